//! The crate's one error type: what went wrong, and the file it went wrong on.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use safetensors::Dtype;

mod remote;

pub use remote::RemoteFailure;

/// A specialized `Result` whose error is [`Error`].
///
/// ```
/// fn names(path: &std::path::Path) -> safeload::Result<Vec<String>> {
///     let ck = safeload::Checkpoint::open(path)?;
///     Ok(ck.tensors().map(|t| t.name().to_string()).collect())
/// }
/// assert!(names(std::path::Path::new("/no/such/checkpoint")).is_err());
/// ```
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from loading a checkpoint or reading a tensor.
///
/// It carries what went wrong ([`Error::kind`]), the file it went wrong on
/// ([`Error::path`]) and, for I/O, the OS's error ([`Error::io_error`]).
/// `Display` prints the path, this layer's message and, for I/O, the OS's
/// reason, once: `/m/model.safetensors: I/O error while opening: No such
/// file or directory`. Since the reason is in the message,
/// [`source`](std::error::Error::source) gives what lies below the OS error
/// (usually nothing), so that reporters such as `anyhow` do not print it
/// twice.
///
/// Programs branch on [`is_not_found`](Error::is_not_found) ("the
/// checkpoint, a file of it or a tensor is missing"),
/// [`is_corrupt`](Error::is_corrupt) ("the bytes are not a valid
/// checkpoint") and [`ErrorKind::Io`] (the storage failed), or match the
/// [`ErrorKind`] for the details; a remote checkpoint's failure says why
/// as data ([`remote_failure`](Error::remote_failure): repository,
/// revision or file not found, access denied, offline, unreachable, ...),
/// and an address the crate cannot read is [`ErrorKind::BadAddress`].
///
/// ```
/// use safeload::error::Operation;
/// use safeload::{ErrorKind, load_state_dict};
///
/// let err = load_state_dict("/no/such/checkpoint", None).unwrap_err();
/// assert!(err.is_not_found() && !err.is_corrupt());
/// assert!(matches!(err.kind(), ErrorKind::Io { operation: Operation::Stat, .. }));
/// assert_eq!(err.path().unwrap(), std::path::Path::new("/no/such/checkpoint"));
/// assert_eq!(
///     err.to_string(),
///     "/no/such/checkpoint: I/O error while reading the metadata: No such file or directory (os error 2)"
/// );
/// ```
#[derive(thiserror::Error)]
#[error(transparent)]
pub struct Error(Box<Inner>);

/// What an I/O call that failed was doing ([`ErrorKind::Io`]).
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
/// # let shard = std::fs::read_dir(dir.path())?.map(|e| e.unwrap().path())
/// #     .find(|p| p.extension().is_some_and(|e| e == "safetensors")).unwrap();
/// std::fs::remove_file(&shard)?;                 // a shard the index names is gone
/// let err = safeload::load_state_dict(&index, None).unwrap_err();
/// assert!(matches!(
///     err.kind(),
///     safeload::ErrorKind::Io { operation: safeload::error::Operation::Open, .. }
/// ));
/// assert_eq!(err.path(), Some(shard.as_path()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Opening a file, or the checkpoint's directory.
    Open,
    /// Listing the checkpoint's directory.
    List,
    /// Reading a file's metadata (its length, its version).
    Stat,
    /// Reading a file's bytes.
    Read,
    /// Mapping a file into memory.
    Map,
    /// Faulting a map's pages in (`Loader::populate`).
    Populate,
    /// Allocating the memory a file's tensors are read into.
    Allocate,
    /// Making a filled buffer read-only.
    Seal,
    /// Converting tensors read from a file.
    Convert,
    /// Computing a file's SHA-256.
    Hash,
    /// Warming the page cache with a file.
    Prefetch,
    /// Dropping a file from the page cache.
    Evict,
    /// Writing a file (the demo checkpoint).
    Write,
    /// Moving a file's bytes between the nodes of a job, or agreeing on
    /// them (`SAFELOAD_EXCHANGE`).
    Exchange,
    /// Removing names from the Hugging Face cache (`hub_cache_remove`,
    /// `hub_cache_prune`, feature `remote`).
    Remove,
    /// Copying bytes to a device's memory, or getting the memory and the
    /// staging buffers to do so (`Loader::load_to_device`).
    Device,
}

