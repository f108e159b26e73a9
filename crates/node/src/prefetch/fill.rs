//! The chunk queue filling a destination instead of the page cache: the local ranks of a job read each chunk of a node copy once, straight into its place, with the queue's take-over rules.
//!
//! The queue is the prefetch queue (`queue_file.rs`), under a key of its
//! own (the caller's key material: the node copy's files and job), with
//! every chunk free at the start: a node copy starts empty, whatever the
//! page cache holds. The readers are the prefetch readers (`worker.rs`),
//! given a [`Sink`] that reads each chunk they claim into its place. What
//! they leave undone (a holder that keeps beating but never finishes, for
//! the 60 s stall guard) this rank reads itself at the end, so that a fill
//! that returns `Ok` is complete.

use std::path::{Path, PathBuf};

use super::plan::{Chunk, ChunkPlan, Init, reader_plan};
use super::queue::{
    DONE, FREE, Layout, chunk_words, heartbeat_words, init_from_header, slot_words,
};
use super::queue_file::{Queue, sweep_stale};
use super::worker::{Outcome, Sink, Tally, Work};
use crate::cancel::Cancel;
use crate::coord::Owner;
use crate::error::Result;
use crate::extras::LocalRank;
use crate::os;
use crate::progress::{Callback, Meter, Phase};

/// A fill's read of one chunk: a file index, an offset, a length, and the
/// beat to call as pieces of it land.
pub(crate) type ReadChunk<'a> = dyn Fn(usize, u64, u64, &dyn Fn()) -> Result<()> + Sync + 'a;

/// What one rank's part in a fill was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FillOutcome {
    /// Chunks this rank read.
    pub handled: usize,
    /// Chunks of the whole fill.
    pub chunks: usize,
    /// The chunk size the fill used.
    pub chunk_size: u64,
    /// Chunks this rank read at the end because nobody finished them.
    pub finished_here: usize,
    /// Whether the chunks were shared with the other ranks through a queue
    /// file; else this rank read every chunk itself, and why (the queue
    /// file's path and the error).
    pub unshared: Option<(PathBuf, String)>,
    /// Queue files of dead jobs removed first.
    pub swept: usize,
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
    /// queue: a rank that joins after the last has left must learn from it
    /// that the fill is over, not start one anew.
    pub complete: &'a dyn Fn(),
    /// Asked by the rank that makes the queue file: where it says the fill
    /// is over (a rank that took the copy unfinished in the instant before
    /// the last filler called `complete`), every chunk starts done.
    pub done_elsewhere: &'a dyn Fn() -> bool,
    /// Filled by this rank alone, through a queue in its memory (a copy no
    /// other rank fills: the queue file of its key is another copy's).
    pub private: bool,
}

/// Fills files of `lens` bytes (in order) through `shared`, with the other
/// ranks of `rank`: `read` reads one chunk (a file index, an offset, a
/// length) into its place, calling the beat it is given as pieces of it
/// land (the rank's heartbeat: a rank whose reads progress keeps its
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
    let swept = sweep_stale(dir);
    let plan = ChunkPlan::new(lens, chunk_size, os::page_size());
    let me = Owner::current();
    let queue = open_queue(&plan, key_material, dir, me, done_elsewhere, private);
    let shared = queue.is_shared();
    let unshared = (!shared).then(|| queue.refused.clone().unwrap_or_default());
    let needed = init_from_header(queue.words()).needed;
    let meter = Meter::new(progress, Phase::Read, needed, lens.len());
    let fill = Fill {
        queue: &queue,
        chunks: &plan.chunks,
        sink: ReadInto(read),
        cancel,
    };
    let outcome = fill.read_shares(rank, streams, me, &meter)?;
    let finished_here = fill.finish_stalled()?;
    complete();
    meter.finish();
    drop(queue);
    Ok(FillOutcome {
        handled: outcome.handled,
        chunks: plan.chunks.len(),
        chunk_size: plan.chunk_size,
        finished_here,
        unshared,
        swept,
        taken_over: outcome.taken_over,
    })
}

/// The fill's queue: the file of `key_material` in `dir`, shared with the
/// other ranks, or this rank's own where the file cannot be had.
fn open_queue(
    plan: &ChunkPlan,
    key_material: &[u8],
    dir: &Path,
    me: Owner,
    done_elsewhere: &dyn Fn() -> bool,
    private: bool,
) -> Queue {
    let layout = Layout {
        key: 0,
        chunk_size: plan.chunk_size,
        chunks: plan.chunks.len(),
        total: plan.total,
        slots: 0,
    };
    // A node copy starts empty: every chunk free, nothing resident; unless
    // its fill ended before this rank made the queue file.
    let mut make = || Init {
        states: vec![if done_elsewhere() { DONE } else { FREE }; plan.chunks.len()],
        resident: 0,
        needed: plan.total,
        available: None,
        budget: None,
        skipped: 0,
        known: false,
    };
    if private {
        return Queue::local(layout, &mut make, None);
    }
    Queue::shared(dir, key_material, layout, me, &mut make)
}

/// A fill under way, as its steps share it: the queue, its chunks, and the
/// caller's read that puts each chunk in its place.
struct Fill<'a> {
    queue: &'a Queue,
    chunks: &'a [Chunk],
    sink: ReadInto<'a>,
    cancel: &'a Cancel,
}

impl Fill<'_> {
    /// This rank's readers over the queue: `streams` of them, with the other
    /// ranks of `rank` where the queue is shared.
    fn read_shares(
        &self,
        rank: &LocalRank,
        streams: usize,
        me: Owner,
        meter: &Meter,
    ) -> Result<Outcome> {
        let shared = self.queue.is_shared();
        let words = self.queue.words();
        // A queue of this rank's own: no other rank fills any of it, so this
        // rank's readers claim every chunk (not a share, finished at the end by
        // one reader).
        let alone = LocalRank {
            rank: 0,
            size: 1,
            source: rank.source.clone(),
        };
        let (claimable, starts) = reader_plan(
            self.chunks,
            if shared { rank } else { &alone },
            streams,
            shared,
        );
        let work = Work {
            targets: &[],
            methods: &[],
            chunks: self.chunks,
            states: chunk_words(words, self.queue.layout()),
            me,
            shared,
            claimable,
            on_chunk: None,
            meter,
            slots: slot_words(words, self.queue.layout()),
            heartbeats: heartbeat_words(words, self.queue.layout()),
            heartbeat: self.queue.heartbeat(),
            tally: Tally::default(),
            sink: Some(&self.sink),
            cancel: self.cancel,
        };
        work.run(&starts)
    }

    /// Reads here every chunk the readers left undone: how many there were.
    fn finish_stalled(&self) -> Result<usize> {
        // What is still not done was given up on by the stall guard: read it
        // here.
        let mut finished_here = 0;
        for (i, state) in chunk_words(self.queue.words(), self.queue.layout())
            .iter()
            .enumerate()
        {
            if state.load(std::sync::atomic::Ordering::Acquire) != DONE {
                if let Some(&chunk) = self.chunks.get(i) {
                    // No reader of this rank is left to beat for.
                    self.sink.fill(chunk, &|| {})?;
                    finished_here += 1;
                }
            }
        }
        Ok(finished_here)
    }
}

/// The caller's read as a [`Sink`].
struct ReadInto<'a>(&'a ReadChunk<'a>);

impl Sink for ReadInto<'_> {
    fn fill(&self, chunk: Chunk, beat: &dyn Fn()) -> Result<()> {
        (self.0)(chunk.file, chunk.offset, chunk.len, beat)
    }
}
