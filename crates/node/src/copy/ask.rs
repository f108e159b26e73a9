//! Asking the other ranks for a copy: each live holder's socket of this user, in turn, every wait bounded; another user's names skipped unopened and said once.
//!
//! It runs under a lock other ranks wait on, so every wait is bounded: only
//! this user's sockets are connected to, each connection given
//! [`PATIENCE`](super::handoff::PATIENCE), a running holder that does not
//! answer asked [`TRIES`] times.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use super::handoff::{self, Offer, Refused};
use super::registry::{self, Entry};
use crate::coord::{Foreign, Lock, Owner};
use crate::os;
use crate::report::CopyRemark;

/// A copy another rank handed out: its offer and memory files, and its pid.
pub(super) type Found = ((Offer, Vec<File>), u32);

/// What a rank met while it looked for a copy, each thing once, at most
/// [`NAMED`] of another user's names.
#[derive(Debug, Default)]
pub(super) struct Remarks {
    said: Vec<CopyRemark>,
    ignored: Vec<Foreign>,
    /// Another user's names beyond the first [`NAMED`].
    more: usize,
}

/// How many of another user's names a note names.
const NAMED: usize = 3;

impl Remarks {
    pub(super) fn push(&mut self, remark: CopyRemark) {
        if !self.said.contains(&remark) {
            self.said.push(remark);
        }
    }

    /// Another user's name, never opened.
    fn ignored(&mut self, name: &Foreign) {
        if self.ignored.contains(name) {
            return;
        }
        if self.ignored.len() < NAMED {
            self.ignored.push(name.clone());
        } else {
            self.more += 1;
        }
    }

    pub(super) fn extend(&mut self, other: Remarks) {
        for remark in other.said {
            self.push(remark);
        }
        for name in &other.ignored {
            self.ignored(name);
        }
        self.more += other.more;
    }

    /// Whether a holder of this user did not hand its copy over.
    pub(super) fn holder_failed(&self) -> bool {
        self.said
            .iter()
            .any(|r| matches!(r, CopyRemark::HolderFailed { .. }))
    }

    /// Every remark, another user's names after the rest.
    pub(super) fn notes(&self) -> Vec<CopyRemark> {
        let me = os::effective_uid();
        let mut all = self.said.clone();
        all.extend(self.ignored.iter().map(|f| CopyRemark::ForeignName {
            name: f.name.clone(),
            kind: f.kind.to_string(),
            uid: f.uid,
            this_user: f.uid.is_some() && f.uid == me,
        }));
        if self.more > 0 {
            all.push(CopyRemark::MoreForeignNames { count: self.more });
        }
        all
    }
}

/// Who asks for which copy: the copy's directory and key, and this rank's
/// owner name (never asked itself).
#[derive(Debug, Clone, Copy)]
pub(super) struct Asking<'a> {
    pub dir: &'a Path,
    pub key: u64,
    pub me: Owner,
}

/// Which copies [`find`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wanted {
    /// Only a complete one.
    Complete,
    /// One still being filled too.
    Any,
}

/// A copy of `asking.key` another live rank of this user hands out (as
/// `wanted`), and its pid; and whether one offers a copy still being filled.
pub(super) fn find(
    asking: &Asking,
    wanted: Wanted,
    remarks: &mut Remarks,
) -> (Option<Found>, bool) {
    let Asking { dir, key, me } = *asking;
    let mut filling = false;
    let names = registry::entries(dir);
    // Another user's names of this key, said whether or not a copy is found
    // before them: they cost nothing, and are never opened.
    for name in &names {
        if let (Entry::Socket { key: k, .. }, Some(foreign)) = (name.entry, &name.foreign) {
            if k == key {
                remarks.ignored(foreign);
            }
        }
    }
    for name in names {
        let Entry::Socket { key: k, owner } = name.entry else {
            continue;
        };
        // A dead holder's socket is skipped, left to the sweep.
        if k != key || owner == me || name.foreign.is_some() || !owner.alive() {
            continue;
        }
        match take_from_running(&name.path, owner, key) {
            Ok(got) if wanted == Wanted::Complete && !got.0.complete => filling = true,
            Ok(got) => return (Some((got, owner.pid)), true),
            Err(Refused::OtherUser { uid, pid }) => {
                remarks.push(CopyRemark::OfferRefused { pid, uid })
            }
            Err(Refused::Failed(why)) => remarks.push(CopyRemark::HolderFailed {
                pid: owner.pid,
                why,
            }),
        }
    }
    (None, filling)
}

/// How many times a running holder is asked before this rank gives up on it.
///
/// NOTE: a serving thread answers in well under 1 ms; one silent for the 2 s
/// patience is starved, and a second copy costs the node the whole read
/// again. Three tries bound the wait at 6 s; a stopped holder gets one.
const TRIES: usize = 3;

