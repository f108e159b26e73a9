//! The core of safeload: checkpoints read from sources into destinations (the format, tensors, storage, conversions, slices, the read loop, plan and policy, the load and checkpoint APIs, mounts, reports and errors). The `safeload` crate is its facade, with the crate's documentation; this crate's items are what it re-exports.
//!
//! Its doc examples name its items as an engine does, through `safeload`.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

#[macro_use]
#[doc(hidden)] // for the plug-in crates
pub mod worded; // first: its macros are in scope after it
#[doc(hidden)] // for the plug-in crates
pub mod adapt;
#[doc(hidden)] // for the plug-in crates
pub mod cancel;
mod checkpoint;
pub mod cluster;
#[doc(hidden)]
pub mod convert;
#[doc(hidden)] // for the plug-in crates
pub mod coord;
#[doc(hidden)]
pub mod demo;
#[doc(hidden)] // for the plug-in crates
pub mod dest;
#[doc(hidden)] // for the plug-in crates
pub mod error;
mod execute;
pub mod extras;
mod file;
#[doc(hidden)] // for the plug-in crates
pub mod format;
#[doc(hidden)] // for the plug-in crates
pub mod jobs;
mod load;
#[doc(hidden)] // for the plug-in crates
pub mod memory;
pub mod mount;
mod options;
#[doc(hidden)] // for the plug-in crates
pub mod os;
mod plan;
#[doc(hidden)] // for the plug-in crates
pub mod policy;
#[doc(hidden)] // for the plug-in crates
pub mod progress;
pub mod report;
mod resolve;
mod slice;
#[doc(hidden)] // for the plug-in crates
pub mod source;
mod state_dict;
#[doc(hidden)] // for the plug-in crates
pub mod storage;
mod tensor;
#[doc(hidden)] // for the plug-in crates
pub mod trace;
#[doc(hidden)] // for the plug-in crates
pub mod verify;
#[doc(hidden)] // for the plug-in crates
pub mod workers;

use std::path::Path;

pub use checkpoint::{Checkpoint, TensorInfo};
pub use dest::pages::HugePages;
pub use error::{Error, ErrorKind, Operation, RemoteFailure, Result};
pub use load::Loader;
pub use report::LoadReport;
pub use safetensors::Dtype;
pub use state_dict::StateDict;
pub use tensor::{Element, Tensor};

// Test seams and the CLI's and benchmarks' helpers: public for them, out of
// the documented API.
#[doc(hidden)]
pub use extras::PrefetchOptions;
#[doc(hidden)]
pub use format::header::MAX_HEADER_LEN;
#[doc(hidden)]
pub use format::header::fuzz as __fuzz;
#[doc(hidden)]
pub use policy::{
    AutoPolicy, DISABLE_MMAP_ENV, HF_SHARD_PREFETCH_ENV, HUGE_PAGES_ENV, NODE_COPY_ENV,
    PREFETCH_ENV, ReadMode, VARIABLES as ENV_VARIABLES, VERIFY_ENV,
};
#[doc(hidden)]
pub use slice::MERGE_GAP;

/// Loads a checkpoint: a `.safetensors` file, a `*.safetensors.index.json`,
/// or a directory holding one of them.
///
/// `disable_mmap`: `Some(true)` reads every file into memory, `Some(false)`
/// maps every file, `None` decides per file from its filesystem (and the
/// `SAFELOAD_DISABLE_MMAP` environment variable). The same as
/// `Loader::new().disable_mmap(..).load(path)`.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let data = vec![0u8; 64 * 32 * 2];
/// # let mut weight_map = std::collections::BTreeMap::new();
/// # for i in 0..2 {
/// #     let (name, file) = (format!("model.layers.{i}.mlp.up.weight"), format!("model-0000{}-of-00002.safetensors", i + 1));
/// #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 32], &data)?;
/// #     safetensors::serialize_to_file([(name.as_str(), view)], None, &dir.path().join(&file))?;
/// #     weight_map.insert(name, file);
/// # }
/// # let index = dir.path().join("model.safetensors.index.json");
/// # std::fs::write(&index, serde_json::json!({ "weight_map": weight_map }).to_string())?;
/// let sd = safeload::load_state_dict(dir.path(), None)?;          // decided per file
/// let buffered = safeload::load_state_dict(&index, Some(true))?;  // read into memory
/// assert_eq!(sd.names().collect::<Vec<_>>(), buffered.names().collect::<Vec<_>>());
/// assert_eq!(buffered.report().bytes_read(), buffered.total_bytes());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// A path that does not exist or holds no checkpoint
/// ([`Error::is_not_found`]), a file that breaks the format
/// ([`Error::is_corrupt`]), a failed read, or a buffered load that does not
/// fit in memory ([`ErrorKind::InsufficientMemory`]); each names the file.
pub fn load_state_dict(path: impl AsRef<Path>, disable_mmap: Option<bool>) -> Result<StateDict> {
    Loader::<extras::NoExtras>::new()
        .read_mode(ReadMode::from_disable_mmap(disable_mmap))
        .load(path)
}

/// Drops every file of a checkpoint from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`), for honest cold-cache benchmarks
/// and tests. Pages that some process still maps, or that are dirty, stay. A
/// no-op off Linux.
#[doc(hidden)]
pub fn evict(path: impl AsRef<Path>) -> Result<()> {
    let checkpoint = resolve::resolve(
        path.as_ref(),
        resolve::Caching::default(),
        &extras::NoExtras,
    )?;
    let shards = checkpoint
        .shards
        .iter()
        .map(|s| (s.path.as_path(), checkpoint.open(s)));
    let index = checkpoint
        .index_path
        .as_deref()
        .zip(checkpoint.open_index());
    for (path, file) in shards.chain(index) {
        let file = file.map_err(|e| Error::io(Operation::Open, path, None, e))?;
        os::evict(&file).map_err(|e| Error::io(Operation::Evict, path, None, e))?;
    }
    Ok(())
}
