//! Directories with no checkpoint to pick.

use std::fs;

use safeload::ErrorKind;
use tempfile::tempdir;

use super::refused;
use super::sharded_index::{VALID_INDEX, two_shards};

#[test]
fn directory_without_a_checkpoint() {
    let dir = tempdir().unwrap();
    fs::write(dir.path().join("README.md"), b"hi").unwrap();
    let err = refused(dir.path(), dir.path());
    assert_eq!(err.kind(), &ErrorKind::NoCheckpoint { found: vec![] });
}

#[test]
fn directory_with_two_files_and_no_index() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let err = refused(dir.path(), dir.path());
    assert_eq!(
        err.kind(),
        &ErrorKind::NoCheckpoint {
            found: vec!["a.safetensors".into(), "b.safetensors".into()]
        }
    );
}

#[test]
fn directory_with_two_indexes() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::write(dir.path().join("one.safetensors.index.json"), VALID_INDEX).unwrap();
    fs::write(dir.path().join("two.safetensors.index.json"), VALID_INDEX).unwrap();
    let err = refused(dir.path(), dir.path());
    assert_eq!(
        err.kind(),
        &ErrorKind::NoCheckpoint {
            found: vec![
                "one.safetensors.index.json".into(),
                "two.safetensors.index.json".into(),
                "a.safetensors".into(),
                "b.safetensors".into(),
            ]
        }
    );
}