/// The offer of the holder `owner` at `path`, asked again while it runs
/// (not stopped) and fails to answer, [`TRIES`] times at most.
fn take_from_running(path: &Path, owner: Owner, key: u64) -> Result<(Offer, Vec<File>), Refused> {
    let mut tries = 1;
    loop {
        match handoff::take(path, owner.pid, key) {
            Err(Refused::Failed(_)) if tries < TRIES && owner.runs() && path.exists() => {
                tries += 1;
            }
            Err(Refused::Failed(why)) if tries > 1 => {
                return Err(Refused::Failed(format!("{why} (asked {tries} times)")));
            }
            other => return other,
        }
    }
}

/// How often a member asks for the complete copy.
const MEMBER_POLL: Duration = Duration::from_millis(20);

/// A member's wait: the complete copy, under the key's lock; `Err` once no
/// live rank has offered a copy for `patience`.
pub(super) fn wait_for_complete(
    asking: &Asking,
    lock_path: &Path,
    patience: Duration,
    remarks: &mut Remarks,
) -> Result<(Lock, Found), String> {
    let mut last_seen = Instant::now();
    loop {
        let lock = registry::take_lock(lock_path)?;
        // What the last round of asking said, not every round's.
        let mut said = Remarks::default();
        let (found, filling) = find(asking, Wanted::Complete, &mut said);
        if let Some(found) = found {
            remarks.extend(said);
            return Ok((lock, found));
        }
        drop(lock);
        if filling {
            last_seen = Instant::now();
        } else if last_seen.elapsed() > patience {
            let why = said
                .said
                .last()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            return Err(format!(
                "the node's participant offered no copy within {patience:?}{why}"
            ));
        }
        std::thread::sleep(MEMBER_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The remarks in words, as a report shows them after a copy's line.
    fn said(remarks: &Remarks) -> String {
        let words: Vec<String> = remarks.notes().iter().map(ToString::to_string).collect();
        words.join("; ")
    }

    #[test]
    fn remarks_are_said_once_and_foreign_names_counted_past_a_few() {
        let mut remarks = Remarks::default();
        assert_eq!(remarks.notes(), []);
        let uid = u32::MAX - 7;
        let foreign = |i: usize| Foreign {
            name: format!("n{i}.sock"),
            kind: crate::os::NameKind::Fifo,
            uid: Some(uid),
        };
        remarks.ignored(&foreign(0));
        remarks.ignored(&foreign(0));
        let refused = CopyRemark::HolderFailed {
            pid: 7,
            why: "refused".into(),
        };
        remarks.push(refused.clone());
        remarks.push(refused);
        assert_eq!(
            said(&remarks),
            format!(
                "pid 7, which holds a copy, did not hand it over: refused; ignored n0.sock \
                 (a FIFO of uid {uid}, not this user's)"
            )
        );
        for i in 0..1000 {
            remarks.ignored(&foreign(i));
        }
        let notes = remarks.notes();
        let named = notes
            .iter()
            .filter(|n| matches!(n, CopyRemark::ForeignName { .. }))
            .count();
        assert_eq!(named, NAMED, "{notes:?}");
        assert_eq!(
            notes.last(),
            Some(&CopyRemark::MoreForeignNames { count: 997 })
        );
    }

    // Sockets, lstat and liveness need the Linux OS layer.
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn names_that_are_not_this_users_sockets_are_never_connected_to_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let me = Owner::current();
        let other = Owner {
            pid: std::process::id(),
            tag: me.tag ^ 1,
        };
        let dead = Owner {
            pid: u32::MAX >> 2,
            tag: 1,
        };
        // A live owner's name holding a FIFO, a dead owner's holding a file,
        // and a symlink to a listener that would never answer.
        let fifo = registry::socket_path(dir.path(), 5, Owner { pid: 1, tag: 0 });
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let file = registry::socket_path(dir.path(), 5, dead);
        std::fs::write(&file, b"").unwrap();
        let hidden = dir.path().join("hidden.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&hidden).unwrap();
        let link = registry::socket_path(dir.path(), 5, other);
        std::os::unix::fs::symlink(&hidden, &link).unwrap();
        let mut remarks = Remarks::default();
        let started = Instant::now();
        let asking = Asking {
            dir: dir.path(),
            key: 5,
            me,
        };
        let (found, filling) = find(&asking, Wanted::Any, &mut remarks);
        assert!(found.is_none() && !filling);
        assert!(started.elapsed() < Duration::from_millis(500));
        let said = said(&remarks);
        assert!(said.contains("a FIFO, not what its name says"), "{said}");
        assert!(said.contains("a file, not what its name says"), "{said}");
        assert!(said.contains("a symlink, not what its name says"), "{said}");
        for path in [&fifo, &file, &link] {
            assert!(std::fs::symlink_metadata(path).is_ok(), "{path:?} kept");
        }
    }
}
