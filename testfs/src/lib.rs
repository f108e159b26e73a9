//! A read-only FUSE passthrough filesystem for safeload's tests and benchmarks.
//!
//! [`Mount::new`] mounts a directory tree at a fresh temporary mount point and serves it back
//! through FUSE, so that code under test sees what it would see on `hf-mount` (the Hugging Face
//! hub FUSE mount) or on a slow or faulty network filesystem: a mount whose type in
//! `/proc/self/mountinfo` is `fuse` or `fuse.<subtype>`, whose source is any name you choose,
//! whose reads take as long as you say, run on as many daemon threads as you give it, share a
//! link of the bandwidth you set, wait once per block for a modelled remote's first byte,
//! come back short, or fail with `EIO` at an offset you pick. Dropping the [`Mount`]
//! unmounts it, also while a failed test unwinds.
//!
//! ```no_run
//! use std::time::Duration;
//! use safeload_testfs::{Mount, Options};
//!
//! if safeload_testfs::skip_without_fuse() {
//!     return; // printed "SKIPPED: <reason>" to stderr
//! }
//! let source = tempfile::tempdir().unwrap();
//! std::fs::write(source.path().join("model.safetensors"), b"...").unwrap();
//! let mount = Mount::new(
//!     source.path(),
//!     Options {
//!         fsname: "hf-mount".into(),
//!         latency: Some(Duration::from_millis(2)),
//!         ..Options::default()
//!     },
//! )
//! .unwrap();
//! let bytes = std::fs::read(mount.path().join("model.safetensors")).unwrap();
//! assert_eq!(bytes, b"...");
//! assert!(mount.stats().read_requests > 0);
//! ```
//!
//! # What the filesystem does
//!
//! - **Passthrough, read-only.** `LOOKUP`, `GETATTR` (real sizes, modes, owners and times),
//!   `READDIR`, `OPEN`, `READ` (a positional read of the source file), `RELEASE`, `READLINK`
//!   (symlinks stay symlinks, their target text unchanged) and `STATFS` (the source's numbers).
//!   The mount is `ro`, and every request that would write answers `EROFS`. Inode numbers are the
//!   mount's own: one per source file (device and inode), stable for the life of the mount.
//!   The source tree is assumed not to change while mounted; attributes and names are cached
//!   by the kernel for one second.
//! - **Daemon threads.** fuser's session loop runs on one thread here and answers everything
//!   but `READ` itself; each `READ` goes to a queue in the daemon, served first come, first
//!   served by worker threads. [`Options::daemon_threads`] makes them a fixed pool started at
//!   mount, as a real daemon's thread count: with 8 threads at most 8 requests are served at
//!   once, and the kernel's other requests in flight wait in the daemon's queue
//!   ([`Stats::max_queued`]). Without it, [`Options::max_concurrent_reads`] (64 when unset)
//!   bounds workers started as the queue needs them, today's behaviour; the two are one limit,
//!   so setting both is an error. With `Some(1)` of either, every read is served strictly one
//!   after another.
//! - **Latency.** [`Options::latency`] is slept on the worker thread in every `READ`, so `n`
//!   threads serve at most `n` requests per latency: 8 threads at 2 ms answer at most 4,000
//!   requests a second, 500 MiB/s in the kernel's 128 KiB readahead requests or 4 GiB/s in
//!   1 MiB ones (the copy costs more than that on a small machine); one thread at 2 ms, 64
//!   MiB/s in 128 KiB requests.
//! - **Bandwidth cap.** [`Options::bandwidth_bytes_per_sec`] gives the mount one link that the
//!   answers cross one after another, after their latency: an answer leaves when its last byte
//!   has crossed, behind those booked before it, still holding its thread. Over any window the
//!   answered bytes stay within the cap times the window plus one request (1 MiB at most: 8 ms
//!   at 128 MiB/s); an idle link saves no credit for a burst.
//! - **Remote fetches.** [`Options::first_byte_delay`] models a remote chunk store behind the
//!   daemon's read-ahead: each file is cut into [`Options::fetch_block`] blocks (32 MiB by
//!   default, the aligned cell within which hf-mount's read-ahead fetches fall); the first
//!   `READ` that touches a block not fetched yet waits the delay, the remote's time to first
//!   byte, and marks it fetched; `READ`s of that block meanwhile wait for the same fetch
//!   ([`Stats::joined_fetches`]); later ones pay only the latency. A `READ` waiting for a fetch
//!   holds no daemon thread (it is parked, then queued again at the head when the block
//!   arrives), as a daemon that answers reads waiting for the network from a task: so a mount
//!   with few threads still has many fetches in flight. A cold `READ` costs the delay, then
//!   its latency and its time on the link. Nothing is fetched ahead of the reads, so one
//!   sequential reader pays one delay per block (60 ms per 32 MiB block tops at about 530
//!   MiB/s); a reader with several blocks in flight hides it, which is what an adaptive
//!   reader is measured on. Fetched blocks are remembered per file, up to 65,536 (2 TiB at
//!   32 MiB); [`Mount::forget_fetched`] makes them all cold again, and [`Stats::fetches`] and
//!   [`Mount::file_stats`] count the fetches. The cap counts answered bytes only: a fetch
//!   moves none.
//! - **Page cache.** Unless [`Options::direct_io`], [`Options::short_reads`] or
//!   [`Options::interrupt_every`] is set, files are
//!   opened with `FOPEN_KEEP_CACHE`: as on NFS, the page cache of a file survives close and
//!   reopen, so a prefetch pass followed by a second open finds warm pages. The kernel
//!   reads ahead on its own, so [`Stats`] count what the kernel asked for, not what the
//!   application read. With `direct_io`, files are opened with `FOPEN_DIRECT_IO` and each
//!   `read()` becomes `READ` requests of at most 1 MiB. `mmap` of such a file still works:
//!   the filesystem asks for `FUSE_DIRECT_IO_ALLOW_MMAP` where the kernel offers it (6.6 and
//!   later), and faults then go through the page cache. An application that opens a file
//!   with `O_DIRECT` gets the same one-`READ`-per-MiB path on either kind of mount, provided
//!   its buffer is page-aligned: from an unaligned buffer the kernel splits each MiB in two
//!   `READ`s where the buffer's pages fall.
//!
//! # Benchmark mounts
//!
//! The matrix safeload's benchmarks run adaptive read concurrency against, and a mount
//! shaped like hf-mount, with numbers from hf-mount's read-ahead rework
//! (huggingface/hf-mount#246, m6i.2xlarge in us-east-1): its default 16 `--max-threads`,
//! about 60 ms for a cold random 4 KiB read (the p50 measured there), 32 MiB read-ahead
//! cells, and about 900 MB/s for a sequential read of a 3 GB file.
//!
//! ```no_run
//! use std::time::Duration;
//! use safeload_testfs::{Mount, Options};
//!
//! let ms = Duration::from_millis;
//! let source = std::path::Path::new("checkpoint");
//! let fast = Mount::new(
//!     source,
//!     Options { latency: Some(ms(2)), daemon_threads: Some(8), ..Options::default() },
//! )?;
//! let slow_wide = Mount::new(
//!     source,
//!     Options { latency: Some(ms(8)), daemon_threads: Some(32), ..Options::default() },
//! )?;
//! let serialized = Mount::new(
//!     source,
//!     Options { latency: Some(ms(2)), daemon_threads: Some(1), ..Options::default() },
//! )?;
//! let hf_like = Mount::new(
//!     source,
//!     Options {
//!         fsname: "hf-mount".into(),
//!         daemon_threads: Some(16),
//!         first_byte_delay: Some(ms(60)),
//!         fetch_block: 32 << 20,
//!         bandwidth_bytes_per_sec: Some(900_000_000),
//!         ..Options::default()
//!     },
//! )?;
//! // ... a cold run ...
//! hf_like.forget_fetched(); // and drop the page cache of the files read
//! hf_like.reset_stats();
//! // ... the next cold run ...
//! # drop((fast, slow_wide, serialized));
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The same mounts from the command line, for a daemon in a process of its own: see the
//! `safeload-testfs` binary (`--latency-ms 2 --daemon-threads 8`, ...; SIGUSR1 forgets the
//! fetched blocks and SIGUSR2 prints and resets the counters).
//!
//! # Kernel connection settings
//!
//! In `INIT` the filesystem asks for [`Options::max_background`]: by default 64 (fuser's
//! default is 16, the kernel's 12), or twice [`Options::daemon_threads`] when that is more,
//! with the congestion threshold at three quarters of it. `max_background` bounds the
//! asynchronous requests in flight, which are the readahead of the page cache: every read
//! through the page cache, `mmap` faults included. Synchronous requests (a `read()` with
//! direct I/O, one request at a time per calling thread) are not counted against it. So 32
//! threads get work from 32 readers through the page cache only if `max_background` is at
//! least 32; with less, the kernel keeps about that many readahead requests out and reads
//! other pages synchronously, a few at a time. Measured on the tests' 2-core VM with 32
//! threads at 8 ms and 64 readers of 1 MiB each (512 readahead requests of 128 KiB, so
//! 128 ms at best): 580 ms with a `max_background` of 8, 315 ms with 16, 200 ms with 32,
//! 175 ms with 64, 172 ms with 256.
//!
//! The kernel takes any `max_background` up to 65,535 from a daemon with `CAP_SYS_ADMIN`
//! (root) and caps other daemons at `/sys/module/fuse/parameters/max_user_bgreq` and
//! `max_user_congthresh` (derived from the machine's memory: 7,866 on the 2-core, 23 GiB VM
//! of the tests, Linux 6.18); the values a mount got can be read in
//! `/sys/fs/fuse/connections/<device>/` when fusectl is mounted there.
//!
//! `max_readahead` stays at what the kernel offers, which is already the largest value it
//! accepts (128 KiB by default; raise it after mounting with [`Mount::set_read_ahead_kb`]).
//! fuser asks for `FUSE_MAX_PAGES` with a 16 MiB `max_write`, so the kernel sends reads of up
//! to its own limit, 1 MiB with the default `fs.fuse.max_pages_limit`. fuser does not ask for
//! `FUSE_ASYNC_DIO`, and neither does this filesystem: a direct-I/O `read()` larger than
//! 1 MiB goes out as one request after another, as on hf-mount.
//!
//! # Mount table
//!
//! The mount source is [`Options::fsname`]. The type is `fuse.<subtype>` when
//! [`Options::subtype`] is set and plain `fuse` otherwise. (fuser's own `Subtype` option only
//! reaches `fusermount3`; mounting directly as root it would be ignored, so the crate passes
//! `subtype=` as a kernel mount option, which Linux accepts since 5.4 and `fusermount3`
//! understands too.)
//!
//! # Cleaning up
//!
//! [`Mount`]'s `Drop` unmounts with `umount2(2)`; if a file on the mount is still open (or
//! mapped) it detaches the mount lazily instead, so that `Drop` never blocks; if the process
//! may not unmount it runs `fusermount3 -u` (`-z` when busy). Then it removes the mount point.
//! A process that is killed (rather than panicking) leaves a dead mount behind, whose accesses
//! fail with `ENOTCONN`; `fusermount3 -u <path>` or `umount -l <path>` removes it.
//!
//! Linux only: elsewhere [`fuse_available`] says why not and [`Mount::new`] fails with
//! [`std::io::ErrorKind::Unsupported`].
#![deny(missing_docs)]

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

