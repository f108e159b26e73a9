//! The check of a complete file written to a cache: its digest hashed a step at a time (by the read that completed it, the check's own thread, or whoever waits for it), then the file published where it matches.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::super::check::{Hasher, View, hash_step};
use super::{Phase, TempFile, Write, lock};
use crate::source::NotCached;

/// How often a check marks the partial file as changed (its modification
/// time), for the processes that wait for its writer.
const CHECK_SHOWN: Duration = Duration::from_secs(1);

/// How many cache files this process is filling as a load's destination
/// (a map of the file), and what is told when none is left.
static FILLING: Mutex<usize> = Mutex::new(0);
static FILLS_OVER: Condvar = Condvar::new();

/// The longest a check's thread waits for the fills to end.
const FILLS_WAIT: Duration = Duration::from_secs(60);

/// A cache file being filled as a load's destination: the checks' threads
/// of the process wait until none is.
///
/// NOTE: in the idle class the check still took a tenth of the CPU time of
/// a two-CPU load (the moments the readers wait on the network), and its
/// memory traffic slowed them; a check is work the load does not wait for
/// (BENCHMARKS.md, "cache/write_check.rs: Filling").
pub(super) struct Filling(());

impl Filling {
    pub(super) fn start() -> Filling {
        *lock(&FILLING) += 1;
        Filling(())
    }
}

impl Drop for Filling {
    fn drop(&mut self) {
        let mut filling = lock(&FILLING);
        *filling = filling.saturating_sub(1);
        if *filling == 0 {
            FILLS_OVER.notify_all();
        }
    }
}

/// Waits until this process fills no cache file as a load's destination,
/// at most [`FILLS_WAIT`].
pub(super) fn after_fills() {
    let deadline = Instant::now() + FILLS_WAIT;
    let mut filling = lock(&FILLING);
    while *filling > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        filling = FILLS_OVER
            .wait_timeout(filling, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// A complete file whose digest is being checked.
pub(super) struct Checking {
    /// Taken to publish it (its drop then tidies the record, before the
    /// check is said to be over).
    pub(super) begun: Mutex<Option<Arc<TempFile>>>,
    pub(super) file: Arc<File>,
    /// A map of the file, hashed from where it holds the bytes.
    pub(super) view: Option<Arc<View>>,
    /// The hash and the bytes it has taken so far: taken a step at a time
    /// by the check's thread, or by whoever waits for it
    /// ([`Write::settle`]); `None` once every byte is hashed.
    pub(super) job: Mutex<Option<(Hasher, u64)>>,
}

impl Write {
    /// Hashes the complete file a step at a time until it is all hashed,
    /// then checks and publishes it (whoever takes the last step does).
    pub(super) fn check(&self, checking: &Checking) {
        let mut scratch = Vec::new();
        let view = checking.view.as_deref();
        let mut shown = Instant::now();
        loop {
            // A process waiting for this writer sees the check as activity.
            if shown.elapsed() > CHECK_SHOWN {
                let _ = checking.file.set_modified(std::time::SystemTime::now());
                shown = Instant::now();
            }
            let mut job = lock(&checking.job);
            let Some((hasher, at)) = job.as_mut() else {
                // Hashed by the other, which publishes it.
                return;
            };
            if *at < self.len {
                let step = hash_step(hasher, (&checking.file, view), at, self.len, &mut scratch);
                if let Err(e) = step {
                    *job = None;
                    drop(job);
                    drop(lock(&checking.begun).take());
                    self.conclude(Err(NotCached::of_io(&e)));
                    return;
                }
                continue;
            }
            let taken = (job.take(), lock(&checking.begun).take());
            drop(job);
            if let (Some((hasher, _)), Some(begun)) = taken {
                let outcome = self.publish(&begun, hasher);
                drop(begun);
                self.conclude(outcome);
            }
            return;
        }
    }

    /// Waits for the file's check where one is under way, taking its steps
    /// here (at this thread's priority) rather than waiting for the check's
    /// thread to get the CPU.
    pub(crate) fn settle(&self) {
        let checking = match &self.lock().phase {
            Phase::Checking(checking) => Arc::clone(checking),
            _ => return,
        };
        self.check(&checking);
        let mut state = self.lock();
        while matches!(state.phase, Phase::Checking(_)) {
            state = self
                .settled
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Checks the complete, hashed file and publishes it.
    fn publish(&self, begun: &TempFile, hasher: Hasher) -> Result<(), NotCached> {
        match hasher.mismatch(self.check) {
            Some((expected, actual)) => {
                // Nothing of it is kept for a later load.
                begun.discard.store(true, Ordering::Relaxed);
                Err(NotCached::Mismatch { expected, actual })
            }
            None if self.cancel.is_set() => Err(NotCached::Cancelled),
            None => match self.target.publish(begun) {
                Ok(true) => Ok(()),
                Ok(false) => Err(NotCached::PublishedElsewhere),
                Err(e) => Err(NotCached::of_io(&e)),
            },
        }
    }

    /// The check is over, and so is the write.
    fn conclude(&self, outcome: Result<(), NotCached>) {
        self.lock().phase = Phase::Done(outcome);
        self.settled.notify_all();
    }
}

/// Waits for a write's check when dropped ([`Write::settle`]).
pub(super) struct Settle(pub(super) Arc<Write>);

impl Drop for Settle {
    fn drop(&mut self) {
        self.0.settle();
    }
}
