//! Where a node copy is found: its key (the files' versions and the job), the names of its lock and of the sockets that hand it out, and the removal of what dead jobs left.
//!
//! In the queue directory: `safeload-node-<key>-u<uid>.lock`, this user's
//! lock (`coord/lock.rs`) held while a rank looks for, makes, or starts or
//! stops handing out a copy; and `safeload-node-<key>-<owner>.sock`, one per
//! holder, named by its owner word so a dead holder is known by its name. The
//! key covers the files' versions, the chunk size and the job; not the uid:
//! another user's copy is found and refused by its credentials (`handoff.rs`).
//!
//! `/dev/shm` is every user's: each name is looked at by `lstat(2)` first
//! ([`entries`]), and one not this user's, or a holder's name that is no
//! socket, is never connected to, followed, removed or counted; it is said
//! once ([`Foreign`]). Removing this user's names after that look is safe: in
//! a sticky directory another user cannot swap them (unlink(2), `EPERM`).
//! What killed jobs left, the prefetch queue files too, goes by the
//! dead-owner rule ([`sweep`]).

use std::path::{Path, PathBuf};

use crate::coord::{self, Foreign, Lock, Owner, Place, foreign};
use crate::os::{self, NameKind};
use crate::source::{Source, Version, VersionTag};

const PREFIX: &str = "safeload-node-";

/// The bytes that name one version of one file (device, inode, length,
/// mtime and path; or address, length and ETag); `None` where it cannot be
/// told, and the file gets no copy.
pub(crate) fn identity(source: &dyn Source) -> Option<Vec<u8>> {
    let Version { len, tag } = source.version();
    let mut bytes = Vec::with_capacity(64);
    match (tag, source.local()) {
        (VersionTag::Inode { dev, ino, mtime_ns }, Some(local)) => {
            for word in [*dev, *ino, *len] {
                bytes.extend_from_slice(&word.to_le_bytes());
            }
            bytes.extend_from_slice(&mtime_ns.to_le_bytes());
            bytes.extend_from_slice(local.canonical().as_os_str().as_encoded_bytes());
        }
        (VersionTag::ETag(etag), None) => {
            bytes.extend_from_slice(b"remote\0");
            bytes.extend_from_slice(source.path().as_os_str().as_encoded_bytes());
            bytes.push(0);
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(etag.as_bytes());
        }
        _ => return None,
    }
    bytes.push(0);
    Some(bytes)
}

/// A node copy's key: the files' identities, the chunk size and the job.
pub(crate) fn key(identities: &[Vec<u8>], chunk_size: u64, job: &str) -> u64 {
    let mut material = b"safeload node copy 1\0".to_vec();
    for id in identities {
        material.extend_from_slice(id);
    }
    material.extend_from_slice(&chunk_size.to_le_bytes());
    material.extend_from_slice(job.as_bytes());
    coord::fnv1a(0xcbf2_9ce4_8422_2325, &material)
}

/// The lock file of a key, for this user.
pub(crate) fn lock_path(dir: &Path, key: u64, uid: u32) -> PathBuf {
    dir.join(format!("{PREFIX}{key:016x}-u{uid}.lock"))
}

/// The socket of a key's copy handed out by `owner`.
pub(crate) fn socket_path(dir: &Path, key: u64, owner: Owner) -> PathBuf {
    dir.join(format!("{PREFIX}{key:016x}-{:016x}.sock", owner.word()))
}

/// What a name in the directory is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Lock { key: u64 },
    Socket { key: u64, owner: Owner },
}

/// Parses a file name of the directory; `None` for anything not ours.
pub(crate) fn parse(name: &str) -> Option<Entry> {
    let rest = name.strip_prefix(PREFIX)?;
    let (key, rest) = rest.split_at_checked(16)?;
    let key = u64::from_str_radix(key, 16).ok()?;
    let rest = rest.strip_prefix('-')?;
    if let Some(uid) = rest.strip_suffix(".lock").and_then(|r| r.strip_prefix('u')) {
        uid.parse::<u32>().ok()?;
        return Some(Entry::Lock { key });
    }
    let word = rest.strip_suffix(".sock")?;
    if word.len() != 16 {
        return None;
    }
    let owner = Owner::from_word(u64::from_str_radix(word, 16).ok()?)?;
    Some(Entry::Socket { key, owner })
}

