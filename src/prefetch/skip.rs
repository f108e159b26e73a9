//! Why a prefetch left bytes cold, as data: the memory guard, files a rank reads itself, ranks that stopped; rendered to words once, by `Display`.

use std::fmt;

use crate::report::human_bytes;

/// Why a prefetch left bytes cold
/// ([`PrefetchReport::skip_reasons`](crate::report::PrefetchReport::skip_reasons)).
/// `Display` says it in words.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum SkipReason {
    /// Warming `needed` more bytes would pass the budget, 90 % of the
    /// memory `available` (the smaller of `MemAvailable` and the cgroup's
    /// room); `resident` of the `total` were in the page cache already, and
    /// `skipped` bytes were left cold.
    MemoryGuard {
        /// Bytes not in the page cache.
        needed: u64,
        /// The most that may be warmed.
        budget: u64,
        /// The memory available.
        available: u64,
        /// Bytes already in the page cache.
        resident: u64,
        /// Bytes of the files prefetched.
        total: u64,
        /// Bytes left cold.
        skipped: u64,
    },
    /// Files this rank alone reads buffered: its own streaming reads take
    /// them, and a prefetch through the page cache would read them twice.
    ReadByThisRank {
        /// Their bytes.
        bytes: u64,
        /// How many files.
        files: usize,
    },
    /// Ranks holding chunks made no progress for `seconds`: their chunks
    /// were left, not waited for.
    Stalled {
        /// How long this rank waited.
        seconds: u64,
        /// Chunks left.
        chunks: usize,
        /// The processes that held them.
        pids: Vec<u32>,
    },
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
