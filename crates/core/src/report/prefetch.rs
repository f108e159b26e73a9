//! What a prefetch did, as data and as text: the report of one process's prefetch, why it ran (`PrefetchReason`), where its local rank came from, what became of its queue (`QueueNote`), and why bytes were left cold.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::human_bytes;
use crate::mount::Mount;
use crate::policy::PrefetchMethod;

reported! {
/// What a prefetch did, for this process: the rank split, what was already cached, what it
/// warmed, what was left cold and why. `Display` prints it as one line.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PrefetchReport {
    /// Whether anything was warmed or checked (else see [`reason`](Self::reason)).
    pub ran: bool,
    /// Why prefetch ran, or why not.
    pub reason: PrefetchReason,
    /// This process's rank among the job's processes on this node.
    pub rank: usize,
    /// The number of the job's processes on this node.
    pub local_size: usize,
    /// Where the rank and size came from.
    pub rank_source: RankSource,
    /// Readers in this process.
    pub streams: usize,
    /// How chunks were warmed (of the first file, where files differ).
    pub method: PrefetchMethod,
    /// Whether the ranks shared one queue (else each warmed a fixed share).
    pub shared_queue: bool,
    /// Why the queue was not shared, or what was replaced to share it.
    pub queue_note: Option<QueueNote>,
    /// Files prefetched.
    pub files: usize,
    /// Their total size, in bytes.
    pub total_bytes: u64,
    /// The chunk size used, in bytes.
    pub chunk_size: u64,
    /// Chunks in the checkpoint.
    pub chunks: usize,
    /// Chunks this process claimed and handled (resident or not).
    pub chunks_handled: usize,
    /// Bytes already in the page cache before warming began (or the shared queue was made).
    pub resident_before: u64,
    /// Bytes this process brought into the page cache.
    pub warmed: u64,
    /// Bytes this process found missing after warming and read again.
    pub reread: u64,
    /// Bytes left cold on this node (see [`skip_reasons`](Self::skip_reasons)).
    pub skipped: u64,
    /// Why bytes were skipped.
    pub skip_reasons: Vec<SkipReason>,
    /// Bytes in the page cache when this process finished, where residency can be checked.
    pub resident_after: Option<u64>,
    /// Whether page-cache residency could be checked: the kernel hides it for files the caller
    /// neither owns nor may write (`cachestat(2)`), and every chunk is then read.
    pub residency_known: bool,
    /// Wall time of this process's prefetch.
    pub elapsed: Duration => serialize_with = "crate::worded::seconds",
    /// The shared queue's file, where one was used (for tests).
    #[doc(hidden)]
    pub queue_path: Option<PathBuf> => skip_serializing_if = "crate::worded::always",
}
computed { gib_per_s: Option<f64> }
}

/// A prefetch that did nothing: off ([`PrefetchReason::Off`]), one process.
impl Default for PrefetchReport {
    fn default() -> Self {
        PrefetchReport {
            ran: false,
            reason: PrefetchReason::Off,
            rank: 0,
            local_size: 1,
            rank_source: RankSource::Alone,
            streams: 0,
            method: PrefetchMethod::Auto,
            shared_queue: false,
            queue_note: None,
            files: 0,
            total_bytes: 0,
            chunk_size: 0,
            chunks: 0,
            chunks_handled: 0,
            resident_before: 0,
            warmed: 0,
            reread: 0,
            skipped: 0,
            skip_reasons: Vec::new(),
            resident_after: None,
            residency_known: false,
            elapsed: Duration::ZERO,
            queue_path: None,
        }
    }
}

impl PrefetchReport {
    /// Bytes this process read (warmed and re-read) per second, in GiB/s; `None` for none.
    pub fn gib_per_s(&self) -> Option<f64> {
        super::gib_per_s(self.warmed + self.reread, self.elapsed)
    }
}

