//! The read engine's job queue: a load's I/O as (file, offset, length) jobs — positional reads into their final place, conversions, populates — pulled by a bounded set of reader threads (the jobs made in `split.rs`, each run in `execute.rs`).

mod execute;
mod split;

use std::fs::File;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use std::time::{Duration, Instant};

use memmap2::Mmap;
use safetensors::Dtype;

use crate::adapt::{Concurrency, Control, Settled};
use crate::cancel;
use crate::dest::pages::PageSizes;
use crate::error::Operation;
use crate::mount::MountKind;
use crate::os;
use crate::source::Source;
use crate::workers;
use execute::execute;
pub(crate) use split::{
    Conversion, ConvertFrom, MappedFile, ReadFrom, split_convert, split_populate, split_read,
};

/// One unit of I/O.
pub(crate) enum Job<'a> {
    /// A positional read into its final destination. `required` bytes must
    /// arrive; the rest of `dst` (the tail of a direct-I/O block past the end
    /// of the file) may stay unread.
    Read {
        file: &'a dyn Source,
        /// Whether `file` has `O_DIRECT` set: the read bypasses the page
        /// cache (a refused one goes through an aligned bounce buffer, in
        /// `os::read_at_least`).
        direct: bool,
        offset: u64,
        dst: &'a mut [u8],
        required: usize,
        /// Whether the bytes are handed to `done` once read, for a file
        /// whose digest is computed as it loads.
        hashed: bool,
    },
    /// A run of whole elements converted to another dtype into its final
    /// destination (`Loader::dtype`): taken from the file's map, or read
    /// with a positional read into the reader's scratch buffer first.
    Convert {
        source: ConvertSource<'a>,
        from: Dtype,
        to: Dtype,
        dst: &'a mut [u8],
    },
    /// Faulting a range of a file map in, so that later accesses do not wait.
    Populate {
        map: &'a Mmap,
        /// The mapped file, read to learn why a range failed to populate.
        file: &'a File,
        offset: usize,
        len: usize,
    },
}

impl Job<'_> {
    /// The memory the job writes, if any.
    fn destination(&mut self) -> Option<&mut [u8]> {
        match self {
            Job::Read { dst, .. } | Job::Convert { dst, .. } => Some(dst),
            Job::Populate { .. } => None,
        }
    }

    /// Whether the job reads a file on a local disk with `O_DIRECT`: its
    /// destination's pages set the size of the disk's requests
    /// (`PageSizes::fault_in`).
    fn reads_a_disk_directly(&self) -> bool {
        match self {
            Job::Read {
                direct: true, file, ..
            } => file.mount().is_some_and(|m| m.kind == MountKind::Local),
            _ => false,
        }
    }

    /// The bytes the job reads (or populates).
    pub(crate) fn bytes(&self) -> u64 {
        match self {
            Job::Read { required, .. } => *required as u64,
            Job::Convert {
                source: ConvertSource::Mapped(src),
                ..
            } => src.len() as u64,
            Job::Convert {
                source: ConvertSource::File { len, .. },
                ..
            } => *len as u64,
            Job::Populate { len, .. } => *len as u64,
        }
    }
}

/// Where a conversion's source bytes are.
pub(crate) enum ConvertSource<'a> {
    /// In the file's map.
    Mapped(&'a [u8]),
    /// `len` bytes at `offset` of the file.
    File {
        file: &'a dyn Source,
        offset: u64,
        len: usize,
    },
}

/// What a finished job hands to `done`: the bytes a read of a hashed file
/// brought in (at their file offset), and values a conversion overflowed.
#[derive(Default)]
pub(crate) struct Outcome<'a> {
    pub landed: Option<(u64, &'a [u8])>,
    pub overflowed: u64,
    /// Bytes the job read (or populated), for progress.
    pub bytes: u64,
}

/// A job tagged with the file (an index into the caller's list) it belongs to.
pub(crate) struct Tagged<'a> {
    pub file_index: usize,
    pub job: Job<'a>,
}

/// A job waiting in the queue, and whether its destination was faulted in
/// already (by the helper that walks ahead of the readers).
struct Waiting<'a> {
    tagged: Tagged<'a>,
    faulted: bool,
}

/// One place of the queue: its job until a reader takes it (or, cut, the
/// rest of it).
type Slot<'a> = Mutex<Option<Waiting<'a>>>;

/// A job a reader took: where it was in the queue, whether its destination
/// is faulted in already, and how long the reader waited for it on the
/// helper faulting it in.
struct Taken<'a> {
    index: usize,
    tagged: Tagged<'a>,
    faulted: bool,
    waited: Duration,
}

