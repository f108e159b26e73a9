//! Progress for callers: bytes and files done out of their totals, handed to the caller's callback a few times a second, never printed.

use std::fmt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What a load has done so far, as `Loader::on_progress` hands it to the
/// caller: the bytes this phase reads (a lazily mapped file counts nothing)
/// and the files it handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// What is being done.
    pub phase: Phase,
    /// Bytes done.
    pub bytes_done: u64,
    /// Bytes this phase does in all.
    pub bytes_total: u64,
    /// Files done.
    pub files_done: usize,
    /// Files this phase handles in all.
    pub files_total: usize,
    /// Time since the phase began.
    pub elapsed: Duration,
}

impl Progress {
    /// Bytes done per second of `elapsed`, in GiB/s.
    pub fn gib_per_s(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.bytes_done as f64 / (1u64 << 30) as f64 / secs
        } else {
            0.0
        }
    }
}

/// The phase a [`Progress`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// Warming the page cache (`Loader::prefetch`).
    Prefetch,
    /// Reading buffered files, converting, populating maps.
    Read,
    /// Streaming tensors (`Checkpoint::for_each`).
    Stream,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Prefetch => "prefetch",
            Phase::Read => "read",
            Phase::Stream => "stream",
        })
    }
}

/// The caller's callback.
pub type Callback = Arc<dyn Fn(&Progress) + Send + Sync>;

/// The least time between two calls of the callback, but for the last.
///
/// NOTE: 20 calls a second are smooth for a progress bar; a call per read
/// would be thousands a second on a fast disk.
const INTERVAL: Duration = Duration::from_millis(50);

/// Counts one phase's progress and calls the callback at most every
/// `INTERVAL` (checked without a lock on the hot path), and once at the
/// end.
pub struct Meter {
    callback: Option<Callback>,
    phase: Phase,
    bytes_total: u64,
    files_total: usize,
    bytes: AtomicU64,
    files: AtomicUsize,
    start: Instant,
    /// Nanoseconds since `start` of the last call.
    last: AtomicU64,
    /// Serializes the calls, so that they arrive in order.
    calling: Mutex<()>,
}

impl Meter {
    /// A meter for a phase of `bytes_total` bytes over `files_total` files;
    /// it does nothing without a callback.
    pub fn new(
        callback: Option<&Callback>,
        phase: Phase,
        bytes_total: u64,
        files_total: usize,
    ) -> Meter {
        Meter {
            callback: callback.cloned(),
            phase,
            bytes_total,
            files_total,
            bytes: AtomicU64::new(0),
            files: AtomicUsize::new(0),
            start: Instant::now(),
            last: AtomicU64::new(0),
            calling: Mutex::new(()),
        }
    }

    /// `bytes` more are done.
    pub fn add(&self, bytes: u64) {
        if self.callback.is_none() {
            return;
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.maybe_call(false);
    }

    /// One more file is done.
    pub fn file_done(&self) {
        if self.callback.is_none() {
            return;
        }
        self.files.fetch_add(1, Ordering::Relaxed);
        self.maybe_call(false);
    }

    /// The phase is over: one last call, whatever the time.
    pub fn finish(&self) {
        self.maybe_call(true);
    }

    fn maybe_call(&self, last: bool) {
        let Some(callback) = &self.callback else {
            return;
        };
        let now = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let previous = self.last.load(Ordering::Relaxed);
        let due = now.saturating_sub(previous) >= INTERVAL.as_nanos() as u64;
        if !last
            && (!due
                || self
                    .last
                    .compare_exchange(previous, now, Ordering::AcqRel, Ordering::Relaxed)
                    .is_err())
        {
            return;
        }
        let Ok(_order) = self.calling.lock() else {
            return;
        };
        callback(&Progress {
            phase: self.phase,
            bytes_done: self.bytes.load(Ordering::Relaxed).min(self.bytes_total),
            bytes_total: self.bytes_total,
            files_done: self.files.load(Ordering::Relaxed).min(self.files_total),
            files_total: self.files_total,
            elapsed: self.start.elapsed(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_few_ordered_and_end_with_the_totals() {
        let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
        let sink = Arc::clone(&seen);
        let callback: Callback = Arc::new(move |p: &Progress| sink.lock().unwrap().push(*p));
        let meter = Meter::new(Some(&callback), Phase::Read, 1000, 2);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..250 {
                        meter.add(1);
                    }
                });
            }
        });
        meter.file_done();
        meter.file_done();
        meter.finish();
        let seen = seen.lock().unwrap();
        // A thousand additions within far less than a second: a handful of
        // calls, not one per addition.
        assert!(seen.len() <= 5, "{} calls", seen.len());
        let last = seen.last().unwrap();
        assert_eq!(
            (
                last.bytes_done,
                last.bytes_total,
                last.files_done,
                last.files_total
            ),
            (1000, 1000, 2, 2)
        );
        assert!(seen.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done));
        assert_eq!(last.phase, Phase::Read);
    }

    #[test]
    fn without_a_callback_nothing_is_counted() {
        let meter = Meter::new(None, Phase::Stream, 10, 1);
        meter.add(5);
        meter.finish();
        assert_eq!(meter.bytes.load(Ordering::Relaxed), 0);
    }
}
