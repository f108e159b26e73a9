//! One copy per node: the local ranks of a job that read the same files buffered fill one copy of each in shared memory through the prefetch chunk queue, and each maps it read-only.
//!
//! # How it goes
//!
//! With more than one local rank (the launchers' variables,
//! `prefetch/launcher.rs`), a file the policy reads buffered, whole, without
//! conversion, whose tensors sit aligned in it, gets a node copy:
//!
//! 1. Under the key's lock (`registry.rs`) a rank asks each live socket of
//!    the key for its copy (`handoff.rs`): the peer must be this user's
//!    process, the memory files sealed and of the files' lengths. Another
//!    user's offer is refused, with the reason in the report. Where no rank
//!    has a copy, this rank makes one, a sealed `memfd` per file, within the
//!    memory guard (counted once for the node: the ranks that join add
//!    nothing). Then it hands the copy out itself, from a socket of its own.
//! 2. Unless the copy came complete, the ranks fill it through one chunk
//!    queue (`fill.rs`, `prefetch/fill.rs`): each chunk read once, straight
//!    into its place, with the queue's rules for ranks that die or stop.
//! 3. Each rank maps its copies read-only: its tensors are views of them, as
//!    of a buffered file's buffer. When its last tensor of the copy is
//!    dropped, it stops handing the copy out; the memory goes back to the
//!    system with the last rank's.
//!
//! Files that get no copy are read as before, by each rank (buffered, or
//! mapped where the plan's memory guard says so), with the reason in the
//! report. One rank alone reads as before, with nothing said.
//!
//! # Under a load split between nodes
//!
//! Where the nodes of a job read each byte once between them
//! (`execute/exchange.rs`), the copy is the node's share of that split: the
//! node's participant ([`Role::Participant`]) makes the copy and fills it
//! itself, its node's pieces from storage and the other nodes' from the
//! exchange, then offers it as complete; the node's other ranks
//! ([`Role::Member`]) never make or fill a copy, they wait for the complete
//! one (for as long as a live rank offers a copy being filled, and at most
//! the exchange's timeout for one to be offered at all), and read alone,
//! saying why, if none comes.
//!
//! # What it leaves to later
//!
//! - A rank stopped while it holds a key's lock (the milliseconds in which it
//!   asks for a copy or makes one) holds up the ranks that start meanwhile
//!   until it resumes; a rank stopped while it hands the copy out costs the
//!   asker [`handoff::PATIENCE`] (2 s), then it asks another or makes its own.
//! - A rank that received an unfinished copy in the instant before the last
//!   filling rank left the queue makes the queue anew; it asks the other
//!   ranks then, and finds the copy complete (tested by
//!   `tests/it/remote.rs`, which met the race under CI's load: 2.09x the
//!   bytes before the question was asked).
//!
//! NOTE: each rank fills with 4 readers (prefetch's default streams), not the
//! read engine's adaptive count: the queue's readers claim chunks one by
//! one, and the engine's controller runs a list of reads fixed in advance.
//! With 3 ranks that is 12 reads in flight on the node, what the engine
//! settles at on the FUSE test mount (`policy::default_io_concurrency`).

mod fill;
mod handoff;
mod registry;

pub(crate) use fill::direct_reads;

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::dest::node::{self as copy, CopyFill};
use crate::file::OpenedFile;
use crate::memory;
use crate::options::Options;
use crate::policy::{self, Environment, Strategy};
use crate::prefetch::{self, LocalRank, Owner};
use crate::report::human_bytes;
use crate::storage::{BufferLayout, Storage};
use crate::{os, trace};

use handoff::{MAX_FILES, Offer, Refused, Server};
use registry::{Entry, Lock};

/// The chunk size where the caller set none: prefetch's.
const CHUNK: u64 = 8 << 20;
/// Readers per rank (see the `NOTE:` above).
pub(super) const STREAMS: usize = 4;

