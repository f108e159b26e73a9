//! Whether the page cache is warmed before a load, with how many streams and which method: the caller, the environment, then the auto rule.

use std::fmt;

use super::Environment;
use crate::mount::MountKind;

/// The environment variable that turns prefetch on with this many streams per rank (`0`: off).
pub const PREFETCH_ENV: &str = "SAFELOAD_PREFETCH";

/// Read as [`PREFETCH_ENV`] when that is unset (jobs set it for `transformers`).
pub const HF_SHARD_PREFETCH_ENV: &str = "HF_SHARD_PREFETCH";

/// How a chunk is brought into the page cache.
///
/// ```
/// assert_eq!(safeload::report::PrefetchMethod::Pread.to_string(), "pread");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum PrefetchMethod {
    /// `WillNeed` where the pages can be seen landing (`mincore`), else `Pread`.
    #[default]
    Auto,
    /// Large positional reads into a reused per-reader buffer.
    Pread,
    /// `posix_fadvise(POSIX_FADV_WILLNEED)` over the chunk, then waiting until the pages are
    /// resident and reading what did not arrive; where residency is not visible, reads instead.
    WillNeed,
}

impl PrefetchMethod {
    /// `"auto"`, `"pread"` or `"willneed"`, as `Display` and JSON say it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            PrefetchMethod::Auto => "auto",
            PrefetchMethod::Pread => "pread",
            PrefetchMethod::WillNeed => "willneed",
        }
    }
}

impl fmt::Display for PrefetchMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How prefetch was asked for, strongest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefetchAsk {
    /// `Loader::prefetch(n)` / `prefetch_with`.
    Caller(usize),
    /// `SAFELOAD_PREFETCH=n` (else `HF_SHARD_PREFETCH=n`): the streams and the variable.
    Environment(usize, &'static str),
    /// Neither: the auto policy decides.
    Unset,
}

/// Whether a requested prefetch warms a file the load reads buffered: only where several
/// local ranks share the reads; a rank alone reads it with its own streaming reads.
///
/// NOTE: on FUSE a rank alone that warmed its files first was far slower than its direct reads
/// (BENCHMARKS.md, "policy/prefetch.rs: prefetch_warms_buffered").
pub fn prefetch_warms_buffered(local_size: usize) -> bool {
    local_size > 1
}

/// The caller's prefetch streams if set, else the environment's (a value not a number is
/// ignored), else unset.
pub fn prefetch_ask(caller: Option<usize>, env: &Environment) -> PrefetchAsk {
    if let Some(streams) = caller {
        return PrefetchAsk::Caller(streams);
    }
    [PREFETCH_ENV, HF_SHARD_PREFETCH_ENV]
        .into_iter()
        .find_map(|name| {
            let streams = env.get(name)?.trim().parse::<usize>().ok()?;
            Some(PrefetchAsk::Environment(streams, name))
        })
        .unwrap_or(PrefetchAsk::Unset)
}

/// Prefetch streams the auto policy uses for a file that will be mapped, by its filesystem,
/// where prefetch is left unset; `None` leaves it off.
///
/// NOTE: on a kernel network filesystem, faulting a cold map in reads far below a few large
/// sequential readers (reference/004: a cold 57 GB load on Lustre 369 s -> 144 s with 4).
pub fn auto_prefetch_streams(kind: MountKind) -> Option<usize> {
    match kind {
        MountKind::Network => Some(4),
        _ => None,
    }
}

/// Why the auto policy, having picked files to prefetch, does not run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoPrefetchSkip {
    /// Every byte is already in the page cache.
    Resident,
    /// The memory guard would leave part of the checkpoint cold.
    DoesNotFit,
}

/// The auto policy's last word: prefetch runs unless all is resident, or the guard would leave
/// some cold (a partial warm of a checkpoint mapped whole only evicts itself).
pub fn auto_prefetch_runs(
    residency_known: bool,
    needed: u64,
    guard_skipped: u64,
) -> Result<(), AutoPrefetchSkip> {
    if residency_known && needed == 0 {
        Err(AutoPrefetchSkip::Resident)
    } else if guard_skipped > 0 {
        Err(AutoPrefetchSkip::DoesNotFit)
    } else {
        Ok(())
    }
}

