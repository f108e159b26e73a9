//! The read engine of a load: every filling file's reads, conversions and populates put in one job queue (`jobs/`), from each file's source into its destinations, hashed as they land where verified.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::adapt::{Concurrency, Settled};
use crate::cancel::Cancel;
use crate::dest::pages::PageSizes;
use crate::error::Result;
use crate::file::life::{Destination, Filling, Parts};
use crate::file::since;
use crate::jobs::{
    Conversion, ConvertFrom, ConvertSource, Job, JobError, MappedFile, ReadFrom, Tagged, carve,
    run, split_convert, split_populate, split_read,
};
use crate::os::DIRECT_ALIGN;
use crate::plan::cluster::Piece;
use crate::progress::Meter;
use crate::report::LoadNote;
use crate::source::Source;
use crate::storage::{Segment, Storage};
use crate::verify::{Digest256, StreamHasher};
use crate::workers;

use super::Left;

/// How the read engine runs a load's jobs.
#[derive(Clone, Copy)]
pub(crate) struct ReadOptions<'a> {
    pub concurrency: Concurrency,
    pub read_size: usize,
    pub populate: bool,
    /// The load's start, for each file's finishing time.
    pub clock: Instant,
    /// The pieces of a load split between nodes, and this node's index.
    pub share: Option<(&'a [Piece], usize)>,
    pub pages: &'a PageSizes,
    pub cancel: &'a Cancel,
}

/// The read engine of one load, its jobs queued, before it runs.
pub(crate) struct ReadEngine<'a> {
    queued: Queued<'a>,
    hashers: Vec<Option<StreamHasher<'a>>>,
    lens: Vec<u64>,
    sources: Vec<&'a dyn Source>,
}

/// What a run gives: each file's digest where hashed, the engine's figures.
pub(crate) struct Ran {
    pub digests: Vec<Option<Digest256>>,
    pub io: Option<Settled>,
    pub note: Option<LoadNote>,
}

impl<'a> ReadEngine<'a> {
    /// The jobs of every file of `opened`; `prefixes` ([`read_prefixes`])
    /// start the hash of each file read whole.
    pub(crate) fn queue(
        opened: &'a mut [Filling<'_>],
        prefixes: &'a [Option<Vec<u8>>],
        options: &ReadOptions<'_>,
    ) -> ReadEngine<'a> {
        let (mut lens, mut sources) = (Vec::new(), Vec::new());
        let mut queued = Queued::default();
        for (file_index, shard) in opened.iter_mut().enumerate() {
            lens.push(shard.file().header().file_len());
            let hashed = matches!(prefixes.get(file_index), Some(Some(_)));
            let parts = shard.parts();
            sources.push(parts.source);
            queued.file(file_index, parts, hashed, options);
        }
        let hashers = prefixes
            .iter()
            .map(|p| p.as_deref().map(StreamHasher::new))
            .collect();
        ReadEngine {
            queued,
            hashers,
            lens,
            sources,
        }
    }

    /// The bytes its jobs read, and the files they read some of.
    pub(crate) fn bytes(&self) -> (u64, usize) {
        let jobs = self.queued.jobs.iter().filter(|j| j.job.bytes() > 0);
        let files: std::collections::BTreeSet<usize> = jobs.clone().map(|j| j.file_index).collect();
        (jobs.map(|j| j.job.bytes()).sum(), files.len())
    }

    /// Runs the jobs, counting their bytes into `meter`.
    pub(crate) fn run(self, options: &ReadOptions<'_>, meter: &Meter) -> Result<Ran> {
        let ReadEngine {
            queued,
            hashers,
            lens,
            sources,
        } = self;
        if queued.jobs.is_empty() {
            return Ok(Ran {
                digests: vec![None; lens.len()],
                io: None,
                note: None,
            });
        }
        let (result, started, io) = queued.run(&hashers, options, meter);
        let digests: Vec<Option<Digest256>> = hashers
            .into_iter()
            .zip(&lens)
            .map(|(h, &len)| h.and_then(|h| h.finish(len)))
            .collect();
        if let Err(failure) = result {
            let source = sources.get(failure.file_index).copied();
            return Err(failure.on(source));
        }
        Ok(Ran {
            digests,
            io: Some(io),
            note: LoadNote::threads("reading", &started),
        })
    }
}

/// With `verify`, each file's bytes before its image (the header), hashed first.
pub(crate) fn read_prefixes(
    opened: &mut [Filling<'_>],
    verify: bool,
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut prefixes = Vec::with_capacity(opened.len());
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
        crate::source::read_exact(parts.source, &mut prefix, 0)?;
        prefixes.push(Some(prefix));
    }
    Ok(prefixes)
}

/// A load's jobs, and per file what the run updates as they complete.
#[derive(Default)]
struct Queued<'a> {
    jobs: Vec<Tagged<'a>>,
    finished: Vec<&'a AtomicU64>,
    overflowed: Vec<&'a AtomicU64>,
}

