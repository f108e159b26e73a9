//! Reads from an opened checkpoint: one tensor, or its bytes into memory the caller owns; a view of the map where the file is mapped, positional reads of exactly its bytes where it is not.

use std::sync::Arc;

use memmap2::Mmap;

use super::{Checkpoint, TensorInfo};
use crate::checkpoint::open::{OpenFile, read_error};
use crate::error::{Error, ErrorKind, Result};
use crate::os;
use crate::storage::{self, Storage};
use crate::tensor::Tensor;

impl Checkpoint {
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
        if let Some(storage) = file.mapped() {
            return view(info, storage);
        }
        let map = read_sealed(file, info)?;
        let len = map.len();
        let storage = Arc::new(Storage::new(map, file.path.clone()));
        Ok(Tensor::new(
            Arc::from(info.name()),
            info.dtype(),
            info.shape().to_vec(),
            storage,
            0..len,
        ))
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
                    tensor: info.name().to_string(),
                    expected: info.nbytes,
                    actual: dst.len() as u64,
                },
                &file.path,
            ));
        }
        if let Some(storage) = file.mapped() {
            let range = range_in(info, storage)?;
            let src = storage.bytes().get(range).unwrap_or_default();
            dst.copy_from_slice(src);
            return Ok(());
        }
        read_exact(file, dst, info.offset)
    }
}

/// The bytes of `info` read with positional reads into an allocation of
/// their own (page-aligned, so aligned for every dtype), made read-only:
/// exactly the tensor's bytes, whether or not the file is mapped.
pub(super) fn read_sealed(file: &OpenFile, info: &TensorInfo) -> Result<Mmap> {
    let len = usize_of(info.nbytes, file)?;
    let mut buffer = storage::alloc_buffer(len)
        .map_err(|e| Error::io("allocating a buffer for", &file.path, None, e))?;
    let dst = buffer.get_mut(..len).unwrap_or_default();
    read_exact(file, dst, info.offset)?;
    buffer
        .make_read_only()
        .map_err(|e| Error::io("sealing the buffer of", &file.path, None, e))
}

/// A view of a mapped file's bytes of `info`.
fn view(info: &TensorInfo, storage: &Arc<Storage>) -> Result<Tensor> {
    let range = range_in(info, storage)?;
    Ok(Tensor::new(
        Arc::from(info.name()),
        info.dtype(),
        info.shape().to_vec(),
        Arc::clone(storage),
        range,
    ))
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
fn usize_of(bytes: u64, file: &OpenFile) -> Result<usize> {
    usize::try_from(bytes).map_err(|_| {
        Error::new(
            ErrorKind::InsufficientMemory {
                needed: bytes,
                available: usize::MAX as u64,
            },
            &file.path,
        )
    })
}

/// Fills `dst` from the file at `offset`, retrying short reads; a file that
/// ends early is [`ErrorKind::SizeMismatch`].
pub(crate) fn read_exact(file: &OpenFile, dst: &mut [u8], offset: u64) -> Result<()> {
    os::read_exact_at(&file.file, dst, offset)
        .map_err(|(at, e)| read_error("reading", &file.file, &file.path, file.size, at, e))
}
