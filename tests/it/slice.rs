//! `Checkpoint::read_slice` and `Checkpoint::shard`: every slice and part
//! equals the same slice of the whole tensor cut by a naive slicer (element by
//! element, by index arithmetic), for every dtype, shape and mode; bad slices
//! are typed errors.

// A slice along dimension 0 is written `&[a..b]`: one range, on purpose.
#![allow(clippy::single_range_in_vec_init)]

use std::ops::Range;

use crate::common::*;
use proptest::prelude::*;
use safeload::{Checkpoint, Dtype, ErrorKind, Loader};
use tempfile::tempdir;

/// The naive twin: the bytes of `ranges` (trailing dims whole) of a
/// row-major tensor of `shape` and `bits` per element, bit by bit.
fn naive_slice(bytes: &[u8], shape: &[usize], bits: usize, ranges: &[Range<usize>]) -> Vec<u8> {
    let full: Vec<Range<usize>> = (0..shape.len())
        .map(|d| ranges.get(d).cloned().unwrap_or(0..shape[d]))
        .collect();
    let count: usize = full.iter().map(|r| r.len()).product();
    let mut out_bits = vec![false; count * bits];
    let mut index = vec![0usize; shape.len()];
    for k in 0..count {
        // The k-th element of the result, as an index into the slice.
        let mut rest = k;
        for d in (0..shape.len()).rev() {
            index[d] = full[d].start + rest % full[d].len();
            rest /= full[d].len();
        }
        let mut flat = 0usize;
        for d in 0..shape.len() {
            flat = flat * shape[d] + index[d];
        }
        for b in 0..bits {
            let src = flat * bits + b;
            out_bits[k * bits + b] = bytes[src / 8] >> (src % 8) & 1 == 1;
        }
    }
    out_bits
        .chunks(8)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u8, |acc, (i, &b)| acc | (u8::from(b) << i))
        })
        .collect()
}

