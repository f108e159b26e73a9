//! Every automatic decision of a load, made from facts passed in: how each file is read, whether with direct I/O, prefetch and its method, whether files are hashed; each with a typed reason (rendered to words once, in `report.rs`).
//!
//! Nothing here does I/O: the facts (mount, residency, memory) are passed in, so every rule
//! is tested by tables.

use std::fmt;

use crate::dest::pages::{HugePages, PageReason};

mod file;
mod guard;
mod prefetch;
mod reads;
mod reason;

pub use file::AutoPolicy;
#[doc(hidden)]
// for the plug-in crates: a conversion into an engine's tensors converts as a load
pub use file::converts_to;
pub(crate) use file::*;
pub use guard::memory_fits;
pub(crate) use guard::memory_guard;
pub use prefetch::AutoPrefetchSkip;
pub use prefetch::PrefetchAsk;
pub use prefetch::auto_prefetch_runs;
pub use prefetch::auto_prefetch_streams;
pub use prefetch::prefetch_ask;
pub use prefetch::prefetch_method;
pub use prefetch::prefetch_warms_buffered;
pub use prefetch::{HF_SHARD_PREFETCH_ENV, PREFETCH_ENV, PrefetchMethod};
pub(crate) use reads::io_defaults;
pub(crate) use reason::auto_rule;
pub use reason::{DirectIo, Fallback, Reason};

/// How a file's bytes are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum Strategy {
    /// A read-only shared memory map of the file: pages come from the page cache on first
    /// touch, shared with every other process mapping the file.
    ///
    /// # The mapped contract
    ///
    /// A mapped tensor's bytes are the file's own pages
    /// ([`Tensor::as_bytes`](crate::Tensor::as_bytes)): a file rewritten *in place* changes
    /// them under the reference, and one truncated raises `SIGBUS` on a page past its end, the
    /// hazard `memmap2` marks `unsafe`. Loading stays safe to call because checkpoints are
    /// published by rename (which leaves a mapped file intact), every file's length is checked
    /// against its header, and `Loader::populate` faults maps in at load time, where a failed
    /// page is an error. Where files may change in place, use [`Buffered`](Self::Buffered).
    Mmap,
    /// The tensors' bytes read into one private, page-aligned allocation.
    Buffered,
}

/// `mmap` or `buffered`, as in JSON.
impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Mmap => "mmap",
            Strategy::Buffered => "buffered",
        })
    }
}

/// How the caller wants files read: `disable_mmap` `None` is `Auto`, `Some(true)` `Buffered`,
/// `Some(false)` `Mmap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReadMode {
    /// `SAFELOAD_DISABLE_MMAP` if set, else decide per file from its filesystem.
    #[default]
    Auto,
    /// Map every file ([`Strategy::Mmap`], whose contract applies).
    Mmap,
    /// Read every file into memory.
    Buffered,
}

impl ReadMode {
    /// The mode a `disable_mmap: Option<bool>` argument asks for.
    pub(crate) fn from_disable_mmap(disable_mmap: Option<bool>) -> ReadMode {
        match disable_mmap {
            None => ReadMode::Auto,
            Some(true) => ReadMode::Buffered,
            Some(false) => ReadMode::Mmap,
        }
    }
}

/// The environment variable that overrides the auto choice: `1` reads buffered, `0` maps.
pub const DISABLE_MMAP_ENV: &str = "SAFELOAD_DISABLE_MMAP";

/// The job's identity, set by hand (before any launcher's job id): it keys the local ranks'
/// shared queue and node copy, so ranks of one job must see the same value.
pub(crate) const JOB_ID_ENV: &str = "SAFELOAD_JOB_ID";

/// The environment, read once per load so that every decision sees the same values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: Vec<(&'static str, String)>,
}

/// Every variable a decision reads (public for the benchmarks, which clear them).
pub const VARIABLES: &[&str] = &[
    DISABLE_MMAP_ENV,
    PREFETCH_ENV,
    HF_SHARD_PREFETCH_ENV,
    VERIFY_ENV,
    HUGE_PAGES_ENV,
    NODE_COPY_ENV,
    "SAFELOAD_EXCHANGE",
    "SAFELOAD_NODE_ID",
    "SAFELOAD_EXCHANGE_TIMEOUT_SECS",
    JOB_ID_ENV,
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "OMPI_MCA_ess_base_jobid",
];

