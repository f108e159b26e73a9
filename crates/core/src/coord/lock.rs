//! The one lock file of every protocol between processes (the node copy's key, the prefetch queue, a cache's file): opened privately and never through a link, tried or waited for within a bound, its name checked again once held, and what stands at a name that is not this user's said.
//!
//! Locks are `flock(2)`'s, dropped with the last reference to the open file
//! (its descriptor, any map of it): a process that dies lets go of its
//! locks, so a lock held means a live holder. A wait polls, as `flock(2)`
//! cannot be told to give up (and a stopped holder keeps its locks).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::foreign_at;
use crate::os::{self, NameKind};

/// How long a process waits for a lock another holds before it takes the
/// holder for stopped: far past any hold here, each a few bounded steps.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The longest pause between two tries of a lock waited for.
///
/// NOTE: a waiter sees a lock let go at most this late: the node copy's
/// ranks, which take their key's lock in turn, lose a few milliseconds each.
const LONGEST_PAUSE: Duration = Duration::from_millis(4);

/// Where a lock file is.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    /// A path in a directory every local user may write (`/dev/shm`): this
    /// user's regular `0600` file, made where missing; its holder may remove
    /// it, so its name is checked again once held.
    Private(&'a Path),
    /// A name in a cache's folder, which the hub's client locks too: made
    /// where missing, never through a link, never removed.
    Shared(&'a os::Dir, &'a str),
}

impl Place<'_> {
    /// The file, and its path where its holder may remove it.
    fn open(self) -> io::Result<(File, Option<PathBuf>)> {
        match self {
            Place::Private(path) => match os::open_private_rw(path) {
                Ok(file) => Ok((file, Some(path.to_path_buf()))),
                Err(e) => Err(match foreign_at(path, NameKind::File) {
                    Some(other) => {
                        io::Error::new(io::ErrorKind::PermissionDenied, other.to_string())
                    }
                    None => e,
                }),
            },
            Place::Shared(dir, name) => Ok((dir.open_lock(name)?, None)),
        }
    }
}

/// A lock file this process holds (or held, and may take again), let go
/// when dropped.
#[derive(Debug)]
pub struct Lock {
    file: File,
    /// A private lock's path, which its holder may remove.
    path: Option<PathBuf>,
}

impl Lock {
    /// The lock at `place`, taken within `wait` (`Duration::ZERO`: tried
    /// once); [`io::ErrorKind::WouldBlock`] where another process holds it
    /// past the wait.
    pub fn take(place: Place<'_>, wait: Duration) -> io::Result<Lock> {
        let deadline = Instant::now() + wait;
        // A private name replaced under a waiter is opened again.
        for _ in 0..8 {
            let (file, path) = place.open()?;
            let lock = Lock { file, path };
            if !lock.acquire(deadline)? {
                let held = "held by another process";
                return Err(io::Error::new(io::ErrorKind::WouldBlock, held));
            }
            if lock.named() {
                return Ok(lock);
            }
        }
        Err(io::Error::other("the lock file kept being replaced"))
    }

    /// Takes the lock again after [`Lock::unlock`], within `wait`: whether
    /// it is held.
    pub fn relock(&self, wait: Duration) -> io::Result<bool> {
        self.acquire(Instant::now() + wait)
    }

    fn acquire(&self, deadline: Instant) -> io::Result<bool> {
        let mut pause = Duration::from_millis(1);
        while !os::flock(&self.file, true)? {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
        Ok(true)
    }

    /// Lets go of the lock (where held), keeping the file open: a map of it
    /// stays.
    pub fn unlock(&self) {
        let _ = os::flock(&self.file, false);
    }

    /// The open lock file.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether its name still is the file locked (a shared name always is:
    /// nothing removes it).
    pub fn named(&self) -> bool {
        let Some(path) = &self.path else {
            return true;
        };
        // Its device and inode, by `lstat(2)` for the name.
        let id = |meta: io::Result<std::fs::Metadata>| os::file_id(&meta.ok()?);
        id(std::fs::symlink_metadata(path)).is_some_and(|at| Some(at) == id(self.file.metadata()))
    }

    /// Removes its private name, where it still names this file: whether it
    /// went.
    pub fn remove(&self) -> bool {
        let path = self.path.as_deref().filter(|_| self.named());
        path.is_some_and(|path| std::fs::remove_file(path).is_ok())
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        self.unlock();
    }
}

// Private lock files need the Linux OS layer (a private open, `flock(2)`).
#[cfg(all(test, target_os = "linux", not(safeload_os_stub)))]
mod tests {
    use super::*;

