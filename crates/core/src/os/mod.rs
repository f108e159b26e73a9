//! Every call into the operating system, with the platform's implementation chosen in this one place.
//!
//! Linux gets the real calls (`linux.rs`); elsewhere (`stub.rs`) reads go
//! through the standard library and every hint is a no-op or answers
//! [`io::ErrorKind::Unsupported`], so that callers degrade (prefetch reads
//! instead of advising, mount detection says "unknown") rather than fail.
//!
//! `RUSTFLAGS="--cfg safeload_os_stub"` selects the stub on Linux too and
//! drops `rustix` and `libc` (Cargo.toml's `[target]` table), so that CI's
//! stub build (`.ci/run`, the library and its unit tests) fails on any use of
//! them outside `linux.rs`. A cfg, not a feature: features unify, so one
//! dependent naming it would take the Linux layer from every user. Unit tests
//! of Linux behaviour gate on the expression below, with a twin for the
//! stub's answer, or branch on `MOUNT_DETECTION`.
//!
//! The interface is closed: the rest of the crate calls only what is
//! re-exported below, and both implementations define all of it, so a
//! missing or drifting stub is a compile error in the stub build.

use std::fs::File;
use std::io;

#[cfg_attr(all(target_os = "linux", not(safeload_os_stub)), path = "linux.rs")]
#[cfg_attr(not(all(target_os = "linux", not(safeload_os_stub))), path = "stub.rs")]
mod imp;
mod steps;

// Portable, on top of the list below: a range read through a scratch buffer.
pub use steps::read_in_steps;

// Whether this platform has a mount table and filesystem magic numbers
// (`false` makes every mount lookup "unknown").
pub(crate) use imp::MOUNT_DETECTION;

// Opening and reading files, and telling files apart; direct I/O.
pub use imp::{Dir, device_number, file_id, file_owner, may_write, open_private_rw, open_regular};
pub(crate) use imp::{is_direct, path_from_bytes, path_of, pread, set_direct};

// Page-cache and memory hints, and what the page cache holds.
pub(crate) use imp::{
    advise_page_size, advise_page_size_of_range, let_go, populate_read, populate_write,
    thread_cpu_time,
};
pub use imp::{advise_willneed, cached_pages, evict, mincore_pages, page_size, readahead_limit};

// Filesystems (`statfs(2)`), the `/proc` files the crate parses, processes,
// locks (`coord/lock.rs`), shared memory, limits and scheduling.
pub use imp::{SharedWords, effective_uid, idle_priority, parent_pid};
pub(crate) use imp::{
    address_space_limit, filesystem_magic, filesystem_magic_of, flock, pid_exists, read_proc,
};

// The node copy: a sealed memory file, filled through a shared map, handed
// to the job's other local ranks over a Unix socket; what a name is.
pub use imp::{FdListener, FdStream, StopListening, is_sealed_copy, memfd_copy};
pub(crate) use imp::{SharedBytes, name_kind};

/// What a name in a directory is, not following a symlink
/// (`name_kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Socket,
    File,
    /// Told apart only by the Linux layer (the stub says `Other`).
    #[cfg_attr(any(not(target_os = "linux"), safeload_os_stub), allow(dead_code))]
    Fifo,
    Symlink,
    Directory,
    /// A device, or what this platform cannot tell.
    Other,
}

impl std::fmt::Display for NameKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NameKind::Socket => "a socket",
            NameKind::File => "a file",
            NameKind::Fifo => "a FIFO",
            NameKind::Symlink => "a symlink",
            NameKind::Directory => "a directory",
            NameKind::Other => "a special file",
        })
    }
}

// The write-through cache (feature `remote`): `Dir`'s calls that never
// follow a name, a file's link count, space reserved, positional writes.
pub use imp::{link_count, reserve, write_all_at};

/// What a name in a directory is, not following it (`Dir::entry`).
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
    /// Anything else: a FIFO, a socket, a device.
    Other,
}

