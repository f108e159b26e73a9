//! The Linux implementation of the OS layer: `rustix` for the calls it wraps safely, `libc` for `cachestat(2)` and `mincore(2)`, `std::fs` for `/proc`.

use std::fs::{File, Metadata};
use std::io;
use std::num::NonZeroU64;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::AtomicU64;

use memmap2::{Mmap, MmapMut};
use rustix::fs::{Access, AtFlags, FlockOperation, OFlags};

/// Whether this platform has a mount table and filesystem magic numbers.
pub(crate) const MOUNT_DETECTION: bool = true;

/// One positional read (`pread(2)`); may return fewer bytes than asked.
pub(crate) fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    file.read_at(buf, offset)
}

/// Opens `path` for reading, refusing anything but a regular file (after
/// symlinks): a FIFO or a device named by a hostile checkpoint must not block
/// the open (`O_NONBLOCK`, which regular files ignore) or read as endless data.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    super::regular(file)
}

/// Faults `len` bytes of a file map in at `offset` with
/// `MADV_POPULATE_READ` (Linux 5.14+, madvise(2)), which reports an I/O
/// error or a truncated file as an error instead of raising `SIGBUS`. Where
/// the kernel lacks it (`EINVAL`), the map stays lazy.
pub(crate) fn populate_read(map: &Mmap, offset: usize, len: usize) -> io::Result<()> {
    loop {
        match map.advise_range(memmap2::Advice::PopulateRead, offset, len) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.raw_os_error() == Some(super::EINVAL) => return Ok(()),
            other => return other,
        }
    }
}

/// Lets go of the pages of `len` bytes at `offset` of a read-only file map
/// (`MADV_DONTNEED`, madvise(2)): they leave this process's resident set and
/// stay in the page cache. A hint: errors are ignored.
pub(crate) fn let_go(map: &Mmap, offset: usize, len: usize) {
    let page = rustix::param::page_size();
    let first = offset / page * page;
    let end = offset.saturating_add(len).min(map.len());
    if end <= first {
        return;
    }
    // SAFETY: the map is a read-only map of a file (`storage::map_file`),
    // never written, so it holds no private copy of a page: dropping a page
    // loses nothing, and the next access reads the file's page again (the
    // one hazard, the file truncated meanwhile, is the map's own contract).
    // No reference into the range is invalidated: the bytes stay the same.
    let _ = unsafe {
        map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, end - first)
    };
}

/// Faults in the whole pages of `dst` writable (`MADV_POPULATE_WRITE`, Linux
/// 5.14+), so that a read into it later takes no page faults; the contents
/// are unchanged (a missing page arrives zero-filled). A hint.
pub(crate) fn populate_write(dst: &mut [u8]) {
    let Some((first, len)) = whole_pages(dst.as_mut_ptr() as usize, dst.len()) else {
        return;
    };
    // SAFETY: the range lies within `dst`, this process's writable memory
    // borrowed mutably for the call (no one else touches it meanwhile); the
    // advice changes no byte of it (see above) and unmaps nothing.
    let _ = unsafe { rustix::mm::madvise(first, len, rustix::mm::Advice::LinuxPopulateWrite) };
}

/// The whole pages within `len` bytes at `addr`: their start and length.
fn whole_pages(addr: usize, len: usize) -> Option<(*mut std::ffi::c_void, usize)> {
    let page = rustix::param::page_size();
    let first = addr.next_multiple_of(page);
    let end = addr.saturating_add(len) / page * page;
    (end > first).then(|| (first as *mut std::ffi::c_void, end - first))
}

/// Asks the kernel to back the whole pages of `dst`, faulted in after the
/// call, with transparent huge pages (`MADV_HUGEPAGE`) or base pages only
/// (`MADV_NOHUGEPAGE`), madvise(2). A hint: errors are ignored.
pub(crate) fn advise_page_size(dst: &mut [u8], huge: bool) {
    advise_page_size_of_range(dst.as_mut_ptr() as usize, dst.len(), huge);
}