/// The queue of `jobs`, none of them faulted in yet.
fn queue_of(jobs: Vec<Tagged<'_>>) -> Vec<Slot<'_>> {
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
/// taken.
///
/// The first job from the cursor on that no one holds: a slot locked is
/// the helper's, faulting its job in, and is passed over (the cursor stays
/// on it, and the next reader takes it once the helper is done), so that
/// no reader waits on the helper while other jobs are there to take; only
/// where every job left is held does a reader wait (the wait counts as
/// faulting, `Control::completed`). The cursor moves past the slots found
/// empty, in order.
///
/// NOTE: readers that waited on the helper's slot made a slow helper the
/// load's one faulting thread (BENCHMARKS.md, "jobs/mod.rs: take").
fn take<'a>(queue: &[Slot<'a>], cursor: &AtomicUsize) -> Option<Taken<'a>> {
    let mut waited = Duration::ZERO;
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
                // Taken whole by another reader: whichever comes first moves
                // the cursor past it, where it is the cursor's.
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
                waited,
            });
        }
        // Every job left is held: wait for the first, then look again.
        let slot = queue.get(held_by_helper?)?;
        let start = Instant::now();
        drop(slot.lock());
        waited += start.elapsed();
    }
}

/// A failed job: which file, at which offset, and why.
#[derive(Debug)]
pub(crate) struct JobError {
    pub file_index: usize,
    /// What was being done, for the error: "reading", or populating a map.
    pub operation: Operation,
    pub offset: u64,
    pub error: io::Error,
}

/// Runs every job, pulling from one queue so that uneven files keep every
/// reader busy, with as many in flight as `concurrency` and the measured
/// throughput allow (`adapt.rs`). `done(file_index, outcome)` is called as
/// each job completes. Stops at the first error and returns it (the earliest
/// in queue order among those seen); also returns how many readers ran and
/// what the count settled on.
///
/// Every destination is fresh memory, faulted in by `pages` before its
/// bytes land: by a helper walking ahead of the readers where the reads
/// bypass the page cache, else (or where the helper is behind) by the
/// reader that takes the job, just before its read; a window of the
/// adaptive count that its readers mostly spent so is measured again
/// (`Control::completed`).
///
/// Readers are threads of their own, not the caller's rayon pool: they block
/// on storage, and a slow network mount must not starve CPU work elsewhere.
///
/// A load cancelled on this thread (`cancel::current`) stops here: no job
/// is started once its flags are set, each reader finishing the one it holds,
/// and the failure is the job not taken, with `cancel::stopped()` as its error.
pub(crate) fn run<'a>(
    jobs: Vec<Tagged<'a>>,
    concurrency: Concurrency,
    pages: &PageSizes,
    done: &(dyn Fn(usize, Outcome<'a>) + Sync),
) -> (Result<(), JobError>, workers::Started, Settled) {
    let cancel = cancel::current();
    let control = Control::new(concurrency, jobs.len());
    if let Some(first) = jobs.first().filter(|_| cancel.is_set()) {
        // Cancelled before the read phase: no reader is started.
        let error = not_taken(first);
        control.finish();
        let started = workers::Started {
            requested: 1,
            started: 1,
            refused: None,
        };
        return (Err(error), started, control.settled());
    }
    // One more thread faults in the destinations of the jobs ahead of the
    // readers when the reads bypass the page cache (see `fill_ahead`).
    let ahead = reads_bypass_the_page_cache(&jobs);
    let readers = Readers {
        queue: queue_of(jobs),
        cursor: AtomicUsize::new(0),
        failed: AtomicBool::new(false),
        first_error: Mutex::new(None),
        control,
        pages,
        cancel,
        ahead,
        done,
    };
    let filler = readers.control.max();
    let work = |reader: usize| {
        if ahead && reader == filler {
            fill_ahead(&readers.queue, &readers.cursor, &readers.failed, pages);
        } else {
            readers.work(reader);
        }
    };
    let started = workers::run(filler + usize::from(ahead), "safeload-read", work);
    readers.control.finish();
    let settled = readers.control.settled();
    let result = match readers.first_error.into_inner().ok().flatten() {
        Some((_, error)) => Err(error),
        None => Ok(()),
    };
    (result, started, settled)
}

/// What a run's readers share.
struct Readers<'a, 'r> {
    queue: Vec<Slot<'a>>,
    cursor: AtomicUsize,
    failed: AtomicBool,
    /// The earliest failure in queue order, and its place.
    first_error: Mutex<Option<(usize, JobError)>>,
    control: Control,
    pages: &'r PageSizes,
    cancel: cancel::Cancel,
    /// Whether a helper faults destinations in ahead of the readers.
    ahead: bool,
    done: &'r (dyn Fn(usize, Outcome<'a>) + Sync),
}

