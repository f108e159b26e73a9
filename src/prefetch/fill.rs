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

use super::launcher::LocalRank;
use super::owner::Owner;
use super::plan::{Chunk, ChunkPlan, Init, reader_plan};
use super::queue::{
    DONE, FREE, Layout, chunk_words, heartbeat_words, init_from_header, slot_words,
};
use super::queue_file::{Queue, sweep_stale};
use super::worker::{Sink, Tally, Work};
use crate::error::Result;
use crate::os;
use crate::progress::{Callback, Meter, Phase};

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
}

/// Fills files of `lens` bytes (in order) through the chunk queue named by
/// `key_material` in `dir`, shared with the other ranks of `rank`: `read`
/// reads one chunk (a file index, an offset, a length) into its place.
/// `streams` readers in this process. `complete` is called once every chunk
/// is in place, before this rank leaves the queue: a rank that joins after
/// the last has left must learn from it that the fill is over, not start
/// one anew. `done_elsewhere` is asked by the rank that makes the queue
/// file: where it says the fill is over (a rank that took the copy
/// unfinished in the instant before the last filler called `complete`),
/// every chunk starts done.
pub(crate) fn fill_shared(
    lens: &[u64],
    (key_material, dir): (&[u8], &Path),
    (chunk_size, streams): (u64, usize),
    rank: &LocalRank,
    read: &(dyn Fn(usize, u64, u64) -> Result<()> + Sync),
    (complete, done_elsewhere): (&dyn Fn(), &dyn Fn() -> bool),
    progress: Option<&Callback>,
) -> Result<FillOutcome> {
    let swept = sweep_stale(dir);
    let plan = ChunkPlan::new(lens, chunk_size, os::page_size());
    let chunks = plan.chunks;
    let layout = Layout {
        key: 0,
        chunk_size: plan.chunk_size,
        chunks: chunks.len(),
        total: plan.total,
        slots: 0,
    };
    // A node copy starts empty: every chunk free, nothing resident; unless
    // its fill ended before this rank made the queue file.
    let mut make = || Init {
        states: vec![if done_elsewhere() { DONE } else { FREE }; chunks.len()],
        resident: 0,
        needed: plan.total,
        available: None,
        budget: None,
        skipped: 0,
        known: false,
    };
    let me = Owner::current();
    let queue = Queue::shared(dir, key_material, layout, me, &mut make);
    let shared = queue.is_shared();
    let unshared = (!shared).then(|| queue.refused.clone().unwrap_or_default());
    let words = queue.words();
    let needed = init_from_header(words).needed;
    // A queue of this rank's own: no other rank fills any of it, so this
    // rank's readers claim every chunk (not a share, finished at the end by
    // one reader).
    let alone = LocalRank {
        rank: 0,
        size: 1,
        source: rank.source.clone(),
    };
    let (claimable, starts) =
        reader_plan(&chunks, if shared { rank } else { &alone }, streams, shared);
    let meter = Meter::new(progress, Phase::Read, needed, lens.len());
    let sink = ReadInto(read);
    let work = Work {
        targets: &[],
        methods: &[],
        chunks: &chunks,
        states: chunk_words(words, queue.layout()),
        me,
        shared,
        claimable,
        on_chunk: None,
        meter: &meter,
        slots: slot_words(words, queue.layout()),
        heartbeats: heartbeat_words(words, queue.layout()),
        heartbeat: queue.heartbeat(),
        tally: Tally::default(),
        sink: Some(&sink),
    };
    let outcome = work.run(&starts)?;
    // What is still not done was given up on by the stall guard: read it
    // here.
    let mut finished_here = 0;
    for (i, state) in chunk_words(words, queue.layout()).iter().enumerate() {
        if state.load(std::sync::atomic::Ordering::Acquire) != DONE {
            if let Some(&chunk) = chunks.get(i) {
                sink.fill(chunk)?;
                finished_here += 1;
            }
        }
    }
    complete();
    meter.finish();
    drop(queue);
    Ok(FillOutcome {
        handled: outcome.handled,
        chunks: chunks.len(),
        chunk_size: plan.chunk_size,
        finished_here,
        unshared,
        swept,
    })
}

/// The caller's read as a [`Sink`].
struct ReadInto<'a>(&'a (dyn Fn(usize, u64, u64) -> Result<()> + Sync));

impl Sink for ReadInto<'_> {
    fn fill(&self, chunk: Chunk) -> Result<()> {
        (self.0)(chunk.file, chunk.offset, chunk.len)
    }
}
