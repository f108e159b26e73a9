//! The page sizes' tests: the host's settings read, the choice by measured cost (a table of hosts), and fresh memory faulted in for real.

use super::*;

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
fn who_chose_and_what_the_host_offers() {
    use HostHugePages::{Absent, Offered};
    let table = [
        (
            (HugePages::Auto, Offered),
            (HugePages::Auto, PageReason::Measured),
        ),
        (
            (HugePages::Auto, Absent),
            (HugePages::Off, PageReason::Unavailable),
        ),
        ((HugePages::On, Absent), (HugePages::On, PageReason::Caller)),
        (
            (HugePages::Off, Offered),
            (HugePages::Off, PageReason::Caller),
        ),
    ];
    for ((mode, host), expected) in table {
        let pages = PageSizes::new(mode, PageReason::Caller, host);
        assert_eq!((pages.mode, pages.reason), expected, "{mode:?} {host:?}");
    }
}

/// Faults `pieces` destinations of `len` bytes in, as `fault_in` cuts them,
/// with a cost per byte of `cost(piece, size)` instead of the clock's;
/// returns the size each piece was faulted in (most of its bytes), and
/// where a probe was made.
fn drive(
    pages: &PageSizes,
    pieces: usize,
    len: usize,
    cost: impl Fn(usize, Size) -> f64,
) -> Vec<(Size, bool)> {
    drive_for(pages, pieces, len, false, cost)
}

/// [`drive`], for direct reads of a local disk where `disk`.
fn drive_for(
    pages: &PageSizes,
    pieces: usize,
    len: usize,
    disk: bool,
    cost: impl Fn(usize, Size) -> f64,
) -> Vec<(Size, bool)> {
    (0..pieces)
        .map(|i| {
            // Destinations one after another, the first on a huge page.
            let addr = (64 << 30) + i * len;
            let PieceSize { size, probe } = pages.cut(addr, len, disk);
            let nanos = |bytes: usize, size: Size| {
                Some(Duration::from_nanos((cost(i, size) * bytes as f64) as u64))
            };
            if probe.is_some() {
                let page = (HUGE, nanos(HUGE, size.other()));
                let mut state = pages.state.lock().unwrap();
                state.record_probe(size.other(), &[page, page]);
                drop(state);
                pages.record(size, len - PROBE, nanos(len - PROBE, size));
            } else {
                pages.record(size, len, nanos(len, size));
            }
            (size, probe.is_some())
        })
        .collect()
}

fn measuring() -> PageSizes {
    PageSizes::new(
        HugePages::Auto,
        PageReason::Measured,
        HostHugePages::Offered,
    )
}

const MIB8: usize = 8 << 20;

#[test]
fn huge_pages_where_they_are_cheaper_and_base_pages_where_they_are_not() {
    use Size::{Base, Huge};
    // Measured costs in nanoseconds per byte, huge pages at hand or backed
    // again by the host (BENCHMARKS.md, "dest/pages/tests.rs: the measured
    // costs").
    let fast = |_, size| if size == Huge { 0.08 } else { 0.36 };
    let slow = |_, size| if size == Huge { 2.2 } else { 0.36 };
    let pages = measuring();
    let run = drive(&pages, 40, MIB8, fast);
    // The first piece tries both; huge pages win and stay.
    assert_eq!(run[0], (Huge, true));
    assert!(run.iter().all(|&(size, _)| size == Huge), "{run:?}");
    let probes = run.iter().filter(|&&(_, probe)| probe).count() as u64;
    assert_eq!(probes, 3, "after 0, 8 and 24 pieces");
    let report = pages.report().unwrap();
    assert_eq!(report.reason, PageReason::Measured);
    assert_eq!(report.huge_bytes, 40 * MIB8 as u64 - probes * PROBE as u64);
    assert!((report.huge_gib_s.unwrap() - 1e9 / 0.08 / (1u64 << 30) as f64).abs() < 0.5);

    let pages = measuring();
    let run = drive(&pages, 300, MIB8, slow);
    // One piece of huge pages (with a probe of base pages), then base pages.
    assert_eq!(run[0], (Huge, true));
    assert!(run[1..].iter().all(|&(size, _)| size == Base), "{run:?}");
    // Probes of huge pages, fewer and fewer: after 8, 16, 32, 64, 128 pieces.
    let probes: Vec<usize> = (0..run.len()).filter(|&i| run[i].1).collect();
    assert_eq!(probes, [0, 8, 24, 56, 120, 248], "{probes:?}");
    let report = pages.report().unwrap();
    let probed = (probes.len() - 1) as u64 * PROBE as u64;
    assert_eq!(report.huge_bytes, (MIB8 - PROBE) as u64 + probed);
    assert_eq!(
        report.base_bytes + report.huge_bytes,
        300 * MIB8 as u64,
        "{report:?}"
    );
}

