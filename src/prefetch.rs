//! Page-cache warming before a load: the local ranks of a job stream a checkpoint's bytes into the page cache through one shared chunk queue, skipping what is resident and staying within the memory guard.
//!
//! # How the work is shared
//!
//! The files are cut into chunks (8 MiB by default) in checkpoint order. The
//! local ranks of a job (the processes of one node: `LOCAL_RANK` /
//! `LOCAL_WORLD_SIZE` and their Slurm and MPI equivalents) share one queue of
//! chunk states, a small file in `/dev/shm` that every rank maps. Each of a
//! rank's `streams` readers starts at its own byte offset (the checkpoint's
//! bytes split evenly over ranks × streams, never by global rank, so every
//! node warms every byte) and claims free chunks onward with a
//! compare-and-swap, so a rank that finishes early goes on with the chunks
//! of a slower one and no chunk is read twice on a node. When no chunk is
//! free, a reader takes over the chunks of claimers that have died and waits
//! for those of live ones.
//!
//! # The queue file
//!
//! `safeload-prefetch-<hash>.queue`, where the hash covers the files'
//! canonical paths, devices, inodes, sizes and modification times, the chunk
//! size and the job (the launcher's job id, else the parent pid). It is
//! created `0600` and is an array of native-endian `u64` words, each read and
//! written only with atomic operations:
//!
//! | words | content |
//! |---|---|
//! | 0 | magic `b"SLPFQUE1"`, stored last when the file is initialized |
//! | 1 | format version (1) |
//! | 2 | a second hash of the key, checked on attach |
//! | 3, 4, 5 | chunk size, chunk count, total bytes |
//! | 6 | number of rank slots (256) |
//! | 7 | creation time, Unix seconds |
//! | 8, 9 | bytes resident when created, bytes that were not |
//! | 10, 11 | memory available, the guard's budget (`u64::MAX`: unknown) |
//! | 12 | bytes the guard left cold |
//! | 13 | 1 when residency could be checked |
//! | 14, 15 | reserved (0) |
//! | 16 .. 16+slots | rank slots: 0 empty, an owner (attached), or bit 63 and an owner (finished) |
//! | then, one per chunk | 0 free, an owner (claimed), `1<<63 \| 1` done, `1<<63 \| 2` skipped by the guard |
//!
//! An owner is `tag << 32 | pid`, the tag being the low 31 bits of the
//! process's start time (from `/proc/<pid>/stat`), so that a reused pid is
//! not taken for the rank that died. A process is dead when `kill(pid, 0)`
//! says `ESRCH`, when it is a zombie, or when its start time differs.
//!
//! Creating, attaching and leaving happen under `flock(2)` on the file. The
//! first rank creates it, checks residency and applies the memory guard while
//! holding the lock, then stores the magic; the others wait on the lock,
//! validate what they find (size, magic, version, key, layout, every word)
//! and replace a file that fails, or that no live rank is attached to (a
//! stale file from an earlier run). The last live rank to leave removes it.
//!
//! Residency is checked before each chunk is read, so a stale "done" costs
//! nothing but a check, and after a rank's chunks are done it checks what
//! landed and reads what did not, once.
//!
//! Liveness needs the ranks to share a pid namespace, as the processes one
//! launcher starts on a node do; where they do not, a live rank may be taken
//! for dead and its chunks read twice (never left cold). More than 256 ranks
//! on a node share the chunks, but only the first 256 count for removing the
//! file.
//!
//! Readers are threads of their own, like the read engine's: they block on
//! storage. They do not go through the read engine itself, which runs a list
//! of jobs fixed in advance, because here a chunk is only known to be this
//! rank's when its claim succeeds.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use memmap2::Mmap;

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::load::DEFAULT_READ_SIZE as DEFAULT_CHUNK;
use crate::memory;
use crate::mount::{self, Mount, MountKind, MountTable};
use crate::os;
use crate::policy::{self, PrefetchMethod};
use crate::report::{PrefetchReport, human_bytes};
use crate::storage;
use crate::workers;

/// The environment variable that turns prefetch on with this many streams
/// per rank (`0` turns it off, also where the auto policy would turn it on).
/// [`Loader::prefetch`](crate::Loader::prefetch) overrides it.
pub const PREFETCH_ENV: &str = "SAFELOAD_PREFETCH";

/// Read as [`PREFETCH_ENV`] when that is unset, for jobs that already set it
/// for `transformers`.
pub const HF_SHARD_PREFETCH_ENV: &str = "HF_SHARD_PREFETCH";

/// Readers per rank when prefetch is on and no number is given.
pub(crate) const DEFAULT_STREAMS: usize = 4;

/// The memory guard warms at most this fraction of the memory available.
const GUARD_NUMERATOR: u64 = 9;
const GUARD_DENOMINATOR: u64 = 10;

/// A queue of more chunks than this gets larger chunks instead (32 MiB of
/// queue at most).
const MAX_CHUNKS: u64 = 1 << 22;

/// Chunks are at least this large (and a multiple of the page size).
const MIN_CHUNK: u64 = 64 << 10;

/// How often a reader with nothing to claim looks at the queue again.
const POLL: Duration = Duration::from_millis(2);

/// A reader stops waiting for chunks claimed by live ranks when no chunk of
/// the queue has finished for this long, and reports them as not warmed.
const STALL: Duration = Duration::from_secs(60);

/// After `WILLNEED`, the residency of a chunk is polled this often, and the
/// rest is read when nothing has landed for `WILLNEED_IDLE`.
const WILLNEED_POLL: Duration = Duration::from_micros(500);
const WILLNEED_IDLE: Duration = Duration::from_millis(50);

/// The largest read of the `Pread` method: one scratch buffer per reader.
const SCRATCH: u64 = 8 << 20;

/// Pages sampled per chunk before a chunk is taken as resident.
///
/// NOTE: counting a chunk's cached pages costs a page-cache lookup per page
/// in the kernel, for `cachestat(2)` and `mincore(2)` alike: 16 ms per GiB on
/// this project's VM (`perf`: all of it in `filemap_cachestat`); two full
/// passes made a warm 1 GiB prefetch take 32 ms where a warm mapped load with
/// `populate(true)` took 88-125 ms (26-36 %). Sampling 16 pages per chunk
/// (one per 512 KiB of an 8 MiB chunk), counting exactly only where a sample
/// is missing, and skipping the final count when nothing was read, brings it
/// to 2.7-3.1 ms against 119-129 ms, 2.2-2.4 % (`examples/prefetch_methods.rs`,
/// its "warm" line, 2026-11-29).
const SAMPLES: u64 = 16;

type ChunkCallback = Arc<dyn Fn(&Path, Range<u64>) + Send + Sync>;

/// The options of a prefetch, set as one expression.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data = vec![0u8; 1 << 16];
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 16], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// use safeload::{Loader, PrefetchMethod, PrefetchOptions};
///
/// let options = PrefetchOptions::new()
///     .streams(8)                      // readers in this process
///     .local_rank(0, 1)                // instead of LOCAL_RANK / LOCAL_WORLD_SIZE, ...
///     .method(PrefetchMethod::Pread)   // instead of the measured default
///     .on_chunk(|path, range| eprintln!("{}: {range:?} warm", path.display()));
/// let report = safeload::prefetch(&path, &options)?;
/// assert_eq!((report.streams(), report.method()), (8, PrefetchMethod::Pread));
///
/// let sd = Loader::new().prefetch_with(options).load(&path)?; // the same, then load
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PrefetchOptions {
    streams: usize,
    local_rank: Option<(usize, usize)>,
    memory_available: Option<u64>,
    method: PrefetchMethod,
    chunk_size: Option<usize>,
    shared_queue: bool,
    queue_dir: Option<PathBuf>,
    on_chunk: Option<ChunkCallback>,
}

impl Default for PrefetchOptions {
    fn default() -> Self {
        PrefetchOptions {
            streams: DEFAULT_STREAMS,
            local_rank: None,
            memory_available: None,
            method: PrefetchMethod::Auto,
            chunk_size: None,
            shared_queue: true,
            queue_dir: None,
            on_chunk: None,
        }
    }
}

impl fmt::Debug for PrefetchOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefetchOptions")
            .field("streams", &self.streams)
            .field("local_rank", &self.local_rank)
            .field("memory_available", &self.memory_available)
            .field("method", &self.method)
            .field("chunk_size", &self.chunk_size)
            .field("shared_queue", &self.shared_queue)
            .field("queue_dir", &self.queue_dir)
            .field("on_chunk", &self.on_chunk.as_ref().map(|_| "<fn>"))
            .finish()
    }
}

impl PrefetchOptions {
    /// Four streams per rank, rank from the launcher, method by filesystem,
    /// 8 MiB chunks, the shared queue in `/dev/shm`.
    pub fn new() -> PrefetchOptions {
        PrefetchOptions::default()
    }

    /// Readers in this process (default 4). Zero turns prefetch off.
    pub fn streams(mut self, streams: usize) -> PrefetchOptions {
        self.streams = streams;
        self
    }

    /// This process's rank among the processes of the job on this node, and
    /// their number, instead of the launcher's variables. `rank >= size`
    /// is taken as a single process.
    pub fn local_rank(mut self, rank: usize, size: usize) -> PrefetchOptions {
        self.local_rank = Some((rank, size));
        self
    }

    /// Takes this many bytes as the memory available to the memory guard,
    /// instead of the smaller of `MemAvailable` and the cgroup's room
    /// (within a load, [`Loader::memory_available`](crate::Loader::memory_available)
    /// where this is unset).
    pub fn memory_available(mut self, bytes: u64) -> PrefetchOptions {
        self.memory_available = Some(bytes);
        self
    }

    /// How chunks are warmed (default: by filesystem kind).
    pub fn method(mut self, method: PrefetchMethod) -> PrefetchOptions {
        self.method = method;
        self
    }

    /// The unit of work shared between readers and ranks (default 8 MiB),
    /// rounded up to a multiple of the page size and to at least 64 KiB; a
    /// checkpoint of more than 4 Mi chunks gets larger ones. Every rank of a
    /// job must use the same value to share one queue.
    pub fn chunk_size(mut self, bytes: usize) -> PrefetchOptions {
        self.chunk_size = Some(bytes);
        self
    }

