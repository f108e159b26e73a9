//! A rank's readers: claim a free chunk, else take over a dead rank's or wait for a live one's; warm it by reading or by `WILLNEED`; then check that what they warmed landed.

use std::fs::File;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::options::ChunkCallback;
use super::owner::Owner;
use super::plan::Chunk;
use super::queue::{ChunkState, DONE, FREE, SKIPPED, chunk_state};
use super::residency::Target;
use crate::error::{Error, Result};
use crate::os;
use crate::policy::PrefetchMethod;
use crate::workers;

/// How often a reader with nothing to claim looks at the queue again.
const POLL: Duration = Duration::from_millis(2);

/// A reader stops waiting for chunks claimed by live ranks when no chunk of
/// the queue has finished for this long, and reports them as not warmed.
const STALL: Duration = Duration::from_secs(60);

/// After `WILLNEED`, the residency of a chunk is polled this often, and the
/// rest is read when nothing has landed for `WILLNEED_IDLE`.
const WILLNEED_POLL: Duration = Duration::from_micros(500);
const WILLNEED_IDLE: Duration = Duration::from_millis(50);

/// The largest read of the `Pread` method: one scratch buffer per reader.
const SCRATCH: u64 = 8 << 20;

/// What the readers of one rank work from.
pub(super) struct Work<'a> {
    pub targets: &'a [Target],
    pub methods: &'a [PrefetchMethod],
    pub chunks: &'a [Chunk],
    pub states: &'a [AtomicU64],
    pub me: Owner,
    /// Whether other processes claim from the same states.
    pub shared: bool,
    pub claimable: Range<usize>,
    pub on_chunk: Option<&'a ChunkCallback>,
    /// What the readers did so far ([`Tally::default`] to start).
    pub tally: Tally,
}

/// What a rank's readers did so far, updated as they go.
#[derive(Default)]
pub(super) struct Tally {
    warmed: AtomicU64,
    handled: Mutex<Vec<usize>>,
    stalled: Mutex<Option<(u64, String)>>,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    /// Bumped whenever a chunk of this rank finishes (for stall detection
    /// along with the queue's own states).
    progress: AtomicUsize,
}

/// What a rank's readers did, once they are done.
pub(super) struct Outcome {
    /// Chunks this rank claimed and handled.
    pub handled: usize,
    /// Bytes this rank found missing and warmed.
    pub warmed: u64,
    /// Bytes read again because they had not landed.
    pub reread: u64,
    /// Bytes given up on after waiting [`STALL`], and why.
    pub stalled: Option<(u64, String)>,
}

