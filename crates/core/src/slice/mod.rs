//! Plans sliced and sharded reads of one tensor: which of its bytes hold the result, and where each lands.
//!
//! Pure: it takes a dtype, a shape and ranges, and never touches a file;
//! `Checkpoint::read_slice` and `Checkpoint::shard` issue the reads it plans.
//!
//! # Runs
//!
//! A tensor's bytes are row-major, and so is the result. Given ranges
//! `r_0..r_{k-1}` on its first `k` dimensions (the trailing ones whole), let
//! `p` be the last sliced dimension whose range is not the whole dimension.
//! Every dimension after `p` is taken whole, so for each index of the
//! dimensions before `p` the result holds one contiguous block of the
//! source: `len(r_p)` times the stride of dimension `p`. Those blocks are the
//! [`Run`]s. Two of them are never adjacent in the source (they start one
//! stride of dimension `p - 1` apart, which is longer than a block because
//! `r_p` is not whole), so the runs are as few as possible: the product of
//! the lengths of `r_0..r_{p-1}`, one per row of a column slice, one in all
//! for a slice along dimension 0 or the whole tensor. Planning allocates one
//! [`Run`] per run and nothing per element.
//!
//! A result with an empty dimension (an empty range, or an empty trailing
//! dimension) has its shape, no bytes and no runs.
//!
//! # Packed dtypes
//!
//! F4 (4 bits) and F6_E2M3/F6_E3M2 (6 bits) pack elements across bytes. A run
//! that starts or ends inside a byte cannot be copied as bytes, so such a
//! slice is refused ([`ErrorKind::InvalidSlice`]); offsets are checked in
//! bits. BOOL is one byte per element in safetensors, like U8.
//!
//! # Merging runs into reads
//!
//! [`SlicePlan::reads`] groups consecutive runs into one read while the gap
//! between the end of one and the start of the next is under `max_gap` bytes;
//! the gap's bytes are read and dropped. With `max_gap == 0` every run is its
//! own read; with `usize::MAX` the whole span from the first run to the last
//! is one read. [`MERGE_GAP`] is the default, and why.

#[cfg(test)]
mod tests;

use std::fmt;
use std::ops::Range;

use safetensors::Dtype;

use crate::error::{Error, ErrorKind};

/// The gap (in bytes) under which two runs are read as one.
///
/// Reading a gap of `g` bytes costs `g` over the storage's bandwidth;
/// skipping it costs one more request, roughly the storage's fixed latency
/// per request. Gaps under latency times bandwidth are cheaper read.
///
/// NOTE: 512 KiB lies near the geometric mean of the break-even gaps
/// derived from the FUSE measurements (reads in flight and one at a time),
/// where a fixed gap's worst case against the best choice is smallest
/// (BENCHMARKS.md, "slice/mod.rs: MERGE_GAP"). A merged read holds at most this many dropped
/// bytes per gap, and never more than the rows it covers.
pub const MERGE_GAP: usize = 512 << 10;

/// The bytes of a tensor (relative to its first byte) that hold a slice, and where each lands in the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlicePlan {
    /// The result's shape: the ranges' lengths, then the whole trailing dimensions.
    pub shape: Vec<usize>,
    /// The result's length in bytes.
    pub len: usize,
    /// Contiguous runs to copy: `src` bytes of the tensor -> `dst` offset in
    /// the result, in increasing order of both; adjacent runs already joined.
    pub runs: Vec<Run>,
}

/// One contiguous block of the result: `len` bytes at `src` in the tensor,
/// copied to `dst` in the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    /// Offset in the tensor's bytes.
    pub src: usize,
    /// Offset in the result's bytes.
    pub dst: usize,
    /// Length in bytes, never 0.
    pub len: usize,
}

impl Run {
    /// The end of the run's bytes in the tensor.
    pub(crate) fn src_end(&self) -> usize {
        // Cannot saturate: a planned run lies inside a tensor whose size fits.
        self.src.saturating_add(self.len)
    }
}

/// A read to issue: one contiguous range of the tensor's bytes covering one
/// or more runs (gaps between them smaller than `max_gap` are read and
/// dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    /// The tensor's bytes to read: from the first run's start to the last run's end.
    pub src: Range<usize>,
    /// The runs it covers, as indices into [`SlicePlan::runs`].
    pub runs: Range<usize>,
}

impl SlicePlan {
    /// Validates and plans `ranges` (one per leading dimension) of a tensor of `dtype` and `shape`. `tensor` names it in errors.
    ///
    /// `ranges == &[]` is the whole tensor.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSlice`] (without a path: the caller adds it) for
    /// more ranges than dimensions, a range that ends before it starts or
    /// past its dimension, element counts or byte sizes that overflow
    /// `usize`, a packed dtype cut inside a byte, or more runs than can be
    /// allocated.
    pub(crate) fn new(
        tensor: &str,
        dtype: Dtype,
        shape: &[usize],
        ranges: &[Range<usize>],
    ) -> Result<SlicePlan, Error> {
        plan(dtype, shape, ranges).map_err(|invalid| invalid.into_error(tensor))
    }

