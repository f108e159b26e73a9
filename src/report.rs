//! What a load did, as data and as text: per file the filesystem, strategy, reason, bytes and time; the prefetch's rank split and guard; byte and rate formatting.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::mount::Mount;
use crate::mount::MountKind;
use crate::policy::{
    DISABLE_MMAP_ENV, Direct, Fallback, FileDecision, Origin, PrefetchMethod, ReadMode, Strategy,
};

/// How a load went: one [`FileReport`] per file, and the totals.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub(crate) files: Vec<FileReport>,
    pub(crate) elapsed: Duration,
    pub(crate) threads: usize,
    pub(crate) io_concurrency: usize,
    pub(crate) prefetch: Option<PrefetchReport>,
    pub(crate) notes: Vec<String>,
    /// How many reads were kept in flight, and why.
    pub(crate) io: Option<crate::adapt::Settled>,
}

impl LoadReport {
    /// Per file, in load order.
    pub fn files(&self) -> &[FileReport] {
        &self.files
    }

    /// Wall time of the whole load.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Files opened and parsed at once.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Reads in flight at once for buffered files: the count the caller set,
    /// or the one the load settled on by measuring throughput (see
    /// [`io_concurrency_reason`](Self::io_concurrency_reason)).
    pub fn io_concurrency(&self) -> usize {
        self.io_concurrency
    }

    /// How [`io_concurrency`](Self::io_concurrency) was found, in words:
    /// each count tried and its throughput; `None` where nothing was read.
    pub fn io_concurrency_reason(&self) -> Option<String> {
        self.io.as_ref().map(ToString::to_string)
    }

    /// What the page-cache prefetch before the load did and why: `Some`
    /// where it was asked for ([`Loader::prefetch`](crate::Loader::prefetch),
    /// `SAFELOAD_PREFETCH`) or considered by the auto policy (files on a
    /// network filesystem), also when it decided not to run.
    pub fn prefetch(&self) -> Option<&PrefetchReport> {
        self.prefetch.as_ref()
    }

    /// What the load could not do as planned and did otherwise, in words:
    /// e.g. fewer reader threads than asked because the OS refused more
    /// (`RLIMIT_NPROC`, a cgroup's `pids.max`). Empty when all went to plan.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Values that became infinite when converted, over all files
    /// ([`FileReport::overflowed`]).
    pub fn overflowed(&self) -> u64 {
        self.files.iter().map(|f| f.overflowed).sum()
    }

    /// Bytes read into memory (buffered files).
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(|f| f.bytes_read).sum()
    }

    /// Bytes of tensor data loaded, read or mapped.
    pub fn tensor_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.tensor_bytes).sum()
    }

    /// Bytes read per second of wall time, in GiB/s: `None` where the load
    /// read nothing (every file mapped lazily: its pages are read when first
    /// touched, after the load, and no figure of the load measures that).
    pub fn gib_per_s(&self) -> Option<f64> {
        gib_per_s(self.bytes_read(), self.elapsed)
    }
}

fn gib_per_s(bytes: u64, elapsed: Duration) -> Option<f64> {
    let secs = elapsed.as_secs_f64();
    (bytes > 0 && secs > 0.0).then(|| bytes as f64 / (1u64 << 30) as f64 / secs)
}

/// How one file was read.
#[derive(Debug, Clone)]
pub struct FileReport {
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
    pub(crate) tensors: usize,
    pub(crate) tensor_bytes: u64,
    pub(crate) bytes_read: u64,
    pub(crate) direct_io: bool,
    pub(crate) strategy: Strategy,
    pub(crate) reason: String,
    pub(crate) mount: Option<Mount>,
    pub(crate) elapsed: Duration,
    pub(crate) metadata: Option<HashMap<String, String>>,
    pub(crate) sha256: Option<String>,
    pub(crate) converted: usize,
    pub(crate) overflowed: u64,
    /// What the node copy did for it (several local ranks), in words.
    pub(crate) node_copy: Option<String>,
}

