//! `Loader`: the options of a load, set as one expression (its entry points in `run.rs`, their async forms in `future.rs`).

mod future;
mod run;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::dest::pages::HugePages;
use crate::extras::PrefetchOptions;
use crate::extras::{Extras, Installed, NoExtras};
use crate::mount::MountTable;
use crate::options::Options;
use crate::policy::ReadMode;
use crate::progress::Progress;
use safetensors::Dtype;

/// Loads checkpoints; the options of a load, set as one expression.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data = vec![0u8; 16];
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data)?;
/// # safetensors::serialize_to_file([("model.layers.0.w", view.clone()), ("lm_head", view)], None, &path)?;
/// let sd = safeload::Loader::new()
///     .disable_mmap(true)                       // read into memory; false maps; unset decides
///     .threads(4)                               // files opened and parsed at once
///     .filter(|name| name.starts_with("model.layers.0."))
///     .load(&path)?;
/// assert_eq!(sd.names().collect::<Vec<_>>(), ["model.layers.0.w"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Threads
///
/// Opening files and parsing headers, buffered reads and prefetch streams
/// block on storage, so they run on threads of the crate's own, never in the
/// caller's rayon pool (a slow network mount must not starve the process's
/// CPU work): [`threads`](Self::threads) files are opened at once, and
/// [`io_concurrency`](Self::io_concurrency) reads are in flight. Where the OS
/// refuses a thread, the threads that started (at least the calling one) do
/// the work.
///
/// # Extras
///
/// `X` is what it reads beyond local paths ([`Extras`]): the facade's
/// `safeload::Loader` has the extras its cargo features build in (`hf://`,
/// `s3://`, ... with `remote`); `safeload_core::Loader` alone has none.
pub struct Loader<X = NoExtras> {
    opts: Options,
    extras: PhantomData<fn() -> X>,
}

impl<X> Clone for Loader<X> {
    fn clone(&self) -> Self {
        Loader {
            opts: self.opts.clone(),
            extras: PhantomData,
        }
    }
}

impl<X: Extras + Default + 'static> Default for Loader<X> {
    fn default() -> Self {
        Loader::new()
    }
}

impl<X> fmt::Debug for Loader<X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Loader").field(&self.opts).finish()
    }
}

impl<X: Extras + Default + 'static> Loader<X> {
    /// A loader with every option at its default: auto strategy, all
    /// tensors.
    pub fn new() -> Self {
        let opts = Options {
            extras: Installed(Arc::new(X::default())),
            ..Options::default()
        };
        Loader {
            opts,
            extras: PhantomData,
        }
    }
}

impl<X> Loader<X> {
    /// `true` reads every file into memory ("buffered"); `false` maps every
    /// file. Unset, each file's strategy is decided from its filesystem (and
    /// the `SAFELOAD_DISABLE_MMAP` environment variable, which this call
    /// overrides).
    pub fn disable_mmap(self, disable: bool) -> Self {
        self.read_mode(if disable {
            ReadMode::Buffered
        } else {
            ReadMode::Mmap
        })
    }

    #[doc(hidden)]
    /// Sets the read mode. [`ReadMode::Auto`], the default, is the same as
    /// leaving it unset: `SAFELOAD_DISABLE_MMAP` is honoured, then each
    /// file's filesystem decides.
    pub fn read_mode(mut self, mode: ReadMode) -> Self {
        self.opts.mode = mode;
        self
    }

    /// How many files are opened and parsed at once (default: the machine's
    /// parallelism, or the current rayon pool's size when called from inside
    /// one). Zero is taken as one.
    pub fn threads(mut self, threads: usize) -> Self {
        self.opts.threads = Some(threads.max(1));
        self
    }

    /// Pins how many reads of buffered files (and populate calls of mapped
    /// ones) are in flight at once. Unset, the count is found by measurement
    /// during the load: it starts at 12 when a file is on FUSE, 8 otherwise,
    /// and doubles while throughput rises (up to 64), as the report says
    /// ([`LoadReport::io_concurrency_reason`](crate::LoadReport::io_concurrency_reason)).
    /// Zero is taken as one.
    pub fn io_concurrency(mut self, readers: usize) -> Self {
        self.opts.io_concurrency = Some(readers.max(1));
        self
    }

    /// The size of one read of a buffered file (default: 8 MiB); direct
    /// reads round it down to whole 4 KiB blocks. Values below 4 KiB are
    /// raised to it. (Prefetch cuts files into chunks of its own size, 8 MiB.)
    pub fn read_size(mut self, bytes: usize) -> Self {
        self.opts.read_size = Some(bytes.max(4096));
        self
    }

    /// Loads only the tensors whose name passes `keep`. A buffered load reads
    /// only their bytes; a sharded load opens only the shards the index says
    /// hold them.
    pub fn filter(mut self, keep: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        self.opts.filter = Some(Arc::new(keep));
        self
    }

