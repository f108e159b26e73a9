//! Filling a node copy with the other ranks: the prefetch chunk queue (under the copy's key, every chunk free at the start) and its readers, each chunk read once, straight into the copy's memory files, with `O_DIRECT` where the policy reads the file so.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::ask::{Remarks, Wanted, find};
use super::coordinate::{Coordination, Obtained};
use super::handoff::Offer;
use crate::coord::Owner;
use crate::dest::node::CopyFill;
use crate::dest::pages::HugePages;
use crate::error::{Error, Operation, Result};
use crate::extras::{LocalRank, ShareAsk, ShareFile, direct_reads, tensor_part};
use crate::os;
use crate::prefetch::{
    Chunk, ChunkPlan, DONE, Layout, Queue, Sink, Work, chunk_words, guard, init_from_header,
    reader_plan,
};
use crate::progress::{Meter, Phase};
use crate::report::QueueNote;
use crate::source::read_error;

/// Fills `copy` through the chunk queue with the other ranks (alone where
/// `private`: a holder did not hand the key's copy over, so never through
/// the key's queue file), calling `complete` once every chunk is in place:
/// per file of the offer, what this rank read of it. What the queue's
/// readers leave undone (past the stall guard) this rank reads at the end,
/// so a fill that returns `Ok` is complete.
pub(super) fn fill(
    node: &Coordination<'_>,
    copy: &Obtained,
    private: bool,
    complete: &dyn Fn(),
) -> Result<(Vec<ReadHere>, FillOutcome)> {
    let parts = Parts(parts_of_offer(
        node.files,
        &copy.offer,
        &copy.memfds,
        copy.huge_pages,
    )?);
    let lens: Vec<u64> = parts.0.iter().map(|part| part.file.size()).collect();
    // Direct reads where the policy would read the file so (FUSE, cold): the
    // daemon answers in requests of its `max_read`, not 128 KiB, and no page
    // cache copy is left behind. NOTE: the slowest of 3 ranks on the 2 ms test
    // mount kept closer to one rank alone so (BENCHMARKS.md, "node/fill.rs:
    // fill"). Chunks are whole pages of a page-aligned map; a last, partial
    // block goes through the OS layer's bounce buffer.
    let local = parts.0.iter().filter_map(|p| p.file.local());
    let _direct = direct_reads(local, node.ask.direct_io);
    let plan = ChunkPlan::new(&lens, node.chunk_size, os::page_size());
    // A node copy starts empty: every chunk free, nothing resident. But a
    // rank that took the copy unfinished just before the last filler offered
    // it complete finds it complete here (asked under the queue's lock, each
    // holder bounded, `ask.rs`): every chunk starts done. Only this copy (its
    // maker's) counts: another complete copy holds none of this one's bytes.
    let mut make = || {
        let mut init = guard(&plan.chunks, &[], None, false);
        let found = find(&node.asking(), Wanted::Complete, &mut Remarks::default()).0;
        if found.is_some_and(|((found, _), _)| found.maker == copy.offer.maker) {
            init.states.fill(DONE);
        }
        init
    };
    let layout = Layout::of(&plan);
    let queue = if private {
        Queue::local(layout, &mut make, None)
    } else {
        // The copy's key and the user: another user's queue of the same copy
        // is not this one's to join.
        let uid = os::effective_uid().unwrap_or(u32::MAX).to_le_bytes();
        let material = [&node.key.to_le_bytes()[..], &uid, b"node copy queue"].concat();
        Queue::shared(&node.dir, &material, layout, Owner::current(), &mut make)
    };
    let outcome = read_through(node.ask, &queue, &plan, &parts, complete)?;
    drop(queue);
    check_lengths(&parts.0)?;
    Ok((parts.0.into_iter().map(Part::counts).collect(), outcome))
}

/// What one rank's part in a fill met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FillOutcome {
    /// The chunk size the fill used.
    pub chunk_size: u64,
    /// Chunks this rank read at the end because nobody finished them.
    pub finished_here: usize,
    /// Where this rank read every chunk itself: the queue file's path, and why.
    pub unshared: Option<(PathBuf, String)>,
    /// Chunks this rank took over from live ranks that showed no progress
    /// (read twice): per chunk, the holder's pid and how long it was quiet.
    pub taken_over: Vec<(u32, std::time::Duration)>,
}

