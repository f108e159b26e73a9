//! A read-only FUSE passthrough filesystem for safeload's tests and benchmarks.
//!
//! [`Mount::new`] mounts a directory tree at a fresh temporary mount point and serves it back
//! through FUSE, so that code under test sees what it would see on `hf-mount` (the Hugging Face
//! hub FUSE mount) or on a slow or faulty network filesystem: a mount whose type in
//! `/proc/self/mountinfo` is `fuse` or `fuse.<subtype>`, whose source is any name you choose,
//! whose reads take as long as you say, run as many at a time as you allow, come back short, or
//! fail with `EIO` at an offset you pick. Dropping the [`Mount`] unmounts it, also while a failed
//! test unwinds.
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
//! - **Concurrent reads.** fuser's session loop runs on one thread here; each `READ` is handed
//!   to a pool of worker threads that grows on demand up to [`Options::max_concurrent_reads`]
//!   (64 when unlimited) and answers from there, so throughput comes from requests in flight,
//!   as on a network mount. The latency is slept inside the bounded section: with `Some(1)` every read
//!   is served strictly one after another.
//! - **Page cache.** Unless [`Options::direct_io`] or [`Options::short_reads`] is set, files are
//!   opened with `FOPEN_KEEP_CACHE`: as on NFS, the page cache of a file survives close and
//!   reopen, so a prefetch pass followed by a second open finds warm pages. The kernel
//!   reads ahead on its own, so [`Stats`] count what the kernel asked for, not what the
//!   application read. With `direct_io`, files are opened with `FOPEN_DIRECT_IO` and each
//!   `read()` becomes `READ` requests of at most 1 MiB. `mmap` of such a file still works:
//!   the filesystem asks for `FUSE_DIRECT_IO_ALLOW_MMAP` where the kernel offers it (6.6 and
//!   later), and faults then go through the page cache.
//!
//! # Kernel connection settings
//!
//! In `INIT` the filesystem raises `max_background` (the number of asynchronous requests such
//! as readahead the kernel keeps in flight) from 16 to 64, with the congestion threshold at
//! three quarters of it. `max_readahead` stays at what the kernel offers, which is already
//! the largest value it accepts (128 KiB by default; raise it after mounting with
//! [`Mount::set_read_ahead_kb`]). fuser asks for `FUSE_MAX_PAGES` with a 16 MiB `max_write`,
//! so the kernel sends reads of up to its own limit, 1 MiB with the default
//! `fs.fuse.max_pages_limit`.
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

use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

#[cfg(target_os = "linux")]
mod fs;
#[cfg_attr(target_os = "linux", path = "linux.rs")]
#[cfg_attr(not(target_os = "linux"), path = "stub.rs")]
mod os;

/// How a [`Mount`] behaves. `Options::default()` is a plain passthrough named
/// `safeload-testfs`, with no subtype, no latency, unlimited concurrency and no faults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The mount source in `/proc/self/mountinfo` (for example `hf-mount`). Must not contain
    /// a comma.
    pub fsname: String,
    /// With `Some(s)` the filesystem type reads `fuse.<s>` in `/proc/self/mountinfo`; with
    /// `None`, plain `fuse`. Must not contain a comma.
    pub subtype: Option<String>,
    /// Sleep this long in every `READ` request before answering it.
    pub latency: Option<Duration>,
    /// Serve at most this many `READ` requests at once (`Some(1)`: every read serialized,
    /// latency included). `None` allows up to 64. `Some(0)` is rejected by [`Mount::new`].
    pub max_concurrent_reads: Option<usize>,
    /// Answer each `READ` with at most half the bytes asked for (at least one). Files are then
    /// opened with `FOPEN_DIRECT_IO`, as through the page cache the kernel would take a short
    /// answer for the end of the file: so the short count reaches the application's `read()`
    /// and `pread()`. Reads on files opened while this was off are never shortened. Do not
    /// `mmap` files on such a mount: faults go through the page cache, where a short answer
    /// makes the kernel take the file for shorter than it is.
    pub short_reads: bool,
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

impl Default for Options {
    fn default() -> Self {
        Self {
            fsname: "safeload-testfs".to_owned(),
            subtype: None,
            latency: None,
            max_concurrent_reads: None,
            short_reads: false,
            eio_at: None,
            direct_io: false,
        }
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
    /// The most `READ` requests served at the same time.
    pub max_in_flight: u64,
    /// The largest size a `READ` request asked for.
    pub max_request_bytes: u64,
}

/// State shared by the [`Mount`] handle, the filesystem and its read workers.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) read_requests: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    pub(crate) in_flight: AtomicU64,
    pub(crate) max_in_flight: AtomicU64,
    pub(crate) max_request_bytes: AtomicU64,
    pub(crate) short_reads: AtomicBool,
    /// The file (as normal components relative to the source) and offset that fail.
    pub(crate) eio_at: Mutex<Option<(PathBuf, u64)>>,
}

impl Shared {
    fn new(options: &Options) -> Self {
        let shared = Self::default();
        shared
            .short_reads
            .store(options.short_reads, Ordering::Relaxed);
        shared.set_eio_at(options.eio_at.clone());
        shared
    }

    fn set_eio_at(&self, eio_at: Option<(String, u64)>) {
        let eio_at = eio_at.map(|(file, offset)| (normalize(Path::new(&file)), offset));
        *self.eio_at.lock().unwrap_or_else(PoisonError::into_inner) = eio_at;
    }

    /// Whether a `READ` of `file` (relative, normalized) covering `[offset, offset + size)`
    /// must fail.
    pub(crate) fn fails(&self, file: &Path, offset: u64, size: u64) -> bool {
        let eio_at = self.eio_at.lock().unwrap_or_else(PoisonError::into_inner);
        match &*eio_at {
            Some((bad_file, bad_offset)) => {
                bad_file == file && offset <= *bad_offset && *bad_offset - offset < size
            }
            None => false,
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
        if options.max_concurrent_reads == Some(0) {
            return Err(invalid("max_concurrent_reads must be at least 1"));
        }
        if options.fsname.contains(',') {
            return Err(invalid("fsname must not contain a comma"));
        }
        if options.subtype.as_deref().is_some_and(|s| s.contains(',')) {
            return Err(invalid("subtype must not contain a comma"));
        }
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
        }
    }

    /// Sets every counter to zero (`max_in_flight` to the number of reads being served now).
    pub fn reset_stats(&self) {
        let s = &self.shared;
        s.read_requests.store(0, Ordering::Relaxed);
        s.bytes_read.store(0, Ordering::Relaxed);
        s.max_request_bytes.store(0, Ordering::Relaxed);
        s.max_in_flight
            .store(s.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
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
