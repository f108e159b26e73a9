//! Every automatic decision of a load, made from facts passed in: how each file is read, whether with direct I/O, prefetch and its method; each with a typed reason, rendered to words here.

use std::fmt;

use crate::mount::{Mount, MountKind};
use crate::report::human_bytes;

/// How a file's bytes are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// A read-only shared memory map of the file: pages come from the page
    /// cache on first touch, and are shared with every other process mapping
    /// the file.
    Mmap,
    /// The tensors' bytes read into one private, page-aligned allocation with
    /// large positional reads; no page faults on the file afterwards.
    Buffered,
}

impl Strategy {
    /// `"mmap"` or `"buffered"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Mmap => "mmap",
            Strategy::Buffered => "buffered",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// NOTE: which method warms fastest (`default_method`). Measured 2026-11-29
// on this project's 2-core VM (Linux 6.18; / is ext4 on a virtio disk with
// read_ahead_kb 8192; the FUSE mount is safeload-testfs with 2 ms per READ
// and read_ahead_kb 128, serving a file on that ext4), a 1 GiB file evicted
// with posix_fadvise(DONTNEED) before every run (on the mount and the source
// under it), arms interleaved with their order alternating by round, medians:
//
//     cargo bench --bench prefetch_methods -- --size-mib 1024 \
//         --rounds 3 --streams 1,4 --dir /var/tmp
//
//     | filesystem | method   | streams | median s | GiB/s | runs (s)            |
//     |------------|----------|---------|----------|-------|---------------------|
//     | local ext4 | pread    | 1       | 1.667    | 0.60  | 1.67, 1.82, 1.63    |
//     | local ext4 | willneed | 1       | 1.900    | 0.53  | 2.04, 1.90, 1.88    |
//     | local ext4 | pread    | 4       | 1.987    | 0.50  | 2.22, 1.99, 1.50    |
//     | local ext4 | willneed | 4       | 1.368    | 0.73  | 1.37, 0.56, 2.36    |
//     | FUSE 2 ms  | pread    | 1       | 12.863   | 0.08  | 11.81, 12.86, 13.58 |
//     | FUSE 2 ms  | willneed | 1       | 2.070    | 0.48  | 2.07, 1.66, 2.26    |
//     | FUSE 2 ms  | pread    | 4       | 4.548    | 0.22  | 3.32, 4.55, 5.36    |
//     | FUSE 2 ms  | willneed | 4       | 1.595    | 0.63  | 1.60, 3.22, 1.27    |
//
// Two more runs agreed: `--rounds 3 --streams 1,4` gave local 2.36/2.10 s
// (pread/willneed, 1 stream) and 1.86/1.33 s (4 streams), FUSE 12.6/1.72 s
// and 3.74/1.65 s; `--rounds 5 --streams 4` gave local 1.86/1.70 s and FUSE
// 4.28/2.00 s. The local disk is shared with other VMs and noisy (one run
// took 0.56 s, another 2.6 s): there the two methods are within noise of
// each other. On FUSE, `WILLNEED` wins by 2-3x with 4 streams and 6-7x with
// one: each call queues read-ahead requests that the kernel sends
// asynchronously (up to `max_background` in flight), where a `pread` waits
// on one read-ahead window at a time. `WILLNEED` also copies nothing into
// user space, and reads exactly the range asked (no read-ahead into a chunk
// the memory guard skips). So it is the default wherever `mincore` can show
// the pages land; elsewhere reads are the only way to know. Kernel network
// filesystems (NFS, Lustre, ...) could not be measured here; they share
// FUSE's latency-bound shape, and the fallback read covers what a
// `WILLNEED` does not bring in.

/// How a chunk is brought into the page cache.
///
/// ```
/// assert_eq!(safeload::PrefetchMethod::Pread.to_string(), "pread");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PrefetchMethod {
    /// Chosen per filesystem kind from the measurements in the source (see
    /// the `NOTE:` in `src/prefetch.rs`).
    #[default]
    Auto,
    /// Large positional reads into a reused per-reader buffer.
    Pread,
    /// `posix_fadvise(POSIX_FADV_WILLNEED)` over the chunk in read-ahead
    /// sized pieces, then waiting until the pages are resident, and reading
    /// what did not arrive. Needs residency to be visible (see
    /// [`PrefetchReport::residency_known`]); where it is not, reads instead.
    WillNeed,
}

