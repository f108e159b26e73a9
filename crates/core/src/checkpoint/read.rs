//! Reads from an opened checkpoint: one tensor, its bytes into memory the caller owns, a slice of it, one rank's part; a view of the map where the file is mapped and the bytes are contiguous, positional reads of exactly the bytes needed where it is not.

use std::sync::Arc;

use std::ops::Range;

use super::{Checkpoint, TensorInfo};
use crate::adapt::Concurrency;
use crate::cancel::Cancel;
use crate::dest::pages::PageSizes;
use crate::error::Operation;
use crate::error::{Error, ErrorKind, Result};
use crate::file::{OpenedFile, read_error};
use crate::jobs;
use crate::slice::{MERGE_GAP, SlicePlan};
use crate::storage::{Buffer, Storage};
use crate::tensor::Tensor;

impl<X> Checkpoint<X> {
    /// A sub-block of `name`: one range per leading dimension, the trailing
    /// dimensions whole; `&[]` is the whole tensor. The result's shape is
    /// the ranges' lengths (then the whole dimensions), its bytes contiguous,
    /// row-major.
    ///
    /// Only the bytes holding it are read. A slice along dimension 0 (or any
    /// slice whose bytes are one run) is one contiguous read, and where the
    /// file is mapped a zero-copy view of the map. Other slices are strided
    /// runs; runs less than 512 KiB apart are read as one (the gap is read
    /// and dropped: one more request costs about as much as reading that
    /// much, on the mounts measured), and each read is cut in pieces that
    /// the read engine issues in parallel. Where the file is mapped, the
    /// runs are copied from the map.
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
        let info = self.info(name)?;
        let file = self.file_of(info)?;
        let plan = SlicePlan::new(name, info.dtype(), info.shape(), ranges)
            .map_err(|e| e.or_path(file.path()))?;
        self.read_planned(info, file, plan)
    }

    /// Rank `rank`'s part of `name` along dimension `dim` when the tensor is
    /// split `world` ways, as `torch.tensor_split` splits it: the first
    /// `len % world` parts one element longer; a `world` larger than the
    /// dimension gives empty parts to the last ranks. Read as
    /// [`read_slice`](Self::read_slice) reads: a part along dimension 0 is
    /// one read (a view where mapped); along another dimension, exactly the
    /// rows it covers.
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
        let info = self.info(name)?;
        let file = self.file_of(info)?;
        let plan = SlicePlan::shard(name, info.dtype(), info.shape(), dim, rank, world)
            .map_err(|e| e.or_path(file.path()))?;
        self.read_planned(info, file, plan)
    }

    /// Reads what `plan` says of `info`: a view of the map for one run of a
    /// mapped file, else an allocation of the result's length filled from
    /// the map or by the read engine.
    fn read_planned(
        &self,
        info: &TensorInfo,
        file: &OpenedFile,
        plan: SlicePlan,
    ) -> Result<Tensor> {
        let name: Arc<str> = Arc::from(info.name());
        if let Some(storage) = file.map() {
            let whole = range_in(info, storage)?;
            if let Some(run) = plan.contiguous() {
                let range = whole.start + run.start..whole.start + run.end;
                return Tensor::new(name, info.dtype(), plan.shape, Arc::clone(storage), range);
            }
            let src = storage.bytes().get(whole).unwrap_or_default();
            return owned(file, name, info.dtype(), plan.shape, plan.len, |dst| {
                for run in &plan.runs {
                    let (Some(from), Some(to)) = (
                        src.get(run.src..run.src + run.len),
                        dst.get_mut(run.dst..run.dst + run.len),
                    ) else {
                        continue;
                    };
                    to.copy_from_slice(from);
                }
                Ok(())
            });
        }
        let opts = &self.inner().opts;
        let (concurrency, most) =
            crate::policy::io_defaults(std::iter::once(file.source()), opts.caller_reads());
        // One tensor's pieces: small enough that it keeps every reader busy
        // (a mount serves each request after its latency), never under 1 MiB.
        let piece = (plan.len / concurrency.start).clamp(1 << 20, most.max(1 << 20));
        owned(
            file,
            name,
            info.dtype(),
            plan.shape.clone(),
            plan.len,
            |dst| read_runs(file, info.offset, &plan, dst, concurrency, piece),
        )
    }

    /// The tensor called `name`: a zero-copy view of the file's map where
    /// the file is mapped, else its bytes read with positional reads into an
    /// allocation of its own (aligned for its dtype), exactly its bytes.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::TensorNotFound`], or the read's error naming the file and
    /// the offset (a file that shrank is
    /// [`ErrorKind::SizeMismatch`]).
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let info = self.info(name)?;
        let file = self.file_of(info)?;
        if let Some(storage) = file.map() {
            return view(info, storage);
        }
        read_whole(file, info, None)
    }

    /// Reads the bytes of `name` into `dst`, memory the caller owns (an
    /// engine's tensor storage, a pinned staging buffer): one copy from the
    /// map, or positional reads straight into `dst`.
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
        read_exact(file, dst, info.offset)
    }
}

