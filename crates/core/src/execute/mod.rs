//! A load once its files are open, shared by `Loader::load` and `Checkpoint::load_filtered`: prefetch, plan, fill (the read engine), seal, verify, assemble.

mod cached;
pub(crate) mod exchange;
pub(crate) mod queue;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::adapt::Concurrency;
use crate::dest::node::CopyFill;
use crate::dest::pages::{HostHugePages, PageSizes};
use crate::error::Operation;
use crate::error::{Error, ErrorKind, Result};
use crate::extras::{self, LocalRank, PerFile, Role};
use crate::file::life::{Filling, Planned, Sealed};
use crate::file::{self, OpenedFile, read_error, threads};
use crate::memory;
use crate::options::Options;
use crate::plan::cluster::Piece;
use crate::plan::{self, FileFacts, FilePlan, PlanOptions};
use crate::policy::{self, Environment};
use crate::progress::{Meter, Phase};
use crate::report::{ConcurrencyReason, LoadNote, LoadReport, NodeCopy, PrefetchReport};
use crate::resolve::Resolved;
use crate::state_dict::StateDict;
use crate::trace;
use crate::verify;
use crate::workers;

/// One load of files already open.
pub(crate) struct Run<'a> {
    pub opts: &'a Options,
    pub resolved: &'a Resolved,
    pub env: &'a Environment,
    /// The tensors to load (the options' filter, or a checkpoint's).
    pub keep: Option<&'a (dyn Fn(&str) -> bool + Sync)>,
    pub clock: Instant,
    /// What went otherwise than planned so far (threads refused).
    pub notes: Vec<LoadNote>,
    /// The checkpoint's path, for errors about the whole load.
    pub path: &'a Path,
    /// The job's exchange between nodes, on this node's participant.
    pub exchange: Option<&'a dyn crate::cluster::Exchange>,
    /// Another local rank of a participant's node: it waits for the
    /// participant's node copies (`Role::Member`).
    pub member: bool,
}

/// One file of a load as its stages see it.
struct Entry<'a> {
    file: &'a OpenedFile,
    /// Nanoseconds from the load's start at which its part began.
    started_at: u64,
    /// What the node copy did for it (its storage taken by `allocate`).
    copy: PerFile,
    /// What the report says of its node copy.
    copy_report: Option<NodeCopy>,
    /// Bytes of its tensor data this rank read into a copy.
    copy_read: u64,
    /// The participant's node copy, or the cache's file being written,
    /// that the load fills.
    fills: Option<Fills>,
}

/// A copy the load fills through its writer.
struct Fills {
    writer: CopyFill,
    /// The cache's file being written, not a node copy.
    cache_file: bool,
}