impl fmt::Display for PrefetchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.ran {
            write!(f, "not prefetched: {}", self.reason)?;
            if !self.skip_reasons.is_empty() {
                write!(f, "; {}", joined(&self.skip_reasons))?;
            }
            return Ok(());
        }
        let queue = match (&self.queue_path, &self.queue_note) {
            (Some(path), _) => format!("shared queue {}", path.display()),
            (None, Some(note)) => note.to_string(),
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
            write!(f, " ({})", joined(&self.skip_reasons))?;
        }
        if !self.residency_known {
            write!(f, ", residency not visible (every chunk read)")?;
        }
        write!(f, "; {:.3} s", self.elapsed.as_secs_f64())
    }
}

/// Reasons in words, one after another.
fn joined(reasons: &[SkipReason]) -> String {
    reasons
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

worded! {
/// Where a process's local rank and the number of local ranks came from
/// ([`PrefetchReport::rank_source`]), e.g. `LOCAL_RANK=1 LOCAL_WORLD_SIZE=8 (torchrun)`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RankSource {
    /// `Loader::local_rank`.
    Caller {
        /// Whether the rank was below the size (else taken as one process).
        valid: bool,
    } = "caller",
    /// A launcher's variables, as they were set.
    Launcher {
        /// `torchrun`, `Slurm`, `Open MPI` or `MPICH/Intel MPI`.
        launcher: &'static str,
        /// The rank's variable, e.g. `LOCAL_RANK`.
        rank_var: &'static str,
        /// Its value.
        rank: String,
        /// The size's variable, e.g. `LOCAL_WORLD_SIZE`.
        size_var: &'static str,
        /// Its value.
        size: String,
        /// Whether the values were numbers, the rank below the size (else one process).
        valid: bool,
    } = "launcher",
    /// No launcher variable was set: one process.
    #[default]
    Alone = "alone",
}
}

impl fmt::Display for RankSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let valid = match self {
            RankSource::Caller { valid } => {
                f.write_str("local_rank() was set")?;
                valid
            }
            RankSource::Launcher {
                launcher,
                rank_var,
                rank,
                size_var,
                size,
                valid,
            } => {
                write!(f, "{rank_var}={rank} {size_var}={size} ({launcher})")?;
                valid
            }
            RankSource::Alone => return f.write_str("no launcher variables"),
        };
        if !valid {
            f.write_str(": invalid, taken as one process")?;
        }
        Ok(())
    }
}

worded! {
/// Why a prefetch left bytes cold ([`PrefetchReport::skip_reasons`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Warming `needed` more bytes would pass the budget, 90 % of the memory `available`.
    MemoryGuard {
        /// Bytes not in the page cache.
        needed: u64,
        /// The most that may be warmed.
        budget: u64,
        /// The memory available (`MemAvailable` and the cgroup's room).
        available: u64,
        /// Bytes already in the page cache.
        resident: u64,
        /// Bytes of the files prefetched.
        total: u64,
        /// Bytes left cold.
        skipped: u64,
    } = "memory_guard",
    /// Files this rank alone reads buffered: a prefetch through the page cache would read
    /// them twice.
    ReadByThisRank {
        /// Their bytes.
        bytes: u64,
        /// How many files.
        files: usize,
    } = "read_by_this_rank",
    /// Ranks holding chunks made no progress for `seconds`: their chunks were left.
    Stalled {
        /// How long this rank waited.
        seconds: u64,
        /// Chunks left.
        chunks: usize,
        /// The processes that held them.
        pids: Vec<u32>,
    } = "stalled",
}
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::MemoryGuard {
                needed,
                budget,
                available,
                resident,
                total,
                skipped,
            } => {
                write!(
                    f,
                    "memory guard: warming {} more would exceed {} (90% of {} available)",
                    human_bytes(*needed),
                    human_bytes(*budget),
                    human_bytes(*available),
                )?;
                if *resident > 0 {
                    write!(
                        f,
                        ", {} of {} already resident",
                        human_bytes(*resident),
                        human_bytes(*total)
                    )?;
                }
                write!(f, "; {} left cold", human_bytes(*skipped))
            }
            SkipReason::ReadByThisRank { bytes, files } => write!(
                f,
                "{} file(s) of {} not warmed: read buffered by this rank alone, \
                 its own streaming reads take them",
                files,
                human_bytes(*bytes)
            ),
            SkipReason::Stalled {
                seconds,
                chunks,
                pids,
            } => write!(
                f,
                "stopped waiting after {seconds} s without progress for {chunks} chunk(s) \
                 claimed by pid {pids:?}"
            ),
        }
    }
}
worded! {
/// Why a prefetch ran, or why not ([`PrefetchReport::reason`]): asked for, or the auto
/// policy's word on files of a network filesystem.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum PrefetchReason {
    /// `Loader::prefetch` asked for it (or `Loader::warm` ran it).
    Requested {
        /// Readers per process.
        streams: usize,
    } = "prefetch_requested",
    /// An environment variable asked for it (`SAFELOAD_PREFETCH`, `HF_SHARD_PREFETCH`).
    FromEnvironment {
        /// The variable.
        variable: &'static str,
        /// Its value: readers per process.
        streams: usize,
    } = "prefetch_from_environment",
    /// Asked with no readers: nothing was warmed.
    Off = "prefetch_off",
    /// The auto policy warmed files on a network filesystem before mapping them.
    Auto {
        /// The filesystem of the first file.
        mount: Mount,
        /// Bytes not in the page cache.
        needed: u64,
        /// Bytes of the files.
        total: u64,
    } = "prefetch_auto",
    /// The auto policy left files on a network filesystem alone: all in the page cache.
    AutoResident {
        /// The filesystem of the first file.
        mount: Mount,
    } = "prefetch_auto_resident",
    /// The auto policy left files on a network filesystem alone: they do not fit the memory guard.
    AutoDoesNotFit {
        /// The filesystem of the first file.
        mount: Mount,
    } = "prefetch_auto_does_not_fit",
}
}

