//! A checkpoint opened: its files resolved and opened once, their headers read and checked, each file's way of being read decided; the tensors known by name before any of their bytes is read.

mod device;
mod read;
mod stream;

use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use safetensors::Dtype;

use crate::error::{Error, ErrorKind, Result};
use crate::execute::Run;
use crate::extras::{Extras, Installed, NoExtras};
use crate::file::{self, OpenedFile};
use crate::options::Options;
use crate::policy::Environment;
use crate::report::{DirectIo, FileReport, LoadNote, LoadReport};
use crate::resolve::{self, Resolved, ShardFile};
use crate::state_dict::StateDict;

/// A checkpoint opened from its headers alone: which tensors it holds, of
/// what dtype and shape, in which file, before any tensor byte is read; then
/// exactly the bytes an engine asks for.
///
/// Opening reads each file's header (and maps the files the policy maps,
/// which reads nothing), so a checkpoint of hundreds of GiB opens in
/// milliseconds. Reads follow the same rules per file as
/// `Loader::load`: a mapped file hands out views of
/// its map, a file that must not be mapped (FUSE, `disable_mmap(true)`) is
/// read with positional reads of exactly the bytes asked for.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data: Vec<u8> = (0..24u8).collect();
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4, 6], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// use safeload::Checkpoint;
///
/// let ck = Checkpoint::open(&path)?;            // headers only
/// let info = ck.get("w").unwrap();
/// assert_eq!((info.dtype(), info.shape(), info.nbytes()), (safeload::Dtype::U8, &[4, 6][..], 24));
///
/// let w = ck.read("w")?;                        // one tensor
/// assert_eq!(w.as_bytes(), &data[..]);
/// let mut mine = vec![0u8; 24];                 // or into memory of the caller's own
/// ck.read_into("w", &mut mine)?;
/// assert_eq!(mine, data);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// A `Checkpoint` is `Send + Sync` and cheap to clone (its state is shared):
/// threads of an engine can read from one at once.
///
/// `X` is what it reads beyond local paths, as for `Loader`.
pub struct Checkpoint<X = NoExtras> {
    inner: Arc<Inner>,
    extras: PhantomData<fn() -> X>,
}

impl<X> Clone for Checkpoint<X> {
    fn clone(&self) -> Self {
        Checkpoint {
            inner: Arc::clone(&self.inner),
            extras: PhantomData,
        }
    }
}

struct Inner {
    opts: Options,
    env: Environment,
    resolved: Resolved,
    files: Vec<OpenedFile>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<Arc<str>, usize>,
    metadata: BTreeMap<String, String>,
    /// The report of the opening, made once.
    report: LoadReport,
    path: PathBuf,
}

/// One tensor of an opened checkpoint, as its header describes it.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// let ck = safeload::Checkpoint::open(&path)?;
/// let info = ck.get("w").unwrap();
/// assert_eq!((info.dtype(), info.shape(), info.nbytes()), (safeload::Dtype::F32, &[2, 3][..], 24));
/// assert!(info.is_float());
/// assert_eq!(info.file(), path);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    name: Arc<str>,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Which file of the checkpoint holds it.
    pub(crate) file: usize,
    /// Where its bytes start in that file, and how many.
    pub(crate) offset: u64,
    pub(crate) nbytes: u64,
    path: Arc<Path>,
}

impl TensorInfo {
    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its element type.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Its shape; empty for a 0-dimensional scalar.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements (1 for a scalar).
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The bytes of its data in the file.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// Whether its dtype is a floating-point type (what
    /// `Loader::dtype` converts, and the F8, F6, F4
    /// and complex types it leaves as they are).
    pub fn is_float(&self) -> bool {
        crate::format::is_float(self.dtype)
    }

    /// The range of dimension `dim` that
    /// `Checkpoint::shard(name, dim, rank, world)`
    /// returns, split as `torch.tensor_split` does (the first `len % world`
    /// parts one longer); `None` where that call fails (`dim` out of range,
    /// `world == 0`, `rank >= world`).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data = vec![0u8; 10 * 4];
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![10], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// let w = ck.get("w").unwrap();
    /// assert_eq!(w.shard_range(0, 0, 4), Some(0..3)); // 10 rows in 4 parts: 3, 3, 2, 2
    /// assert_eq!(w.shard_range(0, 3, 4), Some(8..10));
    /// assert_eq!(ck.shard("w", 0, 3, 4)?.shape(), [2]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shard_range(&self, dim: usize, rank: usize, world: usize) -> Option<Range<usize>> {
        crate::slice::split_range(*self.shape.get(dim)?, rank, world)
    }

    /// The file that holds it (as opened: symlinks not resolved).
    pub fn file(&self) -> &Path {
        &self.path
    }
}

