//! Remote objects read from an S3-compatible store, `moto_server` (the `moto[server]` Python
//! package) started on `127.0.0.1` by the test: skipped, loudly, where it is not installed,
//! and a failure instead under `SAFELOAD_REQUIRE_MOTO=1` (CI).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;

use super::{location, pattern, quick_tuning, settings};
use crate::remote::error::RemoteErrorKind;
use crate::remote::store::Tuning;
use crate::remote::store::{self, IoRuntime, StoreEnv};
use crate::remote::url::StoreKind;
use crate::source::Source;

/// A `moto_server` of this test's own; killed and reaped on drop.
struct Moto {
    child: Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `moto_server` on a free loopback port and waits (at most 30 s) until it answers;
/// `None`, after saying so on stderr, where it is not installed (a panic instead under
/// `SAFELOAD_REQUIRE_MOTO=1`).
fn start_moto() -> Option<Moto> {
    let required = std::env::var_os("SAFELOAD_REQUIRE_MOTO").is_some_and(|v| v == "1");
    // A port the OS just handed out and took back: free unless another process races for it.
    let port = TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    // `moto_server`, else the same server as a module (a console script not on PATH yet).
    let args = ["-H", "127.0.0.1", "-p", &port.to_string()].map(str::to_owned);
    let spawn = |program: &str, first: &[&str]| {
        Command::new(program)
            .args(first)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    };
    let spawned = spawn("moto_server", &[]).or_else(|e| {
        let has_module = Command::new("python3")
            .args(["-c", "import moto.server"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if has_module {
            spawn("python3", &["-m", "moto.server"])
        } else {
            Err(e)
        }
    });
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            let reason = format!("moto_server cannot be started ({e}); pip install 'moto[server]'");
            assert!(!required, "SAFELOAD_REQUIRE_MOTO=1 but {reason}");
            eprintln!("SKIPPED: {reason}");
            return None;
        }
    };
    let mut moto = Moto {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = moto.child.try_wait() {
            panic!("moto_server exited before listening: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not listen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(moto)
}

/// Creates `bucket` with S3's `CreateBucket` (a bare `PUT /bucket`: object_store makes no
/// buckets, and moto does not check signatures).
fn create_bucket(endpoint: &str, bucket: &str) {
    let addr = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "PUT /{bucket} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "CreateBucket: {answer}");
}

fn s3_vars(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        ("AWS_ACCESS_KEY_ID", "testing".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "moto-secret-key-123".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
    ]
}

#[test]
fn s3_objects_read_back_byte_for_byte_through_moto() {
    let Some(moto) = start_moto() else {
        return;
    };
    create_bucket(&moto.endpoint, "models");
    let vars = s3_vars(&moto.endpoint);
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let tuning = quick_tuning();

    // The objects, put with object_store's own client.
    let runtime = Arc::new(IoRuntime::new().unwrap());
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
    assert!(!format!("{e} {e:?}").contains("moto-secret-key-123"));
    let denied = Tuning {
        max_retries: 0,
        ..tuning
    };
    let other = location("s3://no-such-bucket/x", settings("", &vars, denied));
    let e = other.open_file("m.safetensors").unwrap_err();
    assert_eq!(e.kind, RemoteErrorKind::NotFound, "{e}");
}
