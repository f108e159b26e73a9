//! How many reads a load keeps in flight and how large each is, where the caller set neither: by the filesystems and sources it reads.

use crate::adapt::{Concurrency, Sizes};
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
/// request, under a cap on the bytes in flight.
///
/// NOTE: the stores' guidance is 8-16 MiB per ranged GET (S3's performance
/// guidelines; GCS's sliced downloads), hence 16 MiB and 16 requests to
/// start. Readers write into the load's buffers, so bytes in flight cost no
/// memory of their own: the cap (1 GiB, 64 requests of 16 MiB) bounds what
/// one load asks of the store at once.
///
/// NOTE: the size is no longer doubled once the count settles (it went up
/// to 64 MiB): on the test HTTP server (20 ms, 1,500 MiB/s, 2.2 GiB in 8
/// shards) every load tried 16 x 32 MiB, read 0.80-0.91 GiB/s in that
/// window against 1.42-1.50 GiB/s at 16 MiB, and went back; the detour cost
/// `hf://` 2.418 s against 1.919 s with the size kept at 16 MiB (medians of
/// 8 interleaved rounds each, 2026-12-02, BENCHMARKS.md). The controller
/// still measures sizes within a range ([`Sizes`]); this range leaves it
/// none to try.
const REMOTE_READERS: usize = 16;
/// See [`REMOTE_READERS`].
const REMOTE_SIZES: Sizes = Sizes {
    start: 16 << 20,
    max: 16 << 20,
    in_flight: 1 << 30,
};

/// How a load of `sources` reads where the caller set neither the reads in
/// flight nor their size (`caller`: `Loader::io_concurrency`,
/// `Loader::read_size`): the concurrency, and the size jobs are cut to
/// before the run. Remote objects: [`REMOTE_READERS`] of the size in
/// [`REMOTE_SIZES`];
/// elsewhere the filesystems' count ([`default_io_concurrency`]) and
/// [`DEFAULT_READ_SIZE`]. A size or count the caller set is kept.
pub(crate) fn io_defaults<'a>(
    sources: impl Iterator<Item = &'a dyn Source>,
    caller: (Option<usize>, Option<usize>),
) -> (Concurrency, usize) {
    let mut remote = false;
    let kinds: Vec<MountKind> = sources
        .filter_map(|s| {
            remote |= s.local().is_none();
            s.mount().map(|m| m.kind)
        })
        .collect();
    let readers = default_io_concurrency(kinds.into_iter());
    match caller {
        (Some(n), size) => (
            Concurrency::pinned(n),
            size.unwrap_or(if remote {
                REMOTE_SIZES.start
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
            Concurrency::adaptive(readers.max(REMOTE_READERS)).with_sizes(REMOTE_SIZES),
            REMOTE_SIZES.max,
        ),
        (None, None) => (Concurrency::adaptive(readers), DEFAULT_READ_SIZE),
    }
}

/// Reads in flight by default, for the filesystems a load touches: FUSE
/// needs many requests in flight to hide each one's latency (within the
/// kernel's default of 12 background requests per mount); elsewhere 8.
///
/// NOTE: on the local virtio disk, 2.2 GiB buffered, 3 interleaved runs
/// (2026-11-29): 8 readers of 8 MiB took 1.08-1.65 s cold and 0.95-1.22 s
/// warm, 4 readers 1.47-1.68 s and 1.37-2.08 s; 16 MiB chunks were within
/// the noise of 8 MiB.
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
