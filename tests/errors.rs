//! Every error path of the core has a typed kind, names its file, and never panics.

mod common;

use common::*;
use safeload::{Dtype, ErrorKind, load_state_dict};
use tempfile::tempdir;

fn kind_of(path: &std::path::Path, disable: bool) -> ErrorKind {
    load_state_dict(path, Some(disable))
        .unwrap_err()
        .kind()
        .clone()
}

#[test]
fn missing_path_is_an_io_error_naming_it() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("absent.safetensors");
    for disable in MODES {
        let err = load_state_dict(&path, Some(disable)).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Io { .. }));
        assert_eq!(err.path(), Some(path.as_path()));
        assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
        assert!(std::error::Error::source(&err).is_some());
        assert!(err.to_string().contains("absent.safetensors"), "{err}");
    }
}

#[test]
fn header_errors() {
    let dir = tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    std::fs::write(p("empty.safetensors"), b"").unwrap();
    std::fs::write(p("short.safetensors"), b"\x01\x00\x00").unwrap();
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    std::fs::write(p("huge.safetensors"), huge).unwrap();
    let mut past = 1000u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    std::fs::write(p("past.safetensors"), past).unwrap();
    write_raw(&p("json.safetensors"), "not json", b"");
    let good = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    write_raw(&p("truncated.safetensors"), good, &[0; 5]);
    write_raw(&p("trailing.safetensors"), good, &[0; 9]);

    for disable in MODES {
        assert_eq!(
            kind_of(&p("empty.safetensors"), disable),
            ErrorKind::FileTooSmall { len: 0 }
        );
        assert_eq!(
            kind_of(&p("short.safetensors"), disable),
            ErrorKind::FileTooSmall { len: 3 }
        );
        assert!(matches!(
            kind_of(&p("huge.safetensors"), disable),
            ErrorKind::HeaderTooLarge { len: u64::MAX, .. }
        ));
        assert_eq!(
            kind_of(&p("past.safetensors"), disable),
            ErrorKind::HeaderOutOfBounds {
                len: 1000,
                file_len: 10
            }
        );
        assert!(matches!(
            kind_of(&p("json.safetensors"), disable),
            ErrorKind::InvalidHeader { .. }
        ));
        let header_len = 8 + good.len() as u64;
        assert_eq!(
            kind_of(&p("truncated.safetensors"), disable),
            ErrorKind::SizeMismatch {
                expected: header_len + 8,
                actual: header_len + 5
            }
        );
        assert_eq!(
            kind_of(&p("trailing.safetensors"), disable),
            ErrorKind::SizeMismatch {
                expected: header_len + 8,
                actual: header_len + 9
            }
        );
        let err = load_state_dict(p("truncated.safetensors"), Some(disable)).unwrap_err();
        assert_eq!(err.path(), Some(p("truncated.safetensors").as_path()));
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

#[test]
fn unsafe_shard_names_are_never_opened() {
    for name in [
        "../outside.safetensors",
        "/etc/passwd",
        "a/b.safetensors",
        "",
        "a\0b",
        "..",
        ".",
    ] {
        let dir = tempdir().unwrap();
        write_index(dir.path(), serde_json::json!({"weight_map": {"t": name}}));
        for disable in MODES {
            let err = load_state_dict(dir.path(), Some(disable)).unwrap_err();
            assert_eq!(
                err.kind(),
                &ErrorKind::UnsafeShardName {
                    name: name.to_string()
                },
                "{name:?}"
            );
            assert!(
                err.path()
                    .unwrap()
                    .ends_with("model.safetensors.index.json")
            );
        }
    }
}

#[test]
fn missing_shard_names_the_shard() {
    let dir = tempdir().unwrap();
    write_index(
        dir.path(),
        serde_json::json!({"weight_map": {"t": "gone.safetensors"}}),
    );
    for disable in MODES {
        let err = load_state_dict(dir.path(), Some(disable)).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::Io { .. }));
        assert_eq!(
            err.path(),
            Some(dir.path().join("gone.safetensors").as_path())
        );
        assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
    }
}

#[test]
fn index_and_shards_must_agree() {
    let dir = tempdir().unwrap();
    write_file(
        &dir.path().join("a.safetensors"),
        &[spec("x", Dtype::F32, &[2])],
        None,
    );
    write_file(
        &dir.path().join("b.safetensors"),
        &[spec("y", Dtype::F32, &[2])],
        None,
    );

    // The index puts x in b, which lacks it.
    write_index(
        dir.path(),
        serde_json::json!({"weight_map": {"x": "b.safetensors", "y": "b.safetensors"}}),
    );
    for disable in MODES {
        let err = load_state_dict(dir.path(), Some(disable)).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::TensorNotInShard {
                tensor: "x".into(),
                shard: "b.safetensors".into()
            }
        );
        assert_eq!(err.path(), Some(dir.path().join("b.safetensors").as_path()));
    }

    // The same tensor in two shards.
    write_file(
        &dir.path().join("b.safetensors"),
        &[spec("x", Dtype::F32, &[2])],
        None,
    );
    write_index(
        dir.path(),
        serde_json::json!({"weight_map": {"x": "a.safetensors", "z": "b.safetensors"}}),
    );
    for disable in MODES {
        let err = load_state_dict(dir.path(), Some(disable)).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::DuplicateTensor {
                tensor: "x".into(),
                first: dir.path().join("a.safetensors")
            }
        );
        assert_eq!(err.tensor(), Some("x"));
    }

    // A tensor written twice in weight_map.
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"x": "a.safetensors", "x": "b.safetensors"}}"#,
    )
    .unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    assert_eq!(
        kind_of(dir.path(), true),
        ErrorKind::DuplicateTensor {
            tensor: "x".into(),
            first: index
        }
    );

    // Not JSON, and JSON of the wrong shape.
    for text in [
        "{oops",
        "[]",
        r#"{"weight_map": []}"#,
        r#"{"metadata": {}}"#,
    ] {
        std::fs::write(dir.path().join("model.safetensors.index.json"), text).unwrap();
        for disable in MODES {
            assert!(
                matches!(kind_of(dir.path(), disable), ErrorKind::InvalidIndex { .. }),
                "{text}"
            );
        }
    }
}
