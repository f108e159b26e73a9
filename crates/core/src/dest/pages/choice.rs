//! What a load's fresh memory was asked for and got, as data with its words: the mode a caller sets (`HugePages`), why the sizes were what they were (`PageReason`), and what was faulted in (`FreshMemory`).

use std::fmt;

/// Whether the memory a buffered load reads into is backed by transparent
/// huge pages (`Loader::huge_pages`,
/// `SAFELOAD_HUGE_PAGES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
#[non_exhaustive]
pub enum HugePages {
    /// `SAFELOAD_HUGE_PAGES` if set, else measured while the load faults
    /// its memory in: the page size that costs less per byte.
    #[default]
    Auto,
    /// Always ask for huge pages (`MADV_HUGEPAGE`): the kernel may still
    /// fall back to base pages, and with `defrag` set to stall, may stall
    /// to compact memory for them.
    On,
    /// Never (`MADV_NOHUGEPAGE`): base pages only.
    Off,
}

impl HugePages {
    /// `"auto"`, `"on"` or `"off"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HugePages::Auto => "auto",
            HugePages::On => "on",
            HugePages::Off => "off",
        }
    }
}

/// Why a load's fresh memory had the page size it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
#[non_exhaustive]
pub enum PageReason {
    /// The caller chose (`Loader::huge_pages`).
    Caller,
    /// `SAFELOAD_HUGE_PAGES` chose.
    Environment,
    /// The host offers no transparent huge pages (`enabled` is `never`, or
    /// there are none on this platform): base pages, nothing measured.
    Unavailable,
    /// Measured: each size's cost per byte as the load faulted its memory
    /// in, the cheaper one used.
    Measured,
    /// Every byte was read from a local disk with `O_DIRECT`: measured, with
    /// base pages' cost weighed four times, since huge pages' contiguous
    /// memory lets the disk take requests several times larger.
    DiskReads,
}

impl PageReason {
    /// A stable name: `caller`, `environment`, `unavailable`, `measured`,
    /// `disk_reads`.
    pub fn as_str(self) -> &'static str {
        match self {
            PageReason::Caller => "caller",
            PageReason::Environment => "environment",
            PageReason::Unavailable => "unavailable",
            PageReason::Measured => "measured",
            PageReason::DiskReads => "disk_reads",
        }
    }
}

impl fmt::Display for PageReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageReason::Caller => "as set",
            PageReason::Environment => "as SAFELOAD_HUGE_PAGES says",
            PageReason::Unavailable => "the host offers no transparent huge pages",
            PageReason::Measured => "the cheaper size as measured",
            PageReason::DiskReads => {
                "as measured, base pages weighed 4x: direct reads of a local disk take larger requests into huge pages"
            }
        })
    }
}

/// How a load's fresh memory was faulted in: in which page sizes, why, and
/// what each cost where it was measured.
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct FreshMemory {
    /// The mode in force ([`HugePages::Auto`] where measured).
    pub mode: HugePages,
    /// Why the sizes were what they were.
    pub reason: PageReason,
    /// Bytes faulted in with huge pages asked for (the kernel may have
    /// given base pages for some).
    pub huge_bytes: u64,
    /// Bytes faulted in as base pages.
    pub base_bytes: u64,
    /// GiB faulted in per second of a faulting thread's CPU time, with huge
    /// pages asked for (where a copy out of the page cache faulted them in,
    /// GiB copied per second of the copying thread's: what the size cost
    /// the copy): the last measure, `None` where none was taken.
    pub huge_gib_s: Option<f64>,
    /// The same for base pages.
    pub base_gib_s: Option<f64>,
}

impl fmt::Display for FreshMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "fresh memory: {:.2} GiB as huge pages, {:.2} GiB as base pages ({}",
            gib(self.huge_bytes),
            gib(self.base_bytes),
            self.reason
        )?;
        if let (Some(huge), Some(base)) = (self.huge_gib_s, self.base_gib_s) {
            write!(
                f,
                ": huge {huge:.2} GiB/s, base {base:.2} GiB/s per faulting thread"
            )?;
        }
        f.write_str(")")
    }
}