#[test]
fn a_disk_read_takes_huge_pages_unless_they_cost_over_four_times_as_much() {
    use Size::{Base, Huge};
    // Nanoseconds per byte: huge pages at 1.0 (three times base pages'
    // 0.36), then 2.2 from piece 50 on (six times).
    let cost = |i: usize, size| match size {
        Base => 0.36,
        Huge if i < 50 => 1.0,
        Huge => 2.2,
    };
    let pages = measuring();
    let run = drive_for(&pages, 100, MIB8, true, cost);
    assert!(run[..52].iter().all(|&(s, _)| s == Huge), "{run:?}");
    assert!(run[52..].iter().all(|&(s, _)| s == Base), "{run:?}");
    // The same costs for any other read: base pages from the second piece.
    let pages = measuring();
    let run = drive_for(&pages, 100, MIB8, false, cost);
    assert!(run[1..].iter().all(|&(s, _)| s == Base), "{run:?}");
}

#[test]
fn a_change_of_the_hosts_mode_is_followed() {
    use Size::{Base, Huge};
    // Huge pages fast for 20 pieces (memory another process just freed),
    // slow after; then fast again from piece 100 on.
    let cost = |i: usize, size| match size {
        Base => 0.36,
        Huge if (20..100).contains(&i) => 2.2,
        Huge => 0.08,
    };
    let pages = measuring();
    let run = drive(&pages, 200, MIB8, cost);
    assert!(run[..20].iter().all(|&(s, _)| s == Huge), "{run:?}");
    // Two slow pieces are seen (one alone could be a fluke), and the next
    // ones are of base pages.
    assert_eq!((run[20].0, run[21].0), (Huge, Huge));
    assert!(run[22..100].iter().all(|&(s, _)| s == Base), "{run:?}");
    // Back to huge pages after the first probe once they are fast again
    // (the probes came after 8, 24, 56 and 120 pieces).
    let back = (100..200).find(|&i| run[i].0 == Huge).unwrap();
    assert_eq!(back, 121, "{run:?}");
    assert!(run[back + 1..].iter().all(|&(s, _)| s == Huge));
}

/// Copies `pieces` destinations of `len` bytes out of the page cache one
/// after another, as `prepare` chooses their sizes, each copy costing
/// `cost(piece, size)` per byte; returns the size of each piece and whether
/// it was a probe.
fn drive_copies(
    pages: &PageSizes,
    pieces: usize,
    len: usize,
    cost: impl Fn(usize, Size) -> f64,
) -> Vec<(Size, bool)> {
    (0..pieces)
        .map(|i| {
            let prepared = pages.choose((64 << 30) + i * len, len);
            let (size, probe) = (prepared.size, prepared.probe);
            let nanos = (cost(i, size) * len as f64) as u64;
            pages.copied(prepared, Some(Duration::from_nanos(nanos)));
            (size, probe)
        })
        .collect()
}