    /// Whether the local ranks share one queue file (default `true`). With
    /// `false`, or where the file cannot be made, each rank warms a fixed
    /// share of the bytes.
    pub fn shared_queue(mut self, shared: bool) -> PrefetchOptions {
        self.shared_queue = shared;
        self
    }

    /// Where the queue file lives (default `/dev/shm`, else the temporary
    /// directory). All ranks of a job must agree.
    pub fn queue_dir(mut self, dir: impl Into<PathBuf>) -> PrefetchOptions {
        self.queue_dir = Some(dir.into());
        self
    }

    /// Calls `f(path, byte range)` from a reader thread as each chunk this
    /// process handled is warm, before the chunk is marked done for the
    /// other ranks (progress reporting; a slow `f` delays them).
    pub fn on_chunk(mut self, f: impl Fn(&Path, Range<u64>) + Send + Sync + 'static) -> Self {
        self.on_chunk = Some(Arc::new(f));
        self
    }
}

/// Warms the page cache with the files of the checkpoint at `path` (a
/// `.safetensors` file, an index, or a directory holding one), for a job
/// script that warms, waits at a barrier, then loads.
///
/// Run it in every local rank: they split the bytes between them through a
/// shared queue (see the crate docs, "Prefetch"), and each returns once
/// every chunk is warm or skipped. Chunks already in the page cache are
/// not read; the memory guard warms at most 90 % of the memory available.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data = vec![0u8; 1 << 20];
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 20], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// use safeload::{PrefetchOptions, prefetch};
///
/// let report = prefetch(&path, &PrefetchOptions::new().streams(2))?;
/// assert_eq!(report.total_bytes(), std::fs::metadata(&path)?.len());
/// eprintln!("{report}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// When the checkpoint cannot be resolved, a file cannot be opened, or a
/// read fails (with the file and offset). Problems with the shared queue
/// are not errors: the ranks then split the bytes statically.
pub fn prefetch(path: impl AsRef<Path>, options: &PrefetchOptions) -> Result<PrefetchReport> {
    let checkpoint = checkpoint::resolve(path.as_ref())?;
    let paths: Vec<PathBuf> = checkpoint.shards.into_iter().map(|s| s.path).collect();
    let table = MountTable::current().ok();
    let targets = open_targets(&paths, table.as_ref())?;
    let reason = format!("prefetch() with {} stream(s)", options.streams);
    run(targets, options, reason)
}

// ---------------------------------------------------------------------------
// The loader's side.

/// What a load asks of prefetch.
pub(crate) struct LoadRequest<'a> {
    /// `Loader::prefetch` / `prefetch_with`, if called.
    pub caller: Option<&'a PrefetchOptions>,
    /// `Loader::local_rank`, if called.
    pub local_rank: Option<(usize, usize)>,
    /// `Loader::memory_available`, if called.
    pub memory_available: Option<u64>,
}

/// A file the loader has opened (and parsed), handed over so that prefetch
/// neither opens nor looks it up again.
pub(crate) struct LoadFile<'a> {
    pub path: &'a Path,
    /// `path` with symlinks resolved, as the loader found it.
    pub canonical: &'a Path,
    /// The loader's descriptor: the same file the header was read from,
    /// whatever happened to the path since.
    pub file: &'a File,
    pub mount: Option<&'a Mount>,
    /// Whether the loader will map it (auto prefetch is for mapped files).
    pub mapped: bool,
}

impl LoadFile<'_> {
    fn target(&self) -> Result<Target> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io("duplicating the descriptor of", self.path, None, e))?;
        target_from(
            self.path.to_path_buf(),
            self.canonical,
            file,
            self.mount.cloned(),
        )
    }
}

/// Prefetches the files a load is about to open, when asked to (builder,
/// then environment) or when the auto policy says so; `None` when prefetch
/// was not considered.
pub(crate) fn before_load(
    files: &[LoadFile<'_>],
    request: &LoadRequest<'_>,
) -> Result<Option<PrefetchReport>> {
    let env = |name: &str| std::env::var(name).ok();
    let (options, reason) = if let Some(options) = request.caller {
        let reason = format!("prefetch({}) was requested", options.streams);
        (options.clone(), reason)
    } else if let Some((streams, setting)) = streams_from_env(env) {
        (
            PrefetchOptions::new().streams(streams),
            format!("{setting} is set"),
        )
    } else {
        return auto(files, request);
    };
    if options.streams == 0 {
        return Ok(None);
    }
    let options = with_loader_settings(options, request);
    let targets = files
        .iter()
        .map(LoadFile::target)
        .collect::<Result<Vec<_>>>()?;
    run(targets, &options, reason).map(Some)
}

fn with_loader_settings(
    mut options: PrefetchOptions,
    request: &LoadRequest<'_>,
) -> PrefetchOptions {
    if options.local_rank.is_none() {
        options.local_rank = request.local_rank;
    }
    if options.memory_available.is_none() {
        options.memory_available = request.memory_available;
    }
    options
}

/// The auto policy: files on a kernel network filesystem that will be
/// mapped are prefetched when they are not already resident and the memory
/// guard allows all of them.
fn auto(files: &[LoadFile<'_>], request: &LoadRequest<'_>) -> Result<Option<PrefetchReport>> {
    let mut streams = 0;
    let mut targets = Vec::new();
    for f in files {
        let kind = f.mount.map_or(MountKind::Unknown, |m| m.kind);
        if let (true, Some(n)) = (f.mapped, policy::auto_prefetch_streams(kind)) {
            streams = streams.max(n);
            targets.push(f.target()?);
        }
    }
    let Some(first) = targets.first() else {
        return Ok(None);
    };
    let place = first
        .mount
        .as_ref()
        .map(|m| format!("{} ({}) at {}", m.kind, m.fs_type, m.mount_point.display()))
        .unwrap_or_default();
    let options = with_loader_settings(PrefetchOptions::new().streams(streams), request);
    let total: u64 = targets.iter().map(|t| t.len).sum();
    let page = os::page_size();
    let chunk_size = effective_chunk(total, DEFAULT_CHUNK as u64, page);
    let lens: Vec<u64> = targets.iter().map(|t| t.len).collect();
    let chunks = plan_chunks(&lens, chunk_size);
    let available = options.memory_available.or_else(memory::available);
    let init = initial_states(&targets, &chunks, available);
    let rank = local_rank_of(&options);
    let not_run = |reason: String, skip: Option<String>| PrefetchReport {
        ran: false,
        reason,
        rank: rank.rank,
        local_size: rank.size,
        rank_source: rank.source.clone(),
        streams,
        method: PrefetchMethod::Auto,
        files: targets.len(),
        total_bytes: total,
        chunk_size,
        chunks: chunks.len(),
        resident_before: init.resident,
        skipped: if skip.is_some() { init.needed } else { 0 },
        skip_reasons: skip.into_iter().collect(),
        residency_known: init.known,
        ..PrefetchReport::default()
    };
    if init.known && init.needed == 0 {
        return Ok(Some(not_run(
            format!("on {place}, already in the page cache"),
            None,
        )));
    }
    if init.skipped > 0 {
        let why = init.guard_reason(total).unwrap_or_default();
        return Ok(Some(not_run(
            format!("on {place}, the checkpoint does not fit the memory guard"),
            Some(why),
        )));
    }
    let reason = format!(
        "on {place}, {} of {} not in the page cache: warmed first, then mapped",
        human_bytes(init.needed),
        human_bytes(total)
    );
    run(targets, &options, reason).map(Some)
}

// ---------------------------------------------------------------------------
// Pure parts: settings, rank detection, the split, the guard, the queue's words.

/// `SAFELOAD_PREFETCH`, else `HF_SHARD_PREFETCH`, as a number of streams and
/// the setting in words. A value that is not a number is ignored.
pub(crate) fn streams_from_env(env: impl Fn(&str) -> Option<String>) -> Option<(usize, String)> {
    [PREFETCH_ENV, HF_SHARD_PREFETCH_ENV]
        .into_iter()
        .find_map(|name| {
            let value = env(name)?;
            let streams = value.trim().parse::<usize>().ok()?;
            Some((streams, format!("{name}={streams}")))
        })
}

/// This process's place among the job's processes on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LocalRank {
    pub rank: usize,
    pub size: usize,
    /// Where it came from, in words.
    pub source: String,
}

impl LocalRank {
    fn single(source: impl Into<String>) -> LocalRank {
        LocalRank {
            rank: 0,
            size: 1,
            source: source.into(),
        }
    }

    fn checked(rank: usize, size: usize, source: String) -> LocalRank {
        if size == 0 || rank >= size {
            return LocalRank::single(format!("{source}: invalid, taken as one process"));
        }
        LocalRank { rank, size, source }
    }
}

/// The launchers' variables: the local rank, then the local size (the first
/// that is set), and the launcher's name. torchrun comes first: under Slurm
/// or MPI, torchrun's own variables describe its worker processes.
const LAUNCHERS: [(&str, &[&str], &str); 4] = [
    ("LOCAL_RANK", &["LOCAL_WORLD_SIZE"], "torchrun"),
    (
        "SLURM_LOCALID",
        &["SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"],
        "Slurm",
    ),
    (
        "OMPI_COMM_WORLD_LOCAL_RANK",
        &["OMPI_COMM_WORLD_LOCAL_SIZE"],
        "Open MPI",
    ),
    ("MPI_LOCALRANKID", &["MPI_LOCALNRANKS"], "MPICH/Intel MPI"),
];

/// The local rank and size from the launcher's environment variables, read
/// through `env`. The first launcher whose rank and size are both set
/// decides; values that are not numbers, or a rank not below the size, make
/// this process a single rank.
pub(crate) fn detect_local_rank(env: impl Fn(&str) -> Option<String>) -> LocalRank {
    for (rank_var, size_vars, launcher) in LAUNCHERS {
        let Some(rank_text) = env(rank_var) else {
            continue;
        };
        let Some((size_var, size_text)) = size_vars
            .iter()
            .find_map(|&name| env(name).map(|value| (name, value)))
        else {
            continue;
        };
        let source = format!(
            "{rank_var}={} {size_var}={} ({launcher})",
            rank_text.trim(),
            size_text.trim()
        );
        let rank = rank_text.trim().parse::<usize>().ok();
        let size = leading_number(&size_text);
        return match (rank, size) {
            (Some(rank), Some(size)) => LocalRank::checked(rank, size, source),
            _ => LocalRank::single(format!("{source}: not numbers, taken as one process")),
        };
    }
    LocalRank::single("no launcher variables")
}

/// The number a count starts with: Slurm writes `4(x2)` for "4 tasks on
/// each of 2 nodes", and `4,2(x3)` for uneven nodes.
fn leading_number(text: &str) -> Option<usize> {
    let text = text.trim();
    let end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    text.get(..end)?.parse().ok()
}

/// What identifies the job, so that its ranks share a queue and other jobs
/// do not: the launcher's job id, else the parent process (the ranks of one
/// launcher on a node are its children).
pub(crate) fn job_key(env: impl Fn(&str) -> Option<String>, parent_pid: u32) -> String {
    let set = |name: &str| env(name).filter(|v| !v.trim().is_empty());
    if let Some(id) = set("TORCHELASTIC_RUN_ID") {
        return format!("torchelastic:{id}");
    }
    if let Some(job) = set("SLURM_JOB_ID").or_else(|| set("SLURM_JOBID")) {
        let step = set("SLURM_STEP_ID")
            .or_else(|| set("SLURM_STEPID"))
            .unwrap_or_default();
        return format!("slurm:{job}.{step}");
    }
    if let Some(id) = set("OMPI_MCA_ess_base_jobid") {
        return format!("ompi:{id}");
    }
    format!("parent:{parent_pid}")
}

/// A run of one file's bytes: the unit of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

/// The chunk size for a checkpoint of `total` bytes: the request rounded up
/// to whole pages (at least 64 KiB), doubled until the queue has at most
/// 4 Mi chunks. The same inputs give the same size in every rank.
pub(crate) fn effective_chunk(total: u64, requested: u64, page: u64) -> u64 {
    let page = page.max(1);
    let mut chunk = requested.max(MIN_CHUNK).div_ceil(page).saturating_mul(page);
    while total.div_ceil(chunk.max(1)) > MAX_CHUNKS {
        chunk = chunk.saturating_mul(2);
    }
    chunk.max(1)
}

/// Cuts files of these lengths into chunks, in order.
pub(crate) fn plan_chunks(lens: &[u64], chunk: u64) -> Vec<Chunk> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    for (file, &len) in lens.iter().enumerate() {
        let mut offset = 0;
        while offset < len {
            let this = chunk.min(len - offset);
            out.push(Chunk {
                file,
                offset,
                len: this,
            });
            offset += this;
        }
    }
    out
}

