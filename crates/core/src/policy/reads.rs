//! How many reads a load keeps in flight and how large each is, where the caller set neither: by the filesystems and sources it reads.

use crate::adapt::Concurrency;
use crate::mount::MountKind;
use crate::source::Source;

/// The default size of one read of a buffered file.
///
/// NOTE: set by the `load` benchmark (BENCHMARKS.md): large enough that
/// per-request overhead vanishes and a FUSE mount sees requests in flight,
/// small enough that readers stay balanced at the tail.
const DEFAULT_READ_SIZE: usize = 8 << 20;

/// Reads in flight a load of remote objects starts with (the adaptive
/// controller doubles it while throughput rises), and the size of one ranged
/// request.
///
/// NOTE: the stores' guidance is 8-16 MiB per ranged GET (S3's performance
/// guidelines; GCS's sliced downloads), hence 16 MiB and 16 requests to
/// start; 64 requests of 16 MiB (the most readers) are 1 GiB in flight. A
/// larger size was measured slower (BENCHMARKS.md, "policy/reads.rs:
/// REMOTE_READ_SIZE").
const REMOTE_READERS: usize = 16;
/// See [`REMOTE_READERS`].
const REMOTE_READ_SIZE: usize = 16 << 20;

/// What the caller set of a load's reads.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallerReads {
    /// Reads in flight (`Loader::io_concurrency`).
    pub io_concurrency: Option<usize>,
    /// The size of one read (`Loader::read_size`).
    pub read_size: Option<usize>,
}

/// How a load of `sources` reads where the caller set neither the reads in
/// flight nor their size (`caller`: `Loader::io_concurrency`,
/// `Loader::read_size`): the concurrency, and the size jobs are cut to
/// before the run. Remote objects: [`REMOTE_READERS`] of
/// [`REMOTE_READ_SIZE`];
/// elsewhere the filesystems' count ([`default_io_concurrency`]) and
/// [`DEFAULT_READ_SIZE`]. A size or count the caller set is kept.
pub(crate) fn io_defaults<'a>(
    sources: impl Iterator<Item = &'a dyn Source>,
    caller: CallerReads,
) -> (Concurrency, usize) {
    let mut remote = false;
    let kinds: Vec<MountKind> = sources
        .filter_map(|s| {
            remote |= s.local().is_none();
            s.mount().map(|m| m.kind)
        })
        .collect();
    let readers = default_io_concurrency(kinds.into_iter());
    match (caller.io_concurrency, caller.read_size) {
        (Some(n), size) => (
            Concurrency::pinned(n),
            size.unwrap_or(if remote {
                REMOTE_READ_SIZE
            } else {
                DEFAULT_READ_SIZE
            }),
        ),
        (None, Some(size)) => (
            Concurrency::adaptive(if remote {
                readers.max(REMOTE_READERS)
            } else {
                readers
            }),
            size,
        ),
        (None, None) if remote => (
            Concurrency::adaptive(readers.max(REMOTE_READERS)),
            REMOTE_READ_SIZE,
        ),
        (None, None) => (Concurrency::adaptive(readers), DEFAULT_READ_SIZE),
    }
}

/// Reads in flight by default, for the filesystems a load touches: FUSE
/// needs many requests in flight to hide each one's latency (within the
/// kernel's default of 12 background requests per mount); elsewhere 8.
///
/// NOTE: 8 beat 4 on a local disk, cold and warm (BENCHMARKS.md,
/// "policy/reads.rs: default_io_concurrency").
fn default_io_concurrency(kinds: impl Iterator<Item = MountKind>) -> usize {
    kinds
        .map(|kind| match kind {
            MountKind::HfMount | MountKind::Fuse => 12,
            _ => 8,
        })
        .max()
        .unwrap_or(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_concurrency_by_filesystem() {
        use MountKind::*;
        assert_eq!(default_io_concurrency([Local, Network].into_iter()), 8);
        assert_eq!(default_io_concurrency([Local, Fuse].into_iter()), 12);
        assert_eq!(default_io_concurrency([HfMount].into_iter()), 12);
        assert_eq!(default_io_concurrency(std::iter::empty()), 8);
    }
}
