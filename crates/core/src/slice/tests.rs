//! Tests of the slice planner: worked examples, contiguity, reads and every
//! error (here); the planner against a naive element-by-element slicer, and
//! `split_range` against a brute-force split, as property tests (`twin`).

// `&[a..b]` is one range, for dimension 0: the API's, not a mistaken `Vec`
// of the range's numbers.
#![allow(clippy::single_range_in_vec_init)]

mod twin;

use crate::format::ALL_DTYPES as DTYPES;
use std::ops::Range;

use safetensors::Dtype::{self, *};

use super::*;
use crate::ErrorKind;

fn plan(dtype: Dtype, shape: &[usize], ranges: &[Range<usize>]) -> SlicePlan {
    match SlicePlan::new("w", dtype, shape, ranges) {
        Ok(plan) => plan,
        Err(err) => panic!("{shape:?} {ranges:?} of {dtype}: {err}"),
    }
}

fn run(src: usize, dst: usize, len: usize) -> Run {
    Run { src, dst, len }
}

fn invalid(reason: &str) -> ErrorKind {
    ErrorKind::InvalidSlice {
        tensor: "w".into(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------
// Worked examples.
// ---------------------------------------------------------------------------

#[test]
fn a_block_of_a_matrix_is_one_run_per_row() {
    // F32 [4, 6]: rows are 24 bytes; rows 1..3, columns 2..5 are 12 bytes of each.
    let plan = plan(F32, &[4, 6], &[1..3, 2..5]);
    assert_eq!(plan.shape, [2, 3]);
    assert_eq!(plan.len, 24);
    assert_eq!(plan.runs, [run(32, 0, 12), run(56, 12, 12)]);
    assert_eq!(plan.contiguous(), None);
}

#[test]
fn a_dim_0_slice_is_one_contiguous_run() {
    let plan = plan(BF16, &[5, 3, 2], &[1..4]);
    assert_eq!(plan.shape, [3, 3, 2]);
    assert_eq!(plan.len, 36);
    assert_eq!(plan.runs, [run(12, 0, 36)]);
    assert_eq!(plan.contiguous(), Some(12..48));
}

#[test]
fn whole_trailing_ranges_join_into_the_leading_run() {
    // Ranges that cover their dimension are the same as leaving them out.
    let joined = plan(U16, &[5, 3, 2], &[1..4, 0..3, 0..2]);
    assert_eq!(joined, plan(U16, &[5, 3, 2], &[1..4]));
    assert_eq!(joined.runs.len(), 1);
    // A whole middle range below a partial one: one run per outer index.
    let plan = plan(U8, &[2, 3, 4], &[0..2, 1..2, 0..4]);
    assert_eq!(plan.runs, [run(4, 0, 4), run(16, 4, 4)]);
}

#[test]
fn a_block_of_a_3_dim_tensor_is_one_run_per_outer_index() {
    // U8 [2, 3, 4]: rows 1..3 of each matrix, columns 1..3 of each row.
    let plan = plan(U8, &[2, 3, 4], &[0..2, 1..3, 1..3]);
    assert_eq!(plan.shape, [2, 2, 2]);
    assert_eq!(
        plan.runs,
        [run(5, 0, 2), run(9, 2, 2), run(17, 4, 2), run(21, 6, 2)]
    );
}

#[test]
fn the_whole_tensor_is_contiguous() {
    for (shape, len) in [
        (&[4usize, 6][..], 96),
        (&[7], 28),
        (&[], 4),
        (&[1, 1, 1], 4),
    ] {
        let whole = plan(F32, shape, &[]);
        assert_eq!(whole.shape, shape);
        assert_eq!(whole.runs, [run(0, 0, len)]);
        assert_eq!(whole.contiguous(), Some(0..len));
        let all: Vec<Range<usize>> = shape.iter().map(|&len| 0..len).collect();
        assert_eq!(SlicePlan::new("w", F32, shape, &all).ok(), Some(whole));
    }
}

#[test]
fn a_dim_1_slice_is_contiguous_only_when_whole_or_one_row() {
    assert_eq!(plan(F16, &[4, 6], &[0..4, 1..6]).contiguous(), None);
    assert_eq!(plan(F16, &[4, 6], &[0..4, 0..6]).contiguous(), Some(0..48));
    assert_eq!(plan(F16, &[4, 6], &[2..3, 1..4]).contiguous(), Some(26..32));
    assert_eq!(plan(F16, &[1, 6], &[0..1, 1..4]).contiguous(), Some(2..8));
}

#[test]
fn empty_ranges_and_dimensions_give_an_empty_result_with_its_shape() {
    for (shape, ranges, result) in [
        (&[4usize, 6][..], &[1..1][..], &[0usize, 6][..]),
        (&[4, 6], &[0..4, 3..3], &[4, 0]),
        (&[4, 0, 2], &[1..3], &[2, 0, 2]),
        (&[0], &[], &[0]),
        (&[0], &[0..0], &[0]),
    ] {
        let plan = plan(F32, shape, ranges);
        assert_eq!(plan.shape, result);
        assert_eq!(plan.len, 0);
        assert_eq!(plan.runs, []);
        assert_eq!(plan.contiguous(), Some(0..0));
        assert_eq!(plan.reads(MERGE_GAP), []);
    }
}

#[test]
fn a_0_dim_tensor_is_one_element() {
    assert_eq!(plan(F64, &[], &[]).runs, [run(0, 0, 8)]);
    assert_eq!(plan(BOOL, &[], &[]).runs, [run(0, 0, 1)]);
}

#[test]
fn bool_is_one_byte_per_element() {
    let plan = plan(BOOL, &[3, 5], &[0..3, 1..3]);
    assert_eq!(plan.runs, [run(1, 0, 2), run(6, 2, 2), run(11, 4, 2)]);
}

#[test]
fn packed_dtypes_slice_at_byte_boundaries() {
    // F4 [4, 6]: a row is 24 bits, 3 bytes.
    assert_eq!(plan(F4, &[4, 6], &[1..3]).runs, [run(3, 0, 6)]);
    // F4 [2, 4]: columns 2..4 are the second byte of each row.
    assert_eq!(
        plan(F4, &[2, 4], &[0..2, 2..4]).runs,
        [run(1, 0, 1), run(3, 1, 1)]
    );
    // F6 [4, 4]: a row is 24 bits, 3 bytes; 4 elements of a flat F6 are too.
    for dtype in [F6_E2M3, F6_E3M2] {
        assert_eq!(plan(dtype, &[4, 4], &[2..4]).runs, [run(6, 0, 6)]);
        assert_eq!(plan(dtype, &[8], &[4..8]).runs, [run(3, 0, 3)]);
    }
}

#[test]
fn packed_dtypes_refuse_a_cut_inside_a_byte() {
    let cut = |dtype: Dtype, element: usize| {
        invalid(&format!(
            "{dtype} elements are {} bits and the slice would cut a byte at element {element}; \
             packed dtypes slice only at byte boundaries",
            dtype.bitsize()
        ))
    };
    for (dtype, shape, ranges, at) in [
        // F4 [4, 3]: a row is 12 bits, so row 1 starts mid-byte.
        (F4, &[4usize, 3][..], &[1..2][..], 3),
        (F4, &[4, 3], &[0..1], 3),
        (F4, &[2, 4], &[0..2, 1..3], 1),
        (F4, &[3], &[], 3),
        (F4, &[], &[], 1),
        (F6_E2M3, &[4, 4], &[0..4, 0..1], 1),
        (F6_E3M2, &[8], &[1..8], 1),
        (F6_E3M2, &[2], &[], 2),
    ] {
        let err = SlicePlan::new("w", dtype, shape, ranges).unwrap_err();
        assert_eq!(err.kind(), &cut(dtype, at), "{dtype} {shape:?} {ranges:?}");
    }
}

// ---------------------------------------------------------------------------
// Shards.
// ---------------------------------------------------------------------------

#[test]
fn shards_split_as_tensor_split_does() {
    // 10 rows in 4 parts: 3, 3, 2, 2.
    let rows: Vec<Vec<Run>> = (0..4)
        .map(
            |rank| match SlicePlan::shard("w", U8, &[10, 2], 0, rank, 4) {
                Ok(plan) => plan.runs,
                Err(err) => panic!("{err}"),
            },
        )
        .collect();
    assert_eq!(
        rows,
        [
            vec![run(0, 0, 6)],
            vec![run(6, 0, 6)],
            vec![run(12, 0, 4)],
            vec![run(16, 0, 4)],
        ]
    );
    // 2 columns in 3 parts: the last is empty.
    let empty = SlicePlan::shard("w", U8, &[10, 2], 1, 2, 3).unwrap();
    assert_eq!((empty.shape, empty.runs), (vec![10, 0], vec![]));
}

#[test]
fn a_column_shard_of_a_wide_matrix_reads_no_more_than_its_rows() {
    // BF16 [64, 4096]: 8 KiB rows; rank 1 of 8 wants 1 KiB of each, 7 KiB apart.
    let (rows, row_bytes) = (64, 4096 * 2);
    let plan = SlicePlan::shard("w", BF16, &[rows, 4096], 1, 1, 8).unwrap();
    assert_eq!(plan.runs.len(), rows);
    let reads = plan.reads(MERGE_GAP);
    assert_eq!(reads.len(), 1, "7 KiB gaps are merged");
    let bytes: usize = reads.iter().map(|read| read.src.len()).sum();
    assert!(bytes <= rows * row_bytes, "{bytes} bytes read");
    assert_eq!(reads[0].src, 1024..(rows - 1) * row_bytes + 2048);

    // F32 [16, 1 Mi]: 4 MiB rows, the gaps of 3.5 MiB are not worth reading.
    let plan = SlicePlan::shard("w", F32, &[16, 1 << 20], 1, 3, 8).unwrap();
    let reads = plan.reads(MERGE_GAP);
    assert_eq!(reads.len(), 16);
    assert!(reads.iter().all(|read| read.src.len() == 512 << 10));
}

#[test]
fn reads_merge_only_gaps_under_max_gap() {
    // U8 [3, 4], column 1..3: runs at 1, 5, 9 of 2 bytes, gaps of 2.
    let plan = plan(U8, &[3, 4], &[0..3, 1..3]);
    let one_each = |plan: &SlicePlan, gap| {
        plan.reads(gap)
            .iter()
            .map(|read| (read.src.clone(), read.runs.clone()))
            .collect::<Vec<_>>()
    };
    let separate = vec![(1..3, 0..1), (5..7, 1..2), (9..11, 2..3)];
    assert_eq!(one_each(&plan, 0), separate);
    assert_eq!(one_each(&plan, 1), separate);
    assert_eq!(one_each(&plan, 2), separate, "a gap of 2 is not under 2");
    assert_eq!(one_each(&plan, 3), [(1..11, 0..3)]);
    assert_eq!(one_each(&plan, usize::MAX), [(1..11, 0..3)]);
}

// ---------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------

const MAX: usize = usize::MAX;

#[test]
#[allow(clippy::reversed_empty_ranges)] // reversed on purpose
fn invalid_slices_are_typed_errors() {
    #[rustfmt::skip]
    /// dtype, shape, ranges, the reason expected.
    type Case<'a> = (Dtype, &'a [usize], &'a [Range<usize>], &'a str);
    let cases: &[Case<'_>] = &[
        (
            F32,
            &[4, 6],
            &[0..4, 0..6, 0..1],
            "3 ranges given for its 2 dimensions",
        ),
        (F32, &[], &[0..0], "1 ranges given for its 0 dimensions"),
        (
            F32,
            &[4, 6],
            &[0..4, 5..3],
            "range 5..3 of dimension 1 ends before it starts",
        ),
        (
            F32,
            &[4],
            &[MAX..0],
            "range 18446744073709551615..0 of dimension 0 ends before it starts",
        ),
        (
            F32,
            &[4, 6],
            &[0..4, 2..7],
            "range 2..7 of dimension 1 runs past its length 6",
        ),
        (
            F32,
            &[4, 6],
            &[4..5],
            "range 4..5 of dimension 0 runs past its length 4",
        ),
        (
            U8,
            &[4],
            &[0..MAX],
            "range 0..18446744073709551615 of dimension 0 runs past its length 4",
        ),
        (U8, &[MAX, 2], &[], "its element count overflows usize"),
        (
            U8,
            &[MAX / 2 + 1, 2],
            &[0..1],
            "its element count overflows usize",
        ),
        (
            U8,
            &[1 << 32, 1 << 32],
            &[0..0],
            "its element count overflows usize",
        ),
        (U16, &[MAX], &[], "its size in bytes overflows usize"),
        (
            F64,
            &[MAX / 8 + 1],
            &[0..1],
            "its size in bytes overflows usize",
        ),
        (F4, &[MAX, 2], &[], "its element count overflows usize"),
        (
            U8,
            &[1 << 62, 2],
            &[0..1 << 62, 0..1],
            "its plan needs 4611686018427387904 runs, more than can be allocated",
        ),
    ];
    assert_eq!(usize::BITS, 64, "the messages above spell 64-bit numbers");
    for &(dtype, shape, ranges, reason) in cases {
        let err = SlicePlan::new("w", dtype, shape, ranges).unwrap_err();
        assert_eq!(err.kind(), &invalid(reason), "{dtype} {shape:?} {ranges:?}");
        assert_eq!(err.tensor(), Some("w"));
        assert_eq!(err.path(), None);
        assert_eq!(
            err.to_string(),
            format!("cannot slice tensor \"w\": {reason}")
        );
    }
}

#[test]
fn invalid_shards_are_typed_errors() {
    #[rustfmt::skip]
    let cases: &[(&[usize], usize, usize, usize, &str)] = &[
        (&[4, 6], 2, 0, 1, "dimension 2 is out of range for its 2 dimensions"),
        (&[], 0, 0, 1, "dimension 0 is out of range for its 0 dimensions"),
        (&[4], MAX, 0, 1, "dimension 18446744073709551615 is out of range for its 1 dimensions"),
        (&[4, 6], 1, 0, 0, "a world size of 0 has no ranks"),
        (&[4, 6], 1, 2, 2, "rank 2 is not below the world size 2"),
        (&[4, 6], 0, MAX, 8, "rank 18446744073709551615 is not below the world size 8"),
        (&[MAX, MAX], 0, 0, 2, "its element count overflows usize"),
    ];
    for &(shape, dim, rank, world, reason) in cases {
        let err = SlicePlan::shard("w", F32, shape, dim, rank, world).unwrap_err();
        assert_eq!(
            err.kind(),
            &invalid(reason),
            "{shape:?} {dim} {rank}/{world}"
        );
    }
}

#[test]
fn usize_max_shapes_and_ranges_plan_without_panicking() {
    // The largest U8 tensor: whole, a dim-0 slice at its end, an empty range.
    assert_eq!(plan(U8, &[MAX], &[]).runs, [run(0, 0, MAX)]);
    assert_eq!(plan(U8, &[MAX], &[MAX - 3..MAX]).runs, [run(MAX - 3, 0, 3)]);
    assert_eq!(plan(U8, &[MAX], &[MAX..MAX]).shape, [0]);
    // An empty dimension makes any other one harmless.
    for shape in [&[0, MAX, MAX][..], &[MAX, MAX, 0], &[2, MAX, 0, MAX]] {
        assert_eq!(plan(F64, shape, &[]).shape, shape);
        assert_eq!(plan(F64, shape, &[0..0]).len, 0);
    }
    // The last element of each row of the last two rows of a huge matrix.
    let plan = plan(U8, &[MAX / 4, 4], &[MAX / 4 - 2..MAX / 4, 3..4]);
    let last = (MAX / 4) * 4;
    assert_eq!(plan.runs, [run(last - 5, 0, 1), run(last - 1, 1, 1)]);
    // The last rank of a world of usize::MAX.
    let shard = SlicePlan::shard("w", U8, &[MAX], 0, MAX - 1, MAX).unwrap();
    assert_eq!(shard.runs, [run(MAX - 1, 0, 1)]);
    assert_eq!(split_range(MAX, MAX - 1, MAX), Some(MAX - 1..MAX));
    assert_eq!(split_range(MAX, 0, 2), Some(0..MAX / 2 + 1));
}

#[test]
fn split_range_refuses_what_shard_refuses() {
    assert_eq!(split_range(4, 0, 0), None);
    assert_eq!(split_range(4, 2, 2), None);
    assert_eq!(split_range(0, MAX, MAX), None);
}

#[test]
fn merge_gap_is_between_a_local_and_a_network_break_even() {
    // The NOTE on `MERGE_GAP`: between ~124 KiB and ~1.3 MiB.
    const { assert!(MERGE_GAP >= 124 << 10 && MERGE_GAP <= 1331 << 10) };
}
