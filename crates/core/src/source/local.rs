//! A file on this machine as a source: one descriptor, opened once per load, through which every byte of the load is read.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use memmap2::Mmap;

use super::{Source, Version, VersionTag};
use crate::mount::{self, Mount, MountTable};
use crate::os::{self, DirectDropped};
use crate::storage;

/// A local file, opened once: every read of a load goes through its one
/// descriptor, as a second open of the path could reach another version (on
/// FUSE even a reopen of `/proc/self/fd/N`).
#[derive(Debug)]
#[doc(hidden)]
pub struct LocalFile {
    path: PathBuf,
    canonical: PathBuf,
    file: File,
    mount: Option<Mount>,
    version: Version,
    /// Why a read took `O_DIRECT` off the descriptor, for the report.
    direct_dropped: Mutex<Option<DirectDropped>>,
}

impl LocalFile {
    /// Takes an opened file, its mount looked up in `table`.
    pub fn new(path: PathBuf, file: File, table: Option<&MountTable>) -> io::Result<Self> {
        let meta = file.metadata()?;
        // The file as opened, symlinks resolved then (a Hugging Face cache
        // snapshot links every file into `blobs/`, maybe on another mount).
        let canonical = os::path_of(&file)
            .or_else(|| std::fs::canonicalize(&path).ok())
            .unwrap_or_else(|| path.clone());
        let mount = table.and_then(|table| mount::lookup_file_in(table, &file, &canonical).ok());
        let tag = match (os::file_id(&meta), meta.modified()) {
            (Some((dev, ino)), Ok(mtime)) => VersionTag::Inode {
                dev,
                ino,
                mtime_ns: mtime
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as i128),
            },
            _ => VersionTag::Unknown,
        };
        Ok(LocalFile {
            path,
            canonical,
            file,
            mount,
            version: Version {
                len: meta.len(),
                tag,
            },
            direct_dropped: Mutex::new(None),
        })
    }

    /// The one descriptor of the file.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The path with symlinks resolved when the file was opened.
    pub fn canonical(&self) -> &Path {
        &self.canonical
    }

    /// A read-only map of the whole file.
    pub(crate) fn map(&self) -> io::Result<Mmap> {
        storage::map_file(&self.file)
    }

    /// Turns `O_DIRECT` on or off for every read through the descriptor.
    pub(crate) fn set_direct(&self, on: bool) -> io::Result<()> {
        if on {
            self.take_direct_dropped();
        }
        os::set_direct(&self.file, on)
    }

    /// Why a read took `O_DIRECT` off since it was last turned on.
    pub(crate) fn take_direct_dropped(&self) -> Option<DirectDropped> {
        self.direct_dropped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
    }

    /// Whether at least half of the file's pages are in the page cache.
    pub(crate) fn mostly_cached(&self) -> bool {
        let pages = self.len().div_ceil(os::page_size());
        os::cached_pages(&self.file, 0, 0).is_ok_and(|cached| cached.saturating_mul(2) >= pages)
    }

    /// The file's length now, by `fstat` (a file may shrink during a load).
    pub fn len_now(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
}

impl Source for LocalFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn version(&self) -> &Version {
        &self.version
    }

    fn read_at(
        &self,
        dst: &mut [u8],
        required: usize,
        offset: u64,
    ) -> Result<(), (u64, io::Error)> {
        let dropped = os::read_at_least_noting(&self.file, dst, required, offset)?;
        if let Some(why) = dropped {
            *self
                .direct_dropped
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(why);
        }
        Ok(())
    }

    fn mount(&self) -> Option<&Mount> {
        self.mount.as_ref()
    }

    fn local(&self) -> Option<&LocalFile> {
        Some(self)
    }
}
/// `O_DIRECT` on local files' descriptors for as long as this lives: the
/// one guard of every read that bypasses the page cache.
#[derive(Default)]
pub struct DirectGuard<'a>(Vec<&'a LocalFile>);

impl<'a> DirectGuard<'a> {
    /// Turns `O_DIRECT` on for `file` until the guard is dropped.
    pub fn add(&mut self, file: &'a LocalFile) -> io::Result<()> {
        file.set_direct(true)?;
        self.0.push(file);
        Ok(())
    }

    /// Whether any descriptor has `O_DIRECT` on.
    pub(crate) fn is_on(&self) -> bool {
        !self.0.is_empty()
    }

    /// Why a read took `O_DIRECT` off a descriptor, if one did.
    pub(crate) fn dropped(&self) -> Option<DirectDropped> {
        self.0.iter().find_map(|file| file.take_direct_dropped())
    }
}

impl Drop for DirectGuard<'_> {
    fn drop(&mut self) {
        for file in &self.0 {
            let _ = file.set_direct(false);
        }
    }
}