impl Operation {
    /// The operation in words, as `Display` says it after "while".
    fn words(self) -> &'static str {
        match self {
            Operation::Open => "opening",
            Operation::List => "listing",
            Operation::Stat => "reading the metadata",
            Operation::Read => "reading",
            Operation::Map => "mapping",
            Operation::Populate => "populating the map",
            Operation::Allocate => "allocating a buffer",
            Operation::Seal => "sealing the buffer",
            Operation::Convert => "converting",
            Operation::Hash => "hashing",
            Operation::Prefetch => "prefetching",
            Operation::Evict => "evicting from the page cache",
            Operation::Write => "writing",
            Operation::Exchange => "exchanging between nodes",
            Operation::Remove => "removing from the hub cache",
            Operation::Device => "copying to the device",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.words())
    }
}

/// Boxed so that `Result<T, Error>` stays one pointer wide.
#[derive(Debug)]
struct Inner {
    kind: ErrorKind,
    path: Option<PathBuf>,
    source: Option<io::Error>,
}

impl fmt::Display for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", Prefix(self.path.as_deref()), self.kind)?;
        // The OS's reason is part of the message ("... while opening:
        // No such file or directory"), so that a plain `{}` says what
        // happened; `source()` then skips the `io::Error` (see `Error`).
        // A remote error's reason is its kind's (the `io::Error` is for its
        // kind only).
        if let (Some(cause), ErrorKind::Io { .. }) = (&self.source, &self.kind) {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Inner {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().and_then(|e| e.source())
    }
}

/// `"<path>: "` where there is a path, nothing otherwise.
struct Prefix<'a>(Option<&'a Path>);

impl fmt::Display for Prefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(path) => write!(f, "{}: ", path.display()),
            None => Ok(()),
        }
    }
}