/// What the node copy did for one file.
pub(crate) enum PerFile {
    /// Not considered (one rank alone, or a mapped file): nothing to say.
    Absent,
    /// Its tensors are views of the node copy; the note says how it came,
    /// `bytes_read` what this rank read of it, `made_here` whether this
    /// rank made it (the one that writes it to a cache).
    Copy {
        storage: Arc<Storage>,
        note: String,
        bytes_read: u64,
        made_here: bool,
    },
    /// Read by this rank alone, for this reason.
    NotUsed(NotUsed),
}

impl PerFile {
    /// The line the report shows, if any.
    pub(crate) fn note(&self) -> Option<String> {
        match self {
            PerFile::Absent => None,
            PerFile::Copy { note, .. } => Some(note.clone()),
            PerFile::NotUsed(why) => Some(format!("not used: {why}")),
        }
    }
}

/// How a rank takes part in its node's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// The ranks fill the copy together through the chunk queue.
    Queue,
    /// The node's participant in a load split between nodes: it makes the
    /// copy, and the load fills it ([`Pending`]) with the other nodes.
    Participant,
    /// Another rank of such a node: it waits for the participant's copy,
    /// complete.
    Member,
}

/// A copy this rank made or took, mapped, still to be filled by the load
/// (the participant's, [`Role::Participant`]): per file, its index among the
/// load's files and the writer of its copy. Offered as complete once
/// [`complete`](Self::complete) is called.
pub(crate) struct Pending {
    pub files: Vec<(usize, CopyFill)>,
    hold: Arc<Hold>,
}

impl Pending {
    /// Every byte of every copy is in place: offered as complete from now on.
    pub(crate) fn complete(&self) {
        if let Some(server) = &self.hold.server {
            server.complete();
        }
    }
}

/// What the eligibility rule looks at, for one file read buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Every tensor of the file is loaded (a filter may keep them all).
    pub all_tensors: bool,
    /// The load converts dtypes.
    pub converting: bool,
    /// Every tensor sits at an offset aligned for its dtype.
    pub aligned: bool,
    /// The file's version can be told (device, inode, size, mtime).
    pub identity: bool,
}

/// Why a file read buffered gets no node copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotUsed {
    /// A filter: the copy is of whole files, the ranks' filters may differ.
    Filtered,
    /// A converting load reads its converted tensors itself.
    Converting,
    /// A tensor is misaligned in the file: a copy of the file could not
    /// hand out typed views of it.
    Unaligned,
    /// No device and inode to tell its version by.
    NoIdentity,
    /// More files than one handoff carries.
    TooManyFiles,
    /// The copy does not fit the memory guard (a `memfd` is charged to the
    /// cgroup like any memory).
    DoesNotFit { needed: u64, available: u64 },
    /// The rank that made the copy left this file out (its memory guard).
    LeftOut,
    /// Making, finding or filling the copy failed.
    Failed(String),
}

impl fmt::Display for NotUsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotUsed::Filtered => {
                f.write_str("a filter selects tensors; the copy is of whole files")
            }
            NotUsed::Converting => f.write_str("the load converts dtypes"),
            NotUsed::Unaligned => f.write_str("a tensor is not aligned for its dtype in the file"),
            NotUsed::NoIdentity => f.write_str("the file's version cannot be told"),
            NotUsed::TooManyFiles => write!(f, "more than {MAX_FILES} files"),
            NotUsed::DoesNotFit { needed, available } => write!(
                f,
                "the copy needs {} with its margin, {} available (MemAvailable and the cgroup's room): each rank loads it alone",
                human_bytes(*needed),
                human_bytes(*available)
            ),
            NotUsed::LeftOut => {
                f.write_str("the rank that made the copy left it out (its memory guard)")
            }
            NotUsed::Failed(why) => write!(f, "{why}: each rank loads it alone"),
        }
    }
}

/// The rule: whether a file read buffered by several ranks gets a copy.
pub(crate) fn eligible(facts: Facts) -> Result<(), NotUsed> {
    if !facts.all_tensors {
        Err(NotUsed::Filtered)
    } else if facts.converting {
        Err(NotUsed::Converting)
    } else if !facts.aligned {
        Err(NotUsed::Unaligned)
    } else if !facts.identity {
        Err(NotUsed::NoIdentity)
    } else {
        Ok(())
    }
}