#[test]
fn copies_choose_the_size_they_cost_least_in() {
    use Size::{Base, Huge};
    // A copy's cost per byte, its faults included: base pages take an
    // exception each, so cost more in a copy than in a populate.
    let fast = |_, size| if size == Huge { 0.25 } else { 0.6 };
    let pages = measuring();
    let run = drive_copies(&pages, 40, MIB8, fast);
    // The first piece is a probe of base pages, the second one of huge
    // pages (base pages were in use, the only ones measured); then huge
    // pages, with a whole piece of base pages after 8 and 16 more.
    let probes: Vec<usize> = (0..run.len()).filter(|&i| run[i].1).collect();
    assert_eq!(probes, [0, 1, 9, 25], "{run:?}");
    assert_eq!(run[..2], [(Base, true), (Huge, true)]);
    for (i, &(size, probe)) in run.iter().enumerate().skip(2) {
        assert_eq!(size, if probe { Base } else { Huge }, "piece {i}: {run:?}");
    }
    let report = pages.report().unwrap();
    assert_eq!(report.base_bytes, 3 * MIB8 as u64);
    assert_eq!(report.huge_bytes, 37 * MIB8 as u64);

    // Huge pages the host must back again, from piece 20 to 100: left
    // within two pieces (a cost is the median of three), back at the first
    // probe after they are cheap again.
    let cost = |i: usize, size| match size {
        Base => 0.6,
        Huge if (20..100).contains(&i) => 2.4,
        Huge => 0.25,
    };
    let pages = measuring();
    let run = drive_copies(&pages, 200, MIB8, cost);
    assert!(run[1..22].iter().all(|&(s, p)| s == Huge || p), "{run:?}");
    assert!(run[22..100].iter().all(|&(s, p)| s == Base || p), "{run:?}");
    let back = (100..200).find(|&i| run[i].0 == Huge).unwrap();
    assert!(run[back].1 && back <= 130, "{back}: {run:?}");
    assert!(
        run[back + 1..].iter().all(|&(s, p)| s == Huge || p),
        "{run:?}"
    );
}

#[test]
fn one_probe_at_a_time_and_one_given_back_untimed_ends_it() {
    let pages = measuring();
    // Eight readers take their first destinations before any copy ends:
    // one probe among them.
    let taken: Vec<Prepared> = (0..8)
        .map(|i| pages.choose((64 << 30) + i * MIB8, MIB8))
        .collect();
    assert_eq!(taken.iter().filter(|p| p.probe).count(), 1, "{taken:?}");
    // Given back untimed (a conversion, a failed read): counted, nothing
    // measured, and the next due probe is made.
    for prepared in taken {
        pages.copied(prepared, None);
    }
    let state = pages.state.lock().unwrap();
    assert!(!state.probing);
    assert_eq!(state.base.cost(), None);
    assert_eq!(state.base.bytes + state.huge.bytes, 8 * MIB8 as u64);
    drop(state);
    // A destination a conversion writes is never the probe, and leaves
    // the due one to the next timed copy.
    assert!(!pages.untimed(MIB8).probe);
    assert!(pages.choose(64 << 30, MIB8).probe);
}

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
#[test]
fn direct_reads_of_a_disk_are_said_and_off_still_means_base_pages() {
    let len = 24 << 20;
    let host = HostHugePages::of_host();
    for (mode, disk_share) in [
        (HugePages::Auto, 3),
        (HugePages::Auto, 2),
        (HugePages::Off, 3),
    ] {
        let mut owned = crate::storage::Buffer::new(len).unwrap();
        let buffer = owned.bytes_mut();
        let pages = PageSizes::new(mode, PageReason::Caller, host);
        // The first `disk_share` pieces of three are for direct reads of a
        // disk, the rest for any other read.
        for (i, piece) in buffer.chunks_mut(MIB8).enumerate() {
            pages.fault_in(piece, i < disk_share);
        }
        assert!(buffer.iter().all(|&b| b == 0));
        let report = pages.report().unwrap();
        assert_eq!(report.huge_bytes + report.base_bytes, len as u64);
        match (mode, host, disk_share) {
            (HugePages::Auto, HostHugePages::Offered, 3) => {
                // The sizes are the host's to decide (weighed: see
                // `a_disk_read_takes_huge_pages_unless...`); the reason says
                // whose reads they were.
                assert_eq!(report.reason, PageReason::DiskReads, "{report:?}");
                assert!(report.to_string().contains("direct reads of a local disk"));
            }
            (HugePages::Auto, HostHugePages::Offered, _) => {
                // The other piece measured as ever: the load's reason.
                assert_eq!(report.reason, PageReason::Measured, "{report:?}");
            }
            _ => {
                assert_eq!(report.base_bytes, len as u64, "{mode:?} {report:?}");
                assert_ne!(report.reason, PageReason::DiskReads);
            }
        }
    }
}

