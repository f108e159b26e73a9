//! How many reads a load keeps in flight, found by measurement while it runs: start at the filesystem's default, double while throughput still rises, settle where it stops.
//!
//! The right number of readers is the mount's (a daemon's threads, a server's connections) and
//! written nowhere, so the read engine measures: each window of completed reads gives a
//! throughput (but the first, the readers' start); a doubling that does not raise it by `GAIN`
//! is undone. Only the count changes: on FUSE a larger `pread` reaches the daemon as more 1 MiB
//! requests one after another, not more in flight.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The most reads in flight a load grows to.
///
/// NOTE: a reader costs a thread, no memory of its own. 64 covers the mounts measured (an 8 ms,
/// 32-thread FUSE daemon wants 32) with room for network filesystems that want more.
pub(crate) const MAX_READERS: usize = 64;

/// Readers when the load converts: each holds a scratch buffer, within the guard's margin.
pub(crate) const MAX_CONVERTING_READERS: usize = 16;

/// The throughput a doubling must add to be kept.
///
/// NOTE: above the noise between windows at a fixed count, far below what a
/// doubling that pays gains (BENCHMARKS.md, "adapt.rs: GAIN").
pub(crate) const GAIN: f64 = 1.15;

/// The shortest window a throughput is measured over (every allowed reader must finish a read).
const WINDOW: Duration = Duration::from_millis(100);

/// Where a load's reads in flight start and how far they may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub start: usize,
    pub max: usize,
}

impl Concurrency {
    /// A count the caller set (`Loader::io_concurrency`): no growing.
    pub fn pinned(readers: usize) -> Concurrency {
        let n = readers.max(1);
        Concurrency { start: n, max: n }
    }

    /// The filesystem's default start, growing up to [`MAX_READERS`].
    pub(crate) fn adaptive(start: usize) -> Concurrency {
        let start = start.max(1);
        Concurrency {
            start,
            max: MAX_READERS.max(start),
        }
    }

    /// The same, capped for a load whose readers need scratch buffers.
    pub(crate) fn converting(self) -> Concurrency {
        Concurrency {
            start: self.start,
            max: self.max.min(MAX_CONVERTING_READERS.max(self.start)),
        }
    }
}

/// What the count settled on, and why: for the report.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// The readers allowed at the end.
    pub readers: usize,
    /// Each count tried and the throughput it gave, in GiB/s.
    pub steps: Vec<(usize, f64)>,
    pub why: SettleReason,
}

/// Why the count stopped where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleReason {
    /// The caller set it.
    Pinned,
    /// Doubling it gained less than `GAIN`.
    NoGain,
    /// It reached the most allowed.
    Max,
    /// The load ended before a measurement said more.
    Ended,
}

/// The controller the readers of one run share.
pub(crate) struct Control {
    allowed: AtomicUsize,
    finished: AtomicBool,
    max: usize,
    pinned: bool,
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    /// Whether the first window, the readers' start, has passed: it is not measured.
    warmed: bool,
    start: Instant,
    bytes: u64,
    reads: usize,
    best: Option<(usize, f64)>,
    steps: Vec<(usize, f64)>,
    why: Option<SettleReason>,
}

impl State {
    /// A new window.
    fn restart(&mut self) {
        (self.start, self.bytes, self.reads) = (Instant::now(), 0, 0);
    }
}

impl Control {
    /// A controller for `concurrency`, with at most `jobs` readers useful.
    pub(crate) fn new(concurrency: Concurrency, jobs: usize) -> Control {
        let max = concurrency.max.clamp(1, jobs.max(1));
        let start = concurrency.start.clamp(1, max);
        let pinned = concurrency.start >= concurrency.max;
        Control {
            allowed: AtomicUsize::new(start),
            finished: AtomicBool::new(false),
            max,
            pinned,
            state: Mutex::new(State {
                warmed: false,
                start: Instant::now(),
                bytes: 0,
                reads: 0,
                best: None,
                steps: Vec::new(),
                why: pinned.then_some(SettleReason::Pinned),
            }),
            wake: Condvar::new(),
        }
    }

    /// The most readers that may ever run: the threads to start.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// Waits until reader `index` may read; `false` once the run is over.
    pub(crate) fn wait_turn(&self, index: usize) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if self.finished.load(Ordering::Acquire) {
                return false;
            }
            if index < self.allowed.load(Ordering::Acquire) {
                return true;
            }
            state = self
                .wake
                .wait_timeout(state, WINDOW)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The run is over (no job left, or a failure): every waiting reader leaves.
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::Release);
        let _state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }

    /// A read of `bytes` finished: counts it, and at the end of a window decides whether to
    /// double the readers, keep them, or go back.
    pub(crate) fn completed(&self, bytes: u64) {
        if self.pinned {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.why.is_some() {
            return;
        }
        state.bytes += bytes;
        state.reads += 1;
        let allowed = self.allowed.load(Ordering::Acquire);
        let elapsed = state.start.elapsed();
        if elapsed < WINDOW || state.reads < allowed {
            return;
        }
        if !state.warmed {
            state.warmed = true;
            return state.restart();
        }
        let rate = state.bytes as f64 / (1u64 << 30) as f64 / elapsed.as_secs_f64();
        state.steps.push((allowed, rate));
        let keep = match state.best {
            None => true,
            Some((_, best)) => rate >= best * GAIN,
        };
        if keep {
            state.best = Some((allowed, rate));
            if allowed >= self.max {
                state.why = Some(SettleReason::Max);
            } else {
                self.allowed
                    .store((allowed * 2).min(self.max), Ordering::Release);
                self.wake.notify_all();
            }
        } else {
            // Back to the count that did as well: the extra readers finish their read and wait.
            let (readers, _) = state.best.unwrap_or((allowed, rate));
            self.allowed.store(readers, Ordering::Release);
            state.why = Some(SettleReason::NoGain);
        }
        state.restart();
    }

    /// What the count settled on.
    pub(crate) fn settled(&self) -> Settled {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        Settled {
            readers: self.allowed.load(Ordering::Acquire),
            steps: state.steps.clone(),
            why: state.why.unwrap_or(SettleReason::Ended),
        }
    }
}

#[cfg(test)]
mod tests;
