//! The options of a load, owned once: the `Loader` builder sets them, and a `Checkpoint` opened by it keeps them for the reads it does later.

use std::fmt;
use std::sync::Arc;

use safetensors::Dtype;

use crate::cancel::Cancel;
use crate::dest::pages::HugePages;
use crate::extras::{Job, LocalRank, PrefetchOptions, Role, ShareAsk};
use crate::mount::MountTable;
use crate::policy::{Environment, ReadMode};

/// A filter on tensor names.
pub(crate) type Filter = dyn Fn(&str) -> bool + Send + Sync;

/// Every knob of a load, each once (see `Loader`'s setters).
#[derive(Clone, Default)]
pub(crate) struct Options {
    pub mode: ReadMode,
    pub threads: Option<usize>,
    pub io_concurrency: Option<usize>,
    pub read_size: Option<usize>,
    pub filter: Option<Arc<Filter>>,
    pub mount_table: Option<MountTable>,
    pub populate: bool,
    pub direct_io: Option<bool>,
    pub huge_pages: HugePages,
    pub memory_available: Option<u64>,
    pub prefetch: Option<PrefetchOptions>,
    pub local_rank: Option<(usize, usize)>,
    pub verify: Option<bool>,
    pub expected_sha256: Vec<(String, String)>,
    pub dtype: Option<Dtype>,
    pub progress: Option<crate::progress::Callback>,
    pub exchange: Option<Arc<dyn crate::cluster::Communicator>>,
    /// What stops the load early (`Loader::cancel_on`, a dropped async load).
    pub cancel: Cancel,
    pub hub_cache: Option<bool>,
    pub cache_dir: Option<std::path::PathBuf>,
    /// The loader's type of extras.
    pub extras: crate::extras::Installed,
    /// The staging ring of a load to a device: its buffers and their size.
    pub staging: Option<(usize, usize)>,
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("mode", &self.mode)
            .field("threads", &self.threads)
            .field("io_concurrency", &self.io_concurrency)
            .field("read_size", &self.read_size)
            .field("filter", &self.filter.as_ref().map(|_| "<fn>"))
            .field("populate", &self.populate)
            .field("direct_io", &self.direct_io)
            .field("huge_pages", &self.huge_pages)
            .field("memory_available", &self.memory_available)
            .field("prefetch", &self.prefetch)
            .field("local_rank", &self.local_rank)
            .field("verify", &self.verify)
            .field("expected_sha256", &self.expected_sha256)
            .field("dtype", &self.dtype)
            .field("progress", &self.progress.as_ref().map(|_| "<fn>"))
            .field(
                "exchange",
                &self.exchange.as_ref().map(|c| (c.node(), c.nodes())),
            )
            .field("cancel", &self.cancel)
            .field("hub_cache", &self.hub_cache)
            .field("cache_dir", &self.cache_dir)
            .field("extras", &self.extras)
            .field("staging", &self.staging)
            .finish_non_exhaustive()
    }
}

impl Options {
    /// How a load of `sources` reads: the concurrency, and the size of a read.
    pub(crate) fn io_defaults<'a>(
        &self,
        sources: impl Iterator<Item = &'a dyn crate::source::Source>,
    ) -> (crate::adapt::Concurrency, usize) {
        crate::policy::io_defaults(sources, self.io_concurrency, self.read_size)
    }

    /// The caches a remote address of the load goes through.
    pub(crate) fn caching(&self) -> crate::extras::Caching<'_> {
        let env = Environment::from_process();
        let verify = crate::policy::verify(self.verify, &env, !self.expected_sha256.is_empty());
        crate::extras::Caching {
            hub: self.hub_cache,
            dir: self.cache_dir.as_deref(),
            verify,
            cancel: &self.cancel,
        }
    }

    /// What the warm-up needs of the job; `local_rank` (an exchange's)
    /// where the caller set none.
    pub(crate) fn warm_job<'s>(
        &'s self,
        env: &'s Environment,
        local_rank: Option<(usize, usize)>,
        cancel: &'s Cancel,
    ) -> Job<'s> {
        Job {
            local_rank: self.local_rank.or(local_rank),
            memory_available: self.memory_available,
            env,
            progress: self.progress.as_ref(),
            cancel,
        }
    }

    /// What the share step is asked by the local `rank` with `role`.
    pub(crate) fn share_ask<'s>(
        &'s self,
        rank: &'s LocalRank,
        env: &'s Environment,
        keep: Option<&'s (dyn Fn(&str) -> bool + Sync)>,
        role: Role,
    ) -> ShareAsk<'s> {
        let prefetch = self.prefetch.as_ref();
        ShareAsk {
            rank,
            env,
            keep,
            converting: self.dtype.is_some(),
            role,
            direct_io: self.direct_io,
            huge_pages: self.huge_pages,
            memory_available: self.memory_available,
            chunk_size: prefetch.and_then(|p| p.chunk_bytes()),
            streams: prefetch.map(|p| p.stream_count()),
            dir: prefetch.and_then(|p| p.queue_directory()),
            progress: self.progress.as_ref(),
            cancel: &self.cancel,
        }
    }
}
