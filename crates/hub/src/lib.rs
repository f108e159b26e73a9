//! safeload's remote sources, as a load's extras ([`RemoteExtras`]): checkpoints in object stores (`s3://`, `gs://`, `az://`), on HTTP servers and on the Hugging Face hub (`hf://`), through their caches; and the hub cache's housekeeping.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod cache;
mod remote;
pub mod report;
mod trace;

// The core's modules, named from this root as they were in the core.
use safeload_core::{
    cancel, coord, error, extras, format, memory, mount, os, policy, source, storage, verify,
    workers,
};

pub use cache::{RemoteExtras, hub_cache, hub_cache_prune, hub_cache_remove};
pub use report::{
    CacheEntryKind, CacheListing, CacheRemoval, CachedFile, CachedRepo, CachedRevision, KeepReason,
    KeptEntry, RemoveMode, RemovedEntry,
};
