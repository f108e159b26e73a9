//! What a load's fresh memory was asked for and got, as data with its words: the mode a caller sets (`HugePages`), why the sizes were what they were (`PageReason`), and what was faulted in (`FreshMemory`).

use std::fmt;

/// Whether the memory a buffered load reads into is backed by transparent
/// huge pages ([`Loader::huge_pages`](crate::Loader::huge_pages),
/// `SAFELOAD_HUGE_PAGES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum HugePages {
    /// `SAFELOAD_HUGE_PAGES` if set, else huge pages where the host offers
    /// them (transparent huge pages `enabled` is `always` or `madvise`),
    /// else base pages.
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
#[non_exhaustive]
pub enum PageReason {
    /// The caller chose ([`Loader::huge_pages`](crate::Loader::huge_pages)).
    Caller,
    /// `SAFELOAD_HUGE_PAGES` chose.
    Environment,
    /// The host offers no transparent huge pages (`enabled` is `never`, or
    /// there are none on this platform): base pages.
    Unavailable,
    /// The host offers transparent huge pages (`enabled` is `always` or
    /// `madvise`): asked for.
    HostOffers,
}

impl PageReason {
    /// A stable name: `caller`, `environment`, `unavailable`,
    /// `host_offers`.
    pub fn as_str(self) -> &'static str {
        match self {
            PageReason::Caller => "caller",
            PageReason::Environment => "environment",
            PageReason::Unavailable => "unavailable",
            PageReason::HostOffers => "host_offers",
        }
    }
}

impl fmt::Display for PageReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PageReason::Caller => "as set",
            PageReason::Environment => "as SAFELOAD_HUGE_PAGES says",
            PageReason::Unavailable => "the host offers no transparent huge pages",
            PageReason::HostOffers => "the host offers transparent huge pages",
        })
    }
}

/// How a load's fresh memory was faulted in: in which page sizes, and why.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct FreshMemory {
    /// The mode in force.
    pub mode: HugePages,
    /// Why the sizes were what they were.
    pub reason: PageReason,
    /// Bytes faulted in with huge pages asked for (the kernel may have
    /// given base pages for some).
    pub huge_bytes: u64,
    /// Bytes faulted in as base pages.
    pub base_bytes: u64,
}

impl fmt::Display for FreshMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        write!(
            f,
            "fresh memory: {:.2} GiB as huge pages, {:.2} GiB as base pages ({})",
            gib(self.huge_bytes),
            gib(self.base_bytes),
            self.reason
        )
    }
}
