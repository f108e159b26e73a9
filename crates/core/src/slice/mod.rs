//! Plans sliced and sharded reads of one tensor: which of its bytes hold the result, and where each lands.
//!
//! Pure: `Checkpoint::read_slice` and `Checkpoint::shard` issue the reads it plans.
//!
//! Let `p` be the last sliced dimension not taken whole: for each index of the dimensions
//! before it the result holds one contiguous block of the source, a [`Run`]. Two runs are
//! never adjacent (they start a stride of `p - 1` apart, longer than a block), so they are as
//! few as possible, and planning allocates nothing per element. A packed dtype (F4, F6) cut
//! inside a byte is refused; offsets are checked in bits.

#[cfg(test)]
mod tests;

use std::ops::Range;

use safetensors::Dtype;

use crate::error::{Error, ErrorKind};

/// The gap (in bytes) under which two runs are read as one.
///
/// NOTE: gaps under a request's latency times the bandwidth are cheaper read; 512 KiB lies near
/// the geometric mean of the break-even gaps measured on FUSE (BENCHMARKS.md, "slice/mod.rs:
/// MERGE_GAP").
pub const MERGE_GAP: usize = 512 << 10;

/// The bytes of a tensor (relative to its first byte) that hold a slice, and where each lands in the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlicePlan {
    /// The result's shape: the ranges' lengths, then the whole trailing dimensions.
    pub shape: Vec<usize>,
    /// The result's length in bytes.
    pub len: usize,
    /// Contiguous runs to copy, in increasing order of both offsets.
    pub runs: Vec<Run>,
}

/// One contiguous block of the result.
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

/// A read to issue: one contiguous range of the tensor's bytes covering one or more runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Read {
    /// The tensor's bytes to read: from the first run's start to the last run's end.
    pub src: Range<usize>,
    /// The runs it covers, as indices into [`SlicePlan::runs`].
    pub runs: Range<usize>,
}

impl SlicePlan {
    /// Validates and plans `ranges` (one per leading dimension; none: the whole tensor) of a
    /// tensor of `dtype` and `shape`; [`ErrorKind::InvalidSlice`] (no path) names `tensor`.
    pub(crate) fn new(
        tensor: &str,
        dtype: Dtype,
        shape: &[usize],
        ranges: &[Range<usize>],
    ) -> Result<SlicePlan, Error> {
        plan(dtype, shape, ranges).map_err(|reason| refused(tensor, reason))
    }

    /// The plan of `rank`'s part along `dim` when split `world` ways (torch.tensor_split).
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
            .map_err(|reason| refused(tensor, reason))
    }

    /// The result's range of the tensor where it is one contiguous run (a zero-copy view).
    pub(crate) fn contiguous(&self) -> Option<Range<usize>> {
        match self.runs.as_slice() {
            [] => Some(0..0),
            [run] => Some(run.src..run.src_end()),
            _ => None,
        }
    }

    /// The reads that cover the runs, merging runs whose gap is under `max_gap` bytes.
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

/// The range of `rank`'s part of a dimension of length `len` split `world` ways, as
/// torch.tensor_split does (the first `len % world` parts one longer); `None` for no such rank.
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
        let dims = shape.len();
        return Err(format!(
            "dimension {dim} is out of range for its {dims} dimensions"
        ));
    };
    if world == 0 {
        return Err("a world size of 0 has no ranks".into());
    }
    let part = split_range(len, rank, world)
        .ok_or_else(|| format!("rank {rank} is not below the world size {world}"))?;
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
    // From here no dimension is empty, so `elements` is the product of the shape.
    let strides = strides(shape).ok_or_else(elements_overflow)?;
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
    let (runs, len) = strided_runs(dtype, ranges, &strides, &cut)?;
    Ok(SlicePlan {
        shape: result_shape,
        len,
        runs,
    })
}

/// Refuses more ranges than dimensions, and a range backwards or past its dimension.
fn check_ranges(shape: &[usize], ranges: &[Range<usize>]) -> Result<(), Invalid> {
    if ranges.len() > shape.len() {
        let (ranges, dims) = (ranges.len(), shape.len());
        return Err(format!("{ranges} ranges given for its {dims} dimensions"));
    }
    for (dim, (range, &len)) in ranges.iter().zip(shape).enumerate() {
        let Range { start, end } = range;
        if start > end {
            return Err(format!(
                "range {start}..{end} of dimension {dim} ends before it starts"
            ));
        }
        if *end > len {
            return Err(format!(
                "range {start}..{end} of dimension {dim} runs past its length {len}"
            ));
        }
    }
    Ok(())
}

