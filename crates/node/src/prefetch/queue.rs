//! The queue's word format, as pure functions over mapped words: header, rank slots and chunk states, validation, initialization.
//!
//! A queue is an array of native-endian `u64` words, each read and written
//! only with atomic operations, whether it lives in a shared file
//! (`queue_file.rs`) or in this process's memory:
//!
//! | words | content |
//! |---|---|
//! | 0 | magic `b"SLPFQUE1"`, stored last when the file is initialized |
//! | 1 | format version (2; 1 had no heartbeats and 31-bit tags) |
//! | 2 | a second hash of the key, checked on attach |
//! | 3, 4, 5 | chunk size, chunk count, total bytes |
//! | 6 | number of rank slots (256) |
//! | 7 | creation time, Unix seconds |
//! | 8, 9 | bytes resident when created, bytes that were not |
//! | 10, 11 | memory available, the guard's budget (`u64::MAX`: unknown) |
//! | 12 | bytes the guard left cold |
//! | 13 | 1 when residency could be checked |
//! | 14, 15 | reserved (0) |
//! | 16 .. 16+slots | rank slots: 0 empty, an owner (attached), or bit 63 and an owner (finished) |
//! | then, one per slot | the slot's heartbeat: a count its rank's readers bump as they go (0 while the slot is empty) |
//! | then, one per chunk | 0 free, an owner (claimed), bit 62 and an owner (claimed by taking it over from a holder that made no progress), `1<<63 \| 1` done, `1<<63 \| 2` skipped by the guard |
//!
//! An owner is a process's word (`coord/owner.rs`): its pid and a tag from its
//! start time, bits 62 and 63 clear. The version is also part of the queue
//! file's name, so ranks of two versions never take each other's file for
//! invalid.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::plan::{ChunkPlan, Init};
use crate::coord::Owner;

const MAGIC: u64 = u64::from_le_bytes(*b"SLPFQUE1");
pub(super) const VERSION: u64 = 2;
pub(super) const HEADER_WORDS: usize = 16;
pub(super) const SHARED_SLOTS: usize = 256;

/// Header word positions.
pub(super) mod at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const KEY: usize = 2;
    pub const CHUNK_SIZE: usize = 3;
    pub const CHUNKS: usize = 4;
    pub const TOTAL: usize = 5;
    pub const SLOTS: usize = 6;
    pub const CREATED: usize = 7;
    pub const RESIDENT: usize = 8;
    pub const NEEDED: usize = 9;
    pub const AVAILABLE: usize = 10;
    pub const BUDGET: usize = 11;
    pub const SKIPPED: usize = 12;
    pub const KNOWN: usize = 13;
}

/// A chunk no rank has claimed. A claimed chunk holds its owner's word.
pub(super) const FREE: u64 = 0;
/// The bit of a word that no rank changes again: a finished slot, or a
/// chunk done or skipped.
pub(super) const TERMINAL: u64 = 1 << 63;
/// The bit of a claim that says it was taken over from a holder that made
/// no progress: such a claim is not taken over again for that reason.
pub(super) const TAKEN_OVER: u64 = 1 << 62;
pub(crate) const DONE: u64 = TERMINAL | 1;
pub(super) const SKIPPED: u64 = TERMINAL | 2;

/// A chunk word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChunkState {
    Free,
    Claimed(Claim),
    Done,
    Skipped,
}

/// Who holds a claimed chunk, and how they got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Claim {
    pub owner: Owner,
    /// Taken over from a holder that made no progress.
    pub taken_over: bool,
}

impl Claim {
    /// The chunk word of this claim.
    pub(super) fn word(self) -> u64 {
        self.owner.word() | if self.taken_over { TAKEN_OVER } else { 0 }
    }
}

pub(super) fn chunk_state(word: u64) -> Option<ChunkState> {
    match word {
        FREE => Some(ChunkState::Free),
        DONE => Some(ChunkState::Done),
        SKIPPED => Some(ChunkState::Skipped),
        w => Owner::from_word(w & !TAKEN_OVER).map(|owner| {
            ChunkState::Claimed(Claim {
                owner,
                taken_over: w & TAKEN_OVER != 0,
            })
        }),
    }
}

