//! The steps of a load after its files are open, shared by `Loader::load` and `Checkpoint::load_filtered`: prefetch, fit in memory, read, verify, assemble.

use std::path::Path;
use std::time::Instant;

use super::{assemble, engine};
use crate::checkpoint::open::{self, Body, Context, OpenFile};
use crate::checkpoint::{Resolved, ShardFile};
use crate::error::{Error, ErrorKind, Result};
use crate::memory;
use crate::mount::MountTable;
use crate::options::Options;
use crate::policy::{self, Environment};
use crate::prefetch;
use crate::state_dict::StateDict;
use crate::trace;
use crate::verify;
use crate::workers;

use crate::adapt::Concurrency;
use crate::jobs::DEFAULT_READ_SIZE;

/// Files opened at once: the caller's number, else the machine's.
pub(crate) fn threads(opts: &Options) -> usize {
    opts.threads.unwrap_or_else(workers::default_width).max(1)
}

/// The mount table decisions are made from: the caller's, else this
/// process's (none where it cannot be read: every file is then "unknown").
pub(crate) fn mount_table(opts: &Options) -> Option<MountTable> {
    match &opts.mount_table {
        Some(table) => Some(table.clone()),
        None => MountTable::current().ok(),
    }
}

/// Opens `shards` of `resolved` in parallel, each with its header read and
/// checked, its mount found and its way of being read decided; then checks
/// the headers against each other and the index. Also returns what went
/// otherwise than planned (threads refused), for the report.
pub(crate) fn open_files(
    opts: &Options,
    resolved: &Resolved,
    shards: &[&ShardFile],
    env: &Environment,
    clock: Instant,
) -> Result<(Vec<OpenFile>, Vec<String>)> {
    let (mode, origin) = policy::effective_mode(opts.mode, env);
    let table = mount_table(opts);
    let ctx = Context {
        resolved,
        mode,
        origin,
        table: table.as_ref(),
        clock,
    };
    let (files, openers) = workers::map(shards, threads(opts), "safeload-open", |shard| {
        open::open(shard, &ctx)
    })?;
    let notes = openers
        .shortfall()
        .map(|s| format!("opening files: {s}"))
        .into_iter()
        .collect();
    let headers: Vec<_> = files
        .iter()
        .map(|f| (f.path.as_path(), &f.header))
        .collect();
    resolved.check_headers(&headers)?;
    trace::traced! {
        for file in &files {
            tracing::debug!(
                target: "safeload",
                file = %file.path.display(),
                strategy = %file.decision.strategy,
                reason = %file.decision,
                "opened"
            );
        }
    }
    Ok((files, notes))
}

/// Everything a load does once its files are open and prepared: warm the
/// page cache where asked or where the auto policy says so, fit the buffered
/// files in memory, read them (and populate mapped ones) through one job
/// queue, hash and check them where asked, hand out tensors.
pub(crate) fn finish(
    opts: &Options,
    resolved: &Resolved,
    mut files: Vec<OpenFile>,
    env: &Environment,
    (clock, mut notes): (Instant, Vec<String>),
    path: &Path,
) -> Result<StateDict> {
    // 1. Warm the page cache before any tensor byte is touched.
    let job = prefetch::Job {
        local_rank: opts.local_rank,
        memory_available: opts.memory_available,
        env,
        progress: opts.progress.as_ref(),
    };
    let handed: Vec<prefetch::LoadFile<'_>> = files.iter().map(OpenFile::handed).collect();
    let prefetched = prefetch::before_load(&handed, opts.prefetch.as_ref(), &job)?;
    drop(handed);

    // 2. Make sure buffered files fit in memory, then allocate them; decide
    //    direct I/O now, when a prefetch has warmed what it warms.
    fit_in_memory(opts, &mut files, path)?;
    for file in &mut files {
        file.choose_direct_io(opts.direct_io);
        file.allocate()?;
    }

    // 3. Read every buffered file (and populate mapped ones) through one
    //    job queue; hash what is to be verified.
    let concurrency = match opts.io_concurrency {
        Some(n) => Concurrency::pinned(n),
        None => Concurrency::adaptive(policy::default_io_concurrency(
            files
                .iter()
                .filter_map(|f| f.mount.as_ref().map(|m| m.kind)),
        )),
    };
    let read_size = opts.read_size.unwrap_or(DEFAULT_READ_SIZE);
    let verify = policy::verify(opts.verify, env, !opts.expected_sha256.is_empty());
    let read = engine::read_all(
        &mut files,
        concurrency,
        read_size,
        (opts.populate, verify),
        clock,
        opts.progress.as_ref(),
    );
    for file in &files {
        file.end_direct_io();
    }
    let (io, readers) = read?;
    notes.extend(readers.map(|s| format!("reading: {s}")));
    let threads = threads(opts);
    if verify {
        verify_files(opts, &mut files, threads)?;
    }

    // 4. Hand out tensors.
    let io_concurrency = io.as_ref().map_or(concurrency.start, |s| s.readers);
    let mut state_dict = assemble::assemble(resolved, files, clock, threads, io_concurrency)?;
    state_dict.report.io = io;
    state_dict.report.prefetch = prefetched;
    state_dict.report.notes = notes;
    trace::traced! {
        let report = &state_dict.report;
        tracing::info!(
            target: "safeload",
            files = report.files().len(),
            tensor_bytes = report.tensor_bytes(),
            bytes_read = report.bytes_read(),
            seconds = report.elapsed().as_secs_f64(),
            "loaded"
        );
        for note in report.notes() {
            tracing::warn!(target: "safeload", note = %note, "the load ran otherwise than planned");
        }
    }
    Ok(state_dict)
}

