//! The plan of a load: a pure function of the opened files' facts, the options and the memory figure, deciding per file which tensors are read, where their bytes land (the file's map, or a buffer in a layout), which are converted, with direct I/O or not, and what the memory guard allows.
//!
//! Nothing here does I/O: facts that cost a system call (the page cache's
//! residency of a file, the memory available) are closures asked only when a
//! rule needs them, so that every rule is tested by tables.

pub(crate) mod cluster;
#[cfg(test)]
mod tests;

use safetensors::Dtype;

use crate::format::header::Header;
use crate::mount::MountKind;
use crate::policy::{self, DirectIo, FileDecision};
use crate::storage::BufferLayout;

/// What the plan needs to know of one opened file.
pub(crate) struct FileFacts<'a> {
    pub header: &'a Header,
    /// The policy's decision when it was opened.
    pub decision: &'a FileDecision,
    /// Whether it is mapped already.
    pub mapped: bool,
    /// The kind of filesystem it is on, where known.
    pub kind: Option<MountKind>,
    /// Whether most of it is in the page cache (asked only where direct I/O
    /// is considered).
    pub mostly_cached: &'a dyn Fn() -> bool,
}

/// The caller's options the plan follows.
pub(crate) struct PlanOptions<'a> {
    /// The tensors to load (all where `None`).
    pub keep: Option<&'a (dyn Fn(&str) -> bool + Sync)>,
    /// Convert floating tensors to this dtype while loading.
    pub dtype: Option<Dtype>,
    /// Direct I/O for buffered reads: forced on or off, or the policy's.
    pub direct_io: Option<bool>,
}

/// Where a file's selected bytes land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Views of the file's read-only map (mapped at open, or mapped now
    /// because the memory guard says so).
    Map,
    /// An owned, aligned buffer of this layout, filled by positional reads,
    /// with `O_DIRECT` where `direct`.
    Buffer { layout: BufferLayout, direct: bool },
}

/// The tensors of a file converted while loading, into one buffer of their
/// own: per tensor of the header, its offset in that buffer where converted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConvertPlan {
    pub to: Dtype,
    pub placements: Vec<Option<u64>>,
    /// The buffer's length.
    pub len: u64,
}

/// The plan for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FilePlan {
    /// Per tensor of the header: whether the load hands it out.
    pub selected: Vec<bool>,
    pub placement: Placement,
    pub convert: Option<ConvertPlan>,
    /// The decision with what the plan changed in it (memory guard, direct
    /// I/O), rendered in the report.
    pub decision: FileDecision,
}

impl FilePlan {
    /// Whether any of its bytes is read (not only viewed in a map).
    pub(crate) fn reads(&self) -> bool {
        matches!(self.placement, Placement::Buffer { .. }) || self.convert.is_some()
    }
}

/// A load that cannot fit: the bytes it needs (margin included) and the
/// bytes available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DoesNotFit {
    pub needed: u64,
    pub available: u64,
}

/// Plans a load of `files`. `available` is asked (once) only where a file is
/// to be read into memory. Buffered files that the auto policy chose and that
/// do not fit are mapped instead; where what must be read does not fit
/// anyway, the load fails with the numbers.
pub(crate) fn plan(
    files: &[FileFacts<'_>],
    opts: &PlanOptions<'_>,
    available: impl FnOnce() -> Option<u64>,
) -> Result<Vec<FilePlan>, DoesNotFit> {
    let mut plans: Vec<FilePlan> = files.iter().map(|f| plan_file(f, opts)).collect();
    let pending = |p: &FilePlan| match &p.placement {
        Placement::Buffer { layout, .. } => layout.len,
        Placement::Map => 0,
    };
    let converted = |p: &FilePlan| p.convert.as_ref().map_or(0, |c| c.len);
    if !plans.iter().any(|p| pending(p) > 0 || converted(p) > 0) {
        return Ok(plans);
    }
    let Some(available) = available() else {
        return Ok(plans);
    };
    // Converted tensors need memory whatever the file's strategy: they count
    // as files that cannot be mapped instead.
    let wanted: Vec<(u64, bool)> = plans
        .iter()
        .map(|p| (pending(p), p.decision.switchable()))
        .chain(plans.iter().map(|p| (converted(p), false)))
        .collect();
    let verdict = policy::memory_guard(&wanted, Some(available));
    for (p, &map) in plans.iter_mut().zip(&verdict.map_instead) {
        if map {
            p.placement = Placement::Map;
            p.decision.memory_guard(&verdict, available);
        }
    }
    let still: Vec<u64> = plans
        .iter()
        .map(pending)
        .chain(plans.iter().map(converted))
        .filter(|&n| n > 0)
        .collect();
    policy::memory_fits(still.len(), still.iter().sum(), Some(available))
        .map_err(|(needed, available)| DoesNotFit { needed, available })?;
    Ok(plans)
}

/// One file's plan before the memory guard.
fn plan_file(file: &FileFacts<'_>, opts: &PlanOptions<'_>) -> FilePlan {
    let header = file.header;
    let selected: Vec<bool> = header
        .tensors
        .iter()
        .map(|t| opts.keep.is_none_or(|keep| keep(&t.name)))
        .collect();
    // The selected tensors a converting load converts go to a buffer of
    // their own; the file's map or buffer holds the rest.
    let mut in_body = selected.clone();
    let convert = opts.dtype.and_then(|to| {
        let mut placements = Vec::with_capacity(in_body.len());
        let mut len = 0u64;
        for (t, keep) in header.tensors.iter().zip(in_body.iter_mut()) {
            let converted_len = policy::converts_to(t.dtype, to)
                .filter(|_| *keep)
                .and_then(|size| t.num_elements()?.checked_mul(size));
            match converted_len {
                Some(bytes) => {
                    *keep = false;
                    len = len.next_multiple_of(8);
                    placements.push(Some(len));
                    len += bytes as u64;
                }
                None => placements.push(None),
            }
        }
        placements
            .iter()
            .any(Option::is_some)
            .then_some(ConvertPlan {
                to,
                placements,
                len,
            })
    });
    let mut decision = file.decision.clone();
    let placement = if file.mapped {
        Placement::Map
    } else {
        let layout = BufferLayout::for_file(header, &in_body);
        // Direct reads skip the page cache: a win for a file that is not
        // there, a loss for one that is (it would be read from storage
        // again: a prefetch just warmed it, or an earlier load did).
        let direct = policy::wants_direct_io(opts.direct_io, file.kind, layout.image, || {
            (file.mostly_cached)()
        });
        if direct {
            decision.set_direct(DirectIo::On);
        }
        Placement::Buffer { layout, direct }
    };
    FilePlan {
        selected,
        placement,
        convert,
        decision,
    }
}