/// A name of the directory that parses as one of ours.
#[derive(Debug, Clone)]
pub(crate) struct Name {
    pub path: PathBuf,
    pub entry: Entry,
    /// Set where the name is another user's, or not what its name says
    /// (a holder's name that is no socket, a lock that is no file).
    pub foreign: Option<Foreign>,
}

/// The names of `dir` that parse as ours, each looked at by `lstat(2)`
/// (`DirEntry::metadata` does not follow a symlink).
pub(crate) fn entries(dir: &Path) -> Vec<Name> {
    let Ok(read) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    read.flatten()
        .filter_map(|e| {
            let file_name = e.file_name();
            let name = file_name.to_str()?;
            let entry = parse(name)?;
            // This user's name of a lock is a file, of a holder a socket.
            let kind = match entry {
                Entry::Lock { .. } => NameKind::File,
                Entry::Socket { .. } => NameKind::Socket,
            };
            Some(Name {
                path: e.path(),
                foreign: foreign(name, kind, &e.metadata().ok()?),
                entry,
            })
        })
        .collect()
}

/// The key's lock at `path`, waited for at most [`coord::PATIENCE`].
pub(crate) fn take_lock(path: &Path) -> Result<Lock, String> {
    Lock::take(Place::Private(path), coord::PATIENCE)
        .map_err(|e| lock_failed(path, coord::PATIENCE, &e))
}

/// Why the key's lock at `path` was not had, after a wait of `waited`.
fn lock_failed(path: &Path, waited: std::time::Duration, e: &std::io::Error) -> String {
    if e.kind() != std::io::ErrorKind::WouldBlock {
        return format!("the lock file {}: {e}", path.display());
    }
    // Each hold is a few bounded steps: a holder this long is stopped.
    format!(
        "waited {} s for the node copy's lock file {}, which another process of this \
         user held all along (a rank stopped while it looked for or made the copy)",
        waited.as_secs(),
        path.display()
    )
}

/// Whether a live owner's socket of `key`, this user's, is in `dir` (else
/// the last rank of a copy removes its lock file, leaving nothing behind).
pub(crate) fn held(dir: &Path, key: u64) -> bool {
    entries(dir).iter().any(|n| {
        matches!(n.entry, Entry::Socket { key: k, owner } if k == key && n.foreign.is_none() && owner.alive())
    })
}

