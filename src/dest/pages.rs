//! Fresh memory for a load's destinations: faulted in before the reads land (a copy out of the page cache faults its own as it goes), in one page size for the whole load: the caller's or the environment's, else transparent huge pages where the host offers them (`enabled` is `always` or `madvise`), else base pages.
//!
//! Every byte a buffered load reads lands in memory the process never
//! touched, and the kernel must back each page before the read can fill it:
//! huge pages (2 MiB) cost far less per byte than base pages where free
//! ones are at hand. [`Loader::huge_pages`](crate::Loader::huge_pages) (or
//! `SAFELOAD_HUGE_PAGES`) overrides the rule where a host backs them badly.
//!
//! NOTE: a size measured as the load faulted its memory in, tried before,
//! did not beat this rule beyond noise (BENCHMARKS.md, "dest/pages.rs: the
//! rule").

use std::sync::atomic::{AtomicU64, Ordering};

use crate::os::{self, ProcFile};

mod choice;
pub use choice::{FreshMemory, HugePages, PageReason};

/// The host's transparent huge pages, from its settings' text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostHugePages {
    /// `enabled` is `always` or `madvise`: asking for them may get them.
    Offered,
    /// `enabled` is `never`, or there is no such setting.
    Absent,
}

impl HostHugePages {
    /// Whether anonymous memory may get huge pages, from the text of
    /// `/sys/kernel/mm/transparent_hugepage/enabled`, whose selected value
    /// is in brackets (`always [madvise] never`); `None` (no such file) is
    /// [`Absent`](Self::Absent).
    pub(crate) fn from_enabled(text: Option<&str>) -> HostHugePages {
        match text.and_then(selected) {
            Some("always" | "madvise") => HostHugePages::Offered,
            _ => HostHugePages::Absent,
        }
    }

    /// This host's, read from `/sys`.
    pub(crate) fn of_host() -> HostHugePages {
        let text = os::read_proc(ProcFile::HugePagesEnabled).ok();
        let text = text.as_deref().and_then(|t| std::str::from_utf8(t).ok());
        HostHugePages::from_enabled(text)
    }
}

/// The selected value of a kernel setting listed with it in brackets
/// (`always defer [madvise] never`).
pub(crate) fn selected(text: &str) -> Option<&str> {
    let start = text.find('[')?;
    let rest = text.get(start + 1..)?;
    let end = rest.find(']')?;
    rest.get(..end)
}

/// How a run's fresh memory is faulted in, and how much of it was: shared by
/// every thread that faults destinations in.
pub(crate) struct PageSizes {
    mode: HugePages,
    reason: PageReason,
    /// The size asked for: `Some(true)` huge pages, `Some(false)` base
    /// pages; `None` gives no advice (the host offers no huge pages, or the
    /// memory is not the load's alone).
    huge: Option<bool>,
    /// Whether destinations are faulted in and counted here at all.
    owned: bool,
    huge_bytes: AtomicU64,
    base_bytes: AtomicU64,
}

impl PageSizes {
    /// How a load faults its memory in: `mode`, set by `origin`
    /// ([`PageReason::Caller`] or [`PageReason::Environment`]; anything
    /// else for [`HugePages::Auto`]), on a host whose huge pages are `host`.
    pub(crate) fn new(mode: HugePages, origin: PageReason, host: HostHugePages) -> PageSizes {
        let (mode, reason, huge) = match (mode, host) {
            (HugePages::Auto, HostHugePages::Absent) => {
                (HugePages::Off, PageReason::Unavailable, None)
            }
            (HugePages::Auto, HostHugePages::Offered) => {
                (HugePages::Auto, PageReason::HostOffers, Some(true))
            }
            (HugePages::On, _) => (mode, origin, Some(true)),
            (HugePages::Off, _) => (mode, origin, Some(false)),
        };
        PageSizes {
            mode,
            reason,
            huge,
            owned: true,
            huge_bytes: AtomicU64::new(0),
            base_bytes: AtomicU64::new(0),
        }
    }

    /// For memory a load does not own alone (partial reads into scratch
    /// vectors, a caller's tensor): no advice, nothing faulted in here.
    pub(crate) fn unadvised() -> PageSizes {
        PageSizes {
            huge: None,
            owned: false,
            ..PageSizes::new(
                HugePages::Off,
                PageReason::Unavailable,
                HostHugePages::Absent,
            )
        }
    }

    /// Whether a reader faults its job's destination in (or leaves it to
    /// its copy) where no helper did: for the load's own memory.
    pub(crate) fn readers_fault(&self) -> bool {
        self.owned
    }

    /// A buffer of the load, whose pages are asked for in the load's size,
    /// all at once.
    ///
    /// NOTE: once per buffer, because advice given piece by piece changes
    /// the memory map while the other readers' copies fault their pages in,
    /// which slowed warm loads (BENCHMARKS.md, "dest/pages.rs:
    /// PageSizes::register").
    pub(crate) fn register(&self, buffer: &mut [u8]) {
        if let (true, Some(huge)) = (self.owned, self.huge) {
            if !buffer.is_empty() {
                os::advise_page_size(buffer, huge);
            }
        }
    }

    /// Faults `dst` in, writable: part of a buffer registered before
    /// ([`register`](Self::register)), no byte of which was written yet.
    pub(crate) fn fault_in(&self, dst: &mut [u8]) {
        if self.owned {
            os::populate_write(dst);
            self.count(dst.len());
        }
    }

    /// Leaves `dst` to the copy out of the page cache about to fill it: a
    /// copy into pages faulted in just before runs out of the cache, one
    /// that faults each page as it goes writes it while it is still there
    /// (BENCHMARKS.md, "dest/pages/copy.rs: PageSizes::prepare"). Counted.
    pub(crate) fn leave_to_copy(&self, dst: &[u8]) {
        if self.owned {
            self.count(dst.len());
        }
    }

    fn count(&self, bytes: usize) {
        let counter = match self.huge {
            Some(true) => &self.huge_bytes,
            _ => &self.base_bytes,
        };
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// What was done, for the report: `None` where nothing was faulted in
    /// through here.
    pub(crate) fn report(&self) -> Option<FreshMemory> {
        let huge_bytes = self.huge_bytes.load(Ordering::Relaxed);
        let base_bytes = self.base_bytes.load(Ordering::Relaxed);
        (self.owned && huge_bytes + base_bytes > 0).then_some(FreshMemory {
            mode: self.mode,
            reason: self.reason,
            huge_bytes,
            base_bytes,
        })
    }
}

#[cfg(test)]
mod tests;