/// A file of `/proc` (proc(5)) or `/sys` the crate reads; the text is parsed
/// where it is used, by pure functions tested on every platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProcFile {
    /// `/proc/self/mountinfo`: this process's mount table.
    SelfMountinfo,
    /// `/proc/mounts`: the mount table without device numbers and ids.
    Mounts,
    /// `/proc/meminfo`: `MemAvailable`.
    Meminfo,
    /// `/proc/self/cgroup`: the cgroups whose memory limits apply.
    SelfCgroup,
    /// `/proc/self/stat`: this process's start time.
    SelfStat,
    /// `/proc/self/status`: the address space mapped (`VmSize`).
    SelfStatus,
    /// `/proc/<pid>/stat`: another process's state and start time.
    Stat(u32),
    /// `/sys/kernel/mm/transparent_hugepage/enabled` (`always`, `madvise`,
    /// `never`; the kernel's `admin-guide/mm/transhuge`).
    HugePagesEnabled,
}

/// `file`, where it is a regular file.
fn regular(file: File) -> io::Result<File> {
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    Ok(file)
}

/// The alignment direct I/O needs of offsets, lengths and buffers: 4 KiB
/// covers the logical block size of every common device.
pub(crate) const DIRECT_ALIGN: u64 = 4096;

/// `EINVAL`: what a filesystem answers a direct read it does not support.
pub(crate) const EINVAL: i32 = 22;

/// Why a read took `O_DIRECT` off its descriptor for the rest of the load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DirectDropped {
    /// A read of whole, aligned blocks was refused (the OS error's text).
    Refused(String),
    /// Reads of whole blocks kept coming back in pieces that are not whole
    /// blocks (as some network clients answer).
    Pieces,
}

impl std::fmt::Display for DirectDropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DirectDropped::Refused(e) => write!(f, "a whole-block read was refused ({e})"),
            DirectDropped::Pieces => {
                f.write_str("whole-block reads kept returning pieces that are not whole blocks")
            }
        }
    }
}

/// Reads into `buf` at `offset` until at least `required` bytes have
/// arrived (all of `buf` if the file is long enough), retrying short reads
/// and `EINTR`; on failure, the offset that failed and the error
/// (`UnexpectedEof` where the file ends before `required` bytes).
pub fn read_at_least(
    file: &File,
    buf: &mut [u8],
    required: usize,
    offset: u64,
) -> Result<(), (u64, io::Error)> {
    read_at_least_noting(file, buf, required, offset).map(drop)
}

/// `read_at_least`, saying whether this read took `O_DIRECT` off the
/// descriptor, and why.
///
/// With `O_DIRECT` set, a read that is not whole blocks at a block offset
/// into an aligned buffer (after a short read, or a caller's range) goes
/// through [`bounce`]. Where the filesystem keeps refusing whole-block reads
/// or answering them in pieces, `O_DIRECT` is cleared from the same
/// descriptor (never a second open: see [`bounce`]) and the rest is read
/// through the page cache.
pub(crate) fn read_at_least_noting(
    file: &File,
    buf: &mut [u8],
    required: usize,
    offset: u64,
) -> Result<Option<DirectDropped>, (u64, io::Error)> {
    let mut dropped = None;
    // Whether an `EINVAL` was met after another reader had already taken
    // `O_DIRECT` off the descriptor (a read under way when it did): the
    // same read is made once more, without it.
    let mut raced = false;
    let mut done = 0usize;
    while done < buf.len() {
        let at = offset + done as u64;
        let Some(rest) = buf.get_mut(done..) else {
            break;
        };
        let n = match pread(file, rest, at) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // An unaligned read the descriptor's `O_DIRECT` refuses.
            Err(e) if e.raw_os_error() == Some(EINVAL) && is_direct(file) => {
                match bounce(file, rest, at) {
                    Ok(n) => n,
                    Err(Bounce::Drop(why)) => {
                        set_direct(file, false).map_err(|e| (at, e))?;
                        dropped = Some(why);
                        continue;
                    }
                    Err(Bounce::Failed(e)) => return Err((at, e)),
                }
            }
            Err(e) if e.raw_os_error() == Some(EINVAL) && !raced => {
                raced = true;
                continue;
            }
            Err(e) => return Err((at, e)),
        };
        if n == 0 {
            if done >= required {
                break;
            }
            return Err((
                at,
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "file ended before the expected length",
                ),
            ));
        }
        done += n;
    }
    Ok(dropped)
}

