//! The public options of a prefetch (`PrefetchOptions`): what is prefetch's own, not the job's; a plain options struct the warm-up (`Extras::warm_up`) and the share step read.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::policy::PrefetchMethod;

/// Readers per rank when prefetch is on and no number is given.
#[doc(hidden)] // for the plug-in crates
pub const DEFAULT_STREAMS: usize = 4;

/// The unit of work readers and ranks share, by default: large enough for
/// requests in flight on FUSE, small enough to balance ranks (BENCHMARKS.md).
#[doc(hidden)] // for the plug-in crates
pub const DEFAULT_CHUNK: u64 = 8 << 20;

/// What [`PrefetchOptions::on_chunk`] calls, shared by the readers.
#[doc(hidden)] // for the plug-in crates
pub type ChunkCallback = Arc<dyn Fn(&Path, Range<u64>) + Send + Sync>;

/// The options of a prefetch, set as one expression.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data = vec![0u8; 1 << 16];
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![1 << 16], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// use safeload::{Loader, report::PrefetchMethod, PrefetchOptions};
///
/// let options = PrefetchOptions::new()
///     .streams(8)                      // readers in this process
///     .method(PrefetchMethod::Pread)   // instead of the measured default
///     .on_chunk(|path, range| eprintln!("{}: {range:?} warm", path.display()));
/// let report = Loader::new().prefetch_with(options.clone()).warm(&path)?;
/// assert_eq!((report.streams, report.method), (8, PrefetchMethod::Pread));
///
/// // The job's settings (local rank, memory) are the loader's, for a load and
/// // for a prefetch alone alike.
/// let loader = Loader::new().local_rank(0, 1).prefetch_with(options);
/// let report = loader.warm(&path)?;                 // warm only
/// let sd = loader.load(&path)?;                     // warm, then load
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct PrefetchOptions {
    streams: usize,
    method: PrefetchMethod,
    chunk_size: Option<usize>,
    shared_queue: bool,
    queue_dir: Option<PathBuf>,
    on_chunk: Option<ChunkCallback>,
}

impl Default for PrefetchOptions {
    fn default() -> Self {
        PrefetchOptions {
            streams: DEFAULT_STREAMS,
            method: PrefetchMethod::Auto,
            chunk_size: None,
            shared_queue: true,
            queue_dir: None,
            on_chunk: None,
        }
    }
}

impl fmt::Debug for PrefetchOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrefetchOptions")
            .field("streams", &self.streams)
            .field("method", &self.method)
            .field("chunk_size", &self.chunk_size)
            .field("shared_queue", &self.shared_queue)
            .field("queue_dir", &self.queue_dir)
            .field("on_chunk", &self.on_chunk.as_ref().map(|_| "<fn>"))
            .finish()
    }
}

impl PrefetchOptions {
    /// Four streams per rank, rank from the launcher, method by filesystem,
    /// 8 MiB chunks, the shared queue in `/dev/shm`.
    pub fn new() -> PrefetchOptions {
        PrefetchOptions::default()
    }

    /// The readers set by [`streams`](Self::streams).
    #[doc(hidden)] // for the plug-in crates
    pub fn stream_count(&self) -> usize {
        self.streams
    }

    /// The method set by [`method`](Self::method).
    #[doc(hidden)] // for the plug-in crates
    pub fn warm_method(&self) -> PrefetchMethod {
        self.method
    }

    /// The chunk size set by [`chunk_size`](Self::chunk_size), if any.
    #[doc(hidden)] // for the plug-in crates
    pub fn chunk_bytes(&self) -> Option<usize> {
        self.chunk_size
    }

    /// Whether the ranks share one queue file ([`shared_queue`](Self::shared_queue)).
    #[doc(hidden)] // for the plug-in crates
    pub fn shares_queue(&self) -> bool {
        self.shared_queue
    }

    /// The queue's directory set by [`queue_dir`](Self::queue_dir), if any.
    #[doc(hidden)] // for the plug-in crates
    pub fn queue_directory(&self) -> Option<&Path> {
        self.queue_dir.as_deref()
    }

    /// The callback set by [`on_chunk`](Self::on_chunk), if any.
    #[doc(hidden)] // for the plug-in crates
    pub fn chunk_callback(&self) -> Option<&ChunkCallback> {
        self.on_chunk.as_ref()
    }

    /// Readers in this process (default 4). Zero turns prefetch off.
    pub fn streams(mut self, streams: usize) -> PrefetchOptions {
        self.streams = streams;
        self
    }

    /// How chunks are warmed (default: by filesystem kind).
    pub fn method(mut self, method: PrefetchMethod) -> PrefetchOptions {
        self.method = method;
        self
    }

    /// The unit of work shared between readers and ranks (default 8 MiB;
    /// whole pages, at least 64 KiB). Every rank of a job must use the same.
    pub fn chunk_size(mut self, bytes: usize) -> PrefetchOptions {
        self.chunk_size = Some(bytes);
        self
    }

    /// Whether the local ranks share one queue file (default `true`); else
    /// each rank warms a fixed share.
    pub fn shared_queue(mut self, shared: bool) -> PrefetchOptions {
        self.shared_queue = shared;
        self
    }

    /// Where the queue file lives (default `/dev/shm`, else the temporary
    /// directory). All ranks of a job must agree.
    pub fn queue_dir(mut self, dir: impl Into<PathBuf>) -> PrefetchOptions {
        self.queue_dir = Some(dir.into());
        self
    }

    /// Calls `f(path, byte range)` from a reader thread as each chunk this
    /// process handled is warm (a slow `f` delays the other ranks).
    pub fn on_chunk(mut self, f: impl Fn(&Path, Range<u64>) + Send + Sync + 'static) -> Self {
        self.on_chunk = Some(Arc::new(f));
        self
    }
}
