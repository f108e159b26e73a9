//! The cache's own files as a load's sources: a snapshot file or a blob found there (a hit, reported with the commit or ETag it is at), and the digest a file to be verified needs where its name vouches for none.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use super::hub::{self, Cached};
use super::{HubMode, Mode, Remote, layout};
use crate::error::{Error, ErrorKind, Operation, RemoteFailure, Result};
use crate::format::MAX_INDEX_BYTES;
use crate::mount::MountTable;
use crate::remote::object::RemoteObject;
use crate::source::{CacheStore, LocalFile, Source};

use super::source::Hit;

impl Remote {
    /// A snapshot file to be verified that is no link to a named blob, with the hub's
    /// SHA-256 of it (one HEAD); refused where there is none (offline, no LFS).
    pub(super) fn with_digest(&self, name: &str, mut cached: Cached) -> Result<Cached> {
        let Mode::Hub(hub) = &self.mode else {
            return Ok(cached);
        };
        if !hub.verify || !cached.plain || cached.sha256.is_some() {
            return Ok(cached);
        }
        let refuse = |failure, why: &str| {
            let detail = format!(
                "cannot verify a snapshot file that is not a link to a blob named by its \
                 SHA-256: {why}"
            );
            let path = cached.path.clone();
            let e = Error::remote_failed(Operation::Hash, path, None, failure, &detail);
            Err(e)
        };
        if hub.offline {
            return refuse(RemoteFailure::OfflineNotCached, "the hub's digest of it");
        }
        let digest = match self.checkpoint.location().hub_lookup(name) {
            Some(Ok((_, Some(meta)))) => meta.sha256().and_then(crate::verify::parse_hex),
            Some(Err(e)) => return Err(e.into_error(Operation::Hash)),
            _ => None,
        };
        if digest.is_none() {
            return refuse(RemoteFailure::Protocol, "the hub gives no SHA-256 of it");
        }
        cached.sha256 = digest;
        Ok(cached)
    }

    /// The blob of a file the snapshot lacks but the cache has: linked from the snapshot
    /// and opened, as the hub's client does, where it is a regular file of the right length.
    pub(super) fn blob_of(
        &self,
        hub: &HubMode,
        object: &RemoteObject,
        name: &str,
    ) -> Option<Cached> {
        let view = hub.view.as_ref()?;
        let writer = hub.writer.as_ref()?;
        let blob = blob_name(object);
        layout::named_digest(&blob)?;
        let file = view.blob(&blob)?;
        if file.metadata().ok()?.len() != object.len() {
            return None;
        }
        let path = format!("{}{name}", hub.prefix);
        writer.link(&path, &blob).ok()?;
        let _ = writer.record();
        Some(Cached {
            path: view.snapshot_path(&hub.commit, &path),
            file,
            sha256: hub::sha256_of_name(&blob),
            plain: false,
        })
    }
}

/// The blob name the hub's client gives a file: its linked ETag, else its ETag.
pub(super) fn blob_name(object: &RemoteObject) -> String {
    object
        .hub()
        .and_then(|m| m.linked_etag.clone())
        .or_else(|| object.etag().map(str::to_owned))
        .map(|e| layout::blob_name_of_etag(&e))
        .unwrap_or_default()
}

/// Which cache a hit came from, and what names its version there.
pub(super) enum HitOf<'a> {
    /// The hub cache's snapshot of this commit.
    Hub(&'a str),
    /// A cache directory, where the object had this entity tag.
    Directory(String),
}

/// A file of the cache as the ordinary local source, reported as a hit.
pub(super) fn hit_of(
    cached: Cached,
    table: Option<&MountTable>,
    of: HitOf<'_>,
) -> Result<Arc<dyn Source>> {
    let Cached {
        path, file, sha256, ..
    } = cached;
    let local = LocalFile::new(path.clone(), file, table)
        .map_err(|e| Error::io(Operation::Stat, path, None, e))?;
    let (store, commit, etag) = match of {
        HitOf::Hub(commit) => (CacheStore::Hub, Some(commit.to_owned()), None),
        HitOf::Directory(etag) => (CacheStore::Directory, None, Some(etag)),
    };
    Ok(Arc::new(Hit {
        local,
        store,
        sha256,
        commit,
        etag,
    }))
}
/// A cached index, read whole (refused past the index cap).
pub(super) fn read_index(path: &Path, file: &File) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(MAX_INDEX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(Operation::Read, path, None, e))?;
    if bytes.len() as u64 > MAX_INDEX_BYTES {
        let reason = format!("index of more than {MAX_INDEX_BYTES} bytes");
        return Err(Error::new(ErrorKind::InvalidIndex { reason }, path));
    }
    Ok(bytes)
}
