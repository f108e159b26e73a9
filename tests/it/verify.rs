//! `Loader::verify`: every file's SHA-256 computed while loading, checked
//! against a Hugging Face cache blob's name or a digest the caller gives, in
//! every mode (mapped, buffered through the page cache, buffered direct,
//! buffered in part).

use std::path::{Path, PathBuf};

use crate::common::*;
use safeload::{ErrorKind, Loader};
use sha2::{Digest, Sha256};
use tempfile::tempdir;

/// The loaders each case runs with: every way a file's bytes are hashed.
fn modes() -> Vec<(&'static str, Loader)> {
    let mut modes = read_modes();
    modes.push((
        "buffered-in-part",
        Loader::new()
            .disable_mmap(true)
            .filter(|name| !name.ends_with(".scalar")),
    ));
    modes
}

fn sha256_hex(path: &Path) -> String {
    let digest = Sha256::digest(std::fs::read(path).unwrap());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A Hugging Face cache: `models--org--name/blobs/<sha256>` holding the
/// content, `snapshots/<rev>/<name>` linking to it. Returns the snapshot
/// directory and each file's (name, blob path).
fn hub_cache(root: &Path) -> (PathBuf, Vec<(String, PathBuf)>) {
    let staging = root.join("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let index = write_sharded(&staging, &every_dtype(), 3);
    let repo = root.join("models--org--name");
    let blobs = repo.join("blobs");
    let snapshot = repo.join("snapshots/0123abcd");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    let mut files = Vec::new();
    let names: Vec<PathBuf> = std::fs::read_dir(&staging)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for path in names {
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let blob = blobs.join(sha256_hex(&path));
        std::fs::rename(&path, &blob).unwrap();
        let target = Path::new("../../blobs").join(blob.file_name().unwrap());
        std::os::unix::fs::symlink(&target, snapshot.join(&name)).unwrap();
        files.push((name, blob));
    }
    assert!(index.exists() || files.iter().any(|(n, _)| n.ends_with(".index.json")));
    (snapshot, files)
}

#[test]
fn a_good_cache_loads_and_reports_each_blobs_digest() {
    let dir = tempdir().unwrap();
    let (snapshot, files) = hub_cache(dir.path());
    for (mode, loader) in modes() {
        let sd = loader.verify(true).load(&snapshot).unwrap();
        assert!(!sd.report().files.is_empty());
        for file in &sd.report().files {
            let name = file.path.file_name().unwrap().to_str().unwrap();
            let (_, blob) = files.iter().find(|(n, _)| n == name).unwrap();
            assert_eq!(
                file.sha256,
                Some(blob.file_name().unwrap().to_str().unwrap().to_string()),
                "{mode}: {name}"
            );
        }
        assert!(sd.report().to_string().contains("sha256 "), "{mode}");
    }
}

#[test]
fn a_corrupted_blob_is_an_integrity_mismatch_naming_the_file() {
    let dir = tempdir().unwrap();
    let (snapshot, files) = hub_cache(dir.path());
    // Flip the last byte of a shard's tensor data: the file still parses,
    // only its digest tells.
    let (name, blob) = files
        .iter()
        .find(|(n, _)| n.ends_with(".safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(blob).unwrap();
    *bytes.last_mut().unwrap() ^= 0x55;
    std::fs::write(blob, &bytes).unwrap();
    let actual = sha256_hex(blob);
    let expected = blob.file_name().unwrap().to_str().unwrap().to_string();
    for (mode, loader) in modes() {
        let err = loader.verify(true).load(&snapshot).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::IntegrityMismatch {
                expected: expected.clone(),
                actual: actual.clone()
            },
            "{mode}: {err}"
        );
        assert_eq!(err.path(), Some(snapshot.join(name).as_path()), "{mode}");
        assert!(err.to_string().contains(&expected), "{err}");
    }
    // Without verify the corruption loads: it is the check that catches it.
    assert!(Loader::new().load(&snapshot).is_ok());
}

#[test]
fn outside_a_cache_the_caller_gives_the_digest() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let name = path.file_name().unwrap().to_str().unwrap().to_string();
    let good = sha256_hex(&path);
    for (mode, loader) in modes() {
        // Unverified, no digest; `expect_sha256` alone turns verify on.
        let sd = loader.clone().load(&path).unwrap();
        assert_eq!(sd.report().files[0].sha256, None, "{mode}");
        let sd = loader
            .clone()
            .expect_sha256(name.clone(), &good.to_uppercase())
            .load(&path)
            .unwrap();
        assert_eq!(sd.report().files[0].sha256, Some(good.clone()), "{mode}");
        let wrong = "0".repeat(64);
        let err = loader
            .clone()
            .expect_sha256(name.clone(), &wrong)
            .load(&path)
            .unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::IntegrityMismatch {
                expected: wrong,
                actual: good.clone()
            },
            "{mode}"
        );
        let err = loader
            .expect_sha256(name.clone(), "not-hex")
            .load(&path)
            .unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::InvalidDigest { file, digest } if *file == name && digest == "not-hex"),
            "{mode}: {err}"
        );
    }
    // `verify(false)` wins over an expected digest.
    let sd = Loader::new()
        .expect_sha256(name, &"0".repeat(64))
        .verify(false)
        .load(&path)
        .unwrap();
    assert_eq!(sd.report().files[0].sha256, None);
}
