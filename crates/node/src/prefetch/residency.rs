//! The files to warm and what the kernel shows of their page cache: `cachestat(2)` or `mincore(2)` per file, sampled residency per chunk, and the warming method each file gets.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use memmap2::Mmap;

use super::plan::{Chunk, Init, guard};
use crate::error::Operation;
use crate::error::{Error, Result};
#[cfg(test)]
use crate::mount::{self, MountTable};
use crate::mount::{Mount, MountKind};
use crate::os;
use crate::policy::{self, PrefetchMethod};
use crate::storage;

/// Pages sampled per chunk before a chunk is taken as resident.
///
/// NOTE: counting costs the kernel a lookup per page, a large share of a warm
/// load; a sample per 512 KiB of an 8 MiB chunk makes it small (BENCHMARKS.md,
/// "prefetch/residency.rs: SAMPLES").
const SAMPLES: u64 = 16;

/// How residency of a file's pages is found ([`ResidencyView`]). Neither way: the
/// kernel does not let this process see it.
pub(super) struct Probe {
    /// `cachestat(2)` (Linux 6.5+) works: one call counts the pages present
    /// in a range, also those whose read is still in flight. Cheap.
    cachestat: bool,
    /// A read-only shared map of the file, for `mincore(2)`: counts the
    /// pages that hold their data (up to date), one byte per page.
    map: Option<Mmap>,
}

/// One file to warm.
pub(crate) struct Target {
    pub(super) path: PathBuf,
    pub(super) file: File,
    pub(super) len: u64,
    pub(super) identity: Vec<u8>,
    pub(super) mount: Option<Mount>,
    probe: Probe,
    /// `WILLNEED` pieces: the most the kernel reads for one call.
    pub(super) advice_piece: u64,
}

impl Target {
    /// Bytes of `[offset, offset + len)` in the page cache, pages still
    /// being read included; `None` where residency cannot be seen.
    fn resident(&self, offset: u64, len: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        if self.probe.cachestat {
            let cached = os::cached_pages(&self.file, offset, len).ok()?;
            return Some(pages_to_bytes(cached, len));
        }
        self.landed(offset, len, scratch)
    }

    /// [`resident`](Self::resident), sampled first: `len` when [`SAMPLES`]
    /// pages are all present, else the exact count (a page missed between
    /// samples is read by the load's own page fault).
    pub(super) fn resident_quick(
        &self,
        offset: u64,
        len: u64,
        scratch: &mut Vec<u8>,
    ) -> Option<u64> {
        let page = os::page_size();
        let pages = len.div_ceil(page);
        let samples = SAMPLES.min(pages).max(1);
        for k in 0..samples {
            let at = offset + (k * pages / samples) * page;
            let one = page.min(offset + len - at);
            if self.resident(at, one, scratch)? < one {
                return self.resident(offset, len, scratch);
            }
        }
        Some(len)
    }

    /// Bytes of `[offset, offset + len)` whose pages hold their data, by
    /// `mincore`; as [`resident`](Self::resident) where the file has no map.
    pub(super) fn landed(&self, offset: u64, len: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        let Some(map) = &self.probe.map else {
            return match self.probe.cachestat {
                true => self.resident(offset, len, scratch),
                false => None,
            };
        };
        let offset = usize::try_from(offset).ok()?;
        let n = usize::try_from(len).ok()?;
        let pages = os::mincore_pages(map, offset, n, scratch).ok()?;
        Some(pages_to_bytes(pages, len))
    }

    /// Bytes of the whole file in the page cache, chunk by chunk, sampled.
    pub(super) fn resident_total(&self, chunk: u64, scratch: &mut Vec<u8>) -> Option<u64> {
        let mut sum = 0;
        let mut offset = 0;
        while offset < self.len {
            let len = chunk.min(self.len - offset);
            sum += self.resident_quick(offset, len, scratch)?;
            offset += len;
        }
        Some(sum)
    }
}

/// `pages` whole pages of a range of `len` bytes, in bytes: all of them
/// when every page is counted (the last one may be partial).
fn pages_to_bytes(pages: u64, len: u64) -> u64 {
    let page = os::page_size();
    if pages >= len.div_ceil(page) {
        len
    } else {
        pages.saturating_mul(page).min(len)
    }
}

#[cfg(test)]
pub(super) fn open_targets(paths: &[PathBuf], table: Option<&MountTable>) -> Result<Vec<Target>> {
    paths
        .iter()
        .map(|path| {
            let file =
                os::open_regular(path).map_err(|e| Error::io(Operation::Open, path, None, e))?;
            let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
            let mount = table.and_then(|t| mount::lookup_file_in(t, &file, &canonical).ok());
            target_from(path.clone(), &canonical, file, mount)
        })
        .collect()
}