impl<'a> Readers<'a, '_> {
    /// Reader `reader`'s loop: takes jobs while its turn lasts and none
    /// failed; stops at a cancel.
    fn work(&self, reader: usize) {
        while !self.failed.load(Ordering::Relaxed) && self.control.wait_turn(reader) {
            let Some(taken) = take(&self.queue, &self.cursor) else {
                self.control.finish();
                break;
            };
            if self.cancel.is_set() {
                let error = not_taken(&taken.tagged);
                self.fail(taken.index, error);
                break;
            }
            self.run_one(taken);
        }
    }

    /// Runs one job: its destination faulted in where no helper did, its
    /// outcome counted and handed on, or its failure recorded.
    fn run_one(&self, taken: Taken<'a>) {
        let Taken {
            index,
            mut tagged,
            faulted,
            waited,
        } = taken;
        let operation = match tagged.job {
            Job::Read { .. } => Operation::Read,
            Job::Convert { .. } => Operation::Convert,
            Job::Populate { .. } => Operation::Populate,
        };
        // The destination faulted in here, where no helper did (its page
        // size asked for only, where the read copies out of the page cache:
        // `PageSizes::prepare`).
        let mut faulting = waited;
        // A copy out of the page cache into a destination left to fault in
        // as it goes: timed on this thread's CPU clock, the measure of the
        // page size it was given.
        let mut prepared = None;
        let disk = tagged.job.reads_a_disk_directly();
        let pages = self.pages;
        if let (false, true, Some(dst)) = (faulted, pages.readers_fault(), tagged.job.destination())
        {
            let start = Instant::now();
            if self.ahead {
                pages.fault_in(dst, disk);
            } else {
                let timed = operation == Operation::Read;
                prepared = Some((pages.prepare(dst, timed), os::thread_cpu_time()));
            }
            faulting += start.elapsed();
        }
        let result = execute(tagged.job);
        if let Some((prepared, before)) = prepared {
            let cpu = before
                .filter(|_| operation == Operation::Read && result.is_ok())
                .and_then(|b| Some(os::thread_cpu_time()?.saturating_sub(b)));
            pages.copied(prepared, cpu);
        }
        match result {
            Ok(outcome) => {
                self.control.completed(outcome.bytes, faulting);
                (self.done)(tagged.file_index, outcome);
            }
            Err((offset, error)) => {
                let file_index = tagged.file_index;
                let error = JobError {
                    file_index,
                    operation,
                    offset,
                    error,
                };
                self.fail(index, error);
            }
        }
    }

    /// The job at `index` failed (or was not taken): the run stops, and
    /// keeps the earliest failure in queue order.
    fn fail(&self, index: usize, error: JobError) {
        self.failed.store(true, Ordering::Relaxed);
        self.control.finish();
        if let Ok(mut first) = self.first_error.lock() {
            if first.as_ref().is_none_or(|(j, _)| index < *j) {
                *first = Some((index, error));
            }
        }
    }
}

/// The failure of a run cancelled before `job` was taken.
fn not_taken(job: &Tagged<'_>) -> JobError {
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

/// Whether any job is a direct read or a read of a remote object, the cases where a helper faulting
/// in destinations ahead of the readers pays: the readers wait on the storage or the network.
///
/// NOTE: there the readers wait on the storage or the network and a core is
/// idle, and the helper moves the zeroing of fresh pages there; where reads
/// copy from the page cache both cores are busy copying and it only takes
/// CPU from them, so it does not run (BENCHMARKS.md, "jobs/mod.rs:
/// reads_bypass_the_page_cache").
fn reads_bypass_the_page_cache(jobs: &[Tagged<'_>]) -> bool {
    jobs.iter().any(|t| match &t.job {
        Job::Read { direct, file, .. } => *direct || file.local().is_none(),
        _ => false,
    })
}

/// Walks the queue ahead of the readers and faults in the destination of
/// every job not yet taken (`PageSizes::fault_in`), so that the readers'
/// copies land in present pages. A job it holds is passed over by the
/// readers (`take`): where it is slower than they are, they fault the jobs
/// they take in themselves, and it goes on from the first job after the
/// cursor.
fn fill_ahead(queue: &[Slot<'_>], cursor: &AtomicUsize, failed: &AtomicBool, pages: &PageSizes) {
    let mut i = 0;
    while !failed.load(Ordering::Relaxed) {
        i = i.max(cursor.load(Ordering::Relaxed) + 1);
        let Some(slot) = queue.get(i) else {
            break;
        };
        // A job a reader holds, or has taken, is the reader's to fault.
        if let Ok(mut job) = slot.try_lock() {
            if let Some(waiting) = job.as_mut().filter(|w| !w.faulted) {
                let disk = waiting.tagged.job.reads_a_disk_directly();
                if let Some(dst) = waiting.tagged.job.destination() {
                    pages.fault_in(dst, disk);
                }
                waiting.faulted = true;
            }
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests;
