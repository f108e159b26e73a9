//! A rank's readers: claim a free chunk, else take over a chunk whose holder died or stopped (`takeover.rs`) or wait for it; warm it (`warm.rs`: by reading or by `WILLNEED`), beating the rank's heartbeat as they go; then check that what they warmed landed.

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::claims::{Claims, Reader};
use super::plan::Chunk;
use super::queue::{
    ChunkState, DONE, FREE, SKIPPED, SlotState, chunk_state, chunk_words, heartbeat_words,
    slot_state, slot_words,
};
use super::queue_file::Queue;
use super::residency::Target;
use super::takeover::{self, Verdict, Watch};
use super::warm::{advise_and_wait, read_chunk};
use crate::adapt::Concurrency;
use crate::cancel::Cancel;
use crate::coord::Owner;
use crate::error::{Error, Result};
use crate::extras::ChunkCallback;
use crate::jobs;
use crate::policy::PrefetchMethod;
use crate::progress::Meter;
use crate::report::SkipReason;

/// How often a reader with nothing to claim looks at the queue again.
const POLL: Duration = Duration::from_millis(2);

/// A reader gives up on live ranks' chunks (reported as not warmed) when no
/// chunk has finished for this long: the last resort, for what the take-over
/// rule (`takeover.rs`) leaves alone.
const STALL: Duration = Duration::from_secs(60);

/// What the readers of one rank work from.
pub(crate) struct Work<'a> {
    pub targets: &'a [Target],
    pub methods: &'a [PrefetchMethod],
    pub chunks: &'a [Chunk],
    pub states: &'a [AtomicU64],
    pub me: Owner,
    /// Whether other processes claim from the same states.
    pub shared: bool,
    pub claimable: Range<usize>,
    pub on_chunk: Option<&'a ChunkCallback>,
    pub meter: &'a Meter,
    /// The queue's rank slots and their heartbeats (empty for a local queue).
    pub slots: &'a [AtomicU64],
    pub heartbeats: &'a [AtomicU64],
    /// This rank's heartbeat, where it holds a slot.
    pub heartbeat: Option<&'a AtomicU64>,
    pub tally: Tally,
    /// Where a chunk's bytes go instead of the page cache (a node copy).
    pub sink: Option<&'a dyn Sink>,
    pub cancel: &'a Cancel,
}

/// A destination the chunks are read into, each straight into its place.
pub(crate) trait Sink: Sync {
    /// Reads `chunk` into its place, calling `beat` as pieces of it land.
    fn fill(&self, chunk: Chunk, beat: &dyn Fn()) -> Result<()>;
}

/// What a rank's readers did so far, updated as they go.
#[derive(Default)]
pub(crate) struct Tally {
    warmed: AtomicU64,
    handled: Mutex<Vec<usize>>,
    stalled: Mutex<Option<(u64, SkipReason)>>,
    pub(super) failed: AtomicBool,
    error: Mutex<Option<Error>>,
    /// Chunks of this rank finished (the stall guard watches it).
    progress: AtomicUsize,
    /// Chunks this rank read, and their nanoseconds: the take-over rule's
    /// expected read time.
    reads: AtomicU64,
    read_nanos: AtomicU64,
    taken_over: Mutex<Vec<(u32, Duration)>>,
}

/// A chunk this rank holds, and the claim word it wrote (marked done only
/// from that word).
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    pub index: usize,
    pub claim: u64,
}

impl Tally {
    /// The mean time this rank took to warm a chunk that was not resident.
    fn mean_read(&self) -> Option<Duration> {
        let reads = self.reads.load(Ordering::Relaxed);
        let nanos = self.read_nanos.load(Ordering::Relaxed);
        (reads > 0).then(|| Duration::from_nanos(nanos / reads))
    }
}

/// What a rank's readers did, once they are done.
pub(crate) struct Outcome {
    pub handled: usize,
    /// Bytes this rank found missing and warmed.
    pub warmed: u64,
    /// Bytes read again because they had not landed.
    pub reread: u64,
    /// Bytes given up on after [`STALL`], and why.
    pub stalled: Option<(u64, SkipReason)>,
    /// Per chunk taken over from a live holder: its pid, the patience spent.
    pub taken_over: Vec<(u32, Duration)>,
}

