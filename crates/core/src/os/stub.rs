//! The OS layer where there is no Linux: reads through the standard library, every hint a no-op, every Linux-only question answered "unsupported".

use std::fs::{File, Metadata};
use std::io;
use std::path::Path;
use std::sync::atomic::AtomicU64;

use memmap2::Mmap;

/// Whether this platform has a mount table and filesystem magic numbers.
pub(crate) const MOUNT_DETECTION: bool = false;

fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// One positional read; may return fewer bytes than asked.
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        std::os::windows::fs::FileExt::seek_read(file, buf, offset)
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = (file, buf, offset);
        unsupported()
    }
}

/// Opens `path` for reading, refusing anything but a regular file.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = File::open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// No populate advice here: the read faults its pages in.
pub(crate) fn populate_write(_dst: &mut [u8]) {}

/// No populate advice here: the map stays lazy.
pub(crate) fn populate_read(_map: &Mmap, _offset: usize, _len: usize) -> io::Result<()> {
    Ok(())
}

/// No huge pages here.
pub(crate) fn advise_page_size(_dst: &mut [u8], _huge: bool) {}

/// No huge pages here.
pub(crate) fn advise_page_size_of_range(_addr: usize, _len: usize, _huge: bool) {}

/// No thread CPU clock here: fresh memory's cost is not measured.
pub(crate) fn thread_cpu_time() -> Option<std::time::Duration> {
    None
}

/// Lets go of a map's pages: a no-op here.
pub(crate) fn let_go(_map: &Mmap, _offset: usize, _len: usize) {}

/// No page-cache eviction here.
pub fn evict(_file: &File) -> io::Result<()> {
    Ok(())
}

/// No read-ahead advice here.
pub fn advise_willneed(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    Ok(())
}

/// 4 KiB, the common page size.
pub fn page_size() -> u64 {
    4096
}

/// Residency cannot be seen here.
pub fn cached_pages(_file: &File, _offset: u64, _len: u64) -> io::Result<u64> {
    unsupported()
}

/// Residency cannot be seen here.
pub fn mincore_pages(
    _map: &Mmap,
    _offset: usize,
    _len: usize,
    _vec: &mut Vec<u8>,
) -> io::Result<u64> {
    unsupported()
}

/// No locks here: always granted, and released.
pub(crate) fn flock(_file: &File, _take: bool) -> io::Result<bool> {
    Ok(true)
}

/// Liveness cannot be asked here: every process is taken to exist.
pub(crate) fn pid_exists(_pid: u32) -> bool {
    true
}

/// Unknown here.
pub fn parent_pid() -> u32 {
    0
}

/// Unknown here.
pub fn effective_uid() -> Option<u32> {
    None
}

/// Unknown here: no limit is seen.
pub(crate) fn address_space_limit() -> Option<u64> {
    None
}

/// Unknown here.
pub fn file_owner(_meta: &Metadata) -> Option<u32> {
    None
}

/// Unknown here.
pub fn file_id(_meta: &Metadata) -> Option<(u64, u64)> {
    None
}

/// Unknown here.
pub fn device_number(_meta: &Metadata) -> Option<u64> {
    None
}

/// Unknown here: taken as not writable.
pub fn may_write(_path: &Path) -> bool {
    false
}

/// No `statfs` here.
pub(crate) fn filesystem_magic(_path: &Path) -> io::Result<u64> {
    unsupported()
}

/// No `fstatfs` here.
pub(crate) fn filesystem_magic_of(_file: &File) -> io::Result<u64> {
    unsupported()
}

/// Unknown here.
pub fn readahead_limit(_dev: u64) -> Option<u64> {
    None
}

/// No shared queue files here.
pub fn open_private_rw(_path: &Path) -> io::Result<File> {
    unsupported()
}

/// No shared maps here: [`SharedWords::map`] always fails, and prefetch
/// splits the work statically.
pub struct SharedWords {
    _never: (),
}

impl SharedWords {
    /// Always unsupported here.
    pub fn map(_file: &File) -> io::Result<SharedWords> {
        unsupported()
    }

    /// Never reached: no value of this type is made here.
    pub fn words(&self) -> &[AtomicU64] {
        &[]
    }
}

/// A path from bytes: exact on Unix, UTF-8 (lossy) elsewhere.
pub(crate) fn path_from_bytes(bytes: Vec<u8>) -> std::path::PathBuf {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes))
    }
    #[cfg(not(unix))]
    {
        std::path::PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// A directory resolved once (its canonical path): files opened through it
/// come from that directory, though a symlink flipped between the opens of
/// a load can still be seen where there is no `openat`.
#[derive(Debug)]
pub struct Dir {
    path: std::path::PathBuf,
}

impl Dir {
    /// Resolves the directory at `path`.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let path = std::fs::canonicalize(path)?;
        if !path.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a directory",
            ));
        }
        Ok(Dir { path })
    }

    /// Opens `name` in this directory, refusing anything but a regular file.
    pub fn open_regular(&self, name: &str) -> io::Result<File> {
        open_regular(&self.path.join(name))
    }

    /// Whether `name` in this directory is a regular file.
    pub fn is_file(&self, name: &str) -> bool {
        self.path.join(name).is_file()
    }

    /// The names of the entries.
    pub fn names(&self) -> io::Result<Vec<String>> {
        std::fs::read_dir(&self.path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }
}

