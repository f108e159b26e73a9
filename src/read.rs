//! The read engine: a load's I/O as one queue of (file, offset, length) jobs, pulled by a bounded set of readers that read each straight into its final place.

use std::fs::File;
use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use memmap2::Mmap;

use crate::sys;

/// `EINVAL`: what a filesystem answers a direct read it does not support.
const EINVAL: i32 = 22;

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

    if readers == 1 {
        work();
    } else {
        std::thread::scope(|scope| {
            // The calling thread is one of the readers; if the OS refuses a
            // thread, the others (at least this one) drain the queue.
            for _ in 1..readers {
                let spawned = std::thread::Builder::new()
                    .name("safeload-read".into())
                    .spawn_scoped(scope, work);
                if spawned.is_err() {
                    break;
                }
            }
            work();
        });
    }
    match first_error.into_inner().ok().flatten() {
        Some((_, error)) => Err(error),
        None => Ok(()),
    }
}

/// Faults fresh anonymous buffers in before they are read into, `readers`
/// pieces at a time (`MADV_POPULATE_WRITE`, Linux 5.14+; a no-op elsewhere),
/// so that zeroing their pages runs in parallel rather than inside each
/// read's copy. Failure is harmless: the reads fault the pages instead.
pub(crate) fn prefault(buffers: &[&memmap2::MmapMut], readers: usize, piece: usize) {
    let mut pieces: Vec<(&memmap2::MmapMut, usize, usize)> = Vec::new();
    for buffer in buffers {
        let mut offset = 0;
        while offset < buffer.len() {
            let len = piece.max(1).min(buffer.len() - offset);
            pieces.push((buffer, offset, len));
            offset += len;
        }
    }
    let cursor = AtomicUsize::new(0);
    let work = || {
        while let Some(&(buffer, offset, len)) = pieces.get(cursor.fetch_add(1, Ordering::Relaxed))
        {
            sys::populate_write(buffer, offset, len);
        }
    };
    let readers = readers.clamp(1, pieces.len().max(1));
    std::thread::scope(|scope| {
        for _ in 1..readers {
            let spawned = std::thread::Builder::new()
                .name("safeload-prefault".into())
                .spawn_scoped(scope, work);
            if spawned.is_err() {
                break;
            }
        }
        work();
    });
}

fn execute(job: Job<'_>) -> Result<(), (u64, io::Error)> {
    match job {
        Job::Read {
            file,
            fallback,
            offset,
            dst,
            required,
        } => match (sys::read_at_least(file, dst, required, offset), fallback) {
            (Err((_, e)), Some(plain)) if e.raw_os_error() == Some(EINVAL) => {
                sys::read_at_least(plain, dst, required, offset)
            }
            (result, _) => result,
        },
        Job::Populate { map, offset, len } => {
            sys::populate_read(map, offset, len).map_err(|e| (offset as u64, e))
        }
    }
}