/// Hashes the files the read engine did not (mapped ones, and files read
/// only in part), in parallel, and checks every digest against what the
/// file must have.
pub(crate) fn verify_files(opts: &Options, files: &mut [OpenFile], threads: usize) -> Result<()> {
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
    let missing: Vec<&OpenFile> = files.iter().filter(|f| f.sha256.is_none()).collect();
    let (digests, _) = workers::map(&missing, threads, "safeload-verify", |f| {
        let digest = match &f.body {
            Body::Mapped(storage) => verify::of_map(storage.map()),
            _ => verify::of_file(&f.file, f.header.file_len())
                .map_err(|(at, e)| open::read_error("hashing", &f.file, &f.path, f.size, at, e))?,
        };
        Ok(digest)
    })?;
    let mut digests = digests.into_iter();
    for file in files.iter_mut() {
        if file.sha256.is_none() {
            file.sha256 = digests.next();
        }
        let name = file.path.file_name().and_then(|n| n.to_str());
        let must = expected
            .iter()
            .find(|(n, _)| Some(*n) == name)
            .map(|&(_, d)| d)
            .or_else(|| verify::expected_from_cache(&file.canonical));
        if let (Some(must), Some(actual)) = (must, file.sha256) {
            if must != actual {
                return Err(Error::new(
                    ErrorKind::IntegrityMismatch {
                        expected: verify::hex(&must),
                        actual: verify::hex(&actual),
                    },
                    &file.path,
                ));
            }
        }
    }
    Ok(())
}

/// The memory guard: buffered files that do not fit in the memory
/// available are mapped instead where the auto policy chose buffered;
/// where the caller asked for buffered, the load fails with the numbers
/// instead of meeting the OOM killer.
pub(crate) fn fit_in_memory(
    opts: &Options,
    files: &mut [OpenFile],
    checkpoint: &Path,
) -> Result<()> {
    // Asking the kernel and the cgroup costs more than a small mapped load.
    let any_pending = files
        .iter()
        .any(|f| f.pending_bytes() > 0 || f.converted_bytes() > 0);
    let available = opts
        .memory_available
        .or_else(|| any_pending.then(memory::available).flatten());
    let Some(available) = available else {
        return Ok(());
    };
    // Converted tensors need memory whatever the file's strategy: they are
    // counted as files that cannot be mapped instead.
    let pending: Vec<(u64, bool)> = files
        .iter()
        .map(|f| (f.pending_bytes(), f.decision.switchable()))
        .chain(files.iter().map(|f| (f.converted_bytes(), false)))
        .collect();
    let verdict = policy::memory_guard(&pending, Some(available));
    for (file, map) in files.iter_mut().zip(&verdict.map_instead) {
        if *map {
            // A refused map leaves the file buffered, checked below.
            file.map_instead(&verdict, available);
        }
    }
    let still: Vec<u64> = files
        .iter()
        .map(OpenFile::pending_bytes)
        .chain(files.iter().map(OpenFile::converted_bytes))
        .filter(|&n| n > 0)
        .collect();
    policy::memory_fits(still.len(), still.iter().sum(), Some(available)).map_err(
        |(needed, available)| {
            Error::new(
                ErrorKind::InsufficientMemory { needed, available },
                checkpoint,
            )
        },
    )
}
