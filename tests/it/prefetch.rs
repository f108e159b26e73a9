//! Page-cache prefetch of local files, by one process: the memory guard, a
//! warm checkpoint, both methods, prefetch before a load, and the auto policy
//! on a network filesystem (an injected mount table); and, each in a child
//! process of its own, the settings from the environment (it sets them) and
//! residency where `cachestat(2)` is refused or the file is not the user's.
//! Residency is checked with the tests' own `mincore(2)`
//! (`common::residency`), independently of the crate's `cachestat(2)`; a
//! page the kernel reclaimed meanwhile is told apart from one never read
//! (see there).
//!
//! Ranks sharing a prefetch across processes, on FUSE:
//! `tests/it/fuse_prefetch_ranks.rs`.

use safeload::report::{PrefetchReason, SkipReason};
use std::path::PathBuf;
use std::process::Command;

use crate::common::child::{PATH, child_command, run_role};
use crate::common::residency::{
    SYS_CACHESTAT, assert_resident_unless_reclaimed, evict_until_cold, reclaimed_bytes, residency,
    sync, system_refaulted_file_pages,
};
use crate::common::*;
use safeload::mount::MountTable;
use safeload::{Dtype, Loader, PrefetchOptions, report::PrefetchMethod, report::PrefetchReport};
use tempfile::tempdir;

/// Set: the child refuses itself `cachestat(2)` with `EPERM` (a seccomp
/// filter, as a container runtime's that does not know the call).
const NO_CACHESTAT: &str = "SAFELOAD_TEST_PREFETCH_NO_CACHESTAT";

// ---------------------------------------------------------------------------
// The child side: the settings from the environment, and residency as a
// process that sees less of the page cache.

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[
        ("env", settings_from_the_environment),
        ("probe", probe_residency),
    ]);
}

/// `SAFELOAD_PREFETCH` and `HF_SHARD_PREFETCH` turn prefetch on; the builder
/// overrides them. Run alone in a child, since it sets the environment.
fn settings_from_the_environment() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let reason = |loader: Loader| {
        let sd = loader.load(&path).unwrap();
        sd.report().prefetch.as_ref().map(|p| p.reason.to_string())
    };
    // SAFETY: this process runs one test (`--exact prefetch::child`), on this thread.
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

/// Prefetches one file as one rank and prints what it saw of the page
/// cache: whether residency was known, bytes resident before, bytes warmed,
/// the method.
fn probe_residency() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    if std::env::var_os(NO_CACHESTAT).is_some() {
        if let Err(why) = refuse_cachestat() {
            println!("PROBE-SKIP {why}");
            return;
        }
    }
    let report = Loader::new().local_rank(0, 1).warm(&path).unwrap();
    println!(
        "PROBE-REPORT {} {} {} {}",
        report.residency_known, report.resident_before, report.warmed, report.method,
    );
}

