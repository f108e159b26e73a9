//! Reading only what is needed, counted by the FUSE test filesystem: opening
//! reads the headers, a tenth of the tensors reads about a tenth of the bytes,
//! the eight tensor-parallel parts of every tensor read the checkpoint about
//! once, a dim-1 part reads no more than its rows. The mount serves files
//! with `FOPEN_DIRECT_IO`, so every byte the loader reads is a byte the
//! daemon answers (no read-ahead). Needs root and /dev/fuse: skipped (loudly)
//! where they are missing, a failure under `SAFELOAD_REQUIRE_FUSE=1`.

use crate::common::*;
use safeload::{Checkpoint, Dtype, report::Strategy};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

/// 40 BF16 matrices of 96 x 512 (96 KiB each) in 4 shards, and a wide one
/// whose rows are 2 MiB.
fn write_model(dir: &std::path::Path) -> Vec<Spec> {
    let mut specs: Vec<Spec> = (0..40)
        .map(|i| spec(&format!("layers.{i:02}.w"), Dtype::BF16, &[96, 512]))
        .collect();
    specs.push(spec("wide", Dtype::F32, &[8, 512 << 10]));
    write_sharded(dir, &specs, 4);
    specs
}

fn hf_mount(source: &std::path::Path) -> Mount {
    Mount::new(
        source,
        Options {
            fsname: "hf-mount".into(),
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap()
}

#[test]
fn a_rank_reads_its_part_and_a_filter_its_tensors() {
    if skip_without_fuse() {
        return;
    }
    let local = tempdir().unwrap();
    let specs = write_model(local.path());
    let total: u64 = specs.iter().map(|s| s.data.len() as u64).sum();
    let fs = hf_mount(local.path());

    // Headers only: a few KiB.
    let ck = Checkpoint::open(fs.path()).unwrap();
    assert!(
        ck.report()
            .files
            .iter()
            .all(|f| f.strategy == Strategy::Buffered)
    );
    let headers = fs.stats().bytes_read;
    assert!(headers < 64 << 10, "opening read {headers} bytes");
    assert_eq!(ck.total_bytes(), total);

    // A tenth of the tensors: about a tenth of the bytes.
    fs.reset_stats();
    let keep = |name: &str| name.ends_with("0.w");
    let wanted: u64 = specs
        .iter()
        .filter(|s| keep(&s.name))
        .map(|s| s.data.len() as u64)
        .sum();
    let sd = ck.load_filtered(keep).unwrap();
    assert_eq!(sd.len(), 4);
    let read = fs.stats().bytes_read;
    assert!(
        read >= wanted && read <= wanted + 4 * (8 << 10),
        "a tenth of the tensors ({wanted} bytes) read {read} of {total}"
    );

    // The eight dim-0 parts of every tensor: the checkpoint once.
    fs.reset_stats();
    for s in &specs {
        for rank in 0..8 {
            let part = ck.shard(&s.name, 0, rank, 8).unwrap();
            assert_eq!(part.shape()[0], s.shape[0] / 8);
        }
    }
    let read = fs.stats().bytes_read;
    assert!(
        read >= total && read <= total + total / 100,
        "8 parts of every tensor read {read} bytes of {total}"
    );

    // One rank's dim-1 part of the small matrices: no more than their rows.
    fs.reset_stats();
    let mut rows = 0u64;
    for s in specs.iter().filter(|s| s.name.starts_with("layers.")) {
        let part = ck.shard(&s.name, 1, 3, 8).unwrap();
        assert_eq!(part.shape(), [96, 64]);
        rows += s.data.len() as u64;
    }
    let read = fs.stats().bytes_read;
    assert!(
        read <= rows,
        "dim-1 parts read {read} bytes, their rows are {rows}"
    );

    // A dim-1 part of a matrix of 2 MiB rows: runs far apart, read apart:
    // about an eighth.
    fs.reset_stats();
    let part = ck.shard("wide", 1, 5, 8).unwrap();
    let wide = 8u64 * (512 << 10) * 4;
    let read = fs.stats().bytes_read;
    assert_eq!(part.nbytes(), wide / 8);
    assert!(
        read >= wide / 8 && read <= wide / 8 + wide / 100,
        "a dim-1 eighth of a wide matrix read {read} of {wide}"
    );
}