/// Removes what dead jobs of this user left in `dir` by the dead-owner rule
/// ([`coord::sweep`]): dead owners' sockets, free lock files with no live
/// socket, and prefetch queue files no live rank is attached to: how many.
pub(crate) fn sweep(dir: &Path) -> usize {
    let uid = os::effective_uid().unwrap_or(u32::MAX);
    let found = entries(dir);
    let ours = || found.iter().filter(|n| n.foreign.is_none());
    let remove = |name: &Name| std::fs::remove_file(&name.path).is_ok();
    let sockets = ours().filter(|n| match n.entry {
        Entry::Socket { owner, .. } => !owner.alive() && remove(n),
        Entry::Lock { .. } => false,
    });
    let removed = sockets.count();
    let locks = ours().filter(|n| match n.entry {
        // Another user's name where it is not this user's lock file.
        Entry::Lock { key } if n.path == lock_path(dir, key, uid) => {
            coord::sweep(Place::Private(&n.path), |_| !held(dir, key) && remove(n))
        }
        _ => false,
    });
    let removed = removed + locks.count();
    let queues = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let queues = queues.filter(|entry| {
        let name = entry.file_name();
        let name = name.to_str().unwrap_or_default();
        name.starts_with("safeload-prefetch-")
            && name.ends_with(".queue")
            && coord::sweep(Place::Private(&entry.path()), |lock| {
                crate::prefetch::is_stale(lock.file()) && lock.remove()
            })
    });
    removed + queues.count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let owner = Owner {
            pid: 4242,
            tag: 0x1234,
        };
        let dir = Path::new("/dev/shm");
        let sock = socket_path(dir, 0xabc, owner);
        let name = sock.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse(name), Some(Entry::Socket { key: 0xabc, owner }));
        let lock = lock_path(dir, u64::MAX, 1000);
        let name = lock.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse(name), Some(Entry::Lock { key: u64::MAX }));
        for other in [
            "safeload-prefetch-0000000000000abc.queue",
            "safeload-node-xyz.sock",
            "safeload-node-0000000000000abc-u.lock",
            "safeload-node-0000000000000abc-0000000000000000.sock",
            "safeload-node-0000000000000abc-00000000000010.sock",
            "safeload-node-",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn a_lock_waited_for_in_vain_says_how_long_and_why() {
        let path = Path::new("/dev/shm/safeload-node-0000000000000001-u0.lock");
        let held = std::io::Error::new(std::io::ErrorKind::WouldBlock, "held by another process");
        let why = lock_failed(path, coord::PATIENCE, &held);
        assert!(
            why.starts_with("waited 60 s for the node copy's lock file /dev/shm/"),
            "{why}"
        );
        assert!(
            why.contains("another process of this user held all along"),
            "{why}"
        );
        let other = std::io::Error::other("a FIFO of uid 7, not this user's");
        assert_eq!(
            lock_failed(path, coord::PATIENCE, &other),
            format!(
                "the lock file {}: a FIFO of uid 7, not this user's",
                path.display()
            )
        );
    }

    #[test]
    fn the_key_tells_versions_and_jobs_apart() {
        let id = |ino: u8, mtime: u8| vec![1, ino, 3, mtime];
        let base = key(&[id(1, 1)], 8 << 20, "torchelastic:a");
        assert_eq!(base, key(&[id(1, 1)], 8 << 20, "torchelastic:a"));
        assert_ne!(base, key(&[id(2, 1)], 8 << 20, "torchelastic:a"), "inode");
        assert_ne!(base, key(&[id(1, 2)], 8 << 20, "torchelastic:a"), "mtime");
        assert_ne!(base, key(&[id(1, 1)], 4 << 20, "torchelastic:a"), "chunks");
        assert_ne!(base, key(&[id(1, 1)], 8 << 20, "torchelastic:b"), "job");
    }

    // Liveness and private files need the Linux OS layer.
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn the_sweep_removes_the_dead_and_keeps_the_live() {
        let dir = tempfile::tempdir().unwrap();
        let uid = os::effective_uid().unwrap();
        let me = Owner::current();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = Owner {
            pid: child.id(),
            tag: 1,
        };
        child.wait().unwrap();
        let live_sock = socket_path(dir.path(), 1, me);
        let dead_sock = socket_path(dir.path(), 2, dead);
        // Not a socket at a dead holder's name: not what its name says, so
        // not the sweep's to remove.
        let not_sock = socket_path(dir.path(), 3, dead);
        let (live_lock, dead_lock) = (lock_path(dir.path(), 1, uid), lock_path(dir.path(), 2, uid));
        let _listeners: Vec<_> = [&live_sock, &dead_sock]
            .map(|p| std::os::unix::net::UnixListener::bind(p).unwrap())
            .into();
        std::fs::write(&not_sock, b"").unwrap();
        for p in [&live_lock, &dead_lock] {
            drop(os::open_private_rw(p).unwrap());
        }
        assert_eq!(sweep(dir.path()), 2);
        assert!(live_sock.exists() && live_lock.exists(), "a live owner's");
        assert!(!dead_sock.exists() && !dead_lock.exists(), "a dead job's");
        assert!(not_sock.exists(), "not a holder's socket");
        // The last owner leaving removes the lock file.
        std::fs::remove_file(&live_sock).unwrap();
        let lock = Lock::take(Place::Private(&live_lock), std::time::Duration::ZERO);
        assert!(!held(dir.path(), 1) && lock.unwrap().remove());
        assert!(!live_lock.exists());
    }
}