    fn private(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("x.lock")
    }

    #[test]
    fn a_held_lock_is_tried_in_vain_and_waited_for_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = private(&dir);
        let held = Lock::take(Place::Private(&path), Duration::ZERO).expect("taken at once");
        let tried = Lock::take(Place::Private(&path), Duration::ZERO).unwrap_err();
        assert_eq!(
            tried.kind(),
            io::ErrorKind::WouldBlock,
            "held by another open file"
        );
        let start = Instant::now();
        let waited = Lock::take(Place::Private(&path), Duration::from_millis(60)).unwrap_err();
        assert_eq!(waited.kind(), io::ErrorKind::WouldBlock);
        assert!(
            start.elapsed() >= Duration::from_millis(60),
            "the whole bound"
        );
        // Let go on another thread meanwhile: the waiter gets it soon after.
        let start = Instant::now();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(held);
        });
        let got = Lock::take(Place::Private(&path), Duration::from_secs(5));
        release.join().unwrap();
        assert!(got.is_ok());
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < Duration::from_secs(1), "{took:?}");
    }

    #[test]
    fn unlocked_it_is_free_and_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = private(&dir);
        let lock = Lock::take(Place::Private(&path), Duration::ZERO).unwrap();
        lock.unlock();
        let other = Lock::take(Place::Private(&path), Duration::ZERO);
        assert!(other.is_ok(), "free once unlocked");
        assert!(!lock.relock(Duration::ZERO).unwrap(), "the other holds it");
        drop(other);
        assert!(lock.relock(Duration::ZERO).unwrap());
    }

    #[test]
    fn a_name_removed_under_the_lock_is_not_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = private(&dir);
        let first = Lock::take(Place::Private(&path), Duration::ZERO).unwrap();
        assert!(first.named());
        assert!(first.remove());
        assert!(!first.named() && !path.exists());
        assert!(!first.remove(), "not its name any more");
        // A new file at the name: another lock, free.
        let second = Lock::take(Place::Private(&path), Duration::ZERO).unwrap();
        assert!(second.named());
    }

    #[test]
    fn what_is_not_this_users_private_file_is_refused_and_said() {
        let dir = tempfile::tempdir().unwrap();
        let path = private(&dir);
        std::os::unix::fs::symlink("/dev/null", &path).unwrap();
        let e = Lock::take(Place::Private(&path), Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(e.to_string(), "a symlink, not what its name says");
        let socket = dir.path().join("socket.lock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let e = Lock::take(Place::Private(&socket), Duration::ZERO).unwrap_err();
        assert_eq!(e.to_string(), "a socket, not what its name says");
    }

    #[test]
    fn a_shared_name_is_made_where_missing_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let folder = os::Dir::open(dir.path()).unwrap();
        let made = Lock::take(Place::Shared(&folder, "b.lock"), Duration::ZERO);
        assert!(made.is_ok() && dir.path().join("b.lock").is_file());
        let busy = Lock::take(Place::Shared(&folder, "b.lock"), Duration::ZERO).unwrap_err();
        assert_eq!(busy.kind(), io::ErrorKind::WouldBlock, "held by the first");
        std::os::unix::fs::symlink("b.lock", dir.path().join("link.lock")).unwrap();
        assert!(Lock::take(Place::Shared(&folder, "link.lock"), Duration::ZERO).is_err());
    }
}
