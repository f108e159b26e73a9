//! One load's node copies: found among the other ranks or made under the key's lock, filled with them, mapped read-only, and held (handed out) until the last tensor goes.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::CHUNK;
use super::ask::{self, Asking, Found, Remarks, Wanted};
use super::fill::{self, ReadHere};
use super::handoff::{Maker, Offer, Server};
use super::registry;
use crate::cluster::{DEFAULT_TIMEOUT, timeout_from};
use crate::coord::{self, Lock, Owner, Place};
use crate::dest::node::{self as copy, CopyFill};
use crate::dest::pages::HugePages;
use crate::extras::{Pending, PerFile, Role, ShareAsk, ShareFile, job_key};
use crate::memory;
use crate::os;
use crate::policy;
use crate::report::{CopyRemark, NodeCopy};

/// The copy of `files`, found or made, filled and mapped: per file, the copy
/// or why not; `Err` where nothing could be done at all.
pub(super) fn coordinate(
    files: &[ShareFile<'_>],
    ids: &[Vec<u8>],
    ask: &ShareAsk<'_>,
) -> Result<(Vec<PerFile>, Option<Pending>), String> {
    let node = Coordination::new(files, ids, ask)?;

    // 1. A copy a live rank of this user hands out, else a new one (a
    // member waits for its participant's, complete).
    let mut remarks = Remarks::default();
    let (lock, found) = node.find(&mut remarks)?;
    // A holder did not hand its copy over: a copy made now is a second one,
    // this rank's own, which the key's queue (the first copy's) must not fill.
    let private = ask.role == Role::Queue && found.is_none() && remarks.holder_failed();
    let mut results: Vec<PerFile> = files.iter().map(|_| PerFile::Absent).collect();
    let Some(mut copy) = node.take_or_make(found, &mut results)? else {
        // Nothing fits: no copy to hand out; a rank that comes next
        // applies the guard to its own room.
        return Ok((results, None));
    };
    let server = if private {
        remarks.push(CopyRemark::NotHandedOut {
            why: "a copy of this rank's own, read alone, since a holder did not hand the \
                  job's copy over"
                .into(),
        });
        None
    } else {
        node.hand_out(&copy, &mut remarks)?
    };
    drop(lock);

    // 2. The fill, unless the copy came complete (or the load fills it).
    node.fill(&mut copy, server.as_ref(), private, &mut remarks)?;

    // 3. Each file's copy, mapped read-only; the server stops with the last.
    let guard = Arc::new(Hold {
        server,
        lock_path: node.lock_path.clone(),
        dir: node.dir.clone(),
        key: node.key,
    });
    let remarks = remarks.notes();
    let deferred = copy.deferred;
    let pending = node.map_copies(copy, &guard, &remarks, &mut results)?;
    for slot in &mut results {
        if matches!(slot, PerFile::Absent) {
            *slot = PerFile::NotUsed(NodeCopy::LeftOut);
        }
    }
    let pending = deferred.then(|| Pending {
        files: pending,
        complete: Box::new(move || guard.complete()),
    });
    Ok((results, pending))
}

/// One load's coordination of its node copy, as the steps share it.
pub(super) struct Coordination<'a> {
    pub files: &'a [ShareFile<'a>],
    pub ask: &'a ShareAsk<'a>,
    pub chunk_size: u64,
    pub dir: PathBuf,
    pub key: u64,
    me: Owner,
    /// Sockets and lock files of dead jobs removed first.
    swept: usize,
    lock_path: PathBuf,
}

/// The copy this rank found or made: its offer, its memory files (in the
/// offer's order), the pid it came from where another rank made it, and how
/// it is filled.
pub(super) struct Obtained {
    pub offer: Offer,
    pub memfds: Vec<File>,
    received_from: Option<u32>,
    /// Per file of the offer, what this rank read of it.
    read_here: Vec<ReadHere>,
    /// The chunk size of the fill.
    chunk_size: u64,
    /// Whether the load fills the copy (the participant's): it is mapped
    /// first, and the load is handed its writers.
    deferred: bool,
    /// The size of the pages the copy's writers fault in.
    pub huge_pages: HugePages,
}

