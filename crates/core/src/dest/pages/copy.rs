//! A copy out of the page cache into fresh memory: the page size it faults its destination in with, chosen and measured by the copy itself.

use std::sync::PoisonError;
use std::time::Duration;

use super::{HUGE, HugePages, PROBE, PageReason, PageSizes, PieceSize, Size};
use crate::os;

/// How a reader's destination gets its pages before its job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Faulted in now, timed ([`PageSizes::fault_in`]); `disk`: for a read
    /// of a local disk with `O_DIRECT`.
    Now { disk: bool },
    /// Left to the copy out of the page cache to fault in, its page size
    /// asked for ([`PageSizes::prepare`]); `timed`: the copy is a read whose
    /// time measures that size (not a conversion).
    ByCopy { timed: bool },
}

/// A destination a reader began to fill, given back to
/// [`PageSizes::filled`] when its job ends.
#[derive(Debug)]
#[must_use = "give it back to `PageSizes::filled`, or no probe is made again"]
pub(crate) struct Filling {
    copy: Option<(Prepared, Option<Duration>)>,
}

/// A destination prepared for a copy out of the page cache, to be given back
/// with the copy's time ([`PageSizes::copied`]).
#[derive(Debug)]
#[must_use = "give it back to `PageSizes::copied`, or no probe is made again"]
pub(crate) struct Prepared {
    pub(super) size: Size,
    pub(super) probe: bool,
    pub(super) bytes: usize,
}

impl PageSizes {
    /// Begins filling `dst`, a fresh destination about to be read into, as
    /// `how` says: the read loop's one door to the page-size choice.
    pub(crate) fn fill(&self, dst: &mut [u8], how: Fill) -> Filling {
        let copy = match how {
            Fill::Now { disk } => {
                self.fault_in(dst, disk);
                None
            }
            Fill::ByCopy { timed } if self.advise => {
                let before = timed.then(os::thread_cpu_time).flatten();
                Some((self.prepare(dst, timed), before))
            }
            Fill::ByCopy { .. } => None,
        };
        Filling { copy }
    }

    /// Ends a fill begun by [`fill`](Self::fill): a copy that succeeded
    /// (`ok`) is a measure of its page size.
    pub(crate) fn filled(&self, filling: Filling, ok: bool) {
        if let Some((prepared, before)) = filling.copy {
            let cpu = before
                .filter(|_| ok)
                .and_then(|b| Some(os::thread_cpu_time()?.saturating_sub(b)));
            self.copied(prepared, cpu);
        }
    }

    /// Asks for a page size for `dst`, which a copy out of the page cache
    /// is about to fault in (a copy into pages faulted in just before runs
    /// out of the cache): the one in use, or the other where a probe is due;
    /// the copy is then timed ([`copied`](Self::copied)). An untimed copy
    /// (a conversion) gets the size in use.
    ///
    /// NOTE: the copy's own faults are what a size costs here, not a
    /// populate's: a copy takes a fault per base page (an exception each), a
    /// populate faults them in a loop in the kernel, and sizes chosen by
    /// populates slowed the copies (BENCHMARKS.md, "dest/pages/copy.rs:
    /// PageSizes::prepare").
    pub(super) fn prepare(&self, dst: &mut [u8], timed: bool) -> Prepared {
        let prepared = if timed {
            self.choose(dst.as_ptr() as usize, dst.len())
        } else {
            self.untimed(dst.len())
        };
        let size = prepared.size;
        if prepared.probe {
            // The whole huge pages of `dst` alone: its neighbours, in
            // other readers' hands, keep the size in use.
            if self.advise && self.reason != PageReason::Unavailable {
                let at = dst.as_ptr() as usize;
                let first = at.next_multiple_of(HUGE);
                let end = at.saturating_add(dst.len()) / HUGE * HUGE;
                if first < end {
                    os::advise_page_size_of_range(first, end - first, size == Size::Huge);
                }
            }
        } else {
            self.advise_part(dst, size);
        }
        prepared
    }

    /// The size for a destination of `len` bytes at `addr` that a copy will
    /// fault in: the one in use, or the other where a probe is due and no
    /// other probe is being copied into.
    pub(super) fn choose(&self, addr: usize, len: usize) -> Prepared {
        // `cut` probes under `HugePages::Auto` only.
        let PieceSize { size, probe } = self.cut(addr, len, false);
        let probe = probe.is_some();
        if probe {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.probing = true;
        }
        Prepared {
            size: if probe { size.other() } else { size },
            probe,
            bytes: len,
        }
    }

    /// The size in use for a destination of `len` bytes whose copy is not
    /// timed.
    pub(super) fn untimed(&self, len: usize) -> Prepared {
        Prepared {
            size: self.size_in_use(),
            probe: false,
            bytes: len,
        }
    }

    /// Counts the copy into a destination [`prepare`](Self::prepare)d for
    /// it, which took `cpu` of this thread's CPU time (`None` where it was
    /// not timed: a conversion, a failed read): a measure of the size its
    /// pages were asked for, replacing the older ones where it was a probe.
    pub(super) fn copied(&self, prepared: Prepared, cpu: Option<Duration>) {
        if !self.advise {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Prepared { size, probe, bytes } = prepared;
        // A destination too small to say what its size costs counts only
        // its bytes.
        let cpu = cpu.filter(|_| bytes >= PROBE && self.mode == HugePages::Auto);
        if probe {
            state.probing = false;
            if cpu.is_some() {
                state.record_probe(size, &[(bytes, cpu)]);
                return;
            }
        }
        state.record(size, bytes, cpu);
    }
}