/// This rank's readers over `queue` (prefetch's, into `parts`), then what
/// they left undone read here; `complete` called before the queue is left,
/// so a rank joining later does not start the fill anew.
fn read_through(
    ask: &ShareAsk<'_>,
    queue: &Queue,
    plan: &ChunkPlan,
    parts: &Parts<'_>,
    complete: &dyn Fn(),
) -> Result<FillOutcome> {
    let shared = queue.is_shared();
    let unshared = (!shared).then(|| match &queue.note {
        Some(QueueNote::NotShared { path, why }) => (path.clone(), why.clone()),
        _ => Default::default(),
    });
    let needed = init_from_header(queue.words()).needed;
    let meter = Meter::new(ask.progress, Phase::Read, needed, parts.0.len());
    // A queue of this rank's own: no other rank fills any of it, so its
    // readers claim every chunk.
    let alone = LocalRank {
        rank: 0,
        size: 1,
        source: ask.rank.source.clone(),
    };
    let ranks = if shared { ask.rank } else { &alone };
    let streams = ask.streams.map_or(super::STREAMS, |s| s.max(1));
    let (claimable, starts) = reader_plan(&plan.chunks, ranks, streams, shared);
    let work = Work {
        sink: Some(parts),
        ..Work::over(queue, &plan.chunks, claimable, &meter, ask.cancel)
    };
    let outcome = work.run(&starts)?;
    // What is still not done was given up on by the stall guard: read here,
    // with no reader of this rank left to beat for.
    let mut finished_here = 0;
    let states = chunk_words(queue.words(), queue.layout());
    for (state, &chunk) in states.iter().zip(&plan.chunks) {
        if state.load(Ordering::Acquire) != DONE {
            parts.fill(chunk, &|| {})?;
            finished_here += 1;
        }
    }
    complete();
    meter.finish();
    Ok(FillOutcome {
        chunk_size: plan.chunk_size,
        finished_here,
        unshared,
        taken_over: outcome.taken_over,
    })
}

/// The most bytes one read of a chunk asks for: the rank beats its heartbeat
/// after each piece, so a chunk read slowly but surely is never taken over.
///
/// NOTE: FUSE splits a direct read into 1 MiB requests anyway (`testfs`, as
/// hf-mount) and a disk into its own limit, so 2 MiB pieces cost nothing.
const PIECE: u64 = 2 << 20;

/// What this rank read of one file of the copy.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ReadHere {
    /// Chunks this rank read.
    pub chunks: usize,
    /// Bytes of tensor data in them.
    pub bytes: u64,
}

/// One file of the offer as the fill sees it: the file, the writer of its
/// copy, and what this rank read of it (as [`ReadHere`]).
struct Part<'a> {
    file: ShareFile<'a>,
    writer: CopyFill,
    chunks: AtomicUsize,
    bytes: AtomicU64,
}

impl Part<'_> {
    /// Reads `len` bytes at `offset` of the file into its copy, in pieces
    /// of [`PIECE`] with a `beat` after each, and counts them.
    fn read(&self, offset: u64, len: u64, beat: &dyn Fn()) -> Result<()> {
        let file = self.file;
        let mut at = offset;
        while at < offset + len {
            let piece = PIECE.min(offset + len - at);
            self.writer
                .read_chunk(file.source(), at, piece)
                .map_err(|(at, e)| {
                    read_error(Operation::Read, file.source(), file.size(), at, e)
                })?;
            beat();
            at += piece;
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(
            tensor_part(file.header().data_start, offset, len),
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// What this rank read of the file.
    fn counts(self) -> ReadHere {
        ReadHere {
            chunks: self.chunks.into_inner(),
            bytes: self.bytes.into_inner(),
        }
    }
}

/// The offer's files, in its order, as the queue's [`Sink`].
struct Parts<'a>(Vec<Part<'a>>);

impl Sink for Parts<'_> {
    fn fill(&self, chunk: Chunk, beat: &dyn Fn()) -> Result<()> {
        let part = self.0.get(chunk.file);
        part.map_or(Ok(()), |part| part.read(chunk.offset, chunk.len, beat))
    }
}

/// The offer's files among `files`, in its order, each with a writer of its
/// copy (its pages faulted in as `huge_pages` says).
fn parts_of_offer<'a>(
    files: &[ShareFile<'a>],
    offer: &Offer,
    memfds: &[File],
    huge_pages: HugePages,
) -> Result<Vec<Part<'a>>> {
    let mut parts = Vec::with_capacity(offer.files.len());
    for (&(i, _), memfd) in offer.files.iter().zip(memfds) {
        let Some(&file) = usize::try_from(i).ok().and_then(|i| files.get(i)) else {
            continue;
        };
        let writer = CopyFill::new(memfd, huge_pages)
            .map_err(|e| Error::io(Operation::Map, file.path(), None, e))?;
        parts.push(Part {
            file,
            writer,
            chunks: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
        });
    }
    Ok(parts)
}

/// Checks that each local file is still of the length it was opened at (a
/// remote object's every request required the version opened).
fn check_lengths(parts: &[Part<'_>]) -> Result<()> {
    for part in parts {
        let (f, expected) = (part.file, part.file.size());
        let Some(local) = f.local() else {
            continue;
        };
        let now = local
            .len_now()
            .map_err(|e| Error::io(Operation::Stat, f.path(), None, e))?;
        if now != expected {
            let kind = crate::error::ErrorKind::SizeMismatch {
                expected,
                actual: now,
            };
            return Err(Error::new(kind, f.path()));
        }
    }
    Ok(())
}
