//! Where a file's bytes come from: the `Source` seam, and its first implementation, a local file.
//!
//! What only a file of this machine can do (a map, direct I/O, the page
//! cache) is reached through [`Source::local`]; other sources are read
//! buffered by the same engine (`docs/ARCHITECTURE.md`, "The two seams").

mod cache_use;
mod local;

use std::io;
use std::path::Path;

pub use cache_use::{CacheStore, CacheUse, NotCached};
pub use local::{DirectGuard, LocalFile};

use crate::error::{Error, ErrorKind, Operation};
use crate::mount::Mount;

/// One version of a file, as opened: what must not change while it is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version {
    /// Its length in bytes.
    pub len: u64,
    /// What tells this version from another of the same length.
    pub tag: VersionTag,
}

/// The part of a [`Version`] a source can vouch for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VersionTag {
    /// A file of a filesystem: device, inode and modification time (ns).
    Inode {
        /// The device the file is on.
        dev: u64,
        /// Its inode number there.
        ino: u64,
        /// Its modification time, in nanoseconds since the epoch.
        mtime_ns: i128,
    },
    /// A remote object: the entity tag its server gave, or the version id.
    ETag(String),
    /// Nothing better is known.
    Unknown,
}

/// Where one file's bytes come from.
///
/// # Contract
///
/// - [`len`](Self::len) and [`version`](Self::version) are facts of the open
///   that never change for this value.
/// - [`read_at`](Self::read_at) fills `dst` from `offset`, retrying short
///   reads, until at least `required` bytes have arrived (all of `dst` where
///   the file is long enough); it reads the version that was opened or fails,
///   never another one; on failure it names the offset that failed. It may be
///   called from many threads at once.
/// - Nothing here blocks forever: a source that waits on a network bounds its
///   waits and fails with an error naming what it waited for.
pub trait Source: Send + Sync {
    /// The path (or address) named in reports and errors.
    fn path(&self) -> &Path;

    /// The file's length in bytes, when opened.
    fn len(&self) -> u64 {
        self.version().len
    }

    /// Whether the file had no byte when opened.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The version that was opened.
    fn version(&self) -> &Version;

    /// A positional read (see the trait's contract).
    fn read_at(&self, dst: &mut [u8], required: usize, offset: u64)
    -> Result<(), (u64, io::Error)>;

    /// The mount the file is on, where known: what the policy decides from.
    fn mount(&self) -> Option<&Mount>;

    /// The local file behind this source, where it is one.
    fn local(&self) -> Option<&LocalFile> {
        None
    }

    /// The SHA-256 its store publishes for it (the hub's LFS object id).
    fn published_sha256(&self) -> Option<[u8; 32]> {
        None
    }

    /// What a cache did for the file, where it came through one.
    fn cache_use(&self) -> Option<CacheUse> {
        None
    }

    /// The hub commit the file is at, for a file of an `hf://` checkpoint.
    fn commit(&self) -> Option<&str> {
        None
    }

    /// The entity tag of the remote object the file is (or was fetched as).
    fn etag(&self) -> Option<&str> {
        match &self.version().tag {
            VersionTag::ETag(etag) => Some(etag),
            _ => None,
        }
    }

    /// The cache write of a file fetched through a cache.
    fn cache_write(&self) -> Option<&dyn CacheWrite> {
        None
    }

    /// Whether the source is fetched whole by one request (a server that
    /// ignores `Range`).
    fn fetched_whole(&self) -> bool {
        false
    }

    /// The crate's error for a failure [`read_at`](Self::read_at) returned,
    /// where the source says more than its I/O kind; `None` for the crate
    /// to map it.
    fn own_error(&self, _operation: Operation, _error: &io::Error) -> Option<Error> {
        None
    }
}

/// A cache written as a file is fetched: what a load may tell it besides
/// the reads it sees.
#[doc(hidden)]
pub trait CacheWrite: Send + Sync {
    /// The reads from now on are not written (the bytes come from a node
    /// copy); [`write_image`](Self::write_image) or
    /// [`abandon`](Self::abandon) says what becomes of the cache's copy.
    fn pause(&self);

    /// The reads from now on are written again.
    fn resume(&self);

    /// Writes the whole file from `image`, then checks and publishes it.
    fn write_image(&self, image: &[u8]);

    /// The file being written, its space reserved, for the load to map
    /// shared as the destination of its reads (which still go through the
    /// source); `None` where the write cannot begin, has begun, or its space
    /// cannot be reserved (a full disk would then fault the map).
    fn map_destination(&self) -> Option<std::fs::File>;

    /// The file of [`map_destination`](Self::map_destination) is mapped at
    /// these addresses: a read landing there is in the file already.
    fn mapped_at(&self, addresses: std::ops::Range<usize>);

    /// The file is not written to the cache, for this reason.
    fn abandon(&self, why: NotCached);

    /// A guard, kept with the file's tensors, whose drop waits for the
    /// file's digest check (which then runs on a thread of its own).
    fn settle_on_drop(&self) -> Box<dyn Send + Sync>;

    /// The load returned its tensors: its cancel flag no longer stops the
    /// file being published.
    fn load_returned(&self);

    /// What became of the file, once a check under way is over.
    fn settled(&self) -> CacheUse;

    /// Where the file written whole is (or will be) published.
    fn published_path(&self) -> Option<std::path::PathBuf>;
}

/// Fills `dst` from `source` at `offset`, retrying short reads; a failure
/// as [`read_error`] words it.
pub(crate) fn read_exact(source: &dyn Source, dst: &mut [u8], offset: u64) -> Result<(), Error> {
    let len = dst.len();
    let read = source.read_at(dst, len, offset);
    read.map_err(|(at, e)| read_error(Operation::Read, source, source.len(), at, e))
}

/// The error of a failed read of `source` at `offset` (`expected`: its
/// length when opened): the source's own, a file that shrank, else the I/O
/// error naming the file and offset.
pub fn read_error(
    operation: Operation,
    source: &dyn Source,
    expected: u64,
    offset: u64,
    error: io::Error,
) -> Error {
    if let Some(own) = source.own_error(operation, &error) {
        return own;
    }
    if error.kind() == io::ErrorKind::UnexpectedEof {
        if let Some(Ok(actual)) = source.local().map(LocalFile::len_now) {
            if actual < expected {
                return Error::new(ErrorKind::SizeMismatch { expected, actual }, source.path());
            }
        }
    }
    Error::io(operation, source.path(), Some(offset), error)
}