impl PrefetchMethod {
    /// `"auto"`, `"pread"` or `"willneed"`.
    pub fn as_str(self) -> &'static str {
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

/// How the caller wants files read.
///
/// `load_state_dict(path, disable_mmap)` maps onto it: `None` is `Auto`,
/// `Some(true)` is `Buffered`, `Some(false)` is `Mmap`. `Auto` is exactly the
/// same as leaving the mode unset: `SAFELOAD_DISABLE_MMAP` is honoured, then
/// each file's filesystem decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReadMode {
    /// `SAFELOAD_DISABLE_MMAP` if set, else decide per file from its
    /// filesystem (see the crate docs' policy table).
    #[default]
    Auto,
    /// Map every file.
    Mmap,
    /// Read every file into memory.
    Buffered,
}

impl ReadMode {
    /// The mode a `disable_mmap: Option<bool>` argument asks for.
    pub fn from_disable_mmap(disable_mmap: Option<bool>) -> ReadMode {
        match disable_mmap {
            None => ReadMode::Auto,
            Some(true) => ReadMode::Buffered,
            Some(false) => ReadMode::Mmap,
        }
    }
}

/// The environment variable that overrides the auto choice: `1` reads
/// buffered, `0` maps. An explicit builder call overrides it.
pub const DISABLE_MMAP_ENV: &str = "SAFELOAD_DISABLE_MMAP";

/// The environment, read once at the top of a load (or a prefetch) so that
/// every decision of it sees the same values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Environment {
    vars: Vec<(&'static str, String)>,
}

/// Every variable a decision reads: the read mode, prefetch, the launchers'
/// local ranks and job ids.
const VARIABLES: &[&str] = &[
    DISABLE_MMAP_ENV,
    crate::prefetch::PREFETCH_ENV,
    crate::prefetch::HF_SHARD_PREFETCH_ENV,
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
    pub(crate) fn from_process() -> Environment {
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
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The lookup closure the launcher detection takes.
    pub(crate) fn lookup(&self) -> impl Fn(&str) -> Option<String> + '_ {
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

/// The caller's mode if it is `Mmap` or `Buffered`, else the environment's,
/// else auto.
pub(crate) fn effective_mode(caller: ReadMode, env: &Environment) -> (ReadMode, Origin) {
    if caller != ReadMode::Auto {
        return (caller, Origin::Caller);
    }
    let value = env
        .get(DISABLE_MMAP_ENV)
        .map(|v| v.trim().to_ascii_lowercase());
    match value.as_deref() {
        Some("1" | "true" | "yes" | "on") => (ReadMode::Buffered, Origin::Environment),
        Some("0" | "false" | "no" | "off") => (ReadMode::Mmap, Origin::Environment),
        _ => (ReadMode::Auto, Origin::Default),
    }
}

/// How one file is read, and why: the rule that chose, what changed the
/// choice afterwards, and whether direct I/O was used. Rendered to words
/// by its `Display`, once, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileDecision {
    pub strategy: Strategy,
    origin: Origin,
    mode: ReadMode,
    mount: Option<Mount>,
    fallback: Option<Fallback>,
    direct: Direct,
}

/// What overrode the first choice of a file's strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// The filesystem refused the map; the file is read instead.
    MmapRefused(String),
    /// Buffered reads would not fit in memory; the file is mapped instead.
    MemoryGuard { needed: u64, available: u64 },
}

/// Direct I/O for a buffered file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Direct {
    /// Not asked for, or not applicable (mapped, or not laid out in blocks).
    Off,
    /// Reads bypass the page cache.
    On,
    /// Asked for, refused by the file or its filesystem.
    Refused(String),
}