/// [`advise_page_size`] for `len` bytes at `addr`, memory other threads may
/// be writing: the advice changes no byte, so no borrow is needed.
pub(crate) fn advise_page_size_of_range(addr: usize, len: usize, huge: bool) {
    let Some((first, len)) = whole_pages(addr, len) else {
        return;
    };
    let advice = if huge {
        rustix::mm::Advice::LinuxHugepage
    } else {
        rustix::mm::Advice::LinuxNoHugepage
    };
    // SAFETY: both advices only set a flag of the mappings in the range (an
    // address of no mapping is refused): no byte is read, written, freed or
    // unmapped, so memory other threads hold is unchanged.
    let _ = unsafe { rustix::mm::madvise(first, len, advice) };
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`,
/// clock_gettime(2)): what faulting memory in costs it, waits not counted.
pub(crate) fn thread_cpu_time() -> Option<std::time::Duration> {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    let secs = u64::try_from(t.tv_sec).ok()?;
    let nanos = u32::try_from(t.tv_nsec).ok()?;
    Some(std::time::Duration::new(secs, nanos))
}

/// Drops a file's clean, unmapped pages from the page cache
/// (`POSIX_FADV_DONTNEED`, posix_fadvise(2)).
pub fn evict(file: &File) -> io::Result<()> {
    rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed)?;
    Ok(())
}

/// Asks the kernel to read `[offset, offset + len)` of `file` into the page
/// cache in the background (`POSIX_FADV_WILLNEED`), each call clamped to the
/// larger of the device's read-ahead window and its largest I/O
/// (`force_page_cache_ra` in mm/readahead.c): callers issue pieces that size.
pub fn advise_willneed(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let Some(len) = NonZeroU64::new(len) else {
        return Ok(());
    };
    rustix::fs::fadvise(file, offset, Some(len), rustix::fs::Advice::WillNeed)?;
    Ok(())
}

/// The size of a page of memory (and of the page cache), in bytes.
pub fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// How many pages of `file` in `[offset, offset + len)` are in the page
/// cache, from `cachestat(2)` (Linux 6.5+; `len` 0: to the end). The kernel
/// answers `EPERM` for a file the caller may not write and does not own,
/// and `ENOSYS` before 6.5.
///
/// NOTE: hand-written because neither `rustix` nor `libc` wraps
/// `cachestat(2)` yet; the layouts follow include/uapi/linux/mman.h.
pub fn cached_pages(file: &File, offset: u64, len: u64) -> io::Result<u64> {
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
    // SAFETY: both pointers are to live, properly laid out `repr(C)` values
    // for the duration of the call; the kernel reads `range` and writes
    // `stat` only; the fd is valid because `file` is borrowed.
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

/// How many pages of `map` in `[offset, offset + len)` are in the page cache,
/// from `mincore(2)`; `offset` page-aligned, `vec` scratch space. For a file
/// the caller neither owns nor may write, Linux 5.0+ counts only the pages
/// this process has mapped in (`can_do_mincore` in mm/mincore.c).
///
/// NOTE: hand-written because `rustix` does not wrap `mincore(2)`.
pub fn mincore_pages(map: &Mmap, offset: usize, len: usize, vec: &mut Vec<u8>) -> io::Result<u64> {
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
    // SAFETY: `offset..offset + len` lies within the live map borrowed for the
    // call (checked above); `offset` and the map's base are page-aligned;
    // `vec` holds one byte per page of the range, what mincore(2) writes.
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

/// Takes an exclusive advisory lock with `flock(2)` without waiting
/// (`take`), or releases it (`!take`), retrying `EINTR`: `false` where
/// another open file description holds it (`EWOULDBLOCK`).
pub(crate) fn flock(file: &File, take: bool) -> io::Result<bool> {
    let operation = match take {
        true => FlockOperation::NonBlockingLockExclusive,
        false => FlockOperation::Unlock,
    };
    loop {
        match rustix::fs::flock(file, operation) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether the process `pid` may still exist: `kill(pid, 0)` fails with
/// `ESRCH` only for a pid with no process (kill(2)); a zombie, or another
/// user's process, exists.
pub(crate) fn pid_exists(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    !matches!(
        rustix::process::test_kill_process(pid),
        Err(rustix::io::Errno::SRCH)
    )
}

/// The parent process's id (`getppid(2)`); 0 where there is none.
pub fn parent_pid() -> u32 {
    u32::try_from(rustix::process::Pid::as_raw(rustix::process::getppid())).unwrap_or(0)
}

/// The effective user id (`geteuid(2)`).
pub fn effective_uid() -> Option<u32> {
    Some(rustix::process::geteuid().as_raw())
}

/// The most address space this process may map (the soft `RLIMIT_AS`,
/// getrlimit(2)), in bytes; `None` where there is no limit.
pub(crate) fn address_space_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::As).current
}

/// The owner of a file, from its metadata.
pub fn file_owner(meta: &Metadata) -> Option<u32> {
    Some(meta.uid())
}

/// Device and inode numbers: what makes two descriptors the same file.
pub fn file_id(meta: &Metadata) -> Option<(u64, u64)> {
    Some((meta.dev(), meta.ino()))
}

/// The raw device number (`st_dev`) of the filesystem holding a file.
pub fn device_number(meta: &Metadata) -> Option<u64> {
    Some(meta.dev())
}

/// Whether this process may write `path` (`faccessat(AT_EACCESS)`), the
/// test the kernel applies before it shows a non-owner page-cache residency.
pub fn may_write(path: &Path) -> bool {
    rustix::fs::accessat(rustix::fs::CWD, path, Access::WRITE_OK, AtFlags::EACCESS).is_ok()
}

/// The `statfs(2)` magic number (`f_type`) of the filesystem holding `path`,
/// a sign-extended one (`0xFF534D42` in an `i32`) brought back to 32 bits.
#[allow(clippy::unnecessary_cast)] // The type of `f_type` differs between targets.
pub(crate) fn filesystem_magic(path: &Path) -> io::Result<u64> {
    Ok((rustix::fs::statfs(path)?.f_type as u64) & 0xFFFF_FFFF)
}

/// The `fstatfs(2)` magic number of the filesystem holding an open file, as
/// [`filesystem_magic`].
#[allow(clippy::unnecessary_cast)] // The type of `f_type` differs between targets.
pub(crate) fn filesystem_magic_of(file: &File) -> io::Result<u64> {
    Ok((rustix::fs::fstatfs(file)?.f_type as u64) & 0xFFFF_FFFF)
}

/// The largest `WILLNEED` the kernel honours in one call for files on the
/// device `dev` (see [`advise_willneed`]), from sysfs; `None` where unknown.
pub fn readahead_limit(dev: u64) -> Option<u64> {
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let read_kb = |path: String| -> Option<u64> {
        std::fs::read_to_string(path)
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
    };
    let window = read_kb(format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"));
    let request = read_kb(format!(
        "/sys/dev/block/{major}:{minor}/queue/max_sectors_kb"
    ))
    .or_else(|| {
        read_kb(format!(
            "/sys/dev/block/{major}:{minor}/../queue/max_sectors_kb"
        ))
    });
    let kb = window.max(request).filter(|&kb| kb > 0)?;
    Some((kb << 10).max(4096))
}

/// Opens (creating, empty, mode `0600`) a file for a queue shared with this
/// user's other processes: never through a symlink, and only if it is this
/// user's own regular file.
pub fn open_private_rw(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags((OFlags::NOFOLLOW | OFlags::CLOEXEC).bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || effective_uid() != Some(meta.uid()) {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the file belongs to another user",
        ));
    }
    Ok(file)
}

/// A file mapped shared and read-write, seen as 64-bit words that several
/// processes update with atomic operations (lock-free instructions on the
/// word, atomic between processes too): the prefetch queue.
///
/// The hazard is a process truncating the file while it is mapped (`SIGBUS`
/// in the others); the file is the caller's own `0600` one
/// ([`open_private_rw`]), so only the caller's own processes can.
pub struct SharedWords {
    map: MmapMut,
}

impl SharedWords {
    /// Maps all of `file` shared and read-write. Its length must be a
    /// non-zero multiple of 8.
    pub fn map(file: &File) -> io::Result<SharedWords> {
        let len = file.metadata()?.len();
        if len == 0 || len % 8 != 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidData));
        }
        // SAFETY: a shared map of a regular file only ever accessed as atomics
        // (`words`), so writers in other processes cannot race with us;
        // truncation by another process is the documented hazard above.
        let map = unsafe { memmap2::MmapOptions::new().map_mut(file)? };
        Ok(SharedWords { map })
    }

    /// The words of the map.
    pub fn words(&self) -> &[AtomicU64] {
        let len = self.map.len() / 8;
        // SAFETY: the page-aligned map holds `len` whole words; `AtomicU64` has
        // `u64`'s layout, every bit pattern is valid, all access is atomic (also
        // across processes); the slice borrows `self`, which owns the map.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr() as *const AtomicU64, len) }
    }
}

/// A path from the bytes the kernel wrote (mount points need not be UTF-8).
pub(crate) fn path_from_bytes(bytes: Vec<u8>) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStringExt;
    std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes))
}

/// A directory opened once: files opened through it come from the directory
/// it was when opened, whatever happens to the path that named it (a
/// `current -> snapshots/<rev>` symlink flipped to another revision).
#[derive(Debug)]
pub struct Dir {
    fd: std::os::fd::OwnedFd,
}

impl Dir {
    /// Opens the directory at `path` (following symlinks, once).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// Opens `name` in this directory for reading, refusing anything but a
    /// regular file, without blocking (as [`open_regular`]).
    pub fn open_regular(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        super::regular(File::from(fd))
    }

    /// Whether `name` in this directory is a regular file (after symlinks).
    pub fn is_file(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, AtFlags::empty()).is_ok_and(|stat| {
            rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile
        })
    }

    /// The names of the entries, `.` and `..` left out.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        Ok(names)
    }
}

/// Turns `O_DIRECT` on or off for every read through this open file
/// (`fcntl(F_SETFL)`), never a second open: on FUSE a second open, even of
/// `/proc/self/fd/N`, is an `OPEN` a passthrough daemon resolves by path
/// again, maybe to another version of the file. `EINVAL` where the
/// filesystem has no direct I/O.
pub(crate) fn set_direct(file: &File, on: bool) -> io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    let wanted = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    if wanted != flags {
        rustix::fs::fcntl_setfl(file, wanted)?;
    }
    Ok(())
}

/// Whether reads through this open file bypass the page cache (`O_DIRECT`).
pub(crate) fn is_direct(file: &File) -> bool {
    rustix::fs::fcntl_getfl(file).is_ok_and(|flags| flags.contains(OFlags::DIRECT))
}

/// The path of an open file, as the kernel knows it (`/proc/self/fd`):
/// symlinks resolved at the time it was opened, whatever they name now.
pub(crate) fn path_of(file: &File) -> Option<std::path::PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

/// The bytes of a `/proc` file (proc(5)), read whole, for the caller to parse.
pub(crate) fn read_proc(file: super::ProcFile) -> io::Result<Vec<u8>> {
    use super::ProcFile;
    match file {
        ProcFile::SelfMountinfo => std::fs::read("/proc/self/mountinfo"),
        ProcFile::Mounts => std::fs::read("/proc/mounts"),
        ProcFile::Meminfo => std::fs::read("/proc/meminfo"),
        ProcFile::SelfCgroup => std::fs::read("/proc/self/cgroup"),
        ProcFile::SelfStat => std::fs::read("/proc/self/stat"),
        ProcFile::SelfStatus => std::fs::read("/proc/self/status"),
        ProcFile::Stat(pid) => std::fs::read(format!("/proc/{pid}/stat")),
        ProcFile::HugePagesEnabled => std::fs::read("/sys/kernel/mm/transparent_hugepage/enabled"),
    }
}

// The node copy (src/node/): an anonymous memory file, a shared map the
// ranks fill, and the Unix socket that hands the file to the other ranks.
#[path = "linux_node.rs"]
mod node_copy;
pub use node_copy::FdListener;
pub use node_copy::FdStream;
pub use node_copy::StopListening;
pub use node_copy::is_sealed_copy;
pub use node_copy::memfd_copy;
pub(crate) use node_copy::{SharedBytes, name_kind};

// The write-through cache (src/cache/): names walked, made and published in a
// shared directory without following what another user may have put there.
#[path = "linux_cache.rs"]
mod cache_dir;
pub use cache_dir::{link_count, reserve, write_all_at};

/// Puts the calling thread in the idle scheduling class (`SCHED_IDLE`): it
/// runs only on CPU time no other thread wants. A hint.
///
/// NOTE: through `libc`, as `rustix` cannot set a scheduling policy.
pub fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` reads `param`, a live value on this stack,
    // for the duration of the call; pid 0 is the calling thread, and a
    // policy changes no memory of the process.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
}