#[cfg(target_os = "linux")]
mod fetch;
#[cfg(target_os = "linux")]
mod fs;
#[cfg(target_os = "linux")]
mod link;
#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(not(target_os = "linux"), path = "stub.rs")]
mod os;
#[cfg(target_os = "linux")]
mod pool;

/// How a [`Mount`] behaves. `Options::default()` is a plain passthrough named
/// `safeload-testfs`, with no subtype, no latency, up to 64 reads at once (workers started on
/// demand), no bandwidth cap, no remote fetches and no faults.
///
/// The cost of one `READ`, in the order it is paid (each part off unless set):
///
/// 1. waiting for a daemon thread ([`daemon_threads`](Self::daemon_threads), or
///    [`max_concurrent_reads`](Self::max_concurrent_reads));
/// 2. [`first_byte_delay`](Self::first_byte_delay), once per
///    [`fetch_block`](Self::fetch_block) of each file, holding no thread;
/// 3. [`latency`](Self::latency), on the daemon thread;
/// 4. the bytes' time on the link, [`bandwidth_bytes_per_sec`](Self::bandwidth_bytes_per_sec),
///    behind the other answers, still on the daemon thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The mount source in `/proc/self/mountinfo` (for example `hf-mount`). Must not contain
    /// a comma.
    pub fsname: String,
    /// With `Some(s)` the filesystem type reads `fuse.<s>` in `/proc/self/mountinfo`; with
    /// `None`, plain `fuse`. Must not contain a comma.
    pub subtype: Option<String>,
    /// Sleep this long in every `READ` request before answering it, on the daemon thread
    /// that serves it (so with `n` threads, at most `n` requests per `latency`).
    pub latency: Option<Duration>,
    /// Serve at most this many `READ` requests at once (`Some(1)`: every read serialized,
    /// latency included), with worker threads started as requests need them. `None` allows
    /// up to 64. `Some(0)` is rejected by [`Mount::new`], and so is setting it together with
    /// [`daemon_threads`](Self::daemon_threads), which bounds the same workers.
    pub max_concurrent_reads: Option<usize>,
    /// Serve `READ` requests with a fixed pool of this many daemon threads, all started at
    /// mount, as a FUSE daemon's thread count: at most this many requests are served at once,
    /// and the rest wait in the daemon's queue (first come, first served), not in the
    /// kernel, which keeps up to [`max_background`](Self::max_background) asynchronous
    /// requests and any number of synchronous ones in flight. `Some(1)` is a serialized
    /// mount. `None`: [`max_concurrent_reads`](Self::max_concurrent_reads) decides.
    /// `Some(0)` is rejected by [`Mount::new`].
    pub daemon_threads: Option<usize>,
    /// Cap the bytes answered by the whole mount at this many per second: the mount has one
    /// link, answers cross it one after another, and each leaves when its last byte has
    /// crossed. Over any window the answered bytes stay within the cap times the window,
    /// plus one `READ` (at most 1 MiB: 8 ms at 128 MiB/s). An idle link saves no credit.
    /// `None`: unlimited. `Some(0)` is rejected by [`Mount::new`].
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// Model a remote store behind the daemon, which fetches each file in blocks of
    /// [`fetch_block`](Self::fetch_block) bytes: the first `READ` that touches a block not
    /// fetched yet waits this long (the remote's time to first byte) and marks the block
    /// fetched; `READ`s of the same block meanwhile wait for that one fetch; later `READ`s of
    /// it pay only [`latency`](Self::latency). A `READ` that waits for a fetch holds no daemon
    /// thread, as a daemon that answers such reads from a task. Nothing is fetched ahead.
    /// [`Mount::forget_fetched`] makes every block cold again. `Some(Duration::ZERO)` only
    /// counts fetches ([`Stats::fetches`]). `None`: no fetches are modelled.
    pub first_byte_delay: Option<Duration>,
    /// The size of the fetch blocks of [`first_byte_delay`](Self::first_byte_delay), aligned
    /// on multiples of it from the start of each file. Default 32 MiB. `0` is rejected by
    /// [`Mount::new`].
    pub fetch_block: u64,
    /// The `max_background` the filesystem asks for in `INIT`: how many asynchronous requests
    /// (readahead of the page cache) the kernel keeps in flight; the congestion threshold is
    /// three quarters of it. Synchronous requests, such as each `read()` of a file opened
    /// with direct I/O, are not counted against it. `None`: 64, or twice
    /// [`daemon_threads`](Self::daemon_threads) when that is more, so that the kernel can
    /// keep every thread busy with a request queued behind each. `Some(0)` is rejected by
    /// [`Mount::new`].
    pub max_background: Option<u16>,
    /// Answer each `READ` with at most half the bytes asked for (at least one). Files are then
    /// opened with `FOPEN_DIRECT_IO`, as through the page cache the kernel would take a short
    /// answer for the end of the file: so the short count reaches the application's `read()`
    /// and `pread()`. Reads on files opened while this was off are never shortened. Do not
    /// `mmap` files on such a mount: faults go through the page cache, where a short answer
    /// makes the kernel take the file for shorter than it is.
    pub short_reads: bool,
    /// Answer every `N`th `READ` (counted over the mount) with `EINTR`, as a network
    /// filesystem's client does when a signal arrives during a request. As with
    /// [`short_reads`](Self::short_reads), files are then opened with `FOPEN_DIRECT_IO`, so that
    /// the error reaches the application's `read()` and `pread()` (through the page cache a
    /// failed read-ahead would be retried or turned into `EIO`). `Some(0)` is taken as `None`.
    pub interrupt_every: Option<u32>,
    /// A `READ` of this file (a path relative to the source directory) whose range
    /// `[offset, offset + size)` contains this offset answers `EIO`. Through the page cache
    /// the kernel reads whole pages and reads ahead: an application read that ends shortly
    /// before the offset can fail too, and one that spans it first returns the bytes before
    /// the failed page (a short read), then `EIO`. Set [`direct_io`](Self::direct_io) for
    /// byte-exact ranges.
    pub eio_at: Option<(String, u64)>,
    /// Open files with `FOPEN_DIRECT_IO`: the page cache of the mount is bypassed and every
    /// `read()` turns into `READ` requests of the same range.
    pub direct_io: bool,
}

