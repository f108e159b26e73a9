//! Page-cache prefetch of local files, by one process: the memory guard, a
//! warm checkpoint, both methods, prefetch before a load, and the auto policy
//! on a network filesystem (an injected mount table); and the settings from
//! the environment, read by a child process of their own since they set it.
//! Residency is checked with the tests' own `mincore(2)`
//! (`common::residency`), independently of the crate's `cachestat(2)`.
//!
//! Ranks sharing a prefetch across processes, on FUSE:
//! `tests/fuse_prefetch_ranks.rs`.

mod common;

use std::path::PathBuf;

use common::child::{PATH, child_command, run_role};
use common::residency::{assert_all_resident, assert_none_resident, residency, sync};
use common::*;
use safeload::mount::MountTable;
use safeload::{Loader, PrefetchMethod, PrefetchOptions, PrefetchReport};
use tempfile::tempdir;

// ---------------------------------------------------------------------------
// The settings from the environment, in a child process that sets them.

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[("env", settings_from_the_environment)]);
}

/// `SAFELOAD_PREFETCH` and `HF_SHARD_PREFETCH` turn prefetch on; the builder
/// overrides them. Run alone in a child, since it sets the environment.
fn settings_from_the_environment() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let reason = |loader: Loader| {
        let sd = loader.load(&path).unwrap();
        sd.report().prefetch().map(|p| p.reason().to_string())
    };
    // SAFETY: this process runs one test (`--exact child`), on this thread.
    unsafe { std::env::set_var("HF_SHARD_PREFETCH", "3") };
    let why = reason(Loader::new()).expect("on");
    assert!(why.contains("HF_SHARD_PREFETCH=3"), "{why}");
    // SAFETY: as above.
    unsafe { std::env::set_var("SAFELOAD_PREFETCH", "2") };
    let why = reason(Loader::new()).expect("on");
    assert!(why.contains("SAFELOAD_PREFETCH=2"), "{why}");
    assert_eq!(reason(Loader::new().prefetch(0)), None, "the builder wins");
    let why = reason(Loader::new().prefetch(1)).expect("on");
    assert!(why.contains("prefetch(1)"), "{why}");
    // SAFETY: as above.
    unsafe { std::env::set_var("SAFELOAD_PREFETCH", "0") };
    assert_eq!(reason(Loader::new()), None, "0 turns it off");
    println!("ENV-OK");
}

#[test]
fn settings_come_from_the_environment_and_the_builder_wins() {
    let dir = tempdir().unwrap();
    let index = write_uneven_shards(dir.path());
    let out = child_command("env", &index).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ENV-OK"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------
// Prefetch in this process.

fn local_checkpoint() -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
    let dir = tempdir().unwrap();
    let index = write_uneven_shards(dir.path());
    let shards = shards_of(dir.path());
    sync(&shards);
    safeload::evict(&index).unwrap();
    (dir, index, shards)
}

#[test]
fn the_memory_guard_skips_and_says_why() {
    let (_dir, index, shards) = local_checkpoint();
    let total = total_size(&shards);
    let available = 1 << 20;
    let report = Loader::new()
        .local_rank(0, 1)
        .memory_available(available)
        .prefetch_with(PrefetchOptions::new().chunk_size(PREFETCH_CHUNK))
        .warm(&index)
        .unwrap();
    assert!(report.ran());
    assert_eq!(report.resident_before(), 0);
    let budget = available * 9 / 10;
    assert!(report.warmed() > 0, "{report}");
    assert!(report.skipped() >= total - budget, "{report}");
    // What is resident is within the budget: no read-ahead into the skipped part.
    let resident: u64 = shards.iter().map(|s| residency(s).0 as u64 * 4096).sum();
    assert!(resident <= budget, "{resident} resident: {report}");
    assert_eq!(report.resident_after(), Some(resident));
    let why = report.skip_reasons().join("; ");
    assert!(why.contains("memory guard"), "{why}");
    assert!(why.contains("90% of 1.00 MiB available"), "{why}");
    assert!(report.to_string().contains("memory guard"), "{report}");

    // The same through the loader, which says so in its report.
    safeload::evict(&index).unwrap();
    let sd = Loader::new()
        .prefetch(2)
        .memory_available(available)
        .load(&index)
        .unwrap();
    let p = sd.report().prefetch().expect("prefetch ran");
    assert!(p.skipped() > 0, "{p}");
    let text = sd.report().to_string();
    assert!(text.contains("memory guard"), "{text}");
}