/// No direct I/O here.
pub(crate) fn set_direct(_file: &File, on: bool) -> io::Result<()> {
    if on { unsupported() } else { Ok(()) }
}

/// Never: there is no direct I/O here.
pub(crate) fn is_direct(_file: &File) -> bool {
    false
}

/// Unknown here.
pub(crate) fn path_of(_file: &File) -> Option<std::path::PathBuf> {
    None
}

/// No `/proc` here: mount detection says "unknown", the memory guard has no
/// figures, a process's start time is unknown, and there are no huge pages.
pub(crate) fn read_proc(_file: super::ProcFile) -> io::Result<Vec<u8>> {
    unsupported()
}

/// No memory files here: no node copy (each rank reads on its own).
pub fn memfd_copy(_name: &str, _len: u64) -> io::Result<File> {
    unsupported()
}

/// No memory files here.
pub fn is_sealed_copy(_file: &File, _len: u64) -> bool {
    false
}

/// No node copy to fill here.
pub(crate) struct SharedBytes(());

impl SharedBytes {
    /// Unsupported.
    pub(crate) fn map(_file: &File, _huge: Option<bool>) -> io::Result<SharedBytes> {
        unsupported()
    }

    /// Unsupported (never reached: nothing maps one).
    pub(crate) fn read_from(
        &self,
        _at: usize,
        _len: usize,
        offset: u64,
        _read: impl FnOnce(&mut [u8]) -> Result<(), (u64, io::Error)>,
    ) -> Result<(), (u64, io::Error)> {
        Err((offset, io::Error::from(io::ErrorKind::Unsupported)))
    }

    /// Nothing (never reached: nothing maps one).
    pub(crate) fn addresses(&self) -> std::ops::Range<usize> {
        0..0
    }

    /// Unsupported (never reached: nothing maps one).
    pub(crate) fn write_with<R>(
        &self,
        _at: usize,
        _len: usize,
        _write: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        unsupported()
    }
}

/// What a name is, as far as the standard library tells.
pub(crate) fn name_kind(meta: &Metadata) -> super::NameKind {
    let t = meta.file_type();
    if t.is_file() {
        super::NameKind::File
    } else if t.is_symlink() {
        super::NameKind::Symlink
    } else if t.is_dir() {
        super::NameKind::Directory
    } else {
        super::NameKind::Other
    }
}

/// No file handoff between processes here.
pub struct FdListener(());

/// No file handoff between processes here.
pub struct StopListening(());

impl StopListening {
    /// Nothing to stop (never reached: nothing binds a listener).
    pub fn stop(&self) {}
}

impl FdListener {
    /// Unsupported.
    pub fn bind(_path: &Path) -> io::Result<FdListener> {
        unsupported()
    }

    /// Never reached: nothing binds one.
    pub fn stopper(&self) -> StopListening {
        StopListening(())
    }

    /// Unsupported (never reached: nothing binds one).
    pub fn next(&self) -> io::Result<Option<FdStream>> {
        unsupported()
    }
}

/// No file handoff between processes here.
pub struct FdStream(());

impl FdStream {
    /// Unsupported.
    pub fn connect(_path: &Path, _timeout: std::time::Duration) -> io::Result<FdStream> {
        unsupported()
    }

    /// Unsupported.
    pub fn set_timeout(&self, _timeout: std::time::Duration) -> io::Result<()> {
        unsupported()
    }

    /// Unsupported.
    pub fn peer(&self) -> io::Result<(u32, u32)> {
        unsupported()
    }

    /// Unsupported.
    pub fn send(&self, _bytes: &[u8], _files: &[&File]) -> io::Result<()> {
        unsupported()
    }

    /// Unsupported.
    pub fn recv(&self, _buf: &mut [u8], _max_files: usize) -> io::Result<(usize, Vec<File>)> {
        unsupported()
    }
}

// The write-through cache (feature `remote`).
pub use cache_dir::{EntryKind, link_count, reserve, write_all_at};

mod cache_dir {
    use std::fs::File;
    use std::io;

    #[cfg(not(unix))]
    use super::unsupported;
    use super::{Dir, open_regular};