/// A rank slot word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotState {
    Empty,
    Attached(Owner),
    Finished,
}

pub(super) fn slot_state(word: u64) -> Option<SlotState> {
    if word == 0 {
        return Some(SlotState::Empty);
    }
    if word & TERMINAL != 0 {
        return Owner::from_word(word & !TERMINAL).map(|_| SlotState::Finished);
    }
    Owner::from_word(word).map(SlotState::Attached)
}

/// What a queue must hold to be this checkpoint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub key: u64,
    pub chunk_size: u64,
    pub chunks: usize,
    pub total: u64,
    pub slots: usize,
}

impl Layout {
    /// The layout of a queue of `plan`'s chunks in this process's memory
    /// (`Queue::shared` sets the key and slots of a file's).
    pub(crate) fn of(plan: &ChunkPlan) -> Layout {
        Layout {
            key: 0,
            chunk_size: plan.chunk_size,
            chunks: plan.chunks.len(),
            total: plan.total,
            slots: 0,
        }
    }

    pub(super) fn words(&self) -> usize {
        HEADER_WORDS + 2 * self.slots + self.chunks
    }

    pub(super) fn bytes(&self) -> u64 {
        self.words() as u64 * 8
    }
}

/// Why a queue file was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Invalid {
    /// Its size is not this layout's.
    Size,
    /// It was never initialized, or is not a queue.
    Magic,
    /// Another format version.
    Version,
    /// Another checkpoint, chunk size or job.
    Layout,
    /// A word that no rank writes.
    Word,
    /// Valid, but no live rank is attached: left by an earlier run.
    Stale,
}

impl Invalid {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Invalid::Size => "its size is not this checkpoint's layout",
            Invalid::Magic => "it was not initialized",
            Invalid::Version => "another format version",
            Invalid::Layout => "another checkpoint or chunk size",
            Invalid::Word => "it holds a corrupt word",
            Invalid::Stale => "no live rank was attached to it",
        }
    }
}

pub(super) fn load(words: &[AtomicU64], i: usize) -> u64 {
    words.get(i).map_or(0, |w| w.load(Ordering::Acquire))
}

fn store(words: &[AtomicU64], i: usize, value: u64) {
    if let Some(w) = words.get(i) {
        w.store(value, Ordering::Release);
    }
}

pub(crate) fn chunk_words<'a>(words: &'a [AtomicU64], layout: &Layout) -> &'a [AtomicU64] {
    words.get(HEADER_WORDS + 2 * layout.slots..).unwrap_or(&[])
}

/// One heartbeat per slot, in slot order.
pub(super) fn heartbeat_words<'a>(words: &'a [AtomicU64], layout: &Layout) -> &'a [AtomicU64] {
    words
        .get(HEADER_WORDS + layout.slots..HEADER_WORDS + 2 * layout.slots)
        .unwrap_or(&[])
}

pub(super) fn slot_words<'a>(words: &'a [AtomicU64], layout: &Layout) -> &'a [AtomicU64] {
    words
        .get(HEADER_WORDS..HEADER_WORDS + layout.slots)
        .unwrap_or(&[])
}

/// Checks a mapped queue against the layout it must have.
pub(super) fn validate(words: &[AtomicU64], layout: &Layout) -> std::result::Result<(), Invalid> {
    if words.len() != layout.words() {
        return Err(Invalid::Size);
    }
    if load(words, at::MAGIC) != MAGIC {
        return Err(Invalid::Magic);
    }
    if load(words, at::VERSION) != VERSION {
        return Err(Invalid::Version);
    }
    let same = load(words, at::KEY) == layout.key
        && load(words, at::CHUNK_SIZE) == layout.chunk_size
        && load(words, at::CHUNKS) == layout.chunks as u64
        && load(words, at::TOTAL) == layout.total
        && load(words, at::SLOTS) == layout.slots as u64;
    if !same {
        return Err(Invalid::Layout);
    }
    let reserved_ok = (at::KNOWN + 1..HEADER_WORDS).all(|i| load(words, i) == 0);
    // Only a rank that holds a slot bumps its heartbeat, and slots are taken
    // under the lock this runs under: an empty slot's heartbeat is 0.
    let slots_ok = slot_words(words, layout)
        .iter()
        .zip(heartbeat_words(words, layout))
        .all(|(w, beat)| match slot_state(w.load(Ordering::Acquire)) {
            Some(SlotState::Empty) => beat.load(Ordering::Acquire) == 0,
            Some(_) => true,
            None => false,
        });
    let chunks_ok = chunk_words(words, layout)
        .iter()
        .all(|w| chunk_state(w.load(Ordering::Acquire)).is_some());
    if !(reserved_ok && slots_ok && chunks_ok) {
        return Err(Invalid::Word);
    }
    Ok(())
}

