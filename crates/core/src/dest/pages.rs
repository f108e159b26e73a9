//! Fresh memory for a load's destinations: faulted in before the reads land, in the page size the host serves best (transparent huge pages or base pages), as the caller, the environment or the host's settings say, else as measured while the load faults its memory in.
//!
//! NOTE: huge pages cost a quarter of base pages where free ones are at
//! hand, many times more where the kernel compacts memory or the host backs
//! each again, and which is cheaper changes within a load while the settings
//! look the same: so each piece faulted in is timed on the thread's CPU
//! clock, and the cheaper size kept, the other probed now and then
//! (BENCHMARKS.md, "dest/pages.rs: the module").

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::os::{self, ProcFile};

mod choice;
mod copy;
pub use choice::{FreshMemory, HugePages, PageReason};
pub(crate) use copy::Fill;
#[cfg(test)]
use copy::Prepared;

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

/// A page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Size {
    Base,
    Huge,
}

impl Size {
    fn other(self) -> Size {
        match self {
            Size::Base => Size::Huge,
            Size::Huge => Size::Base,
        }
    }
}

/// One huge page on x86-64 and arm64 with 4 KiB base pages: the alignment
/// a huge page needs.
const HUGE: usize = 2 << 20;

/// A probe of the size not in use: two huge pages, each measured.
const PROBE: usize = 2 * HUGE;

/// Pieces faulted in with the size in use between two probes of the other
/// one, at first; doubled after each probe, up to [`MAX_GAP`].
///
/// NOTE: one probe of the losing size costs little, but probes add up over
/// a load, as do the pieces a lucky probe switches to: the gap grows
/// whatever the probe found, and a change of the host's mode is still seen
/// within a few hundred MiB at first (BENCHMARKS.md, "dest/pages.rs:
/// FIRST_GAP"). The size in use is measured on every piece.
const FIRST_GAP: u32 = 8;
/// See [`FIRST_GAP`].
const MAX_GAP: u32 = 256;

/// How a run's fresh memory is faulted in, and what was measured: shared
/// by every thread that faults destinations in.
pub(crate) struct PageSizes {
    mode: HugePages,
    reason: PageReason,
    /// Whether the sizes are advised at all (not for memory the load does
    /// not own alone, such as a reader's scratch vector).
    advise: bool,
    state: Mutex<State>,
    /// The load's buffers, each with the size its pages are asked for from
    /// an address on ([`register`](Self::register)).
    buffers: Mutex<Vec<Advised>>,
}

/// A buffer of the load, and the advice on it: `size` from `from` to its
/// end.
#[derive(Debug, Clone, Copy)]
struct Advised {
    start: usize,
    end: usize,
    from: usize,
    size: Size,
}

#[derive(Debug, Default)]
struct State {
    base: Measured,
    huge: Measured,
    /// Pieces since the size not in use was last tried, and the gap before
    /// the next try.
    since_probe: u32,
    gap: u32,
    /// A destination of the size not in use is being copied into, its copy
    /// to be timed (`PageSizes::prepare`): no other probe until it is.
    probing: bool,
    /// Bytes faulted in for reads of a local disk with `O_DIRECT`, whose
    /// base pages are weighed [`DISK_WEIGHT`] times (`PageSizes::fault_in`).
    disk_bytes: u64,
}

/// What one page size was given and cost.
#[derive(Debug, Default, Clone, Copy)]
struct Measured {
    /// Nanoseconds of CPU per byte of the last [`SAMPLES`] pieces faulted
    /// in with this size, the newest first.
    samples: [Option<f64>; SAMPLES],
    bytes: u64,
}

/// How many times its measured cost base pages are taken to cost for a
/// direct read of a local disk: huge pages unless they cost more than this
/// many times as much to fault in.
///
/// NOTE: base pages cut a direct read into small requests (the device's
/// most segments times 4 KiB), which costs more than their fault alone; the
/// weight lies between that and what huge pages cost once the host must back
/// them again (BENCHMARKS.md, "dest/pages.rs: DISK_WEIGHT").
const DISK_WEIGHT: f64 = 4.0;

/// The measures of each size its cost is taken from.
///
/// NOTE: one measure alone misleads (a probe far above the others once kept
/// a load on the costlier size): the median of three moves on no outlier
/// and leaves a size that got costlier within two pieces (BENCHMARKS.md,
/// "dest/pages.rs: SAMPLES").
const SAMPLES: usize = 3;

impl Measured {
    /// The cost per byte this size is taken to have, if measured.
    fn cost(&self) -> Option<f64> {
        let mut known: Vec<f64> = self.samples.iter().flatten().copied().collect();
        known.sort_by(f64::total_cmp);
        match known.as_slice() {
            [_, middle, _] => Some(*middle),
            [low, ..] => Some(*low),
            [] => None,
        }
    }

