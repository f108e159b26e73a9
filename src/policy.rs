//! Every automatic decision of a load, made from facts passed in: how each file is read, whether with direct I/O, prefetch and its method; each with a typed reason, rendered to words here.

use std::fmt;

use crate::mount::{Mount, MountKind};

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
//     cargo run --release --example prefetch_methods -- --size-mib 1024 \
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
/// `Some(true)` is `Buffered`, `Some(false)` is `Mmap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ReadMode {
    /// Decide per file from its filesystem (see the crate docs' policy table).
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

/// Where the effective mode came from, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Caller,
    Environment,
    Default,
}

/// The caller's mode if set, else the environment's, else auto.
pub(crate) fn effective_mode(caller: Option<ReadMode>, env: Option<&str>) -> (ReadMode, Origin) {
    if let Some(mode) = caller {
        return (mode, Origin::Caller);
    }
    match env.map(str::trim).map(str::to_ascii_lowercase).as_deref() {
        Some("1" | "true" | "yes" | "on") => (ReadMode::Buffered, Origin::Environment),
        Some("0" | "false" | "no" | "off") => (ReadMode::Mmap, Origin::Environment),
        _ => (ReadMode::Auto, Origin::Default),
    }
}

/// A strategy and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Choice {
    pub strategy: Strategy,
    pub reason: String,
}

/// Decides how to read one file.
pub(crate) fn choose(mode: ReadMode, origin: Origin, mount: Option<&Mount>) -> Choice {
    let strategy = match mode {
        ReadMode::Mmap => Strategy::Mmap,
        ReadMode::Buffered => Strategy::Buffered,
        ReadMode::Auto => auto_strategy(mount.map(|m| m.kind).unwrap_or(MountKind::Unknown)),
    };
    let reason = match (mode, origin) {
        (ReadMode::Auto, _) => auto_reason(mount),
        (_, Origin::Environment) => format!(
            "{DISABLE_MMAP_ENV}={} is set{}",
            if mode == ReadMode::Buffered { 1 } else { 0 },
            located(mount)
        ),
        (_, _) => format!(
            "disable_mmap({}) was requested{}",
            mode == ReadMode::Buffered,
            located(mount)
        ),
    };
    Choice { strategy, reason }
}

/// Whether buffered reads use `O_DIRECT` by default on a filesystem (for a
/// file that is not already in the page cache).
///
/// NOTE: measured with `cargo bench --bench load` (BENCHMARKS.md, 2.2 GiB,
/// medians of 3). On FUSE, page-cache reads reach the daemon as requests of
/// at most 128 KiB (the kernel caps FUSE read-ahead) while direct reads go
/// out as 1 MiB requests: at 2 ms per request, 3.04 s direct against 5.61 s
/// through the page cache; serialized, 2.24 s against 12.0 s (0.62 GiB). On
/// the local ext4 virtio disk, cold, direct reads into huge-page buffers took
/// 1.40 s against 3.33 s. Warm files are read through the page cache (the
/// caller checks residency first). Kernel network filesystems are not
/// measured here, so they keep plain reads.
pub(crate) fn default_direct_io(kind: Option<MountKind>) -> bool {
    matches!(
        kind,
        Some(MountKind::HfMount | MountKind::Fuse | MountKind::Local)
    )
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

/// Prefetch streams the auto policy uses for files on a filesystem when the
/// caller and the environment leave prefetch unset; `None` leaves it off.
/// On a kernel network filesystem, faulting a cold map in tensor by tensor
/// reads far below what a few large sequential readers get
/// (reference/004: 0.26 GiB/s against 8.5 GiB/s on Lustre, a cold 57 GB load
/// 369 s -> 144 s with 4 streams per rank), and the files are then mapped,
/// one page-cache copy per node. Prefetch itself still skips resident files
/// and checkpoints that do not fit the memory guard.
pub(crate) fn auto_prefetch_streams(kind: MountKind) -> Option<usize> {
    match kind {
        MountKind::Network => Some(4),
        _ => None,
    }
}

fn auto_strategy(kind: MountKind) -> Strategy {
    match kind {
        MountKind::HfMount | MountKind::Fuse => Strategy::Buffered,
        _ => Strategy::Mmap,
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
        MountKind::HfMount => format!("{at} — mmap page faults stall on FUSE"),
        MountKind::Fuse => format!("{at} — mmap page faults stall on FUSE"),
        MountKind::Network => format!("{at} — mapped; pages shared through the page cache"),
        MountKind::Local => format!("{at} — mapping a local file costs no copy"),
        _ => format!("{at} — filesystem unknown, mapping is the default"),
    }
}

/// `on hf-mount (fuse) at /mnt/hub`.
fn describe(mount: &Mount) -> String {
    let kind = match mount.kind {
        MountKind::HfMount => "hf-mount".to_string(),
        MountKind::Fuse => "FUSE".to_string(),
        MountKind::Network => "network filesystem".to_string(),
        MountKind::Local => "local filesystem".to_string(),
        _ => "filesystem".to_string(),
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

fn located(mount: Option<&Mount>) -> String {
    mount
        .map(|m| format!(" ({})", describe(m)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_beats_environment_beats_auto() {
        assert_eq!(
            effective_mode(Some(ReadMode::Mmap), Some("1")),
            (ReadMode::Mmap, Origin::Caller)
        );
        assert_eq!(
            effective_mode(None, Some("1")),
            (ReadMode::Buffered, Origin::Environment)
        );
        assert_eq!(
            effective_mode(None, Some(" 0 ")),
            (ReadMode::Mmap, Origin::Environment)
        );
        assert_eq!(
            effective_mode(None, Some("maybe")),
            (ReadMode::Auto, Origin::Default)
        );
        assert_eq!(
            effective_mode(None, None),
            (ReadMode::Auto, Origin::Default)
        );
    }

    #[test]
    fn disable_mmap_maps_onto_modes() {
        assert_eq!(ReadMode::from_disable_mmap(None), ReadMode::Auto);
        assert_eq!(ReadMode::from_disable_mmap(Some(true)), ReadMode::Buffered);
        assert_eq!(ReadMode::from_disable_mmap(Some(false)), ReadMode::Mmap);
    }
}