/// The default [`Options::fetch_block`].
const DEFAULT_FETCH_BLOCK: u64 = 32 * 1024 * 1024;
/// The `max_background` asked for when [`Options::max_background`] is `None` and the daemon
/// threads do not need more; fuser's own default is 16 and the kernel's 12.
///
/// NOTE: twice the daemon threads (and 64 at least) was chosen over a fixed 256 by the
/// measurement in the crate docs (Kernel connection settings): 175 ms against 172 ms for 32
/// threads, while 64 keeps today's value, and hf-mount's, for every other mount.
const DEFAULT_MAX_BACKGROUND: u16 = 64;

impl Default for Options {
    fn default() -> Self {
        Self {
            fsname: "safeload-testfs".to_owned(),
            subtype: None,
            latency: None,
            max_concurrent_reads: None,
            daemon_threads: None,
            bandwidth_bytes_per_sec: None,
            first_byte_delay: None,
            fetch_block: DEFAULT_FETCH_BLOCK,
            max_background: None,
            short_reads: false,
            interrupt_every: None,
            eio_at: None,
            direct_io: false,
        }
    }
}

impl Options {
    /// The `max_background` to ask for in `INIT` (see [`Options::max_background`]).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn effective_max_background(&self) -> u16 {
        self.max_background.unwrap_or_else(|| {
            let per_threads = self.daemon_threads.map_or(0, |n| n.saturating_mul(2));
            u16::try_from(per_threads)
                .unwrap_or(u16::MAX)
                .max(DEFAULT_MAX_BACKGROUND)
        })
    }

    fn validate(&self) -> io::Result<()> {
        if self.max_concurrent_reads == Some(0) {
            return Err(invalid("max_concurrent_reads must be at least 1"));
        }
        if self.daemon_threads == Some(0) {
            return Err(invalid("daemon_threads must be at least 1"));
        }
        if self.daemon_threads.is_some() && self.max_concurrent_reads.is_some() {
            return Err(invalid(
                "daemon_threads and max_concurrent_reads both bound the read workers; set one",
            ));
        }
        if self.bandwidth_bytes_per_sec == Some(0) {
            return Err(invalid("bandwidth_bytes_per_sec must be at least 1"));
        }
        if self.fetch_block == 0 {
            return Err(invalid("fetch_block must be at least 1"));
        }
        if self.max_background == Some(0) {
            return Err(invalid("max_background must be at least 1"));
        }
        if self.fsname.contains(',') {
            return Err(invalid("fsname must not contain a comma"));
        }
        if self.subtype.as_deref().is_some_and(|s| s.contains(',')) {
            return Err(invalid("subtype must not contain a comma"));
        }
        Ok(())
    }
}

