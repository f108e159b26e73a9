//! The cache directory of other stores (`SAFELOAD_CACHE_DIR`, `Loader::cache_dir`), against
//! `moto_server`: a second load reads the cache, and an object replaced between two loads is
//! fetched again, never read stale.

use safeload_testhttp::moto::Moto;

use super::*;

/// A child's variables for `moto`, with the cache directory `dir`.
fn vars(moto: &Moto, dir: &Path) -> Vec<(&'static str, String)> {
    let mut vars = moto.s3_vars();
    vars.push(("SAFELOAD_CACHE_DIR", dir.display().to_string()));
    vars
}

#[test]
fn an_object_replaced_between_two_loads_is_fetched_again() {
    let Some(moto) = Moto::start() else {
        return;
    };
    let files = tempfile::tempdir().unwrap();
    let mut specs = every_dtype();
    specs.push(spec("big", Dtype::F32, &[256, 1024]));
    write_sharded(files.path(), &specs, 2);
    moto.create_bucket("models").unwrap();
    for path in shards_of(files.path())
        .into_iter()
        .chain([files.path().join("model.safetensors.index.json")])
    {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        moto.put(
            "models",
            &format!("m/{name}"),
            &std::fs::read(&path).unwrap(),
        )
        .unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let vars = vars(&moto, cache.path());
    let url = "s3://models/m";
    let cold = run_load(url, &vars);
    let expected = digest_of(&naive_load(&shards_of(files.path())));
    assert_eq!(cold.digest, expected);
    assert!(cold.every("written"), "{cold:#?}");
    assert_eq!(
        cold.words(&shard_name(0, 2)),
        "from the store, written to the cache directory"
    );
    let warm = run_load(url, &vars);
    assert_eq!(warm.digest, expected);
    assert!(warm.every("hit"), "{warm:#?}");
    assert_eq!(warm.words(&shard_name(0, 2)), "from the cache directory");
    assert!(incomplete(cache.path()).is_empty());
    // The second shard replaced by another of the same tensors' names and shapes.
    let replaced = shard_name(1, 2);
    let other: Vec<Spec> = naive_load(&[files.path().join(&replaced)])
        .into_iter()
        .map(|mut s| {
            for b in &mut s.data {
                *b = b.wrapping_add(1);
            }
            s
        })
        .collect();
    write_file(&files.path().join(&replaced), &other, None);
    moto.put(
        "models",
        &format!("m/{replaced}"),
        &std::fs::read(files.path().join(&replaced)).unwrap(),
    )
    .unwrap();
    let after = run_load(url, &vars);
    assert_eq!(
        after.digest,
        digest_of(&naive_load(&shards_of(files.path())))
    );
    assert_ne!(after.digest, expected);
    assert_eq!(after.code(&replaced), "written", "{after:#?}");
    assert_eq!(after.code(&shard_name(0, 2)), "hit", "{after:#?}");
    // Without the cache directory, nothing is read or written there.
    let none = run_load(url, &moto.s3_vars());
    assert!(none.every("none"), "{none:#?}");
}