/// Ranks attached to a queue and still running.
pub(super) fn live_attached(
    words: &[AtomicU64],
    layout: &Layout,
    alive: &dyn Fn(Owner) -> bool,
) -> usize {
    slot_words(words, layout)
        .iter()
        .filter(|w| matches!(slot_state(w.load(Ordering::Acquire)), Some(SlotState::Attached(o)) if alive(o)))
        .count()
}

/// Writes a new queue: the header, the chunk states, this rank in the first
/// slot, and the magic last.
pub(super) fn init_words(words: &[AtomicU64], layout: &Layout, init: &Init, me: Option<Owner>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let header = [
        (at::VERSION, VERSION),
        (at::KEY, layout.key),
        (at::CHUNK_SIZE, layout.chunk_size),
        (at::CHUNKS, layout.chunks as u64),
        (at::TOTAL, layout.total),
        (at::SLOTS, layout.slots as u64),
        (at::CREATED, now),
        (at::RESIDENT, init.resident),
        (at::NEEDED, init.needed),
        (at::AVAILABLE, init.available.unwrap_or(u64::MAX)),
        (at::BUDGET, init.budget.unwrap_or(u64::MAX)),
        (at::SKIPPED, init.skipped),
        (at::KNOWN, u64::from(init.known)),
    ];
    for (i, value) in header {
        store(words, i, value);
    }
    for (w, &s) in chunk_words(words, layout).iter().zip(&init.states) {
        w.store(s, Ordering::Release);
    }
    if let (Some(me), Some(slot)) = (me, slot_words(words, layout).first()) {
        slot.store(me.word(), Ordering::Release);
    }
    store(words, at::MAGIC, MAGIC);
}

/// The header's guard numbers, as [`Init`] without the states.
pub(crate) fn init_from_header(words: &[AtomicU64]) -> Init {
    let opt = |v: u64| (v != u64::MAX).then_some(v);
    Init {
        states: Vec::new(),
        resident: load(words, at::RESIDENT),
        needed: load(words, at::NEEDED),
        available: opt(load(words, at::AVAILABLE)),
        budget: opt(load(words, at::BUDGET)),
        skipped: load(words, at::SKIPPED),
        known: load(words, at::KNOWN) == 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let owner = Owner {
            pid: 4_000_000,
            tag: 0x3FFF_FFFF,
        };
        let claim = Claim {
            owner,
            taken_over: false,
        };
        assert_eq!(chunk_state(claim.word()), Some(ChunkState::Claimed(claim)));
        let taken = Claim {
            owner,
            taken_over: true,
        };
        assert_eq!(taken.word(), owner.word() | TAKEN_OVER);
        assert_eq!(chunk_state(taken.word()), Some(ChunkState::Claimed(taken)));
        assert_eq!(chunk_state(TAKEN_OVER), None, "taken over by nobody");
        assert_eq!(chunk_state(FREE), Some(ChunkState::Free));
        assert_eq!(chunk_state(DONE), Some(ChunkState::Done));
        assert_eq!(chunk_state(SKIPPED), Some(ChunkState::Skipped));
        assert_eq!(chunk_state(TERMINAL | 3), None);
        assert_eq!(chunk_state(5 << 32), None, "a tag without a pid");
        assert_eq!(slot_state(0), Some(SlotState::Empty));
        assert_eq!(slot_state(owner.word()), Some(SlotState::Attached(owner)));
        assert_eq!(
            slot_state(owner.word() | TERMINAL),
            Some(SlotState::Finished)
        );
        assert_eq!(slot_state(owner.word() | TAKEN_OVER), None, "chunks only");
    }
}