    /// Faults mapped files in eagerly, in parallel, before returning
    /// (`MADV_POPULATE_READ`, which reports an I/O error or a truncated file
    /// as an error instead of `SIGBUS`). Default `false`: mapped loads stay
    /// lazy, and pages arrive when tensors are first touched.
    pub fn populate(mut self, populate: bool) -> Self {
        self.opts.populate = populate;
        self
    }

    /// Whether buffered reads bypass the page cache with `O_DIRECT`. Unset,
    /// the default suits the filesystem (see the crate docs). Where a file or
    /// its filesystem refuses direct reads, plain reads are used. Direct reads
    /// apply to files read whole; a filtered or packed file is read plainly.
    pub fn direct_io(mut self, direct: bool) -> Self {
        self.opts.direct_io = Some(direct);
        self
    }

    /// Whether the memory buffered reads land in is backed by transparent
    /// huge pages. [`HugePages::Auto`] (the default) honours
    /// `SAFELOAD_HUGE_PAGES` (`1`/`on`, `0`/`off`, `auto`), else measures
    /// while the load faults its memory in, and uses the page size that
    /// costs less per byte there. `On` always asks for them, `Off` never.
    /// The report says which were used and why
    /// ([`LoadReport::fresh_memory`](crate::LoadReport::fresh_memory)).
    pub fn huge_pages(mut self, huge_pages: HugePages) -> Self {
        self.opts.huge_pages = huge_pages;
        self
    }

    /// Takes `bytes` as the memory available to buffered reads, instead of
    /// asking the kernel (`MemAvailable`) and the cgroup (limit minus usage).
    /// Where buffered files need more, files the auto policy would read are
    /// mapped instead, and an explicit `disable_mmap(true)` load fails with
    /// [`ErrorKind::InsufficientMemory`](crate::ErrorKind::InsufficientMemory).
    pub fn memory_available(mut self, bytes: u64) -> Self {
        self.opts.memory_available = Some(bytes);
        self
    }

    /// Warms the page cache with the files before loading them, with
    /// `streams` readers in this process; `0` turns prefetch off, also where
    /// the auto policy would turn it on. Overrides `SAFELOAD_PREFETCH` (and
    /// `HF_SHARD_PREFETCH`). The job's processes on this node share the
    /// work (see the crate docs, "Prefetch"); resident chunks are not
    /// read, and the memory guard caps what is warmed. The report says what
    /// it did ([`LoadReport::prefetch`](crate::LoadReport::prefetch)).
    /// [`warm`](Self::warm) does the same alone, without loading.
    pub fn prefetch(mut self, streams: usize) -> Self {
        self.opts.prefetch = Some(
            self.opts
                .prefetch
                .take()
                .unwrap_or_default()
                .streams(streams),
        );
        self
    }

    #[doc(hidden)]
    /// Prefetch as [`prefetch`](Self::prefetch), with every option of
    /// [`PrefetchOptions`].
    pub fn prefetch_with(mut self, options: PrefetchOptions) -> Self {
        self.opts.prefetch = Some(options);
        self
    }

    /// This process's rank among the job's processes on this node, and their
    /// number, for prefetch and the node copy, instead of the launcher's
    /// variables (`LOCAL_RANK`/`LOCAL_WORLD_SIZE`, `SLURM_LOCALID`, ...).
    ///
    /// Which processes are one job is not set here: the job's identity is
    /// `SAFELOAD_JOB_ID` where set, else the launcher's job id, else the
    /// parent process (the crate docs, "One job, one copy per node"); ranks
    /// started without a launcher by one parent are one job already.
    pub fn local_rank(mut self, rank: usize, size: usize) -> Self {
        self.opts.local_rank = Some((rank, size));
        self
    }

