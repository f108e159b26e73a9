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

/// An error from loading a checkpoint or reading a tensor: what went wrong ([`Error::kind`]),
/// the file ([`Error::path`]) and, for I/O, the OS's error ([`Error::io_error`]).
///
/// `Display` prints the path, the message and the OS's reason once; so that reporters such as
/// `anyhow` do not print that twice, [`source`](std::error::Error::source) gives what lies
/// below the OS error. Programs branch on [`is_not_found`](Error::is_not_found),
/// [`is_corrupt`](Error::is_corrupt), [`ErrorKind::Io`] or
/// [`remote_failure`](Error::remote_failure), or match the [`ErrorKind`].
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
    /// Moving a file's bytes between the nodes of a job (`SAFELOAD_EXCHANGE`).
    Exchange,
    /// Removing names from the hub cache (`hub_cache_remove`, `hub_cache_prune`).
    Remove,
    /// Copying bytes to a device's memory, or getting that memory (`Loader::load_to_device`).
    Device,
}

/// The operation in words, as an error says it after "while".
impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
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
        })
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
        if let Some(path) = &self.path {
            write!(f, "{}: ", path.display())?;
        }
        write!(f, "{}", self.kind)?;
        // The OS's reason is in the message, so `source()` skips the `io::Error`; a remote
        // error's reason is already its kind's.
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

/// What went wrong. Match on it; new kinds may be added. `Display` gives this layer's message,
/// without the path or the cause (those are [`Error`]'s).
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
    #[error("I/O error while {operation}{}", some(*offset, |o| format!(" at offset {o}")))]
    Io {
        /// What was being done.
        operation: Operation,
        /// The byte offset in the file, for reads.
        offset: Option<u64>,
    },
    /// The path is a directory that holds no checkpoint to pick without guessing.
    #[error("{}", no_checkpoint(found))]
    NoCheckpoint {
        /// The safetensors and index files the directory holds, sorted.
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
    /// The header is not a valid safetensors header (not JSON, bad entries or offsets, ...).
    #[error("invalid safetensors header: {reason}")]
    InvalidHeader {
        /// What is wrong with it.
        reason: String,
    },
    /// The file's length is not what its header describes (truncated, trailing bytes, changed).
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
    /// The index names a shard that escapes the checkpoint directory; it is never opened.
    #[error(
        "index names shard {name:?}, which is not a plain file name in the checkpoint directory"
    )]
    UnsafeShardName {
        /// The name as written in the index.
        name: String,
    },
    /// A remote address (or a repository id or revision given to the hub cache's housekeeping)
    /// the crate does not read: no known scheme, a name the hub does not take
    /// (`hf://acme/bad--name`), a `..` part, a bad `?with=` name. Refused before any request;
    /// the error's path is the address without credentials.
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
    /// A typed view or conversion asked for a type that does not match the tensor's dtype.
    #[error("tensor {tensor:?} has dtype {actual}, which cannot be viewed as {requested}")]
    DtypeMismatch {
        /// The tensor's name.
        tensor: String,
        /// The dtype of the tensor.
        actual: Dtype,
        /// The dtypes the requested type can view.
        requested: &'static str,
    },
    /// A zero-copy view of a tensor not aligned for its type (in a mapped file; the converting
    /// accessors copy instead).
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
    /// A buffered read would need more memory than the machine (or the cgroup) has available.
    #[error("a buffered read needs {needed} bytes but only {available} are available")]
    InsufficientMemory {
        /// Bytes the read would allocate.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// A dtype conversion between these two types is not supported.
    #[error(
        "cannot convert {}{from} to {to}",
        some(tensor.as_deref(), |t| format!("tensor {t:?} from "))
    )]
    UnsupportedConversion {
        /// The tensor's name, where one is involved.
        tensor: Option<String>,
        /// The source dtype.
        from: Dtype,
        /// The requested dtype.
        to: Dtype,
    },
    /// A file's SHA-256 is not the one it must have (its hub cache blob's name, or
    /// `Loader::expect_sha256`).
    #[error("SHA-256 mismatch: expected {expected}, the file has {actual}")]
    IntegrityMismatch {
        /// The digest it must have, in hex.
        expected: String,
        /// The digest of its bytes, in hex.
        actual: String,
    },
    /// A digest given to `Loader::expect_sha256` is not 64 hex digits.
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
    /// A slice or a tensor-parallel part that the tensor does not have (a range out of bounds,
    /// `rank >= world`, a packed type cut off a byte boundary, ...).
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
        some(tensor.as_deref(), |t| format!("for tensor {t:?} "))
    )]
    LengthMismatch {
        /// The tensor's name, where one is involved.
        tensor: Option<String>,
        /// The bytes needed.
        expected: u64,
        /// The bytes given.
        actual: u64,
    },
    /// A remote store or server (feature `remote`) refused a request, failed after its
    /// retries, or answered for another version of the object. The error's path is the
    /// object's address, without credentials; `failure` says why, as data.
    #[error(
        "remote error while {operation}{}: {reason}",
        some(range.as_ref(), |r| format!(" (bytes {}..{})", r.start, r.end))
    )]
    Remote {
        /// What was being done.
        operation: Operation,
        /// The bytes of the object asked for, for a read.
        range: Option<std::ops::Range<u64>>,
        /// Why it failed.
        failure: RemoteFailure,
        /// What happened, in words, credentials removed.
        reason: String,
    },
    /// The load was cancelled (`Loader::cancel_on`, or its future dropped).
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

    /// Whether something asked for does not exist: a file (`ENOENT`), a checkpoint in a
    /// directory, a tensor, or a remote repository, revision or file ([`RemoteFailure`]).
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

    /// Whether the bytes are not a valid checkpoint (its header, index, lengths, names or
    /// SHA-256): reading it again will not help.
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

    /// The underlying I/O error, for [`ErrorKind::Io`]; for [`ErrorKind::Remote`], one of its
    /// failure's [`io_kind`](RemoteFailure::io_kind) with the same reason.
    pub fn io_error(&self) -> Option<&io::Error> {
        self.0.source.as_ref()
    }

    fn make(kind: ErrorKind, path: Option<PathBuf>, source: Option<io::Error>) -> Error {
        Error(Box::new(Inner { kind, path, source }))
    }

    pub fn new(kind: ErrorKind, path: impl Into<PathBuf>) -> Error {
        Error::make(kind, Some(path.into()), None)
    }

    /// The same error, naming `path` where it names no file yet.
    pub(crate) fn or_path(mut self, path: impl Into<PathBuf>) -> Error {
        if self.0.path.is_none() {
            self.0.path = Some(path.into());
        }
        self
    }

    pub(crate) fn without_path(kind: ErrorKind) -> Error {
        Error::make(kind, None, None)
    }

    pub fn io(
        operation: Operation,
        path: impl Into<PathBuf>,
        offset: Option<u64>,
        source: io::Error,
    ) -> Error {
        let kind = ErrorKind::Io { operation, offset };
        Error::make(kind, Some(path.into()), Some(source))
    }
}

/// A message's optional part: `f` of the value, or nothing.
fn some<T>(value: Option<T>, f: impl FnOnce(T) -> String) -> String {
    value.map(f).unwrap_or_default()
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

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.0.kind)
            .field("path", &self.0.path)
            .field("source", &self.0.source)
            .finish()
    }
}