/// What went wrong. Match on it; new kinds may be added.
///
/// `Display` gives this layer's message, lowercase and without the path or
/// the cause (those are [`Error`]'s).
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// std::fs::write(&path, b"not a checkpoint")?;
/// let err = safeload::load_state_dict(&path, None).unwrap_err();
/// match err.kind() {
///     safeload::ErrorKind::HeaderTooLarge { len, limit } => assert!(len > limit),
///     other => panic!("unexpected: {other}"),
/// }
/// assert!(err.is_corrupt());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An I/O call failed; [`Error::io_error`] gives the OS's error.
    #[error("I/O error while {operation}{}", at_offset(*offset))]
    Io {
        /// What was being done.
        operation: Operation,
        /// The byte offset in the file, for reads.
        offset: Option<u64>,
    },
    /// The path is a directory that holds no checkpoint this crate can pick
    /// without guessing.
    #[error("{}", no_checkpoint(found))]
    NoCheckpoint {
        /// What the directory holds that looked relevant (safetensors files
        /// and index files), sorted; empty when it holds none.
        found: Vec<String>,
    },
    /// The file is shorter than the 8 bytes that give the header length.
    #[error("file of {len} bytes is too small to be safetensors (at least 8 bytes)")]
    FileTooSmall {
        /// The file's length in bytes.
        len: u64,
    },
    /// The header length field exceeds the format's limit.
    #[error("header length {len} exceeds the limit of {limit} bytes")]
    HeaderTooLarge {
        /// The header length the file claims.
        len: u64,
        /// The largest header accepted.
        limit: u64,
    },
    /// The header length field points past the end of the file.
    #[error("header length {len} runs past the end of the {file_len}-byte file")]
    HeaderOutOfBounds {
        /// The header length the file claims.
        len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// The header is not a valid safetensors header (not UTF-8, not JSON, bad
    /// tensor entries, inconsistent offsets, duplicate names, ...).
    #[error("invalid safetensors header: {reason}")]
    InvalidHeader {
        /// What is wrong with it.
        reason: String,
    },
    /// The file's length is not what its header describes: it was truncated,
    /// has bytes after the tensor data, or changed while it was being read.
    #[error("{}", size_mismatch(*expected, *actual))]
    SizeMismatch {
        /// The length the header implies.
        expected: u64,
        /// The length found.
        actual: u64,
    },
    /// The sharded index (`*.safetensors.index.json`) is malformed.
    #[error("invalid checkpoint index: {reason}")]
    InvalidIndex {
        /// What is wrong with it.
        reason: String,
    },
    /// The index names a shard that escapes the checkpoint directory (an
    /// absolute name, `..`, a path separator, an empty name, a NUL). It is
    /// never opened.
    #[error(
        "index names shard {name:?}, which is not a plain file name in the checkpoint directory"
    )]
    UnsafeShardName {
        /// The name as written in the index.
        name: String,
    },
    /// A remote address, or a repository id or revision given to the hub
    /// cache's housekeeping, that is not one the crate reads: no known
    /// scheme, a name the hub does not take (`hf://acme/bad--name`: letters,
    /// digits, `-`, `_`, `.`, no `--` or `..`), a `.` or `..` part
    /// (`hf://a/b/../c`), a bad `?with=` name. Refused before any request
    /// or any name of the cache is looked at. The error's path is the
    /// address (without credentials), also where it was given as a
    /// repository id and a revision (`hf://org/name@revision`).
    #[error("bad remote address: {reason}")]
    BadAddress {
        /// What is wrong with it.
        reason: String,
    },
    /// The index maps a tensor to a shard whose header lacks it.
    #[error("index maps tensor {tensor:?} to shard {shard:?}, which does not contain it")]
    TensorNotInShard {
        /// The tensor's name.
        tensor: String,
        /// The shard the index names for it.
        shard: String,
    },
    /// The same tensor name appears in two shards, or twice in the index.
    #[error("tensor {tensor:?} appears twice (first in {})", first.display())]
    DuplicateTensor {
        /// The tensor's name.
        tensor: String,
        /// The file it was first found in.
        first: PathBuf,
    },
    /// A typed view or conversion asked for a type that does not match the
    /// tensor's dtype.
    #[error("tensor {tensor:?} has dtype {actual}, which cannot be viewed as {requested}")]
    DtypeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The dtype of the tensor.
        actual: Dtype,
        /// The dtypes the requested type can view.
        requested: &'static str,
    },
    /// A zero-copy view was asked of a tensor whose bytes are not aligned for
    /// its type (only possible for memory-mapped files written without
    /// alignment; the converting accessors copy instead).
    #[error(
        "tensor {tensor:?} is not aligned to {align} bytes in the mapped file; \
         load buffered or use a converting accessor"
    )]
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// The alignment the type needs, in bytes.
        align: usize,
    },
    /// A buffered read would need more memory than the machine (or the
    /// cgroup) has available.
    #[error("a buffered read needs {needed} bytes but only {available} are available")]
    InsufficientMemory {
        /// Bytes the read would allocate.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// A dtype conversion between these two types is not supported.
    #[error("cannot convert {}{from} to {to}", of_tensor(tensor.as_deref()))]
    UnsupportedConversion {
        /// The tensor's name, where one is involved.
        tensor: Option<String>,
        /// The source dtype.
        from: Dtype,
        /// The requested dtype.
        to: Dtype,
    },
    /// A file's SHA-256 is not the one it must have (the name of its
    /// Hugging Face cache blob, or `Loader::expect_sha256`):
    /// corrupt, truncated and regrown, or another file.
    #[error("SHA-256 mismatch: expected {expected}, the file has {actual}")]
    IntegrityMismatch {
        /// The digest it must have, in hex.
        expected: String,
        /// The digest of its bytes, in hex.
        actual: String,
    },
    /// A digest given to `Loader::expect_sha256`
    /// is not 64 hex digits.
    #[error("expected SHA-256 {digest:?} of {file:?} is not 64 hex digits")]
    InvalidDigest {
        /// The file name it was given for.
        file: String,
        /// What was given.
        digest: String,
    },
    /// No tensor of this name in the checkpoint.
    #[error("no tensor {tensor:?} in the checkpoint")]
    TensorNotFound {
        /// The name asked for.
        tensor: String,
    },
    /// A slice or a tensor-parallel part that the tensor does not have: a
    /// dimension out of range, `rank >= world`, `world == 0`, more ranges than
    /// dimensions, a range backwards or past its dimension, or a packed type
    /// (F4, F6) cut off a byte boundary.
    #[error("cannot slice tensor {tensor:?}: {reason}")]
    InvalidSlice {
        /// The tensor's name.
        tensor: String,
        /// What is wrong with the slice.
        reason: String,
    },
    /// A destination buffer does not have the length the data needs.
    #[error(
        "buffer of {actual} bytes given {}where {expected} are needed",
        for_tensor(tensor.as_deref())
    )]
    LengthMismatch {
        /// The tensor's name, where one is involved.
        tensor: Option<String>,
        /// The bytes needed.
        expected: u64,
        /// The bytes given.
        actual: u64,
    },
    /// A remote checkpoint's store or server (`s3://`, `hf://`, `https://`
    /// and the others of the feature `remote`) refused a request, failed
    /// after its retries, or answered for another version of the object
    /// than the one opened. The error's path is the object's address,
    /// without credentials; `failure` says why, as data
    /// ([`Error::remote_failure`]); [`Error::is_not_found`] is true where the
    /// repository, revision or file does not exist (or offline, the cache
    /// lacks it), and [`Error::io_error`]'s kind is `PermissionDenied` where
    /// access was denied.
    #[error("remote error while {operation}{}: {reason}", bytes(range.as_ref()))]
    Remote {
        /// What was being done.
        operation: Operation,
        /// The bytes of the object asked for, for a read.
        range: Option<std::ops::Range<u64>>,
        /// Why it failed.
        failure: RemoteFailure,
        /// What happened, in words (the failure's, then the detail),
        /// credentials removed.
        reason: String,
    },
    /// The load was cancelled: its flag
    /// (`Loader::cancel_on`) was set, or its
    /// future (`Loader::load_async`) dropped.
    /// The path is the checkpoint's.
    #[error("the load was cancelled")]
    Cancelled,
}

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0.kind
    }

    /// The file (or directory) it went wrong on, where there is one.
    pub fn path(&self) -> Option<&Path> {
        self.0.path.as_deref()
    }

    /// The name of the tensor involved, for the kinds that have one.
    pub fn tensor(&self) -> Option<&str> {
        match &self.0.kind {
            ErrorKind::TensorNotInShard { tensor, .. }
            | ErrorKind::DuplicateTensor { tensor, .. }
            | ErrorKind::DtypeMismatch { tensor, .. }
            | ErrorKind::Misaligned { tensor, .. }
            | ErrorKind::TensorNotFound { tensor }
            | ErrorKind::InvalidSlice { tensor, .. } => Some(tensor),
            ErrorKind::UnsupportedConversion { tensor, .. }
            | ErrorKind::LengthMismatch { tensor, .. } => tensor.as_deref(),
            _ => None,
        }
    }

    /// Whether something asked for does not exist: the checkpoint or one
    /// of its files (an open that failed with `ENOENT`), a directory with
    /// no checkpoint in it, a tensor of that name, or a remote repository,
    /// revision, file or object, also one the hub cache lacks offline
    /// ([`RemoteFailure`]).
    pub fn is_not_found(&self) -> bool {
        match &self.0.kind {
            ErrorKind::Io { .. } => self
                .io_error()
                .is_some_and(|e| e.kind() == io::ErrorKind::NotFound),
            ErrorKind::Remote { failure, .. } => failure.is_not_found(),
            ErrorKind::NoCheckpoint { .. } | ErrorKind::TensorNotFound { .. } => true,
            _ => false,
        }
    }

    /// Whether the bytes are not a valid checkpoint: a header, an index or
    /// a length that breaks the format's rules, a shard name that escapes
    /// the directory, a tensor twice or in the wrong shard, or a file whose
    /// SHA-256 is not the one expected. Reading it again will not help.
    pub fn is_corrupt(&self) -> bool {
        matches!(
            self.0.kind,
            ErrorKind::FileTooSmall { .. }
                | ErrorKind::HeaderTooLarge { .. }
                | ErrorKind::HeaderOutOfBounds { .. }
                | ErrorKind::InvalidHeader { .. }
                | ErrorKind::SizeMismatch { .. }
                | ErrorKind::InvalidIndex { .. }
                | ErrorKind::UnsafeShardName { .. }
                | ErrorKind::TensorNotInShard { .. }
                | ErrorKind::DuplicateTensor { .. }
                | ErrorKind::IntegrityMismatch { .. }
        )
    }

    /// The underlying I/O error, for [`ErrorKind::Io`]; for
    /// [`ErrorKind::Remote`], one of the kind its failure matches
    /// (`NotFound`, `PermissionDenied`, `TimedOut`, `Other`, ...) carrying
    /// the same reason.
    pub fn io_error(&self) -> Option<&io::Error> {
        self.0.source.as_ref()
    }

    pub fn new(kind: ErrorKind, path: impl Into<PathBuf>) -> Error {
        Error(Box::new(Inner {
            kind,
            path: Some(path.into()),
            source: None,
        }))
    }

    /// The same error, naming `path` where it names no file yet.
    pub(crate) fn or_path(mut self, path: impl Into<PathBuf>) -> Error {
        if self.0.path.is_none() {
            self.0.path = Some(path.into());
        }
        self
    }

    pub(crate) fn without_path(kind: ErrorKind) -> Error {
        Error(Box::new(Inner {
            kind,
            path: None,
            source: None,
        }))
    }

    pub fn io(
        operation: Operation,
        path: impl Into<PathBuf>,
        offset: Option<u64>,
        source: io::Error,
    ) -> Error {
        Error(Box::new(Inner {
            kind: ErrorKind::Io { operation, offset },
            path: Some(path.into()),
            source: Some(source),
        }))
    }
}