/// Splits `chunks` into `parts` runs of about equal bytes: part `p` holds
/// the chunks that start in bytes `[p T / parts, (p + 1) T / parts)` of the
/// concatenated files (of total `T`). Every chunk is in exactly one part;
/// parts may be empty.
pub(crate) fn split_by_bytes(chunks: &[Chunk], parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let total: u64 = chunks.iter().map(|c| c.len).sum();
    let mut starts = Vec::with_capacity(chunks.len());
    let mut at = 0u64;
    for c in chunks {
        starts.push(at);
        at += c.len;
    }
    let boundary = |p: usize| -> u64 {
        let b = u128::from(total) * p as u128 / parts as u128;
        u64::try_from(b).unwrap_or(u64::MAX)
    };
    let mut out = Vec::with_capacity(parts);
    let mut first = 0usize;
    for p in 0..parts {
        let end_byte = boundary(p + 1);
        let mut end = first;
        while starts.get(end).is_some_and(|&s| s < end_byte) {
            end += 1;
        }
        if p + 1 == parts {
            end = chunks.len();
        }
        out.push(first..end);
        first = end;
    }
    out
}

/// Where each of a rank's readers starts, and which chunks it may claim:
/// with a shared queue, everything, readers spread over ranks × streams;
/// without, the rank's own share, its readers spread over it.
pub(crate) fn reader_plan(
    chunks: &[Chunk],
    rank: &LocalRank,
    streams: usize,
    shared: bool,
) -> (Range<usize>, Vec<usize>) {
    let streams = streams.max(1);
    if shared {
        let parts = split_by_bytes(chunks, rank.size.saturating_mul(streams));
        let starts = (0..streams)
            .map(|s| parts.get(rank.rank * streams + s).map_or(0, |r| r.start))
            .collect();
        return (0..chunks.len(), starts);
    }
    let mine = split_by_bytes(chunks, rank.size)
        .get(rank.rank)
        .cloned()
        .unwrap_or(0..0);
    let sub = chunks.get(mine.clone()).unwrap_or(&[]);
    let starts = split_by_bytes(sub, streams)
        .into_iter()
        .map(|r| mine.start + r.start)
        .collect();
    (mine, starts)
}

/// The memory guard's decision, over chunks in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Init {
    /// One word per chunk: free, done (resident), or skipped.
    pub states: Vec<u64>,
    /// Bytes resident when checked.
    pub resident: u64,
    /// Bytes not resident when checked.
    pub needed: u64,
    /// The memory available, where known.
    pub available: Option<u64>,
    /// The most the guard lets prefetch warm: 90 % of `available`.
    pub budget: Option<u64>,
    /// Bytes the guard leaves cold.
    pub skipped: u64,
    /// Whether residency could be checked.
    pub known: bool,
}

impl Init {
    fn guard_reason(&self, total: u64) -> Option<String> {
        if self.skipped == 0 {
            return None;
        }
        let (Some(available), Some(budget)) = (self.available, self.budget) else {
            return None;
        };
        Some(format!(
            "memory guard: warming {} more would exceed {} (90% of {} available){}; {} left cold",
            human_bytes(self.needed),
            human_bytes(budget),
            human_bytes(available),
            if self.resident > 0 {
                format!(
                    ", {} of {} already resident",
                    human_bytes(self.resident),
                    human_bytes(total)
                )
            } else {
                String::new()
            },
            human_bytes(self.skipped)
        ))
    }
}

/// Applies the memory guard: chunks are warmed in order while the bytes not
/// yet resident fit in 90 % of `available`; fully resident chunks are done
/// from the start; the rest is skipped. `resident[i]` is the resident bytes
/// of chunk `i` (0 where unknown).
pub(crate) fn guard(
    chunks: &[Chunk],
    resident: &[u64],
    available: Option<u64>,
    known: bool,
) -> Init {
    let budget = available.map(|a| {
        u64::try_from(u128::from(a) * u128::from(GUARD_NUMERATOR) / u128::from(GUARD_DENOMINATOR))
            .unwrap_or(u64::MAX)
    });
    let mut states = Vec::with_capacity(chunks.len());
    let (mut resident_total, mut needed, mut planned, mut skipped) = (0u64, 0u64, 0u64, 0u64);
    let mut over = false;
    for (i, c) in chunks.iter().enumerate() {
        let r = resident.get(i).copied().unwrap_or(0).min(c.len);
        let missing = c.len - r;
        resident_total += r;
        needed += missing;
        if missing == 0 {
            states.push(DONE);
            continue;
        }
        if !over && budget.is_none_or(|b| planned + missing <= b) {
            planned += missing;
            states.push(FREE);
        } else {
            over = true;
            skipped += missing;
            states.push(SKIPPED);
        }
    }
    Init {
        states,
        resident: resident_total,
        needed,
        available,
        budget,
        skipped,
        known,
    }
}

const MAGIC: u64 = u64::from_le_bytes(*b"SLPFQUE1");
const VERSION: u64 = 1;
const HEADER_WORDS: usize = 16;
const SHARED_SLOTS: usize = 256;

/// Header word positions.
mod at {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const KEY: usize = 2;
    pub const CHUNK_SIZE: usize = 3;
    pub const CHUNKS: usize = 4;
    pub const TOTAL: usize = 5;
    pub const SLOTS: usize = 6;
    pub const CREATED: usize = 7;
    pub const RESIDENT: usize = 8;
    pub const NEEDED: usize = 9;
    pub const AVAILABLE: usize = 10;
    pub const BUDGET: usize = 11;
    pub const SKIPPED: usize = 12;
    pub const KNOWN: usize = 13;
}

const FREE: u64 = 0;
const TERMINAL: u64 = 1 << 63;
const DONE: u64 = TERMINAL | 1;
const SKIPPED: u64 = TERMINAL | 2;
const TAG_MASK: u32 = 0x7FFF_FFFF;

/// A process that claims chunks: its pid and a tag from its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    pub pid: u32,
    /// The low 31 bits of the start time; 0 when unknown.
    pub tag: u32,
}

impl Owner {
    fn word(self) -> u64 {
        (u64::from(self.tag & TAG_MASK) << 32) | u64::from(self.pid)
    }

    fn from_word(word: u64) -> Option<Owner> {
        let pid = (word & 0xFFFF_FFFF) as u32;
        (word & TERMINAL == 0 && pid != 0).then_some(Owner {
            pid,
            tag: (word >> 32) as u32,
        })
    }

    fn current() -> Owner {
        let pid = std::process::id();
        let tag = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .as_deref()
            .and_then(parse_stat)
            .map_or(0, |(_, start)| start_tag(start));
        Owner { pid, tag }
    }

    /// Whether the process still runs: it exists, is not a zombie, and has
    /// the start time it had when it claimed.
    fn alive(self) -> bool {
        if !os::pid_exists(self.pid) {
            return false;
        }
        let Ok(text) = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) else {
            return true; // no /proc to ask: kill(2) said it exists
        };
        match parse_stat(&text) {
            Some(('Z' | 'X' | 'x', _)) => false,
            Some((_, start)) => self.tag == 0 || start_tag(start) == self.tag,
            None => true,
        }
    }
}

fn start_tag(start: u64) -> u32 {
    (start as u32) & TAG_MASK
}

/// The state and start time (field 22, clock ticks since boot) from the
/// text of `/proc/<pid>/stat` (see proc_pid_stat(5)). The command name,
/// field 2, is in parentheses and may hold spaces and parentheses, so the
/// fields are counted after its last `)`.
pub(crate) fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // `state` is field 3; the start time is field 22.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// A chunk word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Free,
    Claimed(Owner),
    Done,
    Skipped,
}

fn chunk_state(word: u64) -> Option<ChunkState> {
    match word {
        FREE => Some(ChunkState::Free),
        DONE => Some(ChunkState::Done),
        SKIPPED => Some(ChunkState::Skipped),
        w => Owner::from_word(w).map(ChunkState::Claimed),
    }
}

/// A rank slot word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Empty,
    Attached(Owner),
    Finished,
}

