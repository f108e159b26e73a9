//! Page-cache prefetch shared by the local ranks of a job, on a FUSE mount of
//! the test filesystem: ranks are separate processes (this test binary run
//! again, see `child`), with the launchers' variables set, warming a
//! checkpoint served through FUSE so that every byte fetched from "storage"
//! is counted; one of them killed, or stopped. Residency is checked with the
//! tests' own `mincore(2)` (`common::residency`), independently of the
//! crate's `cachestat(2)`. The kernel may reclaim a warmed page before the
//! test looks (see `common::residency`): a page missing at the end, or
//! fetched twice, is allowed only where the kernel shows it reclaimed it.
//! Needs root and /dev/fuse: skipped (loudly) where they are missing, a
//! failure under `SAFELOAD_REQUIRE_FUSE=1`.
//!
//! Prefetch in one process, on local files: `tests/it/prefetch.rs`.

use safeload::report::DirectIo;
use safeload::report::SkipReason;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::child::{PATH, child_command, run_role};
use crate::common::residency::{
    assert_none_resident, assert_resident_unless_reclaimed, evict_until_cold, pages_never_warmed,
    reclaim, reclaimed_bytes, reclaimed_pages, residency, system_refaulted_file_pages,
};
use crate::common::*;
use rustix::process::{Pid, Signal, kill_process};
use safeload::{Loader, PrefetchOptions};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

/// Sleep this many milliseconds per chunk (a slow rank).
const SLOW_MS: &str = "SAFELOAD_TEST_PREFETCH_SLOW_MS";
/// Create this file at the first chunk, then hang (a rank to kill).
const HANG_MARKER: &str = "SAFELOAD_TEST_PREFETCH_HANG_MARKER";
/// Set: each rank warms a fixed share (`shared_queue(false)`).
const STATIC: &str = "SAFELOAD_TEST_PREFETCH_STATIC";
/// Write the first chunk's line (see `LOG`) to this file, then linger in
/// the callback, holding the chunk's claim, for a second (a rank to stop).
const STOP_MARKER: &str = "SAFELOAD_TEST_PREFETCH_STOP_MARKER";
/// Append a line `offset len path` to this file for each chunk handled.
const LOG: &str = "SAFELOAD_TEST_PREFETCH_LOG";
/// `rank/size`: the rank from `Loader::local_rank` instead of the
/// launcher's variables.
const LOCAL_RANK: &str = "SAFELOAD_TEST_PREFETCH_LOCAL_RANK";

// ---------------------------------------------------------------------------
// The child side.

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[("rank", act_as_rank)]);
}

fn act_as_rank() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let slow = std::env::var(SLOW_MS)
        .ok()
        .map(|ms| Duration::from_millis(ms.parse().unwrap()));
    let marker = std::env::var(HANG_MARKER).ok().map(PathBuf::from);
    let stop_marker = std::env::var(STOP_MARKER).ok().map(PathBuf::from);
    let log = std::env::var(LOG).ok().map(|log| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log);
        std::sync::Mutex::new(file.unwrap())
    });
    let options = PrefetchOptions::new()
        .streams(2)
        .chunk_size(PREFETCH_CHUNK)
        .shared_queue(std::env::var_os(STATIC).is_none())
        .on_chunk(move |path, range| {
            let line = format!(
                "{} {} {}",
                range.start,
                range.end - range.start,
                path.display()
            );
            if let Some(log) = &log {
                writeln!(log.lock().unwrap(), "{line}").unwrap();
            }
            if let Some(pause) = slow {
                std::thread::sleep(pause);
            }
            if let Some(marker) = &marker {
                let _ = std::fs::write(marker, b"claimed");
                std::thread::sleep(Duration::from_secs(60));
            }
            // The first chunk of either reader only (`create_new`), written
            // whole before the parent sees the marker (the rename).
            let first = stop_marker.as_ref().filter(|m| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(m.with_extension("tmp"))
                    .and_then(|mut f| f.write_all(line.as_bytes()))
                    .is_ok()
            });
            if let Some(marker) = first {
                std::fs::rename(marker.with_extension("tmp"), marker).unwrap();
                std::thread::sleep(Duration::from_secs(1));
            }
        });
    let report = match std::env::var(LOCAL_RANK) {
        Ok(given) => {
            let (rank, size) = given.split_once('/').unwrap();
            Loader::new()
                .local_rank(rank.parse().unwrap(), size.parse().unwrap())
                .prefetch_with(options)
                .warm(&path)
        }
        Err(_) => Loader::new().prefetch_with(options.clone()).warm(&path),
    }
    .unwrap();
    println!(
        "PREFETCH-REPORT {} {} {} {} {} {} {} {}",
        report.rank,
        report.local_size,
        report.chunks_handled,
        report.chunks,
        report.warmed,
        report.skipped,
        report.skip_reasons.len(),
        report
            .queue_path
            .as_ref()
            .map_or("-".to_string(), |p| p.display().to_string()),
    );
    eprintln!("{report}");
}

