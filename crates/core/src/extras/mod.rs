//! The seams the core's extras plug into: a checkpoint at an address the core cannot read itself (an object store's, the hub's) resolved to its files, each a source; the exchange between nodes joined by name; a share step before reads (the node copy); a warm-up (prefetch); and the core alone, `NoExtras`.
//!
//! A `Loader<E>` asks its type of extras' default value for each address
//! that is not a local path; past the resolution, a load knows its files
//! only as [`Source`]s.

mod local_rank;
mod prefetch_options;
mod share;
mod warm_up;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cancel::Cancel;
use crate::error::Result;
pub use crate::mount::MountTable;
pub use crate::source::{LocalFile, Source, Version, VersionTag};
#[doc(hidden)] // for the plug-in crates
pub use local_rank::{LocalRank, detect_local_rank, job_key};
#[doc(hidden)] // at the root: `PrefetchOptions`
pub use prefetch_options::PrefetchOptions;
#[doc(hidden)] // for the plug-in crates
pub use prefetch_options::{ChunkCallback, DEFAULT_CHUNK, DEFAULT_STREAMS};
pub(crate) use share::direct_on;
#[doc(hidden)] // for the plug-in crates
pub use share::{
    Facts, Pending, PerFile, Role, ShareAsk, ShareFile, Shared, direct_reads, eligible, tensor_part,
};
#[doc(hidden)] // for the plug-in crates
pub use warm_up::{Job, WarmFile, Warming};

