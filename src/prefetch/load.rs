//! The loader's side of prefetch: whether a load prefetches (the caller, then the environment, then the auto policy), with which settings, on the files the loader already opened.

use std::fs::File;
use std::path::Path;

use super::options::{HF_SHARD_PREFETCH_ENV, PREFETCH_ENV, PrefetchOptions};
use super::residency::{Target, target_from};
use super::run::{Plan, run};
use crate::error::{Error, Result};
use crate::memory;
use crate::mount::{Mount, MountKind};
use crate::policy::{self, PrefetchMethod};
use crate::report::{PrefetchReport, human_bytes};

/// What a load asks of prefetch.
pub(crate) struct LoadRequest<'a> {
    /// `Loader::prefetch` / `prefetch_with`, if called.
    pub caller: Option<&'a PrefetchOptions>,
    /// `Loader::local_rank`, if called.
    pub local_rank: Option<(usize, usize)>,
    /// `Loader::memory_available`, if called.
    pub memory_available: Option<u64>,
}

/// A file the loader has opened (and parsed), handed over so that prefetch
/// neither opens nor looks it up again.
pub(crate) struct LoadFile<'a> {
    pub path: &'a Path,
    /// `path` with symlinks resolved, as the loader found it.
    pub canonical: &'a Path,
    /// The loader's descriptor: the same file the header was read from,
    /// whatever happened to the path since.
    pub file: &'a File,
    pub mount: Option<&'a Mount>,
    /// Whether the loader will map it (auto prefetch is for mapped files).
    pub mapped: bool,
}

impl LoadFile<'_> {
    fn target(&self) -> Result<Target> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io("duplicating the descriptor of", self.path, None, e))?;
        target_from(
            self.path.to_path_buf(),
            self.canonical,
            file,
            self.mount.cloned(),
        )
    }
}

/// Prefetches the files a load is about to open, when asked to (builder,
/// then environment) or when the auto policy says so; `None` when prefetch
/// was not considered.
pub(crate) fn before_load(
    files: &[LoadFile<'_>],
    request: &LoadRequest<'_>,
) -> Result<Option<PrefetchReport>> {
    let env = |name: &str| std::env::var(name).ok();
    let (options, reason) = if let Some(options) = request.caller {
        let reason = format!("prefetch({}) was requested", options.streams);
        (options.clone(), reason)
    } else if let Some((streams, setting)) = streams_from_env(env) {
        (
            PrefetchOptions::new().streams(streams),
            format!("{setting} is set"),
        )
    } else {
        return auto(files, request);
    };
    if options.streams == 0 {
        return Ok(None);
    }
    let options = with_loader_settings(options, request);
    let targets = files
        .iter()
        .map(LoadFile::target)
        .collect::<Result<Vec<_>>>()?;
    run(Plan::new(targets, &options), &options, reason).map(Some)
}

/// The caller's options, with the loader's rank and memory where the
/// options leave them unset.
fn with_loader_settings(
    mut options: PrefetchOptions,
    request: &LoadRequest<'_>,
) -> PrefetchOptions {
    if options.local_rank.is_none() {
        options.local_rank = request.local_rank;
    }
    if options.memory_available.is_none() {
        options.memory_available = request.memory_available;
    }
    options
}

/// The auto policy: files on a kernel network filesystem that will be
/// mapped are prefetched when they are not already resident and the memory
/// guard allows all of them.
fn auto(files: &[LoadFile<'_>], request: &LoadRequest<'_>) -> Result<Option<PrefetchReport>> {
    let mut streams = 0;
    let mut targets = Vec::new();
    for f in files {
        let kind = f.mount.map_or(MountKind::Unknown, |m| m.kind);
        if let (true, Some(n)) = (f.mapped, policy::auto_prefetch_streams(kind)) {
            streams = streams.max(n);
            targets.push(f.target()?);
        }
    }
    let Some(first) = targets.first() else {
        return Ok(None);
    };
    let place = first
        .mount
        .as_ref()
        .map(|m| format!("{} ({}) at {}", m.kind, m.fs_type, m.mount_point.display()))
        .unwrap_or_default();
    let options = with_loader_settings(PrefetchOptions::new().streams(streams), request);
    let mut plan = Plan::new(targets, &options);
    let total = plan.chunks.total;
    let available = options.memory_available.or_else(memory::available);
    let init = plan.check(available);
    let (known, resident, needed, skipped) = (init.known, init.resident, init.needed, init.skipped);
    let guard_reason = init.guard_reason(total);
    let not_run = |reason: String, skip: Option<String>| PrefetchReport {
        resident_before: resident,
        skipped: if skip.is_some() { needed } else { 0 },
        skip_reasons: skip.into_iter().collect(),
        residency_known: known,
        ..plan.report(streams, PrefetchMethod::Auto, reason)
    };
    if known && needed == 0 {
        return Ok(Some(not_run(
            format!("on {place}, already in the page cache"),
            None,
        )));
    }
    if skipped > 0 {
        return Ok(Some(not_run(
            format!("on {place}, the checkpoint does not fit the memory guard"),
            Some(guard_reason.unwrap_or_default()),
        )));
    }
    let reason = format!(
        "on {place}, {} of {} not in the page cache: warmed first, then mapped",
        human_bytes(needed),
        human_bytes(total)
    );
    // The residency just checked goes on with the plan: not checked twice.
    run(plan, &options, reason).map(Some)
}

/// `SAFELOAD_PREFETCH`, else `HF_SHARD_PREFETCH`, as a number of streams and
/// the setting in words. A value that is not a number is ignored.
pub(crate) fn streams_from_env(env: impl Fn(&str) -> Option<String>) -> Option<(usize, String)> {
    [PREFETCH_ENV, HF_SHARD_PREFETCH_ENV]
        .into_iter()
        .find_map(|name| {
            let value = env(name)?;
            let streams = value.trim().parse::<usize>().ok()?;
            Some((streams, format!("{name}={streams}")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefetch::launcher::tests::env_of;

    #[test]
    fn streams_from_the_environment() {
        assert_eq!(streams_from_env(env_of(&[])), None);
        assert_eq!(
            streams_from_env(env_of(&[("SAFELOAD_PREFETCH", " 4 ")])),
            Some((4, "SAFELOAD_PREFETCH=4".to_string()))
        );
        assert_eq!(
            streams_from_env(env_of(&[("HF_SHARD_PREFETCH", "8")])),
            Some((8, "HF_SHARD_PREFETCH=8".to_string()))
        );
        assert_eq!(
            streams_from_env(env_of(&[
                ("SAFELOAD_PREFETCH", "0"),
                ("HF_SHARD_PREFETCH", "8")
            ])),
            Some((0, "SAFELOAD_PREFETCH=0".to_string())),
            "ours first"
        );
        assert_eq!(
            streams_from_env(env_of(&[("SAFELOAD_PREFETCH", "yes")])),
            None
        );
    }
}