impl<X> std::fmt::Debug for Checkpoint<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.inner.path)
            .field("files", &self.inner.files.len())
            .field("tensors", &self.inner.tensors.len())
            .finish_non_exhaustive()
    }
}

impl<X: Extras + Default + 'static> Checkpoint<X> {
    /// Opens the checkpoint at `path` (a `.safetensors` file, an index, or a
    /// directory holding one) with the default options: the same as
    /// `Loader::new().open(path)`. Resolves it with the same rules and checks
    /// as a load, and reads only the headers.
    ///
    /// # Errors
    ///
    /// As `Loader::load` for resolving the files and
    /// reading their headers.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let opts = Options {
            extras: Installed(Arc::new(X::default())),
            ..Options::default()
        };
        open_with(opts, path.as_ref())
    }
}

impl<X> Checkpoint<X> {
    /// The same checkpoint, its type of extras left behind: they resolve an
    /// address, which an opened checkpoint is past (for the plug-in crates:
    /// an engine's backend holds one type of checkpoint, whatever opened it).
    #[doc(hidden)]
    pub fn plain(self) -> Checkpoint {
        Checkpoint {
            inner: self.inner,
            extras: PhantomData,
        }
    }

    /// Loads the tensors whose name passes `keep` from this opened
    /// checkpoint, through the parallel read engine, with the options it was
    /// opened with: the same as a `Loader::load` with
    /// a filter, without opening or parsing anything again. Files that hold
    /// none of them are not read.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data = vec![0u8; 8];
    /// # let views = ["a.w", "a.b", "b.w"].map(|n| (n, safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![8], &data).unwrap()));
    /// # safetensors::serialize_to_file(views, None, &path)?;
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// let layer_a = ck.load_filtered(|name| name.starts_with("a."))?;
    /// assert_eq!(layer_a.names().collect::<Vec<_>>(), ["a.b", "a.w"]); // file order
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As `Loader::load`.
    pub fn load_filtered(&self, keep: impl Fn(&str) -> bool + Send + Sync) -> Result<StateDict> {
        let inner = &*self.inner;
        let files: Vec<(&OpenedFile, u64)> = inner
            .files
            .iter()
            .filter(|f| f.header().tensors.iter().any(|t| keep(&t.name)))
            .map(|f| (f, 0))
            .collect();
        Run {
            opts: &inner.opts,
            resolved: &inner.resolved,
            env: &inner.env,
            keep: Some(&keep),
            clock: Instant::now(),
            notes: Vec::new(),
            path: &inner.path,
            exchange: None,
            member: false,
        }
        .finish(&files)
    }

    fn inner(&self) -> &Inner {
        &self.inner
    }

    /// The tensors in load order: file by file (shards sorted by name), by
    /// offset within each.
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = &TensorInfo> + '_ {
        self.inner.tensors.iter()
    }

    /// The tensor called `name`, if the checkpoint has one.
    pub fn get(&self, name: &str) -> Option<&TensorInfo> {
        self.inner
            .by_name
            .get(name)
            .and_then(|&i| self.inner.tensors.get(i))
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.inner.tensors.len()
    }

    /// Whether the checkpoint holds no tensor.
    pub fn is_empty(&self) -> bool {
        self.inner.tensors.is_empty()
    }

    /// The bytes of all tensors' data.
    pub fn total_bytes(&self) -> u64 {
        self.inner.tensors.iter().map(|t| t.nbytes).sum()
    }

    /// The files' `__metadata__` entries merged (the first file that sets a
    /// key wins), as [`StateDict::metadata`](crate::StateDict::metadata).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.inner.metadata
    }

    /// The `metadata` object of the sharded index, for a sharded checkpoint
    /// that has one: string values as they are, others (numbers such as
    /// `total_size`) as their JSON text.
    pub fn index_metadata(&self) -> Option<&BTreeMap<String, String>> {
        self.inner
            .resolved
            .index
            .as_ref()
            .and_then(|i| i.metadata.as_ref())
    }

    /// The files, in load order, as they were opened: their paths.
    pub fn files(&self) -> impl ExactSizeIterator<Item = &Path> + '_ {
        self.inner.files.iter().map(|f| f.path())
    }

    /// How each file is read and why (mapped, or read with positional
    /// reads), with its filesystem: a [`LoadReport`] of the opening, in
    /// which no tensor byte has been read yet. By reference, as
    /// [`StateDict::report`].
    pub fn report(&self) -> &LoadReport {
        &self.inner.report
    }

    /// The info of `name`, or [`ErrorKind::TensorNotFound`].
    pub(crate) fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.get(name).ok_or_else(|| self.not_found(name))
    }

    fn not_found(&self, name: &str) -> Error {
        let tensor = name.to_string();
        Error::new(ErrorKind::TensorNotFound { tensor }, &self.inner.path)
    }

    /// The info of `name` ([`ErrorKind::TensorNotFound`] naming the
    /// checkpoint where it has none), and whether its file is mapped (its
    /// tensors views of the map) rather than read with positional reads: for
    /// the plug-in crates, which read a tensor of a read file straight into
    /// storage of their own.
    #[doc(hidden)]
    pub fn info_mapped(&self, name: &str) -> Result<(&TensorInfo, bool)> {
        let info = self.info(name)?;
        Ok((info, self.file_of(info)?.map().is_some()))
    }

    /// The open file holding `info`.
    pub(crate) fn file_of(&self, info: &TensorInfo) -> Result<&OpenedFile> {
        let file = self.inner.files.get(info.file);
        file.ok_or_else(|| self.not_found(&info.name))
    }
}

