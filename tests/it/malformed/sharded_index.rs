//! Sharded checkpoints: the index (`model.safetensors.index.json`) and the
//! shards it names.

use std::fs;
use std::path::{Path, PathBuf};

use safeload::{Dtype, ErrorKind, MAX_HEADER_LEN};
use tempfile::tempdir;

use super::allocation_watch::{SMALL, largest_allocation_during};
use super::single_files::nested;
use super::{loads_as, refused};
use crate::common::child::{run_alone, run_role};
use crate::common::{Spec, spec, write_file};

/// Two valid shards, `a.safetensors` (x, y) and `b.safetensors` (z), in `dir`.
pub(super) fn two_shards(dir: &Path) -> Vec<Spec> {
    let a = vec![spec("x", Dtype::F32, &[2]), spec("y", Dtype::BF16, &[3])];
    let b = vec![spec("z", Dtype::U8, &[4])];
    write_file(&dir.join("a.safetensors"), &a, None);
    write_file(&dir.join("b.safetensors"), &b, None);
    a.into_iter().chain(b).collect()
}

pub(super) fn index_path(dir: &Path) -> PathBuf {
    dir.join("model.safetensors.index.json")
}

/// The valid index of `two_shards`.
pub(super) const VALID_INDEX: &str = r#"{"metadata":{"total_size":18},"weight_map":{
    "x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}}"#;

