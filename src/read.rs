//! The read engine: a load's I/O as one queue of (file, offset, length) jobs, pulled by a bounded set of readers that read each straight into its final place.

use std::fs::File;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use memmap2::Mmap;

use crate::os;
use crate::workers;

/// The default chunk size. NOTE: set by the `load` benchmark (BENCHMARKS.md):
/// large enough that per-request overhead vanishes and a FUSE mount sees
/// requests in flight, small enough that readers stay balanced at the tail.
pub(crate) const DEFAULT_CHUNK: usize = 8 << 20;

/// One unit of I/O.
pub(crate) enum Job<'a> {
    /// A positional read into its final destination. `required` bytes must
    /// arrive; the rest of `dst` (the tail of a direct-I/O block past the end
    /// of the file) may stay unread.
    Read {
        file: &'a File,
        /// A plain descriptor of the same file, for when a direct read of
        /// `file` is refused (`EINVAL`).
        fallback: Option<&'a File>,
        offset: u64,
        dst: &'a mut [u8],
        required: usize,
    },
    /// Faulting a range of a file map in, so that later accesses do not wait.
    Populate {
        map: &'a Mmap,
        offset: usize,
        len: usize,
    },
}

/// A job tagged with the file (an index into the caller's list) it belongs to.
pub(crate) struct Tagged<'a> {
    pub file_index: usize,
    pub job: Job<'a>,
}

/// A failed job: which file, at which offset, and why.
#[derive(Debug)]
pub(crate) struct JobError {
    pub file_index: usize,
    /// What was being done, for the error: "reading", or populating a map.
    pub operation: &'static str,
    pub offset: u64,
    pub error: io::Error,
}

/// Splits the read of a run of `dst`, filled from `file` at `offset`, into
/// jobs of at most `chunk` bytes. `required` bytes of `dst` must be read; the
/// rest may lie past the end of the file.
pub(crate) fn split_read<'a>(
    out: &mut Vec<Tagged<'a>>,
    file_index: usize,
    (file, fallback): (&'a File, Option<&'a File>),
    offset: u64,
    dst: &'a mut [u8],
    required: usize,
    chunk: usize,
) {
    let mut at = 0usize;
    for piece in dst.chunks_mut(chunk.max(1)) {
        let len = piece.len();
        out.push(Tagged {
            file_index,
            job: Job::Read {
                file,
                fallback,
                offset: offset + at as u64,
                dst: piece,
                required: required.saturating_sub(at).min(len),
            },
        });
        at += len;
    }
}

/// Splits the population of a whole map into jobs of at most `chunk` bytes.
pub(crate) fn split_populate<'a>(
    out: &mut Vec<Tagged<'a>>,
    file_index: usize,
    map: &'a Mmap,
    chunk: usize,
) {
    let chunk = chunk.max(1);
    let mut offset = 0;
    while offset < map.len() {
        let len = chunk.min(map.len() - offset);
        out.push(Tagged {
            file_index,
            job: Job::Populate { map, offset, len },
        });
        offset += len;
    }
}

/// Runs every job with at most `readers` in flight, pulling from one queue so
/// that uneven files keep every reader busy. `done(file_index)` is called as
/// each job completes. Stops at the first error and returns it (the earliest
/// in queue order among those seen).
///
/// Readers are threads of their own, not the caller's rayon pool: they block
/// on storage, and a slow network mount must not starve CPU work elsewhere.
pub(crate) fn run(
    jobs: Vec<Tagged<'_>>,
    readers: usize,
    done: &(dyn Fn(usize) + Sync),
) -> Result<(), JobError> {
    let readers = readers.clamp(1, jobs.len().max(1));
    let queue: Vec<Mutex<Option<Tagged<'_>>>> =
        jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let cursor = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let first_error: Mutex<Option<(usize, JobError)>> = Mutex::new(None);

    let work = || {
        while !failed.load(Ordering::Relaxed) {
            let i = cursor.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = queue.get(i) else { break };
            let Some(tagged) = slot.lock().ok().and_then(|mut c| c.take()) else {
                continue;
            };
            let operation = match tagged.job {
                Job::Read { .. } => "reading",
                Job::Populate { .. } => "populating the map of",
            };
            match execute(tagged.job) {
                Ok(()) => done(tagged.file_index),
                Err((offset, error)) => {
                    failed.store(true, Ordering::Relaxed);
                    if let Ok(mut first) = first_error.lock() {
                        if first.as_ref().is_none_or(|(j, _)| i < *j) {
                            let file_index = tagged.file_index;
                            *first = Some((
                                i,
                                JobError {
                                    file_index,
                                    operation,
                                    offset,
                                    error,
                                },
                            ));
                        }
                    }
                }
            }
        }
    };

    workers::run(readers, "safeload-read", |_| work());
    match first_error.into_inner().ok().flatten() {
        Some((_, error)) => Err(error),
        None => Ok(()),
    }
}

// NOTE: prefaulting fresh buffers in a parallel pass before reading into them
// (`MADV_POPULATE_WRITE` over 32 MiB pieces) was measured and rejected: on
// 2.2 GiB, 8 readers of 16 MiB, 3 interleaved runs each (2026-11-29), cold
// direct loads took 1.50-3.54 s with it and 1.19-1.25 s without, warm loads
// 1.43-2.76 s with it and 0.96-1.08 s without. The readers already fault
// their destinations in parallel, each its own chunk, while the reads of the
// others are in flight; a separate pass only adds a serial phase.

fn execute(job: Job<'_>) -> Result<(), (u64, io::Error)> {
    match job {
        Job::Read {
            file,
            fallback,
            offset,
            dst,
            required,
        } => match (os::read_at_least(file, dst, required, offset), fallback) {
            (Err((_, e)), Some(plain)) if e.raw_os_error() == Some(os::EINVAL) => {
                os::read_at_least(plain, dst, required, offset)
            }
            (result, _) => result,
        },
        Job::Populate { map, offset, len } => {
            os::populate_read(map, offset, len).map_err(|e| (offset as u64, e))
        }
    }
}
