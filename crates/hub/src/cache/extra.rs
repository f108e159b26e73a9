//! The repository's other files an engine reads beside the weights (`hf://org/repo?with=engine`): brought into the hub cache's snapshot at the weights' commit, the missing ones marked in `.no_exist` as the hub's clients mark them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Mode, Remote};
use crate::error::{Error, Operation, Result};
use crate::remote::checkpoint::read_whole;
use crate::remote::object::RemoteObject;
use crate::source::{CacheUse, CacheWrite, Source};
use crate::workers;

/// The largest such file fetched: a tokenizer is tens of MiB, never this.
const MAX_EXTRA_BYTES: u64 = 256 << 20;

/// Names asked of the hub at once.
///
/// NOTE: each name is one round trip, most often a 404 for a file the
/// repository lacks, so the wait shrinks by about the width
/// (`hub_cache::requests` asserts under half the time in series); 8 stay far
/// below a hub's per-client limits, and hold at most 8 files in memory at
/// once, each within `MAX_EXTRA_BYTES` and the memory headroom.
const BRING_WIDTH: usize = 8;

impl Remote {
    /// Brings each of `names` (paths under the checkpoint's folder) into the
    /// hub cache at the weights' commit, where it is not there yet: its
    /// snapshot path, or `None` where the repository has no such file at
    /// the commit (then marked in `.no_exist`, or found marked) or the hub
    /// may not be asked (`HF_HUB_OFFLINE=1`). Nothing without the hub cache.
    pub(super) fn bring(&self, names: &[String]) -> Result<BTreeMap<String, Option<PathBuf>>> {
        let Mode::Hub(hub) = &self.mode else {
            return Ok(BTreeMap::new());
        };
        // Each name is a HEAD at least, and a missing one nothing more: asked several at
        // a time; the first failing name in the caller's order is the error.
        let (paths, _) = workers::map(names, BRING_WIDTH, "safeload-extra", |name| {
            let full = format!("{}{name}", hub.prefix);
            let cached = hub.view.as_ref().and_then(|v| {
                let found = v.file(&hub.commit, &full).map(|c| c.path);
                let marked = v.no_exist(&hub.commit, &full);
                found.map(Some).or(marked.then_some(None))
            });
            match cached {
                Some(found) => Ok(found),
                None if hub.offline => Ok(None),
                None => self.fetch(name, &full),
            }
        })?;
        Ok(names.iter().cloned().zip(paths).collect())
    }

    /// Fetches `name` whole and writes it to the snapshot (`full`, its path
    /// in the repository); `None`, marked in `.no_exist`, where the hub has
    /// no such file, or where the cache could not take it.
    fn fetch(&self, name: &str, full: &str) -> Result<Option<PathBuf>> {
        let Mode::Hub(hub) = &self.mode else {
            return Ok(None);
        };
        let object = match self.checkpoint.take(name) {
            Ok(object) => object,
            Err(e) if e.is_not_found() => {
                if let Some(writer) = &hub.writer {
                    // A marker is the cache's help, not the load's need.
                    let _ = writer.mark_missing(full);
                }
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let bytes = read_capped(&object)?;
        let Some(write) = self.write_of(&object, name) else {
            return Ok(None);
        };
        write.write_image(&bytes);
        // Small: published before its path is handed out; one that does not
        // hash to the hub's digest is an error, never taken for missing.
        write.settle();
        let written = matches!(
            write.outcome().checked(object.path())?,
            CacheUse::Written { .. }
        );
        Ok(hub
            .writer
            .as_ref()
            .filter(|_| written)
            .map(|w| w.snapshot_path(full)))
    }
}

/// The bytes of a small object, refused past [`MAX_EXTRA_BYTES`].
fn read_capped(object: &RemoteObject) -> Result<Vec<u8>> {
    let len = object.len();
    if len > MAX_EXTRA_BYTES {
        return Err(Error::remote(
            Operation::Read,
            object.path(),
            None,
            format!("{len} bytes, more than the {MAX_EXTRA_BYTES} a ?with= file may have"),
            std::io::ErrorKind::InvalidData,
        ));
    }
    read_whole(object, MAX_EXTRA_BYTES)
}
