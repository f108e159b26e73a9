//! Page-cache residency of files, counted by the tests' own `mincore(2)`,
//! independently of the crate's `cachestat(2)`; and what the kernel took back.
//!
//! # Reclaim
//!
//! The page cache is a cache: the kernel may drop a clean page at any time,
//! since its data is on storage (Documentation/admin-guide/mm/concepts.rst,
//! "Reclaim"), under memory pressure or not. Proactive reclaim does it on an
//! idle machine: the test VM runs DAMON with a `pageout` scheme (see
//! /sys/kernel/mm/damon/admin), whose kdamond reclaims, every aggregation
//! interval (5 s there), the unmapped file pages of physical regions it found
//! cold, pages read a moment ago included (`damon_pa_pageout` in
//! mm/damon/paddr.c hands them to `reclaim_pages`; the scheme's filter that
//! lets unmapped pages through is matched before the per-page access check
//! it appends). A test that warms a file and finds one of its pages missing
//! later, or storage asked twice for it, has then seen the kernel, not
//! prefetch: traced there (`mm_filemap_delete_from_page_cache`), every such
//! failure of the FUSE prefetch tests was kdamond deleting their pages.
//!
//! What tells the two apart: reclaim leaves a shadow entry where it dropped
//! a clean page (`__remove_mapping` in mm/vmscan.c), which `cachestat(2)`
//! counts as `nr_evicted` ([`reclaimed_pages`]); invalidation
//! (`posix_fadvise(DONTNEED)`, which the tests evict with) drops pages and
//! shadows alike (`invalidate_mapping_pages` in mm/truncate.c), and a page
//! never read has neither. When a reclaimed page is read again its shadow
//! goes and the read counts as a refault (`workingset_refault` in
//! mm/workingset.c): `workingset_refault_file` in /proc/vmstat
//! ([`system_refaulted_file_pages`]). [`reclaim`] makes the kernel reclaim
//! a file's pages the way kdamond does, to check all this
//! (`pages_the_kernel_reclaims_are_told_apart_from_pages_never_read` in
//! tests/it/fuse_prefetch_ranks.rs).
//!
//! NOTE: shadows are memory too, and the kernel drops them under pressure
//! (the shadow-node shrinker of mm/workingset.c; emptying a memory cgroup
//! with `memory.force_empty` drops them with its pages, which is why
//! [`reclaim`] does not use it). A page lost that way looks never read: a
//! test on a machine that short of memory fails rather than passes.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// `cachestat(2)`: the same number on every architecture
/// (include/uapi/asm-generic/unistd.h); neither `libc` nor `rustix` wraps it
/// on every target.
pub const SYS_CACHESTAT: libc::c_long = 451;

/// Resident and total pages of a file, by `mincore(2)` on a fresh map (this
/// process is root, so the kernel shows all of the page cache).
pub fn residency(path: &Path) -> (usize, usize) {
    let pages = resident_pages(path);
    (pages.iter().filter(|&&r| r).count(), pages.len())
}

/// Whether each page of a file is in the page cache with its data, by
/// `mincore(2)` on a fresh map.
pub fn resident_pages(path: &Path) -> Vec<bool> {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only map of a file no test changes while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let pages = map.len().div_ceil(rustix::param::page_size());
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is the whole live map; `vec` has a byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), vec.as_mut_ptr()) };
    assert_eq!(rc, 0);
    vec.iter().map(|&b| b & 1 != 0).collect()
}

/// Pages of `path` in `[offset, offset + len)` (to the end of the file when
/// `len` is 0) that the kernel reclaimed and nobody has read since: the
/// shadow entries `cachestat(2)` counts as `nr_evicted`. `None` where the
/// kernel has no `cachestat(2)` (before Linux 6.5).
pub fn reclaimed_pages(path: &Path, offset: u64, len: u64) -> Option<u64> {
    // The layouts of include/uapi/linux/mman.h.
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let file = std::fs::File::open(path).unwrap();
    let range = Range { off: offset, len };
    let mut stat = Stat::default();
    // SAFETY: both pointers are to live structs of the kernel's layout, for
    // the length of the call; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0,
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS), "cachestat: {e}");
        return None;
    }
    Some(stat.nr_evicted)
}

