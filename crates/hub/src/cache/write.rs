//! A file written to a cache as a load fetches it: its partial file (`temp.rs`), each read written to it as its body arrives, and published once every byte is in and the digest is the store's (`write_check.rs`); never failing the load.
//!
//! Publishing (a rename that never replaces) is the only step another process
//! relies on: writers that meet where advisory locks do nothing lose a race,
//! nothing more (the bytes are the same, and each is checked).

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};

use super::check::{Check, Hasher, View};
use super::partial;
use super::streams::{self, Streams};
pub(crate) use super::temp::TempFile;
use crate::os;
use crate::source::{CacheStore, CacheUse, CacheWrite, NotCached};

enum Phase {
    /// Nothing written yet: the reads so far are within the header, kept.
    Waiting { kept: Vec<(u64, Vec<u8>)> },
    /// The temporary file exists and reads are written to it.
    Writing(Box<Progress>),
    /// Every byte is in: its digest is being checked.
    Checking(Arc<Checking>),
    /// Published, or given up.
    Done(Result<(), NotCached>),
    /// Another process published the file while this one waited for its
    /// lock: read from there.
    Elsewhere(Arc<File>),
}

struct Progress {
    begun: Arc<TempFile>,
    /// Where the file is mapped as the load's destination: a read that lands
    /// there is in the file already (recorded and hashed, not written).
    mapped: Option<Range<usize>>,
    /// The file was handed out to be mapped, its map not yet registered.
    handed: bool,
    /// Held while the map is filled (until every byte is in).
    filling: Option<Filling>,
    /// The byte ranges written, sorted, merged.
    covered: Vec<Range<u64>>,
    /// The record of finished pieces (where the file is kept for a later
    /// load), and the pieces recorded.
    log: Option<Arc<Mutex<partial::PieceLog>>>,
    recorded: BTreeSet<u64>,
    /// The pieces' hashes taken as their bytes land.
    streams: Streams,
    /// A map of the file, where its space is reserved, to hash from.
    view: Option<Arc<View>>,
    /// The ranges an earlier load left, adopted: proven by the digest
    /// before the load returns ([`Write::prove`]).
    unproven: Vec<Range<u64>>,
}

struct State {
    phase: Phase,
    /// Landed reads are not written (the node copy brings the bytes).
    paused: bool,
    /// The file once every byte is in it, and where it is mapped.
    complete: Option<(Arc<File>, Option<Range<usize>>)>,
}

/// Bytes of an image written at a time.
const IMAGE_PIECE: usize = 64 << 20;

/// A file written to a cache as it is fetched.
pub(crate) struct Write {
    /// This write, for the thread that checks it once complete.
    me: Weak<Write>,
    target: Box<dyn Target>,
    len: u64,
    check: Check,
    /// Reads entirely before this offset (the header) are kept, not written.
    start_at: u64,
    state: Mutex<State>,
    /// Told when a check ends (the phase leaves `Checking`).
    settled: Condvar,
    /// The flags of the load that fetches it: set, nothing is published.
    cancel: crate::cancel::Cancel,
    /// Bytes an earlier load left in the partial file, checked and kept.
    resumed: AtomicU64,
    /// Bytes an earlier load left that were fetched again instead.
    refetched: AtomicU64,
    /// The load returned: its cancel flag no longer stops the publish.
    returned: std::sync::atomic::AtomicBool,
    /// Something outlives the load waiting for the check ([`Settle`]): it
    /// runs on a thread of its own, else on the read that completes the file.
    deferred: std::sync::atomic::AtomicBool,
}

/// What of a range is read from the cache's file instead of fetched.
pub(crate) struct Local {
    pub file: Arc<File>,
    /// The parts of the range the file holds, in order.
    pub ranges: Vec<Range<u64>>,
    /// Where the file is mapped as the load's destination.
    pub mapped: Option<Range<usize>>,
}

/// Where a written file goes.
pub(crate) trait Target: Send + Sync {
    /// The cache it is in (for the report).
    fn store(&self) -> CacheStore;

    /// Where the file is once published: its snapshot path, or its path in
    /// the cache directory.
    fn shown(&self) -> std::path::PathBuf;

    /// Makes the temporary file for `len` bytes, or says why not.
    fn begin(&self, len: u64) -> Result<TempFile, NotCached>;

    /// The final file, where another process published it, made found for
    /// this load.
    fn published(&self, len: u64) -> Option<File>;

