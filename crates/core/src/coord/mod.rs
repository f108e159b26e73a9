//! How the processes of a node coordinate through a shared directory, one mechanism each: the lock file (`lock.rs`), the owner a name is tagged with (`owner.rs`), and the dead-owner rule by which every protocol removes what a dead process left ([`sweep`]).
//!
//! The node copy, the prefetch queue and the caches leave names that outlive
//! a process that dies. One rule removes them: **a name is tagged by its
//! writer; its lock held, or its tag naming a writer that runs, it is live.**
//! A lock dies with its holder (`flock(2)`); a tag is an owner word (pid and
//! start time) in the name or the file, or the time the file last changed,
//! which a live writer keeps fresh. A name that is not live is removed by
//! whoever comes next, under its lock (tried, never waited for); a name
//! without a lock (a holder's socket) goes by its tag alone. A name that is
//! not this user's, or not what it says it is, is only `lstat`ed (`Foreign`).

mod lock;
mod owner;

use std::path::{Path, PathBuf};

pub use lock::PATIENCE;
pub use lock::{Lock, Place};
pub use owner::Owner;

use crate::os::{self, NameKind};

/// The dead-owner rule over a name guarded by the lock at `lock`: the lock
/// tried (held, the name is a live writer's); under it, `remove` removes the
/// name unless its tag names a writer that runs, saying whether it went.
pub fn sweep(lock: Place<'_>, remove: impl FnOnce(&Lock) -> bool) -> bool {
    Lock::take(lock, std::time::Duration::ZERO).is_ok_and(|lock| remove(&lock))
}

/// The directory the processes of a node share names in: `/dev/shm` where
/// it is a directory, else the temporary directory.
pub fn shared_dir() -> PathBuf {
    let shm = Some(Path::new("/dev/shm")).filter(|shm| shm.is_dir());
    shm.map_or_else(std::env::temp_dir, Path::to_path_buf)
}

/// FNV-1a, 64 bits, from `seed`: a stable hash (the same in every build and
/// process) of what a shared name stands for.
pub fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A name in a shared directory that is not this user's, or not what its
/// name says it is: what it is (by `lstat(2)`) and whose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Foreign {
    pub name: String,
    pub kind: NameKind,
    /// `None` where the platform cannot tell.
    pub uid: Option<u32>,
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.uid {
            Some(uid) if Some(uid) != os::effective_uid() => {
                write!(f, "{} of uid {uid}, not this user's", self.kind)
            }
            Some(_) => write!(f, "{}, not what its name says", self.kind),
            None => write!(f, "{} of an unknown user", self.kind),
        }
    }
}

/// What `meta` (by `lstat(2)`) says of a name meant to be this user's
/// `meant` (a socket for a holder, a file for a lock or a queue): `None`
/// where it is.
pub fn foreign(name: &str, meant: NameKind, meta: &std::fs::Metadata) -> Option<Foreign> {
    let kind = os::name_kind(meta);
    let uid = os::file_owner(meta);
    (uid.is_none() || uid != os::effective_uid() || kind != meant).then(|| Foreign {
        name: name.to_owned(),
        kind,
        uid,
    })
}

/// What `path` is, where it is not this user's `meant` (by `lstat(2)`):
/// `None` where it is, or is not there.
pub fn foreign_at(path: &Path, meant: NameKind) -> Option<Foreign> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let name = path.file_name()?.to_string_lossy();
    foreign(&name, meant, &meta)
}

// Locks need the Linux OS layer.
#[cfg(all(test, target_os = "linux", not(safeload_os_stub)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_held_lock_keeps_its_name_whatever_its_tag_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.lock");
        let held = Lock::take(Place::Private(&path), std::time::Duration::ZERO);
        let asked = Cell::new(false);
        let dead = |lock: &Lock| {
            assert!(lock.named(), "asked under its lock");
            asked.set(true);
            lock.remove()
        };
        assert!(!sweep(Place::Private(&path), dead));
        assert!(path.exists() && !asked.get(), "its holder lives");
        drop(held);
        assert!(!sweep(Place::Private(&path), |_| false), "its writer runs");
        assert!(path.exists());
        assert!(sweep(Place::Private(&path), dead));
        assert!(!path.exists() && asked.get());
    }

    #[test]
    fn fnv1a_is_the_reference_hash() {
        // The FNV-1a test vectors of `a` and `foobar` (64 bits).
        let basis = 0xcbf2_9ce4_8422_2325;
        assert_eq!(fnv1a(basis, b""), basis);
        assert_eq!(fnv1a(basis, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(basis, b"foobar"), 0x8594_4171_f739_67e8);
    }
}
