//! `Loader`: the options of a load, and the load itself — resolve the files, plan how to read each, read, assemble tensors.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::{Mmap, MmapMut};

use crate::checkpoint::{self, Checkpoint, ShardFile};
use crate::error::{Error, ErrorKind, Result};
use crate::header::{self, Header, PREFIX_LEN};
use crate::memory;
use crate::mount::{self, Mount, MountTable};
use crate::os::{self, DIRECT_ALIGN};
use crate::policy::{self, Choice, DISABLE_MMAP_ENV, Origin, ReadMode, Strategy};
use crate::prefetch::{self, PrefetchOptions};
use crate::read::{self, Tagged};
use crate::report::{FileReport, LoadReport, human_bytes};
use crate::state_dict::StateDict;
use crate::storage::{self, BufferLayout, Storage};
use crate::tensor::Tensor;
use crate::workers;

type Filter = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// Loads checkpoints; the options of a load, set as one expression.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data = vec![0u8; 16];
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data)?;
/// # safetensors::serialize_to_file([("model.layers.0.w", view.clone()), ("lm_head", view)], None, &path)?;
/// let sd = safeload::Loader::new()
///     .disable_mmap(true)                       // read into memory; false maps; unset decides
///     .threads(4)                               // files opened and parsed at once
///     .filter(|name| name.starts_with("model.layers.0."))
///     .load(&path)?;
/// assert_eq!(sd.names().collect::<Vec<_>>(), ["model.layers.0.w"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Threads
///
/// Opening files and parsing headers runs in the caller's rayon pool
/// (`pool.install(|| loader.load(path))` bounds it), at most
/// [`threads`](Self::threads) files at once. Buffered reads are issued by
/// [`io_concurrency`](Self::io_concurrency) reader threads of their own, so
/// that a slow network mount blocks them and not the caller's pool.
#[derive(Clone, Default)]
pub struct Loader {
    mode: Option<ReadMode>,
    threads: Option<usize>,
    io_concurrency: Option<usize>,
    chunk_size: Option<usize>,
    filter: Option<Filter>,
    mount_table: Option<MountTable>,
    populate: bool,
    direct_io: Option<bool>,
    memory_available: Option<u64>,
    prefetch: Option<PrefetchOptions>,
    local_rank: Option<(usize, usize)>,
}

impl fmt::Debug for Loader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loader")
            .field("mode", &self.mode)
            .field("threads", &self.threads)
            .field("io_concurrency", &self.io_concurrency)
            .field("chunk_size", &self.chunk_size)
            .field("filter", &self.filter.as_ref().map(|_| "<fn>"))
            .field("populate", &self.populate)
            .field("direct_io", &self.direct_io)
            .field("memory_available", &self.memory_available)
            .field("prefetch", &self.prefetch)
            .field("local_rank", &self.local_rank)
            .finish_non_exhaustive()
    }
}

impl Loader {
    /// A loader with every option at its default: auto strategy, all
    /// tensors.
    pub fn new() -> Loader {
        Loader::default()
    }

    /// `true` reads every file into memory ("buffered"); `false` maps every
    /// file. Unset, each file's strategy is decided from its filesystem (and
    /// the `SAFELOAD_DISABLE_MMAP` environment variable, which this call
    /// overrides).
    pub fn disable_mmap(self, disable: bool) -> Loader {
        self.read_mode(if disable {
            ReadMode::Buffered
        } else {
            ReadMode::Mmap
        })
    }

    /// Sets the read mode; [`ReadMode::Auto`] decides per file, ignoring the
    /// environment.
    pub fn read_mode(mut self, mode: ReadMode) -> Loader {
        self.mode = Some(mode);
        self
    }

    pub(crate) fn read_mode_opt(mut self, mode: Option<ReadMode>) -> Loader {
        self.mode = mode;
        self
    }

