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
//! `handoff::PATIENCE` (tested by `tests/it/node_copy/attacks.rs`, as
//! root and as an ordinary user); a holder of this user that runs but does
//! not answer is asked three times (`ask.rs`).
//!
//! # Under a load split between nodes
//!
//! Where the nodes of a job read each byte once between them
//! (`execute/exchange.rs`), the copy is the node's share of that split: the
//! node's participant (`Role::Participant`) makes the copy and fills it
//! itself, its node's pieces from storage and the other nodes' from the
//! exchange, then offers it as complete; the node's other ranks
//! (`Role::Member`) never make or fill a copy, they wait for the complete
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
//!   `handoff::PATIENCE` (2 s), then it asks another or makes its own.
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
mod fill;
mod handoff;
mod registry;

use crate::extras::{Facts, PerFile, ShareAsk, ShareFile, Shared, eligible};
use crate::report::NodeCopy;
use crate::storage::BufferLayout;
use crate::trace;

use coordinate::coordinate;
use handoff::MAX_FILES;

/// The chunk size where the caller set none: prefetch's.
use crate::extras::DEFAULT_CHUNK as CHUNK;
/// Readers per rank (see the `NOTE:` above): prefetch's default streams.
use crate::extras::DEFAULT_STREAMS as STREAMS;

/// One load's part in node copies: per file of `files`, what it did; and,
/// for the participant of a load split between nodes, the copies the load
/// is to fill.
pub(crate) fn share(files: &[ShareFile<'_>], ask: &ShareAsk<'_>) -> Shared {
    let mut out = Shared::none(files.len());
    // The benchmark's "today" arm turns it off (`policy::NODE_COPY_ENV`):
    // then every rank reads alone, with nothing said, as one rank alone.
    if ask.rank.size < 2 || !crate::policy::node_copy(ask.env) {
        return out;
    }
    // The files that get a copy, with their identities; the others say why.
    let mut chosen: Vec<usize> = Vec::new();
    let mut ids: Vec<Vec<u8>> = Vec::new();
    for (i, (f, slot)) in files.iter().zip(out.files.iter_mut()).enumerate() {
        if !f.buffered {
            continue;
        }
        let id = registry::identity(f.source());
        let header = f.header();
        let facts = Facts {
            all_tensors: ask
                .keep
                .is_none_or(|keep| header.tensors.iter().all(|t| keep(&t.name))),
            converting: ask.converting,
            aligned: BufferLayout::for_file(header, &vec![true; header.tensors.len()]).image,
            identity: id.is_some(),
        };
        match (eligible(facts), id) {
            (Ok(()), Some(id)) if chosen.len() < MAX_FILES => {
                chosen.push(i);
                ids.push(id);
            }
            (Ok(()), _) => *slot = PerFile::NotUsed(NodeCopy::TooManyFiles { most: MAX_FILES }),
            (Err(why), _) => *slot = PerFile::NotUsed(why),
        }
    }
    if chosen.is_empty() {
        return out;
    }
    let chosen_files: Vec<ShareFile<'_>> = chosen
        .iter()
        .filter_map(|&i| files.get(i).copied())
        .collect();
    let (results, mut pending) = match coordinate(&chosen_files, &ids, ask) {
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
            *index = chosen.get(*index).copied().unwrap_or(usize::MAX);
        }
    }
    // Back in the load's order.
    for (&i, result) in chosen.iter().zip(results) {
        if let Some(slot) = out.files.get_mut(i) {
            *slot = result;
        }
    }
    out.pending = pending;
    trace::traced! {
        for (f, per) in files.iter().zip(&out.files) {
            if let Some(copy) = per.report() {
                tracing::info!(target: "safeload", file = %f.path().display(), node_copy = %copy, "node copy");
            }
        }
    }
    out
}