    /// The plan of `rank`'s part along `dim` when split `world` ways (torch.tensor_split).
    ///
    /// The first `len % world` parts are one element longer than the rest;
    /// with `world` larger than the dimension the last parts are empty.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSlice`] for a `dim` out of range (any `dim` of a
    /// 0-dim tensor), `world == 0`, `rank >= world`, and as [`SlicePlan::new`].
    pub(crate) fn shard(
        tensor: &str,
        dtype: Dtype,
        shape: &[usize],
        dim: usize,
        rank: usize,
        world: usize,
    ) -> Result<SlicePlan, Error> {
        shard_ranges(shape, dim, rank, world)
            .and_then(|ranges| plan(dtype, shape, &ranges))
            .map_err(|invalid| invalid.into_error(tensor))
    }

    /// Whether the result is one contiguous run of the tensor (a dim-0 slice, the whole tensor): then it can be a zero-copy view.
    ///
    /// An empty result is the empty range `0..0`.
    pub(crate) fn contiguous(&self) -> Option<Range<usize>> {
        match self.runs.as_slice() {
            [] => Some(0..0),
            [run] => Some(run.src..run.src_end()),
            _ => None,
        }
    }

    /// The reads that cover the runs, merging runs whose gap is under `max_gap` bytes.
    ///
    /// In increasing order; every run is in exactly one read.
    pub(crate) fn reads(&self, max_gap: usize) -> Vec<Read> {
        let mut reads: Vec<Read> = Vec::new();
        for (index, run) in self.runs.iter().enumerate() {
            // `index + 1` is at most the number of runs, which fits.
            let next = index.saturating_add(1);
            if let Some(read) = reads.last_mut() {
                // Runs increase and are never adjacent, so the gap is positive.
                if run.src.saturating_sub(read.src.end) < max_gap {
                    read.src.end = run.src_end();
                    read.runs.end = next;
                    continue;
                }
            }
            reads.push(Read {
                src: run.src..run.src_end(),
                runs: index..next,
            });
        }
        reads
    }
}

/// The range of `rank`'s part of a dimension of length `len` split `world` ways, as torch.tensor_split does. Errors as `shard`.
///
/// `None` when `world == 0` or `rank >= world`.
pub(crate) fn split_range(len: usize, rank: usize, world: usize) -> Option<Range<usize>> {
    if rank >= world {
        return None;
    }
    let base = len.checked_div(world)?;
    let longer = len.checked_rem(world)?;
    // The parts before `rank` are `base` long, and the first `longer` of them one more.
    let start = rank.checked_mul(base)?.checked_add(rank.min(longer))?;
    let part = base.checked_add(usize::from(rank < longer))?;
    Some(start..start.checked_add(part)?)
}

/// The ranges of `rank`'s part along `dim`: every dimension before it whole.
fn shard_ranges(
    shape: &[usize],
    dim: usize,
    rank: usize,
    world: usize,
) -> Result<Vec<Range<usize>>, Invalid> {
    let Some(&len) = shape.get(dim) else {
        return Err(Invalid::DimOutOfRange {
            dim,
            dims: shape.len(),
        });
    };
    if world == 0 {
        return Err(Invalid::NoRanks);
    }
    let part = split_range(len, rank, world).ok_or(Invalid::RankOutOfRange { rank, world })?;
    Ok(shape
        .iter()
        .take(dim)
        .map(|&len| 0..len)
        .chain([part])
        .collect())
}

/// The plan behind [`SlicePlan::new`], with its errors as data.
fn plan(dtype: Dtype, shape: &[usize], ranges: &[Range<usize>]) -> Result<SlicePlan, Invalid> {
    check_ranges(shape, ranges)?;
    let elements = checked_size(dtype, shape)?;
    let result_shape = result_shape(shape, ranges);
    if result_shape.contains(&0) {
        return Ok(SlicePlan {
            shape: result_shape,
            len: 0,
            runs: Vec::new(),
        });
    }
    // From here no dimension is empty (a non-empty result needs every range
    // and every trailing dimension non-empty), so `elements` is the exact
    // product of the shape and every stride below divides it.
    let strides = strides(shape).ok_or(Invalid::ElementsOverflow)?;
    let Some(cut) = innermost_cut(shape, ranges, &strides) else {
        // Every range whole: the tensor itself.
        let len = byte_offset(elements, dtype)?;
        return Ok(SlicePlan {
            shape: result_shape,
            len,
            runs: vec![Run {
                src: 0,
                dst: 0,
                len,
            }],
        });
    };
    let runs = strided_runs(dtype, ranges, &strides, &cut)?;
    Ok(SlicePlan {
        shape: result_shape,
        len: runs.len,
        runs: runs.runs,
    })
}

