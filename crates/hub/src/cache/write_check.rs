//! The check of a complete file written to a cache: its digest hashed a step at a time (by the read that completed it, the check's own thread, or whoever waits for it), bytes an earlier load left fetched again where it does not match, then the file published where it matches.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::super::check::{Hasher, View, hash_step};
use super::{Phase, TempFile, Write, lock};
use crate::os;
use crate::source::NotCached;
use crate::verify::InOrder;

/// Fetches bytes of the file again from its store (a proof's mend).
pub(crate) type Refetch<'a> = &'a (dyn Fn(u64, &mut [u8]) -> io::Result<()> + Sync);

/// Bytes fetched again at a time by a proof that found the digest wrong.
const REFETCH_STEP: usize = 8 << 20;

/// How many cache files this process is filling as a load's destination.
static FILLING: Mutex<usize> = Mutex::new(0);
static FILLS_OVER: Condvar = Condvar::new();

/// The longest a check's thread waits for the fills to end.
const FILLS_WAIT: Duration = Duration::from_secs(60);

/// A cache file being filled as a load's destination: the checks wait until none is.
///
/// NOTE: in the idle class the check still took a tenth of a two-CPU load's
/// CPU time and slowed it with memory traffic (BENCHMARKS.md,
/// "cache/write_check.rs: Filling").
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

/// Waits, at most [`FILLS_WAIT`], until this process fills no cache file as a
/// load's destination (the partial file's heartbeat goes on meanwhile).
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
    /// Taken to publish it (its drop tidies the record before the check ends).
    pub(super) begun: Mutex<Option<Arc<TempFile>>>,
    pub(super) file: Arc<File>,
    pub(super) view: Option<Arc<View>>,
    /// The hash, in file order, taken a step at a time by the check's thread
    /// or a waiter ([`Write::settle`]); `None` once every byte is hashed.
    pub(super) job: Mutex<Option<InOrder<'static, Hasher>>>,
    /// The ranges an earlier load left, unproven until [`Write::prove`].
    pub(super) proof: Mutex<Option<Vec<Range<u64>>>>,
}

/// A proof's means of mending the file: the ranges to fetch again, and how.
struct Repair<'a> {
    unproven: Vec<Range<u64>>,
    refetch: Refetch<'a>,
}

impl Write {
    /// Hashes the complete file a step at a time; whoever takes the last
    /// step checks and publishes it.
    pub(super) fn check(&self, checking: &Checking) {
        let _ = self.check_repairing(checking, None);
    }

    /// Where the complete file holds bytes an earlier load left, checks its
    /// digest before the load hands its tensors out; where it does not
    /// match, fetches those bytes again through `refetch`, checks again and
    /// publishes. An error where they could not be fetched: the load fails.
    pub(crate) fn prove(&self, refetch: Refetch<'_>) -> io::Result<()> {
        let checking = match &self.lock().phase {
            Phase::Checking(checking) => Arc::clone(checking),
            _ => return Ok(()),
        };
        let Some(unproven) = lock(&checking.proof).take() else {
            return Ok(());
        };
        self.check_repairing(&checking, Some(Repair { unproven, refetch }))
    }

    /// [`check`](Self::check), mending the file with `repair` where given.
    fn check_repairing(
        &self,
        checking: &Checking,
        mut repair: Option<Repair<'_>>,
    ) -> io::Result<()> {
        let mut scratch = Vec::new();
        let view = checking.view.as_deref();
        loop {
            let mut job = lock(&checking.job);
            let Some(hash) = job.as_mut() else {
                // Hashed by the other, which publishes it.
                return Ok(());
            };
            if hash.next() < self.len {
                let step = hash_step(hash, (&checking.file, view), self.len, &mut scratch);
                if let Err(e) = step {
                    *job = None;
                    drop(job);
                    let begun = lock(&checking.begun).take();
                    self.conclude(Err(NotCached::of_io(&e)));
                    drop(begun);
                    // Unproven bytes cannot be handed out.
                    return match repair {
                        Some(_) => Err(e),
                        None => Ok(()),
                    };
                }
                continue;
            }
            let taken = (job.take(), lock(&checking.begun).take());
            drop(job);
            let (Some(hash), Some(begun)) = taken else {
                return Ok(());
            };
            let mut mismatch = hash.into_inner().mismatch(self.check);
            if let (Some(_), Some(repair)) = (&mismatch, repair.take()) {
                match self.repair(checking, repair) {
                    Ok(again) => mismatch = again,
                    Err(e) => {
                        begun.discard.store(true, Ordering::Relaxed);
                        self.conclude(Err(NotCached::of_io(&e)));
                        return Err(e);
                    }
                }
            }
            let outcome = self.publish(&begun, mismatch);
            drop(begun);
            self.conclude(outcome);
            return Ok(());
        }
    }

    /// Fetches the unproven ranges again and hashes the file anew: `None` where it matches.
    fn repair(
        &self,
        checking: &Checking,
        repair: Repair<'_>,
    ) -> io::Result<Option<(String, String)>> {
        let mut buffer = vec![0u8; REFETCH_STEP];
        for range in &repair.unproven {
            let mut at = range.start;
            while at < range.end {
                let n =
                    usize::try_from(range.end - at).map_or(REFETCH_STEP, |n| n.min(REFETCH_STEP));
                let Some(bytes) = buffer.get_mut(..n) else {
                    break;
                };
                (repair.refetch)(at, bytes)?;
                os::write_all_at(&checking.file, bytes, at)?;
                self.refetched.fetch_add(n as u64, Ordering::Relaxed);
                let _ = self
                    .resumed
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                        Some(r.saturating_sub(n as u64))
                    });
                at += n as u64;
            }
        }
        let mut hash = Hasher::start(self.check, self.len);
        let mut scratch = Vec::new();
        let view = checking.view.as_deref();
        while hash.next() < self.len {
            hash_step(&mut hash, (&checking.file, view), self.len, &mut scratch)?;
        }
        Ok(hash.into_inner().mismatch(self.check))
    }

    /// Waits for the file's check, taking its steps here (at this thread's priority).
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

    /// Publishes the hashed file where it matched and the load was not cancelled.
    fn publish(
        &self,
        begun: &TempFile,
        mismatch: Option<(String, String)>,
    ) -> Result<(), NotCached> {
        let returned = self.returned.load(Ordering::Relaxed);
        match mismatch {
            Some((expected, actual)) => {
                // Nothing of it is kept for a later load.
                begun.discard.store(true, Ordering::Relaxed);
                Err(NotCached::Mismatch { expected, actual })
            }
            None if self.cancel.is_set() && !returned => Err(NotCached::Cancelled),
            None => match self.target.publish(begun) {
                Ok(true) => Ok(()),
                Ok(false) => Err(NotCached::PublishedElsewhere),
                Err(e) => Err(NotCached::of_io(&e)),
            },
        }
    }

    /// The check is over, and so is the write.
    fn conclude(&self, outcome: Result<(), NotCached>) {
        if let Err(NotCached::Mismatch { expected, actual }) = &outcome {
            // The store's bytes are not the ones its digest names.
            crate::trace::traced! {
                tracing::warn!(
                    target: "safeload",
                    file = %self.target.shown().display(),
                    expected = %expected,
                    actual = %actual,
                    "a fetched file does not hash to the store's digest: not cached"
                );
            }
            let _ = (expected, actual);
        }
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
