//! The read engine's job queue: a load's I/O as (file, offset, length) jobs — positional reads into their final place, conversions, populates — pulled by a bounded set of reader threads (the jobs made in `split.rs`, each run in `execute.rs`).

mod execute;
mod list;
mod split;

use std::fs::File;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use memmap2::Mmap;
use safetensors::Dtype;

use crate::adapt::{Concurrency, Control, Settled};
use crate::cancel::Cancel;
use crate::dest::pages::PageSizes;
use crate::error::Operation;
use crate::mount::MountKind;
use crate::source::Source;
use crate::workers;
#[cfg(test)]
use list::take;
use list::{List, not_taken, queue_of, reads_bypass_the_page_cache};
pub(crate) use split::{
    Conversion, ConvertFrom, MappedFile, ReadFrom, carve, split_convert, split_populate, split_read,
};

/// One unit of I/O.
pub(crate) enum Job<'a> {
    /// A positional read into its final destination: `required` bytes must
    /// arrive, the rest of `dst` (a direct-I/O block's tail past the file's
    /// end) may stay unread. `direct`: `file` has `O_DIRECT` set; `hashed`:
    /// the bytes are handed to `done` for the file's digest.
    Read {
        file: &'a dyn Source,
        direct: bool,
        offset: u64,
        dst: &'a mut [u8],
        required: usize,
        hashed: bool,
    },
    /// A run of whole elements converted to another dtype into its final
    /// destination (`Loader::dtype`).
    Convert {
        source: ConvertSource<'a>,
        from: Dtype,
        to: Dtype,
        dst: &'a mut [u8],
    },
    /// Faulting a range of a file map in; `file` is read to learn why a
    /// range failed to.
    Populate {
        map: &'a Mmap,
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

    /// Whether the job reads a local disk with `O_DIRECT` (its pages set
    /// the size of the disk's requests, `PageSizes::fault_in`).
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

/// Where a conversion's source bytes are: in the file's map, or `len`
/// bytes at `offset` of the file, read into the reader's scratch buffer.
pub(crate) enum ConvertSource<'a> {
    Mapped(&'a [u8]),
    File {
        file: &'a dyn Source,
        offset: u64,
        len: usize,
    },
}

/// What a finished job hands to `done`: the bytes a read of a hashed file
/// brought in (at their file offset), the values a conversion overflowed,
/// the bytes it read (for progress).
#[derive(Default)]
pub(crate) struct Outcome<'a> {
    pub landed: Option<(u64, &'a [u8])>,
    pub overflowed: u64,
    pub bytes: u64,
}

/// A job tagged with the file (an index into the caller's list) it belongs to.
pub(crate) struct Tagged<'a> {
    pub file_index: usize,
    pub job: Job<'a>,
}

/// A failed job: which file, doing what, at which offset, and why.
#[derive(Debug)]
pub(crate) struct JobError {
    pub file_index: usize,
    pub operation: Operation,
    pub offset: u64,
    pub error: io::Error,
}

impl JobError {
    /// The crate's error for it, naming `source` (its file) where known.
    pub(crate) fn on(self, source: Option<&dyn Source>) -> crate::error::Error {
        let JobError {
            operation, offset, ..
        } = self;
        match source {
            Some(s) => crate::source::read_error(operation, s, s.len(), offset, self.error),
            None => crate::error::Error::without_path(crate::error::ErrorKind::Io {
                operation,
                offset: Some(offset),
            }),
        }
    }
}

/// Where a run's readers take their work from (a load's list, the chunk
/// queue local ranks share, the pieces of node copies): what the work is,
/// where the next piece is, how one is done. [`drain`] is the one read loop.
pub trait JobSource: Sync {
    /// One piece of work.
    type Job: Send;
    /// A piece's failure.
    type Error: Send;

    /// The next piece for reader `reader` and its place in the source's
    /// order (of two failures, the run keeps the earlier); `None` once none
    /// is left for it.
    fn next(&self, reader: usize) -> Option<(usize, Self::Job)>;

