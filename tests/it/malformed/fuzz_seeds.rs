//! The fuzz targets' seed corpus, generated from the cases of this folder.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::Path;

use safeload::Dtype;
use tempfile::tempdir;

use super::sharded_index::INVALID_INDEXES;
use super::single_files::{file, header_cases};
use crate::common::{Spec, every_dtype, spec, write_file};

/// The committed seed corpus of the fuzz targets, `fuzz/corpus/seed-header/`
/// (every single-file case above, and a few valid files) and
/// `fuzz/corpus/seed-index/` (indexes over the fuzz target's fixed shards),
/// is what these cases generate: a case added here without its seed fails.
/// To rewrite the corpus after changing the cases:
///
/// ```text
/// SAFELOAD_WRITE_FUZZ_SEEDS=1 cargo test --test it malformed::fuzz_seeds
/// ```
#[test]
fn fuzz_seeds_are_up_to_date() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus");
    let header_dir = corpus.join("seed-header");
    let index_dir = corpus.join("seed-index");
    let rewrite = std::env::var_os("SAFELOAD_WRITE_FUZZ_SEEDS").is_some_and(|v| v == "1");
    if rewrite {
        for dir in [&header_dir, &index_dir] {
            if dir.exists() {
                fs::remove_dir_all(dir).unwrap();
            }
            fs::create_dir_all(dir).unwrap();
        }
    }
    let mut expected: BTreeSet<std::path::PathBuf> = BTreeSet::new();

    let mut total = 0;
    let mut seed = |dir: &Path, name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        if rewrite {
            fs::write(&path, bytes).unwrap();
        } else {
            let committed = fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; rewrite the corpus (see this test's docs)",
                    path.display()
                )
            });
            assert!(
                committed == bytes,
                "{} is out of date; rewrite the corpus",
                path.display()
            );
        }
        expected.insert(path);
        total += bytes.len();
    };
    for (name, bytes) in header_cases() {
        // The 100 KB nesting bomb would be most of the budget; the fuzzer
        // finds deep nesting from a few brackets.
        if bytes.len() <= 4096 {
            seed(&header_dir, name, &bytes);
        }
    }
    let scratch = tempdir().unwrap();
    let valid: [(&str, Vec<Spec>); 4] = [
        ("valid_every_dtype", every_dtype()),
        (
            "valid_scalar_and_empty",
            vec![spec("s", Dtype::F64, &[]), spec("e", Dtype::BF16, &[0, 4])],
        ),
        (
            "valid_f16_bf16",
            vec![spec("h", Dtype::F16, &[3]), spec("b", Dtype::BF16, &[2, 2])],
        ),
        ("valid_one_u8", vec![spec("u", Dtype::U8, &[5])]),
    ];
    for (name, specs) in valid {
        let path = scratch.path().join(name);
        // One metadata entry: with two, the bytes would follow a HashMap's
        // order and change on every run.
        let format = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_file(&path, &specs, Some(format));
        seed(&header_dir, name, &fs::read(&path).unwrap());
    }
    // Packed: a U8 of 3 bytes, then an F32 at offset 3, header not padded.
    let packed = concat!(
        r#"{"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"#,
        r#""f":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}"#
    );
    seed(&header_dir, "valid_packed", &file(packed, 11));

    // The index target's fixture (fuzz/src/lib.rs): a.safetensors holds x
    // (F32 [2]) and y (BF16 [3]); b.safetensors holds z (U8 [4]) and e
    // (F16 [0]); ../outside.safetensors and sub/inner.safetensors exist and
    // must stay unreachable.
    let indexes: [(&str, &str); 9] = [
        (
            "valid",
            concat!(
                r#"{"metadata":{"total_size":18},"weight_map":{"x":"a.safetensors","#,
                r#""y":"a.safetensors","z":"b.safetensors","e":"b.safetensors"}}"#
            ),
        ),
        ("valid_one_shard", r#"{"weight_map":{"x":"a.safetensors"}}"#),
        (
            "tensor_not_in_shard",
            r#"{"weight_map":{"x":"b.safetensors"}}"#,
        ),
        (
            "duplicate_key",
            r#"{"weight_map":{"x":"a.safetensors","x":"b.safetensors"}}"#,
        ),
        ("missing_shard", r#"{"weight_map":{"x":"c.safetensors"}}"#),
        (
            "parent",
            r#"{"weight_map":{"outside":"../outside.safetensors"}}"#,
        ),
        (
            "subdirectory",
            r#"{"weight_map":{"inner":"sub/inner.safetensors"}}"#,
        ),
        ("directory", r#"{"weight_map":{"x":"sub"}}"#),
        (
            "escaped_slash",
            r#"{"weight_map":{"inner":"sub\/inner.safetensors","x":"a.safetensors"}}"#,
        ),
    ];
    for (name, text) in indexes {
        seed(&index_dir, name, text.as_bytes());
    }
    for (name, bytes, _) in INVALID_INDEXES {
        if name != "nested_100_000_deep" {
            seed(&index_dir, &format!("invalid_{name}"), bytes);
        }
    }
    assert!(total < 100 << 10, "the seed corpus is {total} bytes");
    // Nothing stale: every committed seed is one of the cases.
    for dir in [&header_dir, &index_dir] {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            assert!(
                expected.contains(&path),
                "{} is no longer a case; rewrite the corpus",
                path.display()
            );
        }
    }
}
