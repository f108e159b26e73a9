//! The cache directory of other stores (`s3://`, `gs://`, `az://`, `http(s)://`): an object's bytes kept under its length and ETag, so that a replaced object is a miss, never stale bytes.
//!
//! ```text
//! <dir>/safeload-objects/<h(address)>/address                 the address, for listings
//!                                    /<len>-<h(etag)>/<name>  the object's bytes, by its name
//! ```
//!
//! An ETag is no digest: a file is published once every byte was read under `If-Match`,
//! and read back only where this user (or root) owns it.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use super::layout::{self, ADDRESS_FILE, OBJECTS_FOLDER};
use super::partial;
use super::temp::{self, nonce};
use super::write::{Target, TempFile};
use crate::os::{self, Dir, EntryKind};
use crate::source::{CacheStore, NotCached};

/// A cache directory.
#[derive(Debug, Clone)]
pub(crate) struct StoreCache {
    root: PathBuf,
}

impl StoreCache {
    pub(crate) fn new(root: PathBuf) -> StoreCache {
        StoreCache { root }
    }

    /// The cached bytes of the object at `address` (`len`, `etag`), opened, and their path;
    /// `None` where the cache has none this user can trust.
    pub(crate) fn lookup(&self, address: &str, len: u64, etag: &str) -> Option<(PathBuf, File)> {
        let target = self.target(address, len, etag);
        let (_, dir) = target.folders(false).ok()?;
        let file = trusted(dir.open_nofollow(&target.name).ok()?, len)?;
        Some((target.shown(), file))
    }

    /// Where the object's bytes are written as they are fetched.
    pub(crate) fn target(&self, address: &str, len: u64, etag: &str) -> StoreTarget {
        StoreTarget {
            root: self.root.clone(),
            folder: layout::object_folder(address),
            version: layout::object_version(len, etag),
            name: object_name(address),
            address: address.to_owned(),
        }
    }
}

/// `file`, where this user (or root) owns it and it is `len` bytes long.
fn trusted(file: File, len: u64) -> Option<File> {
    let meta = file.metadata().ok()?;
    let owner = os::file_owner(&meta);
    let trusted = owner.is_some() && (owner == os::effective_uid() || owner == Some(0));
    (trusted && meta.len() == len).then_some(file)
}

/// The name an object's bytes are kept by: its address's last part, where plain.
fn object_name(address: &str) -> String {
    let last = address.rsplit('/').next().unwrap_or_default();
    if layout::is_plain(last) && !layout::is_temp_name(last) && last != ADDRESS_FILE {
        last.to_owned()
    } else {
        "object".to_owned()
    }
}

/// One object version written to a cache directory.
pub(crate) struct StoreTarget {
    root: PathBuf,
    folder: String,
    version: String,
    name: String,
    address: String,
}

impl StoreTarget {
    /// The object's folder, and its version's (made where missing, where `create`).
    fn folders(&self, create: bool) -> io::Result<(Dir, Dir)> {
        if create {
            std::fs::create_dir_all(&self.root)?;
        }
        let object = Dir::open(&self.root)?
            .sub(OBJECTS_FOLDER, create)?
            .sub(&self.folder, create)?;
        let version = object.sub(&self.version, create)?;
        Ok((object, version))
    }
}

impl Target for StoreTarget {
    fn store(&self) -> CacheStore {
        CacheStore::Directory
    }

    fn shown(&self) -> PathBuf {
        self.root
            .join(OBJECTS_FOLDER)
            .join(&self.folder)
            .join(&self.version)
            .join(&self.name)
    }

    fn begin(&self, len: u64) -> Result<TempFile, NotCached> {
        let unwritable = |e: io::Error| NotCached::of_io(&e);
        let (object, dir) = self.folders(true).map_err(unwritable)?;
        temp::sweep(&dir, &dir);
        // The address first, for listings (a few bytes; kept if there).
        if matches!(object.entry(ADDRESS_FILE), Ok(EntryKind::Missing)) {
            let temp = layout::temp_name(ADDRESS_FILE, nonce());
            if let Ok(file) = object.create_new(&temp) {
                let written = os::write_all_at(&file, self.address.as_bytes(), 0);
                drop(file);
                let moved = written.and_then(|()| object.rename_noreplace(&temp, ADDRESS_FILE));
                if !matches!(moved, Ok(true)) {
                    let _ = object.remove(&temp);
                }
            }
        }
        // Its lock beside it.
        let locks = dir.sub(".", false).ok();
        TempFile::make(dir, &self.name, len, locks)
    }

    fn published(&self, len: u64) -> Option<File> {
        let (_, dir) = self.folders(true).ok()?;
        trusted(dir.open_nofollow(&self.name).ok()?, len)
    }

    fn activity(&self) -> partial::Activity {
        match self.folders(true) {
            Ok((_, dir)) => partial::activity(&dir, &self.name),
            Err(_) => partial::Activity::default(),
        }
    }

    fn publish(&self, begun: &TempFile) -> io::Result<bool> {
        let published = begun.dir.rename_noreplace(&begun.temp, &self.name)?;
        begun.moved.store(published, Ordering::Relaxed);
        Ok(published)
    }
}
