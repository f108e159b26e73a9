//! One copy per node: the local ranks of a job that read the same files buffered fill one copy of each in shared memory through the prefetch chunk queue, and each maps it read-only.
//!
//! With more than one local rank, a file the policy reads buffered, whole,
//! unconverted and aligned gets a node copy: under the key's lock
//! (`registry.rs`) a rank asks the key's live sockets for the copy (`ask.rs`,
//! `handoff.rs`), else makes one, a sealed `memfd` per file within the memory
//! guard (`coordinate.rs`), and hands it out from a socket of its own. Unless
//! it came complete, the ranks fill it through one chunk queue (`fill.rs`),
//! each chunk read once; each rank maps it read-only, and stops handing it
//! out when its last tensor of it goes.
//!
//! # Other users
//!
//! The names live in `/dev/shm`, which every local user can write. Another
//! user can at most turn the copy off (by taking the lock's or the queue's
//! name: each rank then reads alone, saying why); no rank connects to,
//! follows, removes or counts as a holder anything not this user's, and no
//! wait on another user's process under a lock outlasts `handoff::PATIENCE`
//! (`tests/it/node_copy/attacks.rs`).
//!
//! # Under a load split between nodes
//!
//! The node's participant (`Role::Participant`) makes the copy and the load
//! fills it (its node's pieces from storage, the others' from the exchange);
//! the other ranks (`Role::Member`) wait for the complete copy, at most the
//! exchange's timeout for one to be offered, and else read alone.
//!
//! # Limits
//!
//! A rank of this user stopped under a key's lock holds up the ranks that
//! start meanwhile for a minute at most; one stopped while it hands the copy
//! out costs the asker 2 s. A running holder that does not answer is asked
//! three times (`ask.rs`), then the asker makes a copy of its own, filled
//! alone through a queue in its memory (the key's queue file is the first
//! copy's) and said in its report. A rank that received an unfinished copy
//! just as the last filler left the queue asks again and finds it complete
//! (`tests/it/remote.rs` met that race under CI's load).
//!
//! NOTE: each rank fills with 4 readers (prefetch's default streams), not the
//! read engine's adaptive count: the queue's readers claim chunks one by one,
//! the engine runs a list fixed in advance. With 3 ranks that is 12 reads in
//! flight, what the engine settles at on the FUSE test mount.

mod ask;
mod coordinate;
mod fill;
mod handoff;
pub(crate) mod registry;

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
