//! Reads from an opened checkpoint: one tensor, its bytes into memory the caller owns, a slice of it, one rank's part; a view of the map where the file is mapped and the bytes are contiguous, positional reads of exactly the bytes needed where it is not.

use std::ops::Range;
use std::sync::Arc;

use super::device::cut;
use super::{Checkpoint, TensorInfo};
use crate::adapt::Concurrency;
use crate::cancel::Cancel;
use crate::dest::device::Part;
use crate::dest::pages::PageSizes;
use crate::error::{Error, ErrorKind, Operation, Result};
use crate::file::OpenedFile;
use crate::jobs;
use crate::slice::{MERGE_GAP, Run, SlicePlan};
use crate::source::read_exact;
use crate::storage::{Buffer, Storage};
use crate::tensor::Tensor;

impl<X> Checkpoint<X> {
    /// A sub-block of `name`: one range per leading dimension, the trailing
    /// dimensions whole; `&[]` is the whole tensor. The result's shape is
    /// the ranges' lengths (then the whole dimensions), its bytes contiguous,
    /// row-major.
    ///
    /// Only the bytes holding it are read: one read (a zero-copy view where
    /// mapped) for a slice whose bytes are one run, else strided runs, those
    /// less than 512 KiB apart read as one (one more request costs about as
    /// much as reading the gap), in pieces the read engine issues in
    /// parallel; where mapped, the runs are copied from the map.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = (0..24u8).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4, 6], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// let rows = ck.read_slice("w", &[1..3])?;            // rows 1 and 2, all columns
    /// assert_eq!((rows.shape(), rows.as_bytes()), (&[2, 6][..], &data[6..18]));
    /// let block = ck.read_slice("w", &[0..2, 4..6])?;     // a 2 x 2 block
    /// assert_eq!(block.as_bytes(), [4, 5, 10, 11]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSlice`] for more ranges than dimensions, a range
    /// backwards or past its dimension, or a packed dtype (F4, F6) cut inside
    /// a byte; [`ErrorKind::TensorNotFound`]; a read's error.
    pub fn read_slice(&self, name: &str, ranges: &[Range<usize>]) -> Result<Tensor> {
        self.read_part(name, Part::Slice(ranges.to_vec()))
    }

    /// Rank `rank`'s part of `name` along dimension `dim` when the tensor is
    /// split `world` ways, as `torch.tensor_split` splits it: the first
    /// `len % world` parts one element longer, empty parts for the last
    /// ranks where `world` passes the dimension. Read as
    /// [`read_slice`](Self::read_slice) reads.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = (0..35u8).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![5, 7], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// // Column-parallel: 7 columns over 3 ranks are 3, 2 and 2 wide.
    /// let widths: Vec<usize> = (0..3).map(|r| ck.shard("w", 1, r, 3).unwrap().shape()[1]).collect();
    /// assert_eq!(widths, [3, 2, 2]);
    /// // Row-parallel: rank 1 of 2 has rows 3 and 4.
    /// assert_eq!(ck.shard("w", 0, 1, 2)?.as_bytes(), &data[21..]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSlice`] for a `dim` the tensor does not have (any
    /// `dim` of a 0-dim tensor), `world == 0` or `rank >= world`, or a packed
    /// dtype cut inside a byte; [`ErrorKind::TensorNotFound`]; a read's error.
    pub fn shard(&self, name: &str, dim: usize, rank: usize, world: usize) -> Result<Tensor> {
        self.read_part(name, Part::Shard { dim, rank, world })
    }