fn bytes(range: Option<&std::ops::Range<u64>>) -> String {
    range
        .map(|r| format!(" (bytes {}..{})", r.start, r.end))
        .unwrap_or_default()
}

fn at_offset(offset: Option<u64>) -> String {
    offset
        .map(|o| format!(" at offset {o}"))
        .unwrap_or_default()
}

fn no_checkpoint(found: &[String]) -> String {
    const EXPECTED: &str =
        "expected model.safetensors, model.safetensors.index.json or a single *.safetensors file";
    if found.is_empty() {
        format!("no checkpoint found: {EXPECTED}")
    } else {
        format!(
            "cannot tell which checkpoint to load: {EXPECTED}, found {}",
            found.join(", ")
        )
    }
}

fn size_mismatch(expected: u64, actual: u64) -> String {
    if actual < expected {
        format!("file is truncated: the header describes {expected} bytes, the file has {actual}")
    } else {
        format!("file size mismatch: the header describes {expected} bytes, the file has {actual}")
    }
}

fn of_tensor(tensor: Option<&str>) -> String {
    tensor
        .map(|t| format!("tensor {t:?} from "))
        .unwrap_or_default()
}

fn for_tensor(tensor: Option<&str>) -> String {
    tensor
        .map(|t| format!("for tensor {t:?} "))
        .unwrap_or_default()
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("path", &self.0.path)
            .field("source", &self.0.source)
            .finish()
    }
}