/// Refuses more ranges than dimensions, and a range that ends before it
/// starts or past its dimension.
fn check_ranges(shape: &[usize], ranges: &[Range<usize>]) -> Result<(), Invalid> {
    if ranges.len() > shape.len() {
        return Err(Invalid::TooManyRanges {
            ranges: ranges.len(),
            dims: shape.len(),
        });
    }
    for (dim, (range, &len)) in ranges.iter().zip(shape).enumerate() {
        if range.start > range.end {
            return Err(Invalid::Reversed {
                dim,
                range: range.clone(),
            });
        }
        if range.end > len {
            return Err(Invalid::PastEnd {
                dim,
                range: range.clone(),
                len,
            });
        }
    }
    Ok(())
}

/// Checks that the tensor's own size fits, and returns its element count.
fn checked_size(dtype: Dtype, shape: &[usize]) -> Result<usize, Invalid> {
    let bits = dtype.bitsize();
    // The tensor's own size, in elements and in bytes (a packed tail
    // rounded up), must fit before any offset into it is computed; then no
    // offset inside it can overflow.
    let elements = element_count(shape).ok_or(Invalid::ElementsOverflow)?;
    let (whole_bytes, rest_bits) = bits_to_bytes(elements, bits).ok_or(Invalid::BytesOverflow)?;
    let _tensor_len = whole_bytes
        .checked_add(usize::from(rest_bits != 0))
        .ok_or(Invalid::BytesOverflow)?;
    Ok(elements)
}

/// The result's shape: the ranges' lengths, then the whole trailing dimensions.
fn result_shape(shape: &[usize], ranges: &[Range<usize>]) -> Vec<usize> {
    ranges
        .iter()
        .map(ExactSizeIterator::len)
        .chain(shape.iter().skip(ranges.len()).copied())
        .collect()
}

/// The last sliced dimension not taken whole, where a slice's runs are cut.
struct Cut<'r> {
    /// Its index.
    dim: usize,
    /// Its range.
    range: &'r Range<usize>,
    /// Its stride, in elements.
    stride: usize,
}

/// Finds where a slice's runs are cut; `None` when every range is whole.
fn innermost_cut<'r>(
    shape: &[usize],
    ranges: &'r [Range<usize>],
    strides: &[usize],
) -> Option<Cut<'r>> {
    // The last sliced dimension not taken whole: below it runs are contiguous.
    let innermost = ranges
        .iter()
        .zip(strides)
        .enumerate()
        .zip(shape)
        .rev()
        .find(|((_, (range, _)), len)| range.start != 0 || range.end != **len);
    innermost.map(|((dim, (range, &stride)), _)| Cut { dim, range, stride })
}

/// A slice's runs and the result's length in bytes.
struct Runs {
    /// The runs, in increasing order of source and destination.
    runs: Vec<Run>,
    /// The result's length in bytes: where the last run ends in it.
    len: usize,
}

/// Lays out the runs of a slice cut at `cut`: one block of the cut
/// dimension's range per index of the dimensions before it.
fn strided_runs(
    dtype: Dtype,
    ranges: &[Range<usize>],
    strides: &[usize],
    cut: &Cut<'_>,
) -> Result<Runs, Invalid> {
    let at_byte = |element: usize| byte_offset(element, dtype);
    let outer = ranges.iter().take(cut.dim);

    let block = cut
        .range
        .len()
        .checked_mul(cut.stride)
        .ok_or(Invalid::ElementsOverflow)?;
    let inner_start = cut
        .range
        .start
        .checked_mul(cut.stride)
        .ok_or(Invalid::ElementsOverflow)?;
    let run_count = outer
        .clone()
        .try_fold(1usize, |count, range| count.checked_mul(range.len()))
        .ok_or(Invalid::ElementsOverflow)?;
    let mut runs = Vec::new();
    runs.try_reserve_exact(run_count)
        .map_err(|_| Invalid::TooManyRuns { runs: run_count })?;

    // An odometer over the indices of the outer dimensions, in row-major order.
    let mut index: Vec<usize> = outer.clone().map(|range| range.start).collect();
    let mut dst = 0usize;
    for _ in 0..run_count {
        let start = index
            .iter()
            .zip(strides)
            .try_fold(inner_start, |offset, (&i, &stride)| {
                offset.checked_add(i.checked_mul(stride)?)
            })
            .ok_or(Invalid::ElementsOverflow)?;
        let end = start.checked_add(block).ok_or(Invalid::ElementsOverflow)?;
        let src = at_byte(start)?;
        let len = at_byte(end)?.saturating_sub(src);
        runs.push(Run { src, dst, len });
        // The result is no larger than the tensor, whose size fits.
        dst = dst.checked_add(len).ok_or(Invalid::BytesOverflow)?;
        advance(&mut index, outer.clone());
    }
    Ok(Runs { runs, len: dst })
}

