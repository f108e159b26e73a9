//! Why a file was read as it was, as data: the rule that chose its strategy (with the auto rule written once), what overrode it, what became of direct I/O; the words are `report/`'s.

use super::Strategy;
use crate::mount::MountKind;

/// Why a file was first mapped or read: the rule that chose its
/// [`Strategy`]. [`Fallback`] says what overrode it, if anything; `Display`
/// gives the rule in words.
///
/// ```
/// use safeload::mount::MountKind;
/// use safeload::report::Reason;
///
/// let why = Reason::Auto(MountKind::Fuse);
/// assert_eq!(why.to_string(), "mmap page faults stall on FUSE");
/// assert_eq!(Reason::Requested { disable_mmap: true }.to_string(), "disable_mmap(true) was requested");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The auto policy's rule for a file on this kind of filesystem
    /// ([`MountKind::Unknown`] where it could not be found).
    Auto(MountKind),
    /// The caller asked: `disable_mmap(..)`, or `load_state_dict`'s
    /// `Some(..)`.
    Requested {
        /// `true`: read buffered; `false`: mapped.
        disable_mmap: bool,
    },
    /// `SAFELOAD_DISABLE_MMAP` asked.
    Environment {
        /// `true` (`=1`): read buffered; `false` (`=0`): mapped.
        disable_mmap: bool,
    },
    /// A remote object (feature `remote`): read by ranged requests into
    /// memory, whatever was asked, since there is no file to map.
    Remote,
}

impl Reason {
    /// A stable name for the variant, for logs and JSON (`"auto"`,
    /// `"requested"`, `"environment"`, `"remote"`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Auto(_) => "auto",
            Reason::Requested { .. } => "requested",
            Reason::Environment { .. } => "environment",
            Reason::Remote => "remote",
        }
    }
}

/// The auto policy, one row per kind of filesystem: how a file there is
/// held and why. The one place the rule is written: [`choose`] takes the
/// strategy, `Display for Reason` the words.
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

/// What overrode the first choice of a file's strategy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// The filesystem refused the map (the OS error, in words); the file is
    /// read instead.
    MmapRefused(String),
    /// Buffered reads of all the load's files would not fit in memory
    /// (`needed`, margin included, against `available`); `kept` of its
    /// `files` buffered files are read, this one is mapped instead.
    MemoryGuard {
        /// Bytes the buffered reads would need, margin included.
        needed: u64,
        /// Bytes of memory available (the smaller of `MemAvailable` and the
        /// cgroup's room).
        available: u64,
        /// Files of the load still read buffered.
        kept: usize,
        /// Files of the load the auto policy would have read buffered.
        files: usize,
    },
}

/// Direct I/O (`O_DIRECT`: reads that bypass the page cache) for a file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DirectIo {
    /// Not used: not asked for, or not applicable (mapped, or not laid out
    /// in blocks).
    Off,
    /// Every read of the file bypassed the page cache.
    On,
    /// Asked for, refused by the file or its filesystem (the OS error, in
    /// words).
    Refused(String),
    /// Used, then given up during the reads, for this reason (the rest of
    /// the file read through the page cache).
    Dropped(String),
}