/// The prefetch method for a file: the caller's, else `WillNeed`; `Pread` where pages cannot be
/// seen landing.
///
/// NOTE: `WILLNEED` won by several times on FUSE (the kernel's read-ahead runs asynchronously)
/// and tied on a local disk, copying nothing (BENCHMARKS.md, "policy/prefetch.rs:
/// PrefetchMethod").
pub fn prefetch_method(
    requested: PrefetchMethod,
    _kind: MountKind,
    pages_visible: bool,
) -> PrefetchMethod {
    let method = match requested {
        // The same winner on every kind measured.
        PrefetchMethod::Auto => PrefetchMethod::WillNeed,
        other => other,
    };
    match method {
        PrefetchMethod::WillNeed if pages_visible => PrefetchMethod::WillNeed,
        _ => PrefetchMethod::Pread,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_asked_by_caller_then_environment() {
        let env = Environment::from_pairs(&[(PREFETCH_ENV, "3"), (HF_SHARD_PREFETCH_ENV, "5")]);
        assert_eq!(prefetch_ask(Some(2), &env), PrefetchAsk::Caller(2));
        assert_eq!(
            prefetch_ask(None, &env),
            PrefetchAsk::Environment(3, "SAFELOAD_PREFETCH")
        );
        let hf = Environment::from_pairs(&[(PREFETCH_ENV, "lots"), (HF_SHARD_PREFETCH_ENV, " 5 ")]);
        assert_eq!(
            prefetch_ask(None, &hf),
            PrefetchAsk::Environment(5, "HF_SHARD_PREFETCH")
        );
        assert_eq!(
            prefetch_ask(None, &Environment::default()),
            PrefetchAsk::Unset
        );
        // Trimmed; ours first, also when it turns prefetch off; not a number
        // is ignored.
        let env = |pairs: &[(&'static str, &str)]| Environment::from_pairs(pairs);
        let ours = PREFETCH_ENV;
        let theirs = HF_SHARD_PREFETCH_ENV;
        assert_eq!(
            prefetch_ask(None, &env(&[(ours, " 4 ")])),
            PrefetchAsk::Environment(4, "SAFELOAD_PREFETCH")
        );
        assert_eq!(
            prefetch_ask(None, &env(&[(theirs, "8")])),
            PrefetchAsk::Environment(8, "HF_SHARD_PREFETCH")
        );
        assert_eq!(
            prefetch_ask(None, &env(&[(ours, "0"), (theirs, "8")])),
            PrefetchAsk::Environment(0, "SAFELOAD_PREFETCH")
        );
        assert_eq!(
            prefetch_ask(None, &env(&[(ours, "yes")])),
            PrefetchAsk::Unset
        );
    }

    #[test]
    fn auto_prefetch_for_cold_mapped_network_files_that_fit() {
        use MountKind::*;
        assert_eq!(auto_prefetch_streams(Network), Some(4));
        for kind in [HfMount, Fuse, Local, Unknown] {
            assert_eq!(auto_prefetch_streams(kind), None, "{kind:?}");
        }
        assert_eq!(
            auto_prefetch_runs(true, 0, 0),
            Err(AutoPrefetchSkip::Resident)
        );
        assert_eq!(
            auto_prefetch_runs(false, 0, 0),
            Ok(()),
            "unknown residency: warm"
        );
        assert_eq!(
            auto_prefetch_runs(true, 10, 5),
            Err(AutoPrefetchSkip::DoesNotFit)
        );
        assert_eq!(auto_prefetch_runs(true, 10, 0), Ok(()));
    }

    #[test]
    fn prefetch_method_needs_visible_pages_for_willneed() {
        use PrefetchMethod::*;
        let table = [
            (Auto, true, WillNeed),
            (Auto, false, Pread),
            (WillNeed, false, Pread),
            (WillNeed, true, WillNeed),
            (Pread, true, Pread),
        ];
        for (requested, visible, expected) in table {
            assert_eq!(
                prefetch_method(requested, MountKind::Fuse, visible),
                expected
            );
        }
    }
}