impl<'a> Coordination<'a> {
    /// The names of the copy of `files` (the files' `ids`, the chunk size and
    /// the job): its directory, key and lock file; dead jobs' names swept.
    fn new(
        files: &'a [ShareFile<'a>],
        ids: &[Vec<u8>],
        ask: &'a ShareAsk<'a>,
    ) -> Result<Self, String> {
        let chunk_size = ask.chunk_size.map_or(CHUNK, |c| c as u64);
        let dir = ask
            .dir
            .map_or_else(coord::shared_dir, std::path::Path::to_path_buf);
        let job = job_key(ask.env.lookup(), os::parent_pid());
        let key = registry::key(ids, chunk_size, &job);
        let uid = os::effective_uid().ok_or("no user id")?;
        let me = Owner::current();
        let swept = registry::sweep(&dir);
        let lock_path = registry::lock_path(&dir, key, uid);
        Ok(Coordination {
            files,
            ask,
            chunk_size,
            dir,
            key,
            me,
            swept,
            lock_path,
        })
    }

    /// Who asks for which copy: this rank, for the copy of these files.
    pub(super) fn asking(&self) -> Asking<'_> {
        Asking {
            dir: &self.dir,
            key: self.key,
            me: self.me,
        }
    }

    /// The key's lock, and the copy a live rank of this user hands out, if
    /// any (a member waits for its participant's, complete).
    fn find(&self, remarks: &mut Remarks) -> Result<(Lock, Option<Found>), String> {
        if self.ask.role == Role::Member {
            // The exchange's timeout, where no live rank offers a copy at
            // all: the participant may still be opening its files.
            let env = |name: &str| self.ask.env.get(name).map(str::to_owned);
            let patience = timeout_from(env).unwrap_or(DEFAULT_TIMEOUT);
            let (lock, found) =
                ask::wait_for_complete(&self.asking(), &self.lock_path, patience, remarks)?;
            Ok((lock, Some(found)))
        } else {
            let lock = registry::take_lock(&self.lock_path)?;
            Ok((lock, ask::find(&self.asking(), Wanted::Any, remarks).0))
        }
    }

    /// The copy `found`, checked to be of these files, else a new one of the
    /// files that fit (the others marked in `results`); `None` where none fits.
    fn take_or_make(
        &self,
        found: Option<Found>,
        results: &mut [PerFile],
    ) -> Result<Option<Obtained>, String> {
        let ((offer, memfds), received_from) = match found {
            Some((copy, pid)) => {
                let valid = copy.0.files.iter().all(|&(i, len)| {
                    usize::try_from(i)
                        .ok()
                        .and_then(|i| self.files.get(i))
                        .is_some_and(|f| f.size() == len)
                });
                if !valid {
                    return Err(format!("pid {pid} offered a copy of other files"));
                }
                (copy, Some(pid))
            }
            None => {
                let made = self.make(results)?;
                if made.0.files.is_empty() {
                    return Ok(None);
                }
                (made, None)
            }
        };
        Ok(Some(Obtained {
            read_here: vec![ReadHere::default(); offer.files.len()],
            chunk_size: self.chunk_size,
            deferred: !offer.complete && self.ask.role == Role::Participant,
            // Its pages of the size the caller or the environment asks for.
            huge_pages: policy::huge_pages(self.ask.huge_pages, self.ask.env).0,
            offer,
            memfds,
            received_from,
        }))
    }

    /// The copy handed out from this rank's socket; `None` where the server
    /// could not start (said in `remarks`).
    fn hand_out(
        &self,
        obtained: &Obtained,
        remarks: &mut Remarks,
    ) -> Result<Option<Server>, String> {
        let dups: Vec<File> = obtained
            .memfds
            .iter()
            .map(File::try_clone)
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let server = Server::start(
            &registry::socket_path(&self.dir, self.key, self.me),
            obtained.offer.clone(),
            dups,
        );
        match server {
            Ok(server) => Ok(Some(server)),
            Err(e) => {
                remarks.push(CopyRemark::NotHandedOut { why: e.to_string() });
                Ok(None)
            }
        }
    }

    /// This rank's fill of the copy with the other ranks, unless the copy
    /// came complete or the load fills it; what it met goes to `remarks`.
    fn fill(
        &self,
        copy: &mut Obtained,
        server: Option<&Server>,
        private: bool,
        remarks: &mut Remarks,
    ) -> Result<(), String> {
        if copy.offer.complete || copy.deferred {
            return Ok(());
        }
        let complete = || {
            if let Some(server) = server {
                server.complete();
            }
        };
        let (read_here, outcome) = fill::fill(self, copy, private, &complete)
            .map_err(|e| format!("filling the copy: {e}"))?;
        copy.read_here = read_here;
        copy.chunk_size = outcome.chunk_size;
        note_fill(remarks, outcome, self.swept);
        Ok(())
    }

    /// Each file's copy, mapped read-only and held by `guard`, with its
    /// report into `results`; where the load fills the copy, its writers.
    fn map_copies(
        &self,
        copy: Obtained,
        guard: &Arc<Hold>,
        remarks: &[CopyRemark],
        results: &mut [PerFile],
    ) -> Result<Vec<(usize, CopyFill)>, String> {
        let Obtained {
            offer,
            memfds,
            received_from,
            deferred,
            ..
        } = &copy;
        let (deferred, made_here) = (*deferred, received_from.is_none());
        let mut pending = Vec::new();
        for ((&(i, len), memfd), read) in offer.files.iter().zip(memfds).zip(&copy.read_here) {
            let Some(file) = usize::try_from(i).ok().and_then(|i| self.files.get(i)) else {
                continue;
            };
            let kept: Box<dyn Send + Sync> = Box::new(Arc::clone(guard));
            // Mapped before a deferred fill: the map is shared, and the load
            // hands out no tensor of it before the fill is over.
            let storage = copy::seal(memfd, file.path(), kept)
                .map_err(|e| format!("mapping the copy: {e}"))?;
            if deferred {
                let writer = CopyFill::new(memfd, copy.huge_pages).map_err(|e| e.to_string())?;
                pending.push((i as usize, writer));
            }
            let chunks = if deferred {
                0
            } else {
                usize::try_from(len.div_ceil(copy.chunk_size.max(1))).unwrap_or(usize::MAX)
            };
            let report = NodeCopy::Shared {
                made_by_pid: offer.maker.pid,
                made_by_rank: offer.maker.rank as usize,
                received_from: *received_from,
                filled_here: read.chunks,
                chunks,
                by_exchange: deferred,
                bytes: len,
                ranks: self.ask.rank.size,
                remarks: remarks.to_vec(),
            };
            if let Some(slot) = results.get_mut(i as usize) {
                *slot = PerFile::Copy {
                    storage: Arc::new(storage),
                    report,
                    bytes_read: read.bytes,
                    made_here,
                };
            }
        }
        Ok(pending)
    }

    /// A new copy of the files that fit the memory guard, in order; those that
    /// do not are marked in `results`.
    fn make(&self, results: &mut [PerFile]) -> Result<(Offer, Vec<File>), String> {
        let available = self.ask.memory_available.or_else(memory::available);
        let maker = Maker {
            pid: self.me.pid,
            rank: u32::try_from(self.ask.rank.rank).unwrap_or(u32::MAX),
        };
        let mut offer = Offer {
            key: self.key,
            complete: false,
            maker,
            files: Vec::new(),
        };
        let mut memfds = Vec::new();
        let mut total = 0u64;
        for (i, (f, slot)) in self.files.iter().zip(results.iter_mut()).enumerate() {
            let len = f.size();
            if let Err((needed, available)) =
                policy::memory_fits(offer.files.len() + 1, total + len, available)
            {
                *slot = PerFile::NotUsed(NodeCopy::DoesNotFit { needed, available });
                continue;
            }
            let memfd = copy::create(len).map_err(|e| format!("making a memfd: {e}"))?;
            total += len;
            offer.files.push((i as u64, len));
            memfds.push(memfd);
        }
        Ok((offer, memfds))
    }
}