    /// How many files are opened and parsed at once (default: the current
    /// rayon pool's size). Zero is taken as one.
    pub fn threads(mut self, threads: usize) -> Loader {
        self.threads = Some(threads.max(1));
        self
    }

    /// How many reads of buffered files (and populate calls of mapped ones)
    /// are in flight at once. Default: 12 when a file is on FUSE (enough
    /// requests in flight to hide each one's latency, within the kernel's
    /// default of 12 background requests per mount), 8 otherwise. Zero is
    /// taken as one.
    pub fn io_concurrency(mut self, readers: usize) -> Loader {
        self.io_concurrency = Some(readers.max(1));
        self
    }

    /// The size of one read of a buffered file (default: 8 MiB). Values
    /// below 4 KiB are raised to it.
    pub fn chunk_size(mut self, bytes: usize) -> Loader {
        self.chunk_size = Some(bytes.max(4096));
        self
    }

    /// Loads only the tensors whose name passes `keep`. A buffered load reads
    /// only their bytes; a sharded load opens only the shards the index says
    /// hold them.
    pub fn filter(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Loader {
        self.filter = Some(Arc::new(keep));
        self
    }

    /// Faults mapped files in eagerly, in parallel, before returning
    /// (`MADV_POPULATE_READ`, which reports an I/O error or a truncated file
    /// as an error instead of `SIGBUS`). Default `false`: mapped loads stay
    /// lazy, and pages arrive when tensors are first touched.
    pub fn populate(mut self, populate: bool) -> Loader {
        self.populate = populate;
        self
    }

    /// Whether buffered reads bypass the page cache with `O_DIRECT`. Unset,
    /// the default suits the filesystem (see the crate docs). Where a file or
    /// its filesystem refuses direct reads, plain reads are used. Direct reads
    /// apply to files read whole; a filtered or packed file is read plainly.
    pub fn direct_io(mut self, direct: bool) -> Loader {
        self.direct_io = Some(direct);
        self
    }

    /// Takes `bytes` as the memory available to buffered reads, instead of
    /// asking the kernel (`MemAvailable`) and the cgroup (limit minus usage).
    /// Where buffered files need more, files the auto policy would read are
    /// mapped instead, and an explicit `disable_mmap(true)` load fails with
    /// [`ErrorKind::InsufficientMemory`].
    pub fn memory_available(mut self, bytes: u64) -> Loader {
        self.memory_available = Some(bytes);
        self
    }

    /// Warms the page cache with the files before loading them, with
    /// `streams` readers in this process; `0` turns prefetch off, also where
    /// the auto policy would turn it on. Overrides `SAFELOAD_PREFETCH` (and
    /// `HF_SHARD_PREFETCH`). The job's processes on this node share the
    /// work (see [`prefetch`](crate::prefetch())); resident chunks are not
    /// read, and the memory guard caps what is warmed. The report says what
    /// it did ([`LoadReport::prefetch`](crate::LoadReport::prefetch)).
    pub fn prefetch(mut self, streams: usize) -> Loader {
        self.prefetch = Some(self.prefetch.take().unwrap_or_default().streams(streams));
        self
    }

    /// Prefetch as [`prefetch`](Self::prefetch), with every option of
    /// [`PrefetchOptions`].
    pub fn prefetch_with(mut self, options: PrefetchOptions) -> Loader {
        self.prefetch = Some(options);
        self
    }

    /// This process's rank among the job's processes on this node, and their
    /// number, for prefetch, instead of the launcher's variables
    /// (`LOCAL_RANK`/`LOCAL_WORLD_SIZE`, `SLURM_LOCALID`, ...).
    pub fn local_rank(mut self, rank: usize, size: usize) -> Loader {
        self.local_rank = Some((rank, size));
        self
    }

    /// Decides filesystems from this mount table instead of the process's own
    /// (for tests, and for reasoning about another machine's mounts).
    pub fn mount_table(mut self, table: MountTable) -> Loader {
        self.mount_table = Some(table);
        self
    }

    /// Loads the checkpoint at `path`: a `.safetensors` file, a
    /// `*.safetensors.index.json`, or a directory holding
    /// `model.safetensors`, `model.safetensors.index.json` or exactly one
    /// `*.safetensors` file.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<StateDict> {
        let path = path.as_ref();
        let clock = Instant::now();
        let checkpoint = checkpoint::resolve(path)?;
        let shards = self.shards_to_open(&checkpoint);

        let env = std::env::var(DISABLE_MMAP_ENV).ok();
        let (mode, origin) = policy::effective_mode(self.mode, env.as_deref());
        let table = match &self.mount_table {
            Some(table) => Some(table.clone()),
            None => MountTable::current().ok(),
        };
        let threads = self.threads.unwrap_or_else(workers::default_width).max(1);
        let plan = Plan {
            mode,
            origin,
            table: table.as_ref(),
            filter: self.filter.as_deref(),
            direct_io: self.direct_io,
            clock,
        };

        // 1. Open every file, parse its header, decide its strategy.
        let mut opened = workers::map(&shards, threads, "safeload-open", |shard| {
            open_shard(shard, &plan)
        })?;
        check_tensors(&checkpoint, &opened)?;

        // 2. Warm the page cache, where asked or where the auto policy says
        //    so (mapped files on a network filesystem), before any tensor
        //    byte is touched.
        let files: Vec<prefetch::LoadFile<'_>> = opened
            .iter()
            .map(|s| prefetch::LoadFile {
                path: &s.path,
                canonical: &s.canonical,
                file: &s.file,
                mount: s.mount.as_ref(),
                mapped: matches!(s.body, Body::Mapped(_)),
            })
            .collect();
        let prefetched = prefetch::before_load(
            &files,
            &prefetch::LoadRequest {
                caller: self.prefetch.as_ref(),
                local_rank: self.local_rank,
                memory_available: self.memory_available,
            },
        )?;
        drop(files);

        // 3. Make sure buffered files fit in memory, then allocate them.
        // Asking the kernel and the cgroup costs more than a small mapped load.
        let any_pending = opened.iter().any(|s| matches!(s.body, Body::Pending(_)));
        let available = self
            .memory_available
            .or_else(|| any_pending.then(memory::available).flatten());
        guard_memory(&mut opened, available, path)?;
        allocate(&mut opened)?;

        // 4. Read every buffered file (and populate mapped ones) through one
        //    job queue.
        let io_concurrency = self.io_concurrency.unwrap_or_else(|| {
            policy::default_io_concurrency(
                opened
                    .iter()
                    .filter_map(|s| s.mount.as_ref().map(|m| m.kind)),
            )
        });
        let chunk = self.chunk_size.unwrap_or(read::DEFAULT_CHUNK);
        run_io(&mut opened, io_concurrency, chunk, self.populate, clock)?;

        // 5. Hand out tensors.
        let mut state_dict = assemble(&checkpoint, opened, clock, threads, io_concurrency)?;
        state_dict.report.prefetch = prefetched;
        Ok(state_dict)
    }