    fn add(&mut self, per_byte: f64) {
        self.samples.rotate_right(1);
        if let Some(newest) = self.samples.first_mut() {
            *newest = Some(per_byte);
        }
    }
}

impl State {
    fn of(&mut self, size: Size) -> &mut Measured {
        match size {
            Size::Base => &mut self.base,
            Size::Huge => &mut self.huge,
        }
    }

    /// The size in use: the one measured cheaper (huge where tied, and
    /// first, until base pages were measured too), base pages' cost
    /// weighed [`DISK_WEIGHT`] times for a direct read of a local disk.
    fn in_use(&self, disk: bool) -> Size {
        let weight = if disk { DISK_WEIGHT } else { 1.0 };
        match (self.base.cost(), self.huge.cost()) {
            (Some(base), Some(huge)) if base * weight < huge => Size::Base,
            (Some(_), None) => Size::Base,
            _ => Size::Huge,
        }
    }

    /// Counts a measure of `size`: `bytes` faulted in with `cpu` of CPU
    /// time (`None` where the clock could not be read).
    fn record(&mut self, size: Size, bytes: usize, cpu: Option<Duration>) {
        let measured = self.of(size);
        measured.bytes += bytes as u64;
        if let Some(cpu) = cpu.filter(|_| bytes > 0) {
            measured.add(cpu.as_nanos() as f64 / bytes as f64);
        }
    }

    /// Counts a probe of `size`, a measure per huge page: they replace what
    /// was measured of it before the gap.
    fn record_probe(&mut self, size: Size, pages: &[(usize, Option<Duration>)]) {
        self.of(size).samples = [None; SAMPLES];
        for &(bytes, cpu) in pages {
            self.record(size, bytes, cpu);
        }
    }
}

/// How one destination is cut for faulting in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PieceSize {
    size: Size,
    /// The probe's offset in the destination (aligned to a huge page in
    /// memory), where one is due and fits.
    probe: Option<usize>,
}

impl PageSizes {
    /// How a load faults its memory in: `mode`, set by `origin`
    /// ([`PageReason::Caller`] or [`PageReason::Environment`]; anything
    /// else for [`HugePages::Auto`]), on a host whose huge pages are `host`.
    pub(crate) fn new(mode: HugePages, origin: PageReason, host: HostHugePages) -> PageSizes {
        let (mode, reason) = match (mode, host) {
            (HugePages::Auto, HostHugePages::Absent) => (HugePages::Off, PageReason::Unavailable),
            (HugePages::Auto, HostHugePages::Offered) => (HugePages::Auto, PageReason::Measured),
            (mode, _) => (mode, origin),
        };
        PageSizes {
            mode,
            reason,
            advise: true,
            state: Mutex::new(State {
                gap: FIRST_GAP,
                ..State::default()
            }),
            buffers: Mutex::new(Vec::new()),
        }
    }

    /// For memory a load does not own alone (partial reads into scratch
    /// vectors): faulted in ahead where that pays, with no advice.
    pub(crate) fn unadvised() -> PageSizes {
        PageSizes {
            advise: false,
            ..PageSizes::new(HugePages::Auto, PageReason::Measured, HostHugePages::Absent)
        }
    }

    /// The size for the next destination of `len` bytes at `addr`, and a
    /// probe of the other size where one is due.
    fn cut(&self, addr: usize, len: usize, disk: bool) -> PieceSize {
        if self.mode != HugePages::Auto {
            let size = self.size_in_use();
            return PieceSize { size, probe: None };
        }
        let mut state = self.state();
        let size = state.in_use(disk);
        let never_measured = state.of(size.other()).cost().is_none();
        state.since_probe += 1;
        if state.probing || (!never_measured && state.since_probe < state.gap) {
            return PieceSize { size, probe: None };
        }
        // Two huge pages of the destination, from its first huge page
        // boundary.
        let start = addr.next_multiple_of(HUGE);
        let probe = start
            .checked_add(PROBE)
            .filter(|&end| end <= addr.saturating_add(len))
            .map(|_| start - addr);
        if probe.is_some() {
            state.since_probe = 0;
            if !never_measured {
                state.gap = (state.gap * 2).min(MAX_GAP);
            }
        }
        PieceSize { size, probe }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, size: Size, bytes: usize, cpu: Option<Duration>) {
        self.state().record(size, bytes, cpu);
    }

