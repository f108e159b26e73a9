//! The plan's rules by tables: selection, conversion, direct I/O, the memory guard.

use super::*;
use crate::format::header;
use crate::policy::{Origin, ReadMode, Strategy};

/// A header of U8 tensors `a` (4096 bytes) and `b` (8192) and an F32 `w`
/// (1024 elements), data starting on a block boundary.
fn header_abw() -> Header {
    let json = r#"{"a":{"dtype":"U8","shape":[4096],"data_offsets":[0,4096]},"b":{"dtype":"U8","shape":[8192],"data_offsets":[4096,12288]},"w":{"dtype":"F32","shape":[1024],"data_offsets":[12288,16384]}}"#;
    let mut padded = json.as_bytes().to_vec();
    padded.resize(4096 - 8, b' ');
    header::parse(&padded, 4096 + 16384).unwrap()
}

fn decision(strategy: Strategy, mode: ReadMode) -> FileDecision {
    let mut d = policy::choose(mode, Origin::Default, None);
    d.strategy = strategy;
    d
}

fn facts<'a>(
    header: &'a Header,
    decision: &'a FileDecision,
    kind: Option<MountKind>,
    cached: &'a dyn Fn() -> bool,
) -> FileFacts<'a> {
    FileFacts {
        header,
        decision,
        mapped: decision.strategy == Strategy::Mmap,
        kind,
        mostly_cached: cached,
    }
}

const NO: PlanOptions<'static> = PlanOptions {
    keep: None,
    dtype: None,
    direct_io: None,
};

#[test]
fn mapped_files_are_viewed_and_buffered_ones_laid_out() {
    let h = header_abw();
    let cold = || false;
    let map = decision(Strategy::Mmap, ReadMode::Auto);
    let read = decision(Strategy::Buffered, ReadMode::Auto);
    let files = [
        facts(&h, &map, Some(MountKind::Local), &cold),
        facts(&h, &read, Some(MountKind::Fuse), &cold),
    ];
    let plans = plan(&files, &NO, || None).unwrap();
    assert_eq!(plans[0].placement, Placement::Map);
    assert!(!plans[0].reads());
    match &plans[1].placement {
        Placement::Buffer { layout, direct } => {
            assert!(
                layout.image && *direct,
                "a cold FUSE file is read whole, direct"
            );
            assert_eq!(layout.len, 16384, "the data section, from its block");
        }
        other => panic!("{other:?}"),
    }
    assert!(plans.iter().all(|p| p.selected == [true, true, true]));
}

#[test]
fn direct_io_by_caller_filesystem_and_residency() {
    let h = header_abw();
    let read = decision(Strategy::Buffered, ReadMode::Buffered);
    // (caller, kind, mostly cached) -> direct
    let table = [
        (None, Some(MountKind::Fuse), false, true),
        (None, Some(MountKind::Fuse), true, false),
        (None, Some(MountKind::Local), false, true),
        (None, Some(MountKind::Network), false, false),
        (Some(false), Some(MountKind::Fuse), false, false),
        (Some(true), Some(MountKind::Network), true, true),
    ];
    for (caller, kind, cached, expected) in table {
        let cached = move || cached;
        let opts = PlanOptions {
            direct_io: caller,
            ..NO
        };
        let plans = plan(&[facts(&h, &read, kind, &cached)], &opts, || None).unwrap();
        let Placement::Buffer { direct, .. } = plans[0].placement else {
            panic!("buffered")
        };
        assert_eq!(direct, expected, "{caller:?} {kind:?} cached {}", cached());
        assert_eq!(
            plans[0].decision.direct == crate::policy::DirectIo::On,
            expected
        );
    }
}

#[test]
fn a_filter_selects_and_a_packed_file_is_not_direct() {
    let h = header_abw();
    let read = decision(Strategy::Buffered, ReadMode::Buffered);
    let cold = || false;
    let keep = |name: &str| name != "b";
    let opts = PlanOptions {
        keep: Some(&keep),
        ..NO
    };
    let plans = plan(
        &[facts(&h, &read, Some(MountKind::Fuse), &cold)],
        &opts,
        || None,
    )
    .unwrap();
    assert_eq!(plans[0].selected, [true, false, true]);
    let Placement::Buffer { layout, direct } = &plans[0].placement else {
        panic!("buffered")
    };
    assert!(!layout.image && !direct, "{layout:?}");
    assert_eq!(layout.len, 4096 + 4096);
}

#[test]
fn a_converting_load_places_floating_tensors_in_a_buffer_of_their_own() {
    let h = header_abw();
    let map = decision(Strategy::Mmap, ReadMode::Auto);
    let cold = || false;
    let opts = PlanOptions {
        dtype: Some(Dtype::BF16),
        ..NO
    };
    let plans = plan(&[facts(&h, &map, None, &cold)], &opts, || None).unwrap();
    let convert = plans[0].convert.as_ref().expect("w converts");
    assert_eq!(convert.placements, [None, None, Some(0)]);
    assert_eq!(convert.len, 2048);
    assert!(
        plans[0].reads(),
        "converted tensors are written, even from a map"
    );
}

#[test]
fn the_memory_guard_maps_what_the_auto_policy_read_and_refuses_what_was_asked() {
    let h = header_abw();
    let cold = || false;
    let auto = decision(Strategy::Buffered, ReadMode::Auto);
    let asked = decision(Strategy::Buffered, ReadMode::Buffered);
    // Plenty: nothing changes, and the figure is asked once.
    let asks = std::cell::Cell::new(0);
    let plans = plan(&[facts(&h, &auto, None, &cold)], &NO, || {
        asks.set(asks.get() + 1);
        Some(1 << 40)
    })
    .unwrap();
    assert!(matches!(plans[0].placement, Placement::Buffer { .. }));
    assert_eq!(asks.get(), 1);
    // Too little: the auto file is mapped instead, and says why.
    let plans = plan(&[facts(&h, &auto, None, &cold)], &NO, || Some(1 << 20)).unwrap();
    assert_eq!(plans[0].placement, Placement::Map);
    assert!(
        plans[0].decision.to_string().contains("memory"),
        "{}",
        plans[0].decision
    );
    // Asked for buffered: refused with the numbers.
    let refused = plan(&[facts(&h, &asked, None, &cold)], &NO, || Some(1 << 20)).unwrap_err();
    assert_eq!(refused.available, 1 << 20);
    assert!(refused.needed > 4096 + 16384);
    // Nothing to read: the figure is never asked.
    let map = decision(Strategy::Mmap, ReadMode::Auto);
    plan(&[facts(&h, &map, None, &cold)], &NO, || panic!("asked")).unwrap();
}