/// Index texts that are not `{"weight_map": {"tensor": "shard"}}`, each refused
/// as `InvalidIndex`, whose reason mentions the given text.
pub(super) const INVALID_INDEXES: [(&str, &[u8], &str); 14] = [
    ("empty", b"", ""),
    ("not_json", b"{oops", "key must be a string"),
    ("truncated", br#"{"weight_map":{"x":"a.safetensors""#, "EOF"),
    (
        "not_utf8",
        b"{\"weight_map\":{\"x\":\"a\xff.safetensors\"}}",
        "unicode",
    ),
    ("array", b"[]", ""),
    ("number", b"7", ""),
    ("no_weight_map", br#"{"metadata":{}}"#, "weight_map"),
    ("weight_map_null", br#"{"weight_map":null}"#, "missing"),
    (
        "weight_map_array",
        br#"{"weight_map":["a.safetensors"]}"#,
        "invalid type",
    ),
    (
        "shard_not_a_string",
        br#"{"weight_map":{"x":1}}"#,
        "invalid type: integer",
    ),
    (
        "shard_null",
        br#"{"weight_map":{"x":null}}"#,
        "invalid type: null",
    ),
    (
        "metadata_not_an_object",
        br#"{"metadata":1,"weight_map":{"x":"a.safetensors"}}"#,
        "invalid type",
    ),
    (
        "json_then_garbage",
        br#"{"weight_map":{"x":"a.safetensors"}} x"#,
        "trailing characters",
    ),
    ("nested_100_000_deep", b"", "recursion limit"), // built below: too long to write here
];

fn invalid_index_bytes(name: &str, bytes: &[u8]) -> Vec<u8> {
    if name == "nested_100_000_deep" {
        let metadata = nested("x", 100_000);
        format!(r#"{{"metadata":{metadata},"weight_map":{{"x":"a.safetensors"}}}}"#).into_bytes()
    } else {
        bytes.to_vec()
    }
}

#[test]
fn the_valid_index_loads() {
    let dir = tempdir().unwrap();
    let specs = two_shards(dir.path());
    fs::write(index_path(dir.path()), VALID_INDEX).unwrap();
    loads_as(dir.path(), &specs);
    loads_as(&index_path(dir.path()), &specs);
}

#[test]
fn index_that_is_not_an_index() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    for (name, bytes, mentions) in INVALID_INDEXES {
        fs::write(&index, invalid_index_bytes(name, bytes)).unwrap();
        for entry in [dir.path(), index.as_path()] {
            let err = refused(entry, &index);
            match err.kind() {
                ErrorKind::InvalidIndex { reason } => assert!(
                    reason.contains(mentions),
                    "{name}: the reason {reason:?} should mention {mentions:?}"
                ),
                other => panic!("{name}: expected InvalidIndex, got {other:?}"),
            }
        }
    }
}

/// Found by the `index` fuzz target (2026-11-29, minimized by hand): bytes
/// that are not UTF-8 anywhere inside the value of an unknown field (which
/// the parser skips) were never checked, so the file loaded; the same bytes
/// in a key, or in a shard name, are refused. JSON text is UTF-8 (RFC 8259 §8.1)
/// and Python's `json.load` refuses such a file, so it must be refused here too.
#[test]
fn index_not_utf8_where_the_parser_skips() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    let texts: [&[u8]; 3] = [
        b"{\"extra\":\"\xff\",\"weight_map\":{\"x\":\"a.safetensors\"}}",
        b"{\"extra\xff\":1,\"weight_map\":{\"x\":\"a.safetensors\"}}",
        // The fuzzer's input, shortened: an unknown "metadat$" object.
        b"{\"metadat$\":{\"total\xc0\xff_size\":18},\"weight_map\":{\"x\":\"a.safetensors\"}}",
    ];
    for text in texts {
        fs::write(&index, text).unwrap();
        let err = refused(dir.path(), &index);
        assert!(
            matches!(err.kind(), ErrorKind::InvalidIndex { .. }),
            "{}: {err:?}",
            String::from_utf8_lossy(text)
        );
    }
}

/// An index must be a JSON object. A derived `Deserialize` also accepts a
/// struct written as an array of its fields in order (`[metadata,
/// weight_map]`), which no writer produces and no other reader accepts.
#[test]
fn index_as_a_json_array_of_its_fields() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    fs::write(
        &index,
        r#"[null,{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}]"#,
    )
    .unwrap();
    let err = refused(dir.path(), &index);
    assert!(
        matches!(err.kind(), ErrorKind::InvalidIndex { .. }),
        "{err:?}"
    );
}

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`); each role is a test
/// of this file that measures allocations, alone in its process.
#[test]
fn child() {
    run_role(&[("index-over-the-limit", index_over_the_size_limit_in_child)]);
}

/// An index of 100 MB + 1 byte (sparse): refused by its size, before it is
/// read.
#[test]
fn index_over_the_size_limit() {
    run_alone(module_path!(), "index-over-the-limit");
}

fn index_over_the_size_limit_in_child() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    fs::write(&index, b"{").unwrap();
    let file = fs::OpenOptions::new().write(true).open(&index).unwrap();
    file.set_len(100_000_001).unwrap();
    drop(file);

    let largest = largest_allocation_during(|| {
        let err = refused(dir.path(), &index);
        assert!(
            matches!(err.kind(), ErrorKind::InvalidIndex { reason } if reason.contains("exceeds")),
            "{err:?}"
        );
    });
    assert!(
        largest < SMALL,
        "an allocation of {largest} bytes was attempted"
    );
}

#[test]
fn index_names_a_missing_shard() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","w":"gone.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &dir.path().join("gone.safetensors"));
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn index_maps_a_tensor_to_a_shard_that_lacks_it() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"a.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &dir.path().join("a.safetensors"));
    assert_eq!(
        err.kind(),
        &ErrorKind::TensorNotInShard {
            tensor: "z".into(),
            shard: "a.safetensors".into()
        }
    );
    assert_eq!(err.tensor(), Some("z"));
}

/// `DuplicateTensor` is documented as "the same tensor name appears in two
/// shards, or twice in the index": a key written twice in `weight_map` is the
/// second case, and the error names the tensor (`err.tensor()`), which a
/// generic `InvalidIndex` cannot.
#[test]
fn index_puts_one_tensor_in_two_shards_by_a_duplicate_key() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    fs::write(
        &index,
        r#"{"weight_map":{"x":"a.safetensors","z":"b.safetensors","x":"b.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &index);
    assert_eq!(
        err.kind(),
        &ErrorKind::DuplicateTensor {
            tensor: "x".into(),
            first: index.clone()
        }
    );
    assert_eq!(err.tensor(), Some("x"));
}

#[test]
fn one_tensor_physically_in_two_shards() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    // b.safetensors holds x as well; the index lists x once, in a.
    write_file(
        &dir.path().join("b.safetensors"),
        &[spec("z", Dtype::U8, &[4]), spec("x", Dtype::F32, &[2])],
        None,
    );
    fs::write(index_path(dir.path()), VALID_INDEX).unwrap();
    let err = refused(dir.path(), &dir.path().join("b.safetensors"));
    assert_eq!(
        err.kind(),
        &ErrorKind::DuplicateTensor {
            tensor: "x".into(),
            first: dir.path().join("a.safetensors")
        }
    );
    assert_eq!(err.tensor(), Some("x"));
}

/// Names that leave the checkpoint directory are refused before anything is
/// opened; each one names a real, valid file, so following it would load.
#[test]
fn index_names_a_shard_outside_the_directory() {
    let root = tempdir().unwrap();
    let dir = root.path().join("ckpt");
    fs::create_dir_all(dir.join("sub")).unwrap();
    two_shards(&dir);
    let outside = root.path().join("outside.safetensors");
    write_file(&outside, &[spec("w", Dtype::U8, &[1])], None);
    write_file(
        &dir.join("sub").join("inner.safetensors"),
        &[spec("w", Dtype::U8, &[1])],
        None,
    );
    fs::write(dir.join("sub\\inner.safetensors"), b"").unwrap();
    let absolute = outside.to_str().unwrap().to_string();
    let index = index_path(&dir);
    for name in [
        "../outside.safetensors",
        absolute.as_str(),
        "sub/inner.safetensors",
        "./a.safetensors",
        "sub\\inner.safetensors",
        "",
        "a.safetensors\0",
        "a\0b",
        "\0",
        ".",
        "..",
    ] {
        let text = serde_json::json!({"weight_map": {"x": "a.safetensors", "w": name}});
        fs::write(&index, text.to_string()).unwrap();
        let err = refused(&dir, &index);
        assert_eq!(
            err.kind(),
            &ErrorKind::UnsafeShardName {
                name: name.to_string()
            },
            "{name:?}"
        );
    }
}

/// An index that names itself as a shard: opened as a safetensors file, its
/// first 8 bytes of JSON read as a header length far past the cap.
#[test]
fn index_names_itself_as_a_shard() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    let text = r#"{"weight_map":{"x":"model.safetensors.index.json"}}"#;
    fs::write(&index, text).unwrap();
    let err = refused(dir.path(), &index);
    let len = u64::from_le_bytes(text.as_bytes()[..8].try_into().unwrap());
    assert_eq!(
        err.kind(),
        &ErrorKind::HeaderTooLarge {
            len,
            limit: MAX_HEADER_LEN
        }
    );
}

/// A shard name that is a directory, not a file.
#[test]
fn index_names_a_directory() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::create_dir(dir.path().join("c.safetensors")).unwrap();
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","w":"c.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &dir.path().join("c.safetensors"));
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    // Refused at the open as not a regular file, or by the first read.
    assert!(
        matches!(
            err.io_error().unwrap().kind(),
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::IsADirectory
        ),
        "{err:?}"
    );
}
