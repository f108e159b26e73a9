//! The repository's other files an engine reads beside the weights (`hf://org/repo?with=engine`): brought into the hub cache's snapshot at the weights' commit, the missing ones marked in `.no_exist` as the hub's clients mark them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{Mode, Remote};
use crate::error::{Error, Operation, Result};
use crate::remote::checkpoint::read_whole;
use crate::remote::object::RemoteObject;
use crate::source::Source;
use crate::workers;

/// The largest such file fetched: a tokenizer is tens of MiB, never this.
const MAX_EXTRA_BYTES: u64 = 256 << 20;

/// Names asked of the hub at once.
///
/// NOTE: each name is one round trip, most often a 404, so the wait shrinks by about the
/// width; 8 stay far below a hub's per-client limits and bound the files held in memory.
const BRING_WIDTH: usize = 8;

impl Remote {
    /// Brings each of `names` (under the checkpoint's folder) into the hub cache at the
    /// weights' commit: its snapshot path, or `None` where the repository lacks it (marked
    /// in `.no_exist`) or the hub may not be asked. Nothing without the hub cache.
    pub(super) fn bring(&self, names: &[String]) -> Result<BTreeMap<String, Option<PathBuf>>> {
        let Mode::Hub(hub) = &self.mode else {
            return Ok(BTreeMap::new());
        };
        // The first failing name in the caller's order is the error.
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

    /// Fetches `name` whole into the snapshot (`full`, its repository path); `None`,
    /// marked in `.no_exist`, where the hub lacks it or the cache could not take it.
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
        let written = self.write_small(&object, name, &bytes)?;
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