fn tensor_split(len: usize, rank: usize, world: usize) -> Range<usize> {
    let (base, extra) = (len / world, len % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Tensors of several shapes in every whole-byte dtype, plus the packed ones.
fn specs() -> Vec<Spec> {
    let mut specs = Vec::new();
    for dtype in [
        Dtype::U8,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
        Dtype::BOOL,
        Dtype::F8_E4M3,
    ] {
        let n = format!("{dtype:?}").to_lowercase();
        specs.push(spec(&format!("{n}.m"), dtype, &[5, 7]));
        specs.push(spec(&format!("{n}.t"), dtype, &[3, 4, 6]));
        specs.push(spec(&format!("{n}.v"), dtype, &[9]));
        specs.push(spec(&format!("{n}.s"), dtype, &[]));
        specs.push(spec(&format!("{n}.e"), dtype, &[4, 0]));
    }
    specs.push(spec("f4.m", Dtype::F4, &[4, 6]));
    specs.push(spec("f6.m", Dtype::F6_E2M3, &[4, 8]));
    specs
}

#[test]
fn every_slice_and_part_equals_the_naive_slice() {
    let dir = tempdir().unwrap();
    let specs = specs();
    let index = write_sharded(dir.path(), &specs, 2);
    for (mode, loader) in read_modes() {
        let ck = loader.open(&index).unwrap();
        for s in &specs {
            let bits = s.dtype.bitsize();
            let whole = ck.read(&s.name).unwrap();
            assert_eq!(
                ck.read_slice(&s.name, &[]).unwrap(),
                whole,
                "{mode} {}: &[] is the whole",
                s.name
            );
            // Every dim-0 range, and blocks over two dims.
            let mut cases: Vec<Vec<Range<usize>>> = Vec::new();
            if let Some(&d0) = s.shape.first() {
                for a in 0..=d0 {
                    for b in a..=d0 {
                        cases.push(vec![a..b]);
                    }
                }
            }
            if s.shape.len() >= 2 {
                let (d0, d1) = (s.shape[0], s.shape[1]);
                cases.push(vec![0..d0, d1.min(1)..d1]);
                cases.push(vec![1..d0.min(2), 0..d1 / 2]);
                cases.push(vec![0..d0, d1 / 2..d1]);
            }
            for ranges in cases {
                let expected = naive_slice(&s.data, &s.shape, bits, &ranges);
                match ck.read_slice(&s.name, &ranges) {
                    Ok(t) => {
                        assert_eq!(t.as_bytes(), &expected[..], "{mode} {} {ranges:?}", s.name);
                        let lens: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
                        assert_eq!(
                            &t.shape()[..lens.len()],
                            &lens[..],
                            "{mode} {} {ranges:?}",
                            s.name
                        );
                    }
                    Err(e) => {
                        // Only packed types refuse, and only off a byte.
                        assert!(bits % 8 != 0, "{mode} {} {ranges:?}: {e}", s.name);
                        assert!(matches!(e.kind(), ErrorKind::InvalidSlice { .. }), "{e}");
                    }
                }
            }
            // Every part along every dim, for worlds that divide and not.
            for dim in 0..s.shape.len() {
                for world in [1, 2, 3, 8, 11] {
                    for rank in 0..world {
                        let mut ranges: Vec<Range<usize>> = s.shape.iter().map(|&d| 0..d).collect();
                        ranges[dim] = tensor_split(s.shape[dim], rank, world);
                        let expected = naive_slice(&s.data, &s.shape, bits, &ranges);
                        match ck.shard(&s.name, dim, rank, world) {
                            Ok(t) => {
                                assert_eq!(
                                    t.as_bytes(),
                                    &expected[..],
                                    "{mode} {} dim {dim} {rank}/{world}",
                                    s.name
                                );
                                assert_eq!(t.shape()[dim], ranges[dim].len());
                            }
                            Err(e) => assert!(bits % 8 != 0, "{mode} {}: {e}", s.name),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_dim0_slice_of_a_mapped_file_is_a_view_of_the_map() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &specs());
    let ck = Loader::new().disable_mmap(false).open(&path).unwrap();
    let whole = ck.read("f32.m").unwrap();
    let rows = ck.read_slice("f32.m", &[2..4]).unwrap();
    let row_bytes = 7 * 4;
    assert_eq!(
        rows.as_bytes().as_ptr() as usize,
        whole.as_bytes().as_ptr() as usize + 2 * row_bytes,
        "zero-copy"
    );
    let part = ck.shard("f32.m", 0, 1, 2).unwrap();
    assert_eq!(
        part.as_bytes().as_ptr() as usize,
        whole.as_bytes().as_ptr() as usize + 3 * row_bytes
    );
    // A column slice owns exactly its bytes.
    let cols = ck.read_slice("f32.m", &[0..5, 0..2]).unwrap();
    assert_eq!(cols.nbytes(), 5 * 2 * 4);
    assert!(cols.is_aligned());
}

#[test]
fn bad_slices_are_typed_errors_naming_the_tensor_and_file() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &specs());
    for (mode, loader) in read_modes() {
        let ck = loader.open(&path).unwrap();
        #[allow(clippy::reversed_empty_ranges)]
        let cases: Vec<(&str, Vec<Range<usize>>)> = vec![
            ("u8.m", vec![0..6]),             // past dim 0 (5)
            ("u8.m", vec![3..2]),             // backwards
            ("u8.m", vec![0..5, 0..8]),       // past dim 1 (7)
            ("u8.m", vec![0..1, 0..1, 0..1]), // more ranges than dims
            ("u8.s", vec![0..1]),             // a 0-dim tensor has no dim 0
            ("f4.m", vec![0..4, 0..1]),       // half a byte
        ];
        for (name, ranges) in cases {
            let err = ck.read_slice(name, &ranges).unwrap_err();
            assert!(
                matches!(err.kind(), ErrorKind::InvalidSlice { tensor, .. } if tensor == name),
                "{mode} {name} {ranges:?}: {err}"
            );
            assert_eq!(err.path(), Some(path.as_path()), "{mode}");
        }
        for (dim, rank, world) in [(2, 0, 2), (0, 2, 2), (0, 0, 0)] {
            let err = ck.shard("u8.m", dim, rank, world).unwrap_err();
            assert!(
                matches!(err.kind(), ErrorKind::InvalidSlice { .. }),
                "{mode} {dim} {rank} {world}: {err}"
            );
        }
        let err = ck.shard("u8.s", 0, 0, 1).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::InvalidSlice { .. }),
            "{err}"
        );
        let err = ck.shard("missing", 0, 0, 1).unwrap_err();
        assert!(
            matches!(err.kind(), ErrorKind::TensorNotFound { .. }),
            "{err}"
        );
        // A world larger than the dimension gives empty parts.
        let empty = ck.shard("u8.v", 0, 10, 11).unwrap();
        assert_eq!((empty.shape(), empty.nbytes()), (&[0][..], 0));
        // F4 slices on byte boundaries work: two elements are a byte.
        assert_eq!(ck.read_slice("f4.m", &[1..3, 2..6]).unwrap().nbytes(), 4);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random shapes, random ranges and parts, every read mode: the naive twin.
    #[test]
    fn random_slices_equal_the_naive_slice(
        shape in prop::collection::vec(0usize..5, 0..4),
        seed in any::<u64>(),
        dtype in prop::sample::select(vec![Dtype::U8, Dtype::I16, Dtype::F32, Dtype::F64]),
    ) {
        let dir = tempdir().unwrap();
        let s = spec("t", dtype, &shape);
        let path = dir.path().join("model.safetensors");
        write_file(&path, std::slice::from_ref(&s), None);
        let mut rng = seed | 1;
        let mut next = |n: usize| { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; (rng as usize) % (n + 1) };
        let k = next(shape.len());
        let ranges: Vec<Range<usize>> = shape[..k].iter().map(|&d| { let a = next(d); a..a + next(d - a) }).collect();
        let bits = dtype.bitsize();
        for (_, loader) in read_modes() {
            let ck = loader.open(&path).unwrap();
            let t = ck.read_slice("t", &ranges).unwrap();
            prop_assert_eq!(t.as_bytes(), &naive_slice(&s.data, &shape, bits, &ranges)[..]);
            if !shape.is_empty() {
                let dim = next(shape.len() - 1);
                let world = next(6) + 1;
                let rank = next(world - 1);
                let mut full: Vec<Range<usize>> = shape.iter().map(|&d| 0..d).collect();
                full[dim] = tensor_split(shape[dim], rank, world);
                let part = ck.shard("t", dim, rank, world).unwrap();
                prop_assert_eq!(part.as_bytes(), &naive_slice(&s.data, &shape, bits, &full)[..]);
            }
        }
    }
}

#[test]
fn checkpoint_open_default_reads_slices_too() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &specs());
    let ck = Checkpoint::open(&path).unwrap();
    let s = ck.read_slice("bf16.t", &[1..2, 0..4, 3..6]).unwrap();
    assert_eq!(s.shape(), [1, 4, 3]);
}
