//! A node copy as the place a file's bytes land: a sealed memory file that the local ranks of a job fill together, chunk by chunk, each straight into its place, then each map read-only.
//!
//! It is not a [`Fill`](super::Fill): the read engine fills a destination
//! of one process through `&mut` slices, while a node copy is written by
//! the chunk queue's readers of several processes (`prefetch/fill.rs`), each
//! chunk by whoever claims it. What it shares with the owned buffer is the
//! end: a read-only [`Storage`] that tensors view through an `Arc`, whose
//! bytes no one can change or truncate (the memory file is sealed against
//! shrinking and growing, and nothing writes it once the fill is over).

use std::fs::File;
use std::io;
use std::path::Path;

use crate::os::{self, SharedBytes};
use crate::storage::{self, Storage};

/// A new, empty (zero) node copy for a file of `len` bytes.
pub(crate) fn create(len: u64) -> io::Result<File> {
    os::memfd_copy("safeload-node-copy", len)
}

/// A node copy being filled by this process's readers.
pub(crate) struct CopyFill(SharedBytes);

impl CopyFill {
    /// Maps `copy` for writing.
    pub(crate) fn new(copy: &File) -> io::Result<CopyFill> {
        SharedBytes::map(copy).map(CopyFill)
    }

    /// Reads `len` bytes of `from` at `offset` into the same offset of the
    /// copy (the copy is an image of the whole file).
    pub(crate) fn read_chunk(
        &self,
        from: &dyn crate::source::Source,
        offset: u64,
        len: u64,
    ) -> Result<(), (u64, io::Error)> {
        let (Ok(at), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err((offset, io::Error::from(io::ErrorKind::InvalidInput)));
        };
        self.0
            .read_from(at, len, offset, |dst| from.read_at(dst, len, offset))
    }
}

impl CopyFill {
    /// The addresses the writable map of the copy spans in this process.
    pub(crate) fn addresses(&self) -> std::ops::Range<usize> {
        self.0.addresses()
    }

    /// Runs `write` on the copy's `len` bytes at `at` (the exchange's
    /// broadcast of a piece into its place).
    pub(crate) fn write_with<R>(
        &self,
        at: u64,
        len: u64,
        write: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        let (Ok(at), Ok(len)) = (usize::try_from(at), usize::try_from(len)) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        self.0.write_with(at, len, write)
    }
}

/// The filled copy, read-only, for the tensors of the file at `path`:
/// `guard` is dropped with the last of them (the rank's part in handing
/// the copy out ends then).
pub(crate) fn seal(copy: &File, path: &Path, guard: Box<dyn Send + Sync>) -> io::Result<Storage> {
    let map = storage::map_file(copy)?;
    Ok(Storage::with_drop_guard(map, path.to_path_buf(), guard))
}
