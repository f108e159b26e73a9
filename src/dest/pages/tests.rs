//! The page sizes' tests: the host's settings read, the rule (a table of modes and hosts), and fresh memory faulted in for real.

use super::*;

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
const MIB8: usize = 8 << 20;

#[test]
fn the_selected_setting_is_the_one_in_brackets() {
    assert_eq!(selected("always [madvise] never\n"), Some("madvise"));
    assert_eq!(selected("[always] madvise never"), Some("always"));
    assert_eq!(
        selected("always defer defer+madvise [madvise] never"),
        Some("madvise")
    );
    assert_eq!(selected("always madvise never"), None);
    assert_eq!(selected("always [madvise"), None);
    let offered = |t| HostHugePages::from_enabled(Some(t));
    assert_eq!(offered("always [madvise] never"), HostHugePages::Offered);
    assert_eq!(offered("[always] madvise never"), HostHugePages::Offered);
    assert_eq!(offered("always madvise [never]"), HostHugePages::Absent);
    assert_eq!(offered("garbage"), HostHugePages::Absent);
    assert_eq!(HostHugePages::from_enabled(None), HostHugePages::Absent);
}

#[test]
fn the_caller_the_environment_or_the_host_decides() {
    use HostHugePages::{Absent, Offered};
    let table = [
        (
            (HugePages::Auto, Offered),
            (HugePages::Auto, PageReason::HostOffers, Some(true)),
        ),
        (
            (HugePages::Auto, Absent),
            (HugePages::Off, PageReason::Unavailable, None),
        ),
        (
            (HugePages::On, Absent),
            (HugePages::On, PageReason::Caller, Some(true)),
        ),
        (
            (HugePages::Off, Offered),
            (HugePages::Off, PageReason::Caller, Some(false)),
        ),
    ];
    for ((mode, host), expected) in table {
        let pages = PageSizes::new(mode, PageReason::Caller, host);
        let got = (pages.mode, pages.reason, pages.huge);
        assert_eq!(got, expected, "{mode:?} {host:?}");
    }
    // Memory the load does not own alone: no advice, nothing counted.
    let scratch = PageSizes::unadvised();
    assert!(!scratch.readers_fault());
    scratch.fault_in(&mut [0u8; 64]);
    assert_eq!(scratch.report(), None);
}

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
fn smaps_field(addr: usize, field: &str) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-') {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if let (true, Some(value)) = (inside, line.strip_prefix(field)) {
            return value.trim().to_string();
        }
    }
    panic!("no {field} for a mapping at {addr:#x}");
}

/// The bytes of this process's memory in the mapping at `addr` that are
/// backed by transparent huge pages.
#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
fn huge_bytes_at(addr: usize) -> u64 {
    let kib = smaps_field(addr, "AnonHugePages:");
    kib.trim_end_matches("kB").trim().parse::<u64>().unwrap() << 10
}

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
#[test]
fn a_node_copy_asks_for_the_page_size_it_is_told() {
    use crate::dest::node::{CopyFill, create, huge_page_advice};
    let copy = create(8 << 20).unwrap();
    // `hg`: huge pages asked for (MADV_HUGEPAGE), `nh`: refused (see proc(5)).
    for (mode, has, lacks) in [
        (HugePages::On, Some("hg"), "nh"),
        (HugePages::Off, Some("nh"), "hg"),
        (HugePages::Auto, None, "hg"),
    ] {
        let writer = CopyFill::new(&copy, mode).unwrap();
        let flags = smaps_field(writer.addresses().start, "VmFlags:");
        let flags: Vec<&str> = flags.split_whitespace().collect();
        assert!(
            has.is_none_or(|f| flags.contains(&f)),
            "{mode:?}: {flags:?}"
        );
        assert!(!flags.contains(&lacks), "{mode:?}: {flags:?}");
        assert_eq!(huge_page_advice(mode), has.map(|f| f == "hg"));
    }
}

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
#[test]
fn fresh_memory_faulted_in_is_zero_and_counted_and_off_means_no_huge_page() {
    let len = 24 << 20;
    for mode in [HugePages::Auto, HugePages::Off, HugePages::On] {
        let mut owned = crate::storage::Buffer::new(len).unwrap();
        let buffer = owned.bytes_mut();
        let pages = PageSizes::new(mode, PageReason::Caller, HostHugePages::of_host());
        pages.register(buffer);
        for piece in buffer.chunks_mut(MIB8) {
            pages.fault_in(piece);
        }
        assert!(buffer.iter().all(|&b| b == 0), "{mode:?}");
        let report = pages.report().unwrap();
        let total = report.huge_bytes + report.base_bytes;
        assert_eq!(total, len as u64, "{report:?}");
        let addr = buffer.as_ptr() as usize;
        match pages.huge {
            Some(false) | None => {
                assert_eq!(report.base_bytes, total, "{report:?}");
                assert_eq!(huge_bytes_at(addr), 0, "base pages only");
            }
            Some(true) => assert_eq!(report.huge_bytes, total, "{report:?}"),
        }
    }
}

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
#[test]
fn a_destination_left_to_its_copy_is_counted_and_untouched() {
    let len = 24 << 20;
    let mut owned = crate::storage::Buffer::new(len).unwrap();
    let buffer = owned.bytes_mut();
    let pages = PageSizes::new(
        HugePages::Auto,
        PageReason::Caller,
        HostHugePages::of_host(),
    );
    pages.register(buffer);
    for piece in buffer.chunks(MIB8) {
        pages.leave_to_copy(piece);
    }
    let report = pages.report().unwrap();
    assert_eq!(
        report.huge_bytes + report.base_bytes,
        len as u64,
        "{report:?}"
    );
    // Pages of a piece present in memory, by mincore(2) (an smaps entry
    // counts its whole mapping, which the advice may have merged with the
    // first piece's).
    let resident = |at: usize| {
        let page = rustix::param::page_size();
        let start = buffer.as_ptr() as usize + at;
        let mut vec = vec![0u8; MIB8 / page];
        // The range: 8 MiB of `buffer` (24 MiB, mapped in whole huge pages)
        // at a multiple of 8 MiB, so page-aligned; `buffer` is borrowed.
        // SAFETY: the range lies in live memory of this process; `vec` has
        // the byte per page mincore(2) writes; the buffer is not touched.
        let rc = unsafe { libc::mincore(start as *mut libc::c_void, MIB8, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 != 0).count()
    };
    assert_eq!(resident(0), 0, "the first piece untouched");
    assert_eq!(resident(MIB8), 0, "the second piece untouched");
    assert_eq!(resident(2 * MIB8), 0, "the third piece untouched");
    assert!(buffer.iter().all(|&b| b == 0));
}
