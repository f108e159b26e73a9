//! The fixed list of a load's jobs as a source of the read loop: one queue the readers take from in order, the destination of each faulted in before its bytes land (by a helper walking ahead of the readers where the reads bypass the page cache, else by the reader), each outcome handed on.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::execute::execute;
use super::{ConvertSource, Job, JobError, JobSource, Outcome, Tagged};
use crate::cancel;
use crate::dest::pages::{Fill, PageSizes};
use crate::error::Operation;

/// A load's jobs in one queue, and what the readers share of them; `ahead`:
/// a helper faults destinations in ahead of the readers.
pub(super) struct List<'a, 'r> {
    pub queue: Vec<Slot<'a>>,
    pub cursor: AtomicUsize,
    pub pages: &'r PageSizes,
    pub ahead: bool,
    pub done: &'r (dyn Fn(usize, Outcome<'a>) + Sync),
}

impl<'a> JobSource for List<'a, '_> {
    type Job = Taken<'a>;
    type Error = JobError;

    fn next(&self, _reader: usize) -> Option<(usize, Taken<'a>)> {
        take(&self.queue, &self.cursor).map(|taken| (taken.index, taken))
    }

    /// Runs one job, its destination faulted in where no helper did.
    fn run(&self, taken: Taken<'a>) -> Result<u64, JobError> {
        let Taken {
            mut tagged,
            faulted,
            ..
        } = taken;
        let operation = match tagged.job {
            Job::Read { .. } => Operation::Read,
            Job::Convert { .. } => Operation::Convert,
            Job::Populate { .. } => Operation::Populate,
        };
        // Where a helper runs (the reads wait on storage), faulted in now;
        // else left to the copy out of the page cache (`dest::pages::Fill`).
        let mut filling = None;
        let how = match self.ahead {
            true => Fill::Now {
                disk: tagged.job.reads_a_disk_directly(),
            },
            false => Fill::ByCopy {
                timed: operation == Operation::Read,
            },
        };
        if let (false, Some(dst)) = (faulted, tagged.job.destination()) {
            filling = Some(self.pages.fill(dst, how));
        }
        let result = execute(tagged.job);
        if let Some(filling) = filling {
            self.pages.filled(filling, result.is_ok());
        }
        match result {
            Ok(outcome) => {
                let bytes = outcome.bytes;
                (self.done)(tagged.file_index, outcome);
                Ok(bytes)
            }
            Err((offset, error)) => Err(JobError {
                file_index: tagged.file_index,
                operation,
                offset,
                error,
            }),
        }
    }

    fn cancelled(&self, taken: Taken<'a>) -> JobError {
        not_taken(&taken.tagged)
    }

    fn helps(&self) -> bool {
        self.ahead
    }

    fn help(&self, stop: &AtomicBool) {
        fill_ahead(&self.queue, &self.cursor, stop, self.pages);
    }
}

/// A job waiting in the queue, and whether the helper faulted it in.
pub(super) struct Waiting<'a> {
    tagged: Tagged<'a>,
    faulted: bool,
}

/// One place of the queue: its job until a reader takes it.
pub(super) type Slot<'a> = Mutex<Option<Waiting<'a>>>;

/// A job a reader took, its place in the queue, and whether it is faulted in.
pub(super) struct Taken<'a> {
    pub index: usize,
    pub tagged: Tagged<'a>,
    pub faulted: bool,
}

/// The queue of `jobs`, none of them faulted in yet.
pub(super) fn queue_of(jobs: Vec<Tagged<'_>>) -> Vec<Slot<'_>> {
    jobs.into_iter()
        .map(|tagged| {
            Mutex::new(Some(Waiting {
                tagged,
                faulted: false,
            }))
        })
        .collect()
}

/// The next job of the queue and its place in it; `None` once every job is
/// taken. A locked slot is the helper's and is passed over (the cursor stays
/// on it), so that no reader waits on the helper while other jobs are left.
///
/// NOTE: readers that waited on the helper's slot made a slow helper the
/// load's one faulting thread (BENCHMARKS.md, "jobs/mod.rs: take").
pub(super) fn take<'a>(queue: &[Slot<'a>], cursor: &AtomicUsize) -> Option<Taken<'a>> {
    loop {
        let mut held_by_helper = None;
        let mut i = cursor.load(Ordering::Acquire);
        while let Some(slot) = queue.get(i) {
            let mut held = match slot.try_lock() {
                Ok(held) => held,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => {
                    held_by_helper.get_or_insert(i);
                    i += 1;
                    continue;
                }
            };
            let Some(Waiting { tagged, faulted }) = held.take() else {
                drop(held);
                // Taken by another reader: move the cursor past it.
                let _ = cursor.compare_exchange(i, i + 1, Ordering::AcqRel, Ordering::Acquire);
                i += 1;
                continue;
            };
            drop(held);
            let _ = cursor.compare_exchange(i, i + 1, Ordering::AcqRel, Ordering::Acquire);
            return Some(Taken {
                index: i,
                tagged,
                faulted,
            });
        }
        // Every job left is held: wait for the first, then look again.
        let slot = queue.get(held_by_helper?)?;
        drop(slot.lock());
    }
}

/// The failure of a run cancelled before `job` was taken.
pub(super) fn not_taken(job: &Tagged<'_>) -> JobError {
    let (operation, offset) = match &job.job {
        Job::Read { offset, .. } => (Operation::Read, *offset),
        Job::Convert {
            source: ConvertSource::File { offset, .. },
            ..
        } => (Operation::Read, *offset),
        Job::Convert { .. } => (Operation::Convert, 0),
        Job::Populate { offset, .. } => (Operation::Populate, *offset as u64),
    };
    JobError {
        file_index: job.file_index,
        operation,
        offset,
        error: cancel::stopped(),
    }
}

/// Whether any job is a direct read or a remote object's, where a helper
/// faulting destinations in ahead of the readers pays.
///
/// NOTE: there the readers wait and a core is idle for the zeroing of fresh
/// pages; where reads copy from the page cache it only takes CPU from them
/// (BENCHMARKS.md, "jobs/mod.rs: reads_bypass_the_page_cache").
pub(super) fn reads_bypass_the_page_cache(jobs: &[Tagged<'_>]) -> bool {
    jobs.iter().any(|t| match &t.job {
        Job::Read { direct, file, .. } => *direct || file.local().is_none(),
        _ => false,
    })
}

/// Walks the queue ahead of the readers, faulting in the destination of
/// every job not yet taken (`Fill::Now`); where it falls behind, it goes on
/// from the first job after the cursor.
pub(super) fn fill_ahead(
    queue: &[Slot<'_>],
    cursor: &AtomicUsize,
    failed: &AtomicBool,
    pages: &PageSizes,
) {
    let mut i = 0;
    while !failed.load(Ordering::Relaxed) {
        i = i.max(cursor.load(Ordering::Relaxed) + 1);
        let Some(slot) = queue.get(i) else {
            break;
        };
        // A job a reader holds or took is the reader's to fault.
        if let Ok(mut job) = slot.try_lock() {
            if let Some(waiting) = job.as_mut().filter(|w| !w.faulted) {
                let disk = waiting.tagged.job.reads_a_disk_directly();
                if let Some(dst) = waiting.tagged.job.destination() {
                    pages.filled(pages.fill(dst, Fill::Now { disk }), true);
                }
                waiting.faulted = true;
            }
        }
        i += 1;
    }
}