impl Work<'_> {
    /// Runs one reader per start, then checks that what they warmed landed.
    pub(super) fn run(&self, starts: &[usize]) -> Result<Outcome> {
        self.run_readers(starts);
        let tally = &self.tally;
        if let Some(error) = tally.error.lock().ok().and_then(|mut e| e.take()) {
            return Err(error);
        }
        let handled = tally.handled.lock().map(|h| h.clone()).unwrap_or_default();
        let reread = self.verify(&handled)?;
        Ok(Outcome {
            handled: handled.len(),
            warmed: tally.warmed.load(Ordering::Relaxed),
            reread,
            stalled: tally.stalled.lock().ok().and_then(|mut s| s.take()),
        })
    }

    /// Runs one reader per start, on threads of their own: they block on
    /// storage, and must not occupy the caller's rayon pool.
    fn run_readers(&self, starts: &[usize]) {
        let reader = |start: usize| {
            if let Err(e) = self.reader(start) {
                self.tally.failed.store(true, Ordering::Relaxed);
                if let Ok(mut slot) = self.tally.error.lock() {
                    slot.get_or_insert(e);
                }
            }
        };
        if starts.is_empty() {
            return;
        }
        workers::run(starts.len(), "safeload-prefetch", |i| {
            if let Some(&start) = starts.get(i) {
                reader(start);
            }
        });
    }

    fn reader(&self, start: usize) -> Result<()> {
        let mut scratch = Vec::new();
        let mut pages = Vec::new();
        let mut cursor = start;
        while !self.tally.failed.load(Ordering::Relaxed) {
            let next = match self.claim_free(&mut cursor) {
                Some(i) => Some(i),
                None if self.shared => self.wait_or_take_over(),
                None => None,
            };
            let Some(i) = next else {
                return Ok(());
            };
            if let Err(e) = self.handle(i, &mut scratch, &mut pages) {
                // Let another rank try it.
                if let Some(w) = self.states.get(i) {
                    swap(w, self.me.word(), FREE);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Claims the next free chunk at or after `cursor` in the claimable
    /// range, wrapping around.
    fn claim_free(&self, cursor: &mut usize) -> Option<usize> {
        let range = self.claimable.clone();
        if range.is_empty() {
            return None;
        }
        let from = (*cursor).clamp(range.start, range.end);
        for i in (from..range.end).chain(range.start..from) {
            let Some(word) = self.states.get(i) else {
                continue;
            };
            if word.load(Ordering::Relaxed) == FREE && swap(word, FREE, self.me.word()) {
                *cursor = i + 1;
                return Some(i);
            }
        }
        None
    }

    /// With nothing free: takes over a chunk whose claimer died, or waits
    /// for live claimers; `None` when every chunk is finished, or when
    /// nothing has finished for [`STALL`] (recorded in `stalled`).
    fn wait_or_take_over(&self) -> Option<usize> {
        let mut last_seen = (usize::MAX, 0usize);
        let mut last_change = Instant::now();
        loop {
            if self.tally.failed.load(Ordering::Relaxed) {
                return None;
            }
            let mut terminal = 0usize;
            let mut waiting: Vec<(usize, Owner)> = Vec::new();
            let mut verdicts: Vec<(Owner, bool)> = Vec::new();
            for i in self.claimable.clone() {
                let Some(word) = self.states.get(i) else {
                    continue;
                };
                let now = word.load(Ordering::Acquire);
                match chunk_state(now) {
                    Some(ChunkState::Free) if swap(word, FREE, self.me.word()) => return Some(i),
                    Some(ChunkState::Free) => {}
                    Some(ChunkState::Claimed(owner)) if owner == self.me => {
                        waiting.push((i, owner))
                    }
                    Some(ChunkState::Claimed(owner)) => {
                        let alive = match verdicts.iter().find(|(o, _)| *o == owner) {
                            Some(&(_, alive)) => alive,
                            None => {
                                let alive = owner.alive();
                                verdicts.push((owner, alive));
                                alive
                            }
                        };
                        if alive {
                            waiting.push((i, owner));
                        } else if swap(word, now, self.me.word()) {
                            return Some(i);
                        }
                    }
                    _ => terminal += 1,
                }
            }
            if waiting.is_empty() {
                return None;
            }
            let seen = (terminal, self.tally.progress.load(Ordering::Relaxed));
            if seen != last_seen {
                last_seen = seen;
                last_change = Instant::now();
            } else if last_change.elapsed() >= STALL {
                self.record_stall(&waiting);
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    fn record_stall(&self, waiting: &[(usize, Owner)]) {
        let bytes: u64 = waiting
            .iter()
            .filter_map(|&(i, _)| self.chunks.get(i))
            .map(|c| c.len)
            .sum();
        let mut pids: Vec<u32> = waiting.iter().map(|&(_, o)| o.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let why = format!(
            "stopped waiting after {} s without progress for {} chunk(s) claimed by pid {:?}",
            STALL.as_secs(),
            waiting.len(),
            pids
        );
        if let Ok(mut slot) = self.tally.stalled.lock() {
            slot.get_or_insert((bytes, why));
        }
    }

    /// Warms chunk `i`, claimed by this rank, and marks it done.
    fn handle(&self, i: usize, scratch: &mut Vec<u8>, pages: &mut Vec<u8>) -> Result<()> {
        let (Some(&chunk), Some(word)) = (self.chunks.get(i), self.states.get(i)) else {
            return Ok(());
        };
        let (Some(target), Some(&method)) =
            (self.targets.get(chunk.file), self.methods.get(chunk.file))
        else {
            return Ok(());
        };
        if let Ok(mut handled) = self.tally.handled.lock() {
            handled.push(i);
        }
        let resident = target.resident_quick(chunk.offset, chunk.len, pages);
        if resident != Some(chunk.len) {
            self.tally
                .warmed
                .fetch_add(chunk.len - resident.unwrap_or(0), Ordering::Relaxed);
            let file = if self.skipped_ahead(i, target) {
                target.bounded()
            } else {
                &target.file
            };
            match (method, resident) {
                (PrefetchMethod::WillNeed, Some(_)) => {
                    advise_and_wait(target, chunk, scratch, pages)?
                }
                _ => read_chunk(target, file, chunk, scratch)?,
            }
        }
        if let Some(f) = self.on_chunk {
            f(&target.path, chunk.offset..chunk.offset + chunk.len);
        }
        // Fails only if another rank took the chunk over, taking this
        // process for dead; it is warm either way.
        swap(word, self.me.word(), DONE);
        self.tally.progress.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the memory guard skipped a chunk of the same file that the
    /// kernel's read-ahead for chunk `i` could reach (two read-ahead windows
    /// on, the most it keeps ahead of a sequential reader).
    fn skipped_ahead(&self, i: usize, target: &Target) -> bool {
        let Some(chunk) = self.chunks.get(i) else {
            return false;
        };
        let reach = chunk.offset + chunk.len + 2 * target.advice_piece;
        (i + 1..self.chunks.len())
            .map_while(|j| {
                let next = self.chunks.get(j)?;
                (next.file == chunk.file && next.offset < reach).then_some(j)
            })
            .any(|j| {
                self.states
                    .get(j)
                    .is_some_and(|w| w.load(Ordering::Relaxed) == SKIPPED)
            })
    }

    /// Checks that the chunks this rank handled are resident, and reads
    /// what is not, once. Returns the bytes read again.
    fn verify(&self, handled: &[usize]) -> Result<u64> {
        let mut scratch = Vec::new();
        let mut pages = Vec::new();
        let mut reread = 0;
        for &i in handled {
            let Some(&chunk) = self.chunks.get(i) else {
                continue;
            };
            let Some(target) = self.targets.get(chunk.file) else {
                continue;
            };
            // Landed, not merely present: a page can be in the page cache
            // without its data (a large folio only partly read), and a read
            // completes it.
            if let Some(r) = target.landed(chunk.offset, chunk.len, &mut pages) {
                if r < chunk.len {
                    read_chunk(target, &target.file, chunk, &mut scratch)?;
                    reread += chunk.len - r;
                }
            }
        }
        Ok(reread)
    }
}

/// Moves a chunk word from `from` to `to` if it still holds `from`: every
/// change of a chunk's state is one compare-and-swap, so of two ranks that
/// race for a chunk exactly one wins.
fn swap(word: &AtomicU64, from: u64, to: u64) -> bool {
    word.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

/// Reads a chunk through the page cache into a scratch buffer, in reads of
/// at most 8 MiB. A file that ends early ends the chunk (the load reports
/// the truncation).
fn read_chunk(target: &Target, file: &File, chunk: Chunk, scratch: &mut Vec<u8>) -> Result<()> {
    let want = usize::try_from(chunk.len.min(SCRATCH))
        .unwrap_or(1 << 20)
        .max(1);
    if scratch.len() < want {
        scratch.resize(want, 0);
    }
    let mut offset = chunk.offset;
    let end = chunk.offset + chunk.len;
    while offset < end {
        let len = usize::try_from(end - offset)
            .unwrap_or(usize::MAX)
            .min(scratch.len());
        let Some(buf) = scratch.get_mut(..len) else {
            break;
        };
        os::read_at_least(file, buf, 0, offset)
            .map_err(|(at, e)| Error::io("prefetching", &target.path, Some(at), e))?;
        offset += len as u64;
    }
    Ok(())
}

/// Asks for a chunk with `WILLNEED` in pieces the kernel honours whole,
/// waits while its pages arrive, and reads what has not arrived once
/// nothing has for a while (the kernel may drop read-ahead under load).
fn advise_and_wait(
    target: &Target,
    chunk: Chunk,
    scratch: &mut Vec<u8>,
    pages: &mut Vec<u8>,
) -> Result<()> {
    let end = chunk.offset + chunk.len;
    let piece = target.advice_piece.max(1);
    let mut offset = chunk.offset;
    while offset < end {
        let len = piece.min(end - offset);
        if os::advise_willneed(&target.file, offset, len).is_err() {
            return read_chunk(target, &target.file, chunk, scratch);
        }
        offset += len;
    }
    let mut last = 0;
    let mut last_change = Instant::now();
    loop {
        match target.landed(chunk.offset, chunk.len, pages) {
            Some(r) if r >= chunk.len => return Ok(()),
            Some(r) if r > last => {
                last = r;
                last_change = Instant::now();
            }
            Some(_) if last_change.elapsed() < WILLNEED_IDLE => {}
            _ => return read_chunk(target, &target.file, chunk, scratch),
        }
        std::thread::sleep(WILLNEED_POLL);
    }
}