    fn shards_to_open<'a>(&self, checkpoint: &'a Checkpoint) -> Vec<&'a ShardFile> {
        match (&self.filter, &checkpoint.index) {
            (Some(keep), Some(index)) => {
                let wanted: HashSet<&str> = index
                    .weight_map
                    .iter()
                    .filter(|(tensor, _)| keep(tensor))
                    .map(|(_, shard)| shard.as_str())
                    .collect();
                checkpoint
                    .shards
                    .iter()
                    .filter(|s| wanted.contains(s.name.as_str()))
                    .collect()
            }
            _ => checkpoint.shards.iter().collect(),
        }
    }
}

/// What every file's preparation shares.
struct Plan<'a> {
    mode: ReadMode,
    origin: Origin,
    table: Option<&'a MountTable>,
    filter: Option<&'a (dyn Fn(&str) -> bool + Send + Sync)>,
    direct_io: Option<bool>,
    clock: Instant,
}

/// A file whose header is parsed and whose strategy is decided.
struct OpenedShard {
    path: PathBuf,
    /// `path` with symlinks resolved (the path itself where that fails).
    canonical: PathBuf,
    file: File,
    /// A second descriptor opened with `O_DIRECT`, for buffered reads that
    /// use it.
    direct: Option<File>,
    size: u64,
    header: Header,
    selected: Vec<bool>,
    choice: Choice,
    /// Whether the auto policy chose buffered (and the memory guard may map
    /// it instead).
    switchable: bool,
    mount: Option<Mount>,
    body: Body,
    /// Nanoseconds since the load started: when the file was opened, and
    /// when its last byte arrived.
    opened_at: u64,
    finished_at: AtomicU64,
}

