//! Where a file's bytes come from: the `Source` seam, and its first implementation, a local file.
//!
//! A source answers what a load needs of a file without saying how it gets
//! it: its length, a positional read into the caller's buffer, its version
//! (so that one load reads one version of it), and the facts the policy
//! decides from (the mount it is on). What only a file on this machine can do
//! (be mapped, bypass the page cache, be warmed in it) is reached through
//! [`Source::local`], so that a source without those (a remote object) is read
//! buffered by the same engine. The contract is written out in
//! `docs/ARCHITECTURE.md`, "The two seams".

mod cache_use;
mod local;

use std::io;
use std::path::Path;

pub use cache_use::{CacheStore, CacheUse, NotCached};
pub use local::DirectGuard;
pub use local::LocalFile;

use crate::error::{Error, ErrorKind, Operation};
use crate::mount::Mount;

/// One version of a file, as seen when it was opened: what must not change
/// while a load reads it.
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
    /// A remote object: the entity tag its server gave (required by
    /// `If-Match` on every later request), or the version id.
    ETag(String),
    /// Nothing better is known (a platform without inode numbers, a server
    /// that gives no ETag).
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
    /// The path (or, for a remote source, the address) named in reports and
    /// errors.
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

    /// The local file behind this source, for what only it can do (a map,
    /// direct I/O, the page cache); `None` for a source that is not a file
    /// of this machine.
    fn local(&self) -> Option<&LocalFile> {
        None
    }

    /// The SHA-256 its store publishes for it, where it publishes one (the
    /// hub's LFS object id): what `Loader::verify` checks it against.
    fn published_sha256(&self) -> Option<[u8; 32]> {
        None
    }

    /// What a cache did for the file, where it came through one (feature
    /// `remote`: the hub cache, a cache directory).
    fn cache_use(&self) -> Option<CacheUse> {
        None
    }

    /// The hub commit the file is at, for a file of an `hf://` checkpoint
    /// (fetched, or read from the hub cache).
    fn commit(&self) -> Option<&str> {
        None
    }

    /// The entity tag of the remote object the file is (or was fetched as),
    /// which every read of it required.
    fn etag(&self) -> Option<&str> {
        match &self.version().tag {
            VersionTag::ETag(etag) => Some(etag),
            _ => None,
        }
    }

    /// The cache write of a file fetched through a cache, for a load that
    /// gets the file's bytes otherwise than by its own reads (a node copy).
    fn cache_write(&self) -> Option<&dyn CacheWrite> {
        None
    }

    /// Whether the source is fetched whole by one request rather than read
    /// in ranges (a remote server that ignores `Range`): the report says so.
    fn fetched_whole(&self) -> bool {
        false
    }

    /// The crate's error for a failure [`read_at`](Self::read_at) returned,
    /// where the source made that failure itself and says more than its I/O
    /// kind (a remote object: the status, address and byte range); `None`
    /// for an ordinary I/O error, which the crate maps.
    fn own_error(&self, _operation: Operation, _error: &io::Error) -> Option<Error> {
        None
    }
}

/// A cache written as a file is fetched (a second place its bytes go): what
/// a load may tell it besides the reads it sees.
#[doc(hidden)]
pub trait CacheWrite: Send + Sync {
    /// The reads from now on are not written: the file's bytes reach the
    /// load another way (a node copy), and [`write_image`](Self::write_image)
    /// or [`abandon`](Self::abandon) says what becomes of the cache's copy.
    fn pause(&self);

    /// The reads from now on are written again.
    fn resume(&self);

    /// Writes the whole file from `image` (its bytes, all of them: a node
    /// copy), then checks and publishes it as a fetched file would be.
    fn write_image(&self, image: &[u8]);

    /// The file being written, its space reserved, for the load to map
    /// shared as the destination of its reads, which then land once, in
    /// the page cache, and are published once every byte is in and checked
    /// (the reads still go through the source, which hashes them); `None`
    /// where the write cannot begin, has begun, or its space cannot be
    /// reserved (a full disk would then fault the map).
    fn map_destination(&self) -> Option<std::fs::File>;

    /// The file of [`map_destination`](Self::map_destination) is mapped
    /// shared at these addresses of this process: a read landing there at
    /// its own offset is in the file already.
    fn mapped_at(&self, addresses: std::ops::Range<usize>);

    /// The file is not written to the cache, for this reason.
    fn abandon(&self, why: NotCached);

    /// A guard whose drop waits for the file's digest check, kept with the
    /// file's tensors: from then on the check of the complete file goes on
    /// on a thread of its own instead of the read that completes it, and a
    /// process that drops the tensors has published what it wrote.
    fn settle_on_drop(&self) -> Box<dyn Send + Sync>;

    /// The load returned its tensors: from now on its cancel flag does not
    /// stop the file being published (a check under way finishes).
    fn load_returned(&self);

    /// What became of the file once its check (if one is under way) is
    /// over: waits for it.
    fn settled(&self) -> CacheUse;

    /// Where the file is published, or will be once its digest is checked,
    /// where it was written whole; `None` otherwise.
    fn published_path(&self) -> Option<std::path::PathBuf>;
}

/// The error of a failed read of `source` (`operation` says of what) at
/// `offset`, `expected` being the length it was opened with: the source's own
/// error where it made one, a file that ended early reported as having
/// shrunk, else the I/O error naming the file and offset.
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