/// A tensor of `len` bytes of its own, filled by `fill`.
fn owned(
    file: &OpenedFile,
    name: Arc<str>,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    len: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<Tensor> {
    let mut buffer =
        Buffer::new(len).map_err(|e| Error::io(Operation::Allocate, file.path(), None, e))?;
    fill(buffer.bytes_mut())?;
    let storage = buffer
        .seal(file.path().to_path_buf(), None)
        .map_err(|e| Error::io(Operation::Seal, file.path(), None, e))?;
    Tensor::new(name, dtype, shape, Arc::new(storage), 0..len)
}

/// Reads the runs of `plan` (of the tensor at `base` in `file`) into `dst`:
/// the plan's reads (runs less than [`MERGE_GAP`] apart merged), each cut
/// in pieces of `piece` bytes, through the read engine's queue. A read of
/// exactly one run lands in `dst`; a merged one in a buffer of its own, its
/// runs then copied out.
fn read_runs(
    file: &OpenedFile,
    base: u64,
    plan: &SlicePlan,
    dst: &mut [u8],
    concurrency: Concurrency,
    piece: usize,
) -> Result<()> {
    let reads = plan.reads(MERGE_GAP);
    // Runs are in increasing order of `dst`, so `dst` splits into one slice
    // per direct read; merged reads get scratch buffers.
    let mut scratch: Vec<Vec<u8>> = reads
        .iter()
        .filter(|r| r.runs.len() > 1)
        .map(|r| vec![0u8; r.src.len()])
        .collect();
    let jobs = queue_reads(file, base, plan, &reads, dst, &mut scratch, piece);
    // Scratch vectors and a caller's tensor: no page size is advised.
    let pages = PageSizes::unadvised();
    // A lazy read is the caller's own, not a load's: no cancel flag stops it.
    let (result, _, _) = jobs::run(jobs, concurrency, &pages, &|_, _| {}, &Cancel::NONE);
    if let Err(failure) = result {
        return Err(read_error(
            Operation::Read,
            file.source(),
            file.size(),
            failure.offset,
            failure.error,
        ));
    }
    let mut scratch_iter = scratch.iter();
    for read in reads.iter().filter(|r| r.runs.len() > 1) {
        let Some(buffer) = scratch_iter.next() else {
            break;
        };
        for run in plan.runs.get(read.runs.clone()).unwrap_or_default() {
            let from = run.src - read.src.start;
            let (Some(src), Some(to)) = (
                buffer.get(from..from + run.len),
                dst.get_mut(run.dst..run.dst + run.len),
            ) else {
                continue;
            };
            to.copy_from_slice(src);
        }
    }
    Ok(())
}

/// The jobs of `reads`: a read of one run straight into its place in
/// `dst`, a merged one into its scratch buffer, each cut in pieces of
/// `piece` bytes.
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
    let mut rest: &mut [u8] = dst;
    let mut at = 0usize;
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
            let Some((_, tail)) = rest.split_at_mut_checked(run.dst - at) else {
                break;
            };
            let Some((into, tail)) = tail.split_at_mut_checked(run.len) else {
                break;
            };
            rest = tail;
            at = run.dst + run.len;
            into
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

/// `info` read with positional reads into an allocation of its own
/// (page-aligned, so aligned for every dtype), made read-only: exactly the
/// tensor's bytes, whether or not the file is mapped; `guard`, where given,
/// is dropped with them.
pub(super) fn read_whole(
    file: &OpenedFile,
    info: &TensorInfo,
    guard: Option<Box<dyn Send + Sync>>,
) -> Result<Tensor> {
    let len = usize_of(info.nbytes, file)?;
    let mut buffer =
        Buffer::new(len).map_err(|e| Error::io(Operation::Allocate, file.path(), None, e))?;
    read_exact(file, buffer.bytes_mut(), info.offset)?;
    let storage = buffer
        .seal(file.path().to_path_buf(), guard)
        .map_err(|e| Error::io(Operation::Seal, file.path(), None, e))?;
    tensor_of(info, Arc::new(storage), 0..len)
}

/// `info` at `range` of `storage`: its name, dtype and shape, the length
/// checked against them.
fn tensor_of(info: &TensorInfo, storage: Arc<Storage>, range: Range<usize>) -> Result<Tensor> {
    Tensor::new(
        Arc::from(info.name()),
        info.dtype(),
        info.shape().to_vec(),
        storage,
        range,
    )
}

/// A view of a mapped file's bytes of `info`.
fn view(info: &TensorInfo, storage: &Arc<Storage>) -> Result<Tensor> {
    let range = range_in(info, storage)?;
    tensor_of(info, Arc::clone(storage), range)
}

/// Where `info`'s bytes are in its file's map; the header was checked
/// against the file's length when it was opened, so this fails only for a
/// map of another length.
fn range_in(info: &TensorInfo, storage: &Storage) -> Result<std::ops::Range<usize>> {
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

/// `bytes` as a length in memory, or the file's error that it cannot be.
fn usize_of(bytes: u64, file: &OpenedFile) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| {
        Error::new(
            ErrorKind::InsufficientMemory {
                needed: bytes,
                available: usize::MAX as u64,
            },
            file.path(),
        )
    })
}

/// Fills `dst` from the file at `offset`, retrying short reads; a file that
/// ends early is [`ErrorKind::SizeMismatch`].
pub(crate) fn read_exact(file: &OpenedFile, dst: &mut [u8], offset: u64) -> Result<()> {
    let len = dst.len();
    file.source()
        .read_at(dst, len, offset)
        .map_err(|(at, e)| read_error(Operation::Read, file.source(), file.size(), at, e))
}