/// A snapshot of a mount's `READ` counters, from [`Mount::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// `READ` requests received from the kernel.
    pub read_requests: u64,
    /// Bytes sent back in answers to `READ` requests.
    pub bytes_read: u64,
    /// The most `READ` requests served at the same time (by daemon threads: never more than
    /// [`Options::daemon_threads`]). Requests waiting for a fetch are not being served.
    pub max_in_flight: u64,
    /// The largest size a `READ` request asked for.
    pub max_request_bytes: u64,
    /// The most `READ` requests waiting in the daemon's queue for a thread at the same time:
    /// how far the kernel's requests in flight went past the threads.
    pub max_queued: u64,
    /// Fetch blocks fetched ([`Options::first_byte_delay`]), each paying the delay once: the
    /// number of distinct blocks read, until [`Mount::forget_fetched`].
    pub fetches: u64,
    /// `READ` requests that found a block they need already being fetched by another and
    /// waited for that fetch instead of starting one.
    pub joined_fetches: u64,
    /// `READ` requests answered with `EINTR` ([`Options::interrupt_every`]).
    pub interrupted: u64,
}

/// A snapshot of the `READ` counters of one file, from [`Mount::file_stats`]. Counted when
/// the answer leaves (a request still waiting is not in them yet), except
/// [`fetches`](Self::fetches), counted when they start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileStats {
    /// `READ` requests of this file answered (with data or an error).
    pub read_requests: u64,
    /// Bytes of this file sent back.
    pub bytes_read: u64,
    /// Fetch blocks of this file fetched.
    pub fetches: u64,
}