    /// `part` of `name`: a view for one run of a mapped file, else an
    /// allocation filled from the map or by the read engine.
    fn read_part(&self, name: &str, part: Part) -> Result<Tensor> {
        let info = self.info(name)?;
        let file = self.file_of(info)?;
        let plan = cut(info, part)?;
        let shape = plan.shape.clone();
        if let Some(storage) = file.map() {
            let whole = range_in(info, storage)?;
            if let Some(run) = plan.contiguous() {
                let range = whole.start + run.start..whole.start + run.end;
                return tensor(info, shape, Arc::clone(storage), range);
            }
            let src = storage.bytes().get(whole).unwrap_or_default();
            let fill = |dst: &mut [u8]| {
                copy_runs(&plan.runs, src, 0, dst);
                Ok(())
            };
            return owned(file, info, shape, plan.len, None, fill);
        }
        let opts = &self.inner().opts;
        let (concurrency, most) = opts.io_defaults(std::iter::once(file.source()));
        // Pieces small enough to keep every reader busy, never under 1 MiB.
        let piece = (plan.len / concurrency.start).clamp(1 << 20, most.max(1 << 20));
        let fill = |dst: &mut [u8]| read_runs(file, info.offset, &plan, dst, concurrency, piece);
        owned(file, info, shape, plan.len, None, fill)
    }

    /// The tensor called `name`: a zero-copy view of the map where the file
    /// is mapped, else exactly its bytes read into an allocation of its own
    /// (aligned for its dtype).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::TensorNotFound`], or the read's error naming the file and
    /// the offset (a file that shrank is
    /// [`ErrorKind::SizeMismatch`]).
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let info = self.info(name)?;
        let file = self.file_of(info)?;
        match file.map() {
            Some(storage) => {
                let range = range_in(info, storage)?;
                tensor(info, info.shape().to_vec(), Arc::clone(storage), range)
            }
            None => read_whole(file, info, None),
        }
    }

    /// Reads the bytes of `name` into `dst`, memory the caller owns (an
    /// engine's tensor storage, a pinned staging buffer).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LengthMismatch`] unless `dst` is exactly the tensor's
    /// length; otherwise as [`read`](Self::read).
    pub fn read_into(&self, name: &str, dst: &mut [u8]) -> Result<()> {
        let info = self.info(name)?;
        let file = self.file_of(info)?;
        if dst.len() as u64 != info.nbytes {
            return Err(Error::new(
                ErrorKind::LengthMismatch {
                    tensor: Some(info.name().to_string()),
                    expected: info.nbytes,
                    actual: dst.len() as u64,
                },
                file.path(),
            ));
        }
        if let Some(storage) = file.map() {
            let range = range_in(info, storage)?;
            let src = storage.bytes().get(range).unwrap_or_default();
            dst.copy_from_slice(src);
            return Ok(());
        }
        read_exact(file.source(), dst, info.offset)
    }
}