/// One load's part in node copies: per file of `files`, what it did; and,
/// for the participant of a load split between nodes, the copies the load
/// is to fill.
pub(crate) fn share(
    files: &[&OpenedFile],
    opts: &Options,
    env: &Environment,
    keep: Option<&(dyn Fn(&str) -> bool + Sync)>,
    role: Role,
) -> (Vec<PerFile>, Option<Pending>) {
    let mut out: Vec<PerFile> = files.iter().map(|_| PerFile::Absent).collect();
    let rank = LocalRank::from_setting(opts.local_rank, env);
    // The benchmark's "today" arm turns it off (`policy::NODE_COPY_ENV`):
    // then every rank reads alone, with nothing said, as one rank alone.
    if rank.size < 2 || !policy::node_copy(env) {
        return (out, None);
    }
    // The files that get a copy, with their identities; the others say why.
    let mut chosen: Vec<&OpenedFile> = Vec::new();
    let mut ids: Vec<Vec<u8>> = Vec::new();
    for (&f, slot) in files.iter().zip(out.iter_mut()) {
        if f.map().is_some() || f.decision().strategy != Strategy::Buffered {
            continue;
        }
        let id = registry::identity(f.source());
        let facts = Facts {
            all_tensors: keep.is_none_or(|keep| f.header().tensors.iter().all(|t| keep(&t.name))),
            converting: opts.dtype.is_some(),
            aligned: BufferLayout::for_file(f.header(), &vec![true; f.header().tensors.len()])
                .image,
            identity: id.is_some(),
        };
        match (eligible(facts), id) {
            (Ok(()), Some(id)) if chosen.len() < MAX_FILES => {
                chosen.push(f);
                ids.push(id);
            }
            (Ok(()), _) => *slot = PerFile::NotUsed(NotUsed::TooManyFiles),
            (Err(why), _) => *slot = PerFile::NotUsed(why),
        }
    }
    if chosen.is_empty() {
        return (out, None);
    }
    let (results, mut pending) = match coordinate(&chosen, &ids, opts, env, (&rank, role)) {
        Ok(done) => done,
        Err(why) => (
            chosen
                .iter()
                .map(|_| PerFile::NotUsed(NotUsed::Failed(why.clone())))
                .collect(),
            None,
        ),
    };
    // The pending copies by the load's index, not the chosen files'.
    if let Some(pending) = &mut pending {
        for (index, _) in &mut pending.files {
            let chosen_file = chosen.get(*index).copied();
            *index = files
                .iter()
                .position(|f| chosen_file.is_some_and(|c| std::ptr::eq(c, *f)))
                .unwrap_or(usize::MAX);
        }
    }
    // Back in the load's order: the chosen files are the Absent ones left
    // among the buffered, in order.
    let mut results = results.into_iter();
    for (&f, slot) in files.iter().zip(out.iter_mut()) {
        if chosen.iter().any(|c| std::ptr::eq(*c, f)) {
            if let Some(result) = results.next() {
                *slot = result;
            }
        }
    }
    trace::traced! {
        for (f, per) in files.iter().zip(&out) {
            if let Some(note) = per.note() {
                tracing::info!(target: "safeload", file = %f.path().display(), node_copy = %note, "node copy");
            }
        }
    }
    (out, pending)
}

/// A copy another rank handed out: its offer and memory files, and its pid.
type Found = ((Offer, Vec<File>), u32);