enum Body {
    /// The file's own map.
    Mapped(Mmap),
    /// To be read into a buffer laid out so.
    Pending(BufferLayout),
    /// A buffer to be filled by the read engine.
    Buffered {
        buffer: MmapMut,
        layout: BufferLayout,
    },
    /// A filled buffer made read-only.
    Read { map: Mmap, layout: BufferLayout },
    /// Moved out while changing state.
    Taken,
}

fn since(clock: Instant) -> u64 {
    u64::try_from(clock.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn open_shard(shard: &ShardFile, plan: &Plan<'_>) -> Result<OpenedShard> {
    let path = &shard.path;
    let opened_at = since(plan.clock);
    let file = os::open_regular(path).map_err(|e| Error::io("opening", path, None, e))?;
    let size = file_len(&file, path)?;
    let header = read_header(&file, path, size)?;

    let selected: Vec<bool> = header
        .tensors
        .iter()
        .map(|t| plan.filter.is_none_or(|keep| keep(&t.name)))
        .collect();
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
    let mount = plan
        .table
        .and_then(|table| mount::lookup_file_in(table, &file, &canonical).ok());
    let mut choice = policy::choose(plan.mode, plan.origin, mount.as_ref());
    let switchable = plan.mode == ReadMode::Auto && choice.strategy == Strategy::Buffered;

    let body = match choice.strategy {
        Strategy::Mmap => match map_checked(&file, path, &header) {
            Ok(map) => Body::Mapped(map),
            Err(MapError::Checked(e)) => return Err(e),
            Err(MapError::Refused(e)) => {
                // Some FUSE filesystems refuse mmap (ENODEV); reading works.
                choice = Choice {
                    strategy: Strategy::Buffered,
                    reason: format!("mmap failed ({e}), read instead; {}", choice.reason),
                };
                Body::Pending(BufferLayout::for_file(&header, &selected))
            }
        },
        Strategy::Buffered => Body::Pending(BufferLayout::for_file(&header, &selected)),
    };

    let mut direct = None;
    if let Body::Pending(layout) = &body {
        // Direct reads skip the page cache: a win for a file that is not
        // there, a loss for one that is (it would be read from storage again).
        let wanted = plan.direct_io.unwrap_or_else(|| {
            policy::default_direct_io(mount.as_ref().map(|m| m.kind)) && !mostly_cached(&file, size)
        });
        if wanted && layout.image {
            match os::open_direct(path) {
                Ok(file) => direct = Some(file),
                Err(e) => choice.reason.push_str(&format!("; O_DIRECT refused ({e})")),
            }
        }
    }
    let finished_at = AtomicU64::new(since(plan.clock));
    Ok(OpenedShard {
        path: path.clone(),
        canonical,
        file,
        direct,
        size,
        header,
        selected,
        choice,
        switchable,
        mount,
        body,
        opened_at,
        finished_at,
    })
}

/// Whether at least half of a file's pages are in the page cache (by
/// `cachestat(2)`); false where that cannot be told.
fn mostly_cached(file: &File, size: u64) -> bool {
    let pages = size.div_ceil(os::page_size());
    os::cached_pages(file, 0, 0).is_ok_and(|cached| cached.saturating_mul(2) >= pages)
}

enum MapError {
    /// The map was made but the file is not what its header says.
    Checked(Error),
    /// The filesystem refused the map.
    Refused(std::io::Error),
}

/// Maps a file and checks the map's length against the header, before any
/// tensor can be handed out.
fn map_checked(file: &File, path: &Path, header: &Header) -> std::result::Result<Mmap, MapError> {
    let map = storage::map_file(file).map_err(MapError::Refused)?;
    let mapped = map.len() as u64;
    if mapped != header.file_len() {
        // The file changed between fstat and mmap.
        return Err(MapError::Checked(size_mismatch(
            path,
            header.file_len(),
            mapped,
        )));
    }
    Ok(map)
}

fn file_len(file: &File, path: &Path) -> Result<u64> {
    Ok(file
        .metadata()
        .map_err(|e| Error::io("reading metadata of", path, None, e))?
        .len())
}

fn size_mismatch(path: &Path, expected: u64, actual: u64) -> Error {
    Error::new(ErrorKind::SizeMismatch { expected, actual }, path)
}

/// Reads the 8-byte length, checks it against the limit and the file size,
/// then reads and parses exactly that many bytes of header.
fn read_header(file: &File, path: &Path, size: u64) -> Result<Header> {
    if size < PREFIX_LEN {
        return Err(Error::new(ErrorKind::FileTooSmall { len: size }, path));
    }
    let mut prefix = [0u8; PREFIX_LEN as usize];
    os::read_exact_at(file, &mut prefix, 0)
        .map_err(|(at, e)| read_error(file, path, size, at, e))?;
    let len = header::header_len(&prefix, size).map_err(|kind| Error::new(kind, path))?;
    // Bounded by the limit and by the file's size, both checked above.
    let mut json = vec![0u8; usize::try_from(len).unwrap_or(0)];
    os::read_exact_at(file, &mut json, PREFIX_LEN)
        .map_err(|(at, e)| read_error(file, path, size, at, e))?;
    header::parse(&json, size).map_err(|kind| Error::new(kind, path))
}

/// An I/O error of a read; a read that ended early means the file shrank,
/// which is reported as such.
fn read_error(
    file: &File,
    path: &Path,
    expected: u64,
    offset: u64,
    error: std::io::Error,
) -> Error {
    read_error_of("reading", file, path, expected, offset, error)
}

/// [`read_error`] for any operation of the read engine.
fn read_error_of(
    operation: &'static str,
    file: &File,
    path: &Path,
    expected: u64,
    offset: u64,
    error: std::io::Error,
) -> Error {
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        if let Ok(actual) = file_len(file, path) {
            if actual < expected {
                return size_mismatch(path, expected, actual);
            }
        }
    }
    Error::io(operation, path, Some(offset), error)
}

/// Refuses a checkpoint whose shards disagree with each other or with the
/// index: a tensor in two shards, or an index entry whose shard lacks it.
fn check_tensors(checkpoint: &Checkpoint, opened: &[OpenedShard]) -> Result<()> {
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for (i, shard) in opened.iter().enumerate() {
        for tensor in &shard.header.tensors {
            if let Some(first) = owner.insert(&tensor.name, i) {
                let first = opened
                    .get(first)
                    .map(|s| s.path.clone())
                    .unwrap_or_default();
                return Err(Error::new(
                    ErrorKind::DuplicateTensor {
                        tensor: tensor.name.clone(),
                        first,
                    },
                    &shard.path,
                ));
            }
        }
    }
    let Some(index) = &checkpoint.index else {
        return Ok(());
    };
    let opened_at: HashMap<&Path, usize> = opened
        .iter()
        .enumerate()
        .map(|(i, s)| (s.path.as_path(), i))
        .collect();
    let shard_paths: HashMap<&str, &Path> = checkpoint
        .shards
        .iter()
        .map(|s| (s.name.as_str(), s.path.as_path()))
        .collect();
    for (tensor, shard_name) in &index.weight_map {
        let Some(&path) = shard_paths.get(shard_name.as_str()) else {
            continue;
        };
        let Some(&shard_index) = opened_at.get(path) else {
            continue; // not opened: the filter needs nothing from it
        };
        if owner.get(tensor.as_str()) != Some(&shard_index) {
            return Err(Error::new(
                ErrorKind::TensorNotInShard {
                    tensor: tensor.clone(),
                    shard: shard_name.clone(),
                },
                path,
            ));
        }
    }
    Ok(())
}

/// The memory guard: buffered files that do not fit in the memory available
/// are mapped instead where the auto policy chose buffered; where the caller
/// asked for buffered, the load fails with the numbers instead of meeting
/// the OOM killer.
fn guard_memory(
    opened: &mut [OpenedShard],
    available: Option<u64>,
    checkpoint: &Path,
) -> Result<()> {
    let Some(available) = available else {
        return Ok(());
    };
    let pending = |s: &OpenedShard| match &s.body {
        Body::Pending(layout) => layout.len,
        _ => 0,
    };
    let needed: u64 = opened.iter().map(pending).sum();
    if needed <= available {
        return Ok(());
    }
    for shard in opened.iter_mut() {
        if !(shard.switchable && matches!(shard.body, Body::Pending(_))) {
            continue;
        }
        if let Ok(map) = map_checked(&shard.file, &shard.path, &shard.header) {
            shard.body = Body::Mapped(map);
            shard.direct = None;
            shard.choice = Choice {
                strategy: Strategy::Mmap,
                reason: format!(
                    "buffered reads would need {} but {} of memory is available, mapped instead; {}",
                    human_bytes(needed),
                    human_bytes(available),
                    shard.choice.reason
                ),
            };
        }
    }
    let still: u64 = opened.iter().map(pending).sum();
    if still > available {
        return Err(Error::new(
            ErrorKind::InsufficientMemory {
                needed: still,
                available,
            },
            checkpoint,
        ));
    }
    Ok(())
}

/// Allocates the buffers of pending files.
fn allocate(opened: &mut [OpenedShard]) -> Result<()> {
    for shard in opened.iter_mut() {
        let Body::Pending(layout) = &shard.body else {
            continue;
        };
        let len = usize::try_from(layout.len).unwrap_or(usize::MAX);
        let buffer = storage::alloc_buffer(len)
            .map_err(|e| Error::io("allocating a buffer for", &shard.path, None, e))?;
        if let Body::Pending(layout) = std::mem::replace(&mut shard.body, Body::Taken) {
            shard.body = Body::Buffered { buffer, layout };
        }
    }
    Ok(())
}

/// Reads every buffered file, and populates mapped ones when asked, through
/// one queue of jobs; then seals each buffer read-only and checks that no
/// file changed size meanwhile.
fn run_io(
    opened: &mut [OpenedShard],
    readers: usize,
    chunk: usize,
    populate: bool,
    clock: Instant,
) -> Result<()> {
    let mut jobs: Vec<Tagged<'_>> = Vec::new();
    let mut finished: Vec<&AtomicU64> = Vec::with_capacity(opened.len());
    for (file_index, shard) in opened.iter_mut().enumerate() {
        let OpenedShard {
            body,
            file,
            direct,
            finished_at,
            ..
        } = shard;
        finished.push(&*finished_at);
        let buffer_and_layout = match body {
            Body::Buffered { buffer, layout } => (buffer, layout),
            Body::Mapped(map) => {
                if populate {
                    read::split_populate(&mut jobs, file_index, map, chunk);
                }
                continue;
            }
            _ => continue,
        };
        let (buffer, layout) = buffer_and_layout;
        // Direct reads need whole blocks: round the chunk down to one.
        let source: &File = direct.as_ref().unwrap_or(file);
        let chunk = if direct.is_some() {
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
            let fallback = direct.is_some().then_some(&*file);
            read::split_read(
                &mut jobs,
                file_index,
                (source, fallback),
                segment.src,
                dst,
                required,
                chunk,
            );
        }
    }
    if !jobs.is_empty() {
        let done = |file_index: usize| {
            if let Some(f) = finished.get(file_index) {
                f.fetch_max(since(clock), Ordering::Relaxed);
            }
        };
        let result = read::run(jobs, readers, &done);
        drop(finished);
        if let Err(failure) = result {
            let shard = opened.get(failure.file_index);
            return Err(match shard {
                Some(s) => read_error_of(
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
        if !matches!(shard.body, Body::Buffered { .. }) {
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
    Ok(())
}

fn assemble(
    checkpoint: &Checkpoint,
    opened: Vec<OpenedShard>,
    clock: Instant,
    threads: usize,
    io_concurrency: usize,
) -> Result<StateDict> {
    let mut tensors = Vec::new();
    let mut by_name = HashMap::new();
    let mut metadata = BTreeMap::new();
    let mut files = Vec::with_capacity(opened.len());
    for shard in opened {
        let (map, layout) = match shard.body {
            Body::Mapped(map) => (map, None),
            Body::Read { map, layout } => (map, Some(layout)),
            // `run_io` seals every buffer, or fails.
            Body::Pending(_) | Body::Buffered { .. } | Body::Taken => continue,
        };
        let buffered = layout.is_some();
        let storage = Arc::new(Storage::new(map, shard.path.clone()));
        let mut count = 0;
        let mut bytes = 0u64;
        for (i, entry) in shard.header.tensors.iter().enumerate() {
            if !shard.selected.get(i).copied().unwrap_or(false) {
                continue;
            }
            let start = match &layout {
                Some(layout) => layout.placements.get(i).copied().flatten(),
                None => Some(shard.header.data_start + entry.start),
            };
            let len = entry.end - entry.start;
            let range = start.and_then(|s| {
                let s = usize::try_from(s).ok()?;
                let e = s.checked_add(usize::try_from(len).ok()?)?;
                (e <= storage.bytes().len()).then_some(s..e)
            });
            let Some(range) = range else {
                return Err(size_mismatch(
                    &shard.path,
                    shard.header.file_len(),
                    shard.size,
                ));
            };
            by_name.insert(entry.name.clone(), tensors.len());
            tensors.push(Tensor::new(
                Arc::from(entry.name.as_str()),
                entry.dtype,
                entry.shape.clone(),
                Arc::clone(&storage),
                range,
            ));
            count += 1;
            bytes += len;
        }
        if let Some(meta) = &shard.header.metadata {
            for (k, v) in meta {
                metadata.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let finished = shard.finished_at.load(Ordering::Relaxed);
        files.push(FileReport {
            path: shard.path,
            size: shard.size,
            tensors: count,
            tensor_bytes: bytes,
            bytes_read: if buffered { bytes } else { 0 },
            direct_io: shard.direct.is_some(),
            strategy: shard.choice.strategy,
            reason: shard.choice.reason,
            mount: shard.mount,
            elapsed: Duration::from_nanos(finished.saturating_sub(shard.opened_at)),
            metadata: shard.header.metadata,
        });
    }
    Ok(StateDict {
        tensors,
        by_name,
        metadata,
        index_metadata: checkpoint.index.as_ref().and_then(|i| i.metadata.clone()),
        report: LoadReport {
            files,
            elapsed: clock.elapsed(),
            threads,
            io_concurrency,
            prefetch: None,
        },
    })
}