/// A target from an open file: its identity for the queue's key (canonical
/// path, size, mtime, device, inode) and how its residency can be seen.
pub(super) fn target_from(
    path: PathBuf,
    canonical: &Path,
    file: File,
    mount: Option<Mount>,
) -> Result<Target> {
    let meta = file
        .metadata()
        .map_err(|e| Error::io(Operation::Stat, &path, None, e))?;
    let mut identity = canonical.as_os_str().as_encoded_bytes().to_vec();
    identity.push(0);
    identity.extend_from_slice(&meta.len().to_le_bytes());
    let modified = meta
        .modified()
        .ok()
        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    identity.extend_from_slice(&modified.to_le_bytes());
    if let Some((dev, ino)) = os::file_id(&meta) {
        identity.extend_from_slice(&dev.to_le_bytes());
        identity.extend_from_slice(&ino.to_le_bytes());
    }
    let probe = probe_for(&file, &path, &meta);
    let advice_piece = advice_piece(&meta);
    Ok(Target {
        path,
        file,
        len: meta.len(),
        identity,
        mount,
        probe,
        advice_piece,
    })
}

/// Which calls show this process a file's page cache, from what
/// `cachestat(2)` answered and whether `mincore(2)` can see the file's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ResidencyView {
    /// `cachestat(2)` counts, and `mincore(2)` on a map tells what landed.
    Both,
    /// `cachestat(2)` only: `mincore(2)` would report every page present.
    Cachestat,
    /// `mincore(2)` only: `cachestat(2)` is missing (`ENOSYS` before Linux
    /// 6.5) or refused.
    Mincore,
    /// Neither: residency is unknown, and every chunk is read.
    Hidden,
}

/// The decision behind [`ResidencyView`]: `cachestat(2)` where it succeeds,
/// `mincore(2)` where it shows this process the pages. `EPERM` from
/// `cachestat(2)` is any failure: its permission check (Linux 6.14+) is
/// `mincore`'s rule, or a seccomp filter refused it and `mincore` works.
pub(super) fn residency_view(
    cachestat: Result<(), io::ErrorKind>,
    visible_to_mincore: bool,
) -> ResidencyView {
    match (cachestat, visible_to_mincore) {
        (Ok(()), true) => ResidencyView::Both,
        (Ok(()), false) => ResidencyView::Cachestat,
        (Err(_), true) => ResidencyView::Mincore,
        (Err(_), false) => ResidencyView::Hidden,
    }
}

/// How this process sees the page cache of `file` ([`residency_view`]).
fn probe_for(file: &File, path: &Path, meta: &std::fs::Metadata) -> Probe {
    if meta.len() == 0 {
        return Probe {
            cachestat: false,
            map: None,
        };
    }
    let cachestat = os::cached_pages(file, 0, 1).map(drop).map_err(|e| e.kind());
    let sight = residency_view(cachestat, visible_to_mincore(path, meta));
    let map = matches!(sight, ResidencyView::Both | ResidencyView::Mincore)
        .then(|| storage::map_file(file).ok())
        .flatten();
    Probe {
        cachestat: matches!(sight, ResidencyView::Both | ResidencyView::Cachestat),
        map,
    }
}

/// Whether `mincore(2)` shows this process a file's page cache: root, the
/// owner, or a writer (`can_do_mincore`, mm/mincore.c). For others Linux 5.0+
/// reports every page present, cached or not (measured on 6.18).
fn visible_to_mincore(path: &Path, meta: &std::fs::Metadata) -> bool {
    let euid = os::effective_uid();
    euid.is_some() && (euid == Some(0) || euid == os::file_owner(meta) || os::may_write(path))
}

/// The largest `WILLNEED` the kernel honours in one call for this file
/// (`force_page_cache_ra`, mm/readahead.c): from sysfs, else 128 KiB.
fn advice_piece(meta: &std::fs::Metadata) -> u64 {
    const DEFAULT: u64 = 128 << 10;
    os::device_number(meta)
        .and_then(os::readahead_limit)
        .unwrap_or(DEFAULT)
}

/// The method for a file: the policy's answer for what was requested, the
/// file's filesystem, and whether `mincore` can show its pages land.
pub(super) fn resolve_method(requested: PrefetchMethod, target: &Target) -> PrefetchMethod {
    let kind = target.mount.as_ref().map_or(MountKind::Unknown, |m| m.kind);
    policy::prefetch_method(requested, kind, target.probe.map.is_some())
}

