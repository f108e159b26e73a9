//! Thin wrappers over the OS calls the loader needs: positional reads that finish, and page-cache advice.

use std::fs::File;
use std::io;

use memmap2::Mmap;

/// Reads into `buf` at `offset` until at least `required` bytes have
/// arrived (all of `buf` if the file is long enough), retrying short reads
/// and `EINTR`. On failure returns the offset that failed along with the
/// error; end-of-file before `required` bytes is `UnexpectedEof` (the file
/// shrank).
pub(crate) fn read_at_least(
    file: &File,
    buf: &mut [u8],
    required: usize,
    offset: u64,
) -> Result<(), (u64, io::Error)> {
    #[cfg(unix)]
    use std::os::unix::fs::FileExt;
    #[cfg(windows)]
    use std::os::windows::fs::FileExt;
    let mut done = 0usize;
    while done < buf.len() {
        let at = offset + done as u64;
        let Some(rest) = buf.get_mut(done..) else {
            break;
        };
        #[cfg(unix)]
        let n = file.read_at(rest, at);
        #[cfg(windows)]
        let n = file.seek_read(rest, at);
        match n {
            Ok(0) if done >= required => break,
            Ok(0) => {
                return Err((
                    at,
                    io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file ended before the expected length",
                    ),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((at, e)),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes at `offset`; see [`read_at_least`].
pub(crate) fn read_exact_at(
    file: &File,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), (u64, io::Error)> {
    let len = buf.len();
    read_at_least(file, buf, len, offset)
}

/// Faults `len` bytes of a file map in at `offset` with
/// `MADV_POPULATE_READ` (Linux 5.14+, see madvise(2)), which reports an I/O
/// error or a truncated file as an error instead of raising `SIGBUS`. Where
/// the kernel lacks it, nothing is done: the map stays lazy.
pub(crate) fn populate_read(map: &Mmap, offset: usize, len: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        match map.advise_range(memmap2::Advice::PopulateRead, offset, len) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            other => other,
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (map, offset, len);
        Ok(())
    }
}

/// Opens `path` for reading, refusing anything but a regular file (after
/// symlinks): a FIFO or a device named by a hostile checkpoint must not block
/// the open or read as endless data. The open itself does not block
/// (`O_NONBLOCK`, which regular files ignore).
pub(crate) fn open_regular(path: &std::path::Path) -> io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// Opens `path` for direct I/O (`O_DIRECT`, bypassing the page cache), where
/// the platform has it.
pub(crate) fn open_direct(path: &std::path::Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT | libc::O_NONBLOCK)
            .open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = path;
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// The alignment direct I/O needs of offsets, lengths and buffers. 4 KiB
/// covers the logical block size of every common device.
pub(crate) const DIRECT_ALIGN: u64 = 4096;

/// Drops a file's clean pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`, see posix_fadvise(2)). Pages mapped
/// or dirty elsewhere stay. A no-op where unsupported.
pub(crate) fn evict(file: &File) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments; the fd is
        // valid for the duration of the call because `file` is borrowed.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
    Ok(())
}

// ---------------------------------------------------------------------------
// Page-cache prefetch: residency, advice, the shared queue's lock and map, and
// process liveness (see src/prefetch.rs).

/// The size of a page of memory (and of the page cache), in bytes.
pub(crate) fn page_size() -> u64 {
    #[cfg(unix)]
    {
        // SAFETY: sysconf only reads its integer argument.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
    }
    #[cfg(not(unix))]
    {
        4096
    }
}

/// How many pages of `file` in `[offset, offset + len)` are in the page
/// cache, from `cachestat(2)` (Linux 6.5+). The kernel answers `EPERM` for a
/// file the caller could not open for writing and does not own (the same
/// rule that makes `mincore(2)` silently report such pages as absent),
/// `ENOSYS` before 6.5, and `Unsupported` elsewhere. `len` 0 means to the end
/// of the file.
pub(crate) fn cached_pages(file: &File, offset: u64, len: u64) -> io::Result<u64> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        #[repr(C)]
        struct CachestatRange {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Cachestat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        // The same number on every architecture (syscalls after 403 share
        // one table); see include/uapi/asm-generic/unistd.h.
        const SYS_CACHESTAT: libc::c_long = 451;
        let range = CachestatRange { off: offset, len };
        let mut stat = Cachestat::default();
        // SAFETY: both pointers are to live, properly laid out `repr(C)`
        // values for the duration of the call; the kernel reads `range` and
        // writes `stat` only; the fd is valid because `file` is borrowed.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                file.as_raw_fd(),
                &range as *const CachestatRange,
                &mut stat as *mut Cachestat,
                0u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stat.nr_cache)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, offset, len);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// How many pages of `map` in `[offset, offset + len)` are in the page cache,
/// from `mincore(2)`. `offset` must be a multiple of the page size; `vec` is
/// scratch space, grown as needed. For a file the caller neither owns nor
/// may write, Linux 5.0+ reports only the pages this process has mapped in,
/// so a count of zero may be an understatement (see `can_do_mincore` in
/// mm/mincore.c).
pub(crate) fn mincore_pages(
    map: &Mmap,
    offset: usize,
    len: usize,
    vec: &mut Vec<u8>,
) -> io::Result<u64> {
    #[cfg(unix)]
    {
        let page = usize::try_from(page_size()).unwrap_or(4096);
        let end = offset.checked_add(len).filter(|&e| e <= map.len());
        if offset % page != 0 || end.is_none() {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        if len == 0 {
            return Ok(0);
        }
        let pages = len.div_ceil(page);
        vec.clear();
        vec.resize(pages, 0);
        // `offset..offset + len` lies within the map (checked above), so the
        // address is inside a live mapping owned by `map`, borrowed for the
        // call; `offset` and the map's base are page-aligned.
        // SAFETY: a page-aligned range of a live mapping, and `vec` holds one
        // byte per page of it, as mincore(2) writes.
        let rc = unsafe {
            libc::mincore(
                map.as_ptr().add(offset) as *mut libc::c_void,
                len,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64)
    }
    #[cfg(not(unix))]
    {
        let _ = (map, offset, len, vec);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Asks the kernel to read `[offset, offset + len)` of `file` into the page
/// cache in the background (`posix_fadvise(POSIX_FADV_WILLNEED)`). Each call
/// is clamped by the kernel to the larger of the device's read-ahead window
/// and its largest I/O (`force_page_cache_ra` in mm/readahead.c), so callers
/// issue it in pieces of that size. A no-op where unsupported.
pub(crate) fn advise_willneed(file: &File, offset: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len))
        else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        // SAFETY: posix_fadvise only reads its integer arguments; the fd is
        // valid for the duration of the call because `file` is borrowed.
        let rc = unsafe {
            libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_WILLNEED)
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
    Ok(())
}

/// Takes (`exclusive`) or releases (`!exclusive`) an advisory whole-file lock
/// with `flock(2)`, blocking until it is granted and retrying `EINTR`.
pub(crate) fn flock(file: &File, exclusive: bool) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let op = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_UN
        };
        loop {
            // SAFETY: flock only reads its integer arguments; the fd is valid
            // because `file` is borrowed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
            if rc == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (file, exclusive);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Whether the process `pid` may still exist: `kill(pid, 0)` fails with
/// `ESRCH` only for a pid with no process (see kill(2)); a zombie, or a
/// process of another user (`EPERM`), still answers that it exists.
pub(crate) fn pid_exists(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        if pid <= 0 {
            return false;
        }
        // SAFETY: signal 0 sends nothing; kill only checks that the process
        // exists and may be signalled.
        let rc = unsafe { libc::kill(pid, 0) };
        rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// The parent process's id (`getppid(2)`); 0 where there is none to ask.
pub(crate) fn parent_pid() -> u32 {
    #[cfg(unix)]
    {
        // SAFETY: getppid takes no arguments and cannot fail.
        let pid = unsafe { libc::getppid() };
        u32::try_from(pid).unwrap_or(0)
    }
    #[cfg(not(unix))]
    {
        0
    }
}

/// The effective user id (`geteuid(2)`); `None` off Unix.
pub(crate) fn effective_uid() -> Option<u32> {
    #[cfg(unix)]
    {
        // SAFETY: geteuid takes no arguments and cannot fail.
        Some(unsafe { libc::geteuid() })
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Whether this process may write `path` (`access(2)` with the effective
/// ids, `faccessat(AT_EACCESS)`), the test the kernel applies before it
/// reveals a file's page-cache residency to a non-owner.
pub(crate) fn may_write(path: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
            return false;
        };
        // SAFETY: `c_path` is a NUL-terminated string that lives for the
        // call; faccessat only reads it.
        let rc = unsafe {
            libc::faccessat(
                libc::AT_FDCWD,
                c_path.as_ptr(),
                libc::W_OK,
                libc::AT_EACCESS,
            )
        };
        rc == 0
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        false
    }
}

/// A file mapped shared and read-write, seen as 64-bit words that several
/// processes update with atomic operations: the prefetch queue.
///
/// Every process that maps the file sees the same memory, and `AtomicU64`
/// operations on it are atomic between processes as between threads (they
/// are lock-free instructions on the word itself, whatever its address).
/// The hazard is the file map's usual one: a process that truncates the file
/// while it is mapped makes the others receive `SIGBUS`. The queue file is
/// created `0600` and checked to be the caller's own before it is mapped, so
/// only the caller's own processes can do that.
pub(crate) struct SharedWords {
    map: memmap2::MmapMut,
}

impl SharedWords {
    /// Maps all of `file` shared and read-write. Its length must be a
    /// non-zero multiple of 8.
    pub(crate) fn map(file: &File) -> io::Result<SharedWords> {
        let len = file.metadata()?.len();
        if len == 0 || len % 8 != 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        // Its contents are only ever accessed as atomics (`words`), so
        // writers in other processes cannot cause a data race.
        // SAFETY: a shared map of a regular file accessed only atomically;
        // truncation by another process is the documented hazard above.
        let map = unsafe { memmap2::MmapOptions::new().map_mut(file)? };
        Ok(SharedWords { map })
    }

    /// The words of the map.
    pub(crate) fn words(&self) -> &[std::sync::atomic::AtomicU64] {
        let len = self.map.len() / 8;
        // The map is page-aligned, hence aligned for `AtomicU64`, and holds
        // `len` whole words; `AtomicU64` has the layout of `u64`, every bit
        // pattern is valid, and all access is atomic, also across processes.
        // SAFETY: aligned, in bounds, valid for the borrow of `self`.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr() as *const std::sync::atomic::AtomicU64,
                len,
            )
        }
    }
}

/// Turns the kernel's read-ahead off for reads through this descriptor
/// (`posix_fadvise(POSIX_FADV_RANDOM)`): a read then brings in the pages it
/// asks for and no more (`page_cache_sync_ra` in mm/readahead.c). A no-op
/// where unsupported.
pub(crate) fn advise_random(file: &File) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: posix_fadvise only reads its integer arguments; the fd is
        // valid for the duration of the call because `file` is borrowed.
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = file;
    Ok(())
}
