//! Where a file's bytes land: the `Fill` seam (memory the read engine writes, then seals read-only for tensors to view), and its first implementation, an owned aligned buffer (faulted in by `pages.rs`).
//!
//! `docs/ARCHITECTURE.md`, "The two seams", writes the contract out.

pub mod device;
pub mod node;
pub mod pages;

use std::io;
use std::path::Path;

use crate::storage::{self, Storage};

/// Memory a load fills, then seals.
///
/// # Contract
///
/// - [`bytes_mut`](Self::bytes_mut) is the whole destination, page-aligned
///   (so aligned for every dtype and for direct I/O), zero where never
///   written; the read engine writes disjoint parts of it from many threads
///   through `split_at_mut`, never the same byte twice.
/// - [`seal`](Self::seal) is called once, after every write, and gives the
///   read-only [`Storage`] that tensors view through an `Arc`; nothing writes
///   the bytes after that, and they stay valid for as long as a tensor holds
///   the storage, whatever happens to the file they came from.
pub(crate) trait Fill: Send {
    /// The bytes to write.
    fn bytes_mut(&mut self) -> &mut [u8];

    /// Makes the bytes read-only; `path` names the file they hold.
    fn seal(self: Box<Self>, path: &Path) -> io::Result<Storage>;
}

/// An anonymous, page-aligned allocation owned by the load
/// ([`storage::Buffer`]), faulted in by the read engine
/// ([`pages::PageSizes`]).
impl Fill for storage::Buffer {
    fn bytes_mut(&mut self) -> &mut [u8] {
        storage::Buffer::bytes_mut(self)
    }

    fn seal(self: Box<Self>, path: &Path) -> io::Result<Storage> {
        storage::Buffer::seal(*self, path.to_path_buf(), None)
    }
}