/// A copy of `key` a live rank other than `me` hands out (complete, where
/// `complete_only`), and its pid; whether a live rank offers one still
/// being filled. Refusals go to `remarks`.
fn find(
    dir: &Path,
    key: u64,
    me: Owner,
    complete_only: bool,
    remarks: &mut Vec<String>,
) -> (Option<Found>, bool) {
    let mut filling = false;
    for (path, entry) in registry::entries(dir) {
        let Entry::Socket { key: k, owner } = entry else {
            continue;
        };
        if k != key || owner == me {
            continue;
        }
        if !owner.alive() {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        match handoff::take(&path, owner.pid, key) {
            Ok(got) if complete_only && !got.0.complete => filling = true,
            Ok(got) => return (Some((got, owner.pid)), true),
            Err(Refused::OtherUser { uid, pid }) => remarks.push(format!(
                "refused the copy offered by pid {pid}: it runs as uid {uid}, not this user's"
            )),
            Err(Refused::Failed(why)) => remarks.push(format!("pid {}: {why}", owner.pid)),
        }
    }
    (None, filling)
}

/// How long a node's other ranks wait for a copy from their participant
/// when no live rank offers one at all (it may still be opening its files).
fn member_patience(env: &Environment) -> Duration {
    crate::cluster::timeout_from(|name| env.get(name).map(str::to_owned))
        .unwrap_or(crate::cluster::DEFAULT_TIMEOUT)
}

/// A member's wait (see [`Role::Member`]): the complete copy, under the
/// key's lock, once a live rank offers it; `Err` with the reason once no
/// live rank has offered a copy for [`member_patience`].
fn wait_for_complete(
    (dir, key, me): (&Path, u64, Owner),
    lock_path: &Path,
    patience: Duration,
    remarks: &mut Vec<String>,
) -> Result<(Lock, Found), String> {
    let mut last_seen = Instant::now();
    loop {
        let lock = Lock::take(lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
        // What the last round of asking said, not every round's.
        let mut said = Vec::new();
        let (found, filling) = find(dir, key, me, true, &mut said);
        if let Some(found) = found {
            remarks.extend(said);
            return Ok((lock, found));
        }
        drop(lock);
        if filling {
            last_seen = Instant::now();
        } else if last_seen.elapsed() > patience {
            let why = said.last().map(|s| format!(" ({s})")).unwrap_or_default();
            return Err(format!(
                "the node's participant offered no copy within {patience:?}{why}"
            ));
        }
        std::thread::sleep(MEMBER_POLL);
    }
}

/// How often a member asks for the complete copy.
const MEMBER_POLL: Duration = Duration::from_millis(20);

/// Finds, or makes, the copy of `files`, fills it with the other ranks and
/// maps it: per file, the copy or why not; `Err` where nothing could be
/// done at all.
fn coordinate(
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
    let mut remarks = Vec::new();
    let (lock, found) = if role == Role::Member {
        let patience = member_patience(env);
        let (lock, found) = wait_for_complete((&dir, key, me), &lock_path, patience, &mut remarks)?;
        (lock, Some(found))
    } else {
        let lock = Lock::take(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
        (lock, find(&dir, key, me, false, &mut remarks).0)
    };
    let mut results: Vec<PerFile> = files.iter().map(|_| PerFile::Absent).collect();
    let made_here = found.is_none();
    let (offer, memfds, origin) = match found {
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
            (offer, memfds, format!("received from pid {pid}"))
        }
        None => {
            let (offer, memfds) = make(files, key, opts, &mut results)?;
            if offer.files.is_empty() {
                // Nothing fits: no copy to hand out; a rank that comes next
                // applies the guard to its own room.
                return Ok((results, None));
            }
            (offer, memfds, "made here".to_string())
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
            remarks.push(format!("not handed out from here: {e}"));
            None
        }
    };
    drop(lock);

    // 2. The fill, unless the copy came complete (or the load fills it).
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
            opts,
            rank,
        );
        match outcome {
            Ok((counts, outcome)) => {
                filled = counts;
                fill_chunk = outcome.chunk_size;
                if let Some(why) = outcome.unshared {
                    remarks.push(format!("chunks not shared ({why})"));
                }
                if outcome.finished_here > 0 {
                    remarks.push(format!(
                        "{} chunk(s) finished here after a stall",
                        outcome.finished_here
                    ));
                }
                if outcome.swept + swept > 0 {
                    remarks.push(format!(
                        "{} file(s) of dead jobs removed",
                        outcome.swept + swept
                    ));
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
    let extra = if remarks.is_empty() {
        String::new()
    } else {
        format!("; {}", remarks.join("; "))
    };
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
        let how = if deferred {
            pending.push((i as usize, CopyFill::new(memfd).map_err(|e| e.to_string())?));
            "filled here by the node's part in the split between nodes".to_owned()
        } else {
            format!(
                "filled here {filled} of {} chunks",
                len.div_ceil(fill_chunk.max(1))
            )
        };
        let note = format!(
            "{how}, mapped from a memfd of {} {origin} (shared by the job's {} local ranks){extra}",
            human_bytes(len),
            rank.size,
        );
        if let Some(slot) = results.get_mut(i as usize) {
            *slot = PerFile::Copy {
                storage: Arc::new(storage),
                note,
                bytes_read,
                made_here,
            };
        }
    }
    for slot in &mut results {
        if matches!(slot, PerFile::Absent) {
            *slot = PerFile::NotUsed(NotUsed::LeftOut);
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
struct Hold {
    server: Option<Server>,
    lock_path: PathBuf,
    dir: PathBuf,
    key: u64,
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Not waited for: dropping tensors must not wait on a rank stopped
        // under the lock (the lock file is then left for a later sweep).
        let lock = Lock::try_take(&self.lock_path);
        drop(self.server.take());
        if let Some(lock) = lock {
            lock.release_last(&self.dir, self.key);
        }
    }
}

/// A new copy of the files that fit the memory guard, in order; those that
/// do not are marked in `results`.
fn make(
    files: &[&OpenedFile],
    key: u64,
    opts: &Options,
    results: &mut [PerFile],
) -> Result<(Offer, Vec<File>), String> {
    let available = opts.memory_available.or_else(memory::available);
    let mut offer = Offer {
        key,
        complete: false,
        files: Vec::new(),
    };
    let mut memfds = Vec::new();
    let mut total = 0u64;
    for (i, (f, slot)) in files.iter().zip(results.iter_mut()).enumerate() {
        let len = f.size();
        if let Err((needed, available)) =
            policy::memory_fits(offer.files.len() + 1, total + len, available)
        {
            *slot = PerFile::NotUsed(NotUsed::DoesNotFit { needed, available });
            continue;
        }
        let memfd = copy::create(len).map_err(|e| format!("making a memfd: {e}"))?;
        total += len;
        offer.files.push((i as u64, len));
        memfds.push(memfd);
    }
    Ok((offer, memfds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        let ok = Facts {
            all_tensors: true,
            converting: false,
            aligned: true,
            identity: true,
        };
        assert_eq!(eligible(ok), Ok(()));
        let table = [
            (
                Facts {
                    all_tensors: false,
                    ..ok
                },
                NotUsed::Filtered,
            ),
            (
                Facts {
                    converting: true,
                    ..ok
                },
                NotUsed::Converting,
            ),
            (
                Facts {
                    aligned: false,
                    ..ok
                },
                NotUsed::Unaligned,
            ),
            (
                Facts {
                    identity: false,
                    ..ok
                },
                NotUsed::NoIdentity,
            ),
            (
                Facts {
                    all_tensors: false,
                    converting: true,
                    ..ok
                },
                NotUsed::Filtered,
            ),
        ];
        for (facts, why) in table {
            assert_eq!(eligible(facts), Err(why), "{facts:?}");
        }
    }

    #[test]
    fn reasons_in_words() {
        let why = NotUsed::DoesNotFit {
            needed: 3 << 30,
            available: 1 << 30,
        };
        let text = PerFile::NotUsed(why).note().unwrap();
        assert!(
            text.starts_with("not used: the copy needs 3.00 GiB"),
            "{text}"
        );
        assert!(text.contains("each rank loads it alone"), "{text}");
        assert_eq!(PerFile::Absent.note(), None);
    }
}
