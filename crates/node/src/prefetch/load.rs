//! The loader's side of prefetch: the files the loader already opened handed over, and the policy's answer (the caller, then the environment, then the auto rule) carried out.

use super::residency::{Target, target_from};
use super::run::{Plan, run};
use crate::error::Operation;
use crate::error::{Error, Result};
use crate::extras::LocalRank;
use crate::extras::PrefetchOptions;
use crate::extras::{Job, WarmFile as LoadFile};
use crate::mount::MountKind;
use crate::policy::{self, AutoPrefetchSkip, PrefetchAsk, PrefetchMethod};
use crate::report::SkipReason;
use crate::report::{PrefetchReason, PrefetchReport};
use crate::trace;

/// A file handed over as a target of the chunk plan: its descriptor again,
/// with its mount.
fn target(f: &LoadFile<'_>) -> Result<Target> {
    let file = f
        .file
        .try_clone()
        .map_err(|e| Error::io(Operation::Open, f.path, None, e))?;
    target_from(f.path.to_path_buf(), f.canonical, file, f.mount.cloned())
}

/// Prefetches the files a load has opened, when asked to (builder, then
/// environment) or when the auto policy says so; `None` when prefetch was
/// not considered, or was turned off (`0` streams).
pub(crate) fn before_load(
    files: &[LoadFile<'_>],
    caller: Option<&PrefetchOptions>,
    job: &Job<'_>,
) -> Result<Option<PrefetchReport>> {
    let ask = policy::prefetch_ask(caller.map(|o| o.stream_count()), job.env);
    let options = match (&ask, caller) {
        (PrefetchAsk::Unset, _) => return auto(files, job),
        (PrefetchAsk::Caller(_), Some(options)) => options.clone(),
        (PrefetchAsk::Caller(streams) | PrefetchAsk::Environment(streams, _), _) => {
            PrefetchOptions::new().streams(*streams)
        }
    };
    if options.stream_count() == 0 {
        trace::traced! {
            if files
                .iter()
                .any(|f| f.mapped && f.mount.is_some_and(|m| m.kind == MountKind::Network))
            {
                tracing::warn!(
                    target: "safeload",
                    "prefetch is off, and files on a network filesystem are mapped: if they are \
                     not in the page cache, page faults read them far below streaming speed"
                );
            }
        }
        return Ok(None);
    }
    let reason = match ask {
        PrefetchAsk::Environment(streams, variable) => {
            PrefetchReason::FromEnvironment { variable, streams }
        }
        _ => PrefetchReason::Requested {
            streams: options.stream_count(),
        },
    };
    // One rank alone reads its buffered files itself (see the policy).
    let rank = LocalRank::from_setting(job.local_rank, job.env);
    let (warmed, left): (Vec<&LoadFile<'_>>, Vec<&LoadFile<'_>>) = files
        .iter()
        .partition(|f| f.mapped || policy::prefetch_warms_buffered(rank.size));
    let left_reason = (!left.is_empty()).then(|| SkipReason::ReadByThisRank {
        bytes: left.iter().map(|f| f.len).sum(),
        files: left.len(),
    });
    let targets = warmed
        .iter()
        .map(|f| target(f))
        .collect::<Result<Vec<_>>>()?;
    let mut report = if targets.is_empty() {
        Plan::new(targets, &options, job).report(
            options.stream_count(),
            options.warm_method(),
            reason,
        )
    } else {
        run(Plan::new(targets, &options, job), &options, job, reason)?
    };
    report.skip_reasons.extend(left_reason);
    trace::traced! {
        tracing::info!(target: "safeload", report = %report, "prefetch");
    }
    Ok(Some(report))
}

/// Warms these files with `options`, for `reason`: a prefetch the caller or
/// the environment asked for, or `Loader::warm`.
pub(crate) fn warm(
    files: &[LoadFile<'_>],
    options: &PrefetchOptions,
    job: &Job<'_>,
    reason: PrefetchReason,
) -> Result<PrefetchReport> {
    let targets = files.iter().map(target).collect::<Result<Vec<_>>>()?;
    run(Plan::new(targets, options, job), options, job, reason)
}

/// The auto policy: mapped files on a kernel network filesystem, prefetched
/// when not resident and the memory guard allows all of them.
fn auto(files: &[LoadFile<'_>], job: &Job<'_>) -> Result<Option<PrefetchReport>> {
    let mut streams = 0;
    let mut targets = Vec::new();
    for f in files {
        let kind = f.mount.map_or(MountKind::Unknown, |m| m.kind);
        if let (true, Some(n)) = (f.mapped, policy::auto_prefetch_streams(kind)) {
            streams = streams.max(n);
            targets.push(target(f)?);
        }
    }
    // Only files on a network filesystem are picked: each has its mount.
    let Some(mount) = targets.iter().find_map(|t| t.mount.clone()) else {
        return Ok(None);
    };
    let options = PrefetchOptions::new().streams(streams);
    let mut plan = Plan::new(targets, &options, job);
    let total = plan.chunks.total;
    let init = plan.check(job.available());
    let (known, resident, needed, skipped) = (init.known, init.resident, init.needed, init.skipped);
    let guard_reason = init.guard_reason(total);
    let not_run = |reason: PrefetchReason, skip: Option<SkipReason>| {
        let mut report = plan.report(streams, PrefetchMethod::Auto, reason);
        report.resident_before = resident;
        report.skipped = if skip.is_some() { needed } else { 0 };
        report.skip_reasons = skip.into_iter().collect();
        report.residency_known = known;
        report
    };
    match policy::auto_prefetch_runs(known, needed, skipped) {
        Err(AutoPrefetchSkip::Resident) => {
            Ok(Some(not_run(PrefetchReason::AutoResident { mount }, None)))
        }
        Err(AutoPrefetchSkip::DoesNotFit) => Ok(Some(not_run(
            PrefetchReason::AutoDoesNotFit { mount },
            guard_reason,
        ))),
        Ok(()) => {
            trace::traced! {
                tracing::info!(target: "safeload", mount = %mount.mount_point.display(), "the auto policy prefetches before mapping");
            }
            let reason = PrefetchReason::Auto {
                mount,
                needed,
                total,
            };
            // The residency just checked goes on with the plan: not checked twice.
            run(plan, &options, job, reason).map(Some)
        }
    }
}
