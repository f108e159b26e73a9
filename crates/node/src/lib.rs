//! safeload's node-shared fill, as a load's extras: the local ranks of a job read a checkpoint's bytes once between them through one chunk queue, into one of two sinks: the page cache (prefetch, a warm-up before the load) or a sealed memfd per file that every rank maps (the node copy, a share step before the reads).
//!
//! This crate answers the core's seams (`safeload_core::extras::Extras::share`
//! and `Extras::warm_up`) with [`NodeExtras`], which the `safeload` crate
//! builds into its `Loader`'s extras (`safeload::extras::Builtin`).
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod copy;
mod prefetch;
mod trace;

// The core's modules this crate's code builds on, named from its root.
use safeload_core::{
    adapt, cancel, cluster, coord, dest, error, extras, jobs, memory, mount, os, policy, progress,
    report, source, storage,
};

use extras::{Extras, Job, ShareAsk, ShareFile, Shared, WarmFile, Warming};
use report::PrefetchReport;

/// The node copy (`Extras::share`) and the page-cache warm-up
/// (`Extras::warm_up`) as a load's extras.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeExtras;

impl Extras for NodeExtras {
    fn share(&self, files: &[ShareFile<'_>], ask: &ShareAsk<'_>) -> Shared {
        copy::share(files, ask)
    }

    fn warm_up(
        &self,
        files: &[WarmFile<'_>],
        warming: Warming<'_>,
        job: &Job<'_>,
    ) -> error::Result<Option<PrefetchReport>> {
        match warming {
            Warming::BeforeLoad(caller) => prefetch::before_load(files, caller, job),
            Warming::Only(options, reason) => {
                prefetch::warm(files, options, job, reason.clone()).map(Some)
            }
        }
    }
}

/// The owner of a process that has exited and been reaped (the core's
/// `Owner::dead`, which is its tests' own).
#[cfg(all(test, target_os = "linux", not(safeload_os_stub)))]
fn dead_owner() -> coord::Owner {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    coord::Owner { pid, tag: 1 }
}