impl<'a> Work<'a> {
    /// The readers of this rank over `queue`'s words, claiming in
    /// `claimable`: no page-cache targets, chunk callback or sink (set them
    /// after).
    pub(crate) fn over(
        queue: &'a Queue,
        chunks: &'a [Chunk],
        claimable: Range<usize>,
        meter: &'a Meter,
        cancel: &'a Cancel,
    ) -> Work<'a> {
        let (words, layout) = (queue.words(), queue.layout());
        Work {
            targets: &[],
            methods: &[],
            chunks,
            states: chunk_words(words, layout),
            me: Owner::current(),
            shared: queue.is_shared(),
            claimable,
            on_chunk: None,
            meter,
            slots: slot_words(words, layout),
            heartbeats: heartbeat_words(words, layout),
            heartbeat: queue.heartbeat(),
            tally: Tally::default(),
            sink: None,
            cancel,
        }
    }

    /// Runs one reader per start, then checks that what they warmed landed.
    pub(crate) fn run(&self, starts: &[usize]) -> Result<Outcome> {
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
            taken_over: tally
                .taken_over
                .lock()
                .map(|t| t.clone())
                .unwrap_or_default(),
        })
    }

    /// Runs one reader per start, in the read loop (`jobs::drain`): the
    /// chunk queue is its source ([`Claims`]).
    fn run_readers(&self, starts: &[usize]) {
        if starts.is_empty() {
            return;
        }
        let claims = Claims {
            work: self,
            readers: starts
                .iter()
                .map(|&cursor| {
                    Mutex::new(Reader {
                        cursor,
                        watch: Watch::default(),
                    })
                })
                .collect(),
        };
        let concurrency = Concurrency::pinned(starts.len());
        let pieces = self.chunks.len().max(starts.len());
        let (result, _, _) = jobs::drain(
            &claims,
            concurrency,
            pieces,
            "safeload-prefetch",
            self.cancel,
        );
        if let Err(e) = result {
            self.tally.failed.store(true, Ordering::Relaxed);
            if let Ok(mut slot) = self.tally.error.lock() {
                slot.get_or_insert(e);
            }
        }
    }

    /// Claims the next free chunk at or after `cursor` in the claimable
    /// range, wrapping around.
    pub(super) fn claim_free(&self, cursor: &mut usize) -> Option<usize> {
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

    /// This rank runs: other ranks watch the count to tell a stopped rank
    /// from a busy one.
    pub(super) fn beat(&self) {
        if let Some(beat) = self.heartbeat {
            beat.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The heartbeat of `owner`, summed over its slots; `None` without one.
    fn beat_of(&self, owner: Owner) -> Option<u64> {
        let mut found: Option<u64> = None;
        for (slot, beat) in self.slots.iter().zip(self.heartbeats) {
            if slot_state(slot.load(Ordering::Acquire)) == Some(SlotState::Attached(owner)) {
                let beat = beat.load(Ordering::Relaxed);
                found = Some(found.unwrap_or(0).wrapping_add(beat));
            }
        }
        found
    }

    /// With nothing free: a chunk taken over (`takeover.rs`) once one may
    /// be; `None` when every chunk is finished or after [`STALL`].
    pub(super) fn wait_or_take_over(&self, watch: &mut Watch) -> Option<Held> {
        let mut last_seen = (usize::MAX, 0usize);
        let mut last_change = Instant::now();
        loop {
            if self.tally.failed.load(Ordering::Relaxed) {
                return None;
            }
            self.beat();
            let patience = takeover::patience(self.tally.mean_read());
            let now = Instant::now();
            let mut terminal = 0usize;
            let mut waiting: Vec<(usize, Owner)> = Vec::new();
            // Per holder, looked up once a pass: alive, and quiet for how long.
            let mut holders: Vec<(Owner, bool, Option<Duration>)> = Vec::new();
            for i in self.claimable.clone() {
                let Some(word) = self.states.get(i) else {
                    continue;
                };
                let seen = word.load(Ordering::Acquire);
                let claim = match chunk_state(seen) {
                    Some(ChunkState::Free) if swap(word, FREE, self.me.word()) => {
                        return Some(Held {
                            index: i,
                            claim: self.me.word(),
                        });
                    }
                    Some(ChunkState::Claimed(claim)) => claim,
                    Some(ChunkState::Free) => continue,
                    _ => {
                        terminal += 1;
                        continue;
                    }
                };
                let owner = claim.owner;
                let (alive, quiet) = match holders.iter().find(|h| h.0 == owner) {
                    Some(&(_, alive, quiet)) => (alive, quiet),
                    None if owner == self.me => (true, None),
                    None => {
                        let alive = owner.alive();
                        let quiet = self.beat_of(owner).map(|b| watch.quiet(owner, b, now));
                        holders.push((owner, alive, quiet));
                        (alive, quiet)
                    }
                };
                match takeover::verdict(claim, self.me, alive, quiet, patience) {
                    Verdict::TakeOver(mine) if swap(word, seen, mine.word()) => {
                        // Said in the report: its bytes are read twice.
                        if let (true, Ok(mut taken)) = (alive, self.tally.taken_over.lock()) {
                            taken.push((owner.pid, patience));
                        }
                        return Some(Held {
                            index: i,
                            claim: mine.word(),
                        });
                    }
                    // Lost the race to another taker, or to the holder.
                    Verdict::TakeOver(_) => {}
                    Verdict::Wait => waiting.push((i, owner)),
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
        let why = SkipReason::Stalled {
            seconds: STALL.as_secs(),
            chunks: waiting.len(),
            pids,
        };
        if let Ok(mut slot) = self.tally.stalled.lock() {
            slot.get_or_insert((bytes, why));
        }
    }

    /// Warms the chunk this rank holds (or reads it into the sink), and
    /// marks it done.
    pub(super) fn handle(
        &self,
        held: Held,
        scratch: &mut Vec<u8>,
        pages: &mut Vec<u8>,
    ) -> Result<()> {
        let Held { index: i, claim } = held;
        let (Some(&chunk), Some(word)) = (self.chunks.get(i), self.states.get(i)) else {
            return Ok(());
        };
        if let Some(sink) = self.sink {
            self.note_handled(i);
            self.timed(chunk.len, || sink.fill(chunk, &|| self.beat()))?;
        } else {
            let (Some(target), Some(&method)) =
                (self.targets.get(chunk.file), self.methods.get(chunk.file))
            else {
                return Ok(());
            };
            self.note_handled(i);
            let resident = target.resident_quick(chunk.offset, chunk.len, pages);
            if resident != Some(chunk.len) {
                // Before a chunk the guard skipped, `WILLNEED` of exactly this
                // chunk: a read's read-ahead would warm part of the skipped one
                // (a second open with read-ahead off may meet another version).
                let bounded = self.skipped_ahead(i, target);
                let missing = chunk.len - resident.unwrap_or(0);
                let advise = resident.is_some() && (method == PrefetchMethod::WillNeed || bounded);
                self.timed(missing, || match advise {
                    true => advise_and_wait(target, chunk, scratch, pages, &|| self.beat()),
                    false => read_chunk(target, &target.file, chunk, scratch),
                })?;
                self.beat();
            }
            if let Some(f) = self.on_chunk {
                f(&target.path, chunk.offset..chunk.offset + chunk.len);
            }
        }
        self.meter.add(chunk.len);
        // Fails only if another rank took the chunk over, taking this
        // process for dead or stopped: the bytes are in place either way.
        swap(word, claim, DONE);
        self.tally.progress.fetch_add(1, Ordering::Relaxed);
        self.beat();
        Ok(())
    }

    fn note_handled(&self, i: usize) {
        if let Ok(mut handled) = self.tally.handled.lock() {
            handled.push(i);
        }
    }

    /// Runs `read` of `bytes` not yet in place, timed for the take-over rule.
    fn timed(&self, bytes: u64, read: impl FnOnce() -> Result<()>) -> Result<()> {
        let started = Instant::now();
        self.tally.warmed.fetch_add(bytes, Ordering::Relaxed);
        read()?;
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.tally.read_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.tally.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the guard skipped a chunk of the same file within two
    /// read-ahead windows after chunk `i` (what read-ahead could reach).
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
            // Landed, not merely present: a large folio only partly read is
            // in the page cache without all its data.
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

/// Moves a chunk word from `from` to `to` if it still holds `from`: of two
/// ranks racing for a chunk exactly one wins.
pub(super) fn swap(word: &AtomicU64, from: u64, to: u64) -> bool {
    word.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
}

// A holder that is another live process (the parent, by `getppid(2)`) needs the Linux OS
// layer; the stub knows no parent and has no shared queue to race on.
#[cfg(all(test, target_os = "linux", not(safeload_os_stub)))]
mod tests {
    use super::*;
    use crate::os;
    use crate::prefetch::plan::{guard, plan_chunks};
    use crate::prefetch::queue::{Layout, chunk_words, heartbeat_words, init_words, slot_words};
    use crate::prefetch::residency::{open_targets, resolve_method};

    /// One reader of this process against a queue of two slots, on a cold
    /// file of four chunks, the last claimed by a live process that is not
    /// this one (the parent: alive, and never beating on its own). `beat`
    /// plays the holder from a thread. Returns chunks handled, the last
    /// chunk's word, and how long the reader took.
    fn race(beat: impl FnOnce(&AtomicU64, &AtomicU64) + Send) -> (usize, u64, Duration) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![3u8; 4 << 16]).unwrap();
        let targets = open_targets(&[path], None).unwrap();
        targets[0].file.sync_all().unwrap();
        os::evict(&targets[0].file).unwrap();
        let chunks = plan_chunks(&[4 << 16], 1 << 16);
        let layout = Layout {
            key: 1,
            chunk_size: 1 << 16,
            chunks: 4,
            total: 4 << 16,
            slots: 2,
        };
        let words: Vec<AtomicU64> = (0..layout.words()).map(|_| AtomicU64::new(0)).collect();
        let me = Owner::current();
        init_words(
            &words,
            &layout,
            &guard(&chunks, &[0; 4], None, true),
            Some(me),
        );
        let holder = Owner {
            pid: os::parent_pid(),
            tag: 0,
        };
        let (slots, beats) = (
            slot_words(&words, &layout),
            heartbeat_words(&words, &layout),
        );
        slots[1].store(holder.word(), Ordering::Relaxed);
        let states = chunk_words(&words, &layout);
        states[3].store(holder.word(), Ordering::Relaxed);
        let methods: Vec<_> = targets
            .iter()
            .map(|t| resolve_method(PrefetchMethod::Pread, t))
            .collect();
        let work = Work {
            targets: &targets,
            methods: &methods,
            chunks: &chunks,
            states,
            me,
            shared: true,
            claimable: 0..4,
            on_chunk: None,
            meter: &Meter::new(None, crate::progress::Phase::Prefetch, 0, 0),
            slots,
            heartbeats: beats,
            heartbeat: beats.first(),
            tally: Tally::default(),
            sink: None,
            cancel: &Cancel::NONE,
        };
        let clock = Instant::now();
        let outcome = std::thread::scope(|s| {
            s.spawn(|| beat(&beats[1], &states[3]));
            work.run(&[0]).unwrap()
        });
        (
            outcome.handled,
            states[3].load(Ordering::Relaxed),
            clock.elapsed(),
        )
    }

    #[test]
    fn a_quiet_live_holder_loses_its_chunk() {
        let (handled, last, took) = race(|_, _| {});
        assert_eq!((handled, last), (4, DONE), "taken over and done");
        // Its own reads of 64 KiB were quick: the rule waits its floor, 500 ms.
        assert!(took >= Duration::from_millis(500), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_beating_holder_keeps_its_chunk() {
        let (handled, last, took) = race(|beat, chunk| {
            let until = Instant::now() + Duration::from_millis(1200);
            while Instant::now() < until {
                beat.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
            chunk.store(DONE, Ordering::Release); // finished it itself
        });
        assert_eq!((handled, last), (3, DONE), "left to its holder");
        assert!(took >= Duration::from_millis(1200), "{took:?}");
    }
}
