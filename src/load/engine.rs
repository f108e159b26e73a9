//! The read engine of a load: every buffered file's reads, conversions and populates put in one job queue (`jobs.rs`), hashed as they land where verified, then each buffer sealed read-only.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::adapt::{Concurrency, Settled};
use crate::checkpoint::open::ConvertBuffer;
use crate::checkpoint::open::{Body, OpenFile, file_len, read_error, since, size_mismatch};
use crate::error::{Error, ErrorKind, Result};
use crate::jobs::{
    ConvertFrom, ConvertSource, Job, Tagged, run, split_convert, split_populate, split_read,
};
use crate::os::{self, DIRECT_ALIGN};
use crate::progress::{Callback, Meter, Phase};
use crate::storage::Storage;
use crate::verify::{Digest256, StreamHasher};

/// Reads every buffered file, and populates mapped ones when asked, through
/// one queue of jobs; then seals each buffer read-only and checks that no
/// file changed size meanwhile. With `verify`, a file read whole is hashed
/// as its chunks land (its digest left in [`OpenFile::sha256`]). Returns,
/// for the report, how many reads the load kept in flight and why, and
/// where the OS refused some reader threads, how many ran.
pub(crate) fn read_all(
    opened: &mut [OpenFile],
    concurrency: Concurrency,
    chunk: usize,
    (populate, verify): (bool, bool),
    clock: Instant,
    progress: Option<&Callback>,
) -> Result<(Option<Settled>, Option<String>)> {
    let mut shortfall = None;
    let mut settled = None;
    // The bytes before a whole-file buffer's image (the header), hashed
    // first; the buffer holds the rest of the file.
    let mut prefixes: Vec<Option<Vec<u8>>> = Vec::with_capacity(opened.len());
    for shard in opened.iter() {
        let base = match &shard.body {
            Body::Buffered { layout, .. } if verify && layout.image => {
                layout.segments.first().map(|s| s.src)
            }
            _ => None,
        };
        let Some(base) = base else {
            prefixes.push(None);
            continue;
        };
        let mut prefix = vec![0u8; usize::try_from(base).unwrap_or(0)];
        os::read_exact_at(&shard.file, &mut prefix, 0).map_err(|(at, e)| {
            read_error("reading", &shard.file, &shard.path, shard.size, at, e)
        })?;
        prefixes.push(Some(prefix));
    }
    let lens: Vec<u64> = opened.iter().map(|s| s.header.file_len()).collect();
    let hashers: Vec<Option<StreamHasher<'_>>> = prefixes
        .iter()
        .map(|p| p.as_deref().map(StreamHasher::new))
        .collect();
    let mut jobs: Vec<Tagged<'_>> = Vec::new();
    let mut finished: Vec<&AtomicU64> = Vec::with_capacity(opened.len());
    let mut overflowed: Vec<Option<&AtomicU64>> = Vec::with_capacity(opened.len());
    for (file_index, shard) in opened.iter_mut().enumerate() {
        let OpenFile {
            body,
            file,
            decision,
            finished_at,
            header,
            convert,
            populated,
            ..
        } = shard;
        finished.push(&*finished_at);
        // The converted tensors: from the map where the file is mapped,
        // else read by the readers (plain reads: the runs are not blocks).
        let mut conversion = match convert {
            Some(part) => {
                overflowed.push(Some(&part.overflowed));
                match &mut part.buffer {
                    ConvertBuffer::Filling(buffer) => {
                        Some((&part.placements, part.to, &mut buffer[..]))
                    }
                    _ => None,
                }
            }
            None => {
                overflowed.push(None);
                None
            }
        };
        let buffer_and_layout = match body {
            Body::Buffered { buffer, layout } => (buffer, layout),
            Body::Mapped(storage) => {
                let storage: &Storage = storage;
                if let Some((placements, to, dst)) = conversion.take() {
                    let plan = (&*header, placements.as_slice(), to);
                    split_convert(
                        &mut jobs,
                        file_index,
                        plan,
                        dst,
                        ConvertFrom::Map(storage.bytes()),
                        chunk,
                    );
                }
                if populate {
                    split_populate(&mut jobs, file_index, (storage.map(), file), chunk);
                    *populated = true;
                }
                continue;
            }
            _ => continue,
        };
        if let Some((placements, to, dst)) = conversion.take() {
            let plan = (&*header, placements.as_slice(), to);
            split_convert(
                &mut jobs,
                file_index,
                plan,
                dst,
                ConvertFrom::File(file),
                chunk,
            );
        }
        let (buffer, layout) = buffer_and_layout;
        // Direct reads need whole blocks: round the chunk down to one.
        let direct = decision.direct_io();
        let source: &File = file;
        let chunk = if direct {
            (chunk as u64 - chunk as u64 % DIRECT_ALIGN).max(DIRECT_ALIGN) as usize
        } else {
            chunk
        };
        let mut rest: &mut [u8] = &mut buffer[..];
        let mut at = 0u64;
        for segment in &layout.segments {
            let skip = usize::try_from(segment.dst - at).unwrap_or(usize::MAX);
            let len = usize::try_from(segment.len).unwrap_or(usize::MAX);
            let Some((_, tail)) = rest.split_at_mut_checked(skip) else {
                break;
            };
            let Some((dst, tail)) = tail.split_at_mut_checked(len) else {
                break;
            };
            rest = tail;
            at = segment.dst + segment.len;
            let required = usize::try_from(segment.required).unwrap_or(len);
            let hashed = matches!(prefixes.get(file_index), Some(Some(_)));
            split_read(
                &mut jobs,
                file_index,
                (source, direct, hashed),
                segment.src,
                dst,
                required,
                chunk,
            );
        }
    }
    if !jobs.is_empty() {
        // Progress: the bytes of every job, and a file done with its last.
        let mut left: Vec<AtomicUsize> = (0..finished.len()).map(|_| AtomicUsize::new(0)).collect();
        let mut total = 0u64;
        for job in &jobs {
            if let Some(n) = left.get_mut(job.file_index) {
                *n.get_mut() += 1;
            }
            total += job.job.bytes();
        }
        let files_total = left
            .iter()
            .filter(|n| n.load(Ordering::Relaxed) > 0)
            .count();
        let meter = Meter::new(progress, Phase::Read, total, files_total);
        // The closure is written at the call so that its argument has the
        // jobs' own lifetime: the hashers keep the bytes it hands them.
        // Reads that convert from a file hold a scratch buffer each.
        let converting = jobs.iter().any(|j| {
            matches!(
                j.job,
                Job::Convert {
                    source: ConvertSource::File { .. },
                    ..
                }
            )
        });
        let concurrency = if converting {
            concurrency.converting()
        } else {
            concurrency
        };
        let (result, started, io) = run(jobs, concurrency, &|file_index, outcome| {
            meter.add(outcome.bytes);
            if left
                .get(file_index)
                .is_some_and(|n| n.fetch_sub(1, Ordering::AcqRel) == 1)
            {
                meter.file_done();
            }
            if let (Some((offset, bytes)), Some(Some(hasher))) =
                (outcome.landed, hashers.get(file_index))
            {
                hasher.land(offset, bytes);
            }
            if outcome.overflowed > 0 {
                if let Some(Some(counter)) = overflowed.get(file_index) {
                    counter.fetch_add(outcome.overflowed, Ordering::Relaxed);
                }
            }
            if let Some(f) = finished.get(file_index) {
                f.fetch_max(since(clock), Ordering::Relaxed);
            }
        });
        shortfall = started.shortfall();
        settled = Some(io);
        meter.finish();
        drop(finished);
        let digests: Vec<Option<Digest256>> = hashers
            .into_iter()
            .zip(&lens)
            .map(|(h, &len)| h.and_then(|h| h.finish(len)))
            .collect();
        for (shard, digest) in opened.iter_mut().zip(digests) {
            if digest.is_some() {
                shard.sha256 = digest;
            }
        }
        if let Err(failure) = result {
            let shard = opened.get(failure.file_index);
            return Err(match shard {
                Some(s) => read_error(
                    failure.operation,
                    &s.file,
                    &s.path,
                    s.header.file_len(),
                    failure.offset,
                    failure.error,
                ),
                None => Error::without_path(ErrorKind::Io {
                    operation: failure.operation,
                    offset: Some(failure.offset),
                }),
            });
        }
    }
    for shard in opened.iter_mut() {
        if let Some(part) = &mut shard.convert {
            if let ConvertBuffer::Filling(buffer) =
                std::mem::replace(&mut part.buffer, ConvertBuffer::Taken)
            {
                let map = buffer
                    .make_read_only()
                    .map_err(|e| Error::io("sealing the buffer of", &shard.path, None, e))?;
                part.buffer =
                    ConvertBuffer::Sealed(Arc::new(Storage::new(map, shard.path.clone())));
            }
        }
        let read_through = matches!(shard.body, Body::Buffered { .. })
            || shard
                .convert
                .as_ref()
                .is_some_and(|_| !matches!(shard.body, Body::Mapped(_)));
        if !read_through {
            continue;
        }
        // The file may have been truncated or grown during the read.
        let now = file_len(&shard.file, &shard.path)?;
        if now != shard.header.file_len() {
            return Err(size_mismatch(&shard.path, shard.header.file_len(), now));
        }
        if let Body::Buffered { buffer, layout } = std::mem::replace(&mut shard.body, Body::Taken) {
            let map = buffer
                .make_read_only()
                .map_err(|e| Error::io("sealing the buffer of", &shard.path, None, e))?;
            shard.body = Body::Read { map, layout };
        }
    }
    Ok((settled, shortfall))
}

// NOTE: prefaulting fresh buffers in a parallel pass before reading into them
// (`MADV_POPULATE_WRITE` over 32 MiB pieces) was measured and rejected: on
// 2.2 GiB, 8 readers of 16 MiB, 3 interleaved runs each (2026-11-29), cold
// direct loads took 1.50-3.54 s with it and 1.19-1.25 s without, warm loads
// 1.43-2.76 s with it and 0.96-1.08 s without. The readers already fault
// their destinations in parallel, each its own chunk, while the reads of the
// others are in flight; a separate pass only adds a serial phase. What ships
// instead overlaps the faulting with direct reads: one helper thread walking
// the queue ahead of the readers (`reads_bypass_the_page_cache` in
// `src/jobs.rs`, with its measurements).
