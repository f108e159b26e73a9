//! Whether the page cache is warmed before a load, with how many streams and which method: the caller, the environment, then the auto rule.

use std::fmt;

use super::Environment;
use crate::mount::MountKind;

/// The environment variable that turns prefetch on with this many streams
/// per rank (`0` turns it off, also where the auto policy would turn it on).
/// `Loader::prefetch` overrides it.
pub const PREFETCH_ENV: &str = "SAFELOAD_PREFETCH";

/// Read as [`PREFETCH_ENV`] when that is unset, for jobs that already set it
/// for `transformers`.
pub const HF_SHARD_PREFETCH_ENV: &str = "HF_SHARD_PREFETCH";

// NOTE: which method warms fastest (`prefetch_method`): on FUSE `WILLNEED`
// wins by several times (the kernel sends its read-ahead asynchronously,
// where a `pread` waits on one window at a time), on a local disk the two are
// within noise, and `WILLNEED` copies nothing into user space; so it is the
// default wherever `mincore` can show the pages land (BENCHMARKS.md,
// "policy/prefetch.rs: PrefetchMethod").

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
    /// `WillNeed` where the pages can be seen landing (`mincore`), else
    /// `Pread`: the same on every filesystem kind measured (the `NOTE:` in
    /// `src/policy/prefetch.rs`).
    #[default]
    Auto,
    /// Large positional reads into a reused per-reader buffer.
    Pread,
    /// `posix_fadvise(POSIX_FADV_WILLNEED)` over the chunk in read-ahead
    /// sized pieces, then waiting until the pages are resident, and reading
    /// what did not arrive. Needs residency to be visible (see
    /// [`PrefetchReport::residency_known`](crate::report::PrefetchReport::residency_known)); where it is not, reads instead.
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
    /// `SAFELOAD_PREFETCH=n` (else `HF_SHARD_PREFETCH=n`): the streams and
    /// the variable that set them.
    Environment(usize, &'static str),
    /// Neither: the auto policy decides.
    Unset,
}

/// Whether a requested prefetch warms a file the load reads buffered: only
/// where several local ranks share the reads (each then copies from the page
/// cache what the others warmed). A rank alone reads such a file with its own
/// streaming reads, in flight as many as measured throughput says, and takes
/// what is already in the page cache from there.
///
/// NOTE: on FUSE a rank alone that warmed its files and then loaded from the
/// page cache was far slower than its load alone with direct reads: FUSE
/// page-cache reads reach the daemon as 128 KiB requests, direct ones as
/// 1 MiB (BENCHMARKS.md, "policy/prefetch.rs: prefetch_warms_buffered").
pub fn prefetch_warms_buffered(local_size: usize) -> bool {
    local_size > 1
}

/// The caller's prefetch streams if set, else the environment's
/// (`SAFELOAD_PREFETCH`, then `HF_SHARD_PREFETCH`; a value that is not a
/// number is ignored), else unset.
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

/// Prefetch streams the auto policy uses for a file that will be mapped
/// (the caller checks that), from its filesystem, when the caller and the environment leave prefetch
/// unset; `None` leaves it off. On a kernel network filesystem, faulting a
/// cold map in tensor by tensor reads far below what a few large sequential
/// readers get (reference/004: 0.26 GiB/s against 8.5 GiB/s on Lustre, a
/// cold 57 GB load 369 s -> 144 s with 4 streams per rank), and the files
/// are then mapped, one page-cache copy per node. Prefetch itself still
/// skips resident files and checkpoints that do not fit the memory guard
/// ([`auto_prefetch_runs`]).
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

/// The auto policy's last word: prefetch runs unless everything is known to
/// be resident, or the guard would leave some of it cold (a partial warm of
/// a checkpoint that will be mapped whole only evicts itself).
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

/// The prefetch method for a file: the caller's, else the measured winner
/// for its filesystem (the `NOTE:` on [`PrefetchMethod`]: `WillNeed`
/// everywhere measured). `WillNeed` needs to see pages land (`mincore`,
/// `pages_visible`); where it cannot, chunks are read.
pub fn prefetch_method(
    requested: PrefetchMethod,
    kind: MountKind,
    pages_visible: bool,
) -> PrefetchMethod {
    let method = match requested {
        PrefetchMethod::Auto => {
            let _ = kind; // the same winner on every kind measured
            PrefetchMethod::WillNeed
        }
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