#[test]
fn a_caller_or_a_host_without_them_decides_and_nothing_is_probed() {
    let cost = |_, size| if size == Size::Huge { 2.2 } else { 0.36 };
    for (mode, host, size) in [
        (HugePages::On, HostHugePages::Offered, Size::Huge),
        (HugePages::Off, HostHugePages::Offered, Size::Base),
        (HugePages::Auto, HostHugePages::Absent, Size::Base),
    ] {
        let pages = PageSizes::new(mode, PageReason::Caller, host);
        let run = drive(&pages, 50, MIB8, cost);
        assert!(run.iter().all(|&r| r == (size, false)), "{mode:?}: {run:?}");
    }
}

#[test]
fn a_probe_needs_two_whole_huge_pages_inside_the_destination() {
    let pages = measuring();
    // 4.5 MiB from 1 MiB past a huge page boundary: no two whole ones inside.
    let cut = pages.cut((64 << 30) + (1 << 20), 9 << 19, false);
    assert_eq!(cut.probe, None);
    // 5 MiB from the same place: the two from the next boundary on.
    let cut = pages.cut((64 << 30) + (1 << 20), 5 << 20, false);
    assert_eq!(cut.probe, Some(1 << 20));
}

/// The value of `field` (`AnonHugePages:`, `VmFlags:`) of the mapping of
/// this process at `addr`, from /proc/self/smaps.
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
        for piece in buffer.chunks_mut(MIB8) {
            pages.fault_in(piece, false);
        }
        assert!(buffer.iter().all(|&b| b == 0), "{mode:?}");
        let report = pages.report().unwrap();
        assert_eq!(
            report.huge_bytes + report.base_bytes,
            len as u64,
            "{report:?}"
        );
        let addr = buffer.as_ptr() as usize;
        if mode == HugePages::Off {
            assert_eq!(report.huge_bytes, 0);
            assert_eq!(huge_bytes_at(addr), 0, "base pages only");
        }
        if pages.reason == PageReason::Measured {
            // Both sizes were measured on the first piece.
            assert!(
                report.huge_gib_s.is_some() && report.base_gib_s.is_some(),
                "{report:?}"
            );
        }
    }
}

#[cfg(all(target_os = "linux", not(safeload_os_stub)))]
#[test]
fn a_destination_prepared_for_a_copy_is_left_to_it() {
    let len = 24 << 20;
    let mut owned = crate::storage::Buffer::new(len).unwrap();
    let buffer = owned.bytes_mut();
    let pages = PageSizes::new(
        HugePages::Auto,
        PageReason::Measured,
        HostHugePages::of_host(),
    );
    let prepared: Vec<Prepared> = buffer
        .chunks_mut(MIB8)
        .map(|p| pages.prepare(p, true))
        .collect();
    if pages.reason == PageReason::Measured {
        // The first piece is the probe of base pages (huge ones are in use
        // until measured).
        let sizes: Vec<(Size, bool)> = prepared.iter().map(|p| (p.size, p.probe)).collect();
        assert_eq!(
            sizes,
            [(Size::Base, true), (Size::Huge, false), (Size::Huge, false)]
        );
    }
    for (i, p) in prepared.into_iter().enumerate() {
        pages.copied(p, Some(Duration::from_millis(1 + i as u64)));
    }
    let report = pages.report().unwrap();
    assert_eq!(
        report.huge_bytes + report.base_bytes,
        len as u64,
        "{report:?}"
    );
    if pages.reason == PageReason::Measured {
        assert!(
            report.huge_gib_s.is_some() && report.base_gib_s.is_some(),
            "{report:?}"
        );
    }
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