/// `info`'s `len` bytes of `shape` in an allocation of their own
/// (page-aligned, read-only) filled by `fill`; `guard` is dropped with them.
fn owned(
    file: &OpenedFile,
    info: &TensorInfo,
    shape: Vec<usize>,
    len: usize,
    guard: Option<Box<dyn Send + Sync>>,
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<Tensor> {
    let mut buffer =
        Buffer::new(len).map_err(|e| Error::io(Operation::Allocate, file.path(), None, e))?;
    fill(buffer.bytes_mut())?;
    let storage = buffer
        .seal(file.path().to_path_buf(), guard)
        .map_err(|e| Error::io(Operation::Seal, file.path(), None, e))?;
    tensor(info, shape, Arc::new(storage), 0..len)
}

/// `info`'s tensor of `shape` at `range` of `storage`.
fn tensor(
    info: &TensorInfo,
    shape: Vec<usize>,
    storage: Arc<Storage>,
    range: Range<usize>,
) -> Result<Tensor> {
    Tensor::new(info.name().into(), info.dtype(), shape, storage, range)
}

/// Copies `runs` into `dst` from `src`, which starts at offset `base` of the
/// tensor's bytes.
fn copy_runs(runs: &[Run], src: &[u8], base: usize, dst: &mut [u8]) {
    for run in runs {
        let from = run.src - base;
        let (Some(from), Some(to)) = (
            src.get(from..from + run.len),
            dst.get_mut(run.dst..run.dst + run.len),
        ) else {
            continue;
        };
        to.copy_from_slice(from);
    }
}

/// Reads the runs of `plan` (of the tensor at `base` in `file`) into `dst`
/// through the read engine, in pieces of `piece` bytes: a read of one run
/// straight into `dst`, a merged one ([`MERGE_GAP`]) into a scratch buffer,
/// its runs then copied out.
fn read_runs(
    file: &OpenedFile,
    base: u64,
    plan: &SlicePlan,
    dst: &mut [u8],
    concurrency: Concurrency,
    piece: usize,
) -> Result<()> {
    let reads = plan.reads(MERGE_GAP);
    let mut scratch: Vec<Vec<u8>> = reads
        .iter()
        .filter(|r| r.runs.len() > 1)
        .map(|r| vec![0u8; r.src.len()])
        .collect();
    let jobs = queue_reads(file, base, plan, &reads, dst, &mut scratch, piece);
    // A lazy read is the caller's own: no page size advised, no cancel flag.
    let pages = PageSizes::unadvised();
    let (result, _, _) = jobs::run(jobs, concurrency, &pages, &|_, _| {}, &Cancel::NONE);
    result.map_err(|failure| failure.on(Some(file.source())))?;
    let merged = reads.iter().filter(|r| r.runs.len() > 1);
    for (read, buffer) in merged.zip(&scratch) {
        let runs = plan.runs.get(read.runs.clone()).unwrap_or_default();
        copy_runs(runs, buffer, read.src.start, dst);
    }
    Ok(())
}

/// The jobs of `reads` ([`read_runs`]); runs are in increasing order of
/// `dst`, so `dst` splits into one slice per read of one run.
fn queue_reads<'a>(
    file: &'a OpenedFile,
    base: u64,
    plan: &SlicePlan,
    reads: &[crate::slice::Read],
    dst: &'a mut [u8],
    scratch: &'a mut [Vec<u8>],
    piece: usize,
) -> Vec<jobs::Tagged<'a>> {
    let mut jobs = Vec::new();
    let (mut rest, mut at) = (dst, 0u64);
    let mut scratch_iter = scratch.iter_mut();
    for read in reads {
        let target: &mut [u8] = if read.runs.len() > 1 {
            match scratch_iter.next() {
                Some(buffer) => buffer,
                None => break,
            }
        } else {
            let Some(run) = plan.runs.get(read.runs.start) else {
                break;
            };
            match jobs::carve(&mut rest, &mut at, run.dst as u64, run.len as u64) {
                Some(into) => into,
                None => break,
            }
        };
        let len = target.len();
        let offset = base + read.src.start as u64;
        let how = jobs::ReadFrom {
            source: file.source(),
            direct: false,
            hashed: false,
        };
        jobs::split_read(&mut jobs, 0, how, offset, target, len, piece);
    }
    jobs
}

/// `info`'s exact bytes read into an allocation of their own ([`owned`]),
/// whether or not the file is mapped.
pub(super) fn read_whole(
    file: &OpenedFile,
    info: &TensorInfo,
    guard: Option<Box<dyn Send + Sync>>,
) -> Result<Tensor> {
    let len = usize::try_from(info.nbytes).map_err(|_| {
        let kind = ErrorKind::InsufficientMemory {
            needed: info.nbytes,
            available: usize::MAX as u64,
        };
        Error::new(kind, file.path())
    })?;
    let fill = |dst: &mut [u8]| read_exact(file.source(), dst, info.offset);
    owned(file, info, info.shape().to_vec(), len, guard, fill)
}

/// Where `info`'s bytes are in its file's map (the header was checked
/// against the file's length: this fails only for a map of another length).
fn range_in(info: &TensorInfo, storage: &Storage) -> Result<Range<usize>> {
    let start = usize::try_from(info.offset).ok();
    let len = usize::try_from(info.nbytes).ok();
    start
        .zip(len)
        .and_then(|(s, l)| Some(s..s.checked_add(l)?))
        .filter(|r| r.end <= storage.bytes().len())
        .ok_or_else(|| {
            Error::new(
                ErrorKind::SizeMismatch {
                    expected: info.offset.saturating_add(info.nbytes),
                    actual: storage.bytes().len() as u64,
                },
                storage.path(),
            )
        })
}
