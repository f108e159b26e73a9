//! A node copy as the place a file's bytes land: a sealed memory file that the local ranks of a job fill together, chunk by chunk, each straight into its place, then each map read-only.
//!
//! Not a `Fill`: several processes write it, each chunk by whoever claims
//! it; it ends as the same read-only [`Storage`], sealed against resizing.

use std::fs::File;
use std::io;
use std::path::Path;

use super::pages::HugePages;
use crate::os::{self, SharedBytes};
use crate::storage::{self, Storage};

/// A new, empty (zero) node copy for a file of `len` bytes.
pub fn create(len: u64) -> io::Result<File> {
    os::memfd_copy("safeload-node-copy", len)
}

/// The page size a node copy's pages are asked for: huge (`On`), base
/// (`Off`), or the host's `shmem_enabled` alone (`Auto`).
///
/// NOTE: the chunk queue measures no page size (`pages.rs` does), and shared
/// huge pages win or lose as the host backs them: `Auto` asks for nothing;
/// `MFD_HUGETLB`'s pool is not the crate's to take (BENCHMARKS.md,
/// "dest/node.rs: huge_page_advice").
pub fn huge_page_advice(huge_pages: HugePages) -> Option<bool> {
    match huge_pages {
        HugePages::On => Some(true),
        HugePages::Off => Some(false),
        HugePages::Auto => None,
    }
}

/// A node copy being filled by this process's readers.
pub struct CopyFill(SharedBytes, bool);

impl CopyFill {
    /// Maps `copy` for writing, its pages faulted in as `huge_pages` says
    /// ([`huge_page_advice`]).
    pub fn new(copy: &File, huge_pages: HugePages) -> io::Result<CopyFill> {
        SharedBytes::map(copy, huge_page_advice(huge_pages)).map(|m| CopyFill(m, false))
    }

    /// The same for a file of a filesystem (a cache's file), whose pages
    /// each read faults in whole before it fills them.
    ///
    /// NOTE: a write fault on a shared map of a file costs the filesystem a
    /// call per page (`page_mkwrite`); asked for a read's pages at once
    /// (`MADV_POPULATE_WRITE`) the kernel takes them in one pass
    /// (BENCHMARKS.md, "dest/node.rs: CopyFill::of_file").
    pub fn of_file(file: &File) -> io::Result<CopyFill> {
        SharedBytes::map(file, None).map(|m| CopyFill(m, true))
    }

    /// Reads `len` bytes of `from` at `offset` into the same offset of the
    /// copy (the copy is an image of the whole file).
    pub fn read_chunk(
        &self,
        from: &dyn crate::source::Source,
        offset: u64,
        len: u64,
    ) -> Result<(), (u64, io::Error)> {
        let (Ok(at), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err((offset, io::Error::from(io::ErrorKind::InvalidInput)));
        };
        let populate = self.1;
        self.0.read_from(at, len, offset, |dst| {
            if populate {
                crate::os::populate_write(dst);
            }
            from.read_at(dst, len, offset)
        })
    }

    /// The addresses the writable map of the copy spans in this process.
    pub fn addresses(&self) -> std::ops::Range<usize> {
        self.0.addresses()
    }

    /// Runs `write` on the copy's `len` bytes at `at` (the exchange's
    /// broadcast of a piece into its place).
    pub fn write_with<R>(
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
pub fn seal(copy: &File, path: &Path, guard: Box<dyn Send + Sync>) -> io::Result<Storage> {
    let map = storage::map_file(copy)?;
    Ok(Storage::of_file(map, path.to_path_buf(), Some(guard)))
}
