//! A load once its files are open, shared by `Loader::load` and `Checkpoint::load_filtered`: prefetch, plan, fill (the read engine), seal, verify, assemble.

mod cached;
pub(crate) mod engine;
pub(crate) mod exchange;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::dest::pages::{HostHugePages, PageSizes};
use crate::error::Operation;
use crate::error::{Error, ErrorKind, Result};
use crate::file::life::{Planned, Sealed};
use crate::file::{self, OpenedFile, read_error, threads};
use crate::memory;
use crate::node;
use crate::options::Options;
use crate::plan::{self, FileFacts, PlanOptions};
use crate::policy::{self, Environment};
use crate::prefetch;
use crate::report::{LoadReport, Note};
use crate::resolve::Resolved;
use crate::state_dict::StateDict;
use crate::trace;
use crate::verify;
use crate::workers;

/// One load of files already open: each with the nanoseconds, from the
/// load's start, at which its part in the load began.
pub(crate) struct Run<'a> {
    pub opts: &'a Options,
    pub resolved: &'a Resolved,
    pub env: &'a Environment,
    /// The tensors to load (the options' filter, or a checkpoint's).
    pub keep: Option<&'a (dyn Fn(&str) -> bool + Sync)>,
    pub clock: Instant,
    /// What went otherwise than planned so far (threads refused).
    pub notes: Vec<Note>,
    /// The checkpoint's path, for errors about the whole load.
    pub path: &'a Path,
    /// The job's exchange between nodes, on this node's participant
    /// (`SAFELOAD_EXCHANGE`): the load's buffered reads split between the
    /// nodes.
    pub exchange: Option<&'a dyn crate::cluster::Exchange>,
    /// This process is another local rank of a node whose participant
    /// takes part in such a split: it waits for the participant's node
    /// copies (`node::Role::Member`).
    pub member: bool,
}