/// Reads exactly `buf.len()` bytes at `offset`; see `read_at_least`.
pub fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> Result<(), (u64, io::Error)> {
    let len = buf.len();
    read_at_least(file, buf, len, offset)
}

/// The largest piece a bounced read moves at once (each thread's buffer).
const BOUNCE_PIECE: usize = 8 << 20;

/// How many reads of whole blocks in a row may come back in pieces that
/// are not whole blocks, with no whole block gained, before a bounced read
/// gives direct I/O up.
const PIECES_TOLERATED: u32 = 3;

thread_local! {
    /// A reader's aligned bounce buffer, kept for its next unaligned read.
    static BOUNCE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Why a bounced read did not complete: direct reads cannot go on (the
/// caller clears `O_DIRECT`), or the read failed.
enum Bounce {
    Drop(DirectDropped),
    Failed(io::Error),
}

/// One bounced read for a descriptor with `O_DIRECT` set: the whole blocks
/// covering the start of `dst` (up to [`BOUNCE_PIECE`]) read into an aligned
/// buffer, the bytes asked for copied out; how many, 0 at the end of the
/// file. A short answer ending inside a block is read again from that
/// block's start, so every request stays whole blocks.
// NOTE: the descriptor keeps `O_DIRECT` for a load's few reads that are not
// whole blocks, rather than the file being opened again without it: on FUSE
// a second open can reach another version of the file (issue 16).
fn bounce(file: &File, dst: &mut [u8], at: u64) -> Result<usize, Bounce> {
    let align = DIRECT_ALIGN as usize;
    BOUNCE.with(|bounce| {
        let mut bounce = bounce.borrow_mut();
        let skip = (at % DIRECT_ALIGN) as usize;
        let want = dst.len().min(BOUNCE_PIECE);
        let span = (skip + want).next_multiple_of(align);
        if bounce.len() < span + align {
            bounce.resize(span + align, 0);
        }
        let start = bounce.as_ptr().align_offset(align);
        let out_of_range = || Bounce::Failed(io::Error::other("bounce buffer out of range"));
        let Some(block) = bounce.get_mut(start..start + span) else {
            return Err(out_of_range());
        };
        let base = at - skip as u64;
        // Bytes of `block` read so far; every request starts at a whole
        // block of it.
        let mut got = 0usize;
        let mut pieces = 0u32;
        while got < span {
            let whole = got / align * align;
            let Some(rest) = block.get_mut(whole..) else {
                break;
            };
            match pread(file, rest, base + whole as u64) {
                Ok(0) => break,
                Ok(n) => {
                    let reached = whole + n;
                    got = got.max(reached);
                    if reached % align == 0 || reached >= span {
                        pieces = 0;
                        continue;
                    }
                    // The answer ends inside a block: the end of the file,
                    // or a piece; the next read starts again from the last
                    // whole block.
                    let len = file.metadata().map_err(Bounce::Failed)?.len();
                    if base + reached as u64 >= len {
                        break;
                    }
                    if reached / align * align > whole {
                        pieces = 0;
                    } else {
                        pieces += 1;
                        if pieces >= PIECES_TOLERATED {
                            return Err(Bounce::Drop(DirectDropped::Pieces));
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Whole blocks into an aligned buffer, refused.
                Err(e) if e.raw_os_error() == Some(EINVAL) => {
                    return Err(Bounce::Drop(DirectDropped::Refused(e.to_string())));
                }
                Err(e) => return Err(Bounce::Failed(e)),
            }
        }
        let n = got.saturating_sub(skip).min(want);
        let (Some(from), Some(to)) = (block.get(skip..skip + n), dst.get_mut(..n)) else {
            return Err(out_of_range());
        };
        to.copy_from_slice(from);
        Ok(n)
    })
}
