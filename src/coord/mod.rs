//! How the processes of a node coordinate through a shared directory, one mechanism each: the lock file (`lock.rs`), the owner a name is tagged with (`owner.rs`), and the dead-owner rule by which every protocol removes what a dead process left ([`sweep`]).
//!
//! The node copy (its key's lock, the sockets of its holders), the prefetch
//! queue (its file, locked and tagged by the ranks attached) and the caches
//! (a file being written, under its lock, marked as changed every second)
//! leave names that outlive a process that dies. The rule is the same for
//! all:
//!
//! **A name is tagged by its writer and guarded by a lock: it is live while
//! its lock is held or while its tag says its writer runs.** A lock dies with
//! its holder (`flock(2)`), and a tag is an owner word (pid and start time,
//! `owner.rs`) in the name or the file, or a time of last change that a live
//! writer keeps fresh. A name that is not live is removed by whoever comes
//! next, under its lock, tried and never waited for (a lock held is a live
//! writer), so that a process taking the name up meanwhile is never
//! disturbed.
//!
//! The directories are shared (`/dev/shm` is every user's): a name that is
//! not this user's, or not what it says it is, is looked at by `lstat(2)`
//! only ([`Foreign`]), never locked, followed or removed.

mod lock;
mod owner;

use std::path::Path;

pub(crate) use lock::{Lock, PATIENCE, Place};
pub(crate) use owner::Owner;

use crate::os::{self, NameKind};

/// A name a process left, as the dead-owner rule sees it.
pub(crate) trait Left {
    /// Its lock; `None` for a name tagged by its owner alone.
    fn lock(&self) -> Option<Place<'_>>;

    /// Whether its tag says its writer still runs, asked under its lock.
    fn runs(&self, lock: Option<&Lock>) -> bool;

    /// Removes the name, under its lock: whether it went.
    fn remove(&self, lock: Option<&Lock>) -> bool;
}

/// The dead-owner rule over `names`, in order: each one whose lock is free
/// and whose writer is gone is removed. A lock held (or not to be had) keeps
/// its name. Returns how many went.
pub(crate) fn sweep<L: Left>(names: impl IntoIterator<Item = L>) -> usize {
    let dead = |name: &L| {
        let lock = match name.lock() {
            Some(place) => match Lock::take(place, std::time::Duration::ZERO) {
                Ok(Some(lock)) => Some(lock),
                _ => return false,
            },
            None => None,
        };
        !name.runs(lock.as_ref()) && name.remove(lock.as_ref())
    };
    names.into_iter().filter(dead).count()
}

/// A name in a shared directory that is not this user's, or not what its
/// name says it is: what it is (by `lstat(2)`) and whose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Foreign {
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
pub(crate) fn foreign(name: &str, meant: NameKind, meta: &std::fs::Metadata) -> Option<Foreign> {
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
pub(crate) fn foreign_at(path: &Path, meant: NameKind) -> Option<Foreign> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let name = path.file_name()?.to_string_lossy();
    foreign(&name, meant, &meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A name of the naive rule's: its writer's state, whether removing it
    /// works, and what the sweep did to it.
    struct Name {
        runs: bool,
        removable: bool,
        asked: Cell<bool>,
        removed: Cell<bool>,
    }

    impl Left for &Name {
        fn lock(&self) -> Option<Place<'_>> {
            None
        }

        fn runs(&self, lock: Option<&Lock>) -> bool {
            assert!(lock.is_none());
            self.asked.set(true);
            self.runs
        }

        fn remove(&self, _: Option<&Lock>) -> bool {
            self.removed.set(self.removable);
            self.removable
        }
    }

    #[test]
    fn only_what_no_live_writer_owns_is_removed_and_counted() {
        let names: Vec<Name> = [(true, true), (false, true), (false, false), (true, false)]
            .into_iter()
            .map(|(runs, removable)| Name {
                runs,
                removable,
                asked: Cell::new(false),
                removed: Cell::new(false),
            })
            .collect();
        assert_eq!(sweep(&names), 1);
        for name in &names {
            assert!(name.asked.get());
            assert_eq!(name.removed.get(), !name.runs && name.removable);
        }
    }

    // Locks need the Linux OS layer.
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn a_held_lock_keeps_its_name_whatever_its_tag_says() {
        struct Locked<'a>(&'a Path);
        impl Left for Locked<'_> {
            fn lock(&self) -> Option<Place<'_>> {
                Some(Place::Private(self.0))
            }
            fn runs(&self, lock: Option<&Lock>) -> bool {
                assert!(lock.is_some_and(Lock::named), "asked under its lock");
                false
            }
            fn remove(&self, lock: Option<&Lock>) -> bool {
                lock.is_some_and(Lock::remove)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.lock");
        let held = Lock::take(Place::Private(&path), std::time::Duration::ZERO).unwrap();
        assert_eq!(sweep([Locked(&path)]), 0);
        assert!(path.exists(), "its holder lives");
        drop(held);
        assert_eq!(sweep([Locked(&path)]), 1);
        assert!(!path.exists());
    }
}
