//! The seam the core's extras plug into: a checkpoint at an address the core cannot read itself (an object store's, the hub's) resolved to its files, each a source; and the core alone, `NoExtras`.
//!
//! A `Loader` or `Checkpoint` is made
//! with a type of extras (`Loader<E>`), whose default value it asks for each
//! address that is not a local path: the facade's type (the `safeload` crate,
//! its cargo features) names the extras it was built with, the core's own
//! (`NoExtras`) none. Past the resolution, a load knows its files only as
//! [`Source`]s.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cancel::Cancel;
use crate::error::Result;
pub use crate::mount::MountTable;
pub use crate::source::{LocalFile, Source, Version, VersionTag};

/// What a load asks of the caches a remote address goes through: the
/// caller's choices (`Loader::hub_cache`, `Loader::cache_dir`), over the
/// environment's.
#[derive(Debug, Clone, Copy)]
pub struct Caching<'a> {
    /// Whether `hf://` goes through the hub cache.
    pub hub: Option<bool>,
    /// The cache directory of other stores.
    pub dir: Option<&'a Path>,
    /// Whether the load checks SHA-256 digests (a file to be verified may
    /// need its store's).
    pub verify: bool,
    /// The load's cancel flags (`Loader::cancel_on`, a dropped async load):
    /// the checkpoint resolved keeps them, and each of its requests in
    /// flight, from resolving to the last read, stops once they are set
    /// (within its watch's tick), a cache write then publishing nothing.
    /// [`Cancel::NONE`] for an open, whose later reads are the caller's.
    pub cancel: &'a Cancel,
}

impl Default for Caching<'_> {
    fn default() -> Self {
        Caching {
            hub: None,
            dir: None,
            verify: false,
            cancel: &Cancel::NONE,
        }
    }
}

/// What an address names at its place: one `.safetensors` file, or an index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// One file, by its name under the place.
    Single(String),
    /// An index: its name and bytes.
    Index(String, Vec<u8>),
}

/// A checkpoint an extra resolved an address to.
///
/// # Contract
///
/// - [`shown`](Self::shown) names a file of it (the index's or a shard's
///   name, relative to its place) as reports and errors show it, the same
///   for the checkpoint's whole life.
/// - [`take`](Self::take) opens a file of it as a [`Source`], once per name
///   and load, at the one version the whole load reads (for the hub, one
///   commit): every later read of it reads that version or fails.
/// - Nothing blocks forever: what waits on a network bounds its waits.
pub trait RemoteCheckpoint: Send + Sync + fmt::Debug {
    /// The path or address the file `name` is shown by.
    fn shown(&self, name: &str) -> PathBuf;

    /// The file `name` as a source; `table` is the mount table a local file
    /// of it (a cache's) is looked up in.
    fn take(&self, name: &str, table: Option<&MountTable>) -> Result<Arc<dyn Source>>;

    /// Other files brought beside the weights (`hf://...?with=`), by name:
    /// each one's local path, or `None` where the place has none.
    fn extra_files(&self) -> BTreeMap<String, Option<PathBuf>> {
        BTreeMap::new()
    }
}

/// An address resolved: the checkpoint, and what it names there.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// Where its files are opened.
    pub checkpoint: Arc<dyn RemoteCheckpoint>,
    /// The file or the index the address names.
    pub found: Found,
}

/// What a build of the crate reads beyond local paths.
pub trait Extras: Send + Sync + fmt::Debug {
    /// The checkpoint at `address` (`hf://org/repo`, `s3://bucket/prefix`,
    /// ...), through the caches `caching` says; `None` where these extras
    /// read no such address.
    fn resolve(&self, address: &str, caching: Caching<'_>) -> Option<Result<Resolution>> {
        let _ = (address, caching);
        None
    }

    /// This process's part in the job's exchange between nodes that
    /// `SAFELOAD_EXCHANGE=<name>` names (`mpi` with the facade's feature
    /// `mpi`); `None` where these extras know no exchange of that name (the
    /// load then refuses the value, naming it).
    ///
    /// # Contract
    ///
    /// - `name` is the variable's value, trimmed; never empty, `0`, `none`
    ///   or `off` (no exchange: the load does not ask).
    /// - A collective of the whole job: every process calls it, at the same
    ///   place in its order of loads, and it returns within the exchange's
    ///   bound on a collective (`SAFELOAD_EXCHANGE_TIMEOUT_SECS`), an error
    ///   where a process never joins, never a hang.
    /// - `Some(Err(_))` says in words why the exchange cannot be joined (the
    ///   system's library missing, a node identity that does not parse, the
    ///   bound passed); the load returns it as an I/O error of
    ///   `Operation::Exchange` naming the checkpoint.
    /// - The [`Joined`](crate::cluster::Joined) holds the node's exchange
    ///   on one process per node only (its participant), whose collectives
    ///   keep the contract of [`Communicator`](crate::cluster::Communicator).
    fn join_exchange(&self, name: &str) -> Option<std::io::Result<crate::cluster::Joined>> {
        let _ = name;
        None
    }
}

/// The extras a load resolves through (the default: none), as its options
/// keep them.
#[derive(Debug, Clone)]
pub(crate) struct Installed(pub Arc<dyn Extras>);

impl Default for Installed {
    fn default() -> Installed {
        Installed(Arc::new(NoExtras))
    }
}

impl std::ops::Deref for Installed {
    type Target = dyn Extras;

    fn deref(&self) -> &(dyn Extras + 'static) {
        &*self.0
    }
}

/// The core alone: local paths only.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoExtras;

impl Extras for NoExtras {}