    /// Converts every floating tensor to `dtype` (F32, F16 or BF16) as it is
    /// loaded, each run straight into the tensor's final place by the
    /// readers that read or map it: the file is never loaded first and
    /// converted after.
    ///
    /// Sources are F64, F32, F16, BF16, F8_E4M3 and F8_E5M2; integer and
    /// bool tensors, other floating types (the FNUZ F8 types, F8_E8M0, F4,
    /// F6, C64) and tensors already of `dtype` stay as they are. Rounding is
    /// to nearest, ties to even; a value beyond the target's range becomes
    /// infinite (counted in [`FileReport::overflowed`](crate::report::FileReport::overflowed));
    /// NaN stays NaN; F64 rounds through F32, as `torch.Tensor.to` does. A
    /// `dtype` that is not a target converts nothing.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let w: Vec<u8> = [1.0f32, -2.5, 3.0e38].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let ids: Vec<u8> = [7i64].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let views = [("w", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &w)?),
    /// #              ("ids", safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![1], &ids)?)];
    /// # safetensors::serialize_to_file(views, None, &path)?;
    /// use safeload::Dtype;
    ///
    /// let sd = safeload::Loader::new().dtype(Dtype::F16).load(&path)?;
    /// let w = sd.get("w").unwrap();
    /// assert_eq!(w.dtype(), Dtype::F16);
    /// assert_eq!(w.to_f32()?, [1.0, -2.5, f32::INFINITY]);   // 3e38 is beyond F16
    /// assert_eq!(sd.get("ids").unwrap().dtype(), Dtype::I64); // integers stay
    /// assert_eq!(sd.report().overflowed(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn dtype(mut self, dtype: Dtype) -> Self {
        self.opts.dtype = Some(dtype);
        self
    }

    /// Calls `report` with the bytes and files done out of their totals as a
    /// load (or [`warm`](Self::warm), or
    /// `Checkpoint::for_each`) goes on: for
    /// buffered reads, conversions, populated maps, prefetch and streaming,
    /// at most about 20 times a second and once when a phase
    /// ends. From the threads doing the work: keep it short. Nothing is
    /// printed by the library itself; a progress bar is the caller's.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data = vec![0u8; 1 << 20];
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 20], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// use std::sync::{Arc, Mutex};
    ///
    /// let last = Arc::new(Mutex::new(None));
    /// let seen = Arc::clone(&last);
    /// safeload::Loader::new()
    ///     .disable_mmap(true)
    ///     .on_progress(move |p| *seen.lock().unwrap() = Some(*p))
    ///     .load(&path)?;
    /// let p = last.lock().unwrap().unwrap();
    /// assert_eq!((p.bytes_done, p.files_done), (p.bytes_total, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_progress(mut self, report: impl Fn(&Progress) + Send + Sync + 'static) -> Self {
        self.opts.progress = Some(Arc::new(report));
        self
    }

    /// Checks that every file loaded is the file that was published: its
    /// SHA-256 is computed while loading (buffered files as their chunks
    /// land, mapped files in one pass over the map, files in parallel) and
    /// compared with the digest it must have: in a Hugging Face cache, the
    /// name of its blob (`.../blobs/<sha256>`); elsewhere, a digest given
    /// with [`expect_sha256`](Self::expect_sha256). A mismatch fails the
    /// load with [`ErrorKind::IntegrityMismatch`](crate::ErrorKind::IntegrityMismatch) naming the file. Every
    /// file's digest is in the report ([`FileReport::sha256`](crate::report::FileReport::sha256)).
    /// Unset, `SAFELOAD_VERIFY=1` turns it on; `expect_sha256` alone does too.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4], &[1, 2, 3, 4])?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let sd = safeload::Loader::new().verify(true).load(&path)?;
    /// let digest = sd.report().files[0].sha256.clone().unwrap();
    /// assert_eq!(digest.len(), 64);
    ///
    /// // Later, or on another machine: the file must still be that one.
    /// let again = safeload::Loader::new()
    ///     .expect_sha256("model.safetensors", &digest)
    ///     .load(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify(mut self, verify: bool) -> Self {
        self.opts.verify = Some(verify);
        self
    }

    /// The SHA-256 (64 hex digits) the file named `file_name` (a shard's
    /// name as the index writes it, or a single file's name) must have; the
    /// load fails with [`ErrorKind::IntegrityMismatch`](crate::ErrorKind::IntegrityMismatch) where it has another,
    /// and with [`ErrorKind::InvalidDigest`](crate::ErrorKind::InvalidDigest) where `digest` is not one.
    /// Turns [`verify`](Self::verify) on unless it was set to `false`.
    pub fn expect_sha256(mut self, file_name: impl Into<String>, digest: &str) -> Self {
        self.opts
            .expected_sha256
            .push((file_name.into(), digest.to_string()));
        self
    }

    /// Whether an `hf://` checkpoint goes through the Hugging Face cache
    /// (feature `remote`; on by default): the files the cache holds at the
    /// revision's commit are read from it as local files (mapped on a local
    /// disk), the others fetched and written to it as they are read, in the
    /// layout the hub's own clients share (`huggingface_hub`, `hf-hub`).
    /// `false` streams every file and writes nothing (as does
    /// `SAFELOAD_HUB_CACHE=0` where this is unset). The cache is
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`; with `HF_HUB_OFFLINE=1` nothing is asked
    /// of the hub, and a file the cache lacks is an error naming it. Each
    /// file's report says what the cache did
    /// ([`FileReport::cache`](crate::report::FileReport::cache)).
    pub fn hub_cache(mut self, on: bool) -> Self {
        self.opts.hub_cache = Some(on);
        self
    }

    /// A cache directory for `s3://`, `gs://`, `az://` and `http(s)://`
    /// checkpoints (feature `remote`; none by default, or
    /// `SAFELOAD_CACHE_DIR`): each file is read from it where it holds the
    /// object at its current length and ETag (asked of the store at open, as
    /// always), else fetched and written to it as it is read, published once
    /// every byte is in. A replaced object has another ETag, so it is
    /// fetched again, never read stale.
    pub fn cache_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.opts.cache_dir = Some(dir.into());
        self
    }

    /// Splits the load's reads between the nodes of a job, through the
    /// engine's own communicator (see [`Communicator`](crate::cluster::Communicator)):
    /// each node reads its share of the buffered files from storage and
    /// receives the rest, each range checked by its SHA-256; where the nodes
    /// do not load the same files (names, lengths, versions, plans) or one
    /// cannot take part (a converting or verifying load), each reads alone
    /// and the report's notes say why. Call it on every process: a node's
    /// local rank 0 takes part, its other local ranks map the node copy it
    /// fills (a process given none reads its node's files alone). Without
    /// it, `SAFELOAD_EXCHANGE=mpi` joins an MPI job (feature `mpi`).
    ///
    /// ```
    /// # use std::io;
    /// # struct Alone;
    /// # impl safeload::cluster::Communicator for Alone {
    /// #     fn node(&self) -> usize { 0 }
    /// #     fn nodes(&self) -> usize { 1 }
    /// #     fn all_gather(&self, mine: &[u8]) -> io::Result<Vec<Vec<u8>>> { Ok(vec![mine.to_vec()]) }
    /// #     fn broadcast(&self, _: usize, _: &mut [u8]) -> io::Result<()> { Ok(()) }
    /// # }
    /// # let nccl = Alone;
    /// let loader = safeload::Loader::new().disable_mmap(true).exchange(nccl);
    /// # let _ = loader;
    /// ```
    pub fn exchange(mut self, communicator: impl crate::cluster::Communicator + 'static) -> Self {
        self.opts.exchange = Some(Arc::new(communicator));
        self
    }

    #[doc(hidden)]
    /// Decides filesystems from this mount table instead of the process's own
    /// (for tests, and for reasoning about another machine's mounts).
    pub fn mount_table(mut self, table: MountTable) -> Self {
        self.opts.mount_table = Some(table);
        self
    }

    /// Stops this loader's loads and opens, blocking and async, once `flag`
    /// is `true`: a load stops before its next read (each reader in flight
    /// finishes the local one it holds, a [`read_size`](Self::read_size)
    /// chunk; a remote request in flight is dropped within 20 ms), frees what
    /// it read, publishes nothing to a cache from then on, and fails with
    /// [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled) naming the
    /// checkpoint; one started while `flag` is `true` fails at once. The
    /// crate only reads `flag`: set it back to `false` to load again.
    ///
    /// The flag is checked when a load starts, once its files are open, by
    /// each reader of the read loop before every piece it takes (a read, a
    /// populate, a conversion; a chunk of a [`prefetch`](Self::prefetch) or
    /// of the one copy per node of local ranks), and every 20 ms by each
    /// remote request (feature `remote`: resolving, opening and reading).
    /// Opening local files and the hashing of [`verify`](Self::verify) run to
    /// their end before it is seen; an open
    /// checks it when it starts. [`warm`](Self::warm), and the reads of a
    /// `Checkpoint` opened with this loader, do not check it;
    /// its loads to a device (`Checkpoint::to_device`)
    /// do, as a load does.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4], &[1, 2, 3, 4])?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicBool, Ordering};
    ///
    /// let shutdown = Arc::new(AtomicBool::new(false));
    /// let loader = safeload::Loader::new().cancel_on(Arc::clone(&shutdown));
    /// assert!(loader.load(&path).is_ok());
    ///
    /// shutdown.store(true, Ordering::Relaxed);       // from any thread
    /// let err = loader.load(&path).unwrap_err();
    /// assert_eq!(err.kind(), &safeload::ErrorKind::Cancelled);
    /// assert_eq!(err.path(), Some(path.as_path()));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel_on(mut self, flag: Arc<AtomicBool>) -> Self {
        self.opts.cancel = std::mem::take(&mut self.opts.cancel).with_caller(flag);
        self
    }

    /// The staging ring of a load to a device (`safeload::device`):
    /// `buffers` buffers of `bytes` each, the host memory such a load takes
    /// whatever the checkpoint's size (pinned memory on a GPU), and the most
    /// one copy moves. Default 4 of 32 MiB; at least one buffer of 4 KiB.
    /// Two buffers already overlap reads with copies; more keep readers busy
    /// while copies queue.
    pub fn staging(mut self, buffers: usize, bytes: usize) -> Self {
        self.opts.staging = Some((buffers, bytes));
        self
    }
}