// ---------------------------------------------------------------------------
// The parent side.

#[derive(Clone, Copy)]
enum Launcher {
    Torchrun,
    Slurm,
    OpenMpi,
    /// `Loader::local_rank` in the child, the job from `TORCHELASTIC_RUN_ID`.
    Builder,
}

static JOBS: AtomicUsize = AtomicUsize::new(0);

/// A job id no other test (or earlier run) shares.
fn job_id() -> String {
    format!(
        "safeload-test-{}-{}",
        std::process::id(),
        JOBS.fetch_add(1, Ordering::Relaxed)
    )
}

/// Starts a rank warming `setup`'s checkpoint.
fn spawn_rank(
    setup: &OnFuse,
    (rank, size): (usize, usize),
    launcher: Launcher,
    job: &str,
    extra: &[(&str, String)],
) -> Child {
    let mut cmd = child_command(module_path!(), "rank", &setup.index);
    let (r, s) = (rank.to_string(), size.to_string());
    match launcher {
        Launcher::Torchrun => {
            cmd.env("LOCAL_RANK", r)
                .env("LOCAL_WORLD_SIZE", s)
                .env("TORCHELASTIC_RUN_ID", job);
        }
        Launcher::Slurm => {
            cmd.env("SLURM_LOCALID", r)
                .env("SLURM_NTASKS_PER_NODE", format!("{s}(x2)"))
                .env("SLURM_JOB_ID", job)
                .env("SLURM_STEP_ID", "0");
        }
        Launcher::OpenMpi => {
            cmd.env("OMPI_COMM_WORLD_LOCAL_RANK", r)
                .env("OMPI_COMM_WORLD_LOCAL_SIZE", s)
                .env("OMPI_MCA_ess_base_jobid", job);
        }
        Launcher::Builder => {
            cmd.env(LOCAL_RANK, format!("{r}/{s}"))
                .env("TORCHELASTIC_RUN_ID", job);
        }
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// What a rank printed.
#[derive(Debug)]
struct RankReport {
    rank: usize,
    size: usize,
    handled: usize,
    chunks: usize,
    warmed: u64,
    skipped: u64,
    skip_reasons: usize,
    queue: Option<PathBuf>,
}

/// Waits (at most 60 s) for a rank, checks it succeeded, and reads its report.
fn finish(mut child: Child) -> RankReport {
    finish_by(&mut child, Instant::now() + Duration::from_secs(60)).unwrap_or_else(|| {
        child.kill().unwrap();
        panic!("a rank did not finish in 60 s");
    })
}

/// Waits until `deadline` for a rank to exit, checks it succeeded, and
/// reads its report; `None` if it still runs.
fn finish_by(child: &mut Child, deadline: Instant) -> Option<RankReport> {
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let stdout = child.stdout.take().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "rank failed: {status}");
    let line = BufReader::new(stdout)
        .lines()
        .map(Result::unwrap)
        .find_map(|l| l.split_once("PREFETCH-REPORT ").map(|(_, r)| r.to_string()))
        .expect("a report line");
    let f: Vec<&str> = line.split(' ').collect();
    Some(RankReport {
        rank: f[0].parse().unwrap(),
        size: f[1].parse().unwrap(),
        handled: f[2].parse().unwrap(),
        chunks: f[3].parse().unwrap(),
        warmed: f[4].parse().unwrap(),
        skipped: f[5].parse().unwrap(),
        skip_reasons: f[6].parse().unwrap(),
        queue: (f[7] != "-").then(|| PathBuf::from(f[7])),
    })
}

/// A checkpoint on a fresh FUSE mount, evicted, its index read once (the
/// ranks read it to find the shards, which is not what is counted), and the
/// read counters at zero.
struct OnFuse {
    _source: tempfile::TempDir,
    fs: Mount,
    index: PathBuf,
    shards: Vec<PathBuf>,
    /// The system's refault count at the start.
    refaults_before: u64,
}

impl OnFuse {
    /// Pages read back after reclaim since the start, by any process: an
    /// upper bound on the ranks'.
    fn refaulted_pages(&self) -> u64 {
        system_refaulted_file_pages() - self.refaults_before
    }

    /// Counts from zero again: the bytes served and the refaults.
    fn restart_counts(&mut self) {
        self.fs.reset_stats();
        self.refaults_before = system_refaulted_file_pages();
    }
}

fn on_fuse(latency: Option<Duration>) -> OnFuse {
    let source = tempdir().unwrap();
    write_uneven_shards(source.path());
    let fs = Mount::new(
        source.path(),
        Options {
            latency,
            ..Options::default()
        },
    )
    .unwrap();
    let index = fs.path().join("model.safetensors.index.json");
    let shards = shards_of(fs.path());
    std::fs::read(&index).unwrap();
    for s in &shards {
        std::fs::read(s).unwrap();
    }
    assert_resident_unless_reclaimed(&shards);
    // posix_fadvise(DONTNEED) works on FUSE files, and takes reclaim's
    // shadow entries with the pages: a page found reclaimed from now on was
    // read during the test.
    evict_until_cold(&index, &shards);
    std::fs::read(&index).unwrap();
    let refaults_before = system_refaulted_file_pages();
    fs.reset_stats();
    OnFuse {
        _source: source,
        fs,
        index,
        shards,
        refaults_before,
    }
}

/// Every chunk was fetched from storage once: the bytes the filesystem
/// served are the files' sizes (reads are clipped at the end of each file,
/// and chunks start on page boundaries, so there is no rounding to allow),
/// but for pages the kernel reclaimed after they were read and that were
/// read again, each a refault (see `common::residency`); and every page is
/// resident at the end, or reclaimed.
fn assert_read_once(setup: &OnFuse) {
    assert_read_at_most_once_more(setup, 0);
}

/// [`assert_read_once`], allowing `again` bytes read twice by the ranks
/// themselves.
fn assert_read_at_most_once_more(setup: &OnFuse, again: u64) {
    assert_resident_unless_reclaimed(&setup.shards);
    let total = total_size(&setup.shards);
    let served = setup.fs.stats().bytes_read;
    let refaulted = setup.refaulted_pages();
    let page = rustix::param::page_size() as u64;
    assert!(
        served >= total && served - total <= again + refaulted * page,
        "every byte read once: {served} bytes served for {total} \
         ({again} allowed again, {refaulted} page(s) read back after reclaim)"
    );
}

fn ranks_warm_every_byte_once(size: usize, launcher: Launcher) {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(Some(Duration::from_millis(1)));
    let job = job_id();
    let children: Vec<Child> = (0..size)
        .map(|r| spawn_rank(&setup, (r, size), launcher, &job, &[]))
        .collect();
    let reports: Vec<RankReport> = children.into_iter().map(finish).collect();
    assert_read_once(&setup);

    let chunks = reports[0].chunks;
    let expected: u64 = setup
        .shards
        .iter()
        .map(|s| total_size(std::slice::from_ref(s)).div_ceil(PREFETCH_CHUNK as u64))
        .sum();
    assert_eq!(chunks as u64, expected);
    let handled: usize = reports.iter().map(|r| r.handled).sum();
    assert_eq!(handled, chunks, "each chunk claimed once: {reports:?}");
    let warmed: u64 = reports.iter().map(|r| r.warmed).sum();
    assert!(warmed <= total_size(&setup.shards));
    for (i, r) in reports.iter().enumerate() {
        assert_eq!((r.rank, r.size), (i, size));
        assert_eq!(r.queue.is_some(), size > 1, "shared queue with other ranks");
        if let Some(queue) = &r.queue {
            assert!(queue.starts_with("/dev/shm"), "{}", queue.display());
            assert!(!queue.exists(), "the last rank removed {}", queue.display());
        }
    }
}

#[test]
fn one_rank_warms_every_byte_once() {
    ranks_warm_every_byte_once(1, Launcher::Torchrun);
}

#[test]
fn two_ranks_warm_every_byte_once() {
    ranks_warm_every_byte_once(2, Launcher::Slurm);
}

#[test]
fn three_ranks_warm_every_byte_once() {
    ranks_warm_every_byte_once(3, Launcher::OpenMpi);
}

/// A prefetch asked for on FUSE by one rank alone, whose files the load reads
/// buffered: the mount serves each byte once, not twice. The rank's own
/// streaming reads take the files (a prefetch through the page cache would
/// reach the daemon in smaller requests, and the load read them again);
/// where something is already in the page cache, the load takes it there
/// rather than read it again with `O_DIRECT`.
#[test]
fn a_prefetch_then_a_buffered_load_reads_nothing_twice() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(Some(Duration::from_millis(2)));
    let total = total_size(&setup.shards);
    for (name, loader) in [
        ("auto", Loader::new().local_rank(0, 1).prefetch(4)),
        (
            "buffered",
            Loader::new()
                .local_rank(0, 1)
                .prefetch(4)
                .disable_mmap(true),
        ),
    ] {
        evict_until_cold(&setup.index, &setup.shards);
        std::fs::read(&setup.index).unwrap();
        setup.fs.reset_stats();
        let sd = loader.load(&setup.index).unwrap();
        let served = setup.fs.stats().bytes_read;
        assert_eq!(loaded(&sd), naive_load(&setup.shards), "{name}");
        let prefetch = sd
            .report()
            .prefetch
            .as_ref()
            .expect("the prefetch asked for is reported");
        assert_eq!(prefetch.warmed, 0, "{name}: {prefetch}");
        assert!(
            prefetch
                .skip_reasons
                .iter()
                .any(|r| matches!(r, SkipReason::ReadByThisRank { .. })),
            "{name}: the report says why: {prefetch}"
        );
        for file in &sd.report().files {
            assert_eq!(
                file.strategy,
                safeload::report::Strategy::Buffered,
                "{name}"
            );
        }
        assert!(
            served as f64 <= 1.10 * total as f64,
            "{name}: {served} bytes served for {total} (target at most 1.10x)"
        );
    }
    // Warm already (read by hand, as another process would): the buffered
    // load copies from the page cache, with no direct read of the daemon.
    for s in &setup.shards {
        std::fs::read(s).unwrap();
    }
    setup.fs.reset_stats();
    let sd = Loader::new().disable_mmap(true).load(&setup.index).unwrap();
    let served = setup.fs.stats().bytes_read;
    assert_eq!(loaded(&sd), naive_load(&setup.shards));
    for file in &sd.report().files {
        assert_ne!(file.direct_io, DirectIo::On, "warm: {}", file.explain());
    }
    assert!(
        served as f64 <= 0.10 * total as f64,
        "warm: {served} bytes served again for {total}"
    );
}

