//! How many reads a load keeps in flight and how large each is, where the caller set neither: by the filesystems and sources it reads.

use crate::adapt::Concurrency;
use crate::mount::MountKind;
use crate::source::Source;

/// The default size of one read of a buffered file.
///
/// NOTE: set by the `load` benchmark (BENCHMARKS.md): per-request overhead vanishes, readers
/// stay balanced at the tail.
const DEFAULT_READ_SIZE: usize = 8 << 20;

/// Reads in flight a load of remote objects starts with, and the size of one ranged request.
///
/// NOTE: the stores' guidance is 8-16 MiB per ranged GET (S3, GCS); a larger size was measured
/// slower (BENCHMARKS.md, "policy/reads.rs: REMOTE_READ_SIZE").
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

/// How a load of `sources` reads: the concurrency, and the size jobs are cut to; the remote or
/// the filesystems' defaults where the caller set neither.
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
    let (readers, size) = match remote {
        true => (readers.max(REMOTE_READERS), REMOTE_READ_SIZE),
        false => (readers, DEFAULT_READ_SIZE),
    };
    let concurrency = match caller.io_concurrency {
        Some(n) => Concurrency::pinned(n),
        None => Concurrency::adaptive(readers),
    };
    (concurrency, caller.read_size.unwrap_or(size))
}

/// Reads in flight by default: FUSE needs many to hide each one's latency (within the
/// kernel's 12 background requests per mount).
///
/// NOTE: 8 beat 4 on a local disk (BENCHMARKS.md, "policy/reads.rs: default_io_concurrency").
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