/// State shared by the [`Mount`] handle, the filesystem and its read workers.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) read_requests: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) max_in_flight: AtomicU64,
    pub(crate) max_request_bytes: AtomicU64,
    /// Requests in the daemon's queue now, and the most there were.
    pub(crate) queued: AtomicU64,
    pub(crate) max_queued: AtomicU64,
    pub(crate) fetches: AtomicU64,
    pub(crate) joined_fetches: AtomicU64,
    pub(crate) interrupted: AtomicU64,
    /// Bumped by [`Mount::forget_fetched`]; the read path forgets its fetched blocks when it
    /// sees a new value, under its own lock, so that no decision mixes the two.
    pub(crate) forget_generation: AtomicU64,
    /// Counters per file, by path relative to the source (normalized).
    pub(crate) files: Mutex<HashMap<Arc<Path>, FileStats>>,
    pub(crate) short_reads: AtomicBool,
    /// [`Options::interrupt_every`], 0 for never.
    pub(crate) interrupt_every: AtomicU64,
    /// `READ`s counted for [`Options::interrupt_every`].
    pub(crate) interrupt_count: AtomicU64,
    /// The file (as normal components relative to the source) and offset that fail.
    pub(crate) eio_at: Mutex<Option<(PathBuf, u64)>>,
}

