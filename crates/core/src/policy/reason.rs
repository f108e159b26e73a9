//! Why a file was read as it was, as data: the rule that chose its strategy (with the auto rule written once), what overrode it, what became of direct I/O; the words are `report/`'s.

use super::Strategy;
use crate::mount::MountKind;

worded! {
/// Why a file was first mapped or read: the rule that chose its [`Strategy`].
///
/// ```
/// use safeload::mount::MountKind;
/// use safeload::report::Reason;
///
/// let why = Reason::Auto { kind: MountKind::Fuse };
/// assert_eq!(why.to_string(), "mmap page faults stall on FUSE");
/// assert_eq!(Reason::Requested { disable_mmap: true }.to_string(), "disable_mmap(true) was requested");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The auto policy's rule for a file on this kind of filesystem.
    Auto {
        /// The filesystem's kind.
        kind: MountKind,
    } = "auto",
    /// The caller asked: `disable_mmap(..)`, or `load_state_dict`'s `Some(..)`.
    Requested {
        /// `true`: read buffered; `false`: mapped.
        disable_mmap: bool,
    } = "requested",
    /// `SAFELOAD_DISABLE_MMAP` asked.
    Environment {
        /// `true` (`=1`): read buffered; `false` (`=0`): mapped.
        disable_mmap: bool,
    } = "environment",
    /// A remote object: read into memory whatever was asked (no file to map).
    Remote = "remote",
}
}

/// The auto policy, one row per kind of filesystem: how a file there is held and why.
pub(crate) fn auto_rule(kind: MountKind) -> (Strategy, &'static str) {
    match kind {
        MountKind::HfMount => (
            Strategy::Buffered,
            "a userspace daemon serves it, where mmap page faults stall",
        ),
        MountKind::Fuse => (Strategy::Buffered, "mmap page faults stall on FUSE"),
        MountKind::Network => (
            Strategy::Mmap,
            "mapped; pages shared through the page cache",
        ),
        MountKind::Local => (Strategy::Mmap, "mapping a local file costs no copy"),
        _ => (Strategy::Mmap, "filesystem unknown, mapping is the default"),
    }
}

worded! {
/// What overrode the first choice of a file's strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// The filesystem refused the map; the file is read instead.
    MmapRefused {
        /// The OS error, in words.
        error: String,
    } = "mmap_refused",
    /// Buffered reads of all the load's files would not fit in memory: this one is mapped.
    MemoryGuard {
        /// Bytes the buffered reads would need, margin included.
        needed: u64,
        /// Bytes of memory available (`MemAvailable` and the cgroup's room).
        available: u64,
        /// Files of the load still read buffered.
        kept: usize,
        /// Files of the load the auto policy would have read buffered.
        files: usize,
    } = "memory_guard",
}
}

worded! {
/// Direct I/O (`O_DIRECT`: reads that bypass the page cache) for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirectIo {
    /// Not used: not asked for, or not applicable.
    Off = "off",
    /// Every read of the file bypassed the page cache.
    On = "on",
    /// Asked for, refused by the file or its filesystem.
    Refused {
        /// The OS error, in words.
        error: String,
    } = "refused",
    /// Used, then given up during the reads (the rest read through the page cache).
    Dropped {
        /// Why.
        why: String,
    } = "dropped",
}
}
