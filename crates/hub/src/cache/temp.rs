//! The file a cache write fills before it is published: the partial file every process names alike (`partial.rs`), where the file's lock is held and the name is this user's, so that a later load resumes it; else a process-unique temporary name, removed when dropped.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use super::layout;
use super::partial::{self, Opened};
use crate::coord::{self, Lock, Place};
use crate::os::{self, Dir, EntryKind};
use crate::source::NotCached;

/// A temporary file not written to for this long (a live writer's changes every second),
/// its lock free, was left by a dead writer.
pub(crate) const STALE: Duration = Duration::from_secs(3600);

/// A temporary file being written: removed when dropped unless published, or kept for a
/// later load to resume (a partial file with a finished piece).
pub(crate) struct TempFile {
    pub dir: Dir,
    pub temp: String,
    /// Shared with what reads back from it (`write::Local`).
    pub file: Arc<File>,
    /// A lock held for as long as this lives, where the cache takes one.
    pub _lock: Option<Lock>,
    /// Set once the temporary name is gone (renamed to the final one).
    pub moved: AtomicBool,
    /// Whether its space is reserved (`fallocate`): a shared map of it cannot fault
    /// (`SIGBUS`) on a full disk.
    pub reserved: bool,
    /// The final name, where this is its partial file: kept when dropped unpublished
    /// unless `discard` is set.
    pub partial_of: Option<String>,
    pub discard: AtomicBool,
    /// What an earlier load left of it, taken by the write.
    pub resume: Option<Opened>,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let moved = self.moved.load(Ordering::Relaxed);
        match &self.partial_of {
            Some(name) if moved => {
                let _ = self.dir.remove(&partial::pieces_name(name));
            }
            // Nothing finished to resume (or nothing to keep): removed.
            Some(name)
                if self.discard.load(Ordering::Relaxed)
                    || !partial::has_pieces(&self.dir, name) =>
            {
                let _ = partial::remove(&self.dir, name);
            }
            Some(_) => {}
            None if !moved => {
                let _ = self.dir.remove(&self.temp);
            }
            None => {}
        }
    }
}

impl TempFile {
    /// The file to write `final_name` of `len` bytes in `dir` through: under its lock
    /// (`Locked` where held), its partial file, resumed; without a lock, or where the
    /// partial file is not this user's, a process-unique name. Refused where `final_name`
    /// exists.
    pub(crate) fn make(
        dir: Dir,
        final_name: &str,
        len: u64,
        locks: Option<Dir>,
    ) -> Result<TempFile, NotCached> {
        let unwritable = |e: io::Error| NotCached::of_io(&e);
        let name = layout::lock_name(final_name);
        let lock = match locks.map(|l| Lock::take(Place::Shared(&l, &name), Duration::ZERO)) {
            Some(Err(e)) if e.kind() == io::ErrorKind::WouldBlock => return Err(NotCached::Locked),
            locked => locked.and_then(Result::ok),
        };
        if matches!(dir.entry(final_name), Ok(EntryKind::File { .. })) {
            return Err(NotCached::PublishedElsewhere);
        }
        let opened = match lock {
            Some(_) => partial::open(&dir, final_name, len),
            None => None,
        };
        let (temp, file, partial_of, resume) = match opened {
            Some(opened) => {
                let name = partial::partial_name(final_name);
                let file = Arc::clone(&opened.file);
                (name, file, Some(final_name.to_owned()), Some(opened))
            }
            None => {
                let (temp, file) = unique(&dir, final_name)?;
                (temp, Arc::new(file), None, None)
            }
        };
        let mut begun = TempFile {
            dir,
            temp,
            file,
            _lock: lock,
            moved: AtomicBool::new(false),
            reserved: false,
            partial_of,
            discard: AtomicBool::new(false),
            resume,
        };
        // Reserved first: a full disk is found now, not half way.
        match os::reserve(&begun.file, len) {
            Ok(reserved) => begun.reserved = reserved,
            Err(e) => {
                begun.discard.store(true, Ordering::Relaxed);
                return Err(unwritable(e));
            }
        }
        Ok(begun)
    }
}

/// Whether a file last changed at `modified` is older than [`STALE`] at `now`.
pub(crate) fn stale(modified: Option<SystemTime>, now: SystemTime) -> bool {
    modified.is_some_and(|at| now.duration_since(at).is_ok_and(|age| age > STALE))
}

/// Removes the temporary files of `dir` that dead writers left, by the dead-owner rule:
/// not written to for [`STALE`], the lock of their final name in `locks` free.
pub(crate) fn sweep(dir: &Dir, locks: &Dir) {
    let now = SystemTime::now();
    let stale = |name: &str| match dir.entry(name) {
        Ok(EntryKind::File { modified, .. }) => stale(modified, now),
        _ => false,
    };
    for name in dir.names().unwrap_or_default() {
        let lock = layout::final_of_temp(&name).map(layout::lock_name);
        if let Some(lock) = lock.filter(|_| stale(&name)) {
            let remove = |_: &Lock| stale(&name) && dir.remove(&name).is_ok();
            coord::sweep(Place::Shared(locks, &lock), remove);
        }
    }
}

/// A new file under a process-unique temporary name for `final_name`.
fn unique(dir: &Dir, final_name: &str) -> Result<(String, File), NotCached> {
    for _ in 0..3 {
        let temp = layout::temp_name(final_name, nonce());
        match dir.create_new(&temp) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(NotCached::of_io(&e)),
        }
    }
    Err(NotCached::Unwritable {
        error: "no free temporary name".to_owned(),
    })
}

/// A name unique in this process (a counter) and unlikely in another (pid and time).
pub(crate) fn nonce() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (u64::from(std::process::id()) << 40) ^ (count << 24) ^ nanos;
    // splitmix64's finalizer: nearby inputs give unrelated names.
    let mut z = mixed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