impl Shared {
    fn new(options: &Options) -> Self {
        let shared = Self::default();
        shared
            .short_reads
            .store(options.short_reads, Ordering::Relaxed);
        shared.interrupt_every.store(
            u64::from(options.interrupt_every.unwrap_or(0)),
            Ordering::Relaxed,
        );
        shared.set_eio_at(options.eio_at.clone());
        shared
    }

    fn set_eio_at(&self, eio_at: Option<(String, u64)>) {
        let eio_at = eio_at.map(|(file, offset)| (normalize(Path::new(&file)), offset));
        *self.eio_at.lock().unwrap_or_else(PoisonError::into_inner) = eio_at;
    }

    /// Whether files are opened with `FOPEN_DIRECT_IO` for a fault that must reach the
    /// application's reads whole.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn faults_need_direct_io(&self) -> bool {
        self.short_reads.load(Ordering::Relaxed)
            || self.interrupt_every.load(Ordering::Relaxed) != 0
    }

    /// Whether this `READ` answers `EINTR` ([`Options::interrupt_every`]).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn interrupts(&self) -> bool {
        let every = self.interrupt_every.load(Ordering::Relaxed);
        let interrupts = every != 0
            && (self.interrupt_count.fetch_add(1, Ordering::Relaxed) + 1).is_multiple_of(every);
        if interrupts {
            self.interrupted.fetch_add(1, Ordering::Relaxed);
        }
        interrupts
    }

    /// Whether a `READ` of `file` (relative, normalized) covering `[offset, offset + size)`
    /// must fail.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn fails(&self, file: &Path, offset: u64, size: u64) -> bool {
        let eio_at = self.eio_at.lock().unwrap_or_else(PoisonError::into_inner);
        match &*eio_at {
            Some((bad_file, bad_offset)) => {
                bad_file == file && offset <= *bad_offset && *bad_offset - offset < size
            }
            None => false,
        }
    }

    /// Updates the counters of `file` (relative, normalized).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn count_file(&self, file: &Arc<Path>, update: impl FnOnce(&mut FileStats)) {
        let mut files = self.files.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(stats) = files.get_mut(&**file) {
            update(stats);
        } else {
            let mut stats = FileStats::default();
            update(&mut stats);
            files.insert(Arc::clone(file), stats);
        }
    }
}

/// The normal components of a relative path (`./a//b` and `a/b` are the same file).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect()
}

/// A mounted filesystem. Dropping it unmounts it and removes the mount point it created.
pub struct Mount {
    session: Option<os::Session>,
    mount_point: PathBuf,
    /// Whether the mount point is ours to remove (created by [`Mount::new`]).
    owns_mount_point: bool,
    shared: Arc<Shared>,
}

