//! The points where an engine author stumbled on the 0.1 API, each as a
//! spec: errors matched without strings, a mapped file's time, the range a
//! tensor-parallel part covers, floating dtypes, one metadata map type.

use std::collections::BTreeMap;

use crate::common::*;
use safeload::error::Operation;
use safeload::report::{Reason, Strategy};
use safeload::{Checkpoint, Dtype, ErrorKind, Loader};
use tempfile::tempdir;

#[test]
fn a_missing_shard_is_not_found_and_names_the_shard() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 3);
    let gone = dir.path().join(shard_name(1, 3));
    std::fs::remove_file(&gone).unwrap();
    for (mode, loader) in read_modes() {
        let err = loader.load(&index).unwrap_err();
        assert!(err.is_not_found(), "{mode}: {err}");
        assert!(!err.is_corrupt(), "{mode}: {err}");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::Io {
                    operation: Operation::Open,
                    ..
                }
            ),
            "{mode}: {err:?}"
        );
        assert_eq!(err.path(), Some(gone.as_path()), "{mode}");
        assert!(
            err.to_string().contains("No such file or directory"),
            "{err}"
        );
    }
    let err = Checkpoint::open(&index).unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

#[test]
fn a_corrupt_file_is_corrupt_and_a_missing_tensor_not_found() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let ck = Checkpoint::open(&path).unwrap();
    let err = ck.read("no.such.tensor").unwrap_err();
    assert!(err.is_not_found() && !err.is_corrupt(), "{err}");
    assert_eq!(err.tensor(), Some("no.such.tensor"));
    drop(ck);

    // The header's length field points past the end of the file.
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = safeload::load_state_dict(&path, None).unwrap_err();
    assert!(err.is_corrupt() && !err.is_not_found(), "{err}");
}

#[test]
fn mapped_files_report_the_time_their_map_took() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 3);
    let sd = Loader::new().disable_mmap(false).load(&index).unwrap();
    assert_eq!(sd.report().files.len(), 3);
    for file in &sd.report().files {
        assert_eq!(file.strategy, Strategy::Mmap);
        assert_eq!(
            file.reason,
            Reason::Requested {
                disable_mmap: false
            }
        );
        assert!(file.lazy());
        assert!(
            !file.elapsed.is_zero(),
            "{}: {:?}",
            file.path.display(),
            file.elapsed
        );
        assert!(file.elapsed <= sd.report().elapsed);
    }
}

#[test]
fn shard_range_tells_the_rows_a_part_covers() {
    let dir = tempdir().unwrap();
    let specs = vec![
        spec("rows", Dtype::F32, &[10, 3]),
        spec("cols", Dtype::BF16, &[4, 7]),
        spec("scalar", Dtype::I64, &[]),
    ];
    let path = write_single(dir.path(), &specs);
    let ck = Checkpoint::open(&path).unwrap();
    for world in 1..=5 {
        for (name, dim) in [("rows", 0), ("cols", 1)] {
            let info = ck.get(name).unwrap();
            let mut next = 0;
            for rank in 0..world {
                let range = info.shard_range(dim, rank, world).unwrap();
                // The parts tile the dimension in rank order.
                assert_eq!(range.start, next, "{name} {rank}/{world}");
                next = range.end;
                let part = ck.shard(name, dim, rank, world).unwrap();
                assert_eq!(part.shape()[dim], range.len(), "{name} {rank}/{world}");
            }
            assert_eq!(next, info.shape()[dim]);
            assert_eq!(info.shard_range(dim, world, world), None);
        }
    }
    assert_eq!(ck.get("scalar").unwrap().shard_range(0, 0, 1), None);
    assert_eq!(ck.get("rows").unwrap().shard_range(0, 0, 0), None);
}

#[test]
fn floating_dtypes_are_told_apart() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let ck = Checkpoint::open(&path).unwrap();
    let sd = Loader::new().load(&path).unwrap();
    for info in ck.tensors() {
        let float = !matches!(
            info.dtype(),
            Dtype::BOOL
                | Dtype::U8
                | Dtype::I8
                | Dtype::I16
                | Dtype::U16
                | Dtype::I32
                | Dtype::U32
                | Dtype::I64
                | Dtype::U64
        );
        assert_eq!(info.is_float(), float, "{:?}", info.dtype());
        assert_eq!(sd.get(info.name()).unwrap().is_float(), float);
        assert_eq!(sd.get(info.name()).unwrap().nbytes(), info.nbytes());
    }
}

#[test]
fn metadata_is_one_map_type_everywhere() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 2);
    let ck = Checkpoint::open(&index).unwrap();
    let sd = ck.load_filtered(|_| true).unwrap();
    let merged: &BTreeMap<String, String> = sd.metadata();
    let per_file: Option<&BTreeMap<String, String>> = sd.report().files[0].metadata.as_ref();
    let index_metadata: Option<&BTreeMap<String, String>> = sd.index_metadata();
    assert_eq!(ck.metadata(), merged);
    assert!(per_file.is_some() || merged.is_empty());
    // Numbers in the index come as their JSON text.
    let total: u64 = index_metadata.unwrap()["total_size"].parse().unwrap();
    assert_eq!(total, sd.total_bytes());
}
