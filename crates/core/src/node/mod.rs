//! One copy per node: the local ranks of a job that read the same files buffered fill one copy of each in shared memory through the prefetch chunk queue, and each maps it read-only.
//!
//! # How it goes
//!
//! With more than one local rank (the launchers' variables,
//! `prefetch/launcher.rs`), a file the policy reads buffered, whole, without
//! conversion, whose tensors sit aligned in it, gets a node copy:
//!
//! 1. Under the key's lock (`registry.rs`) a rank asks each live socket of
//!    the key for its copy (`ask.rs`, `handoff.rs`): the socket must be this
//!    user's (by `lstat(2)`, before any connect), the peer this user's
//!    process, the memory files sealed and of the files' lengths. Another
//!    user's names and offers are refused, with the reason in the report.
//!    Where no rank has a copy, this rank makes one (`coordinate.rs`), a
//!    sealed `memfd` per file, within the memory guard (counted once for
//!    the node: the ranks that join add nothing). Then it hands the copy
//!    out itself, from a socket of its own.
//! 2. Unless the copy came complete, the ranks fill it through one chunk
//!    queue (`fill.rs`, `prefetch/fill.rs`): each chunk read once, straight
//!    into its place, with the queue's rules for ranks that die or stop. A
//!    reader beats its rank's heartbeat after every 2 MiB that lands, so a
//!    chunk read slowly but surely (a busy machine, a starved daemon) is
//!    never taken over and read twice; one taken over from a live rank that
//!    showed no progress is said in the report (`CopyRemark::TakenOver`).
//! 3. Each rank maps its copies read-only: its tensors are views of them, as
//!    of a buffered file's buffer. When its last tensor of the copy is
//!    dropped, it stops handing the copy out; the memory goes back to the
//!    system with the last rank's.
//!
//! Files that get no copy are read as before, by each rank (buffered, or
//! mapped where the plan's memory guard says so), with the reason in the
//! report (`eligible.rs`). One rank alone reads as before, with nothing
//! said.
//!
//! # Other users
//!
//! The names live in a directory every local user can write (`/dev/shm`).
//! Another user who learns a copy's key (it is in the lock file's name) can
//! at most turn the copy off for those files, by taking the lock file's
//! name or the fill's queue file's (each rank then reads alone, or fills
//! every chunk itself, saying why); names of theirs at a holder's name are
//! skipped unopened. No rank connects to, follows, removes or counts as a
//! live holder anything that is not this user's, and no wait on another
//! user's process, under a lock other ranks need, outlasts
//! [`handoff::PATIENCE`] (tested by `tests/it/node_copy/attacks.rs`, as
//! root and as an ordinary user); a holder of this user that runs but does
//! not answer is asked three times (`ask.rs`).
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
//! - A rank of this user stopped while it holds a key's lock (the
//!   milliseconds in which it asks for a copy or makes one) holds up the
//!   ranks that start meanwhile for a minute at most, then they read alone;
//!   a rank stopped while it hands the copy out costs the asker
//!   [`handoff::PATIENCE`] (2 s), then it asks another or makes its own.
//!   Only this user's processes can take the lock or answer as a holder.
//!   A holder that runs (not stopped) but has not answered within the
//!   patience is asked again, three times in all (`ask.rs`): on a busy
//!   machine a starved serving thread would otherwise cost the node a
//!   second copy, read alone. A rank that makes a copy of its own all the
//!   same keeps it to itself (handed to nobody) and fills it alone, through a
//!   queue in its memory: the key's queue file is the first copy's, and a
//!   chunk done there is not in the second. Its report names the holder that
//!   did not answer, why, and that the copy is its own.
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

mod ask;
mod coordinate;
mod eligible;
mod fill;
mod handoff;
mod registry;

pub(crate) use eligible::{Facts, eligible};
pub(crate) use fill::{direct_reads, tensor_part};

use std::sync::Arc;

use crate::dest::node::CopyFill;
use crate::file::OpenedFile;
use crate::options::Options;
use crate::policy::{self, Environment, Strategy};
use crate::prefetch::LocalRank;
use crate::report::NodeCopy;
use crate::storage::{BufferLayout, Storage};
use crate::trace;

use coordinate::{Hold, coordinate};
use handoff::MAX_FILES;

/// The chunk size where the caller set none: prefetch's.
const CHUNK: u64 = 8 << 20;
/// Readers per rank (see the `NOTE:` above).
pub(super) const STREAMS: usize = 4;

/// What the node copy did for one file.
pub(crate) enum PerFile {
    /// Not considered (one rank alone, or a mapped file): nothing to say.
    Absent,
    /// Its tensors are views of the node copy; `report` says how it came,
    /// `bytes_read` what this rank read of its tensor data.
    Copy {
        storage: Arc<Storage>,
        report: NodeCopy,
        bytes_read: u64,
        /// Whether this rank made the copy (the one that writes it to a
        /// cache).
        made_here: bool,
    },
    /// Read by this rank alone, for this reason.
    NotUsed(NodeCopy),
}

impl PerFile {
    /// What the report says of it, if anything.
    pub(crate) fn report(&self) -> Option<NodeCopy> {
        match self {
            PerFile::Absent => None,
            PerFile::Copy { report, .. } | PerFile::NotUsed(report) => Some(report.clone()),
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
        self.hold.complete();
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
            (Ok(()), _) => *slot = PerFile::NotUsed(NodeCopy::TooManyFiles { most: MAX_FILES }),
            (Err(why), _) => *slot = PerFile::NotUsed(why),
        }
    }
    if chosen.is_empty() {
        return (out, None);
    }
    let (results, mut pending) = match coordinate(&chosen, &ids, opts, env, &rank, role) {
        Ok(done) => done,
        Err(why) => (
            chosen
                .iter()
                .map(|_| PerFile::NotUsed(NodeCopy::Failed { why: why.clone() }))
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
            if let Some(copy) = per.report() {
                tracing::info!(target: "safeload", file = %f.path().display(), node_copy = %copy, "node copy");
            }
        }
    }
    (out, pending)
}