fn slot_state(word: u64) -> Option<SlotState> {
    if word == 0 {
        return Some(SlotState::Empty);
    }
    if word & TERMINAL != 0 {
        return Owner::from_word(word & !TERMINAL).map(|_| SlotState::Finished);
    }
    Owner::from_word(word).map(SlotState::Attached)
}

/// What a queue must hold to be this checkpoint's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub key: u64,
    pub chunk_size: u64,
    pub chunks: usize,
    pub total: u64,
    pub slots: usize,
}

impl Layout {
    fn words(&self) -> usize {
        HEADER_WORDS + self.slots + self.chunks
    }

    fn bytes(&self) -> u64 {
        self.words() as u64 * 8
    }
}

/// Why a queue file was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// Its size is not this layout's.
    Size,
    /// It was never initialized, or is not a queue.
    Magic,
    /// Another format version.
    Version,
    /// Another checkpoint, chunk size or job.
    Layout,
    /// A word that no rank writes.
    Word,
    /// Valid, but no live rank is attached: left by an earlier run.
    Stale,
}

impl Invalid {
    fn as_str(self) -> &'static str {
        match self {
            Invalid::Size => "its size is not this checkpoint's layout",
            Invalid::Magic => "it was not initialized",
            Invalid::Version => "another format version",
            Invalid::Layout => "another checkpoint or chunk size",
            Invalid::Word => "it holds a corrupt word",
            Invalid::Stale => "no live rank was attached to it",
        }
    }
}

fn load(words: &[AtomicU64], i: usize) -> u64 {
    words.get(i).map_or(0, |w| w.load(Ordering::Acquire))
}

fn store(words: &[AtomicU64], i: usize, value: u64) {
    if let Some(w) = words.get(i) {
        w.store(value, Ordering::Release);
    }
}

fn chunk_words<'a>(words: &'a [AtomicU64], layout: &Layout) -> &'a [AtomicU64] {
    words.get(HEADER_WORDS + layout.slots..).unwrap_or(&[])
}

fn slot_words<'a>(words: &'a [AtomicU64], layout: &Layout) -> &'a [AtomicU64] {
    words
        .get(HEADER_WORDS..HEADER_WORDS + layout.slots)
        .unwrap_or(&[])
}

/// Checks a mapped queue against the layout it must have.
pub(crate) fn validate(words: &[AtomicU64], layout: &Layout) -> std::result::Result<(), Invalid> {
    if words.len() != layout.words() {
        return Err(Invalid::Size);
    }
    if load(words, at::MAGIC) != MAGIC {
        return Err(Invalid::Magic);
    }
    if load(words, at::VERSION) != VERSION {
        return Err(Invalid::Version);
    }
    let same = load(words, at::KEY) == layout.key
        && load(words, at::CHUNK_SIZE) == layout.chunk_size
        && load(words, at::CHUNKS) == layout.chunks as u64
        && load(words, at::TOTAL) == layout.total
        && load(words, at::SLOTS) == layout.slots as u64;
    if !same {
        return Err(Invalid::Layout);
    }
    let slots_ok = slot_words(words, layout)
        .iter()
        .all(|w| slot_state(w.load(Ordering::Acquire)).is_some());
    let chunks_ok = chunk_words(words, layout)
        .iter()
        .all(|w| chunk_state(w.load(Ordering::Acquire)).is_some());
    if !(slots_ok && chunks_ok) {
        return Err(Invalid::Word);
    }
    Ok(())
}

/// Ranks attached to a queue and still running.
fn live_attached(words: &[AtomicU64], layout: &Layout, alive: &dyn Fn(Owner) -> bool) -> usize {
    slot_words(words, layout)
        .iter()
        .filter(|w| matches!(slot_state(w.load(Ordering::Acquire)), Some(SlotState::Attached(o)) if alive(o)))
        .count()
}

/// Writes a new queue: the header, the chunk states, this rank in the first
/// slot, and the magic last.
fn init_words(words: &[AtomicU64], layout: &Layout, init: &Init, me: Option<Owner>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let header = [
        (at::VERSION, VERSION),
        (at::KEY, layout.key),
        (at::CHUNK_SIZE, layout.chunk_size),
        (at::CHUNKS, layout.chunks as u64),
        (at::TOTAL, layout.total),
        (at::SLOTS, layout.slots as u64),
        (at::CREATED, now),
        (at::RESIDENT, init.resident),
        (at::NEEDED, init.needed),
        (at::AVAILABLE, init.available.unwrap_or(u64::MAX)),
        (at::BUDGET, init.budget.unwrap_or(u64::MAX)),
        (at::SKIPPED, init.skipped),
        (at::KNOWN, u64::from(init.known)),
    ];
    for (i, value) in header {
        store(words, i, value);
    }
    for (w, &s) in chunk_words(words, layout).iter().zip(&init.states) {
        w.store(s, Ordering::Release);
    }
    if let (Some(me), Some(slot)) = (me, slot_words(words, layout).first()) {
        slot.store(me.word(), Ordering::Release);
    }
    store(words, at::MAGIC, MAGIC);
}

/// The header's guard numbers, as [`Init`] without the states.
fn init_from_header(words: &[AtomicU64]) -> Init {
    let opt = |v: u64| (v != u64::MAX).then_some(v);
    Init {
        states: Vec::new(),
        resident: load(words, at::RESIDENT),
        needed: load(words, at::NEEDED),
        available: opt(load(words, at::AVAILABLE)),
        budget: opt(load(words, at::BUDGET)),
        skipped: load(words, at::SKIPPED),
        known: load(words, at::KNOWN) == 1,
    }
}

/// FNV-1a, 64 bits: a stable hash (the same in every build and process).
fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------
// The files: opening, residency, the method.

/// How residency of a file's pages is found. Neither way: the kernel does
/// not let this process see it.
struct Probe {
    /// `cachestat(2)` (Linux 6.5+) works: one call counts the pages present
    /// in a range, also those whose read is still in flight. Cheap.
    cachestat: bool,
    /// A read-only shared map of the file, for `mincore(2)`: counts the
    /// pages that hold their data (up to date), one byte per page.
    map: Option<Mmap>,
}

impl Probe {
    const HIDDEN: Probe = Probe {
        cachestat: false,
        map: None,
    };
}

/// One file to warm.
struct Target {
    path: PathBuf,
    file: File,
    len: u64,
    identity: Vec<u8>,
    mount: Option<Mount>,
    probe: Probe,
    /// `WILLNEED` pieces: the most the kernel reads for one call.
    advice_piece: u64,
    /// A second descriptor with read-ahead off, opened on first use.
    bounded: OnceLock<Option<File>>,
}

impl Target {
    /// Bytes of `[offset, offset + len)` in the page cache, counting pages
    /// still being read (they will not be read again); `None` where
    /// residency cannot be seen. `cachestat` where the kernel has it: a warm
    /// checkpoint is checked with one call per chunk, not a lookup per page.
    fn resident(&self, offset: u64, len: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        if self.probe.cachestat {
            let cached = os::cached_pages(&self.file, offset, len).ok()?;
            return Some(pages_to_bytes(cached, len));
        }
        self.landed(offset, len, scratch)
    }

    /// [`resident`](Self::resident), sampled first: `len` when
    /// [`SAMPLES`] pages spread over the range are all present, else the
    /// exact count. A warm checkpoint then costs a few calls per chunk
    /// instead of a page-cache lookup per page (see the `NOTE:` on
    /// [`SAMPLES`]); a page missed between samples is read by the load's
    /// own page fault, as without prefetch.
    fn resident_quick(&self, offset: u64, len: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        let page = os::page_size();
        let pages = len.div_ceil(page);
        let samples = SAMPLES.min(pages).max(1);
        for k in 0..samples {
            let at = offset + (k * pages / samples) * page;
            let one = page.min(offset + len - at);
            if self.resident(at, one, scratch)? < one {
                return self.resident(offset, len, scratch);
            }
        }
        Some(len)
    }

    /// Bytes of `[offset, offset + len)` whose pages hold their data, by
    /// `mincore`; as [`resident`](Self::resident) where the file has no map.
    fn landed(&self, offset: u64, len: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        let Some(map) = &self.probe.map else {
            return match self.probe.cachestat {
                true => self.resident(offset, len, scratch),
                false => None,
            };
        };
        let offset = usize::try_from(offset).ok()?;
        let n = usize::try_from(len).ok()?;
        let pages = os::mincore_pages(map, offset, n, scratch).ok()?;
        Some(pages_to_bytes(pages, len))
    }

    /// A descriptor whose reads bring in what they ask for and no more, for
    /// the chunk before one the memory guard skips: the kernel's read-ahead
    /// on the plain descriptor would warm part of the skipped one.
    fn bounded(&self) -> &File {
        self.bounded
            .get_or_init(|| {
                let file = os::open_regular(&self.path).ok()?;
                os::advise_random(&file).ok()?;
                Some(file)
            })
            .as_ref()
            .unwrap_or(&self.file)
    }

    /// Bytes of the whole file in the page cache, chunk by chunk, sampled.
    fn resident_total(&self, chunk: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        let mut sum = 0;
        let mut offset = 0;
        while offset < self.len {
            let len = chunk.min(self.len - offset);
            sum += self.resident_quick(offset, len, scratch)?;
            offset += len;
        }
        Some(sum)
    }
}

/// `pages` whole pages of a range of `len` bytes, in bytes: all of them
/// when every page is counted (the last one may be partial).
fn pages_to_bytes(pages: u64, len: u64) -> u64 {
    let page = os::page_size();
    if pages >= len.div_ceil(page) {
        len
    } else {
        pages.saturating_mul(page).min(len)
    }
}

fn open_targets(paths: &[PathBuf], table: Option<&MountTable>) -> Result<Vec<Target>> {
    paths
        .iter()
        .map(|path| {
            let file = os::open_regular(path).map_err(|e| Error::io("opening", path, None, e))?;
            let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            let mount = table.and_then(|t| mount::lookup_file_in(t, &file, &canonical).ok());
            target_from(path.clone(), &canonical, file, mount)
        })
        .collect()
}

