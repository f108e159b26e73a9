//! The OS layer where there is no Linux: reads through the standard library, every hint a no-op, every Linux-only question answered "unsupported".
// Each item's doc is linux.rs's; here only the answer where it differs.

use std::fs::{File, Metadata};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use memmap2::Mmap;

use super::{EntryKind, NameKind, ProcFile};

pub(crate) const MOUNT_DETECTION: bool = false;

fn unsupported<T>() -> io::Result<T> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

fn refused<T>(why: &str) -> io::Result<T> {
    Err(io::Error::new(io::ErrorKind::InvalidInput, why.to_string()))
}

/// Functions whose answer here does not depend on their arguments.
macro_rules! fixed {
    () => {};
    ($vis:vis fn $name:ident(&self $(, $arg:ty)*) $(-> $ret:ty)? = $answer:expr; $($rest:tt)*) => {
        $vis fn $name(&self $(, _: $arg)*) $(-> $ret)? { $answer }
        fixed!($($rest)*);
    };
    ($vis:vis fn $name:ident($($arg:ty),*) $(-> $ret:ty)? = $answer:expr; $($rest:tt)*) => {
        $vis fn $name($(_: $arg),*) $(-> $ret)? { $answer }
        fixed!($($rest)*);
    };
}

// Hints are no-ops, what cannot be seen is unknown (a process is taken to
// exist, a lock is always granted, a path is taken as not writable).
fixed! {
    pub(crate) fn populate_write(&mut [u8]) = ();
    pub(crate) fn populate_read(&Mmap, usize, usize) -> io::Result<()> = Ok(());
    pub(crate) fn advise_page_size(&mut [u8], bool) = ();
    pub(crate) fn advise_page_size_of_range(usize, usize, bool) = ();
    pub(crate) fn thread_cpu_time() -> Option<Duration> = None;
    pub(crate) fn let_go(&Mmap, usize, usize) = ();
    pub fn evict(&File) -> io::Result<()> = Ok(());
    pub fn advise_willneed(&File, u64, u64) -> io::Result<()> = Ok(());
    pub fn page_size() -> u64 = 4096;
    pub fn cached_pages(&File, u64, u64) -> io::Result<u64> = unsupported();
    pub fn mincore_pages(&Mmap, usize, usize, &mut Vec<u8>) -> io::Result<u64> = unsupported();
    pub(crate) fn flock(&File, bool) -> io::Result<bool> = Ok(true);
    pub(crate) fn pid_exists(u32) -> bool = true;
    pub fn parent_pid() -> u32 = 0;
    pub fn effective_uid() -> Option<u32> = None;
    pub(crate) fn address_space_limit() -> Option<u64> = None;
    pub fn file_owner(&Metadata) -> Option<u32> = None;
    pub fn file_id(&Metadata) -> Option<(u64, u64)> = None;
    pub fn device_number(&Metadata) -> Option<u64> = None;
    pub fn may_write(&Path) -> bool = false;
    pub(crate) fn filesystem_magic(&Path) -> io::Result<u64> = unsupported();
    pub(crate) fn filesystem_magic_of(&File) -> io::Result<u64> = unsupported();
    pub fn readahead_limit(u64) -> Option<u64> = None;
    pub fn open_private_rw(&Path) -> io::Result<File> = unsupported();
    pub(crate) fn is_direct(&File) -> bool = false;
    pub(crate) fn path_of(&File) -> Option<PathBuf> = None;
    // No `/proc`: mount detection says "unknown", the memory guard has no
    // figures, a process's start time is unknown, and there are no huge pages.
    pub(crate) fn read_proc(ProcFile) -> io::Result<Vec<u8>> = unsupported();
    // No node copy: each rank reads on its own.
    pub fn memfd_copy(&str, u64) -> io::Result<File> = unsupported();
    pub fn is_sealed_copy(&File, u64) -> bool = false;
    pub fn link_count(&Metadata) -> Option<u64> = None;
    // No space reservation: writes may find the disk full.
    pub fn reserve(&File, u64) -> io::Result<bool> = Ok(false);
    pub fn idle_priority() = ();
}

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

pub fn open_regular(path: &Path) -> io::Result<File> {
    super::regular(File::open(path)?)
}

pub(crate) fn set_direct(_file: &File, on: bool) -> io::Result<()> {
    if on { unsupported() } else { Ok(()) }
}

/// Exact on Unix, UTF-8 (lossy) elsewhere.
pub(crate) fn path_from_bytes(bytes: Vec<u8>) -> PathBuf {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        PathBuf::from(std::ffi::OsString::from_vec(bytes))
    }
    #[cfg(not(unix))]
    {
        PathBuf::from(String::from_utf8_lossy(&bytes).into_owned())
    }
}

pub(crate) fn name_kind(meta: &Metadata) -> NameKind {
    let t = meta.file_type();
    if t.is_file() {
        NameKind::File
    } else if t.is_symlink() {
        NameKind::Symlink
    } else if t.is_dir() {
        NameKind::Directory
    } else {
        NameKind::Other
    }
}

