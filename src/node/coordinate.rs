//! One load's node copies: found among the other ranks or made under the key's lock, filled with them, mapped read-only, and held (handed out) until the last tensor goes.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use super::ask::{self, Remarks};
use super::handoff::{Offer, Server};
use super::registry::{self, Lock};
use super::{CHUNK, Pending, PerFile, Role, fill};
use crate::dest::node::{self as copy, CopyFill};
use crate::file::OpenedFile;
use crate::memory;
use crate::options::Options;
use crate::os;
use crate::policy::{self, Environment};
use crate::prefetch::{self, LocalRank, Owner};
use crate::report::{NodeCopy, Note};

/// Finds, or makes, the copy of `files`, fills it with the other ranks and
/// maps it: per file, the copy or why not; `Err` where nothing could be
/// done at all.
pub(super) fn coordinate(
    files: &[&OpenedFile],
    ids: &[Vec<u8>],
    opts: &Options,
    env: &Environment,
    (rank, role): (&LocalRank, Role),
) -> Result<(Vec<PerFile>, Option<Pending>), String> {
    let prefetch = opts.prefetch.as_ref();
    let chunk_size = prefetch
        .and_then(|p| p.chunk_size)
        .map_or(CHUNK, |c| c as u64);
    let dir = prefetch
        .and_then(|p| p.queue_dir.clone())
        .unwrap_or_else(prefetch::default_queue_dir);
    let job = prefetch::job_key(env.lookup(), os::parent_pid());
    let key = registry::key(ids, chunk_size, &job);
    let uid = os::effective_uid().ok_or("no user id")?;
    let me = Owner::current();
    let swept = registry::sweep(&dir);
    let lock_path = registry::lock_path(&dir, key, uid);

    // 1. A copy a live rank of this user hands out, else a new one (a
    // member waits for its participant's, complete).
    let mut remarks = Remarks::default();
    let (lock, found) = if role == Role::Member {
        let patience = ask::member_patience(env);
        let (lock, found) =
            ask::wait_for_complete((&dir, key, me), &lock_path, patience, &mut remarks)?;
        (lock, Some(found))
    } else {
        let lock = Lock::take(&lock_path)?;
        (lock, ask::find(&dir, key, me, false, &mut remarks).0)
    };
    let mut results: Vec<PerFile> = files.iter().map(|_| PerFile::Absent).collect();
    let made_here = found.is_none();
    let (offer, memfds, received_from) = match found {
        Some(((offer, memfds), pid)) => {
            let valid = offer.files.iter().all(|&(i, len)| {
                usize::try_from(i)
                    .ok()
                    .and_then(|i| files.get(i))
                    .is_some_and(|f| f.size() == len)
            });
            if !valid {
                return Err(format!("pid {pid} offered a copy of other files"));
            }
            (offer, memfds, Some(pid))
        }
        None => {
            let maker = (me.pid, u32::try_from(rank.rank).unwrap_or(u32::MAX));
            let (offer, memfds) = make(files, (key, maker), opts, &mut results)?;
            if offer.files.is_empty() {
                // Nothing fits: no copy to hand out; a rank that comes next
                // applies the guard to its own room.
                return Ok((results, None));
            }
            (offer, memfds, None)
        }
    };
    let dups: Vec<File> = memfds
        .iter()
        .map(File::try_clone)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let server = Server::start(&registry::socket_path(&dir, key, me), offer.clone(), dups);
    let server = match server {
        Ok(server) => Some(server),
        Err(e) => {
            remarks.push(Note::NotHandedOut { why: e.to_string() });
            None
        }
    };
    drop(lock);

    // 2. The fill, unless the copy came complete (or the load fills it),
    // its pages of the size the caller or the environment asks for.
    let huge_pages = policy::huge_pages(opts.huge_pages, env).0;
    let mut filled: Vec<(usize, u64)> = vec![(0, 0); offer.files.len()];
    let mut fill_chunk = chunk_size;
    let deferred = !offer.complete && role == Role::Participant;
    if !offer.complete && !deferred {
        let complete = || {
            if let Some(server) = &server {
                server.complete();
            }
        };
        let outcome = fill::fill(
            files,
            (&offer, &memfds, &complete),
            key,
            (&dir, chunk_size),
            (opts, huge_pages),
            rank,
        );
        match outcome {
            Ok((counts, outcome)) => {
                filled = counts;
                fill_chunk = outcome.chunk_size;
                // A queue not shared is this rank's alone: it read every
                // chunk, and nothing stalled.
                match outcome.unshared {
                    Some((path, e)) => {
                        let why = match registry::foreign_at(&path, os::NameKind::File) {
                            Some(other) => other.to_string(),
                            None => format!("unusable: {e}"),
                        };
                        remarks.push(Note::QueueNotShared {
                            path,
                            why,
                            node_copy: true,
                        });
                    }
                    None if outcome.finished_here > 0 => remarks.push(Note::FinishedAfterStall {
                        chunks: outcome.finished_here,
                    }),
                    None => {}
                }
                if outcome.swept + swept > 0 {
                    remarks.push(Note::DeadJobsRemoved {
                        files: outcome.swept + swept,
                    });
                }
            }
            Err(e) => return Err(format!("filling the copy: {e}")),
        }
    }

    // 3. Each file's copy, mapped read-only; the server stops with the last.
    let guard = Arc::new(Hold {
        server,
        lock_path,
        dir: dir.clone(),
        key,
    });
    let remarks = remarks.notes();
    let mut pending = Vec::new();
    for ((&(i, len), memfd), (filled, bytes_read)) in offer.files.iter().zip(&memfds).zip(filled) {
        let Some(file) = usize::try_from(i).ok().and_then(|i| files.get(i)) else {
            continue;
        };
        let kept: Box<dyn Send + Sync> = Box::new(Arc::clone(&guard));
        // Mapped before a deferred fill: the map is shared, and the load
        // hands out no tensor of it before the fill is over.
        let storage =
            copy::seal(memfd, file.path(), kept).map_err(|e| format!("mapping the copy: {e}"))?;
        if deferred {
            let writer = CopyFill::new(memfd, huge_pages).map_err(|e| e.to_string())?;
            pending.push((i as usize, writer));
        }
        let chunks = if deferred {
            0
        } else {
            usize::try_from(len.div_ceil(fill_chunk.max(1))).unwrap_or(usize::MAX)
        };
        let report = NodeCopy::Shared {
            made_by_pid: offer.maker.0,
            made_by_rank: offer.maker.1 as usize,
            received_from,
            filled_here: filled,
            chunks,
            by_exchange: deferred,
            bytes: len,
            ranks: rank.size,
            remarks: remarks.clone(),
        };
        if let Some(slot) = results.get_mut(i as usize) {
            *slot = PerFile::Copy {
                storage: Arc::new(storage),
                report,
                bytes_read,
                made_here,
            };
        }
    }
    for slot in &mut results {
        if matches!(slot, PerFile::Absent) {
            *slot = PerFile::NotUsed(NodeCopy::LeftOut);
        }
    }
    let pending = deferred.then(|| Pending {
        files: pending,
        hold: guard,
    });
    Ok((results, pending))
}