/// A target from an open file: its identity for the queue's key (canonical
/// path, size, mtime, device, inode) and how its residency can be seen.
fn target_from(
    path: PathBuf,
    canonical: &Path,
    file: File,
    mount: Option<Mount>,
) -> Result<Target> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io("reading metadata of", &path, None, e))?;
    let mut identity = canonical.as_os_str().as_encoded_bytes().to_vec();
    identity.push(0);
    identity.extend_from_slice(&meta.len().to_le_bytes());
    let modified = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    identity.extend_from_slice(&modified.to_le_bytes());
    if let Some((dev, ino)) = os::file_id(&meta) {
        identity.extend_from_slice(&dev.to_le_bytes());
        identity.extend_from_slice(&ino.to_le_bytes());
    }
    let probe = probe_for(&file, &path, &meta);
    let advice_piece = advice_piece(&meta);
    Ok(Target {
        path,
        file,
        len: meta.len(),
        identity,
        mount,
        probe,
        advice_piece,
        bounded: OnceLock::new(),
    })
}

/// `mincore(2)` on a map of the file, where the kernel shows this process
/// the page cache: the caller owns or may write the file (or is root), the
/// rule of `can_do_mincore` in mm/mincore.c; elsewhere `mincore` silently
/// reports cached pages as absent. `cachestat(2)` applies the same rule but
/// says so (`EPERM`), so it decides where it exists; and it counts pages
/// where the file cannot be mapped.
fn probe_for(file: &File, path: &Path, meta: &std::fs::Metadata) -> Probe {
    if meta.len() == 0 {
        return Probe::HIDDEN;
    }
    let cachestat = match os::cached_pages(file, 0, 1) {
        Ok(_) => true,
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => return Probe::HIDDEN,
        Err(_) if !visible_to_mincore(path, meta) => return Probe::HIDDEN,
        Err(_) => false,
    };
    Probe {
        cachestat,
        map: storage::map_file(file).ok(),
    }
}

fn visible_to_mincore(path: &Path, meta: &std::fs::Metadata) -> bool {
    let euid = os::effective_uid();
    euid.is_some() && (euid == Some(0) || euid == os::file_owner(meta) || os::may_write(path))
}

/// The largest `WILLNEED` the kernel honours in one call for this file: the
/// larger of its device's read-ahead window and largest request
/// (`force_page_cache_ra` in mm/readahead.c), from sysfs; 128 KiB, the
/// kernel's default window, where unknown.
fn advice_piece(meta: &std::fs::Metadata) -> u64 {
    const DEFAULT: u64 = 128 << 10;
    os::device_number(meta)
        .and_then(os::readahead_limit)
        .unwrap_or(DEFAULT)
}

/// The method for a file: the caller's, else the measured winner for its
/// filesystem kind. `WillNeed` needs to see pages land (`mincore`).
fn resolve_method(requested: PrefetchMethod, target: &Target) -> PrefetchMethod {
    let method = match requested {
        PrefetchMethod::Auto => {
            let kind = target.mount.as_ref().map_or(MountKind::Unknown, |m| m.kind);
            default_method(kind)
        }
        other => other,
    };
    match (method, &target.probe) {
        (PrefetchMethod::WillNeed, Probe { map: Some(_), .. }) | (PrefetchMethod::Pread, _) => {
            method
        }
        _ => PrefetchMethod::Pread,
    }
}

/// The measured winner per filesystem kind (see the `NOTE:` above): the same
/// on every kind measured.
fn default_method(kind: MountKind) -> PrefetchMethod {
    let _ = kind;
    PrefetchMethod::WillNeed
}

/// Residency of every chunk, then the guard.
fn initial_states(targets: &[Target], chunks: &[Chunk], available: Option<u64>) -> Init {
    let mut scratch = Vec::new();
    let mut known = !targets.is_empty();
    let resident: Vec<u64> = chunks
        .iter()
        .map(|c| {
            let r = targets
                .get(c.file)
                .and_then(|t| t.resident_quick(c.offset, c.len, &mut scratch));
            if r.is_none() {
                known = false;
            }
            r.unwrap_or(0)
        })
        .collect();
    guard(chunks, &resident, available, known)
}

// ---------------------------------------------------------------------------
// The queue: shared through a file, or this process's own.

/// A queue file mapped by this rank, left (and removed, by the last live
/// rank) on drop.
struct SharedQueue {
    path: PathBuf,
    file: File,
    words: os::SharedWords,
    layout: Layout,
    slot: Option<usize>,
    replaced: Option<Invalid>,
}

impl SharedQueue {
    /// Creates the queue file, or attaches to a valid one, replacing one that
    /// is invalid or stale. `make` runs under the lock, only when creating.
    fn open(
        path: &Path,
        layout: &Layout,
        me: Owner,
        make: &dyn Fn() -> Init,
    ) -> io::Result<SharedQueue> {
        let mut replaced = None;
        for _ in 0..8 {
            let file = os::open_private_rw(path)?;
            os::flock(&file, true)?;
            if !os::names_file(path, &file) {
                continue; // replaced while we waited for the lock
            }
            let len = file.metadata()?.len();
            if len == 0 {
                file.set_len(layout.bytes())?;
                let words = os::SharedWords::map(&file)?;
                init_words(words.words(), layout, &make(), Some(me));
                os::flock(&file, false)?;
                return Ok(SharedQueue {
                    path: path.to_path_buf(),
                    file,
                    words,
                    layout: *layout,
                    slot: Some(0),
                    replaced,
                });
            }
            let verdict = if len != layout.bytes() {
                Err(Invalid::Size)
            } else {
                let words = os::SharedWords::map(&file)?;
                match validate(words.words(), layout) {
                    Ok(()) if live_attached(words.words(), layout, &Owner::alive) == 0 => {
                        Err(Invalid::Stale)
                    }
                    Ok(()) => Ok(words),
                    Err(why) => Err(why),
                }
            };
            match verdict {
                Ok(words) => {
                    let slot = slot_words(words.words(), layout).iter().position(|w| {
                        w.compare_exchange(0, me.word(), Ordering::AcqRel, Ordering::Acquire)
                            .is_ok()
                    });
                    os::flock(&file, false)?;
                    return Ok(SharedQueue {
                        path: path.to_path_buf(),
                        file,
                        words,
                        layout: *layout,
                        slot,
                        replaced,
                    });
                }
                Err(why) => {
                    replaced = Some(why);
                    std::fs::remove_file(path)?;
                    // Unlocked when `file` closes; waiters see the name gone.
                }
            }
        }
        Err(io::Error::other("the queue file kept being replaced"))
    }

    fn words(&self) -> &[AtomicU64] {
        self.words.words()
    }
}

impl Drop for SharedQueue {
    fn drop(&mut self) {
        if os::flock(&self.file, true).is_err() {
            return;
        }
        let words = self.words.words();
        if let Some(slot) = self
            .slot
            .and_then(|i| slot_words(words, &self.layout).get(i))
        {
            let word = slot.load(Ordering::Acquire);
            slot.store(word | TERMINAL, Ordering::Release);
        }
        if live_attached(words, &self.layout, &Owner::alive) == 0
            && os::names_file(&self.path, &self.file)
        {
            let _ = std::fs::remove_file(&self.path);
        }
        let _ = os::flock(&self.file, false);
    }
}

/// `/dev/shm` where it is a directory, else the temporary directory.
fn default_queue_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

enum Store {
    Shared(SharedQueue),
    Local(Vec<AtomicU64>),
}

impl Store {
    fn words(&self) -> &[AtomicU64] {
        match self {
            Store::Shared(q) => q.words(),
            Store::Local(w) => w,
        }
    }
}

// ---------------------------------------------------------------------------
// Warming.

/// The caller's local rank, else the launcher's.
fn local_rank_of(options: &PrefetchOptions) -> LocalRank {
    match options.local_rank {
        Some((rank, size)) => LocalRank::checked(rank, size, "local_rank() was set".to_string()),
        None => detect_local_rank(|name| std::env::var(name).ok()),
    }
}

fn run(targets: Vec<Target>, options: &PrefetchOptions, reason: String) -> Result<PrefetchReport> {
    let clock = Instant::now();
    let env = |name: &str| std::env::var(name).ok();
    let rank = local_rank_of(options);
    let streams = options.streams;
    let total: u64 = targets.iter().map(|t| t.len).sum();
    let page = os::page_size();
    let chunk_size = effective_chunk(
        total,
        options
            .chunk_size
            .map_or(DEFAULT_CHUNK as u64, |c| c as u64),
        page,
    );
    let lens: Vec<u64> = targets.iter().map(|t| t.len).collect();
    let chunks = plan_chunks(&lens, chunk_size);
    let methods: Vec<PrefetchMethod> = targets
        .iter()
        .map(|t| resolve_method(options.method, t))
        .collect();
    let mut report = PrefetchReport {
        ran: true,
        reason,
        rank: rank.rank,
        local_size: rank.size,
        rank_source: rank.source.clone(),
        streams,
        method: methods.first().copied().unwrap_or(PrefetchMethod::Pread),
        files: targets.len(),
        total_bytes: total,
        chunk_size,
        chunks: chunks.len(),
        ..PrefetchReport::default()
    };
    if streams == 0 {
        report.ran = false;
        report.reason = "streams(0): prefetch is off".to_string();
        return Ok(report);
    }
    let available = options.memory_available.or_else(memory::available);
    let me = Owner::current();
    let make = || initial_states(&targets, &chunks, available);

    // The queue: shared where there are other ranks, else this process's.
    // Its name and key cover the files, the chunk size and the job.
    let mut key_material = Vec::new();
    for t in &targets {
        key_material.extend_from_slice(&t.identity);
    }
    key_material.extend_from_slice(&chunk_size.to_le_bytes());
    key_material.extend_from_slice(job_key(env, os::parent_pid()).as_bytes());
    let layout = Layout {
        key: 0,
        chunk_size,
        chunks: chunks.len(),
        total,
        slots: 0,
    };
    let (store, layout) = if rank.size > 1 && !options.shared_queue {
        report.queue_note = Some("shared_queue(false): a fixed share of the bytes".into());
        local_store(layout, &make)
    } else if rank.size > 1 {
        let shared_layout = Layout {
            key: fnv1a(0x6c62_272e_07bb_0142, &key_material),
            slots: SHARED_SLOTS,
            ..layout
        };
        let name = format!(
            "safeload-prefetch-{:016x}.queue",
            fnv1a(0xcbf2_9ce4_8422_2325, &key_material)
        );
        let dir = options.queue_dir.clone().unwrap_or_else(default_queue_dir);
        let path = dir.join(name);
        match SharedQueue::open(&path, &shared_layout, me, &make) {
            Ok(queue) => {
                if let Some(why) = queue.replaced {
                    report.queue_note = Some(format!("replaced a queue file: {}", why.as_str()));
                }
                report.queue_path = Some(path);
                (Store::Shared(queue), shared_layout)
            }
            Err(e) => {
                report.queue_note = Some(format!(
                    "no shared queue ({}: {e}): a fixed share of the bytes",
                    path.display()
                ));
                local_store(layout, &make)
            }
        }
    } else {
        local_store(layout, &make)
    };
    let shared = matches!(store, Store::Shared(_));
    let words = store.words();
    let init = init_from_header(words);
    report.resident_before = init.resident;
    report.residency_known = init.known;
    report.skipped = init.skipped;
    report.skip_reasons.extend(init.guard_reason(total));

    let (claimable, starts) = reader_plan(&chunks, &rank, streams, shared);
    let work = Work {
        targets: &targets,
        methods: &methods,
        chunks: &chunks,
        states: chunk_words(words, &layout),
        me,
        shared,
        claimable,
        on_chunk: options.on_chunk.as_ref(),
        warmed: AtomicU64::new(0),
        handled: Mutex::new(Vec::new()),
        stalled: Mutex::new(None),
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
        progress: AtomicUsize::new(0),
    };
    work.run_readers(&starts);
    if let Some(error) = work.error.lock().ok().and_then(|mut e| e.take()) {
        return Err(error);
    }
    let handled = work.handled.lock().map(|h| h.clone()).unwrap_or_default();
    let reread = work.verify(&handled)?;
    report.chunks_handled = handled.len();
    report.warmed = work.warmed.load(Ordering::Relaxed);
    report.reread = reread;
    if let Some((bytes, why)) = work.stalled.lock().ok().and_then(|mut s| s.take()) {
        report.skipped += bytes;
        report.skip_reasons.push(why);
    }
    report.resident_after = if !shared && handled.is_empty() && init.known {
        // Nothing changed since the check a moment ago, in this process.
        Some(init.resident)
    } else {
        let mut scratch = Vec::new();
        targets
            .iter()
            .map(|t| t.resident_total(chunk_size, &mut scratch))
            .sum()
    };
    drop(store);
    report.elapsed = clock.elapsed();
    Ok(report)
}