impl FileReport {
    /// The file's path, as opened (symlinks not resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Tensors loaded from it (after the filter).
    pub fn tensors(&self) -> usize {
        self.tensors
    }

    /// Bytes of tensor data loaded from it (after the filter).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_bytes
    }

    /// Bytes read at load time: the tensor data of a buffered file (and of
    /// its converted tensors), the whole file where a map was populated;
    /// zero for a file mapped lazily.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Whether its buffered reads bypassed the page cache (`O_DIRECT`).
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// Whether it was mapped or read.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Why, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The filesystem it lives on, where it could be found.
    pub fn mount(&self) -> Option<&Mount> {
        self.mount.as_ref()
    }

    /// From opening the file to its last byte read (buffered) or its map
    /// made (mapped).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Bytes read per second over [`elapsed`](Self::elapsed), in GiB/s:
    /// `None` for a file mapped lazily, which the load does not read.
    pub fn gib_per_s(&self) -> Option<f64> {
        gib_per_s(self.bytes_read, self.elapsed)
    }

    /// Whether the file was mapped and not read at load time: its pages
    /// are read when first touched.
    pub fn lazy(&self) -> bool {
        self.strategy == Strategy::Mmap && self.bytes_read == 0
    }

    /// Tensors converted to another dtype while loading
    /// ([`Loader::dtype`](crate::Loader::dtype)).
    pub fn converted(&self) -> usize {
        self.converted
    }

    /// Values that were finite in the file and became infinite when
    /// converted (they rounded beyond the target's largest value).
    pub fn overflowed(&self) -> u64 {
        self.overflowed
    }

    /// The file's SHA-256 in lowercase hex, where the load computed it
    /// ([`Loader::verify`](crate::Loader::verify)); a file whose digest was
    /// expected (its cache blob name, or `expect_sha256`) has been checked
    /// against it.
    pub fn sha256(&self) -> Option<&str> {
        self.sha256.as_deref()
    }

    /// The file's own `__metadata__`.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.as_ref()
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loaded {} tensor bytes from {} file(s) in {:.3} s",
            human_bytes(self.tensor_bytes()),
            self.files.len(),
            self.elapsed.as_secs_f64(),
        )?;
        match self.gib_per_s() {
            Some(rate) => write!(
                f,
                ", {} read at {rate:.2} GiB/s",
                human_bytes(self.bytes_read())
            )?,
            None => write!(f, ", nothing read (mapped)")?,
        }
        match &self.io {
            Some(io) => writeln!(f, "; {} file(s) at once, {io}", self.threads)?,
            None => writeln!(f, "; {} file(s) at once", self.threads)?,
        }
        if let Some(prefetch) = &self.prefetch {
            writeln!(f, "  {prefetch}")?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        for file in &self.files {
            write!(
                f,
                "  {}  {}  {} tensors, {}",
                file.path.display(),
                file.strategy,
                file.tensors,
                human_bytes(file.tensor_bytes),
            )?;
            match file.gib_per_s() {
                Some(rate) => writeln!(
                    f,
                    "  {} read in {:.3} s  {rate:.2} GiB/s",
                    human_bytes(file.bytes_read),
                    file.elapsed.as_secs_f64()
                )?,
                None if file
                    .node_copy
                    .as_ref()
                    .is_some_and(|n| n.starts_with("filled")) =>
                {
                    writeln!(f, "  views of the node copy")?
                }
                None => writeln!(f, "  mapped (pages are read when first touched)")?,
            }
            let direct = if file.direct_io { " (O_DIRECT)" } else { "" };
            writeln!(f, "    {}{direct}: {}", file.strategy, file.reason)?;
            if let Some(note) = &file.node_copy {
                writeln!(f, "    node copy: {note}")?;
            }
            if file.converted > 0 {
                writeln!(
                    f,
                    "    {} tensor(s) converted, {} value(s) became infinite",
                    file.converted, file.overflowed
                )?;
            }
            if let Some(sha) = &file.sha256 {
                writeln!(f, "    sha256 {sha}")?;
            }
        }
        Ok(())
    }
}

pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let name = UNITS.get(unit).copied().unwrap_or("B");
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {name}")
    }
}

/// What a prefetch did, for this process: the rank split, what was already
/// in the page cache, what this process warmed, what the memory guard left
/// cold and why. `Display` prints it as one line.
#[derive(Debug, Clone, Default)]
pub struct PrefetchReport {
    pub(crate) ran: bool,
    pub(crate) reason: String,
    pub(crate) rank: usize,
    pub(crate) local_size: usize,
    pub(crate) rank_source: String,
    pub(crate) streams: usize,
    pub(crate) method: PrefetchMethod,
    pub(crate) queue_path: Option<PathBuf>,
    pub(crate) queue_note: Option<String>,
    pub(crate) files: usize,
    pub(crate) total_bytes: u64,
    pub(crate) chunk_size: u64,
    pub(crate) chunks: usize,
    pub(crate) chunks_handled: usize,
    pub(crate) resident_before: u64,
    pub(crate) warmed: u64,
    pub(crate) reread: u64,
    pub(crate) skipped: u64,
    pub(crate) skip_reasons: Vec<String>,
    pub(crate) resident_after: Option<u64>,
    pub(crate) residency_known: bool,
    pub(crate) elapsed: Duration,
}

impl PrefetchReport {
    /// Whether anything was warmed or checked; `false` when prefetch was
    /// considered and not done (see [`reason`](Self::reason)).
    pub fn ran(&self) -> bool {
        self.ran
    }

    /// Why prefetch ran, or why not, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// This process's rank among the job's processes on this node.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of the job's processes on this node.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// Where the rank came from, e.g. `LOCAL_RANK=1 LOCAL_WORLD_SIZE=8 (torchrun)`.
    pub fn rank_source(&self) -> &str {
        &self.rank_source
    }

    /// Readers in this process.
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// How chunks were warmed (of the first file, where files differ).
    pub fn method(&self) -> PrefetchMethod {
        self.method
    }

    /// Whether the ranks shared one queue (else each warmed a fixed share).
    pub fn shared_queue(&self) -> bool {
        self.queue_path.is_some()
    }

    /// The shared queue's file, where one was used.
    pub fn queue_path(&self) -> Option<&Path> {
        self.queue_path.as_deref()
    }

    /// Why the queue was not shared, or what was replaced to share it.
    pub fn queue_note(&self) -> Option<&str> {
        self.queue_note.as_deref()
    }

    /// Files prefetched.
    pub fn files(&self) -> usize {
        self.files
    }

    /// Their total size, in bytes.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The chunk size used, in bytes.
    pub fn chunk_size(&self) -> u64 {
        self.chunk_size
    }

    /// Chunks in the checkpoint.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Chunks this process claimed and handled (resident or not).
    pub fn chunks_handled(&self) -> usize {
        self.chunks_handled
    }

    /// Bytes already in the page cache before warming began (when the queue
    /// was made, for a shared queue).
    pub fn resident_before(&self) -> u64 {
        self.resident_before
    }

    /// Bytes this process brought into the page cache.
    pub fn warmed(&self) -> u64 {
        self.warmed
    }

    /// Bytes this process found missing after warming and read again.
    pub fn reread(&self) -> u64 {
        self.reread
    }

    /// Bytes left cold on this node: by the memory guard, or because a rank
    /// holding them stopped making progress.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Why bytes were skipped, in words.
    pub fn skip_reasons(&self) -> &[String] {
        &self.skip_reasons
    }

    /// Bytes in the page cache when this process finished, where residency
    /// can be checked.
    pub fn resident_after(&self) -> Option<u64> {
        self.resident_after
    }

    /// Whether page-cache residency could be checked. The kernel hides it
    /// for files the caller neither owns nor may write (`cachestat(2)`,
    /// `mincore(2)`); every chunk is then read, which costs a copy where
    /// the pages are already cached.
    pub fn residency_known(&self) -> bool {
        self.residency_known
    }

    /// Wall time of this process's prefetch.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
}