/// What a load asks of the caches a remote address goes through: the
/// caller's choices, over the environment's.
#[derive(Debug, Clone, Copy)]
pub struct Caching<'a> {
    /// Whether `hf://` goes through the hub cache.
    pub hub: Option<bool>,
    /// The cache directory of other stores.
    pub dir: Option<&'a Path>,
    /// Whether the load checks SHA-256 digests.
    pub verify: bool,
    /// The load's cancel flags, kept by the checkpoint resolved: each of its
    /// requests stops once they are set, a cache write then publishing
    /// nothing. [`Cancel::NONE`] for an open, whose later reads are the
    /// caller's.
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
    /// `mpi`); `None` where these extras know no exchange of that name.
    ///
    /// # Contract
    ///
    /// - `name` is the variable's value, trimmed; never empty, `0`, `none`
    ///   or `off`.
    /// - A collective of the whole job, called by every process at the same
    ///   place in its order of loads; it returns within
    ///   `SAFELOAD_EXCHANGE_TIMEOUT_SECS`, never hangs.
    /// - `Some(Err(_))` says in words why the exchange cannot be joined; the
    ///   load returns it as an I/O error of `Operation::Exchange`.
    /// - The [`Joined`](crate::cluster::Joined) holds the node's exchange on
    ///   its participant only, whose collectives keep the contract of
    ///   [`Communicator`](crate::cluster::Communicator).
    fn join_exchange(&self, name: &str) -> Option<std::io::Result<crate::cluster::Joined>> {
        let _ = name;
        None
    }

    /// The share step before reads (the node copy): what the node's local
    /// ranks share of `files`, the files of one load in its order, before
    /// any of their tensor bytes is read. The default shares nothing.
    ///
    /// # Contract
    ///
    /// - One `PerFile` per file of `files`, in their order. A file with
    ///   `PerFile::Copy` is read no further: its tensors are views of the
    ///   copy, a read-only image of the whole file, complete when `share`
    ///   returns unless it is among `Shared::pending`.
    /// - Only a buffered file, every tensor kept, not converted and aligned
    ///   (`eligible`) gets a copy; one rank alone gets none, silently.
    /// - Under `Role::Participant`, the copies come back in
    ///   `Shared::pending` for the load to fill; it calls
    ///   `Pending::complete` once every byte is in place, and the other
    ///   ranks (`Role::Member`) map them only then.
    /// - It never fails the load: a copy that cannot be had is
    ///   `PerFile::NotUsed` with its reason. Its waits are bounded.
    #[doc(hidden)] // for the plug-in crates: its types are the core's plumbing
    fn share(&self, files: &[ShareFile<'_>], ask: &ShareAsk<'_>) -> Shared {
        let _ = ask;
        Shared::none(files.len())
    }

    /// The warm-up (prefetch): the page cache warmed with `files`, local
    /// files a load or `Loader::warm` opened, before any of their tensor
    /// bytes is read. The default warms nothing.
    ///
    /// # Contract
    ///
    /// - `Warming::BeforeLoad`: runs where the caller's options, else
    ///   `SAFELOAD_PREFETCH`, else the auto rule say so; `Ok(None)` where it
    ///   did not run. `Warming::Only`: runs with the options given;
    ///   `Ok(None)` only where these extras have no warm-up.
    /// - Only the page cache is warmed: the load's result is the same
    ///   without it.
    /// - The local ranks may split the bytes; a rank that stops or dies
    ///   costs the others a bounded wait, never a hang.
    /// - `Err` only where a file cannot be read (naming it and the offset).
    #[doc(hidden)] // for the plug-in crates: its types are the core's plumbing
    fn warm_up(
        &self,
        files: &[WarmFile<'_>],
        warming: Warming<'_>,
        job: &Job<'_>,
    ) -> Result<Option<crate::report::PrefetchReport>> {
        let _ = (files, warming, job);
        Ok(None)
    }
}

/// The extras a load's options keep (the default: none).
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::Loader;

    /// A checkpoint of one file with one tensor, in a temporary directory.
    fn checkpoint() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let data = vec![7u8; 1 << 16];
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 16], &data)
                .unwrap();
        safetensors::serialize_to_file([("w", view)], None, &path).unwrap();
        (dir, path)
    }

    #[test]
    fn the_core_alone_warms_nothing_and_says_so() {
        let (_dir, path) = checkpoint();
        let err = Loader::<NoExtras>::new()
            .prefetch(2)
            .warm(&path)
            .unwrap_err();
        assert_eq!(
            err.io_error().map(std::io::Error::kind),
            Some(std::io::ErrorKind::Unsupported),
            "{err}"
        );
        assert!(err.to_string().contains("warm-up"), "{err}");
    }

    #[test]
    fn the_core_alone_shares_no_copy_and_prefetches_nothing() {
        let (_dir, path) = checkpoint();
        let sd = Loader::<NoExtras>::new()
            .disable_mmap(true)
            .local_rank(0, 2)
            .prefetch(2)
            .load(&path)
            .unwrap();
        assert_eq!(sd.get("w").unwrap().as_bytes(), &[7u8; 1 << 16][..]);
        assert!(sd.report().prefetch.is_none());
        assert!(sd.report().files.iter().all(|f| f.node_copy.is_none()));
    }

    /// Calls of each seam by the loads of the test below.
    static SHARED: AtomicUsize = AtomicUsize::new(0);
    static WARMED: AtomicUsize = AtomicUsize::new(0);

    /// Extras that count the files each seam is handed, sharing nothing.
    #[derive(Debug, Default)]
    struct Counting;

    impl Extras for Counting {
        fn share(&self, files: &[ShareFile<'_>], ask: &ShareAsk<'_>) -> Shared {
            assert!(files.iter().all(|f| f.buffered), "read buffered");
            assert_eq!(
                (ask.rank.rank, ask.rank.size, ask.role),
                (1, 3, Role::Queue)
            );
            SHARED.fetch_add(files.len(), Ordering::SeqCst);
            Shared::none(files.len())
        }

        fn warm_up(
            &self,
            files: &[WarmFile<'_>],
            warming: Warming<'_>,
            job: &Job<'_>,
        ) -> Result<Option<crate::report::PrefetchReport>> {
            assert!(matches!(warming, Warming::BeforeLoad(Some(_))));
            assert_eq!(job.local_rank, Some((1, 3)));
            WARMED.fetch_add(files.len(), Ordering::SeqCst);
            Ok(None)
        }
    }

    #[test]
    fn a_load_asks_each_seam_once_with_its_files() {
        let (_dir, path) = checkpoint();
        let sd = Loader::<Counting>::new()
            .disable_mmap(true)
            .local_rank(1, 3)
            .prefetch(2)
            .load(&path)
            .unwrap();
        assert_eq!(sd.get("w").unwrap().as_bytes(), &[7u8; 1 << 16][..]);
        assert_eq!(SHARED.load(Ordering::SeqCst), 1);
        assert_eq!(WARMED.load(Ordering::SeqCst), 1);
    }
}
