//! The planner against its naive twin: a slicer that copies the result
//! element by element, bit by bit, from index arithmetic alone; the plan's
//! runs, and its reads at several gaps, must rebuild the same bytes. And
//! `split_range` against a brute-force split that deals elements out in
//! turn. Property tests over random shapes (0-dim, empty dimensions, up to
//! 4 dimensions), ranges and shards of every dtype, and over `usize::MAX`
//! sized ones that must be refused or planned without a panic.
//!
//! 256 cases per property by default; `PROPTEST_CASES=10000 cargo test --lib
//! slice` for a longer search.

use std::ops::Range;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::TestCaseError;
use safetensors::Dtype;

use super::{DTYPES, MERGE_GAP, Read, Run, SlicePlan, split_range};
use crate::{Error, ErrorKind};

/// `PROPTEST_CASES` if set, else 256: a case takes microseconds, and the
/// strided plans with several outer dimensions are a small share of them.
/// Failures are not persisted: one found here becomes a named case in
/// `slice/tests.rs`.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------
// The naive twins.
// ---------------------------------------------------------------------------

/// What a slice must be, computed one element at a time.
struct Naive {
    shape: Vec<usize>,
    /// The result's bits, packed as the tensor's are.
    bytes: Vec<u8>,
    /// Which of the tensor's bytes hold the slice.
    selected: Vec<bool>,
    /// Whether every byte of the tensor is wholly in the slice or wholly out
    /// of it: exactly when byte runs can copy it.
    byte_aligned: bool,
}

fn bit(data: &[u8], i: usize) -> bool {
    data[i / 8] >> (i % 8) & 1 == 1
}

/// Slices `data`, a tensor of `dtype` and `shape`, by walking the result's
/// elements in row-major order and computing each one's source index.
fn naive_slice(dtype: Dtype, shape: &[usize], ranges: &[Range<usize>], data: &[u8]) -> Naive {
    let bits = dtype.bitsize();
    let result: Vec<usize> = ranges
        .iter()
        .map(|range| range.end - range.start)
        .chain(shape[ranges.len()..].iter().copied())
        .collect();
    let count: usize = result.iter().product();
    let mut bytes = vec![0u8; (count * bits).div_ceil(8)];
    let mut selected_bits = vec![false; data.len() * 8];
    for element in 0..count {
        // Its index in the result, the last dimension fastest, shifted by
        // the ranges' starts, then flattened over the tensor's shape.
        let (mut rest, mut source, mut stride) = (element, 0, 1);
        for dim in (0..shape.len()).rev() {
            let index = rest % result[dim];
            rest /= result[dim];
            let start = ranges.get(dim).map_or(0, |range| range.start);
            source += (start + index) * stride;
            stride *= shape[dim];
        }
        for b in 0..bits {
            let from = source * bits + b;
            selected_bits[from] = true;
            if bit(data, from) {
                let to = element * bits + b;
                bytes[to / 8] |= 1 << (to % 8);
            }
        }
    }
    let byte_aligned = selected_bits
        .chunks(8)
        .all(|byte| byte.iter().all(|&s| s == byte[0]));
    let selected = selected_bits.chunks(8).map(|byte| byte[0]).collect();
    Naive {
        shape: result,
        bytes,
        selected,
        byte_aligned,
    }
}

/// The tensor's bytes: as many as its bits need, pseudo-random from `seed`
/// so that a byte copied from the wrong place shows.
fn tensor_bytes(dtype: Dtype, shape: &[usize], seed: u64) -> Vec<u8> {
    let bits = shape.iter().product::<usize>() * dtype.bitsize();
    (0..bits.div_ceil(8) as u64)
        .map(|i| ((i ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8)
        .collect()
}

/// The plan applied run by run.
fn apply(plan: &SlicePlan, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; plan.len];
    for run in &plan.runs {
        out[run.dst..run.dst + run.len].copy_from_slice(&data[run.src..run.src_end()]);
    }
    out
}

/// The plan applied as its reads would be: each covering range read whole,
/// then its runs picked out of it.
fn apply_reads(plan: &SlicePlan, reads: &[Read], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; plan.len];
    for read in reads {
        let buffer = data[read.src.clone()].to_vec();
        for run in &plan.runs[read.runs.clone()] {
            let at = run.src - read.src.start;
            out[run.dst..run.dst + run.len].copy_from_slice(&buffer[at..at + run.len]);
        }
    }
    out
}