impl FileDecision {
    /// Whether the memory guard may map this file instead of reading it:
    /// only where the auto policy chose to read it.
    pub(crate) fn switchable(&self) -> bool {
        self.mode == ReadMode::Auto
            && self.strategy == Strategy::Buffered
            && self.fallback.is_none()
    }

    /// The map was refused: read the file instead.
    pub(crate) fn mmap_refused(&mut self, error: &std::io::Error) {
        self.strategy = Strategy::Buffered;
        self.fallback = Some(Fallback::MmapRefused(error.to_string()));
    }

    /// The memory guard maps the file instead of reading it.
    pub(crate) fn memory_guard(&mut self, needed: u64, available: u64) {
        self.strategy = Strategy::Mmap;
        self.fallback = Some(Fallback::MemoryGuard { needed, available });
        self.direct = Direct::Off;
    }

    /// Whether direct I/O was used, or why not.
    pub(crate) fn set_direct(&mut self, direct: Direct) {
        self.direct = direct;
    }

    /// Whether reads of this file bypass the page cache.
    pub(crate) fn direct_io(&self) -> bool {
        self.direct == Direct::On
    }
}

impl fmt::Display for FileDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.fallback {
            Some(Fallback::MmapRefused(e)) => write!(f, "mmap failed ({e}), read instead; ")?,
            Some(Fallback::MemoryGuard { needed, available }) => write!(
                f,
                "buffered reads would need {} but {} of memory is available, mapped instead; ",
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

/// Decides how to read one file, from the effective mode and its mount.
pub(crate) fn choose(mode: ReadMode, origin: Origin, mount: Option<&Mount>) -> FileDecision {
    let strategy = match mode {
        ReadMode::Mmap => Strategy::Mmap,
        ReadMode::Buffered => Strategy::Buffered,
        ReadMode::Auto => match mount.map_or(MountKind::Unknown, |m| m.kind) {
            MountKind::HfMount | MountKind::Fuse => Strategy::Buffered,
            _ => Strategy::Mmap,
        },
    };
    FileDecision {
        strategy,
        origin,
        mode,
        mount: mount.cloned(),
        fallback: None,
        direct: Direct::Off,
    }
}

/// Whether a buffered file's reads bypass the page cache: the caller's
/// choice, else the filesystem's default for a file that is not already
/// mostly in the page cache (`mostly_cached` is asked only then). Direct
/// reads need a buffer laid out in whole blocks (`image`).
///
/// NOTE: measured with `cargo bench --bench load` (BENCHMARKS.md, 2.2 GiB,
/// medians of 3). On FUSE, page-cache reads reach the daemon as requests of
/// at most 128 KiB (the kernel caps FUSE read-ahead) while direct reads go
/// out as 1 MiB requests: at 2 ms per request, 3.04 s direct against 5.61 s
/// through the page cache; serialized, 2.24 s against 12.0 s (0.62 GiB). On
/// the local ext4 virtio disk, cold, direct reads into huge-page buffers took
/// 1.40 s against 3.33 s. Warm files are read through the page cache (the
/// residency check). Kernel network filesystems are not measured here, so
/// they keep plain reads.
pub(crate) fn wants_direct_io(
    caller: Option<bool>,
    kind: Option<MountKind>,
    image: bool,
    mostly_cached: impl FnOnce() -> bool,
) -> bool {
    let by_default = || {
        matches!(
            kind,
            Some(MountKind::HfMount | MountKind::Fuse | MountKind::Local)
        ) && !mostly_cached()
    };
    image && caller.unwrap_or_else(by_default)
}

/// Reads in flight by default, for the filesystems a load touches: FUSE
/// needs many requests in flight to hide each one's latency (within the
/// kernel's default of 12 background requests per mount); elsewhere 8.
///
/// NOTE: on the local virtio disk, 2.2 GiB buffered, 3 interleaved runs
/// (2026-11-29): 8 readers of 8 MiB took 1.08-1.65 s cold and 0.95-1.22 s
/// warm, 4 readers 1.47-1.68 s and 1.37-2.08 s; 16 MiB chunks were within
/// the noise of 8 MiB.
pub(crate) fn default_io_concurrency(kinds: impl Iterator<Item = MountKind>) -> usize {
    kinds
        .map(|kind| match kind {
            MountKind::HfMount | MountKind::Fuse => 12,
            _ => 8,
        })
        .max()
        .unwrap_or(8)
}

/// What the memory guard does with the buffered files of a load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoryVerdict {
    /// Per file: map it instead of reading it.
    pub map_instead: Vec<bool>,
    /// Bytes the buffered files need, all of them.
    pub needed: u64,
}

/// The memory guard, first half: when the buffered files (`needed` bytes
/// each, `switchable` where the auto policy chose to read them) do not fit
/// in `available`, the switchable ones are mapped instead.
pub(crate) fn memory_guard(files: &[(u64, bool)], available: Option<u64>) -> MemoryVerdict {
    let needed: u64 = files.iter().map(|&(n, _)| n).sum();
    let over = available.is_some_and(|a| needed > a);
    MemoryVerdict {
        map_instead: files.iter().map(|&(n, s)| over && s && n > 0).collect(),
        needed,
    }
}

/// The memory guard, second half: what is still to be read after the
/// switch must fit, else the load fails with the numbers
/// (`Err((still_needed, available))`) rather than meet the OOM killer.
pub(crate) fn memory_fits(still_needed: u64, available: Option<u64>) -> Result<(), (u64, u64)> {
    match available {
        Some(a) if still_needed > a => Err((still_needed, a)),
        _ => Ok(()),
    }
}

/// How prefetch was asked for, strongest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PrefetchAsk {
    /// `Loader::prefetch(n)` / `prefetch_with`.
    Caller(usize),
    /// `SAFELOAD_PREFETCH=n` (else `HF_SHARD_PREFETCH=n`): the streams and
    /// the setting in words.
    Environment(usize, String),
    /// Neither: the auto policy decides.
    Unset,
}