impl<'a> Queued<'a> {
    /// Queues the jobs of file `file_index`.
    fn file(
        &mut self,
        file_index: usize,
        parts: Parts<'a>,
        hashed: bool,
        options: &ReadOptions<'_>,
    ) {
        let Parts {
            source,
            header,
            destination,
            direct,
            convert,
            file,
            finished_at,
            overflowed,
            populated,
        } = parts;
        self.finished.push(finished_at);
        self.overflowed.push(overflowed);
        let chunk = options.read_size;
        // Conversions read plain (their runs are not blocks). Every buffer
        // is registered with the page sizes once.
        let conversion = convert.map(|(part, dst)| {
            options.pages.register(dst);
            let conversion = Conversion {
                header,
                placements: part.placements.as_slice(),
                to: part.to,
            };
            (conversion, dst)
        });
        let (buffer, layout) = match destination {
            Destination::Buffer { buffer, layout } => (buffer, layout),
            Destination::Map(storage) => {
                let storage: &Storage = storage;
                if let Some((plan, dst)) = conversion {
                    let from = ConvertFrom::Map(storage.bytes());
                    split_convert(&mut self.jobs, file_index, plan, dst, from, chunk);
                }
                *populated = self.populate(file_index, storage, file, options);
                return;
            }
        };
        if let Some((plan, dst)) = conversion {
            let from = ConvertFrom::File(source);
            split_convert(&mut self.jobs, file_index, plan, dst, from, chunk);
        }
        // Direct reads need whole blocks: round the chunk down to one.
        let chunk = if direct {
            (chunk as u64 - chunk as u64 % DIRECT_ALIGN).max(DIRECT_ALIGN) as usize
        } else {
            chunk
        };
        options.pages.register(buffer.bytes_mut());
        let segments = segments_of(&layout.segments, options.share, file_index);
        let from = ReadFrom {
            source,
            direct,
            hashed,
        };
        self.reads(file_index, from, &segments, buffer.bytes_mut(), chunk);
    }

    /// Queues the reads of `segments` into `buffer`, in jobs of `chunk`.
    fn reads(
        &mut self,
        file_index: usize,
        from: ReadFrom<'a>,
        segments: &[Segment],
        buffer: &'a mut [u8],
        chunk: usize,
    ) {
        let (mut rest, mut at) = (buffer, 0u64);
        for segment in segments {
            let Some(dst) = carve(&mut rest, &mut at, segment.dst, segment.len) else {
                break;
            };
            let required = usize::try_from(segment.required).unwrap_or(dst.len());
            let jobs = &mut self.jobs;
            split_read(jobs, file_index, from, segment.src, dst, required, chunk);
        }
    }

    /// Queues the populates of a file's map where the load populates.
    fn populate(
        &mut self,
        file_index: usize,
        storage: &'a Storage,
        file: Option<&'a std::fs::File>,
        options: &ReadOptions<'_>,
    ) -> bool {
        let (true, Some(file), Some(map)) = (options.populate, file, storage.file_map()) else {
            return false;
        };
        let mapped = MappedFile { map, file };
        split_populate(&mut self.jobs, file_index, mapped, options.read_size);
        true
    }

    /// Runs the jobs, each counted as it completes.
    fn run(
        self,
        hashers: &[Option<StreamHasher<'a>>],
        options: &ReadOptions<'_>,
        meter: &Meter,
    ) -> (Result<(), JobError>, workers::Started, Settled) {
        let Queued {
            jobs,
            finished,
            overflowed,
        } = self;
        let left = Left::new(
            finished.len(),
            jobs.iter().map(|j| (j.file_index, j.job.bytes())),
        );
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
            options.concurrency.converting()
        } else {
            options.concurrency
        };
        let clock = options.clock;
        // Written at the call so that its argument has the jobs' lifetime
        // (the hashers keep the bytes).
        run(
            jobs,
            concurrency,
            options.pages,
            &|file_index, outcome| {
                left.landed(meter, file_index, outcome.bytes);
                if let (Some((offset, bytes)), Some(Some(hasher))) =
                    (outcome.landed, hashers.get(file_index))
                {
                    hasher.land(offset, bytes);
                }
                if outcome.overflowed > 0 {
                    if let Some(counter) = overflowed.get(file_index) {
                        counter.fetch_add(outcome.overflowed, Ordering::Relaxed);
                    }
                }
                if let Some(f) = finished.get(file_index) {
                    f.fetch_max(since(clock), Ordering::Relaxed);
                }
            },
            options.cancel,
        )
    }
}

/// The segments of file `file_index` this node reads.
fn segments_of<'s>(
    layout: &'s [Segment],
    share: Option<(&[Piece], usize)>,
    file_index: usize,
) -> std::borrow::Cow<'s, [Segment]> {
    match share {
        Some((pieces, me)) => pieces
            .iter()
            .filter(|p| p.file == file_index && p.owner == me)
            .map(|p| Segment {
                src: p.src,
                dst: p.dst,
                len: p.len,
                required: p.required,
            })
            .collect(),
        None => std::borrow::Cow::Borrowed(layout),
    }
}

// NOTE: no prefaulting pass before the reads (a serial phase): faulting
// overlaps them (BENCHMARKS.md, "execute/queue.rs: prefaulting").