impl Run<'_> {
    /// Everything a load does once its files (each with the nanoseconds,
    /// from the load's start, at which its part began) are open.
    pub(crate) fn finish(mut self, files: &[(&OpenedFile, u64)]) -> Result<StateDict> {
        let exchange = self.exchange.filter(|e| e.nodes() > 1);
        let (mut entries, pending) = self.share_copies(files, exchange.is_some());
        let prefetched = self.prefetch(&entries)?;
        let plans = self.plan(&entries)?;
        let mut filling = allocate(&mut entries, plans, self.clock)?;
        let reads = self.reads(files);
        let copies: Vec<exchange::Copy<'_>> = entries
            .iter()
            .filter_map(|e| Some((e.file, &e.fills.as_ref()?.writer)))
            .collect();
        let share = match exchange {
            Some(ex) => {
                let facts = exchange::Facts {
                    converting: self.opts.dtype.is_some(),
                    verifying: reads.verify,
                };
                let (path, notes) = (self.path, &mut self.notes);
                let pieces = exchange::agree(ex, &mut filling, &copies, &facts, path, notes)?;
                pieces.map(|pieces| (ex, pieces))
            }
            None => None,
        };
        let (huge_pages, origin) = policy::huge_pages(self.opts.huge_pages, self.env);
        let pages = PageSizes::new(huge_pages, origin, HostHugePages::of_host());
        let (copies_read, ran) =
            self.read(&mut filling, (&entries, &copies), &share, &reads, &pages)?;
        let (io, readers) = (ran.io, ran.note);
        if let Some((ex, pieces)) = &share {
            let note = exchange::receive(*ex, &mut filling, &copies, pieces, self.clock)?;
            self.notes.push(note);
        }
        // Every byte of the copies in place: the node's other ranks may map them.
        if let Some(pending) = &pending {
            pending.complete();
        }
        drop(copies);
        for (entry, read) in entries
            .iter_mut()
            .filter(|e| e.fills.is_some())
            .zip(copies_read)
        {
            entry.copy_read += read;
        }
        self.notes.extend(readers);
        self.notes
            .extend(crate::file::fetched_whole(files.iter().map(|&(f, _)| f)));
        let threads = threads(self.opts);
        let sealed = self.seal(filling, threads, reads.verify)?;
        let io_concurrency = io.as_ref().map_or(reads.concurrency.start, |s| s.readers);
        let mut state_dict = assemble(self.resolved, sealed, self.clock, threads, io_concurrency)?;
        let report = &mut state_dict.report;
        if let Some((ex, pieces)) = &share {
            exchange::count_reads(&mut report.files, pieces, ex.node());
        }
        for (file, entry) in report.files.iter_mut().zip(entries) {
            file.node_copy = entry.copy_report;
            file.bytes_read += entry.copy_read;
        }
        report.io_concurrency_reason = io.as_ref().map(ConcurrencyReason::of);
        report.prefetch = prefetched;
        report.fresh_memory = pages.report();
        report.notes = self.notes;
        trace_loaded(report);
        for (file, (opened, _)) in report.files.iter().zip(files) {
            if let Some(write) = opened.source().cache_write() {
                // The load returns: a cancel from now on stops nothing of it.
                write.load_returned();
                let source = opened.shared_source();
                state_dict.cache_writes.0.push((file.path.clone(), source));
            }
        }
        Ok(state_dict)
    }

    /// The node copies shared between local ranks, or the cache's files
    /// mapped as destinations: each file's entry, and the copies the load
    /// fills for the node's other ranks.
    fn share_copies<'f>(
        &self,
        files: &[(&'f OpenedFile, u64)],
        split: bool,
    ) -> (Vec<Entry<'f>>, Option<extras::Pending>) {
        let (opts, env) = (self.opts, self.env);
        let role = match (split, self.member) {
            (true, _) => Role::Participant,
            (false, true) => Role::Member,
            (false, false) => Role::Queue,
        };
        let opened: Vec<&OpenedFile> = files.iter().map(|&(f, _)| f).collect();
        let rank = LocalRank::from_setting(opts.local_rank, env);
        let shared_by_ranks = role != Role::Queue || (rank.size > 1 && policy::node_copy(env));
        if shared_by_ranks {
            for write in opened.iter().filter_map(|f| f.source().cache_write()) {
                write.pause();
            }
        }
        let to_share: Vec<extras::ShareFile<'_>> = opened.iter().map(|f| f.to_share()).collect();
        let ask = opts.share_ask(&rank, env, self.keep, role);
        let extras::Shared {
            files: mut copies,
            mut pending,
        } = opts.extras.share(&to_share, &ask);
        let cache_maps = if shared_by_ranks {
            cached::after_node_copies(&opened, &copies, role);
            Vec::new()
        } else {
            cached::map_destinations(&opened, &mut copies, opts, self.keep)
        };
        let mut entries: Vec<Entry<'f>> = files
            .iter()
            .zip(copies)
            .map(|(&(file, started_at), copy)| Entry {
                file,
                started_at,
                copy_report: copy.report(),
                copy_read: match &copy {
                    PerFile::Copy { bytes_read, .. } => *bytes_read,
                    _ => 0,
                },
                copy,
                fills: None,
            })
            .collect();
        let node_copies = pending.iter_mut().flat_map(|p| p.files.drain(..));
        let fills = node_copies
            .map(|(i, writer)| (i, writer, false))
            .chain(cache_maps.into_iter().map(|(i, writer)| (i, writer, true)));
        for (i, writer, cache_file) in fills {
            if let Some(entry) = entries.get_mut(i) {
                // A cache's file as the destination is no node copy: nothing to say.
                if cache_file {
                    entry.copy_report = None;
                }
                entry.fills = Some(Fills { writer, cache_file });
            }
        }
        (entries, pending)
    }

    /// The page cache warmed for the files without a copy.
    fn prefetch(&self, entries: &[Entry<'_>]) -> Result<Option<PrefetchReport>> {
        let job = self.opts.warm_job(self.env, None, &self.opts.cancel);
        let handed: Vec<extras::WarmFile<'_>> = entries
            .iter()
            .filter(|e| !matches!(e.copy, PerFile::Copy { .. }))
            .filter_map(|e| e.file.handed())
            .collect();
        let warming = extras::Warming::BeforeLoad(self.opts.prefetch.as_ref());
        self.opts.extras.warm_up(&handed, warming, &job)
    }

    /// Each file's plan, now that a prefetch has warmed what it warms.
    fn plan(&self, entries: &[Entry<'_>]) -> Result<Vec<FilePlan>> {
        let cached: Vec<Box<dyn Fn() -> bool + '_>> = entries
            .iter()
            .map(|e| {
                let f = e.file;
                Box::new(move || f.local().is_some_and(|l| l.mostly_cached()))
                    as Box<dyn Fn() -> bool>
            })
            .collect();
        let facts: Vec<FileFacts<'_>> = entries
            .iter()
            .zip(&cached)
            .map(|(e, cached)| FileFacts {
                header: e.file.header(),
                decision: e.file.decision(),
                // A node copy is viewed as the file's map would be.
                mapped: e.file.map().is_some() || matches!(e.copy, PerFile::Copy { .. }),
                kind: e.file.source().mount().map(|m| m.kind),
                mostly_cached: &**cached,
            })
            .collect();
        let plan_opts = PlanOptions {
            keep: self.keep,
            dtype: self.opts.dtype,
            direct_io: self.opts.direct_io,
        };
        // Asking the kernel and the cgroup costs more than a small mapped
        // load: the plan asks only where something is to be read.
        let available = || self.opts.memory_available.or_else(memory::available);
        plan::plan(&facts, &plan_opts, available).map_err(|no| {
            let kind = ErrorKind::InsufficientMemory {
                needed: no.needed,
                available: no.available,
            };
            Error::new(kind, self.path)
        })
    }

    /// How the load's reads go.
    fn reads(&self, files: &[(&OpenedFile, u64)]) -> Reads {
        let opts = self.opts;
        let (concurrency, read_size) = opts.io_defaults(files.iter().map(|(f, _)| f.source()));
        let verify = policy::verify(opts.verify, self.env, !opts.expected_sha256.is_empty());
        Reads {
            concurrency,
            read_size,
            verify,
        }
    }

    /// The load's reads, this node's of the copies then the read engine's,
    /// under one progress meter: the tensor bytes read of each copy, and
    /// the engine's figures.
    fn read(
        &self,
        filling: &mut [Filling<'_>],
        (entries, copies): (&[Entry<'_>], &[exchange::Copy<'_>]),
        share: &Option<(&dyn crate::cluster::Exchange, Vec<Piece>)>,
        reads: &Reads,
        pages: &PageSizes,
    ) -> Result<(Vec<u64>, queue::Ran)> {
        let read_options = queue::ReadOptions {
            concurrency: reads.concurrency,
            read_size: reads.read_size,
            populate: self.opts.populate,
            clock: self.clock,
            share: share.as_ref().map(|(ex, p)| (p.as_slice(), ex.node())),
            pages,
            cancel: &self.opts.cancel,
        };
        let buffers = filling.len();
        let prefixes = queue::read_prefixes(filling, reads.verify)?;
        let engine = queue::ReadEngine::queue(filling, &prefixes, &read_options);
        let copy_reads = self.copy_reads(copies, share, reads, buffers);
        let meter = self.meter(&engine, &copy_reads, copies.len());
        let readers = reads.concurrency.start;
        let copies_read = exchange::read_copies(copies, &copy_reads, readers, &meter, self.opts)?;
        let copies_done = file::since(self.clock);
        let mut ran = engine.run(&read_options, &meter)?;
        meter.finish();
        for (shard, digest) in filling.iter_mut().zip(ran.digests.drain(..)) {
            if let Some(digest) = digest {
                shard.set_sha256(digest);
            }
        }
        self.mark_cache_files_done(entries, filling, copies_done);
        Ok((copies_read, ran))
    }

    /// This node's reads of the copies the load fills (placed after the
    /// `buffers`).
    fn copy_reads(
        &self,
        copies: &[exchange::Copy<'_>],
        share: &Option<(&dyn crate::cluster::Exchange, Vec<Piece>)>,
        reads: &Reads,
        buffers: usize,
    ) -> Vec<(usize, u64, u64)> {
        let (pieces, me) = match share {
            Some((ex, pieces)) => (pieces.clone(), ex.node()),
            None => (exchange::alone(buffers, copies), 0),
        };
        let place = exchange::Place { buffers, me };
        exchange::copy_reads(copies, &pieces, place, reads.read_size)
    }

    /// The load's one progress meter, over the copies' reads and the jobs.
    fn meter(
        &self,
        engine: &queue::ReadEngine<'_>,
        copy_reads: &[(usize, u64, u64)],
        copies: usize,
    ) -> Meter {
        let (bytes, files) = engine.bytes();
        let copy_bytes: u64 = copy_reads.iter().map(|&(_, _, len)| len).sum();
        let read: std::collections::BTreeSet<usize> = copy_reads.iter().map(|r| r.0).collect();
        let copy_files = read.range(..copies).count();
        let progress = self.opts.progress.as_ref();
        Meter::new(
            progress,
            Phase::Read,
            bytes + copy_bytes,
            files + copy_files,
        )
    }

    /// A cache's file is done with its last read (`done`).
    fn mark_cache_files_done(&self, entries: &[Entry<'_>], filling: &mut [Filling<'_>], done: u64) {
        for (entry, filling) in entries.iter().zip(filling.iter_mut()) {
            if entry.fills.as_ref().is_some_and(|f| f.cache_file) {
                filling
                    .parts()
                    .finished_at
                    .fetch_max(done, Ordering::Relaxed);
            }
        }
    }

    /// Every file sealed, then hashed and checked where the load verifies.
    fn seal<'f>(
        &self,
        filling: Vec<Filling<'f>>,
        threads: usize,
        verify: bool,
    ) -> Result<Vec<Sealed<'f>>> {
        let mut sealed = filling
            .into_iter()
            .map(Filling::seal)
            .collect::<Result<Vec<_>>>()?;
        if verify {
            verify_files(self.opts, &mut sealed, threads)?;
        }
        Ok(sealed)
    }
}

/// The bytes left to read of each file, for the progress meter's files done.
struct Left(Vec<AtomicU64>);

impl Left {
    /// Of `files` files, from the reads `(file, bytes)` to come.
    fn new(files: usize, reads: impl Iterator<Item = (usize, u64)>) -> Left {
        let mut left: Vec<AtomicU64> = (0..files).map(|_| AtomicU64::new(0)).collect();
        for (k, len) in reads {
            if let Some(n) = left.get_mut(k) {
                *n.get_mut() += len;
            }
        }
        Left(left)
    }

    /// Counts `len` bytes of file `k` into `meter`, and the file with its last.
    fn landed(&self, meter: &Meter, k: usize, len: u64) {
        meter.add(len);
        let last = |n: &AtomicU64| n.fetch_sub(len, Ordering::AcqRel) == len;
        if len > 0 && self.0.get(k).is_some_and(last) {
            meter.file_done();
        }
    }
}

/// How a load's reads go.
struct Reads {
    concurrency: Concurrency,
    read_size: usize,
    verify: bool,
}

/// Each file's destinations: its buffers, or its map, or its node copy's.
fn allocate<'f>(
    entries: &mut [Entry<'f>],
    plans: Vec<FilePlan>,
    clock: Instant,
) -> Result<Vec<Filling<'f>>> {
    let mut filling = Vec::with_capacity(entries.len());
    for (entry, plan) in entries.iter_mut().zip(plans) {
        let copy = match std::mem::replace(&mut entry.copy, PerFile::Absent) {
            PerFile::Copy { storage, .. } => Some(storage),
            _ => None,
        };
        let planned = Planned::new(entry.file, plan, entry.started_at).with_copy(copy);
        filling.push(planned.fill(clock)?);
    }
    Ok(filling)
}

/// What the load did, for `tracing` (feature `tracing`).
fn trace_loaded(report: &LoadReport) {
    trace::traced! {
        tracing::info!(
            target: "safeload",
            files = report.files.len(),
            tensor_bytes = report.tensor_bytes(),
            bytes_read = report.bytes_read(),
            seconds = report.elapsed.as_secs_f64(),
            "loaded"
        );
        for note in &report.notes {
            tracing::warn!(target: "safeload", note = %note, "the load ran otherwise than planned");
        }
    }
    let _ = report;
}

/// The `StateDict` of sealed files, tensors in file order.
fn assemble(
    resolved: &Resolved,
    sealed: Vec<Sealed<'_>>,
    clock: Instant,
    threads: usize,
    io_concurrency: usize,
) -> Result<StateDict> {
    let mut tensors = Vec::new();
    let mut metadata = BTreeMap::new();
    let mut files = Vec::with_capacity(sealed.len());
    for file in sealed {
        if let Some(meta) = &file.file().header().metadata {
            for (k, v) in meta {
                metadata.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        files.push(file.into_tensors(&mut tensors)?);
    }
    let by_name: HashMap<_, _> = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name().to_string(), i))
        .collect();
    Ok(StateDict {
        tensors,
        by_name,
        metadata,
        index_metadata: resolved.index.as_ref().and_then(|i| i.metadata.clone()),
        cache_writes: crate::state_dict::CacheWrites::default(),
        report: LoadReport {
            files,
            elapsed: clock.elapsed(),
            threads,
            io_concurrency,
            prefetch: None,
            fresh_memory: None,
            notes: Vec::new(),
            io_concurrency_reason: None,
            extra_files: resolved.extra_files(),
        },
    })
}

/// Hashes the files the read engine did not, in parallel, and checks every
/// digest against what the file must have.
fn verify_files(opts: &Options, files: &mut [Sealed<'_>], threads: usize) -> Result<()> {
    let mut expected = Vec::with_capacity(opts.expected_sha256.len());
    for (file, digest) in &opts.expected_sha256 {
        let Some(parsed) = verify::parse_hex(digest) else {
            return Err(Error::without_path(ErrorKind::InvalidDigest {
                file: file.clone(),
                digest: digest.clone(),
            }));
        };
        expected.push((file.as_str(), parsed));
    }
    let missing: Vec<&Sealed<'_>> = files.iter().filter(|f| f.sha256().is_none()).collect();
    let (digests, _) = workers::map(&missing, threads, "safeload-verify", |f| {
        let digest = match f.map() {
            Some(storage) => verify::of_bytes(storage.bytes()),
            None => {
                let file = f.file();
                verify::of_source(file.source(), file.header().file_len()).map_err(|(at, e)| {
                    read_error(Operation::Hash, file.source(), file.size(), at, e)
                })?
            }
        };
        Ok(digest)
    })?;
    let mut digests = digests.into_iter();
    for file in files.iter_mut() {
        if file.sha256().is_none() {
            if let Some(digest) = digests.next() {
                file.set_sha256(digest);
            }
        }
        let opened = file.file();
        let name = opened.path().file_name().and_then(|n| n.to_str());
        let must = expected
            .iter()
            .find(|(n, _)| Some(*n) == name)
            .map(|&(_, d)| d)
            .or_else(|| opened.source().published_sha256())
            .or_else(|| {
                let local = opened.local()?;
                verify::expected_from_cache(local.canonical())
            });
        if let (Some(must), Some(actual)) = (must, file.sha256()) {
            if must != actual {
                return Err(Error::new(
                    ErrorKind::IntegrityMismatch {
                        expected: verify::hex(&must),
                        actual: verify::hex(&actual),
                    },
                    opened.path(),
                ));
            }
        }
    }
    Ok(())
}
