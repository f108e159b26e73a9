//! The read engine of a load: every filling file's reads, conversions and populates put in one job queue (`jobs/`), from each file's source into its destinations, hashed as they land where verified.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::adapt::{Concurrency, Settled};
use crate::dest::pages::PageSizes;
use crate::error::Operation;
use crate::error::{Error, ErrorKind, Result};
use crate::file::life::{Destination, Filling, Parts};
use crate::file::{read_error, since};
use crate::jobs::{
    ConvertFrom, ConvertSource, Job, Tagged, run, split_convert, split_populate, split_read,
};
use crate::os::DIRECT_ALIGN;
use crate::plan::cluster::Piece;
use crate::progress::{Callback, Meter, Phase};
use crate::report::Note;
use crate::source::Source;
use crate::storage::{Segment, Storage};
use crate::verify::{Digest256, StreamHasher};

/// Reads every buffered file, and populates mapped ones when asked, through
/// one queue of jobs. With `verify`, a file read whole is hashed as its
/// chunks land (its digest left in the file's state). Returns, for the
/// report, how many reads the load kept in flight and why, and where the OS
/// refused some reader threads, how many ran. Sealing is the caller's next
/// step ([`Filling::seal`]). Every destination is faulted in through
/// `pages`, which measures what each page size costs where it may choose.
///
/// With `share` (a load split between the nodes of a job, `exchange.rs`),
/// a buffered file's reads are only the pieces this node owns; the rest
/// arrive from the other nodes afterwards.
pub(crate) fn read_all(
    opened: &mut [Filling<'_>],
    (concurrency, chunk): (Concurrency, usize),
    (populate, verify): (bool, bool),
    clock: Instant,
    progress: Option<&Callback>,
    share: Option<(&[Piece], usize)>,
    pages: &PageSizes,
) -> Result<(Option<Settled>, Option<Note>)> {
    let mut shortfall = None;
    let mut settled = None;
    // The bytes before a whole-file buffer's image (the header), hashed
    // first; the buffer holds the rest of the file.
    let mut prefixes: Vec<Option<Vec<u8>>> = Vec::with_capacity(opened.len());
    for shard in opened.iter_mut() {
        let parts = shard.parts();
        let base = match &*parts.destination {
            Destination::Buffer { layout, .. } if verify && layout.image => {
                layout.segments.first().map(|s| s.src)
            }
            _ => None,
        };
        let Some(base) = base else {
            prefixes.push(None);
            continue;
        };
        let mut prefix = vec![0u8; usize::try_from(base).unwrap_or(0)];
        let want = prefix.len();
        parts
            .source
            .read_at(&mut prefix, want, 0)
            .map_err(|(at, e)| {
                read_error(Operation::Read, parts.source, parts.source.len(), at, e)
            })?;
        prefixes.push(Some(prefix));
    }
    let lens: Vec<u64> = opened
        .iter()
        .map(|s| s.file().header().file_len())
        .collect();
    let sources: Vec<&dyn Source> = opened.iter().map(|s| s.file().source()).collect();
    let hashers: Vec<Option<StreamHasher<'_>>> = prefixes
        .iter()
        .map(|p| p.as_deref().map(StreamHasher::new))
        .collect();
    let mut jobs: Vec<Tagged<'_>> = Vec::new();
    let mut finished: Vec<&AtomicU64> = Vec::with_capacity(opened.len());
    let mut overflowed: Vec<Option<&AtomicU64>> = Vec::with_capacity(opened.len());
    for (file_index, shard) in opened.iter_mut().enumerate() {
        let Parts {
            source,
            header,
            destination,
            direct,
            convert,
            file,
            finished_at,
            overflowed: overflow,
            populated,
        } = shard.parts();
        finished.push(finished_at);
        overflowed.push(Some(overflow));
        // The converted tensors: from the map where the file is mapped,
        // else read by the readers (plain reads: the runs are not blocks).
        // Every buffer asked for the page size in use, once (`PageSizes::register`).
        let mut conversion = convert.map(|(part, dst)| {
            pages.register(dst);
            (&part.placements, part.to, dst)
        });
        let (buffer, layout) = match destination {
            Destination::Buffer { buffer, layout } => (buffer, layout),
            Destination::Map(storage) => {
                let storage: &Storage = storage;
                if let Some((placements, to, dst)) = conversion.take() {
                    let plan = (header, placements.as_slice(), to);
                    split_convert(
                        &mut jobs,
                        file_index,
                        plan,
                        dst,
                        ConvertFrom::Map(storage.bytes()),
                        chunk,
                    );
                }
                if let (true, Some(file), Some(map)) = (populate, file, storage.file_map()) {
                    split_populate(&mut jobs, file_index, (map, file), chunk);
                    *populated = true;
                }
                continue;
            }
        };
        if let Some((placements, to, dst)) = conversion.take() {
            let plan = (header, placements.as_slice(), to);
            split_convert(
                &mut jobs,
                file_index,
                plan,
                dst,
                ConvertFrom::File(source),
                chunk,
            );
        }
        // Direct reads need whole blocks: round the chunk down to one.
        let chunk = if direct {
            (chunk as u64 - chunk as u64 % DIRECT_ALIGN).max(DIRECT_ALIGN) as usize
        } else {
            chunk
        };
        pages.register(buffer.bytes_mut());
        let mut rest: &mut [u8] = buffer.bytes_mut();
        let mut at = 0u64;
        // This node's pieces of the file, as segments, where the load is
        // shared between nodes; else the layout's segments.
        let owned: Vec<Segment>;
        let segments: &[Segment] = match share {
            Some((pieces, me)) => {
                owned = pieces
                    .iter()
                    .filter(|p| p.file == file_index && p.owner == me)
                    .map(|p| Segment {
                        src: p.src,
                        dst: p.dst,
                        len: p.len,
                        required: p.required,
                    })
                    .collect();
                &owned
            }
            None => &layout.segments,
        };
        for segment in segments {
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
        // Progress: the bytes of every job, and a file done with its last
        // byte (counted in bytes: the readers may cut a read in pieces).
        let mut left: Vec<AtomicU64> = (0..finished.len()).map(|_| AtomicU64::new(0)).collect();
        let mut total = 0u64;
        for job in &jobs {
            if let Some(n) = left.get_mut(job.file_index) {
                *n.get_mut() += job.job.bytes();
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
        let (result, started, io) = run(jobs, concurrency, pages, &|file_index, outcome| {
            meter.add(outcome.bytes);
            if outcome.bytes > 0
                && left
                    .get(file_index)
                    .is_some_and(|n| n.fetch_sub(outcome.bytes, Ordering::AcqRel) == outcome.bytes)
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
        shortfall = Note::threads("reading", &started);
        settled = Some(io);
        meter.finish();
        drop(finished);
        let digests: Vec<Option<Digest256>> = hashers
            .into_iter()
            .zip(&lens)
            .map(|(h, &len)| h.and_then(|h| h.finish(len)))
            .collect();
        for (shard, digest) in opened.iter_mut().zip(digests) {
            if let Some(digest) = digest {
                shard.set_sha256(digest);
            }
        }
        if let Err(failure) = result {
            return Err(match sources.get(failure.file_index) {
                Some(&source) => read_error(
                    failure.operation,
                    source,
                    source.len(),
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
// `src/jobs/mod.rs`, with its measurements).
