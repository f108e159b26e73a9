//! The warm-up (prefetch's seam): the local files a load opened handed to the extras, which may stream them into the page cache before the load plans its reads, and what the warm-up needs of the job.

use std::fs::File;
use std::path::Path;

use crate::cancel::Cancel;
use crate::extras::PrefetchOptions;
use crate::memory;
use crate::mount::Mount;
use crate::policy::Environment;
use crate::progress::Callback;
use crate::report::PrefetchReason;
use crate::source::{LocalFile, Source};

/// A local file the loader has opened, handed over so that the warm-up
/// neither opens nor looks it up again.
#[derive(Clone, Copy)]
pub struct WarmFile<'a> {
    /// The path it was opened by.
    pub path: &'a Path,
    /// `path` with symlinks resolved, as the loader found it.
    pub canonical: &'a Path,
    /// The loader's descriptor (the file the header was read from).
    pub file: &'a File,
    /// Its mount, where it was found.
    pub mount: Option<&'a Mount>,
    /// Whether the loader will map it (the auto rule warms mapped files).
    pub mapped: bool,
    /// Its length in bytes.
    pub len: u64,
}

impl<'a> WarmFile<'a> {
    /// A local file handed over; `mapped`: whether the load maps it.
    pub fn of(source: &'a LocalFile, mapped: bool) -> WarmFile<'a> {
        WarmFile {
            path: source.path(),
            canonical: source.canonical(),
            file: source.file(),
            mount: source.mount(),
            mapped,
            len: source.len(),
        }
    }
}

/// What a warm-up is asked to do.
#[derive(Clone, Copy)]
pub enum Warming<'a> {
    /// Before a load, with the caller's options where set.
    BeforeLoad(Option<&'a PrefetchOptions>),
    /// Only a warm-up (`Loader::warm`): with these options, for this reason.
    Only(&'a PrefetchOptions, &'a PrefetchReason),
}

/// The settings of a warm-up that belong to the job, not to prefetch.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    /// The caller's local rank and size, else the exchange's, where set.
    pub local_rank: Option<(usize, usize)>,
    /// The memory the guard may fill, where the caller set it.
    pub memory_available: Option<u64>,
    /// The environment, read once at the top of the load.
    pub env: &'a Environment,
    /// The caller's progress callback.
    pub progress: Option<&'a Callback>,
    /// The load's cancel flags ([`Cancel::NONE`] for `Loader::warm`).
    pub cancel: &'a Cancel,
}

impl Job<'_> {
    /// The memory the guard may fill: the caller's, else the system's.
    pub fn available(&self) -> Option<u64> {
        self.memory_available.or_else(memory::available)
    }
}