    /// Faults fresh `dst` in, writable, in the size in use (and a probe of
    /// the other where one is due), timing each part; `disk`: for a direct
    /// read of a local disk ([`DISK_WEIGHT`]).
    pub(super) fn fault_in(&self, dst: &mut [u8], disk: bool) {
        if disk && self.mode == HugePages::Auto {
            self.state().disk_bytes += dst.len() as u64;
        }
        let PieceSize { size, probe } = self.cut(dst.as_ptr() as usize, dst.len(), disk);
        let part = |piece: &mut [u8], size: Size| {
            if piece.is_empty() {
                return;
            }
            let cpu = self.fault(piece, size);
            if self.advise {
                self.record(size, piece.len(), cpu);
            }
        };
        match probe {
            Some(at) => {
                let (head, rest) = dst.split_at_mut(at.min(dst.len()));
                let (probed, tail) = rest.split_at_mut(PROBE.min(rest.len()));
                self.probe(probed, size.other());
                part(head, size);
                part(tail, size);
            }
            None => part(dst, size),
        }
    }

    /// Faults `piece` in with `size` advised: the CPU time it took.
    fn fault(&self, piece: &mut [u8], size: Size) -> Option<Duration> {
        self.advise_part(piece, size);
        timed_populate(piece)
    }

    /// Faults in `probed` page by page, each with `size` advised on it
    /// alone, and records what each cost.
    fn probe(&self, probed: &mut [u8], size: Size) {
        let measures: Vec<(usize, Option<Duration>)> = probed
            .chunks_mut(HUGE)
            .map(|page| {
                if self.advise && self.reason != PageReason::Unavailable {
                    os::advise_page_size(page, size == Size::Huge);
                }
                (page.len(), timed_populate(page))
            })
            .collect();
        if self.advise {
            self.state().record_probe(size, &measures);
        }
    }

    /// A buffer of the load, its pages asked for in the size in use now.
    ///
    /// NOTE: once per buffer, because advice given piece by piece changes the
    /// memory map while the other readers' copies fault their pages in, which
    /// slowed warm loads (BENCHMARKS.md, "dest/pages.rs: PageSizes::register").
    pub(crate) fn register(&self, buffer: &mut [u8]) {
        if !self.advise || buffer.is_empty() {
            return;
        }
        let size = self.size_in_use();
        if self.reason != PageReason::Unavailable {
            os::advise_page_size(buffer, size == Size::Huge);
        }
        let start = buffer.as_ptr() as usize;
        let mut buffers = self.buffers.lock().unwrap_or_else(PoisonError::into_inner);
        buffers.push(Advised {
            start,
            end: start + buffer.len(),
            from: start,
            size,
        });
    }

    /// The size the mode says, or in use as measured (no disk weight).
    fn size_in_use(&self) -> Size {
        match self.mode {
            HugePages::On => Size::Huge,
            HugePages::Off => Size::Base,
            HugePages::Auto => self.state().in_use(false),
        }
    }

    /// Asks for `size` for `part`, and its buffer's rest, unless asked so.
    fn advise_part(&self, part: &mut [u8], size: Size) {
        if !self.advise || self.reason == PageReason::Unavailable || part.is_empty() {
            return;
        }
        let at = part.as_ptr() as usize;
        let mut buffers = self.buffers.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(buffer) = buffers.iter_mut().find(|b| (b.start..b.end).contains(&at)) else {
            drop(buffers);
            os::advise_page_size(part, size == Size::Huge);
            return;
        };
        if buffer.size == size && at >= buffer.from {
            return;
        }
        let rest = buffer.end - at;
        *buffer = Advised {
            from: at,
            size,
            ..*buffer
        };
        drop(buffers);
        // The rest of a buffer the load registered and owns, alive while
        // its destinations are faulted in (other readers hold parts of it:
        // the advice changes no byte, only the size of pages faulted later).
        os::advise_page_size_of_range(at, rest, size == Size::Huge);
    }

    /// What was done, for the report; `None` where nothing was faulted in.
    pub(crate) fn report(&self) -> Option<FreshMemory> {
        if !self.advise {
            return None;
        }
        let state = self.state();
        let (base_bytes, huge_bytes) = (state.base.bytes, state.huge.bytes);
        if base_bytes + huge_bytes == 0 {
            return None;
        }
        // Nanoseconds per byte to GiB per second.
        let rate = |cost: Option<f64>| {
            cost.filter(|c| *c > 0.0)
                .map(|c| 1e9 / c / (1u64 << 30) as f64)
        };
        // Every byte for direct reads of a local disk: their size was set.
        let reason = match self.reason {
            PageReason::Measured if state.disk_bytes == base_bytes + huge_bytes => {
                PageReason::DiskReads
            }
            reason => reason,
        };
        Some(FreshMemory {
            mode: self.mode,
            reason,
            huge_bytes,
            base_bytes,
            huge_gib_s: rate(state.huge.cost()),
            base_gib_s: rate(state.base.cost()),
        })
    }
}

/// Faults `piece` in, writable: the CPU time it took this thread.
fn timed_populate(piece: &mut [u8]) -> Option<Duration> {
    let before = os::thread_cpu_time();
    os::populate_write(piece);
    before.and_then(|b| Some(os::thread_cpu_time()?.saturating_sub(b)))
}

#[cfg(test)]
mod tests;