impl Run<'_> {
    /// Everything a load does once its files are open: warm the page cache
    /// where asked or where the auto policy says so, plan (which tensors,
    /// where they land, direct I/O, the memory guard), fill the destinations
    /// through one job queue, seal them, hash and check where asked, hand
    /// out tensors.
    pub(crate) fn finish(self, files: &[(&OpenedFile, u64)]) -> Result<StateDict> {
        let Run {
            opts,
            resolved,
            env,
            keep,
            clock,
            mut notes,
            path,
            exchange,
            member,
        } = self;
        // Split between the nodes of a job, where there are several.
        let exchange = exchange.filter(|e| e.nodes() > 1);
        let role = match (exchange, member) {
            (Some(_), _) => node::Role::Participant,
            (None, true) => node::Role::Member,
            (None, false) => node::Role::Queue,
        };
        // 1. One copy per node of what several local ranks read buffered,
        // then the page cache warmed for the rest before any tensor byte is
        // touched (a file with a copy is read once already).
        let opened: Vec<&OpenedFile> = files.iter().map(|&(f, _)| f).collect();
        let several = role != node::Role::Queue
            || (prefetch::LocalRank::from_setting(opts.local_rank, env).size > 1
                && policy::node_copy(env));
        if several {
            for write in opened.iter().filter_map(|f| f.source().cache_write()) {
                write.pause();
            }
        }
        let (mut copies, pending) = node::share(&opened, opts, env, keep, role);
        // The files fetched through a cache: written from the node copy, or
        // (read by this process alone) fetched into the file being written.
        let cache_maps = if several {
            cached::after_node_copies(&opened, &copies, role);
            Vec::new()
        } else {
            cached::map_destinations(&opened, &mut copies, opts, keep)
        };
        let job = prefetch::Job {
            local_rank: opts.local_rank,
            memory_available: opts.memory_available,
            env,
            progress: opts.progress.as_ref(),
        };
        let handed: Vec<prefetch::LoadFile<'_>> = files
            .iter()
            .zip(&copies)
            .filter(|(_, c)| !matches!(c, node::PerFile::Copy { .. }))
            .filter_map(|((f, _), _)| f.handed())
            .collect();
        let prefetched = prefetch::before_load(&handed, opts.prefetch.as_ref(), &job)?;
        drop(handed);

        // 2. Plan, now that a prefetch has warmed what it warms.
        let cached: Vec<Box<dyn Fn() -> bool + '_>> = files
            .iter()
            .map(|(f, _)| {
                Box::new(move || f.local().is_some_and(|l| l.mostly_cached()))
                    as Box<dyn Fn() -> bool>
            })
            .collect();
        let facts: Vec<FileFacts<'_>> = files
            .iter()
            .zip(&cached)
            .zip(&copies)
            .map(|(((f, _), cached), copy)| FileFacts {
                header: f.header(),
                decision: f.decision(),
                // A node copy is viewed as the file's map would be.
                mapped: f.map().is_some() || matches!(copy, node::PerFile::Copy { .. }),
                kind: f.source().mount().map(|m| m.kind),
                mostly_cached: &**cached,
            })
            .collect();
        let plan_opts = PlanOptions {
            keep,
            dtype: opts.dtype,
            direct_io: opts.direct_io,
        };
        // Asking the kernel and the cgroup costs more than a small mapped
        // load: the plan asks only where something is to be read.
        let plans = plan::plan(&facts, &plan_opts, || {
            opts.memory_available.or_else(memory::available)
        })
        .map_err(|no| {
            Error::new(
                ErrorKind::InsufficientMemory {
                    needed: no.needed,
                    available: no.available,
                },
                path,
            )
        })?;

        // 3. Allocate, and fill every destination through one job queue.
        let mut filling = Vec::with_capacity(files.len());
        let mut notes_of_copies: Vec<(Option<crate::report::NodeCopy>, u64)> = copies
            .iter()
            .map(|c| match c {
                node::PerFile::Copy { bytes_read, .. } => (c.report(), *bytes_read),
                _ => (c.report(), 0),
            })
            .collect();
        // A cache's file as the destination is no node copy: nothing to say.
        for (i, _) in &cache_maps {
            if let Some((note, _)) = notes_of_copies.get_mut(*i) {
                *note = None;
            }
        }
        for ((&(file, started_at), plan), copy) in files.iter().zip(plans).zip(&mut copies) {
            let copy = match std::mem::replace(copy, node::PerFile::Absent) {
                node::PerFile::Copy { storage, .. } => Some(storage),
                _ => None,
            };
            filling.push(
                Planned::new(file, plan, started_at)
                    .with_copy(copy)
                    .fill(clock)?,
            );
        }
        let (concurrency, read_size) = policy::io_defaults(
            files.iter().map(|(f, _)| f.source()),
            (opts.io_concurrency, opts.read_size),
        );
        let verify = policy::verify(opts.verify, env, !opts.expected_sha256.is_empty());
        // The node copies this load fills itself (the participant's), and
        // the files being written to a cache that are the load's destination.
        let (copy_index, copy_files): (Vec<usize>, Vec<exchange::Copy<'_>>) = pending
            .iter()
            .flat_map(|p| &p.files)
            .chain(&cache_maps)
            .filter_map(|(i, writer)| Some((*i, (files.get(*i)?.0, writer))))
            .unzip();
        // Split between the nodes of a job, where they agree on the files.
        let share = match exchange {
            Some(ex) => {
                let facts = exchange::Facts {
                    converting: opts.dtype.is_some(),
                    verifying: verify,
                };
                let both = (filling.as_mut_slice(), copy_files.as_slice());
                exchange::agree(ex, both, &facts, path, &mut notes)?.map(|pieces| (ex, pieces))
            }
            None => None,
        };
        // This node's pieces of the copies, read before any broadcast;
        // every piece where the nodes read alone.
        let copy_pieces = match &share {
            Some((ex, pieces)) => (pieces.clone(), ex.node()),
            None => (exchange::alone(filling.len(), &copy_files), 0),
        };
        let copies_read = exchange::read_copies(
            &copy_files,
            &copy_pieces.0,
            (filling.len(), copy_pieces.1),
            (concurrency.start, read_size),
            opts,
        )?;
        for (&i, read) in copy_index.iter().zip(copies_read) {
            if let Some((_, bytes_read)) = notes_of_copies.get_mut(i) {
                *bytes_read += read;
            }
            // A cache's file is done when its last read is.
            if cache_maps.iter().any(|(k, _)| *k == i) {
                if let Some(filling) = filling.get_mut(i) {
                    let done = file::since(clock);
                    filling
                        .parts()
                        .finished_at
                        .fetch_max(done, Ordering::Relaxed);
                }
            }
        }
        let (huge_pages, origin) = policy::huge_pages(opts.huge_pages, env);
        let pages = PageSizes::new(huge_pages, origin, HostHugePages::of_host());
        let (io, readers) = engine::read_all(
            &mut filling,
            (concurrency, read_size),
            (opts.populate, verify),
            clock,
            opts.progress.as_ref(),
            share.as_ref().map(|(ex, p)| (p.as_slice(), ex.node())),
            &pages,
        )?;
        if let Some((ex, pieces)) = &share {
            let both = (filling.as_mut_slice(), copy_files.as_slice());
            notes.push(exchange::receive(*ex, both, pieces, clock)?);
        }
        // Every byte of the copies in place: the node's other ranks may map them.
        if let Some(pending) = &pending {
            pending.complete();
        }
        drop(copy_files);
        notes.extend(readers);
        notes.extend(crate::file::fetched_whole(files.iter().map(|&(f, _)| f)));
        let mut sealed = filling
            .into_iter()
            .map(|f| f.seal())
            .collect::<Result<Vec<_>>>()?;
        let threads = threads(opts);
        if verify {
            verify_files(opts, &mut sealed, threads)?;
        }

        // 4. Hand out tensors.
        let io_concurrency = io.as_ref().map_or(concurrency.start, |s| s.readers);
        let mut state_dict = assemble(resolved, sealed, clock, threads, io_concurrency)?;
        if let Some((ex, pieces)) = &share {
            exchange::count_reads(&mut state_dict.report.files, pieces, ex.node());
        }
        for (file, (note, read)) in state_dict.report.files.iter_mut().zip(notes_of_copies) {
            file.node_copy = note;
            file.bytes_read += read;
        }
        state_dict.report.io_concurrency_reason = io.as_ref().map(Note::reads);
        state_dict.report.prefetch = prefetched;
        state_dict.report.fresh_memory = pages.report();
        state_dict.report.notes = notes;
        trace::traced! {
            let report = &state_dict.report;
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
        Ok(state_dict)
    }
}

/// The `StateDict` of sealed files: every selected tensor a view of its
/// file's storage, in file order, with the merged metadata and the report.
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
        report: LoadReport {
            files,
            elapsed: clock.elapsed(),
            threads,
            io_concurrency,
            prefetch: None,
            fresh_memory: None,
            notes: Vec::new(),
            io_concurrency_reason: None,
        },
    })
}

/// Hashes the files the read engine did not (mapped ones, and files read
/// only in part), in parallel, and checks every digest against what the
/// file must have.
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
