//! Remote objects read from an S3-compatible store, `moto_server` (the `moto[server]` Python
//! package) started on `127.0.0.1` by the test (`safeload_testhttp::moto`): skipped, loudly,
//! where it is not installed, and a failure instead under `SAFELOAD_REQUIRE_MOTO=1` (CI).

use std::sync::Arc;

use safeload_testhttp::moto::Moto;

use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use super::{location, pattern, quick_tuning, settings};
use crate::remote::error::RemoteErrorKind;
use crate::remote::store::Tuning;
use crate::remote::store::{self, IoRuntime, StoreEnv};
use crate::remote::url::StoreKind;
use crate::source::Source;

#[test]
fn s3_objects_read_back_byte_for_byte_through_moto() {
    let Some(moto) = Moto::start() else {
        return;
    };
    moto.create_bucket("models").unwrap();
    let vars = moto.s3_vars();
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let tuning = quick_tuning();

    // The objects, put with object_store's own client.
    let runtime = Arc::new(IoRuntime::new(crate::cancel::Cancel::NONE).unwrap());
    let env = StoreEnv::Vars(
        vars.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let redactor = Default::default();
    let writer = store::bucket_store(
        StoreKind::S3,
        "models",
        &env,
        &tuning,
        &redactor,
        "s3://models",
    )
    .unwrap();
    let shard = pattern(3 << 20, 9);
    let small = pattern(1000, 10);
    runtime.block_on(async {
        let put = |key: &str, bytes: &[u8]| {
            let (writer, key, bytes) = (Arc::clone(&writer), ObjectPath::from(key), bytes.to_vec());
            async move { writer.put(&key, bytes.into()).await }
        };
        put("llama/model-00001-of-00002.safetensors", &shard)
            .await
            .unwrap();
        put("llama/model-00002-of-00002.safetensors", &small)
            .await
            .unwrap();
    });

    let prefix = location("s3://models/llama", settings("", &vars, tuning.clone()));
    assert_eq!(prefix.file(), None);
    let object = prefix
        .open_file("model-00001-of-00002.safetensors")
        .unwrap();
    assert_eq!(object.len(), shard.len() as u64);
    assert!(object.etag().is_some(), "S3 gives an ETag");
    for (offset, n) in [
        (0usize, 8usize),
        (100, 5000),
        (1 << 20, 1 << 20),
        (0, 3 << 20),
    ] {
        let mut dst = vec![0; n];
        object.read_at(&mut dst, n, offset as u64).unwrap();
        assert!(dst == shard[offset..offset + n], "{offset}+{n}");
    }
    assert_eq!(
        object.path().to_str(),
        Some("s3://models/llama/model-00001-of-00002.safetensors")
    );

    let named = location(
        "s3://models/llama/model-00002-of-00002.safetensors",
        settings("", &vars, tuning.clone()),
    );
    let file = named.file().unwrap().to_owned();
    let object2 = named.open_file(&file).unwrap();
    let mut dst = vec![0; 1000];
    object2.read_at(&mut dst, 1000, 0).unwrap();
    assert_eq!(dst, small);

    // Replaced after the open: If-Match fails, never a mix of versions.
    runtime.block_on(async {
        let key = ObjectPath::from("llama/model-00001-of-00002.safetensors");
        writer.put(&key, pattern(3 << 20, 11).into()).await.unwrap();
    });
    let mut dst = vec![0; 1 << 20];
    let (at, e) = object.read_at(&mut dst, 1 << 20, 1 << 20).unwrap_err();
    assert_eq!(at, 1 << 20);
    assert!(e.to_string().contains("changed since it was opened"), "{e}");

    // Missing: an error at once; the secret key never in it.
    let e = prefix.open_file("missing.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::NotFound);
    let missing = e.clone().into_error(crate::error::Operation::Open);
    let failure = missing.remote_failure();
    assert_eq!(failure, Some(crate::error::RemoteFailure::FileNotFound));
    assert!(!format!("{e} {e:?}").contains("moto-secret-key-123"));
    let denied = Tuning {
        max_retries: 0,
        ..tuning
    };
    let other = location("s3://no-such-bucket/x", settings("", &vars, denied));
    let e = other.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::NotFound, "{e}");
}