/// A rank's hold on a copy, dropped with its last tensor of it: it stops
/// handing the copy out, and the last live rank to do so removes the lock
/// file, so that a finished job leaves nothing in the directory.
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
        let lock = Lock::try_take(&self.lock_path);
        drop(self.server.take());
        // Ranks that drop their copies at the same moment each hold the
        // lock while they look for a live holder; one that finds the lock
        // taken tries again for a moment, so that the last of them sees the
        // others' sockets gone and removes the lock file (two ranks of a
        // test dropping together had each left it to the other). Waited for
        // no longer: dropping tensors must not wait on a rank stopped under
        // the lock (the lock file is then left for a later sweep).
        let lock = lock.or_else(|| {
            (0..DROP_TRIES).find_map(|_| {
                std::thread::sleep(DROP_BACK_OFF);
                Lock::try_take(&self.lock_path)
            })
        });
        if let Some(lock) = lock {
            lock.release_last(&self.dir, self.key);
        }
    }
}

/// How often, and how far apart, a rank dropping its copy tries again for
/// a lock another rank holds (20 x 10 ms: a look at the directory takes
/// well under a millisecond).
const DROP_TRIES: usize = 20;
/// See [`DROP_TRIES`].
const DROP_BACK_OFF: std::time::Duration = std::time::Duration::from_millis(10);

/// A new copy of the files that fit the memory guard, in order; those that
/// do not are marked in `results`.
fn make(
    files: &[&OpenedFile],
    (key, maker): (u64, (u32, u32)),
    opts: &Options,
    results: &mut [PerFile],
) -> Result<(Offer, Vec<File>), String> {
    let available = opts.memory_available.or_else(memory::available);
    let mut offer = Offer {
        key,
        complete: false,
        maker,
        files: Vec::new(),
    };
    let mut memfds = Vec::new();
    let mut total = 0u64;
    for (i, (f, slot)) in files.iter().zip(results.iter_mut()).enumerate() {
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