impl fmt::Debug for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mount")
            .field("mount_point", &self.mount_point)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Mount {
    /// Mounts `source_dir` read-only at a new temporary directory and serves it in a
    /// background thread until the `Mount` is dropped. The filesystem is ready when this
    /// returns.
    ///
    /// # Errors
    ///
    /// When `source_dir` is not a directory, the options are invalid, or the mount fails
    /// (see [`fuse_available`]); the temporary mount point is removed again.
    pub fn new(source_dir: &Path, options: Options) -> io::Result<Mount> {
        let dir = tempfile::Builder::new()
            .prefix("safeload-testfs-")
            .tempdir()?;
        // The kernel records the canonical path; hand out the same one.
        let mount_point = dir.path().canonicalize()?;
        let dir = dir.keep();
        Self::mount_at(source_dir, mount_point, true, options).inspect_err(|_| {
            let _ = std::fs::remove_dir(&dir);
        })
    }

    /// Like [`Mount::new`], but mounts at an existing empty directory `mount_point`, which is
    /// left in place on drop.
    ///
    /// # Errors
    ///
    /// As [`Mount::new`], and when `mount_point` does not exist.
    pub fn new_at(source_dir: &Path, mount_point: &Path, options: Options) -> io::Result<Mount> {
        let mount_point = mount_point
            .canonicalize()
            .map_err(|e| with_path(e, "mount point", mount_point))?;
        Self::mount_at(source_dir, mount_point, false, options)
    }

    fn mount_at(
        source_dir: &Path,
        mount_point: PathBuf,
        owns_mount_point: bool,
        options: Options,
    ) -> io::Result<Mount> {
        let source = source_dir
            .canonicalize()
            .map_err(|e| with_path(e, "source directory", source_dir))?;
        if !source.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("source {} is not a directory", source.display()),
            ));
        }
        options.validate()?;
        let shared = Arc::new(Shared::new(&options));
        let session =
            os::mount(&source, &mount_point, &options, Arc::clone(&shared)).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "mounting {} at {}: {e}",
                        source.display(),
                        mount_point.display()
                    ),
                )
            })?;
        Ok(Mount {
            session: Some(session),
            mount_point,
            owns_mount_point,
            shared,
        })
    }

    /// The mount point (a canonical path).
    pub fn path(&self) -> &Path {
        &self.mount_point
    }

    /// A snapshot of the `READ` counters since the mount or the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            read_requests: s.read_requests.load(Ordering::Relaxed),
            bytes_read: s.bytes_read.load(Ordering::Relaxed),
            max_in_flight: s.max_in_flight.load(Ordering::Relaxed),
            max_request_bytes: s.max_request_bytes.load(Ordering::Relaxed),
            max_queued: s.max_queued.load(Ordering::Relaxed),
            fetches: s.fetches.load(Ordering::Relaxed),
            joined_fetches: s.joined_fetches.load(Ordering::Relaxed),
            interrupted: s.interrupted.load(Ordering::Relaxed),
        }
    }

    /// The counters of one file since the mount or the last
    /// [`reset_stats`](Self::reset_stats): `file` is relative to the source directory, or a
    /// path under [`path`](Self::path). A file reached through a symlink counts under its
    /// own path. All zero for a file not read.
    pub fn file_stats(&self, file: impl AsRef<Path>) -> FileStats {
        let file = file.as_ref();
        let relative = normalize(file.strip_prefix(&self.mount_point).unwrap_or(file));
        let files = self
            .shared
            .files
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        files.get(relative.as_path()).copied().unwrap_or_default()
    }

    /// Sets every counter to zero (`max_in_flight` and `max_queued` to the number of reads
    /// being served and queued now), the counters of every file too. Fetched blocks stay
    /// fetched: see [`forget_fetched`](Self::forget_fetched).
    pub fn reset_stats(&self) {
        let s = &self.shared;
        s.read_requests.store(0, Ordering::Relaxed);
        s.bytes_read.store(0, Ordering::Relaxed);
        s.max_request_bytes.store(0, Ordering::Relaxed);
        s.fetches.store(0, Ordering::Relaxed);
        s.joined_fetches.store(0, Ordering::Relaxed);
        s.interrupted.store(0, Ordering::Relaxed);
        s.max_in_flight
            .store(s.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        s.max_queued
            .store(s.queued.load(Ordering::Relaxed), Ordering::Relaxed);
        s.files
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Forgets which fetch blocks were fetched ([`Options::first_byte_delay`]), so that the
    /// next `READ` of each block pays the delay again: the mount is cold once more. Fetches
    /// in flight finish and count as fetched. The kernel's page cache of the mount is
    /// separate; to make a benchmark cold, also drop it (open the file with direct I/O, or
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` it, or write `1` to `/proc/sys/vm/drop_caches`).
    pub fn forget_fetched(&self) {
        self.shared
            .forget_generation
            .fetch_add(1, Ordering::Release);
    }

    /// Sets the kernel readahead of this mount (`/sys/class/bdi/<dev>/read_ahead_kb`; needs
    /// root). FUSE mounts start at 128 KiB, the most the kernel lets a filesystem ask for in
    /// `INIT`; with latency per request that caps sequential reads through the page cache
    /// (128 KiB per 2 ms is 64 MiB/s per stream), as on real FUSE mounts until an
    /// administrator raises it. Reads are at most 1 MiB each whatever the readahead.
    ///
    /// # Errors
    ///
    /// When the sysfs file cannot be written (not root, sysfs read-only).
    pub fn set_read_ahead_kb(&self, kb: u32) -> io::Result<()> {
        os::set_read_ahead_kb(&self.mount_point, kb)
    }

    /// Changes [`Options::eio_at`] on the running mount; `None` stops failing reads.
    pub fn set_eio_at(&self, eio_at: Option<(String, u64)>) {
        self.shared.set_eio_at(eio_at);
    }

    /// Changes [`Options::short_reads`] on the running mount. It applies to files opened from
    /// now on (which are then opened with `FOPEN_DIRECT_IO`); files already open through the
    /// page cache keep full reads, and files already open with direct I/O follow the switch.
    pub fn set_short_reads(&self, short_reads: bool) {
        self.shared
            .short_reads
            .store(short_reads, Ordering::Relaxed);
    }

    /// Changes [`Options::interrupt_every`] on the running mount, for files opened from now on
    /// (as [`set_short_reads`](Self::set_short_reads)); `None` stops the interruptions.
    pub fn set_interrupt_every(&self, every: Option<u32>) {
        self.shared
            .interrupt_every
            .store(u64::from(every.unwrap_or(0)), Ordering::Relaxed);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            os::unmount(session, &self.mount_point);
        }
        if !self.owns_mount_point {
            return;
        }
        if let Err(e) = std::fs::remove_dir(&self.mount_point) {
            eprintln!(
                "safeload-testfs: cannot remove mount point {}: {e}",
                self.mount_point.display()
            );
        }
    }
}

/// Says whether this process can mount a FUSE filesystem: `/dev/fuse` exists and opens, the
/// process is root or finds `fusermount3` (or `fusermount`) on `PATH`, and a probe mount of
/// an empty directory succeeds. The answer is computed once per process.
///
/// # Errors
///
/// The reason FUSE is not available, for tests to report themselves skipped.
pub fn fuse_available() -> Result<(), String> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE.get_or_init(probe).clone()
}

fn probe() -> Result<(), String> {
    os::can_mount()?;
    let source = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let mount = Mount::new(source.path(), Options::default())
        .map_err(|e| format!("probe mount failed: {e}"))?;
    drop(mount);
    Ok(())
}

/// The skip policy for tests that need FUSE: returns `false` when FUSE is available; otherwise
/// prints `SKIPPED: <reason>` to stderr and returns `true`, or panics with the reason when
/// the environment variable `SAFELOAD_REQUIRE_FUSE` is `1` (set it in CI where FUSE must work).
///
/// ```no_run
/// if safeload_testfs::skip_without_fuse() {
///     return;
/// }
/// ```
pub fn skip_without_fuse() -> bool {
    match fuse_available() {
        Ok(()) => false,
        Err(reason) => {
            if std::env::var_os("SAFELOAD_REQUIRE_FUSE").is_some_and(|v| v == "1") {
                panic!("FUSE is required (SAFELOAD_REQUIRE_FUSE=1) but not available: {reason}");
            }
            eprintln!("SKIPPED: {reason}");
            true
        }
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn with_path(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_background_follows_the_daemon_threads() {
        let with = |daemon_threads, max_background| Options {
            daemon_threads,
            max_background,
            ..Options::default()
        };
        assert_eq!(Options::default().effective_max_background(), 64);
        assert_eq!(with(Some(8), None).effective_max_background(), 64);
        assert_eq!(with(Some(32), None).effective_max_background(), 64);
        assert_eq!(with(Some(33), None).effective_max_background(), 66);
        assert_eq!(
            with(Some(100_000), None).effective_max_background(),
            u16::MAX
        );
        assert_eq!(with(Some(100), Some(16)).effective_max_background(), 16);
        let concurrent = Options {
            max_concurrent_reads: Some(200),
            ..Options::default()
        };
        assert_eq!(concurrent.effective_max_background(), 64);
    }

    #[test]
    fn validate_rejects_zeroes_and_two_worker_limits() {
        assert!(Options::default().validate().is_ok());
        let bad = [
            Options {
                daemon_threads: Some(0),
                ..Options::default()
            },
            Options {
                daemon_threads: Some(2),
                max_concurrent_reads: Some(2),
                ..Options::default()
            },
            Options {
                bandwidth_bytes_per_sec: Some(0),
                ..Options::default()
            },
            Options {
                fetch_block: 0,
                ..Options::default()
            },
            Options {
                max_background: Some(0),
                ..Options::default()
            },
            Options {
                subtype: Some("a,b".into()),
                ..Options::default()
            },
        ];
        for options in bad {
            let err = options.validate().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{options:?}");
        }
    }
}