/// File pages read back after reclaim, system-wide, since boot: every
/// process's, so an upper bound on a test's own, and one that holds across
/// memory cgroups (a memory cgroup's own count, in its `memory.stat`, is
/// brought up to date only once enough has changed in it, so it can lag by
/// a few pages). The per-CPU parts of the count are folded in first
/// (`/proc/sys/vm/stat_refresh`, root only: Documentation/admin-guide/sysctl/vm.rst),
/// else it can lag by up to a second.
pub fn system_refaulted_file_pages() -> u64 {
    let _ = std::fs::read("/proc/sys/vm/stat_refresh");
    std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("workingset_refault_file "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Makes the kernel reclaim the pages of `path` that are in the page cache,
/// the way proactive reclaim does: `madvise(MADV_PAGEOUT)` (Linux 5.4+) on a
/// map of the file, whose pages this process has just touched, hands them to
/// `reclaim_pages` in mm/vmscan.c, as kdamond's `pageout` does. A page
/// another process also maps is left alone.
///
/// Run once on each CPU this thread may use: a page read a moment ago can
/// still sit in the batch of pages on their way to the LRU of the CPU that
/// read it, where reclaim cannot take it, and `MADV_PAGEOUT` drains only the
/// batches of the CPU it runs on (`lru_add_drain` in mm/madvise.c).
pub fn reclaim(path: &Path) {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only map of a file no test changes while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let page = rustix::param::page_size();
    // SAFETY: `cpu_set_t` is plain data; all zeroes is the empty set.
    let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `allowed` is a live set of the size given; pid 0 is this thread.
    assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut allowed) }, 0);
    let cpus = (0..libc::CPU_SETSIZE as usize).filter(|&c| {
        // SAFETY: `c` is below CPU_SETSIZE, within the set.
        unsafe { libc::CPU_ISSET(c, &allowed) }
    });
    for cpu in cpus.collect::<Vec<_>>() {
        // SAFETY: as above.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut one) };
        // SAFETY: `one` is a live set of the size given; pid 0 is this thread.
        assert_eq!(unsafe { libc::sched_setaffinity(0, size, &one) }, 0);
        // Only what is resident: touching the rest would read it in.
        for (i, _) in resident_pages(path).iter().enumerate().filter(|&(_, &r)| r) {
            std::hint::black_box(map[i * page]);
        }
        // SAFETY: the range is the whole live map; reclaiming file pages
        // changes no byte the map shows (a later access reads them again).
        let rc = unsafe { libc::madvise(map.as_ptr() as *mut _, map.len(), libc::MADV_PAGEOUT) };
        assert_eq!(
            rc,
            0,
            "madvise(MADV_PAGEOUT): {}",
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: `allowed` is the live set read above.
    assert_eq!(unsafe { libc::sched_setaffinity(0, size, &allowed) }, 0);
}

/// Byte offsets of the pages of `path` that are neither in the page cache
/// nor reclaimed since they were read: pages nobody brought in (or that were
/// invalidated). Where the kernel cannot show reclaim (no `cachestat(2)`),
/// every page not resident.
pub fn pages_never_warmed(path: &Path) -> Vec<u64> {
    let page = rustix::param::page_size() as u64;
    resident_pages(path)
        .iter()
        .enumerate()
        .filter(|&(_, &resident)| !resident)
        .map(|(i, _)| i as u64 * page)
        .filter(|&at| reclaimed_pages(path, at, page) != Some(1))
        .collect()
}

/// Every page of `files` is in the page cache, or was and the kernel
/// reclaimed it (see the module's docs): none was left unread.
pub fn assert_resident_unless_reclaimed(files: &[PathBuf]) {
    for f in files {
        let missing = pages_never_warmed(f);
        assert!(
            missing.is_empty(),
            "{}: pages at {missing:?} neither in the page cache nor reclaimed",
            f.display()
        );
    }
}

/// Bytes of `files` the kernel reclaimed and nobody has read since.
pub fn reclaimed_bytes(files: &[PathBuf]) -> u64 {
    let page = rustix::param::page_size() as u64;
    files
        .iter()
        .map(|f| reclaimed_pages(f, 0, 0).unwrap_or(0) * page)
        .sum()
}

/// Every page of `files` is resident: only right where nothing can have
/// reclaimed one since it was read (see the module's docs); else
/// [`assert_resident_unless_reclaimed`].
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

/// Evicts the checkpoint at `checkpoint` (`safeload::evict`) until none of
/// `files` is in the page cache and no shadow of reclaim is left, so that a
/// page found later was read later. `posix_fadvise(DONTNEED)` only tries: a
/// page another holder has a reference on at that instant stays (the
/// invalidation skips it, `mapping_evict_folio` in mm/truncate.c), such as
/// one that kdamond has taken off the LRU to reclaim, which then leaves a
/// shadow instead. The holder lets go within milliseconds; a page that stays
/// for a second is a failure.
pub fn evict_until_cold(checkpoint: &Path, files: &[PathBuf]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        safeload::evict(checkpoint).unwrap();
        let resident: usize = files.iter().map(|f| residency(f).0).sum();
        let shadows = reclaimed_bytes(files);
        if resident == 0 && shadows == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{resident} page(s) still resident and {shadows} byte(s) reclaimed after evicting for 1 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Makes the files clean (written back) so that eviction can drop them.
pub fn sync(files: &[PathBuf]) {
    for f in files {
        std::fs::File::open(f).unwrap().sync_all().unwrap();
    }
}