    /// What a name in a directory is, not following it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum EntryKind {
        /// No such name.
        Missing,
        /// A regular file of `len` bytes, last modified then.
        File {
            len: u64,
            modified: Option<std::time::SystemTime>,
        },
        /// A directory.
        Dir,
        /// A symbolic link (not followed).
        Link,
        /// Anything else.
        Other,
    }

    // The cache's calls by path: without `openat` a name can change between a
    // check and its use, which `linux.rs` rules out; each call still refuses to
    // follow a symlink where it checks for one.
    impl Dir {
        /// What `name` is here, without following it.
        pub fn entry(&self, name: &str) -> io::Result<EntryKind> {
            let meta = match std::fs::symlink_metadata(self.path.join(name)) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(EntryKind::Missing),
                Err(e) => return Err(e),
            };
            let kind = meta.file_type();
            Ok(if kind.is_file() {
                EntryKind::File {
                    len: meta.len(),
                    modified: meta.modified().ok(),
                }
            } else if kind.is_dir() {
                EntryKind::Dir
            } else if kind.is_symlink() {
                EntryKind::Link
            } else {
                EntryKind::Other
            })
        }

        /// The directory `name` here, made first where `create` asks; not
        /// through a symlink.
        pub fn sub(&self, name: &str, create: bool) -> io::Result<Dir> {
            let path = self.path.join(name);
            if create {
                match std::fs::create_dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
            }
            if !std::fs::symlink_metadata(&path)?.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a directory",
                ));
            }
            Ok(Dir { path })
        }

        /// The target of the symlink `name` here, as written.
        pub fn read_link(&self, name: &str) -> io::Result<std::path::PathBuf> {
            std::fs::read_link(self.path.join(name))
        }

        /// Opens the regular file `name` here for reading, not through a symlink.
        pub fn open_nofollow(&self, name: &str) -> io::Result<File> {
            let path = self.path.join(name);
            if !std::fs::symlink_metadata(&path)?.is_file() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a regular file",
                ));
            }
            open_regular(&path)
        }

        /// Creates the file `name` here for writing, where no name is.
        pub fn create_new(&self, name: &str) -> io::Result<File> {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(self.path.join(name))
        }

        /// Opens the lock file `name` here, making it where missing.
        pub fn open_lock(&self, name: &str) -> io::Result<File> {
            let path = self.path.join(name);
            if matches!(self.entry(name)?, EntryKind::Link | EntryKind::Other) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a regular file",
                ));
            }
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
        }

        /// Renames `from` to `to` here unless `to` exists (a hard link, which
        /// never replaces, then the removal of `from`): `false` where it does.
        pub fn rename_noreplace(&self, from: &str, to: &str) -> io::Result<bool> {
            match std::fs::hard_link(self.path.join(from), self.path.join(to)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
                Err(e) => return Err(e),
            }
            std::fs::remove_file(self.path.join(from))?;
            Ok(true)
        }

        /// Renames `from` to `to` here, replacing what `to` names.
        pub fn replace(&self, from: &str, to: &str) -> io::Result<()> {
            std::fs::rename(self.path.join(from), self.path.join(to))
        }

        /// Makes `name` here a symlink to `target`.
        pub fn symlink(&self, target: &str, name: &str) -> io::Result<()> {
            #[cfg(unix)]
            {
                std::os::unix::fs::symlink(target, self.path.join(name))
            }
            #[cfg(not(unix))]
            {
                let _ = (target, name);
                unsupported()
            }
        }

        /// Removes the file or symlink `name` here.
        pub fn remove(&self, name: &str) -> io::Result<()> {
            std::fs::remove_file(self.path.join(name))
        }

        /// Removes the empty directory `name` here (not through a symlink).
        pub fn remove_dir(&self, name: &str) -> io::Result<()> {
            if self.entry(name)? != EntryKind::Dir {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a directory",
                ));
            }
            std::fs::remove_dir(self.path.join(name))
        }

        /// The owner (uid) of `name` here, not following a symlink; `None`
        /// where the platform has no uids.
        pub fn owner(&self, name: &str) -> io::Result<Option<u32>> {
            let meta = std::fs::symlink_metadata(self.path.join(name))?;
            #[cfg(unix)]
            {
                Ok(Some(std::os::unix::fs::MetadataExt::uid(&meta)))
            }
            #[cfg(not(unix))]
            {
                let _ = meta;
                Ok(None)
            }
        }
    }

    /// Unknown here.
    pub fn link_count(_meta: &std::fs::Metadata) -> Option<u64> {
        None
    }

    /// No space reservation here: writes may find the disk full.
    pub fn reserve(_file: &File, _len: u64) -> io::Result<bool> {
        Ok(false)
    }

    /// Writes all of `buf` at `offset`.
    pub fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
        }
        #[cfg(not(unix))]
        {
            let _ = (file, buf, offset);
            unsupported()
        }
    }
}

/// No idle scheduling class here: the thread keeps its priority.
pub fn idle_priority() {}
