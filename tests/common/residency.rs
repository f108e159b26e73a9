//! Page-cache residency of files, counted by the tests' own `mincore(2)`,
//! independently of the crate's `cachestat(2)`.

use std::path::{Path, PathBuf};

/// Resident and total pages of a file, by `mincore(2)` on a fresh map (this
/// process is root, so the kernel shows all of the page cache).
pub fn residency(path: &Path) -> (usize, usize) {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only map of a file no test changes while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let page = 4096;
    let pages = map.len().div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is the whole live map; `vec` has a byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), vec.as_mut_ptr()) };
    assert_eq!(rc, 0);
    (vec.iter().filter(|&&b| b & 1 != 0).count(), pages)
}

pub fn assert_all_resident(files: &[PathBuf]) {
    for f in files {
        let (resident, pages) = residency(f);
        assert_eq!(resident, pages, "{} fully in the page cache", f.display());
    }
}

pub fn assert_none_resident(files: &[PathBuf]) {
    for f in files {
        assert_eq!(residency(f).0, 0, "{} evicted", f.display());
    }
}

/// Makes the files clean (written back) so that eviction can drop them.
pub fn sync(files: &[PathBuf]) {
    for f in files {
        std::fs::File::open(f).unwrap().sync_all().unwrap();
    }
}
