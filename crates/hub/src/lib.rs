//! safeload's remote sources, as a load's extras: checkpoints in object stores (`s3://`, `gs://`, `az://`), on HTTP servers (`http(s)://`) and on the Hugging Face hub (`hf://`), read by ranged requests on a runtime of the crate's own; `hf://` through the Hugging Face cache, the others through a cache directory where one is named; and the hub cache's housekeeping.
//!
//! The facade (`safeload`, feature `remote`) reads these addresses with
//! [`RemoteExtras`], through the core's seam (`safeload_core::extras`).
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

// The core's modules this crate's code builds on, named from its root as
// they were when it was a module of the core.
use safeload_core::{
    cancel, coord, error, extras, format, memory, mount, os, policy, source, storage, verify,
    workers,
};

pub use cache::{RemoteExtras, hub_cache, hub_cache_prune, hub_cache_remove};
pub use report::{
    CacheEntryKind, CacheListing, CacheRemoval, CachedFile, CachedRepo, CachedRevision, KeepReason,
    KeptEntry, RemoveMode, RemovedEntry,
};