#[test]
fn without_the_shared_queue_each_rank_warms_its_share_of_the_bytes() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(None);
    let job = job_id();
    let children: Vec<Child> = (0..2)
        .map(|r| {
            let extra = [(STATIC, "1".to_string())];
            spawn_rank(&setup, (r, 2), Launcher::Torchrun, &job, &extra)
        })
        .collect();
    let reports: Vec<RankReport> = children.into_iter().map(finish).collect();
    assert_read_once(&setup);
    let chunks = reports[0].chunks;
    assert!(reports.iter().all(|r| r.queue.is_none()));
    assert_eq!(reports[0].handled + reports[1].handled, chunks);
    // Split by bytes: the halves differ by at most a chunk per file.
    let (a, b) = (reports[0].handled as i64, reports[1].handled as i64);
    assert!((a - b).abs() <= 3, "{reports:?}");
}

#[test]
fn a_slow_rank_leaves_its_chunks_to_the_others() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(None);
    let job = job_id();
    let slow = spawn_rank(
        &setup,
        (0, 2),
        Launcher::Torchrun,
        &job,
        &[(SLOW_MS, "40".to_string())],
    );
    let fast = spawn_rank(&setup, (1, 2), Launcher::Torchrun, &job, &[]);
    let (slow, fast) = (finish(slow), finish(fast));
    assert_read_once(&setup);
    assert_eq!(slow.handled + fast.handled, slow.chunks);
    assert!(
        fast.handled > 2 * slow.handled,
        "the fast rank took most chunks: {fast:?} {slow:?}"
    );
}