/// Installs a seccomp filter on this thread (inherited by the threads it
/// starts) that answers `cachestat(2)` with `EPERM` and allows the rest,
/// then checks that it does.
fn refuse_cachestat() -> Result<(), String> {
    let op = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let filter = [
        // The syscall number: `seccomp_data.nr`, the first word.
        op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        op(
            libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
            SYS_CACHESTAT as u32,
            0,
            1,
        ),
        op(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
            0,
            0,
        ),
        op(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW, 0, 0),
    ];
    let program = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: prctl(2) with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `program` points at `filter`, both alive for the call, which
    // copies the filter into the kernel.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        )
    };
    if rc != 0 {
        return Err(format!("seccomp: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a syscall with null pointers, which the filter answers before
    // the kernel would read them.
    let rc = unsafe { libc::syscall(SYS_CACHESTAT, 0, 0, 0, 0) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    match (rc, errno) {
        (-1, Some(libc::EPERM)) => Ok(()),
        _ => Err(format!("cachestat still answers: {rc}, {errno:?}")),
    }
}

// ---------------------------------------------------------------------------
// The parent side.

#[test]
fn settings_come_from_the_environment_and_the_builder_wins() {
    let dir = tempdir().unwrap();
    let index = write_uneven_shards(dir.path());
    let out = child_command(module_path!(), "env", &index)
        .output()
        .unwrap();
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
    evict_until_cold(&index, &shards);
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
    assert!(report.ran);
    assert_eq!(report.resident_before, 0);
    let budget = available * 9 / 10;
    assert!(report.warmed > 0, "{report}");
    assert!(report.skipped >= total - budget, "{report}");
    // What is resident is within the budget: no read-ahead into the skipped part.
    let resident: u64 = shards.iter().map(|s| residency(s).0 as u64 * 4096).sum();
    assert!(resident <= budget, "{resident} resident: {report}");
    // The report counted what is resident now, and what the kernel has
    // reclaimed since (nothing read it back: this process is the only
    // reader).
    let after = report.resident_after.unwrap();
    let reclaimed = reclaimed_bytes(&shards);
    assert!(
        resident <= after && after <= resident + reclaimed,
        "{after} resident after, {resident} now, {reclaimed} reclaimed"
    );
    let why: Vec<String> = report
        .skip_reasons
        .iter()
        .map(ToString::to_string)
        .collect();
    let why = why.join("; ");
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
    let p = sd.report().prefetch.as_ref().expect("prefetch ran");
    assert!(p.skipped > 0, "{p}");
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
    assert!(cold.warmed > 0 && cold.warmed <= total, "{cold}");
    // Every byte, but for what the kernel may have reclaimed since the
    // report counted (see `common::residency`).
    let after = cold.resident_after.unwrap();
    let reclaimed = reclaimed_bytes(&shards);
    assert!(
        after <= total && after + reclaimed >= total,
        "{after} of {total} resident after, {reclaimed} reclaimed since"
    );
    assert_resident_unless_reclaimed(&shards);

    // Nothing to read, unless the kernel reclaimed pages between the two
    // passes: this one then reads them back, each a refault.
    let refaults = system_refaulted_file_pages();
    let warm = loader.warm(&index).unwrap();
    let refaulted = (system_refaulted_file_pages() - refaults) * 4096;
    assert!(total - warm.resident_before <= refaulted, "{warm}");
    assert!(warm.warmed + warm.reread <= refaulted, "{warm}");
    if refaulted == 0 {
        assert_eq!(
            (warm.resident_before, warm.chunks_handled),
            (total, 0),
            "{warm}"
        );
    }
}

#[test]
fn both_methods_warm_every_byte() {
    let (_dir, index, shards) = local_checkpoint();
    for method in [PrefetchMethod::Pread, PrefetchMethod::WillNeed] {
        evict_until_cold(&index, &shards);
        let report: PrefetchReport = Loader::new()
            .local_rank(0, 1)
            .prefetch_with(
                PrefetchOptions::new()
                    .chunk_size(PREFETCH_CHUNK)
                    .method(method),
            )
            .warm(&index)
            .unwrap();
        assert_eq!(report.method, method);
        eprintln!("{report}");
        assert_resident_unless_reclaimed(&shards);
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
        let p = sd.report().prefetch.as_ref().expect("asked for");
        assert_eq!(p.reason, PrefetchReason::Requested { streams: 3 }, "{p}");
        if disable_mmap {
            // One rank alone reads its buffered files with its own
            // streaming reads: a prefetch first would only add a pass.
            assert!(!p.ran, "{p}");
            assert!(
                p.skip_reasons
                    .iter()
                    .any(|r| matches!(r, SkipReason::ReadByThisRank { .. })),
                "{p}"
            );
        } else {
            assert!(p.ran, "{p}");
            assert_eq!((p.files, p.streams, p.local_size), (3, 3, 1));
            assert_eq!(p.total_bytes, total_size(&shards));
        }
        let plain = safeload::load_state_dict(dir.path(), Some(disable_mmap)).unwrap();
        assert_eq!(loaded(&sd), loaded(&plain));
        assert!(plain.report().prefetch.is_none());
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
        .prefetch
        .as_ref()
        .expect("considered on a network filesystem");
    assert!(p.ran, "{p}");
    assert!(
        matches!(&p.reason, PrefetchReason::Auto { mount, .. } if mount.fs_type == "nfs4"),
        "{p}"
    );
    assert!(
        p.reason.to_string().starts_with("on network (nfs4) at /"),
        "{p}"
    );
    assert_eq!(p.streams, 4);
    // The loader has read each file's header by then: those pages were
    // resident already.
    assert_eq!(p.warmed + p.resident_before, total);
    assert!(p.warmed > total / 2, "{p}");
    assert!(
        sd.report()
            .files
            .iter()
            .all(|f| f.strategy == safeload::report::Strategy::Mmap)
    );

    // Warm now: a check, nothing read.
    let sd = load(Loader::new());
    let p = sd.report().prefetch.as_ref().unwrap();
    assert!(!p.ran, "{p}");
    assert!(
        matches!(p.reason, PrefetchReason::AutoResident { .. }),
        "{p}"
    );
    assert!(sd.report().to_string().contains("not prefetched"));

    // Cold, but larger than the memory guard allows.
    safeload::evict(&index).unwrap();
    let sd = load(Loader::new().memory_available(1 << 20));
    let p = sd.report().prefetch.as_ref().unwrap();
    assert!(!p.ran, "{p}");
    assert_eq!(
        p.skipped + p.resident_before,
        total,
        "headers were read: {p}"
    );
    assert!(
        matches!(p.skip_reasons[0], SkipReason::MemoryGuard { .. }),
        "{p}"
    );
    assert!(
        p.skip_reasons[0].to_string().starts_with("memory guard"),
        "{p}"
    );

    // Turned off by the caller; and on a local disk not considered.
    assert!(load(Loader::new().prefetch(0)).report().prefetch.is_none());
    let local = MountTable::parse("36 25 254:0 / / rw,relatime - ext4 /dev/vda rw");
    let sd = Loader::new().mount_table(local).load(&index).unwrap();
    assert!(sd.report().prefetch.is_none());
}

/// What a `probe` child saw: residency known, bytes resident before, bytes
/// warmed, the method; `None` if it could not refuse itself cachestat(2).
fn probe(mut cmd: Command) -> Option<(bool, u64, u64, String)> {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let after = |tag: &str| {
        stdout
            .lines()
            .find_map(|l| l.split_once(tag).map(|(_, rest)| rest.to_string()))
    };
    if let Some(why) = after("PROBE-SKIP ") {
        eprintln!("SKIPPED: {why}");
        return None;
    }
    let line = after("PROBE-REPORT ").expect("a report line");
    let f: Vec<&str> = line.split(' ').collect();
    Some((
        f[0].parse().unwrap(),
        f[1].parse().unwrap(),
        f[2].parse().unwrap(),
        f[3].to_string(),
    ))
}

/// A checkpoint of one 1 MiB file in a directory anyone may read; the
/// file, as a list of one, and its size.
fn readable_checkpoint() -> (tempfile::TempDir, Vec<PathBuf>, u64) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = write_single(dir.path(), &[spec("w", Dtype::U8, &[1 << 20])]);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let files = vec![path];
    sync(&files);
    let size = total_size(&files);
    (dir, files, size)
}

#[test]
fn when_cachestat_is_refused_mincore_tells_residency() {
    let (_dir, files, size) = readable_checkpoint();
    let path = &files[0];
    let run = || {
        let mut cmd = child_command(module_path!(), "probe", path);
        cmd.env(NO_CACHESTAT, "1");
        probe(cmd)
    };
    // Warm: seen through mincore(2), nothing read; unless the kernel
    // reclaimed pages before the child looked, which it then reads back
    // (each a refault, see `common::residency`).
    std::fs::read(path).unwrap();
    let refaults = system_refaulted_file_pages();
    let Some((known, resident, warmed, method)) = run() else {
        return;
    };
    let refaulted = (system_refaulted_file_pages() - refaults) * 4096;
    assert!(known, "residency seen without cachestat(2)");
    assert!(
        resident <= size && resident + refaulted >= size,
        "{resident} of {size}"
    );
    assert!(
        warmed <= refaulted,
        "{warmed} warmed, {refaulted} refaulted"
    );
    assert_eq!(method, "willneed", "mincore(2) watches the pages land");
    // Cold: mincore(2) says so (it is not "every page present"), and the
    // file is warmed.
    evict_until_cold(path, &files);
    let (known, resident, warmed, _) = run().unwrap();
    assert!(known);
    assert_eq!((resident, warmed), (0, size));
    assert_resident_unless_reclaimed(&files);
}

#[test]
fn a_file_the_user_may_not_write_is_warmed_without_residency() {
    use std::os::unix::process::CommandExt;
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("SKIPPED: needs root, to run a child as nobody on a file root owns");
        return;
    }
    // Root's file, mode 0644: `nobody` may read it, not write it, so
    // cachestat(2) answers EPERM and mincore(2) would report every page
    // present. Cold, it must still be warmed.
    let (_dir, files, size) = readable_checkpoint();
    evict_until_cold(&files[0], &files);
    let mut cmd = child_command(module_path!(), "probe", &files[0]);
    cmd.uid(65534).gid(65534);
    let (known, resident, warmed, method) = probe(cmd).unwrap();
    assert!(!known, "hidden, not guessed");
    assert_eq!((resident, warmed), (0, size), "every byte read");
    assert_eq!(method, "pread", "nothing to watch pages land with");
    assert_resident_unless_reclaimed(&files);
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PrefetchOptions>();
    check::<PrefetchReport>();
    check::<PrefetchMethod>();
}