/// Checks that the tensor's own size fits, and returns its element count.
fn checked_size(dtype: Dtype, shape: &[usize]) -> Result<usize, Invalid> {
    let bits = dtype.bitsize();
    // The tensor's own size must fit: then no offset inside it can overflow.
    let elements = element_count(shape).ok_or_else(elements_overflow)?;
    let (whole_bytes, rest_bits) = bits_to_bytes(elements, bits).ok_or_else(bytes_overflow)?;
    let _tensor_len = whole_bytes
        .checked_add(usize::from(rest_bits != 0))
        .ok_or_else(bytes_overflow)?;
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
    let innermost = ranges
        .iter()
        .zip(strides)
        .enumerate()
        .zip(shape)
        .rev()
        .find(|((_, (range, _)), len)| range.start != 0 || range.end != **len);
    innermost.map(|((dim, (range, &stride)), _)| Cut { dim, range, stride })
}

/// The runs of a slice cut at `cut` (one per index of the dimensions before it), and the
/// result's length in bytes.
fn strided_runs(
    dtype: Dtype,
    ranges: &[Range<usize>],
    strides: &[usize],
    cut: &Cut<'_>,
) -> Result<(Vec<Run>, usize), Invalid> {
    let at_byte = |element: usize| byte_offset(element, dtype);
    let outer = ranges.iter().take(cut.dim);

    let block = cut
        .range
        .len()
        .checked_mul(cut.stride)
        .ok_or_else(elements_overflow)?;
    let inner_start = cut
        .range
        .start
        .checked_mul(cut.stride)
        .ok_or_else(elements_overflow)?;
    let run_count = outer
        .clone()
        .try_fold(1usize, |count, range| count.checked_mul(range.len()))
        .ok_or_else(elements_overflow)?;
    let mut runs = Vec::new();
    runs.try_reserve_exact(run_count)
        .map_err(|_| format!("its plan needs {run_count} runs, more than can be allocated"))?;

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
            .ok_or_else(elements_overflow)?;
        let end = start.checked_add(block).ok_or_else(elements_overflow)?;
        let src = at_byte(start)?;
        let len = at_byte(end)?.saturating_sub(src);
        runs.push(Run { src, dst, len });
        // The result is no larger than the tensor, whose size fits.
        dst = dst.checked_add(len).ok_or_else(bytes_overflow)?;
        advance(&mut index, outer.clone());
    }
    Ok((runs, dst))
}

/// Turns the odometer `index` over the `outer` ranges one step.
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

/// The number of elements of `shape`; `None` if the product of non-empty ones overflows.
fn element_count(shape: &[usize]) -> Option<usize> {
    if shape.contains(&0) {
        return Some(0);
    }
    shape
        .iter()
        .try_fold(1usize, |count, &len| count.checked_mul(len))
}

/// Row-major strides in elements.
fn strides(shape: &[usize]) -> Option<Vec<usize>> {
    let mut strides = vec![1usize; shape.len()];
    let mut stride = 1usize;
    for (slot, &len) in strides.iter_mut().zip(shape).rev() {
        *slot = stride;
        stride = stride.checked_mul(len)?;
    }
    Some(strides)
}

/// `elements` of `bits` bits as whole bytes and the bits left over, without computing
/// `elements * bits` (which would overflow eight times sooner).
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
        None => Err(bytes_overflow()),
        Some((bytes, 0)) => Ok(bytes),
        Some(_) => Err(format!(
            "{dtype} elements are {} bits and the slice would cut a byte at element {element}; \
             packed dtypes slice only at byte boundaries",
            dtype.bitsize()
        )),
    }
}

/// Why a slice or shard was refused: [`ErrorKind::InvalidSlice`]'s `reason`.
type Invalid = String;

fn refused(tensor: &str, reason: Invalid) -> Error {
    Error::without_path(ErrorKind::InvalidSlice {
        tensor: tensor.to_owned(),
        reason,
    })
}

fn elements_overflow() -> Invalid {
    "its element count overflows usize".into()
}

fn bytes_overflow() -> Invalid {
    "its size in bytes overflows usize".into()
}
