//! The chunk queue filling a destination instead of the page cache: the local ranks of a job read each chunk of a node copy once, straight into its place, with the queue's take-over rules.
//!
//! The queue is the prefetch queue under the caller's key, every chunk free
//! at the start (a node copy starts empty); the readers are prefetch's, with
//! a [`Sink`]. What they leave undone (past the stall guard) this rank reads
//! at the end, so a fill that returns `Ok` is complete.

use std::path::{Path, PathBuf};

use super::plan::{Chunk, ChunkPlan, guard, reader_plan};
use super::queue::{DONE, Layout, chunk_words, init_from_header};
use super::queue_file::Queue;
use super::worker::{Sink, Work};
use crate::cancel::Cancel;
use crate::coord::Owner;
use crate::error::Result;
use crate::extras::LocalRank;
use crate::os;
use crate::progress::{Callback, Meter, Phase};
use crate::report::QueueNote;

/// A fill's read of one chunk: a file index, an offset, a length, and the
/// beat to call as pieces of it land.
pub(crate) type ReadChunk<'a> = dyn Fn(usize, u64, u64, &dyn Fn()) -> Result<()> + Sync + 'a;

/// What one rank's part in a fill was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FillOutcome {
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

/// The chunk queue a fill goes through, shared with the other ranks, and how
/// this rank reads its part.
pub(crate) struct SharedQueue<'a> {
    /// What names the queue's file in `dir`.
    pub key_material: &'a [u8],
    pub dir: &'a Path,
    pub chunk_size: u64,
    /// Readers in this process.
    pub streams: usize,
    /// Called once every chunk is in place, before this rank leaves the
    /// queue, so a rank joining later does not start the fill anew.
    pub complete: &'a dyn Fn(),
    /// Asked by the rank that makes the queue file: where the fill is over
    /// already, every chunk starts done.
    pub done_elsewhere: &'a dyn Fn() -> bool,
    /// Filled by this rank alone, through a queue in its memory (a copy no
    /// other rank fills: the queue file of its key is another copy's).
    pub private: bool,
}

/// Fills files of `lens` bytes (in order) through `shared`, with the other
/// ranks of `rank`: `read` reads one chunk into its place, calling the beat
/// it is given as pieces of it land (a rank whose reads progress keeps its
/// chunks, `takeover.rs`).
pub(crate) fn fill_shared(
    lens: &[u64],
    shared: &SharedQueue,
    rank: &LocalRank,
    read: &ReadChunk<'_>,
    progress: Option<&Callback>,
    cancel: &Cancel,
) -> Result<FillOutcome> {
    let SharedQueue {
        key_material,
        dir,
        chunk_size,
        streams,
        complete,
        done_elsewhere,
        private,
    } = *shared;
    let plan = ChunkPlan::new(lens, chunk_size, os::page_size());
    // A node copy starts empty: every chunk free, nothing resident; unless
    // its fill ended before this rank made the queue file.
    let mut make = || {
        let mut init = guard(&plan.chunks, &[], None, false);
        if done_elsewhere() {
            init.states.fill(DONE);
        }
        init
    };
    let layout = Layout::of(&plan);
    let queue = if private {
        Queue::local(layout, &mut make, None)
    } else {
        Queue::shared(dir, key_material, layout, Owner::current(), &mut make)
    };
    let shared = queue.is_shared();
    let unshared = (!shared).then(|| match &queue.note {
        Some(QueueNote::NotShared { path, why }) => (path.clone(), why.clone()),
        _ => Default::default(),
    });
    let needed = init_from_header(queue.words()).needed;
    let meter = Meter::new(progress, Phase::Read, needed, lens.len());
    // A queue of this rank's own: no other rank fills any of it, so its
    // readers claim every chunk.
    let alone = LocalRank {
        rank: 0,
        size: 1,
        source: rank.source.clone(),
    };
    let ranks = if shared { rank } else { &alone };
    let (claimable, starts) = reader_plan(&plan.chunks, ranks, streams, shared);
    let sink = ReadInto(read);
    let work = Work {
        sink: Some(&sink),
        ..Work::over(&queue, &plan.chunks, claimable, &meter, cancel)
    };
    let outcome = work.run(&starts)?;
    // What is still not done was given up on by the stall guard: read here,
    // with no reader of this rank left to beat for.
    let mut finished_here = 0;
    let states = chunk_words(queue.words(), queue.layout());
    for (state, &chunk) in states.iter().zip(&plan.chunks) {
        if state.load(std::sync::atomic::Ordering::Acquire) != DONE {
            sink.fill(chunk, &|| {})?;
            finished_here += 1;
        }
    }
    complete();
    meter.finish();
    drop(queue);
    Ok(FillOutcome {
        chunk_size: plan.chunk_size,
        finished_here,
        unshared,
        taken_over: outcome.taken_over,
    })
}

/// The caller's read as a [`Sink`].
struct ReadInto<'a>(&'a ReadChunk<'a>);

impl Sink for ReadInto<'_> {
    fn fill(&self, chunk: Chunk, beat: &dyn Fn()) -> Result<()> {
        (self.0)(chunk.file, chunk.offset, chunk.len, beat)
    }
}