    /// What tells a live writer in another process from a dead one.
    fn activity(&self) -> partial::Activity;

    /// Publishes the checked temporary file: `Ok(false)` where another
    /// process published that name first.
    fn publish(&self, begun: &TempFile) -> io::Result<bool>;
}

impl Write {
    /// A write of `len` bytes to `target`, started by the first read past
    /// `start_at`; `cancel` set, nothing is published.
    pub(crate) fn new(
        target: Box<dyn Target>,
        len: u64,
        check: Check,
        start_at: u64,
        cancel: crate::cancel::Cancel,
    ) -> Arc<Write> {
        Arc::new_cyclic(|me| Write {
            me: Weak::clone(me),
            target,
            len,
            check,
            start_at: start_at.min(len),
            state: Mutex::new(State {
                phase: Phase::Waiting { kept: Vec::new() },
                paused: false,
                complete: None,
            }),
            settled: Condvar::new(),
            cancel,
            resumed: AtomicU64::new(0),
            refetched: AtomicU64::new(0),
            returned: std::sync::atomic::AtomicBool::new(false),
            deferred: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// [`Write::new`], or a write that is over before it began where `check` says why.
    pub(crate) fn of(
        target: Box<dyn Target>,
        len: u64,
        check: Result<Check, NotCached>,
        start_at: u64,
        cancel: crate::cancel::Cancel,
    ) -> Arc<Write> {
        let refused = check.as_ref().err().cloned();
        let write = Write::new(target, len, check.unwrap_or(Check::Whole), start_at, cancel);
        if let Some(why) = refused {
            write.lock().phase = Phase::Done(Err(why));
        }
        write
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What became of it, for the report.
    pub(crate) fn outcome(&self) -> CacheUse {
        let store = self.target.store();
        let state = self.lock();
        let resumed = self.resumed.load(Ordering::Relaxed);
        let refetched = self.refetched.load(Ordering::Relaxed);
        let why = match &state.phase {
            Phase::Done(Ok(())) => {
                return CacheUse::Written {
                    store,
                    resumed,
                    refetched,
                };
            }
            Phase::Checking(_) => {
                return CacheUse::Checking {
                    store,
                    resumed,
                    refetched,
                };
            }
            Phase::Elsewhere(_) => NotCached::PublishedElsewhere,
            Phase::Done(Err(why)) => why.clone(),
            Phase::Writing(p) => NotCached::Partial {
                read: p.covered.iter().map(|r| r.end - r.start).sum(),
                len: self.len,
            },
            Phase::Waiting { kept } => NotCached::Partial {
                read: kept.iter().map(|(_, b)| b.len() as u64).sum(),
                len: self.len,
            },
        };
        CacheUse::NotCached { store, why }
    }

    /// The bytes at `offset` have been read: written, hashed, and the file
    /// checked once complete.
    pub(crate) fn land(&self, offset: u64, bytes: &[u8]) {
        self.land_with(offset, bytes, false);
    }

    fn land_with(&self, offset: u64, bytes: &[u8], image: bool) {
        let end = offset.saturating_add(bytes.len() as u64);
        if bytes.is_empty() || end > self.len {
            return;
        }
        let mut state = self.lock();
        if state.paused && !image {
            return;
        }
        let (begun, mapped) = match &mut state.phase {
            Phase::Done(_) | Phase::Elsewhere(_) | Phase::Checking(_) => return,
            Phase::Waiting { kept } if end <= self.start_at => {
                kept.push((offset, bytes.to_vec()));
                return;
            }
            Phase::Waiting { .. } => match self.begin(&mut state, false) {
                Some(begun) => (begun, false),
                None => return,
            },
            Phase::Writing(progress) => {
                let in_file = in_place(progress.mapped.as_ref(), bytes, offset);
                (Arc::clone(&progress.begun), in_file)
            }
        };
        let mut taken = match &mut state.phase {
            Phase::Writing(progress) if progress.log.is_some() => {
                progress.streams.take(offset..end, self.len)
            }
            _ => Vec::new(),
        };
        drop(state);
        if !mapped {
            if let Err(e) = os::write_all_at(&begun.file, bytes, offset) {
                self.abandon(NotCached::of_io(&e));
                return;
            }
        }
        // Hashed while the bytes are in the CPU's cache (`streams.rs`).
        streams::hash(&mut taken, bytes, offset);
        let mut state = self.lock();
        if let Phase::Writing(progress) = &mut state.phase {
            progress.streams.put(taken, self.len);
            cover(&mut progress.covered, offset..end);
            let finished = progress.log.as_ref().map(|log| {
                let pieces =
                    lock(log).finished(&progress.covered, offset..end, &mut progress.recorded);
                let pieces: Vec<(u64, Option<u128>)> = pieces
                    .into_iter()
                    .map(|index| (index, progress.streams.finished(index)))
                    .collect();
                (Arc::clone(log), pieces, progress.view.clone())
            });
            self.advance(state);
            // Recorded outside the write's lock.
            if let Some((log, pieces, view)) = finished {
                for (index, streamed) in pieces {
                    let view = view.as_deref();
                    let hash = streamed
                        .or_else(|| partial::hash_piece(&begun.file, view, index, self.len));
                    if let Some(hash) = hash {
                        lock(&log).append(index, hash);
                    }
                }
            }
        }
    }

    /// Makes the temporary file and writes what was kept; `None` where that
    /// failed or another process published the file. What an earlier load
    /// left is adopted only where `adopt` (the file is the destination, so
    /// the digest proves it before the load hands it out) and there is a
    /// digest; else it is fetched again.
    fn begin(&self, state: &mut MutexGuard<'_, State>, adopt: bool) -> Option<Arc<TempFile>> {
        let kept = match std::mem::replace(&mut state.phase, Phase::Done(Ok(()))) {
            Phase::Waiting { kept } => kept,
            other => {
                state.phase = other;
                return None;
            }
        };
        let mut begun = match self.open_target() {
            Ok(begun) => begun,
            Err(Ok(file)) => {
                state.phase = Phase::Elsewhere(Arc::new(file));
                return None;
            }
            Err(Err(why)) => {
                state.phase = Phase::Done(Err(why));
                return None;
            }
        };
        // A file without reserved space is not mapped (`map_destination`).
        let adopt = adopt && begun.reserved && matches!(self.check, Check::Digest(_));
        let (kept_pieces, recorded, log) = match begun.resume.take() {
            Some(mut resume) => {
                if !adopt {
                    let left: u64 = resume.kept.iter().map(|r| r.end - r.start).sum();
                    self.refetched.fetch_add(left, Ordering::Relaxed);
                    resume.log.forget_all();
                    resume.kept.clear();
                    resume.recorded.clear();
                }
                let log = Some(Arc::new(Mutex::new(resume.log)));
                (resume.kept, resume.recorded, log)
            }
            None => (Vec::new(), BTreeSet::new(), None),
        };
        // A file kept whole is complete as it begins.
        let mut covered = Vec::new();
        for piece in kept_pieces {
            cover(&mut covered, piece);
        }
        let unproven = covered.clone();
        let begun = Arc::new(begun);
        if begun.partial_of.is_some() {
            // Under the file's lock: a process waiting for it sees it alive.
            super::heartbeat::hold(&begun);
        }
        let resumed = covered.iter().map(|r| r.end - r.start).sum();
        self.resumed.store(resumed, Ordering::Relaxed);
        for (offset, bytes) in &kept {
            if let Err(e) = os::write_all_at(&begun.file, bytes, *offset) {
                state.phase = Phase::Done(Err(NotCached::of_io(&e)));
                return None;
            }
            cover(&mut covered, *offset..*offset + bytes.len() as u64);
        }
        // A map that does not hold every byte is not used.
        let view = begun
            .reserved
            .then(|| View::of(&begun.file, self.len))
            .flatten()
            .map(Arc::new);
        state.phase = Phase::Writing(Box::new(Progress {
            begun: Arc::clone(&begun),
            mapped: None,
            handed: false,
            filling: None,
            covered,
            log,
            recorded,
            streams: Streams::default(),
            view,
            unproven,
        }));
        Some(begun)
    }

    /// The parts of `range` read from the cache's file rather than fetched;
    /// begins the write where `range` passes the header.
    pub(crate) fn local(&self, range: Range<u64>) -> Option<Local> {
        let mut state = self.lock();
        if range.end > self.start_at
            && !state.paused
            && matches!(state.phase, Phase::Waiting { .. })
        {
            self.begin(&mut state, false);
        }
        match &state.phase {
            Phase::Elsewhere(file) => Some(Local {
                file: Arc::clone(file),
                ranges: vec![range],
                mapped: None,
            }),
            Phase::Checking(_) | Phase::Done(Ok(())) => {
                let (file, mapped) = state.complete.as_ref()?;
                // Bytes an earlier load left are read as data only in place,
                // until proven.
                let unproven =
                    matches!(&state.phase, Phase::Checking(c) if lock(&c.proof).is_some());
                if mapped.is_none() && unproven {
                    return None;
                }
                Some(Local {
                    file: Arc::clone(file),
                    ranges: vec![range],
                    mapped: mapped.clone(),
                })
            }
            Phase::Writing(progress) => {
                let mut ranges: Vec<Range<u64>> = progress
                    .covered
                    .iter()
                    .map(|c| c.start.max(range.start)..c.end.min(range.end))
                    .filter(|r| r.start < r.end)
                    .collect();
                if progress.mapped.is_none() {
                    ranges = without(&ranges, &progress.unproven);
                }
                (!ranges.is_empty()).then(|| Local {
                    file: Arc::clone(&progress.begun.file),
                    ranges,
                    mapped: progress.mapped.clone(),
                })
            }
            _ => None,
        }
    }

    /// Checks the file where it is complete.
    pub(crate) fn advance_now(&self) {
        self.advance(self.lock());
    }

    /// Once every byte is in, checks and publishes the file: here, or, where
    /// something waits for the check after the load, on a thread of its own.
    fn advance(&self, mut state: MutexGuard<'_, State>) {
        let Phase::Writing(progress) = &mut state.phase else {
            return;
        };
        let first = progress.covered.first();
        if !first.map_or(self.len == 0, |first| *first == (0..self.len)) {
            return;
        }
        let unproven = std::mem::take(&mut progress.unproven);
        let checking = Arc::new(Checking {
            begun: Mutex::new(Some(Arc::clone(&progress.begun))),
            file: Arc::clone(&progress.begun.file),
            view: progress.view.clone(),
            job: Mutex::new(Some(Hasher::start(self.check, self.len))),
            proof: Mutex::new((!unproven.is_empty()).then_some(unproven)),
        });
        // The record goes with `Progress`: the check reads the file.
        state.complete = Some((Arc::clone(&progress.begun.file), progress.mapped.clone()));
        state.phase = Phase::Checking(Arc::clone(&checking));
        drop(state);
        if lock(&checking.proof).is_some() {
            // Proven before the load returns, by `prove`.
            return;
        }
        let deferred = self.deferred.load(Ordering::Relaxed);
        let spawned = deferred
            .then(|| self.me.upgrade())
            .flatten()
            .and_then(|write| {
                let theirs = Arc::clone(&checking);
                std::thread::Builder::new()
                    .name("safeload-check".into())
                    .stack_size(256 << 10)
                    .spawn(move || {
                        // After the process's fills, at idle priority (`settle`
                        // finishes it at the waiter's).
                        os::idle_priority();
                        checking::after_fills();
                        write.check(&theirs);
                    })
                    .ok()
            });
        if spawned.is_none() {
            // Nothing waits after the load, or no thread to be had: checked here.
            self.check(&checking);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether `bytes` lie in the map `map` at their own `offset`.
pub(crate) fn in_place(map: Option<&Range<usize>>, bytes: &[u8], offset: u64) -> bool {
    let at = bytes.as_ptr() as usize;
    map.is_some_and(|map| {
        map.contains(&at) && at + bytes.len() <= map.end && (at - map.start) as u64 == offset
    })
}

/// The parts of sorted `ranges` outside sorted, merged `holes`.
fn without(ranges: &[Range<u64>], holes: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for range in ranges {
        let mut at = range.start;
        for hole in holes
            .iter()
            .filter(|h| h.end > range.start && h.start < range.end)
        {
            if hole.start > at {
                out.push(at..hole.start);
            }
            at = at.max(hole.end);
        }
        if at < range.end {
            out.push(at..range.end);
        }
    }
    out
}

/// Adds `range` to the sorted, merged ranges `covered`.
fn cover(covered: &mut Vec<Range<u64>>, range: Range<u64>) {
    let at = covered.partition_point(|r| r.end < range.start);
    let mut merged = range;
    while let Some(next) = covered.get(at) {
        if next.start > merged.end {
            break;
        }
        merged = merged.start.min(next.start)..merged.end.max(next.end);
        covered.remove(at);
    }
    covered.insert(at, merged);
}

#[path = "write_check.rs"]
mod checking;
use checking::{Checking, Filling};

#[path = "write_load.rs"]
mod load;

#[path = "write_wait.rs"]
mod wait;

#[cfg(test)]
#[path = "write_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "write_resume_tests.rs"]
mod resume_tests;