/// A queue in this process's memory, with the same layout as a shared one.
fn local_store(layout: Layout, make: &dyn Fn() -> Init) -> (Store, Layout) {
    let words: Vec<AtomicU64> = (0..layout.words()).map(|_| AtomicU64::new(0)).collect();
    init_words(&words, &layout, &make(), None);
    (Store::Local(words), layout)
}

/// What the readers of one rank share.
struct Work<'a> {
    targets: &'a [Target],
    methods: &'a [PrefetchMethod],
    chunks: &'a [Chunk],
    states: &'a [AtomicU64],
    me: Owner,
    /// Whether other processes claim from the same states.
    shared: bool,
    claimable: Range<usize>,
    on_chunk: Option<&'a ChunkCallback>,
    warmed: AtomicU64,
    handled: Mutex<Vec<usize>>,
    stalled: Mutex<Option<(u64, String)>>,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    /// Bumped whenever a chunk of this rank finishes (for stall detection
    /// along with the queue's own states).
    progress: AtomicUsize,
}

impl Work<'_> {
    /// Runs one reader per start, on threads of their own: they block on
    /// storage, and must not occupy the caller's rayon pool.
    fn run_readers(&self, starts: &[usize]) {
        let reader = |start: usize| {
            if let Err(e) = self.reader(start) {
                self.failed.store(true, Ordering::Relaxed);
                if let Ok(mut slot) = self.error.lock() {
                    slot.get_or_insert(e);
                }
            }
        };
        if starts.is_empty() {
            return;
        }
        workers::run(starts.len(), "safeload-prefetch", |i| {
            if let Some(&start) = starts.get(i) {
                reader(start);
            }
        });
    }

    fn reader(&self, start: usize) -> Result<()> {
        let mut scratch = Vec::new();
        let mut pages = Vec::new();
        let mut cursor = start;
        while !self.failed.load(Ordering::Relaxed) {
            let next = match self.claim_free(&mut cursor) {
                Some(i) => Some(i),
                None if self.shared => self.wait_or_take_over(),
                None => None,
            };
            let Some(i) = next else {
                return Ok(());
            };
            if let Err(e) = self.handle(i, &mut scratch, &mut pages) {
                // Let another rank try it.
                if let Some(w) = self.states.get(i) {
                    let _ = w.compare_exchange(
                        self.me.word(),
                        FREE,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Claims the next free chunk at or after `cursor` in the claimable
    /// range, wrapping around.
    fn claim_free(&self, cursor: &mut usize) -> Option<usize> {
        let range = self.claimable.clone();
        if range.is_empty() {
            return None;
        }
        let from = (*cursor).clamp(range.start, range.end);
        for i in (from..range.end).chain(range.start..from) {
            let Some(word) = self.states.get(i) else {
                continue;
            };
            if word.load(Ordering::Relaxed) == FREE
                && word
                    .compare_exchange(FREE, self.me.word(), Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                *cursor = i + 1;
                return Some(i);
            }
        }
        None
    }

    /// With nothing free: takes over a chunk whose claimer died, or waits
    /// for live claimers; `None` when every chunk is finished, or when
    /// nothing has finished for [`STALL`] (recorded in `stalled`).
    fn wait_or_take_over(&self) -> Option<usize> {
        let mut last_seen = (usize::MAX, 0usize);
        let mut last_change = Instant::now();
        loop {
            if self.failed.load(Ordering::Relaxed) {
                return None;
            }
            let mut terminal = 0usize;
            let mut waiting: Vec<(usize, Owner)> = Vec::new();
            let mut verdicts: Vec<(Owner, bool)> = Vec::new();
            for i in self.claimable.clone() {
                let Some(word) = self.states.get(i) else {
                    continue;
                };
                let now = word.load(Ordering::Acquire);
                match chunk_state(now) {
                    Some(ChunkState::Free) => {
                        if word
                            .compare_exchange(
                                FREE,
                                self.me.word(),
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            return Some(i);
                        }
                    }
                    Some(ChunkState::Claimed(owner)) if owner == self.me => {
                        waiting.push((i, owner))
                    }
                    Some(ChunkState::Claimed(owner)) => {
                        let alive = match verdicts.iter().find(|(o, _)| *o == owner) {
                            Some(&(_, alive)) => alive,
                            None => {
                                let alive = owner.alive();
                                verdicts.push((owner, alive));
                                alive
                            }
                        };
                        if alive {
                            waiting.push((i, owner));
                        } else if word
                            .compare_exchange(
                                now,
                                self.me.word(),
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            return Some(i);
                        }
                    }
                    _ => terminal += 1,
                }
            }
            if waiting.is_empty() {
                return None;
            }
            let seen = (terminal, self.progress.load(Ordering::Relaxed));
            if seen != last_seen {
                last_seen = seen;
                last_change = Instant::now();
            } else if last_change.elapsed() >= STALL {
                self.record_stall(&waiting);
                return None;
            }
            std::thread::sleep(POLL);
        }
    }

    fn record_stall(&self, waiting: &[(usize, Owner)]) {
        let bytes: u64 = waiting
            .iter()
            .filter_map(|&(i, _)| self.chunks.get(i))
            .map(|c| c.len)
            .sum();
        let mut pids: Vec<u32> = waiting.iter().map(|&(_, o)| o.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let why = format!(
            "stopped waiting after {} s without progress for {} chunk(s) claimed by pid {:?}",
            STALL.as_secs(),
            waiting.len(),
            pids
        );
        if let Ok(mut slot) = self.stalled.lock() {
            slot.get_or_insert((bytes, why));
        }
    }

    /// Warms chunk `i`, claimed by this rank, and marks it done.
    fn handle(&self, i: usize, scratch: &mut Vec<u8>, pages: &mut Vec<u8>) -> Result<()> {
        let (Some(&chunk), Some(word)) = (self.chunks.get(i), self.states.get(i)) else {
            return Ok(());
        };
        let (Some(target), Some(&method)) =
            (self.targets.get(chunk.file), self.methods.get(chunk.file))
        else {
            return Ok(());
        };
        if let Ok(mut handled) = self.handled.lock() {
            handled.push(i);
        }
        let resident = target.resident_quick(chunk.offset, chunk.len, pages);
        if resident != Some(chunk.len) {
            self.warmed
                .fetch_add(chunk.len - resident.unwrap_or(0), Ordering::Relaxed);
            let file = if self.skipped_ahead(i, target) {
                target.bounded()
            } else {
                &target.file
            };
            match (method, resident) {
                (PrefetchMethod::WillNeed, Some(_)) => {
                    advise_and_wait(target, chunk, scratch, pages)?
                }
                _ => read_chunk(target, file, chunk, scratch)?,
            }
        }
        if let Some(f) = self.on_chunk {
            f(&target.path, chunk.offset..chunk.offset + chunk.len);
        }
        // Fails only if another rank took the chunk over, taking this
        // process for dead; it is warm either way.
        let _ = word.compare_exchange(self.me.word(), DONE, Ordering::AcqRel, Ordering::Relaxed);
        self.progress.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the memory guard skipped a chunk of the same file that the
    /// kernel's read-ahead for chunk `i` could reach (two read-ahead windows
    /// on, the most it keeps ahead of a sequential reader).
    fn skipped_ahead(&self, i: usize, target: &Target) -> bool {
        let Some(chunk) = self.chunks.get(i) else {
            return false;
        };
        let reach = chunk.offset + chunk.len + 2 * target.advice_piece;
        (i + 1..self.chunks.len())
            .map_while(|j| {
                let next = self.chunks.get(j)?;
                (next.file == chunk.file && next.offset < reach).then_some(j)
            })
            .any(|j| {
                self.states
                    .get(j)
                    .is_some_and(|w| w.load(Ordering::Relaxed) == SKIPPED)
            })
    }

    /// Checks that the chunks this rank handled are resident, and reads
    /// what is not, once. Returns the bytes read again.
    fn verify(&self, handled: &[usize]) -> Result<u64> {
        let mut scratch = Vec::new();
        let mut pages = Vec::new();
        let mut reread = 0;
        for &i in handled {
            let Some(&chunk) = self.chunks.get(i) else {
                continue;
            };
            let Some(target) = self.targets.get(chunk.file) else {
                continue;
            };
            // Landed, not merely present: a page can be in the page cache
            // without its data (a large folio only partly read), and a read
            // completes it.
            if let Some(r) = target.landed(chunk.offset, chunk.len, &mut pages) {
                if r < chunk.len {
                    read_chunk(target, &target.file, chunk, &mut scratch)?;
                    reread += chunk.len - r;
                }
            }
        }
        Ok(reread)
    }
}

/// Reads a chunk through the page cache into a scratch buffer, in reads of
/// at most 8 MiB. A file that ends early ends the chunk (the load reports
/// the truncation).
fn read_chunk(target: &Target, file: &File, chunk: Chunk, scratch: &mut Vec<u8>) -> Result<()> {
    let want = usize::try_from(chunk.len.min(SCRATCH))
        .unwrap_or(1 << 20)
        .max(1);
    if scratch.len() < want {
        scratch.resize(want, 0);
    }
    let mut offset = chunk.offset;
    let end = chunk.offset + chunk.len;
    while offset < end {
        let len = usize::try_from(end - offset)
            .unwrap_or(usize::MAX)
            .min(scratch.len());
        let Some(buf) = scratch.get_mut(..len) else {
            break;
        };
        os::read_at_least(file, buf, 0, offset)
            .map_err(|(at, e)| Error::io("prefetching", &target.path, Some(at), e))?;
        offset += len as u64;
    }
    Ok(())
}

/// Asks for a chunk with `WILLNEED` in pieces the kernel honours whole,
/// waits while its pages arrive, and reads what has not arrived once
/// nothing has for a while (the kernel may drop read-ahead under load).
fn advise_and_wait(
    target: &Target,
    chunk: Chunk,
    scratch: &mut Vec<u8>,
    pages: &mut Vec<u8>,
) -> Result<()> {
    let end = chunk.offset + chunk.len;
    let piece = target.advice_piece.max(1);
    let mut offset = chunk.offset;
    while offset < end {
        let len = piece.min(end - offset);
        if os::advise_willneed(&target.file, offset, len).is_err() {
            return read_chunk(target, &target.file, chunk, scratch);
        }
        offset += len;
    }
    let mut last = 0;
    let mut last_change = Instant::now();
    loop {
        match target.landed(chunk.offset, chunk.len, pages) {
            Some(r) if r >= chunk.len => return Ok(()),
            Some(r) if r > last => {
                last = r;
                last_change = Instant::now();
            }
            Some(_) if last_change.elapsed() < WILLNEED_IDLE => {}
            _ => return read_chunk(target, &target.file, chunk, scratch),
        }
        std::thread::sleep(WILLNEED_POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn rank_of(pairs: &[(&str, &str)]) -> (usize, usize) {
        let r = detect_local_rank(env_of(pairs));
        (r.rank, r.size)
    }

    #[test]
    fn rank_from_each_launcher() {
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "3"), ("LOCAL_WORLD_SIZE", "8")]),
            (3, 8)
        );
        assert_eq!(
            rank_of(&[("SLURM_LOCALID", "1"), ("SLURM_NTASKS_PER_NODE", "4")]),
            (1, 4)
        );
        // Slurm's compressed form: 4 tasks on each of 2 nodes.
        assert_eq!(
            rank_of(&[("SLURM_LOCALID", "2"), ("SLURM_NTASKS_PER_NODE", "4(x2)")]),
            (2, 4)
        );
        // Without --ntasks-per-node, Slurm sets only SLURM_TASKS_PER_NODE.
        assert_eq!(
            rank_of(&[("SLURM_LOCALID", "1"), ("SLURM_TASKS_PER_NODE", "2(x3),1")]),
            (1, 2)
        );
        assert_eq!(
            rank_of(&[
                ("OMPI_COMM_WORLD_LOCAL_RANK", "5"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "6")
            ]),
            (5, 6)
        );
        assert_eq!(
            rank_of(&[("MPI_LOCALRANKID", "0"), ("MPI_LOCALNRANKS", "2")]),
            (0, 2)
        );
        let r = detect_local_rank(env_of(&[("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")]));
        assert_eq!(r.source, "LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 (torchrun)");
    }

    #[test]
    fn torchrun_under_slurm_wins() {
        // torchrun started by srun: one Slurm task per node, 8 torchrun workers.
        let pairs = [
            ("SLURM_LOCALID", "0"),
            ("SLURM_NTASKS_PER_NODE", "1"),
            ("LOCAL_RANK", "6"),
            ("LOCAL_WORLD_SIZE", "8"),
        ];
        assert_eq!(rank_of(&pairs), (6, 8));
    }

    #[test]
    fn invalid_or_missing_is_one_process() {
        assert_eq!(rank_of(&[]), (0, 1));
        assert_eq!(rank_of(&[("LOCAL_RANK", "2")]), (0, 1), "no size");
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "4"), ("LOCAL_WORLD_SIZE", "4")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "x"), ("LOCAL_WORLD_SIZE", "4")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "-1"), ("LOCAL_WORLD_SIZE", "4")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "0")]),
            (0, 1)
        );
        assert_eq!(
            rank_of(&[("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "")]),
            (0, 1)
        );
        let r = detect_local_rank(env_of(&[("LOCAL_RANK", "9"), ("LOCAL_WORLD_SIZE", "4")]));
        assert!(r.source.contains("invalid"), "{}", r.source);
    }

    #[test]
    fn streams_from_the_environment() {
        assert_eq!(streams_from_env(env_of(&[])), None);
        assert_eq!(
            streams_from_env(env_of(&[("SAFELOAD_PREFETCH", " 4 ")])),
            Some((4, "SAFELOAD_PREFETCH=4".to_string()))
        );
        assert_eq!(
            streams_from_env(env_of(&[("HF_SHARD_PREFETCH", "8")])),
            Some((8, "HF_SHARD_PREFETCH=8".to_string()))
        );
        assert_eq!(
            streams_from_env(env_of(&[
                ("SAFELOAD_PREFETCH", "0"),
                ("HF_SHARD_PREFETCH", "8")
            ])),
            Some((0, "SAFELOAD_PREFETCH=0".to_string())),
            "ours first"
        );
        assert_eq!(
            streams_from_env(env_of(&[("SAFELOAD_PREFETCH", "yes")])),
            None
        );
    }

    #[test]
    fn job_key_from_each_launcher() {
        assert_eq!(
            job_key(env_of(&[("TORCHELASTIC_RUN_ID", "abc")]), 7),
            "torchelastic:abc"
        );
        assert_eq!(
            job_key(env_of(&[("SLURM_JOB_ID", "42"), ("SLURM_STEP_ID", "3")]), 7),
            "slurm:42.3"
        );
        assert_eq!(
            job_key(env_of(&[("SLURM_JOBID", "42"), ("SLURM_STEPID", "0")]), 7),
            "slurm:42.0"
        );
        assert_eq!(
            job_key(env_of(&[("OMPI_MCA_ess_base_jobid", "1234")]), 7),
            "ompi:1234"
        );
        assert_eq!(
            job_key(env_of(&[("TORCHELASTIC_RUN_ID", " ")]), 7),
            "parent:7"
        );
    }

    #[test]
    fn chunks_cover_every_byte_once() {
        let lens = [10_000u64, 0, 4096, 12_289];
        let chunks = plan_chunks(&lens, 4096);
        for (file, &len) in lens.iter().enumerate() {
            let mut at = 0;
            for c in chunks.iter().filter(|c| c.file == file) {
                assert_eq!(c.offset, at);
                assert!(c.len > 0 && c.len <= 4096);
                at += c.len;
            }
            assert_eq!(at, len);
        }
        assert_eq!(effective_chunk(1 << 30, 8 << 20, 4096), 8 << 20);
        assert_eq!(effective_chunk(1 << 30, 1000, 4096), MIN_CHUNK);
        assert_eq!(
            effective_chunk(1 << 30, (1 << 20) + 1, 4096),
            (1 << 20) + 4096
        );
        // 64 PiB in 8 MiB chunks would be 8 Gi chunks: larger ones instead.
        let huge = effective_chunk(1 << 56, 8 << 20, 4096);
        assert!((1u64 << 56).div_ceil(huge) <= MAX_CHUNKS);
    }

    /// The naive twin of `split_by_bytes`: each chunk goes to the part its
    /// first byte falls in.
    fn naive_split(chunks: &[Chunk], parts: usize) -> Vec<usize> {
        let total: u64 = chunks.iter().map(|c| c.len).sum();
        let mut at = 0u64;
        chunks
            .iter()
            .map(|c| {
                let part = (0..parts)
                    .rev()
                    .find(|&p| u128::from(at) * parts as u128 >= u128::from(total) * p as u128)
                    .unwrap();
                at += c.len;
                part
            })
            .collect()
    }

    #[test]
    fn split_by_bytes_not_by_count() {
        // One big shard and many small ones: a split by file count would
        // give rank 0 almost everything.
        let lens = [64u64 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20];
        let chunks = plan_chunks(&lens, 8 << 20);
        for parts in 1..=5 {
            let split = split_by_bytes(&chunks, parts);
            assert_eq!(split.len(), parts);
            assert_eq!(split.first().unwrap().start, 0);
            assert_eq!(split.last().unwrap().end, chunks.len());
            for w in split.windows(2) {
                assert_eq!(w[0].end, w[1].start, "contiguous, disjoint");
            }
            let owner = naive_split(&chunks, parts);
            for (p, r) in split.iter().enumerate() {
                for i in r.clone() {
                    assert_eq!(owner[i], p, "chunk {i} with {parts} parts");
                }
            }
            let total: u64 = lens.iter().sum();
            for r in &split {
                let bytes: u64 = chunks[r.clone()].iter().map(|c| c.len).sum();
                assert!(
                    bytes <= total / parts as u64 + (8 << 20),
                    "{bytes} with {parts} parts"
                );
            }
        }
        assert_eq!(split_by_bytes(&[], 3), vec![0..0, 0..0, 0..0]);
    }

    #[test]
    fn readers_start_apart() {
        let chunks = plan_chunks(&[96 << 20], 8 << 20); // 12 chunks
        let rank = |r, s| LocalRank {
            rank: r,
            size: s,
            source: String::new(),
        };
        let (range, starts) = reader_plan(&chunks, &rank(1, 3), 2, true);
        assert_eq!(range, 0..12);
        assert_eq!(starts, vec![4, 6]);
        let (range, starts) = reader_plan(&chunks, &rank(1, 3), 2, false);
        assert_eq!(range, 4..8);
        assert_eq!(starts, vec![4, 6]);
        let (range, starts) = reader_plan(&chunks, &rank(0, 1), 4, true);
        assert_eq!((range, starts), (0..12, vec![0, 3, 6, 9]));
    }

    #[test]
    fn guard_warms_a_prefix_within_budget() {
        let chunks = plan_chunks(&[40], 10); // 4 chunks of 10
        // Chunk 1 resident; 30 bytes needed; 90% of 25 is 22: two chunks fit.
        let init = guard(&chunks, &[0, 10, 0, 0], Some(25), true);
        assert_eq!(init.states, vec![FREE, DONE, FREE, SKIPPED]);
        assert_eq!((init.resident, init.needed, init.skipped), (10, 30, 10));
        assert_eq!(init.budget, Some(22));
        let why = init.guard_reason(40).unwrap();
        assert!(why.contains("memory guard"), "{why}");
        // Unknown memory: no limit.
        let init = guard(&chunks, &[0; 4], None, true);
        assert_eq!(init.states, vec![FREE; 4]);
        assert_eq!(init.guard_reason(40), None);
        // Partly resident chunks count what is missing.
        let init = guard(&chunks, &[5, 5, 5, 5], Some(23), true);
        assert_eq!(init.states, vec![FREE, FREE, FREE, FREE]);
        let init = guard(&chunks, &[5, 5, 5, 5], Some(22), true);
        assert_eq!(init.states, vec![FREE, FREE, FREE, SKIPPED]);
    }

    #[test]
    fn proc_stat_fields() {
        // From this machine's /proc/self/stat, with a command name that has
        // spaces and parentheses.
        let text = "12345 (my (odd) name) S 1 12345 12345 0 -1 4194560 1066 0 0 0 1 0 0 0 20 0 1 0 98765 8761344 895 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(text), Some(('S', 98765)));
        let zombie = "7 (x) Z 1 7 7 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0";
        assert_eq!(parse_stat(zombie), Some(('Z', 555)));
        assert_eq!(parse_stat("7 (x"), None);
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(matches!(parse_stat(&me), Some((state, start)) if state != 'Z' && start > 0));
    }

    #[test]
    fn words_round_trip() {
        let owner = Owner {
            pid: 4_000_000,
            tag: 0x7FFF_FFFF,
        };
        assert_eq!(Owner::from_word(owner.word()), Some(owner));
        assert_eq!(chunk_state(owner.word()), Some(ChunkState::Claimed(owner)));
        assert_eq!(chunk_state(FREE), Some(ChunkState::Free));
        assert_eq!(chunk_state(DONE), Some(ChunkState::Done));
        assert_eq!(chunk_state(SKIPPED), Some(ChunkState::Skipped));
        assert_eq!(chunk_state(TERMINAL | 3), None);
        assert_eq!(chunk_state(5 << 32), None, "a tag without a pid");
        assert_eq!(slot_state(0), Some(SlotState::Empty));
        assert_eq!(slot_state(owner.word()), Some(SlotState::Attached(owner)));
        assert_eq!(
            slot_state(owner.word() | TERMINAL),
            Some(SlotState::Finished)
        );
        assert!(Owner::current().alive());
    }

    fn dead_owner() -> Owner {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        Owner { pid, tag: 1 }
    }

    #[test]
    fn dead_and_reused_pids_are_dead() {
        assert!(!dead_owner().alive());
        let me = Owner::current();
        assert!(
            !Owner {
                tag: me.tag ^ 1,
                ..me
            }
            .alive(),
            "same pid, another start time: reused"
        );
        // A zombie: exited, not yet reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let zombie = Owner {
            pid: child.id(),
            tag: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while zombie.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!zombie.alive());
        child.wait().unwrap();
    }

    fn layout() -> Layout {
        Layout {
            key: 0x1234,
            chunk_size: 4096,
            chunks: 5,
            total: 20_000,
            slots: SHARED_SLOTS,
        }
    }

    fn fresh_init() -> Init {
        let chunks = plan_chunks(&[20_000], 4096);
        guard(&chunks, &[0, 4096, 0, 0, 0], None, true)
    }

    fn write_words(path: &Path, words: &[u64]) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }

    fn words_of(path: &Path) -> Vec<u64> {
        std::fs::read(path)
            .unwrap()
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn the_first_rank_creates_the_others_attach_the_last_removes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.queue");
        let me = Owner::current();
        let first = SharedQueue::open(&path, &layout(), me, &fresh_init).unwrap();
        assert_eq!(first.replaced, None);
        assert_eq!(first.slot, Some(0));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), layout().bytes());
        assert_eq!(validate(first.words(), &layout()), Ok(()));
        let states: Vec<u64> = chunk_words(first.words(), &layout())
            .iter()
            .map(|w| w.load(Ordering::Relaxed))
            .collect();
        assert_eq!(states, vec![FREE, DONE, FREE, FREE, FREE]);

        let never = || -> Init { panic!("only the creator initializes") };
        let second = SharedQueue::open(&path, &layout(), me, &never).unwrap();
        assert_eq!(second.slot, Some(1));
        drop(first);
        assert!(path.exists(), "a live rank is still attached");
        drop(second);
        assert!(!path.exists(), "the last one removes it");
    }

    #[test]
    fn invalid_files_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.queue");
        let me = Owner::current();
        // A valid queue to corrupt, kept as words.
        let good = {
            let q = SharedQueue::open(&path, &layout(), me, &fresh_init).unwrap();
            let words = words_of(&path);
            drop(q);
            words
        };
        let corrupt = |f: &dyn Fn(&mut Vec<u64>)| {
            let mut w = good.clone();
            f(&mut w);
            w
        };
        let slot0 = HEADER_WORDS;
        let chunk0 = HEADER_WORDS + SHARED_SLOTS;
        let dead = dead_owner();
        let cases: Vec<(Vec<u64>, Invalid)> = vec![
            (good[..good.len() - 1].to_vec(), Invalid::Size),
            (vec![0; good.len()], Invalid::Magic),
            (corrupt(&|w| w[at::VERSION] = 99), Invalid::Version),
            (corrupt(&|w| w[at::KEY] ^= 1), Invalid::Layout),
            (corrupt(&|w| w[at::CHUNK_SIZE] = 8192), Invalid::Layout),
            (corrupt(&|w| w[chunk0 + 2] = TERMINAL | 7), Invalid::Word),
            (corrupt(&|w| w[slot0] = 3 << 32), Invalid::Word),
            // Left by an earlier run whose ranks are gone, some chunks
            // still claimed by one of them.
            (
                corrupt(&|w| {
                    w[slot0] = dead.word();
                    w[chunk0] = dead.word();
                }),
                Invalid::Stale,
            ),
            (
                corrupt(&|w| w[slot0] = dead.word() | TERMINAL),
                Invalid::Stale,
            ),
        ];
        for (words, why) in cases {
            write_words(&path, &words);
            let q = SharedQueue::open(&path, &layout(), me, &fresh_init).unwrap();
            assert_eq!(q.replaced, Some(why));
            assert_eq!(validate(q.words(), &layout()), Ok(()));
            assert_eq!(load(q.words(), chunk0), FREE, "{why:?}: fresh states");
            drop(q);
        }
        // Another user's file, or a symlink, is never used.
        std::os::unix::fs::symlink("/dev/null", &path).unwrap();
        assert!(SharedQueue::open(&path, &layout(), me, &fresh_init).is_err());
    }

    #[test]
    fn a_live_queue_is_joined_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.queue");
        let me = Owner::current();
        let first = SharedQueue::open(&path, &layout(), me, &fresh_init).unwrap();
        // Its chunks all done: a rank that arrives late joins and checks
        // residency itself.
        for w in chunk_words(first.words(), &layout()) {
            w.store(DONE, Ordering::Relaxed);
        }
        let late = SharedQueue::open(&path, &layout(), me, &fresh_init).unwrap();
        assert_eq!(late.replaced, None);
        assert_eq!(load(late.words(), HEADER_WORDS + SHARED_SLOTS), DONE);
    }

    #[test]
    fn a_sampled_check_counts_exactly_when_a_sample_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        File::open(&path).unwrap().sync_all().unwrap();
        let paths = [path.clone()];
        let targets = open_targets(&paths, None).unwrap();
        let t = &targets[0];
        assert!(t.probe.cachestat && t.probe.map.is_some());
        let mut scratch = Vec::new();
        os::evict(&t.file).unwrap();
        assert_eq!(t.resident_quick(0, 1 << 20, &mut scratch), Some(0));
        // All but the first page: the first sample misses, the count is exact.
        let mut buf = vec![0u8; (1 << 20) - 4096];
        os::read_exact_at(&t.file, &mut buf, 4096).unwrap();
        assert_eq!(
            t.resident_quick(0, 1 << 20, &mut scratch),
            Some((1 << 20) - 4096)
        );
        assert_eq!(t.landed(0, 1 << 20, &mut scratch), Some((1 << 20) - 4096));
        os::read_exact_at(&t.file, &mut buf[..4096], 0).unwrap();
        assert_eq!(t.resident_quick(0, 1 << 20, &mut scratch), Some(1 << 20));
        assert_eq!(t.resident_total(256 << 10, &mut scratch), Some(1 << 20));
    }

    #[test]
    fn cachestat_and_mincore_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        os::evict(&file).unwrap();
        let mut buf = vec![0u8; 256 << 10];
        os::read_exact_at(&file, &mut buf, 512 << 10).unwrap();
        let map = storage::map_file(&file).unwrap();
        let mut scratch = Vec::new();
        let cached = os::cached_pages(&file, 0, 1 << 20).unwrap();
        let mincore = os::mincore_pages(&map, 0, 1 << 20, &mut scratch).unwrap();
        assert_eq!(cached, mincore);
        assert!(cached >= (256 << 10) / os::page_size(), "{cached}");
        let in_read = os::cached_pages(&file, 512 << 10, 256 << 10).unwrap();
        assert_eq!(in_read, (256 << 10) / os::page_size());
    }
}
