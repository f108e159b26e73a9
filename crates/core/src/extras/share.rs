//! The share step before reads (the node copy's seam): the files a load opened handed to the extras, which may give some of them a copy shared by the node's local ranks; the result per file, the rule for which files may have one, and what a reader of such a copy shares with the core.

use std::path::Path;
use std::sync::Arc;

use crate::dest::node::CopyFill;
use crate::dest::pages::HugePages;
use crate::format::header::Header;
use crate::policy::{self, Environment};
use crate::progress::Callback;
use crate::report::NodeCopy;
use crate::source::{DirectGuard, LocalFile, Source};
use crate::storage::Storage;

use super::local_rank::LocalRank;

/// One file of a load as the share step sees it.
#[derive(Clone, Copy)]
pub struct ShareFile<'a> {
    /// Where its bytes come from (the load's one open of it).
    pub source: &'a dyn Source,
    /// Its header.
    pub header: &'a Header,
    /// Whether the load reads it buffered (only such a file may get a copy).
    pub buffered: bool,
}

impl<'a> ShareFile<'a> {
    /// Its source.
    pub fn source(&self) -> &'a dyn Source {
        self.source
    }

    /// Its header.
    pub fn header(&self) -> &'a Header {
        self.header
    }

    /// The path it was opened by.
    pub fn path(&self) -> &'a Path {
        self.source.path()
    }

    /// Its length in bytes, as opened.
    pub fn size(&self) -> u64 {
        self.source.len()
    }

    /// The local file, where it is one.
    pub fn local(&self) -> Option<&'a LocalFile> {
        self.source.local()
    }
}

/// How a rank takes part in its node's copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The ranks fill the copy together (the share step's own fill).
    Queue,
    /// The node's participant in a load split between nodes: the load
    /// fills the copy ([`Pending`]).
    Participant,
    /// Another rank of such a node: it waits for the participant's copy.
    Member,
}

/// What the share step needs of the load besides its files.
#[derive(Clone, Copy)]
pub struct ShareAsk<'a> {
    /// This process among the job's processes of this node.
    pub rank: &'a LocalRank,
    /// The environment, read once at the top of the load.
    pub env: &'a Environment,
    /// The tensors the load keeps (`None`: all).
    pub keep: Option<&'a (dyn Fn(&str) -> bool + Sync)>,
    /// Whether the load converts dtypes (a converted file gets no copy).
    pub converting: bool,
    /// How this rank takes part.
    pub role: Role,
    /// The caller's direct I/O setting (`Loader::direct_io`).
    pub direct_io: Option<bool>,
    /// The page size of fresh memory the caller asked for.
    pub huge_pages: HugePages,
    /// The memory the guard may fill, where the caller set it.
    pub memory_available: Option<u64>,
    /// The chunk size of a fill, where the caller set one (prefetch's).
    pub chunk_size: Option<usize>,
    /// Readers per rank, where the caller set them (prefetch's streams).
    pub streams: Option<usize>,
    /// Where the ranks' coordinating names live (prefetch's queue directory).
    pub dir: Option<&'a Path>,
    /// The caller's progress callback.
    pub progress: Option<&'a Callback>,
    /// The load's cancel flags.
    pub cancel: &'a crate::cancel::Cancel,
}

/// What the share step did for one file.
pub enum PerFile {
    /// Not considered (one rank alone, or a mapped file): nothing to say.
    Absent,
    /// Its tensors are views of a shared copy.
    Copy {
        /// The copy, read-only.
        storage: Arc<Storage>,
        /// What the report says of it.
        report: NodeCopy,
        /// Bytes of tensor data this rank read into it.
        bytes_read: u64,
        /// Whether this rank made the copy (and writes it to a cache).
        made_here: bool,
    },
    /// Read by this rank alone, for this reason.
    NotUsed(NodeCopy),
}

impl PerFile {
    /// What the report says of it, if anything.
    pub fn report(&self) -> Option<NodeCopy> {
        match self {
            PerFile::Absent => None,
            PerFile::Copy { report, .. } | PerFile::NotUsed(report) => Some(report.clone()),
        }
    }
}

/// Copies the load is to fill ([`Role::Participant`]).
pub struct Pending {
    /// Per file, its index among the load's files and its copy's writer.
    pub files: Vec<(usize, CopyFill)>,
    /// Offers the copies as complete to the node's other ranks.
    pub complete: Box<dyn Fn() + Send + Sync>,
}