/// What the fill met (and the `swept` names before it), in `remarks`.
fn note_fill(remarks: &mut Remarks, outcome: fill::FillOutcome, swept: usize) {
    // A queue not shared is this rank's alone: it read every
    // chunk, and nothing stalled.
    match outcome.unshared {
        Some((path, e)) => {
            let why = match coord::foreign_at(&path, os::NameKind::File) {
                Some(other) => other.to_string(),
                None => format!("unusable: {e}"),
            };
            remarks.push(CopyRemark::QueueNotShared { path, why });
        }
        None if outcome.finished_here > 0 => remarks.push(CopyRemark::FinishedAfterStall {
            chunks: outcome.finished_here,
        }),
        None => {}
    }
    if !outcome.taken_over.is_empty() {
        let mut pids: Vec<u32> = outcome.taken_over.iter().map(|&(pid, _)| pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let quiet = outcome.taken_over.iter().map(|&(_, q)| q).min();
        remarks.push(CopyRemark::TakenOver {
            chunks: outcome.taken_over.len(),
            pids,
            quiet_ms: quiet.map_or(0, |q| u64::try_from(q.as_millis()).unwrap_or(u64::MAX)),
        });
    }
    if swept > 0 {
        remarks.push(CopyRemark::DeadJobsRemoved { files: swept });
    }
}

/// A rank's hold on a copy, dropped with its last tensor of it: it stops
/// handing the copy out; the last rank to do so removes the lock file.
pub(super) struct Hold {
    server: Option<Server>,
    lock_path: PathBuf,
    dir: PathBuf,
    key: u64,
}

impl Hold {
    /// The copy is offered as complete from now on.
    pub(super) fn complete(&self) {
        if let Some(server) = &self.server {
            server.complete();
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let lock = Lock::take(Place::Private(&self.lock_path), Duration::ZERO);
        drop(self.server.take());
        // Ranks dropping together each take the lock to look for a live
        // holder: one that finds it taken waits a moment, so the last sees the
        // others' sockets gone; no longer (a rank stopped under the lock must
        // not hold up dropping tensors; a later sweep removes the file).
        let lock = lock.or_else(|_| Lock::take(Place::Private(&self.lock_path), DROP_WAIT));
        if let Some(lock) = lock.ok().filter(|_| !registry::held(&self.dir, self.key)) {
            lock.remove();
        }
    }
}

/// How long a rank dropping its copy waits for a lock another rank holds
/// (a look at the directory takes well under a millisecond).
const DROP_WAIT: Duration = Duration::from_millis(200);