impl fmt::Display for PrefetchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.ran {
            write!(f, "not prefetched: {}", self.reason)?;
            if !self.skip_reasons.is_empty() {
                write!(f, "; {}", self.skip_reasons.join("; "))?;
            }
            return Ok(());
        }
        let queue = match (&self.queue_path, &self.queue_note) {
            (Some(path), _) => format!("shared queue {}", path.display()),
            (None, Some(note)) => note.clone(),
            (None, None) => "one process".to_string(),
        };
        write!(
            f,
            "prefetched: {}; rank {} of {} ({}), {} stream(s), {}, {}; {} in {} file(s): {} already resident, {} warmed here ({} of {} chunks), {} re-read, {} skipped",
            self.reason,
            self.rank,
            self.local_size,
            self.rank_source,
            self.streams,
            self.method,
            queue,
            human_bytes(self.total_bytes),
            self.files,
            human_bytes(self.resident_before),
            human_bytes(self.warmed),
            self.chunks_handled,
            self.chunks,
            human_bytes(self.reread),
            human_bytes(self.skipped),
        )?;
        if !self.skip_reasons.is_empty() {
            write!(f, " ({})", self.skip_reasons.join("; "))?;
        }
        if !self.residency_known {
            write!(f, ", residency not visible (every chunk read)")?;
        }
        write!(f, "; {:.3} s", self.elapsed.as_secs_f64())
    }
}

// ---------------------------------------------------------------------------
// The policy's reasons in words: rendered here, once.

impl fmt::Display for FileDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.fallback {
            Some(Fallback::MmapRefused(e)) => write!(f, "mmap failed ({e}), read instead; ")?,
            Some(Fallback::MemoryGuard {
                needed,
                available,
                kept,
                files,
            }) => write!(
                f,
                "buffered reads would need {} (margin included) but {} of memory is available, \
                 mapped instead ({kept} of {files} files read); ",
                human_bytes(*needed),
                human_bytes(*available)
            )?,
            None => {}
        }
        let located = self
            .mount
            .as_ref()
            .map(|m| format!(" ({})", describe(m)))
            .unwrap_or_default();
        match (self.mode, self.origin) {
            (ReadMode::Auto, _) => f.write_str(&auto_reason(self.mount.as_ref()))?,
            (mode, Origin::Environment) => write!(
                f,
                "{DISABLE_MMAP_ENV}={} is set{located}",
                u8::from(mode == ReadMode::Buffered)
            )?,
            (mode, _) => write!(
                f,
                "disable_mmap({}) was requested{located}",
                mode == ReadMode::Buffered
            )?,
        }
        if let Direct::Refused(e) = &self.direct {
            write!(f, "; O_DIRECT refused ({e})")?;
        }
        Ok(())
    }
}

fn auto_reason(mount: Option<&Mount>) -> String {
    let Some(mount) = mount else {
        return "filesystem unknown — mapping is the default".to_string();
    };
    let at = describe(mount);
    match mount.kind {
        MountKind::HfMount if mount.fs_type.starts_with("nfs") => {
            format!("{at} — served by a userspace server on loopback, where mmap page faults stall")
        }
        MountKind::HfMount | MountKind::Fuse => format!("{at} — mmap page faults stall on FUSE"),
        MountKind::Network => format!("{at} — mapped; pages shared through the page cache"),
        MountKind::Local => format!("{at} — mapping a local file costs no copy"),
        _ => format!("{at} — filesystem unknown, mapping is the default"),
    }
}

/// `on hf-mount (fuse) at /mnt/hub`: a mount in words, for reasons.
pub(crate) fn describe(mount: &Mount) -> String {
    let kind = match mount.kind {
        MountKind::HfMount => "hf-mount",
        MountKind::Fuse => "FUSE",
        MountKind::Network => "network filesystem",
        MountKind::Local => "local filesystem",
        _ => "filesystem",
    };
    if mount.mount_point.as_os_str().is_empty() {
        format!("on {kind} ({})", mount.fs_type)
    } else {
        format!(
            "on {kind} ({}) at {}",
            mount.fs_type,
            mount.mount_point.display()
        )
    }
}