    /// Does `job` on the reader's thread: the bytes it moved.
    fn run(&self, job: Self::Job) -> Result<u64, Self::Error>;

    /// The failure of a run cancelled before `job` was done.
    fn cancelled(&self, job: Self::Job) -> Self::Error;

    /// Whether one more thread works beside the readers ([`help`](Self::help)).
    fn helps(&self) -> bool {
        false
    }

    /// The helper thread's work, until `stop` is set or it has none left.
    fn help(&self, _stop: &AtomicBool) {}
}

/// The read loop: runs `source`'s work on reader threads named `name`, as
/// many as `concurrency` and the measured throughput allow (`adapt.rs`), a
/// helper beside them where the source has one. Stops at the first failure
/// (the earliest in the source's order among those seen) or once `cancel`
/// is set (the failure: the piece not done). Also returns how many threads
/// ran and what the count settled on.
///
/// Readers are threads of their own, not the caller's rayon pool: they
/// block on storage, which must not starve CPU work elsewhere.
pub fn drain<S: JobSource>(
    source: &S,
    concurrency: Concurrency,
    pieces: usize,
    name: &str,
    cancel: &Cancel,
) -> (Result<(), S::Error>, workers::Started, Settled) {
    let control = Control::new(concurrency, pieces);
    let failed = AtomicBool::new(false);
    let first: Mutex<Option<(usize, S::Error)>> = Mutex::new(None);
    let fail = |index: usize, error: S::Error| {
        failed.store(true, Ordering::Relaxed);
        control.finish();
        if let Ok(mut first) = first.lock() {
            if first.as_ref().is_none_or(|(j, _)| index < *j) {
                *first = Some((index, error));
            }
        }
    };
    let readers = control.max();
    let helps = source.helps();
    let work = |reader: usize| {
        if helps && reader == readers {
            source.help(&failed);
            return;
        }
        while !failed.load(Ordering::Relaxed) && control.wait_turn(reader) {
            let Some((index, job)) = source.next(reader) else {
                control.finish();
                break;
            };
            if cancel.is_set() {
                fail(index, source.cancelled(job));
                break;
            }
            match source.run(job) {
                Ok(bytes) => control.completed(bytes),
                Err(error) => fail(index, error),
            }
        }
    };
    let started = workers::run(readers + usize::from(helps), name, work);
    control.finish();
    let settled = control.settled();
    let result = match first.into_inner().ok().flatten() {
        Some((_, error)) => Err(error),
        None => Ok(()),
    };
    (result, started, settled)
}

/// Runs every job from one queue, so that uneven files keep every reader
/// busy (`list.rs`), calling `done(file_index, outcome)` as each completes;
/// returns as [`drain`] does. Destinations are faulted in by `pages` before
/// their bytes land (`list.rs`). A run cancelled before it starts starts no
/// reader.
pub(crate) fn run<'a>(
    jobs: Vec<Tagged<'a>>,
    concurrency: Concurrency,
    pages: &PageSizes,
    done: &(dyn Fn(usize, Outcome<'a>) + Sync),
    cancel: &Cancel,
) -> (Result<(), JobError>, workers::Started, Settled) {
    if let Some(first) = jobs.first().filter(|_| cancel.is_set()) {
        let control = Control::new(concurrency, jobs.len());
        let started = workers::Started {
            requested: 1,
            started: 1,
            refused: None,
        };
        return (Err(not_taken(first)), started, control.settled());
    }
    let pieces = jobs.len();
    let ahead = reads_bypass_the_page_cache(&jobs);
    let list = List {
        queue: queue_of(jobs),
        cursor: AtomicUsize::new(0),
        pages,
        ahead,
        done,
    };
    drain(&list, concurrency, pieces, "safeload-read", cancel)
}

#[cfg(test)]
mod tests;