#[test]
fn a_warm_checkpoint_costs_only_a_check() {
    let (_dir, index, shards) = local_checkpoint();
    let total = total_size(&shards);
    let loader = Loader::new()
        .local_rank(0, 1)
        .prefetch_with(PrefetchOptions::new().chunk_size(PREFETCH_CHUNK));
    let cold = loader.warm(&index).unwrap();
    // Some chunks arrive with the kernel's read-ahead for the one before.
    assert!(cold.warmed() > 0 && cold.warmed() <= total, "{cold}");
    assert_eq!(cold.resident_after(), Some(total));
    assert_all_resident(&shards);
    let warm = loader.warm(&index).unwrap();
    assert_eq!(warm.resident_before(), total, "{warm}");
    assert_eq!(
        (warm.warmed(), warm.reread(), warm.chunks_handled()),
        (0, 0, 0)
    );
}

#[test]
fn both_methods_warm_every_byte() {
    let (_dir, index, shards) = local_checkpoint();
    for method in [PrefetchMethod::Pread, PrefetchMethod::WillNeed] {
        safeload::evict(&index).unwrap();
        assert_none_resident(&shards);
        let report: PrefetchReport = Loader::new()
            .local_rank(0, 1)
            .prefetch_with(
                PrefetchOptions::new()
                    .chunk_size(PREFETCH_CHUNK)
                    .method(method),
            )
            .warm(&index)
            .unwrap();
        assert_eq!(report.method(), method);
        eprintln!("{report}");
        assert_all_resident(&shards);
    }
}

#[test]
fn prefetch_then_load_gives_the_same_tensors() {
    let (dir, index, shards) = local_checkpoint();
    let naive = naive_load(&shards);
    for disable_mmap in MODES {
        safeload::evict(&index).unwrap();
        let sd = Loader::new()
            .disable_mmap(disable_mmap)
            .prefetch(3)
            .local_rank(0, 1)
            .load(dir.path())
            .unwrap();
        assert_eq!(loaded(&sd), naive, "disable_mmap({disable_mmap})");
        let p = sd.report().prefetch().expect("asked for");
        assert!(p.ran() && p.reason().contains("prefetch(3)"), "{p}");
        assert_eq!((p.files(), p.streams(), p.local_size()), (3, 3, 1));
        assert_eq!(p.total_bytes(), total_size(&shards));
        let plain = safeload::load_state_dict(dir.path(), Some(disable_mmap)).unwrap();
        assert_eq!(loaded(&sd), loaded(&plain));
        assert!(plain.report().prefetch().is_none());
    }
}

#[test]
fn auto_policy_prefetches_a_cold_network_checkpoint_then_maps_it() {
    let (_dir, index, shards) = local_checkpoint();
    let total = total_size(&shards);
    let nfs =
        || MountTable::parse("36 25 0:50 / / rw - nfs4 10.0.0.2:/export rw,vers=4.2,addr=10.0.0.2");
    let load = |loader: Loader| {
        loader
            .mount_table(nfs())
            .local_rank(0, 1)
            .load(&index)
            .unwrap()
    };

    let sd = load(Loader::new());
    let p = sd
        .report()
        .prefetch()
        .expect("considered on a network filesystem");
    assert!(p.ran(), "{p}");
    assert!(p.reason().contains("on network (nfs4) at /"), "{p}");
    assert_eq!(p.streams(), 4);
    // The loader has read each file's header by then: those pages were
    // resident already.
    assert_eq!(p.warmed() + p.resident_before(), total);
    assert!(p.warmed() > total / 2, "{p}");
    assert!(
        sd.report()
            .files()
            .iter()
            .all(|f| f.strategy() == safeload::Strategy::Mmap)
    );

    // Warm now: a check, nothing read.
    let sd = load(Loader::new());
    let p = sd.report().prefetch().unwrap();
    assert!(!p.ran(), "{p}");
    assert!(p.reason().contains("already in the page cache"), "{p}");
    assert!(sd.report().to_string().contains("not prefetched"));

    // Cold, but larger than the memory guard allows.
    safeload::evict(&index).unwrap();
    let sd = load(Loader::new().memory_available(1 << 20));
    let p = sd.report().prefetch().unwrap();
    assert!(!p.ran(), "{p}");
    assert_eq!(
        p.skipped() + p.resident_before(),
        total,
        "headers were read: {p}"
    );
    assert!(p.skip_reasons()[0].contains("memory guard"), "{p}");

    // Turned off by the caller; and on a local disk not considered.
    assert!(
        load(Loader::new().prefetch(0))
            .report()
            .prefetch()
            .is_none()
    );
    let local = MountTable::parse("36 25 254:0 / / rw,relatime - ext4 /dev/vda rw");
    let sd = Loader::new().mount_table(local).load(&index).unwrap();
    assert!(sd.report().prefetch().is_none());
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PrefetchOptions>();
    check::<PrefetchReport>();
    check::<PrefetchMethod>();
}