#[test]
fn a_killed_rank_is_finished_by_the_others() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(None);
    let job = job_id();
    let marker_dir = tempdir().unwrap();
    let marker = marker_dir.path().join("claimed");
    let mut victim = spawn_rank(
        &setup,
        (1, 3),
        Launcher::OpenMpi,
        &job,
        &[(HANG_MARKER, marker.display().to_string())],
    );
    wait_for_claim(&marker);
    // It holds claimed chunks (and hangs): start the others, then kill it,
    // leaving it a zombie until they are done.
    let others: Vec<Child> = [0, 2]
        .into_iter()
        .map(|r| spawn_rank(&setup, (r, 3), Launcher::OpenMpi, &job, &[]))
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    victim.kill().unwrap();
    let reports: Vec<RankReport> = others.into_iter().map(finish).collect();
    victim.wait().unwrap();
    assert_read_once(&setup);
    for r in &reports {
        let queue = r.queue.as_ref().expect("shared");
        assert!(
            !queue.exists(),
            "the last live rank removed {}",
            queue.display()
        );
    }
}

/// Waits (at most 20 s) for a victim rank to create `marker` from its
/// first chunk's callback.
fn wait_for_claim(marker: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "the victim never claimed a chunk"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Ranks that are killed (after a `SIGCONT`, in case one is stopped) if
/// the test fails before they exit.
struct Ranks(Vec<Option<Child>>);

impl Ranks {
    fn signal(&self, rank: usize, signal: Signal) {
        let child = self.0[rank].as_ref().expect("running");
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        kill_process(pid, signal).unwrap();
    }

    /// The report of `rank` if it exits by `deadline`.
    fn finish_by(&mut self, rank: usize, deadline: Instant) -> Option<RankReport> {
        let report = finish_by(self.0[rank].as_mut().expect("running"), deadline)?;
        self.0[rank] = None;
        Some(report)
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in self.0.iter_mut().flatten() {
            if let Some(pid) = Pid::from_raw(child.id() as i32) {
                let _ = kill_process(pid, Signal::CONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The chunks a rank logged, as `offset len path` lines.
fn logged(log: &Path) -> BTreeSet<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A rank stopped with `SIGSTOP` (a debugger, a cgroup freezer, a node
/// short of memory) while it holds claimed chunks: the other two take them
/// over and finish within seconds instead of waiting out the 60 s stall
/// guard; resumed, it finishes cleanly, and the last to leave removes the
/// queue file.
#[test]
fn a_stopped_rank_is_taken_over_within_seconds() {
    if skip_without_fuse() {
        return;
    }
    // Each FUSE read takes 10 ms, so chunks take time as on a network mount.
    let setup = on_fuse(Some(Duration::from_millis(10)));
    let job = job_id();
    let work = tempdir().unwrap();
    let log = |rank: usize| work.path().join(format!("rank{rank}.log"));
    let marker = work.path().join("claimed");
    let victim = 1;
    let mut ranks = Ranks(
        (0..3)
            .map(|r| {
                let mut extra = vec![(LOG, log(r).display().to_string())];
                if r == victim {
                    extra.push((STOP_MARKER, marker.display().to_string()));
                }
                Some(spawn_rank(&setup, (r, 3), Launcher::Builder, &job, &extra))
            })
            .collect(),
    );

    // Stop the victim inside its first chunk's callback: it holds that
    // chunk's claim (read, not yet marked done), and maybe its other
    // reader's.
    wait_for_claim(&marker);
    ranks.signal(victim, Signal::STOP);
    let stopped = Instant::now();
    let held = std::fs::read_to_string(&marker).unwrap();

    // The others finish within a few seconds, every chunk done, none given
    // up on.
    let mut reports = Vec::new();
    for r in [0, 2] {
        let report = ranks.finish_by(r, stopped + Duration::from_secs(5));
        reports.push(report.unwrap_or_else(|| {
            panic!(
                "rank {r} still waiting {:.1} s after rank {victim} was stopped",
                stopped.elapsed().as_secs_f64()
            )
        }));
    }
    eprintln!(
        "the other ranks finished {:.3} s after the stop",
        stopped.elapsed().as_secs_f64()
    );
    for r in &reports {
        assert_eq!(
            (r.skipped, r.skip_reasons),
            (0, 0),
            "nothing given up: {r:?}"
        );
    }
    // The chunk the victim held was taken over: handled by another rank.
    let others: BTreeSet<String> = [0, 2].into_iter().flat_map(|r| logged(&log(r))).collect();
    assert!(others.contains(&held), "{held:?} taken over: {others:?}");
    let every = others.union(&logged(&log(victim))).count();
    assert_eq!(every, reports[0].chunks, "every chunk handled by someone");
    // At worst the chunks the victim's two readers held are read twice.
    assert_read_at_most_once_more(&setup, 2 * PREFETCH_CHUNK as u64);
    let queue = reports[0].queue.clone().expect("a shared queue");
    assert!(queue.exists(), "the stopped rank is still attached");

    // Resumed, the victim finishes cleanly (its claims are someone else's
    // now) and, the last to leave, removes the queue file.
    ranks.signal(victim, Signal::CONT);
    let report = ranks
        .finish_by(victim, Instant::now() + Duration::from_secs(20))
        .expect("the resumed rank finishes");
    assert_eq!(report.queue.as_ref(), Some(&queue));
    assert_eq!((report.skipped, report.skip_reasons), (0, 0), "{report:?}");
    assert!(report.handled >= 1, "{report:?}");
    assert!(!queue.exists(), "the last rank removed {}", queue.display());
}

/// The kernel's side of `assert_read_once`, checked on the kernel the tests
/// run on: pages it reclaims after a prefetch are told apart from pages
/// nobody read (a shadow entry), and reading them back counts as refaults.
/// Were a kernel to stop doing either, the allowances of `assert_read_once`
/// would hide what they must not, or fail where nothing is wrong, and this
/// test would say so.
#[test]
fn pages_the_kernel_reclaims_are_told_apart_from_pages_never_read() {
    if skip_without_fuse() {
        return;
    }
    let mut setup = on_fuse(None);
    let page = rustix::param::page_size() as u64;
    if reclaimed_pages(&setup.shards[0], 0, 0).is_none() {
        eprintln!("SKIPPED: no cachestat(2) (Linux 6.5+) to see reclaim with");
        return;
    }
    let warm = |setup: &OnFuse| {
        finish(spawn_rank(
            setup,
            (0, 1),
            Launcher::Torchrun,
            &job_id(),
            &[],
        ));
        assert_read_once(setup);
    };
    warm(&setup);

    // Reclaimed, every page leaves a shadow.
    for s in &setup.shards {
        reclaim(s);
        let pages = residency(s).1 as u64;
        assert_eq!(reclaimed_pages(s, 0, 0), Some(pages), "{}", s.display());
    }
    assert_none_resident(&setup.shards);
    assert_resident_unless_reclaimed(&setup.shards);
    // Invalidated pages leave none: as if never read.
    let first = std::fs::File::open(&setup.shards[0]).unwrap();
    let len = std::num::NonZeroU64::new(16 * page);
    rustix::fs::fadvise(&first, 0, len, rustix::fs::Advice::DontNeed).unwrap();
    let invalidated: Vec<u64> = (0..16).map(|i| i * page).collect();
    assert_eq!(pages_never_warmed(&setup.shards[0]), invalidated);

    // Warmed again, each reclaimed page read back is a refault (the
    // invalidated ones are not).
    let shadows = reclaimed_bytes(&setup.shards) / page;
    setup.restart_counts();
    warm(&setup);
    let refaulted = setup.refaulted_pages();
    assert!(
        refaulted >= shadows,
        "{refaulted} refaults for {shadows} reclaimed pages read back"
    );
}
