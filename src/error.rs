//! The crate's one error type: what went wrong, and the file it went wrong on.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use safetensors::Dtype;

/// A specialized `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error from loading a checkpoint or reading a tensor.
///
/// It carries what went wrong ([`Error::kind`]), the file it went wrong on
/// ([`Error::path`]) and, for I/O, the underlying cause (through
/// [`std::error::Error::source`]). `Display` prints this layer's message and the
/// path once; the cause is left to `source()` so that error reporters such as
/// `anyhow` do not print it twice.
///
/// ```
/// use safeload::{ErrorKind, load_state_dict};
///
/// let err = load_state_dict("/no/such/checkpoint", None).unwrap_err();
/// assert!(matches!(err.kind(), ErrorKind::Io { .. }));
/// assert_eq!(err.path().unwrap(), std::path::Path::new("/no/such/checkpoint"));
/// ```
pub struct Error(Box<Inner>);

struct Inner {
    kind: ErrorKind,
    path: Option<PathBuf>,
    source: Option<io::Error>,
}

/// What went wrong. Match on it; new kinds may be added.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An I/O call failed; the `io::Error` is the [`source`](std::error::Error::source).
    Io {
        /// What was being done: "opening", "reading", "mapping", ...
        operation: &'static str,
        /// The byte offset in the file, for reads.
        offset: Option<u64>,
    },
    /// The path is a directory that holds no checkpoint this crate can pick
    /// without guessing.
    NoCheckpoint {
        /// What the directory holds that looked relevant (safetensors files
        /// and index files), sorted; empty when it holds none.
        found: Vec<String>,
    },
    /// The file is shorter than the 8 bytes that give the header length.
    FileTooSmall {
        /// The file's length in bytes.
        len: u64,
    },
    /// The header length field exceeds the format's limit.
    HeaderTooLarge {
        /// The header length the file claims.
        len: u64,
        /// The largest header accepted.
        limit: u64,
    },
    /// The header length field points past the end of the file.
    HeaderOutOfBounds {
        /// The header length the file claims.
        len: u64,
        /// The file's length in bytes.
        file_len: u64,
    },
    /// The header is not a valid safetensors header (not UTF-8, not JSON, bad
    /// tensor entries, inconsistent offsets, duplicate names, ...).
    InvalidHeader {
        /// What is wrong with it.
        reason: String,
    },
    /// The file's length is not what its header describes: it was truncated,
    /// has bytes after the tensor data, or changed while it was being read.
    SizeMismatch {
        /// The length the header implies.
        expected: u64,
        /// The length found.
        actual: u64,
    },
    /// The sharded index (`*.safetensors.index.json`) is malformed.
    InvalidIndex {
        /// What is wrong with it.
        reason: String,
    },
    /// The index names a shard that escapes the checkpoint directory (an
    /// absolute name, `..`, a path separator, an empty name, a NUL). It is
    /// never opened.
    UnsafeShardName {
        /// The name as written in the index.
        name: String,
    },
    /// The index maps a tensor to a shard whose header lacks it.
    TensorNotInShard {
        /// The tensor's name.
        tensor: String,
        /// The shard the index names for it.
        shard: String,
    },
    /// The same tensor name appears in two shards, or twice in the index.
    DuplicateTensor {
        /// The tensor's name.
        tensor: String,
        /// The file it was first found in.
        first: PathBuf,
    },
    /// A typed view or conversion asked for a type that does not match the
    /// tensor's dtype.
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
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// The alignment the type needs, in bytes.
        align: usize,
    },
    /// A buffered read would need more memory than the machine (or the
    /// cgroup) has available.
    InsufficientMemory {
        /// Bytes the read would allocate.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// A dtype conversion between these two types is not supported.
    UnsupportedConversion {
        /// The tensor's name, where one is involved (empty otherwise).
        tensor: String,
        /// The source dtype.
        from: Dtype,
        /// The requested dtype.
        to: Dtype,
    },
    /// A destination buffer does not have the length the data needs.
    LengthMismatch {
        /// The tensor's name, where one is involved (empty otherwise).
        tensor: String,
        /// The bytes needed.
        expected: u64,
        /// The bytes given.
        actual: u64,
    },
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
            | ErrorKind::Misaligned { tensor, .. } => Some(tensor),
            _ => None,
        }
    }

    /// The underlying I/O error, for [`ErrorKind::Io`].
    pub fn io_error(&self) -> Option<&io::Error> {
        self.0.source.as_ref()
    }

    pub(crate) fn new(kind: ErrorKind, path: impl Into<PathBuf>) -> Error {
        Error(Box::new(Inner {
            kind,
            path: Some(path.into()),
            source: None,
        }))
    }

    pub(crate) fn without_path(kind: ErrorKind) -> Error {
        Error(Box::new(Inner {
            kind,
            path: None,
            source: None,
        }))
    }

    pub(crate) fn io(
        operation: &'static str,
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

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io {
                operation,
                offset: Some(offset),
            } => write!(f, "I/O error while {operation} at offset {offset}"),
            ErrorKind::Io {
                operation,
                offset: None,
            } => write!(f, "I/O error while {operation}"),
            ErrorKind::NoCheckpoint { found } if found.is_empty() => write!(
                f,
                "no checkpoint found: expected model.safetensors, \
                 model.safetensors.index.json or a single *.safetensors file"
            ),
            ErrorKind::NoCheckpoint { found } => write!(
                f,
                "cannot tell which checkpoint to load: expected model.safetensors, \
                 model.safetensors.index.json or a single *.safetensors file, found {}",
                found.join(", ")
            ),
            ErrorKind::FileTooSmall { len } => write!(
                f,
                "file of {len} bytes is too small to be safetensors (at least 8 bytes)"
            ),
            ErrorKind::HeaderTooLarge { len, limit } => {
                write!(f, "header length {len} exceeds the limit of {limit} bytes")
            }
            ErrorKind::HeaderOutOfBounds { len, file_len } => write!(
                f,
                "header length {len} runs past the end of the {file_len}-byte file"
            ),
            ErrorKind::InvalidHeader { reason } => {
                write!(f, "invalid safetensors header: {reason}")
            }
            ErrorKind::SizeMismatch { expected, actual } if actual < expected => write!(
                f,
                "file is truncated: the header describes {expected} bytes, the file has {actual}"
            ),
            ErrorKind::SizeMismatch { expected, actual } => write!(
                f,
                "file size mismatch: the header describes {expected} bytes, the file has {actual}"
            ),
            ErrorKind::InvalidIndex { reason } => write!(f, "invalid checkpoint index: {reason}"),
            ErrorKind::UnsafeShardName { name } => write!(
                f,
                "index names shard {name:?}, which is not a plain file name in the checkpoint directory"
            ),
            ErrorKind::TensorNotInShard { tensor, shard } => write!(
                f,
                "index maps tensor {tensor:?} to shard {shard:?}, which does not contain it"
            ),
            ErrorKind::DuplicateTensor { tensor, first } => write!(
                f,
                "tensor {tensor:?} appears twice (first in {})",
                first.display()
            ),
            ErrorKind::DtypeMismatch {
                tensor,
                actual,
                requested,
            } => write!(
                f,
                "tensor {tensor:?} has dtype {actual}, which cannot be viewed as {requested}"
            ),
            ErrorKind::Misaligned { tensor, align } => write!(
                f,
                "tensor {tensor:?} is not aligned to {align} bytes in the mapped file; \
                 load buffered or use a converting accessor"
            ),
            ErrorKind::InsufficientMemory { needed, available } => write!(
                f,
                "a buffered read needs {needed} bytes but only {available} are available"
            ),
            ErrorKind::UnsupportedConversion { tensor, from, to } if tensor.is_empty() => {
                write!(f, "cannot convert {from} to {to}")
            }
            ErrorKind::UnsupportedConversion { tensor, from, to } => {
                write!(f, "cannot convert tensor {tensor:?} from {from} to {to}")
            }
            ErrorKind::LengthMismatch {
                tensor,
                expected,
                actual,
            } if tensor.is_empty() => {
                write!(
                    f,
                    "buffer of {actual} bytes given where {expected} are needed"
                )
            }
            ErrorKind::LengthMismatch {
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "buffer of {actual} bytes given for tensor {tensor:?}, which needs {expected}"
            ),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.path {
            Some(path) => write!(f, "{}: {}", path.display(), self.0.kind),
            None => fmt::Display::fmt(&self.0.kind, f),
        }
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

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0
            .source
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}