/// `on network (nfs4) at /mnt/models`: where an auto prefetch looked.
fn place(mount: &Mount) -> String {
    format!(
        "on {} ({}) at {}",
        mount.kind,
        mount.fs_type,
        mount.mount_point.display()
    )
}

impl fmt::Display for PrefetchReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefetchReason::Requested { streams } => write!(f, "prefetch({streams}) was requested"),
            PrefetchReason::FromEnvironment { variable, streams } => {
                write!(f, "{variable}={streams} is set")
            }
            PrefetchReason::Off => f.write_str("streams(0): prefetch is off"),
            PrefetchReason::Auto {
                mount,
                needed,
                total,
            } => write!(
                f,
                "{}, {} of {} not in the page cache: warmed first, then mapped",
                place(mount),
                human_bytes(*needed),
                human_bytes(*total)
            ),
            PrefetchReason::AutoResident { mount } => {
                write!(f, "{}, already in the page cache", place(mount))
            }
            PrefetchReason::AutoDoesNotFit { mount } => write!(
                f,
                "{}, the checkpoint does not fit the memory guard",
                place(mount)
            ),
        }
    }
}

worded! {
/// Why a prefetch's queue was not shared, or what was replaced to share it
/// ([`PrefetchReport::queue_note`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum QueueNote {
    /// The caller asked for no shared queue: each local rank warmed a fixed share.
    FixedShares = "fixed_shares",
    /// The shared queue file could not be had: each rank warmed a fixed share.
    NotShared {
        /// The queue file.
        path: PathBuf => serialize_with = "crate::worded::path_text",
        /// Why, e.g. `a FIFO of uid 1000, not this user's`, or the OS's error.
        why: String,
    } = "queue_not_shared",
    /// A queue file left by an earlier run, or not a valid queue, was replaced.
    Replaced {
        /// What was wrong with it.
        why: &'static str,
    } = "queue_replaced",
}
}

impl fmt::Display for QueueNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueNote::FixedShares => {
                f.write_str("shared_queue(false): a fixed share of the bytes")
            }
            QueueNote::NotShared { path, why } => write!(
                f,
                "no shared queue ({}: {why}): a fixed share of the bytes",
                path.display()
            ),
            QueueNote::Replaced { why } => write!(f, "replaced a queue file: {why}"),
        }
    }
}