/// The brute-force split: deal `len` elements out to `world` parts in turn,
/// so the first `len % world` parts get one more, and lay the parts end to end.
fn naive_split(len: usize, world: usize) -> Vec<Range<usize>> {
    let mut sizes = vec![0usize; world];
    for element in 0..len {
        sizes[element % world] += 1;
    }
    let mut start = 0;
    sizes
        .into_iter()
        .map(|size| {
            start += size;
            start - size..start
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------

/// Runs are non-empty, land end to end in the result, and increase in the
/// source with a gap between any two (adjacent ones would have been joined).
fn check_runs(runs: &[Run], len: usize, tensor_len: u128) -> Result<(), TestCaseError> {
    let mut dst = 0usize;
    for run in runs {
        prop_assert!(run.len > 0, "empty run {:?}", run);
        prop_assert_eq!(run.dst, dst);
        dst += run.len;
    }
    prop_assert_eq!(dst, len);
    for pair in runs.windows(2) {
        prop_assert!(pair[0].src_end() < pair[1].src, "{:?} not apart", pair);
    }
    if let Some(last) = runs.last() {
        prop_assert!(last.src as u128 + last.len as u128 <= tensor_len);
    }
    Ok(())
}

/// The reads cover every run once, in order; runs in one read are under
/// `max_gap` apart, and consecutive reads are not.
fn check_reads(plan: &SlicePlan, reads: &[Read], max_gap: usize) -> Result<(), TestCaseError> {
    let mut next = 0;
    for read in reads {
        prop_assert_eq!(read.runs.start, next);
        prop_assert!(read.runs.start < read.runs.end);
        next = read.runs.end;
        let runs = &plan.runs[read.runs.clone()];
        prop_assert_eq!(read.src.start, runs[0].src);
        prop_assert_eq!(read.src.end, runs[runs.len() - 1].src_end());
        for pair in runs.windows(2) {
            prop_assert!(pair[1].src - pair[0].src_end() < max_gap);
        }
    }
    prop_assert_eq!(next, plan.runs.len());
    for pair in reads.windows(2) {
        prop_assert!(pair[1].src.start - pair[0].src.end >= max_gap);
    }
    Ok(())
}

/// `plan` of `ranges` against the naive twin.
fn check(
    dtype: Dtype,
    shape: &[usize],
    ranges: &[Range<usize>],
    plan: Result<SlicePlan, Error>,
    seed: u64,
    gap: usize,
) -> Result<(), TestCaseError> {
    let data = tensor_bytes(dtype, shape, seed);
    let naive = naive_slice(dtype, shape, ranges, &data);
    let plan = match plan {
        Ok(plan) => plan,
        Err(err) => {
            // The one refusal a small, in-bounds slice may get.
            prop_assert!(!naive.byte_aligned, "refused: {}", err);
            let is_mid_byte = matches!(err.kind(), ErrorKind::InvalidSlice { tensor, reason }
                if tensor == "w" && reason.ends_with("packed dtypes slice only at byte boundaries"));
            prop_assert!(is_mid_byte, "{:?}", err);
            return Ok(());
        }
    };
    prop_assert!(naive.byte_aligned, "planned a slice that cuts bytes");
    prop_assert_eq!(&plan.shape, &naive.shape);
    prop_assert_eq!(plan.len, naive.bytes.len());
    check_runs(&plan.runs, plan.len, data.len() as u128)?;
    prop_assert_eq!(&apply(&plan, &data), &naive.bytes);

    // The runs are exactly the bytes the slice selects, so (being apart)
    // as few as can be.
    let mut covered = vec![false; data.len()];
    for run in &plan.runs {
        covered[run.src..run.src_end()].fill(true);
    }
    prop_assert_eq!(&covered, &naive.selected);

    let expected_view = match plan.runs.as_slice() {
        [] => Some(0..0),
        [run] => Some(run.src..run.src_end()),
        _ => None,
    };
    prop_assert_eq!(plan.contiguous(), expected_view);

    for max_gap in [0, 1, 2, 3, 7, 64, gap, MERGE_GAP, usize::MAX] {
        let reads = plan.reads(max_gap);
        check_reads(&plan, &reads, max_gap)?;
        prop_assert_eq!(
            &apply_reads(&plan, &reads, &data),
            &naive.bytes,
            "gap {}",
            max_gap
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Strategies.
// ---------------------------------------------------------------------------

/// A dimension: mostly 1 to 4, sometimes empty, sometimes 8 (so F6 rows
/// of whole bytes occur).
fn arb_len() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 6 => 1usize..5, 1 => Just(8usize)]
}

/// A range of a dimension of `len`: mostly non-empty where it can be, so
/// that multi-dimensional results with several runs are common.
fn arb_range(len: usize) -> impl Strategy<Value = Range<usize>> {
    let any = (0..=len).prop_flat_map(move |start| (start..=len).prop_map(move |end| start..end));
    if len == 0 {
        return any.boxed();
    }
    let non_empty =
        (0..len).prop_flat_map(move |start| (start + 1..=len).prop_map(move |end| start..end));
    prop_oneof![1 => any, 3 => non_empty].boxed()
}

/// A dtype, a shape of 0 to 4 dimensions, and valid ranges on some or all
/// leading dimensions.
fn arb_slice() -> impl Strategy<Value = (Dtype, Vec<usize>, Vec<Range<usize>>)> {
    (select(DTYPES.to_vec()), vec(arb_len(), 0..=4)).prop_flat_map(|(dtype, shape)| {
        let leading = shape.clone();
        // A range on every dimension half the time: strided plans with
        // several outer dimensions need many.
        let sliced = prop_oneof![0..=shape.len(), Just(shape.len())];
        let ranges = sliced.prop_flat_map(move |k| {
            leading[..k]
                .iter()
                .map(|&len| arb_range(len))
                .collect::<Vec<_>>()
        });
        (Just(dtype), Just(shape), ranges)
    })
}

const MAX: usize = usize::MAX;

/// Dimensions and offsets at the edges of `usize`, and small ones.
fn arb_huge() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..4,
        Just(MAX),
        Just(MAX - 1),
        Just(MAX / 2),
        Just(MAX / 2 + 1),
        Just(MAX / 8 + 1),
        Just(1usize << 32),
        Just((1usize << 32) - 1),
        any::<usize>(),
    ]
}

/// Ranges of up to 4 elements (or reversed) anywhere, except the last,
/// which may be anything: planned, they stay within 4^3 runs.
fn arb_huge_ranges(dims: usize) -> impl Strategy<Value = Vec<Range<usize>>> {
    let short = (arb_huge(), -1isize..5).prop_map(|(start, len)| match usize::try_from(len) {
        Ok(len) => start..start.saturating_add(len),
        Err(_) => start..start.saturating_sub(1),
    });
    (
        vec(short, 0..=dims.saturating_sub(1)),
        arb_huge(),
        arb_huge(),
        any::<bool>(),
    )
        .prop_map(|(mut ranges, start, end, last)| {
            if last {
                ranges.push(start..end);
            }
            ranges
        })
}

fn is_invalid_slice(err: &Error) -> bool {
    matches!(err.kind(), ErrorKind::InvalidSlice { tensor, .. } if tensor == "w")
}

/// The product of `values` and `bits`, if it fits in a u128 (0 with any 0,
/// whatever the others).
fn product_bits(values: &[usize], bits: usize) -> Option<u128> {
    if values.contains(&0) {
        return Some(0);
    }
    values.iter().try_fold(bits as u128, |product, &len| {
        product.checked_mul(len as u128)
    })
}

/// A huge-shape plan that was accepted is consistent with its shape.
fn check_huge(plan: &SlicePlan, dtype: Dtype, shape: &[usize]) -> Result<(), TestCaseError> {
    let tensor_bits = product_bits(shape, dtype.bitsize());
    let result_bits = product_bits(&plan.shape, dtype.bitsize());
    prop_assert_eq!(result_bits, Some(plan.len as u128 * 8));
    prop_assert!(plan.runs.len() <= 64);
    let tensor_len = tensor_bits.map_or(u128::MAX, |bits| bits / 8);
    check_runs(&plan.runs, plan.len, tensor_len)
}

// ---------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(config())]

    #[test]
    fn plans_match_the_naive_slicer(
        (dtype, shape, ranges) in arb_slice(),
        seed in any::<u64>(),
        gap in 0usize..64,
    ) {
        let plan = SlicePlan::new("w", dtype, &shape, &ranges);
        check(dtype, &shape, &ranges, plan, seed, gap)?;
    }

    #[test]
    fn shards_match_the_naive_slicer_of_the_brute_force_split(
        dtype in select(DTYPES.to_vec()),
        shape in vec(arb_len(), 0..=4),
        dim in any::<Index>(),
        world in 1usize..8,
        rank in any::<Index>(),
        seed in any::<u64>(),
        gap in 0usize..64,
    ) {
        let rank = rank.index(world);
        if shape.is_empty() {
            let err = SlicePlan::shard("w", dtype, &shape, 0, rank, world).unwrap_err();
            prop_assert!(is_invalid_slice(&err), "{:?}", err);
            return Ok(());
        }
        let dim = dim.index(shape.len());
        let mut ranges: Vec<Range<usize>> = shape[..dim].iter().map(|&len| 0..len).collect();
        ranges.push(naive_split(shape[dim], world)[rank].clone());

        let shard = SlicePlan::shard("w", dtype, &shape, dim, rank, world);
        let sliced = SlicePlan::new("w", dtype, &shape, &ranges);
        prop_assert_eq!(
            shard.as_ref().map_err(Error::kind),
            sliced.as_ref().map_err(Error::kind)
        );
        check(dtype, &shape, &ranges, shard, seed, gap)?;
    }

    #[test]
    fn split_range_is_tensor_split(len in 0usize..200, world in 1usize..40) {
        let parts: Vec<Range<usize>> = (0..world)
            .map(|rank| split_range(len, rank, world).unwrap())
            .collect();
        prop_assert_eq!(&parts, &naive_split(len, world));
        // What tensor_split promises, checked on the parts themselves.
        prop_assert_eq!(parts[0].start, 0);
        prop_assert_eq!(parts[world - 1].end, len);
        for pair in parts.windows(2) {
            prop_assert_eq!(pair[0].end, pair[1].start, "contiguous and in order");
            prop_assert!(pair[0].len() >= pair[1].len(), "the longer parts first");
        }
        let longest = parts.iter().map(Range::len).max().unwrap();
        let shortest = parts.iter().map(Range::len).min().unwrap();
        prop_assert!(longest - shortest <= 1);
        prop_assert_eq!(parts.iter().filter(|part| part.len() == longest).count(),
            if len % world == 0 { world } else { len % world });
        for rank in world..world + 3 {
            prop_assert_eq!(split_range(len, rank, world), None);
        }
        prop_assert_eq!(split_range(len, 0, 0), None);
    }

    #[test]
    fn huge_slices_are_planned_or_refused_without_panicking(
        dtype in select(DTYPES.to_vec()),
        (shape, ranges) in vec(arb_huge(), 0..=4)
            .prop_flat_map(|shape| { let dims = shape.len(); (Just(shape), arb_huge_ranges(dims.max(1))) }),
    ) {
        match SlicePlan::new("w", dtype, &shape, &ranges) {
            Ok(plan) => check_huge(&plan, dtype, &shape)?,
            Err(err) => prop_assert!(is_invalid_slice(&err), "{:?}", err),
        }
    }

    #[test]
    fn huge_shards_are_planned_or_refused_without_panicking(
        dtype in select(DTYPES.to_vec()),
        // Small dimensions before the split one, so that the runs stay few.
        outer in vec(0usize..4, 0..=3),
        inner in vec(arb_huge(), 0..=2),
        dim in any::<Index>(),
        rank in arb_huge(),
        world in arb_huge(),
    ) {
        let dim = dim.index(outer.len() + 1);
        let shape: Vec<usize> = outer.iter().chain(&inner).copied().collect();
        match SlicePlan::shard("w", dtype, &shape, dim, rank, world) {
            Ok(plan) => {
                check_huge(&plan, dtype, &shape)?;
                let part = split_range(shape[dim], rank, world).unwrap();
                prop_assert_eq!(plan.shape[dim], part.len());
            }
            Err(err) => prop_assert!(is_invalid_slice(&err), "{:?}", err),
        }
    }
}
