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

/// How a load of `sources` reads: the concurrency, and the size jobs are cut to; the remote or
/// the filesystems' defaults where the caller set neither (`Loader::io_concurrency`,
/// `Loader::read_size`).
pub(crate) fn io_defaults<'a>(
    sources: impl Iterator<Item = &'a dyn Source>,
    io_concurrency: Option<usize>,
    read_size: Option<usize>,
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
    let concurrency = match io_concurrency {
        Some(n) => Concurrency::pinned(n),
        None => Concurrency::adaptive(readers),
    };
    (concurrency, read_size.unwrap_or(size))
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