impl PrefetchAsk {
    /// The reason a requested prefetch runs, in words; `None` for `Unset`.
    pub(crate) fn reason(&self) -> Option<String> {
        match self {
            PrefetchAsk::Caller(streams) => Some(format!("prefetch({streams}) was requested")),
            PrefetchAsk::Environment(_, setting) => Some(format!("{setting} is set")),
            PrefetchAsk::Unset => None,
        }
    }
}

/// The caller's prefetch streams if set, else the environment's
/// (`SAFELOAD_PREFETCH`, then `HF_SHARD_PREFETCH`; a value that is not a
/// number is ignored), else unset.
pub(crate) fn prefetch_ask(caller: Option<usize>, env: &Environment) -> PrefetchAsk {
    if let Some(streams) = caller {
        return PrefetchAsk::Caller(streams);
    }
    [
        crate::prefetch::PREFETCH_ENV,
        crate::prefetch::HF_SHARD_PREFETCH_ENV,
    ]
    .into_iter()
    .find_map(|name| {
        let streams = env.get(name)?.trim().parse::<usize>().ok()?;
        Some(PrefetchAsk::Environment(
            streams,
            format!("{name}={streams}"),
        ))
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
pub(crate) fn auto_prefetch_streams(kind: MountKind) -> Option<usize> {
    match kind {
        MountKind::Network => Some(4),
        _ => None,
    }
}

/// Why the auto policy, having picked files to prefetch, does not run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AutoPrefetchSkip {
    /// Every byte is already in the page cache.
    Resident,
    /// The memory guard would leave part of the checkpoint cold.
    DoesNotFit,
}

/// The auto policy's last word: prefetch runs unless everything is known to
/// be resident, or the guard would leave some of it cold (a partial warm of
/// a checkpoint that will be mapped whole only evicts itself).
pub(crate) fn auto_prefetch_runs(
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
pub(crate) fn prefetch_method(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::MountTable;

    /// A mount of `kind` as a lookup would give it, from a one-line table.
    fn mount(line: &str) -> Mount {
        let table = MountTable::parse(line);
        let entry = table.entries().first().cloned();
        let entry = entry.unwrap_or_else(|| panic!("unparsable fixture {line}"));
        Mount {
            source: entry.source().to_string(),
            mount_point: entry.mount_point().to_path_buf(),
            fs_type: entry.fs_type().to_string(),
            kind: entry.kind(),
            detected_by: crate::mount::Detection::Device,
        }
    }

    const HF: &str = "hf-mount /mnt/hub fuse rw,user_id=0,group_id=0 0 0\n";
    const NFS_LOOPBACK: &str = "127.0.0.1:/ /mnt/hub nfs4 rw,addr=127.0.0.1 0 0\n";
    const S3FS: &str = "s3fs /mnt/s3 fuse.s3fs rw 0 0\n";
    const NFS: &str = "server:/export /mnt/nfs nfs4 rw,addr=10.0.0.5 0 0\n";
    const EXT4: &str = "/dev/vda / ext4 rw 0 0\n";
    const AUTOFS: &str = "systemd-1 /net autofs rw 0 0\n";

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
    fn disable_mmap_maps_onto_modes() {
        assert_eq!(ReadMode::from_disable_mmap(None), ReadMode::Auto);
        assert_eq!(ReadMode::from_disable_mmap(Some(true)), ReadMode::Buffered);
        assert_eq!(ReadMode::from_disable_mmap(Some(false)), ReadMode::Mmap);
    }

    #[test]
    fn auto_strategy_and_reason_per_filesystem() {
        let table = [
            (
                HF,
                Strategy::Buffered,
                "on hf-mount (fuse) at /mnt/hub — mmap page faults stall on FUSE",
            ),
            (
                NFS_LOOPBACK,
                Strategy::Buffered,
                "on hf-mount (nfs4) at /mnt/hub — served by a userspace server on loopback",
            ),
            (
                S3FS,
                Strategy::Buffered,
                "on FUSE (fuse.s3fs) at /mnt/s3 — mmap page faults stall on FUSE",
            ),
            (
                NFS,
                Strategy::Mmap,
                "on network filesystem (nfs4) at /mnt/nfs — mapped; pages shared",
            ),
            (
                EXT4,
                Strategy::Mmap,
                "on local filesystem (ext4) at / — mapping a local file costs no copy",
            ),
            (
                AUTOFS,
                Strategy::Mmap,
                "on filesystem (autofs) at /net — filesystem unknown, mapping is the default",
            ),
        ];
        for (line, strategy, words) in table {
            let m = mount(line);
            let d = choose(ReadMode::Auto, Origin::Default, Some(&m));
            assert_eq!(d.strategy, strategy, "{line}");
            assert!(d.to_string().starts_with(words), "{line}: {d}");
            assert_eq!(d.switchable(), strategy == Strategy::Buffered);
        }
        let d = choose(ReadMode::Auto, Origin::Default, None);
        assert_eq!(d.strategy, Strategy::Mmap);
        assert_eq!(d.to_string(), "filesystem unknown — mapping is the default");
    }

    #[test]
    fn explicit_modes_say_who_asked() {
        let m = mount(HF);
        let d = choose(ReadMode::Mmap, Origin::Caller, Some(&m));
        assert_eq!(d.strategy, Strategy::Mmap);
        assert_eq!(
            d.to_string(),
            "disable_mmap(false) was requested (on hf-mount (fuse) at /mnt/hub)"
        );
        assert!(!d.switchable());
        let d = choose(ReadMode::Buffered, Origin::Environment, None);
        assert_eq!(d.strategy, Strategy::Buffered);
        assert_eq!(d.to_string(), "SAFELOAD_DISABLE_MMAP=1 is set");
        assert!(
            !d.switchable(),
            "the guard never overrides an explicit mode"
        );
    }

    #[test]
    fn fallbacks_and_direct_io_are_part_of_the_reason() {
        let m = mount(EXT4);
        let mut d = choose(ReadMode::Auto, Origin::Default, Some(&m));
        d.mmap_refused(&std::io::Error::from_raw_os_error(19));
        assert_eq!(d.strategy, Strategy::Buffered);
        assert!(d.to_string().starts_with("mmap failed ("), "{d}");
        assert!(
            d.to_string().ends_with(
                "; on local filesystem (ext4) at / — mapping a local file costs no copy"
            ),
            "{d}"
        );
        assert!(!d.switchable(), "a refused map is not tried again");
        d.set_direct(Direct::Refused("Invalid argument".into()));
        assert!(
            d.to_string()
                .ends_with("; O_DIRECT refused (Invalid argument)"),
            "{d}"
        );
        assert!(!d.direct_io());

        let mut d = choose(ReadMode::Auto, Origin::Default, Some(&mount(HF)));
        d.set_direct(Direct::On);
        assert!(d.direct_io());
        d.memory_guard(3 << 30, 1 << 30);
        assert_eq!(d.strategy, Strategy::Mmap);
        assert!(!d.direct_io());
        assert!(
            d.to_string().starts_with("buffered reads would need 3.00 GiB but 1.00 GiB of memory is available, mapped instead; on hf-mount"),
            "{d}"
        );
    }

    #[test]
    fn direct_io_by_filesystem_and_residency() {
        use MountKind::*;
        let table = [
            // caller, kind, image, mostly cached -> direct
            (None, Some(HfMount), true, false, true),
            (None, Some(Fuse), true, false, true),
            (None, Some(Local), true, false, true),
            (None, Some(Local), true, true, false),
            (None, Some(Network), true, false, false),
            (None, None, true, false, false),
            (None, Some(Local), false, false, false),
            (Some(true), Some(Network), true, true, true),
            (Some(true), Some(Local), false, false, false),
            (Some(false), Some(HfMount), true, false, false),
        ];
        for (caller, kind, image, cached, expected) in table {
            assert_eq!(
                wants_direct_io(caller, kind, image, || cached),
                expected,
                "{caller:?} {kind:?} image={image} cached={cached}"
            );
        }
    }

    #[test]
    fn io_concurrency_by_filesystem() {
        use MountKind::*;
        assert_eq!(default_io_concurrency([Local, Network].into_iter()), 8);
        assert_eq!(default_io_concurrency([Local, Fuse].into_iter()), 12);
        assert_eq!(default_io_concurrency([HfMount].into_iter()), 12);
        assert_eq!(default_io_concurrency(std::iter::empty()), 8);
    }

    #[test]
    fn memory_guard_maps_switchable_files_only_when_over() {
        let files = [(100, true), (50, false), (0, true)];
        assert_eq!(
            memory_guard(&files, Some(200)),
            MemoryVerdict {
                map_instead: vec![false, false, false],
                needed: 150
            }
        );
        assert_eq!(
            memory_guard(&files, Some(120)),
            MemoryVerdict {
                map_instead: vec![true, false, false],
                needed: 150
            }
        );
        assert_eq!(memory_guard(&files, None).map_instead, vec![false; 3]);
        assert_eq!(memory_fits(50, Some(120)), Ok(()));
        assert_eq!(memory_fits(150, Some(120)), Err((150, 120)));
        assert_eq!(memory_fits(u64::MAX, None), Ok(()));
    }

    #[test]
    fn prefetch_asked_by_caller_then_environment() {
        let env = Environment::from_pairs(&[
            (crate::prefetch::PREFETCH_ENV, "3"),
            (crate::prefetch::HF_SHARD_PREFETCH_ENV, "5"),
        ]);
        assert_eq!(prefetch_ask(Some(2), &env), PrefetchAsk::Caller(2));
        assert_eq!(
            prefetch_ask(None, &env),
            PrefetchAsk::Environment(3, "SAFELOAD_PREFETCH=3".into())
        );
        let hf = Environment::from_pairs(&[
            (crate::prefetch::PREFETCH_ENV, "lots"),
            (crate::prefetch::HF_SHARD_PREFETCH_ENV, " 5 "),
        ]);
        assert_eq!(
            prefetch_ask(None, &hf),
            PrefetchAsk::Environment(5, "HF_SHARD_PREFETCH=5".into())
        );
        assert_eq!(
            prefetch_ask(None, &Environment::default()),
            PrefetchAsk::Unset
        );
        assert_eq!(
            PrefetchAsk::Caller(4).reason().unwrap(),
            "prefetch(4) was requested"
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