/// Turns the odometer `index` over the `outer` ranges one step: its last
/// digit first, each digit that passes its range's end back to its start.
fn advance<'r, I>(index: &mut [usize], outer: I)
where
    I: DoubleEndedIterator<Item = &'r Range<usize>> + ExactSizeIterator,
{
    for (i, range) in index.iter_mut().zip(outer).rev() {
        *i = i.saturating_add(1);
        if *i < range.end {
            break;
        }
        *i = range.start;
    }
}

/// The number of elements of `shape`: 0 if any dimension is, else their
/// product; `None` if that overflows.
fn element_count(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape
        .iter()
        .try_fold(1usize, |count, &len| count.checked_mul(len))
}

/// Row-major strides in elements: each dimension's is the product of the
/// dimensions after it.
fn strides(shape: &[usize]) -> Option<Vec<usize>> {
    let mut strides = vec![1usize; shape.len()];
    let mut stride = 1usize;
    for (slot, &len) in strides.iter_mut().zip(shape).rev() {
        *slot = stride;
        stride = stride.checked_mul(len)?;
    }
    Some(strides)
}

/// `elements` elements of `bits` bits as whole bytes and the bits left
/// over, without computing `elements * bits` (which would overflow `usize`
/// eight times sooner than the byte count does).
fn bits_to_bytes(elements: usize, bits: usize) -> Option<(usize, usize)> {
    // elements * bits / 8 = (8q + r) * bits / 8 = q * bits + r * bits / 8.
    let (q, r) = (elements / 8, elements % 8);
    let tail = r.checked_mul(bits)?;
    let bytes = q.checked_mul(bits)?.checked_add(tail / 8)?;
    Some((bytes, tail % 8))
}

/// The byte offset of element `element`, which must start on a byte.
fn byte_offset(element: usize, dtype: Dtype) -> Result<usize, Invalid> {
    match bits_to_bytes(element, dtype.bitsize()) {
        None => Err(Invalid::BytesOverflow),
        Some((bytes, 0)) => Ok(bytes),
        Some(_) => Err(Invalid::MidByte { dtype, element }),
    }
}

/// Why a slice or shard was refused; rendered to words once, in
/// [`ErrorKind::InvalidSlice`]'s `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Invalid {
    TooManyRanges {
        ranges: usize,
        dims: usize,
    },
    Reversed {
        dim: usize,
        range: Range<usize>,
    },
    PastEnd {
        dim: usize,
        range: Range<usize>,
        len: usize,
    },
    ElementsOverflow,
    BytesOverflow,
    /// A run would start or end at element `element` of the tensor, inside a byte.
    MidByte {
        dtype: Dtype,
        element: usize,
    },
    DimOutOfRange {
        dim: usize,
        dims: usize,
    },
    NoRanks,
    RankOutOfRange {
        rank: usize,
        world: usize,
    },
    /// `Vec::try_reserve` refused the runs (on a huge strided slice).
    TooManyRuns {
        runs: usize,
    },
}

impl Invalid {
    fn into_error(self, tensor: &str) -> Error {
        Error::without_path(ErrorKind::InvalidSlice {
            tensor: tensor.to_owned(),
            reason: self.to_string(),
        })
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::TooManyRanges { ranges, dims } => {
                write!(f, "{ranges} ranges given for its {dims} dimensions")
            }
            Invalid::Reversed { dim, range } => write!(
                f,
                "range {}..{} of dimension {dim} ends before it starts",
                range.start, range.end
            ),
            Invalid::PastEnd { dim, range, len } => write!(
                f,
                "range {}..{} of dimension {dim} runs past its length {len}",
                range.start, range.end
            ),
            Invalid::ElementsOverflow => f.write_str("its element count overflows usize"),
            Invalid::BytesOverflow => f.write_str("its size in bytes overflows usize"),
            Invalid::MidByte { dtype, element } => write!(
                f,
                "{dtype} elements are {} bits and the slice would cut a byte at element {element}; \
                 packed dtypes slice only at byte boundaries",
                dtype.bitsize()
            ),
            Invalid::DimOutOfRange { dim, dims } => {
                write!(
                    f,
                    "dimension {dim} is out of range for its {dims} dimensions"
                )
            }
            Invalid::NoRanks => f.write_str("a world size of 0 has no ranks"),
            Invalid::RankOutOfRange { rank, world } => {
                write!(f, "rank {rank} is not below the world size {world}")
            }
            Invalid::TooManyRuns { runs } => {
                write!(f, "its plan needs {runs} runs, more than can be allocated")
            }
        }
    }
}