/// Residency of every chunk, then the guard.
pub(super) fn initial_states(targets: &[Target], chunks: &[Chunk], available: Option<u64>) -> Init {
    let mut scratch = Vec::new();
    let mut known = !targets.is_empty();
    let resident: Vec<u64> = chunks
        .iter()
        .map(|c| {
            let r = targets
                .get(c.file)
                .and_then(|t| t.resident_quick(c.offset, c.len, &mut scratch));
            if r.is_none() {
                known = false;
            }
            r.unwrap_or(0)
        })
        .collect();
    guard(chunks, &resident, available, known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_is_used_where_it_tells_the_truth() {
        use io::ErrorKind::{PermissionDenied, Unsupported};
        assert_eq!(residency_view(Ok(()), true), ResidencyView::Both);
        // Kernels before cachestat(2) checked permissions (6.5 to 6.13)
        // answer it for anyone; mincore(2) would still report every page of
        // a file this user may not write.
        assert_eq!(residency_view(Ok(()), false), ResidencyView::Cachestat);
        // EPERM where mincore(2) can see (a seccomp filter that does not
        // know the call): mincore(2), as on a kernel without cachestat(2).
        assert_eq!(
            residency_view(Err(PermissionDenied), true),
            ResidencyView::Mincore
        );
        assert_eq!(
            residency_view(Err(Unsupported), true),
            ResidencyView::Mincore
        );
        // A user who neither owns nor may write the file: hidden, not
        // "every page present".
        assert_eq!(
            residency_view(Err(PermissionDenied), false),
            ResidencyView::Hidden
        );
        assert_eq!(
            residency_view(Err(Unsupported), false),
            ResidencyView::Hidden
        );
    }

    /// The stub OS layer has neither call: residency is unknown, and a
    /// prefetch reads every chunk.
    #[cfg(not(all(target_os = "linux", not(safeload_os_stub))))]
    #[test]
    fn residency_is_hidden_without_the_kernel_calls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let targets = open_targets(&[path], None).unwrap();
        let t = &targets[0];
        assert!(!t.probe.cachestat && t.probe.map.is_none());
        let mut scratch = Vec::new();
        assert_eq!(t.resident_quick(0, 1 << 20, &mut scratch), None);
        assert_eq!(t.landed(0, 1 << 20, &mut scratch), None);
    }

    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn a_sampled_check_counts_exactly_when_a_sample_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        File::open(&path).unwrap().sync_all().unwrap();
        let paths = [path.clone()];
        let targets = open_targets(&paths, None).unwrap();
        let t = &targets[0];
        assert!(t.probe.cachestat && t.probe.map.is_some());
        let mut scratch = Vec::new();
        os::evict(&t.file).unwrap();
        assert_eq!(t.resident_quick(0, 1 << 20, &mut scratch), Some(0));
        // All but the first page: the first sample misses, the count is exact.
        let mut buf = vec![0u8; (1 << 20) - 4096];
        os::read_exact_at(&t.file, &mut buf, 4096).unwrap();
        assert_eq!(
            t.resident_quick(0, 1 << 20, &mut scratch),
            Some((1 << 20) - 4096)
        );
        assert_eq!(t.landed(0, 1 << 20, &mut scratch), Some((1 << 20) - 4096));
        os::read_exact_at(&t.file, &mut buf[..4096], 0).unwrap();
        assert_eq!(t.resident_quick(0, 1 << 20, &mut scratch), Some(1 << 20));
        assert_eq!(t.resident_total(256 << 10, &mut scratch), Some(1 << 20));
    }

    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn cachestat_and_mincore_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        os::evict(&file).unwrap();
        let mut buf = vec![0u8; 256 << 10];
        os::read_exact_at(&file, &mut buf, 512 << 10).unwrap();
        let map = storage::map_file(&file).unwrap();
        let mut scratch = Vec::new();
        let cached = os::cached_pages(&file, 0, 1 << 20).unwrap();
        let mincore = os::mincore_pages(&map, 0, 1 << 20, &mut scratch).unwrap();
        assert_eq!(cached, mincore);
        assert!(cached >= (256 << 10) / os::page_size(), "{cached}");
        let in_read = os::cached_pages(&file, 512 << 10, 256 << 10).unwrap();
        assert_eq!(in_read, (256 << 10) / os::page_size());
    }
}
