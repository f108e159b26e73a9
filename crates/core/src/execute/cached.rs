//! A load's files written to a cache as they are fetched (feature `remote`, `src/cache/`): where the file being written is the load's destination (a shared map of it), and what becomes of the writes when local ranks share node copies.
//!
//! NOTE: a file read whole is fetched straight into a shared map of the
//! cache's temporary file (its space reserved first: a full disk is an
//! error, never a `SIGBUS`); its tensors are views of that map, which stays
//! valid when the file is renamed into the cache. `pwrite`-ing a loaded
//! buffer instead touches and holds twice the memory (BENCHMARKS.md,
//! "execute/cached.rs: the module").

use std::sync::Arc;

use crate::dest::node::{self as copy, CopyFill};
use crate::extras::{Facts, PerFile, Role, eligible};
use crate::file::OpenedFile;
use crate::options::Options;
use crate::policy::Strategy;
use crate::source::NotCached;
use crate::storage::BufferLayout;

/// Each file fetched whole through a cache with no node copy: the file
/// being written mapped as its destination, and its writer, by index.
pub(crate) fn map_destinations(
    files: &[&OpenedFile],
    copies: &mut [PerFile],
    opts: &Options,
    keep: Option<&(dyn Fn(&str) -> bool + Sync)>,
) -> Vec<(usize, CopyFill)> {
    let mut maps = Vec::new();
    for (i, (file, slot)) in files.iter().zip(copies.iter_mut()).enumerate() {
        let Some(write) = file.source().cache_write() else {
            continue;
        };
        if file.map().is_some()
            || file.decision().strategy != Strategy::Buffered
            || !matches!(slot, PerFile::Absent)
        {
            continue;
        }
        // What a node copy needs, this needs.
        let header = file.header();
        let facts = Facts {
            all_tensors: keep.is_none_or(|keep| header.tensors.iter().all(|t| keep(&t.name))),
            converting: opts.dtype.is_some(),
            aligned: BufferLayout::for_file(header, &vec![true; header.tensors.len()]).image,
            identity: true,
        };
        if eligible(facts).is_err() {
            continue;
        }
        let Some(temp) = write.map_destination() else {
            continue;
        };
        // The map holds the file open, its check waited for when it goes.
        let held = temp.try_clone().map(|file| (file, write.settle_on_drop()));
        // Page cache pages: no page size is asked for them.
        let mapped = CopyFill::of_file(&temp).and_then(|fill| {
            let held: Box<dyn Send + Sync> = Box::new(held?);
            Ok((fill, copy::seal(&temp, file.path(), held)?))
        });
        match mapped {
            Ok((fill, storage)) => {
                write.mapped_at(fill.addresses());
                *slot = PerFile::Copy {
                    storage: Arc::new(storage),
                    // No node copy: the load reports none for it (`execute`).
                    report: crate::report::NodeCopy::LeftOut,
                    bytes_read: 0,
                    made_here: true,
                };
                maps.push((i, fill));
            }
            Err(e) => write.abandon(NotCached::of_io(&e)),
        }
    }
    maps
}

/// What becomes of the paused cache writes when several local ranks load.
pub(crate) fn after_node_copies(files: &[&OpenedFile], copies: &[PerFile], role: Role) {
    for (file, copy) in files.iter().zip(copies) {
        let Some(write) = file.source().cache_write() else {
            continue;
        };
        match copy {
            PerFile::Copy { .. } if role != Role::Queue => {
                write.abandon(NotCached::Exchange);
            }
            PerFile::Copy {
                storage,
                made_here: true,
                ..
            } => write.write_image(storage.bytes()),
            PerFile::Copy { .. } => write.abandon(NotCached::OtherRank),
            _ => write.resume(),
        }
    }
}