impl Environment {
    /// This process's values of the variables decisions read.
    pub fn from_process() -> Environment {
        Environment {
            vars: VARIABLES
                .iter()
                .filter_map(|&name| std::env::var(name).ok().map(|v| (name, v)))
                .collect(),
        }
    }

    /// An environment of these pairs only (tests).
    #[cfg(test)]
    pub(crate) fn from_pairs(pairs: &[(&'static str, &str)]) -> Environment {
        Environment {
            vars: pairs.iter().map(|&(k, v)| (k, v.to_string())).collect(),
        }
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The lookup closure the launcher detection takes.
    pub fn lookup(&self) -> impl Fn(&str) -> Option<String> + '_ {
        |name| self.get(name).map(str::to_owned)
    }
}

/// Where the effective mode came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `disable_mmap(..)` / `read_mode(..)` with `Mmap` or `Buffered`.
    Caller,
    /// `SAFELOAD_DISABLE_MMAP`.
    Environment,
    /// Neither: each file's filesystem decides.
    Default,
}

/// The environment variable that turns integrity checks on (`1`) or off (`0`) where the caller
/// leaves `Loader::verify` unset.
pub const VERIFY_ENV: &str = "SAFELOAD_VERIFY";

/// Whether a load hashes its files: the caller's choice, else `SAFELOAD_VERIFY`, else only where
/// a digest is expected (hashing reads every byte of a mapped file).
pub(crate) fn verify(caller: Option<bool>, env: &Environment, expected: bool) -> bool {
    caller.unwrap_or_else(|| env.get(VERIFY_ENV).and_then(switch).unwrap_or(expected))
}

/// The value of an on/off variable (`1`, `true`, `yes`, `on`; `0`, `false`, `no`, `off`, any
/// case); anything else is `None`.
pub fn switch(value: &str) -> Option<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// A test seam for the node copy's benchmark and tests: `0` turns the node copy off, so each
/// local rank reads its files alone. Not part of the documented API.
pub const NODE_COPY_ENV: &str = "SAFELOAD_NODE_COPY";

/// Whether the local ranks of a job may share a node copy: on unless `SAFELOAD_NODE_COPY` is off.
pub fn node_copy(env: &Environment) -> bool {
    env.get(NODE_COPY_ENV).and_then(switch) != Some(false)
}

/// The environment variable that asks for transparent huge pages (`1`) or base pages (`0`) for
/// buffered loads' memory where the caller leaves `Loader::huge_pages` at [`HugePages::Auto`].
pub const HUGE_PAGES_ENV: &str = "SAFELOAD_HUGE_PAGES";

/// The page size of a load's fresh memory, and who chose it: the caller, else
/// `SAFELOAD_HUGE_PAGES`, else measured.
pub fn huge_pages(caller: HugePages, env: &Environment) -> (HugePages, PageReason) {
    if caller != HugePages::Auto {
        return (caller, PageReason::Caller);
    }
    match env.get(HUGE_PAGES_ENV).and_then(switch) {
        Some(true) => (HugePages::On, PageReason::Environment),
        Some(false) => (HugePages::Off, PageReason::Environment),
        None => (HugePages::Auto, PageReason::Measured),
    }
}

/// The caller's mode if it is `Mmap` or `Buffered`, else the environment's, else auto.
pub(crate) fn effective_mode(caller: ReadMode, env: &Environment) -> (ReadMode, Origin) {
    if caller != ReadMode::Auto {
        return (caller, Origin::Caller);
    }
    match env.get(DISABLE_MMAP_ENV).and_then(switch) {
        Some(true) => (ReadMode::Buffered, Origin::Environment),
        Some(false) => (ReadMode::Mmap, Origin::Environment),
        None => (ReadMode::Auto, Origin::Default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_on_off_or_neither() {
        for (text, value) in [
            ("1", Some(true)),
            (" ON ", Some(true)),
            ("true", Some(true)),
            ("Yes", Some(true)),
            ("0", Some(false)),
            ("off", Some(false)),
            ("NO", Some(false)),
            ("false", Some(false)),
            ("auto", None),
            ("2", None),
            ("", None),
        ] {
            assert_eq!(switch(text), value, "{text:?}");
        }
    }

    #[test]
    fn caller_beats_environment_beats_auto() {
        let env1 = Environment::from_pairs(&[(DISABLE_MMAP_ENV, "1")]);
        let env0 = Environment::from_pairs(&[(DISABLE_MMAP_ENV, " 0 ")]);
        let junk = Environment::from_pairs(&[(DISABLE_MMAP_ENV, "maybe")]);
        let none = Environment::default();
        let table = [
            (ReadMode::Mmap, &env1, (ReadMode::Mmap, Origin::Caller)),
            (
                ReadMode::Buffered,
                &env0,
                (ReadMode::Buffered, Origin::Caller),
            ),
            // Auto is the same as unset: the environment is honoured.
            (
                ReadMode::Auto,
                &env1,
                (ReadMode::Buffered, Origin::Environment),
            ),
            (ReadMode::Auto, &env0, (ReadMode::Mmap, Origin::Environment)),
            (ReadMode::Auto, &junk, (ReadMode::Auto, Origin::Default)),
            (ReadMode::Auto, &none, (ReadMode::Auto, Origin::Default)),
        ];
        for (caller, env, expected) in table {
            assert_eq!(effective_mode(caller, env), expected, "{caller:?} {env:?}");
        }
    }

    #[test]
    fn verify_by_caller_then_environment_then_expected_digests() {
        let on = Environment::from_pairs(&[(VERIFY_ENV, "1")]);
        let off = Environment::from_pairs(&[(VERIFY_ENV, " off ")]);
        let none = Environment::default();
        let table = [
            (Some(false), &on, true, false),
            (Some(true), &off, false, true),
            (None, &on, false, true),
            (None, &off, true, false),
            (None, &none, true, true),
            (None, &none, false, false),
        ];
        for (caller, env, expected, verdict) in table {
            assert_eq!(
                verify(caller, env, expected),
                verdict,
                "{caller:?} {env:?} {expected}"
            );
        }
    }

    #[test]
    fn node_copy_on_unless_the_seam_turns_it_off() {
        let table = [
            (None, true),
            (Some("0"), false),
            (Some(" off "), false),
            (Some("False"), false),
            (Some("no"), false),
            (Some("1"), true),
            (Some("maybe"), true),
            (Some(""), true),
        ];
        for (value, on) in table {
            let env = match value {
                Some(v) => Environment::from_pairs(&[(NODE_COPY_ENV, v)]),
                None => Environment::default(),
            };
            assert_eq!(node_copy(&env), on, "{value:?}");
        }
    }

    #[test]
    fn huge_pages_by_caller_then_environment_then_measured() {
        use HugePages::{Auto, Off, On};
        use PageReason::{Caller, Environment as Env, Measured};
        let env = |v: &str| Environment::from_pairs(&[(HUGE_PAGES_ENV, v)]);
        let none = Environment::default();
        let table = [
            (On, env("0"), (On, Caller)),
            (Off, env("on"), (Off, Caller)),
            (Auto, env(" 1 "), (On, Env)),
            (Auto, env("OFF"), (Off, Env)),
            (Auto, env("false"), (Off, Env)),
            (Auto, env("auto"), (Auto, Measured)),
            (Auto, env("huge"), (Auto, Measured)),
            (Auto, none, (Auto, Measured)),
        ];
        for (caller, env, expected) in table {
            assert_eq!(huge_pages(caller, &env), expected, "{caller:?} {env:?}");
        }
    }

    #[test]
    fn disable_mmap_maps_onto_modes() {
        assert_eq!(ReadMode::from_disable_mmap(None), ReadMode::Auto);
        assert_eq!(ReadMode::from_disable_mmap(Some(true)), ReadMode::Buffered);
        assert_eq!(ReadMode::from_disable_mmap(Some(false)), ReadMode::Mmap);
    }
}