/// The tensors of opened files, in load order, found by name, and their
/// merged metadata.
type Catalogue = (
    Vec<TensorInfo>,
    HashMap<Arc<str>, usize>,
    BTreeMap<String, String>,
);

/// The catalogue of opened files.
fn catalogue(files: &[OpenedFile]) -> Catalogue {
    // One allocation per name and per path, shared by the list and the map:
    // a header can hold over a million tensors.
    let count = files.iter().map(|f| f.header().tensors.len()).sum();
    let mut tensors = Vec::with_capacity(count);
    let mut by_name = HashMap::with_capacity(count);
    let mut metadata = BTreeMap::new();
    for (index, file) in files.iter().enumerate() {
        let path: Arc<Path> = Arc::from(file.path());
        let header = file.header();
        for entry in &header.tensors {
            let name: Arc<str> = Arc::from(entry.name.as_str());
            by_name.insert(Arc::clone(&name), tensors.len());
            tensors.push(TensorInfo {
                name,
                dtype: entry.dtype,
                shape: entry.shape.clone(),
                file: index,
                offset: header.data_start + entry.start,
                nbytes: entry.end - entry.start,
                path: Arc::clone(&path),
            });
        }
        if let Some(meta) = &header.metadata {
            for (k, v) in meta {
                metadata.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    (tensors, by_name, metadata)
}

/// Opens the checkpoint at `path` from its headers alone, with `opts`: the
/// one open path (`file::open_all`), every file kept open.
pub(crate) fn open_with<X>(opts: Options, path: &Path) -> Result<Checkpoint<X>> {
    let clock = Instant::now();
    let env = Environment::from_process();
    // An open reads headers, and verifies nothing; the reads of the
    // checkpoint it returns are the caller's, which no flag stops
    // (`Loader::cancel_on`).
    let caching = resolve::Caching {
        verify: false,
        cancel: &crate::cancel::Cancel::NONE,
        ..opts.caching()
    };
    let resolved = resolve::resolve(path, caching, &*opts.extras)?;
    let shards: Vec<&ShardFile> = resolved.shards.iter().collect();
    let (files, mut notes) = file::open_all(&opts, &resolved, &shards, &env, clock)?;
    notes.extend(file::fetched_whole(&files));
    let (tensors, by_name, metadata) = catalogue(&files);
    let mut report = opening_report(&files, notes, clock.elapsed());
    report.extra_files = resolved.extra_files();
    Ok(Checkpoint {
        extras: PhantomData,
        inner: Arc::new(Inner {
            opts,
            env,
            resolved,
            files,
            tensors,
            by_name,
            metadata,
            report,
            path: path.to_path_buf(),
        }),
    })
}

/// The report of an opening: per file how it is read and why, nothing read.
fn opening_report(files: &[OpenedFile], notes: Vec<LoadNote>, elapsed: Duration) -> LoadReport {
    let files = files
        .iter()
        .map(|f| FileReport {
            path: f.path().to_path_buf(),
            size: f.size(),
            tensors: f.header().tensors.len(),
            tensor_bytes: f.header().tensors.iter().map(|t| t.end - t.start).sum(),
            bytes_read: 0,
            strategy: f.decision().strategy,
            reason: f.decision().reason(),
            fallback: f.decision().fallback.clone(),
            direct_io: DirectIo::Off,
            mount: f.source().mount().cloned(),
            elapsed: Duration::ZERO,
            metadata: f.header().metadata.clone(),
            sha256: None,
            converted: 0,
            overflowed: 0,
            node_copy: None,
            cache: f.source().cache_use(),
            commit: f.source().commit().map(str::to_owned),
            etag: f.source().etag().map(str::to_owned),
        })
        .collect();
    LoadReport {
        files,
        elapsed,
        threads: 0,
        io_concurrency: 0,
        prefetch: None,
        fresh_memory: None,
        notes,
        io_concurrency_reason: None,
        extra_files: BTreeMap::new(),
    }
}

// Engines read from one checkpoint on many threads.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Checkpoint>();
    assert_send_sync::<TensorInfo>();
};