impl Pending {
    /// Every byte of every copy is in place: offers them as complete.
    pub fn complete(&self) {
        (self.complete)();
    }
}

/// The share step's answer.
pub struct Shared {
    /// Per file, in the load's order.
    pub files: Vec<PerFile>,
    /// The copies the load fills ([`Role::Participant`]).
    pub pending: Option<Pending>,
}

impl Shared {
    /// Nothing shared, nothing said.
    pub fn none(files: usize) -> Shared {
        Shared {
            files: (0..files).map(|_| PerFile::Absent).collect(),
            pending: None,
        }
    }
}

/// `O_DIRECT` on the descriptors of `files` where the policy would read the
/// file so (FUSE, cold), for as long as the guard lives: reads into a copy.
pub fn direct_reads<'a>(
    files: impl IntoIterator<Item = &'a LocalFile>,
    direct_io: Option<bool>,
) -> DirectGuard<'a> {
    let mut guard = DirectGuard::default();
    for local in files {
        // Refused: read through the page cache.
        direct_on(&mut guard, local, local.mount().map(|m| m.kind), direct_io);
    }
    guard
}

/// `O_DIRECT` on `local` (on a `kind` of filesystem) in `guard` where the
/// policy reads it so: whether it is on.
pub(crate) fn direct_on<'a>(
    guard: &mut DirectGuard<'a>,
    local: &'a LocalFile,
    kind: Option<crate::mount::MountKind>,
    direct_io: Option<bool>,
) -> bool {
    policy::wants_direct_io(direct_io, kind, true, || local.mostly_cached())
        && guard.add(local).is_ok()
}

/// The bytes of `offset..offset + len` of a file that are tensor data (at
/// or after `data_start`).
pub fn tensor_part(data_start: u64, offset: u64, len: u64) -> u64 {
    (offset + len).saturating_sub(offset.max(data_start))
}

/// What the eligibility rule looks at, for one file read buffered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Every tensor of the file is loaded (a filter may keep them all).
    pub all_tensors: bool,
    /// The load converts dtypes.
    pub converting: bool,
    /// Every tensor sits at an offset aligned for its dtype.
    pub aligned: bool,
    /// The file's version can be told (device, inode, size, mtime).
    pub identity: bool,
}

/// The rule: whether a file read buffered by several ranks gets a copy.
pub fn eligible(facts: Facts) -> Result<(), NodeCopy> {
    if !facts.all_tensors {
        Err(NodeCopy::Filtered)
    } else if facts.converting {
        Err(NodeCopy::Converting)
    } else if !facts.aligned {
        Err(NodeCopy::Unaligned)
    } else if !facts.identity {
        Err(NodeCopy::NoIdentity)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_counts_its_tensor_data_only() {
        // A header of 100 bytes: the first chunk holds it, the others none.
        assert_eq!(tensor_part(100, 0, 4096), 3996);
        assert_eq!(tensor_part(100, 4096, 4096), 4096);
        assert_eq!(tensor_part(100, 0, 100), 0);
        assert_eq!(tensor_part(100, 0, 50), 0);
        // The chunks of a file add up to its tensor data.
        let (size, chunk, data) = (10_000u64, 4096u64, 100u64);
        let sum: u64 = (0..size.div_ceil(chunk))
            .map(|i| tensor_part(data, i * chunk, chunk.min(size - i * chunk)))
            .sum();
        assert_eq!(sum, size - data);
    }

    #[test]
    fn the_rule() {
        let ok = Facts {
            all_tensors: true,
            converting: false,
            aligned: true,
            identity: true,
        };
        assert_eq!(eligible(ok), Ok(()));
        let table = [
            (
                Facts {
                    all_tensors: false,
                    ..ok
                },
                NodeCopy::Filtered,
            ),
            (
                Facts {
                    converting: true,
                    ..ok
                },
                NodeCopy::Converting,
            ),
            (
                Facts {
                    aligned: false,
                    ..ok
                },
                NodeCopy::Unaligned,
            ),
            (
                Facts {
                    identity: false,
                    ..ok
                },
                NodeCopy::NoIdentity,
            ),
            (
                Facts {
                    all_tensors: false,
                    converting: true,
                    ..ok
                },
                NodeCopy::Filtered,
            ),
        ];
        for (facts, why) in table {
            assert_eq!(eligible(facts), Err(why), "{facts:?}");
        }
    }
}