/// No shared maps: [`SharedWords::map`] always fails, and prefetch splits
/// the work statically.
pub struct SharedWords(());

impl SharedWords {
    fixed! {
        pub fn map(&File) -> io::Result<SharedWords> = unsupported();
        pub fn words(&self) -> &[AtomicU64] = &[];
    }
}

/// No node copy to fill: nothing maps one.
pub(crate) struct SharedBytes(());

impl SharedBytes {
    fixed! {
        pub(crate) fn map(&File, Option<bool>) -> io::Result<SharedBytes> = unsupported();
        pub(crate) fn addresses(&self) -> std::ops::Range<usize> = 0..0;
    }

    pub(crate) fn read_from(
        &self,
        _at: usize,
        _len: usize,
        offset: u64,
        _read: impl FnOnce(&mut [u8]) -> Result<(), (u64, io::Error)>,
    ) -> Result<(), (u64, io::Error)> {
        unsupported().map_err(|e| (offset, e))
    }

    pub(crate) fn write_with<R>(
        &self,
        _at: usize,
        _len: usize,
        _write: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        unsupported()
    }
}

/// No file handoff between processes: nothing binds a listener.
pub struct FdListener(());

pub struct StopListening(());

pub struct FdStream(());

impl StopListening {
    fixed! {
        pub fn stop(&self) = ();
    }
}

impl FdListener {
    fixed! {
        pub fn bind(&Path) -> io::Result<FdListener> = unsupported();
        pub fn stopper(&self) -> StopListening = StopListening(());
        pub fn next(&self) -> io::Result<Option<FdStream>> = unsupported();
    }
}

impl FdStream {
    fixed! {
        pub fn connect(&Path, Duration) -> io::Result<FdStream> = unsupported();
        pub fn set_timeout(&self, Duration) -> io::Result<()> = unsupported();
        pub fn peer(&self) -> io::Result<(u32, u32)> = unsupported();
        pub fn send(&self, &[u8], &[&File]) -> io::Result<()> = unsupported();
        pub fn recv(&self, &mut [u8], usize) -> io::Result<(usize, Vec<File>)> = unsupported();
    }
}

/// A directory resolved once (its canonical path): files opened through it
/// come from that directory, though a symlink flipped between the opens of
/// a load can still be seen where there is no `openat`.
#[derive(Debug)]
pub struct Dir {
    path: PathBuf,
}

// Without `openat` a name can change between a check and its use, which
// `linux_cache.rs` rules out; each call still refuses to follow a symlink
// where it checks for one.
impl Dir {
    pub fn open(path: &Path) -> io::Result<Dir> {
        let path = std::fs::canonicalize(path)?;
        if !path.is_dir() {
            return refused("not a directory");
        }
        Ok(Dir { path })
    }

    pub fn open_regular(&self, name: &str) -> io::Result<File> {
        open_regular(&self.path.join(name))
    }

    pub fn is_file(&self, name: &str) -> bool {
        self.path.join(name).is_file()
    }

    pub fn names(&self) -> io::Result<Vec<String>> {
        std::fs::read_dir(&self.path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }

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

    pub fn sub(&self, name: &str, create: bool) -> io::Result<Dir> {
        let path = self.path.join(name);
        if create {
            match std::fs::create_dir(&path) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        if !std::fs::symlink_metadata(&path)?.is_dir() {
            return refused("not a directory");
        }
        Ok(Dir { path })
    }

    pub fn read_link(&self, name: &str) -> io::Result<PathBuf> {
        std::fs::read_link(self.path.join(name))
    }

    pub fn open_nofollow(&self, name: &str) -> io::Result<File> {
        let path = self.path.join(name);
        if !std::fs::symlink_metadata(&path)?.is_file() {
            return refused("not a regular file");
        }
        open_regular(&path)
    }

    pub fn create_new(&self, name: &str) -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.path.join(name))
    }

    pub fn open_lock(&self, name: &str) -> io::Result<File> {
        if matches!(self.entry(name)?, EntryKind::Link | EntryKind::Other) {
            return refused("not a regular file");
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.path.join(name))
    }

    /// A hard link, which never replaces, then the removal of `from`.
    pub fn rename_noreplace(&self, from: &str, to: &str) -> io::Result<bool> {
        match std::fs::hard_link(self.path.join(from), self.path.join(to)) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            other => other?,
        }
        std::fs::remove_file(self.path.join(from))?;
        Ok(true)
    }

    pub fn replace(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.path.join(from), self.path.join(to))
    }

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

    pub fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.path.join(name))
    }

    pub fn remove_dir(&self, name: &str) -> io::Result<()> {
        if self.entry(name)? != EntryKind::Dir {
            return refused("not a directory");
        }
        std::fs::remove_dir(self.path.join(name))
    }

    /// `None` where the platform has no uids.
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
