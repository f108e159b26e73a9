//! Page-cache prefetch shared by the local ranks of a job, on a FUSE mount of
//! the test filesystem: ranks are separate processes (this test binary run
//! again, see `child`), with the launchers' variables set, warming a
//! checkpoint served through FUSE so that every byte fetched from "storage"
//! is counted. Residency is checked with the tests' own `mincore(2)`
//! (`common::residency`), independently of the crate's `cachestat(2)`. Needs
//! root and /dev/fuse: skipped (loudly) where they are missing, a failure
//! under `SAFELOAD_REQUIRE_FUSE=1`.
//!
//! Prefetch in one process, on local files: `tests/prefetch.rs`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::child::{PATH, child_command, run_role};
use common::residency::{assert_all_resident, assert_none_resident};
use common::*;
use safeload::{PrefetchOptions, prefetch};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

/// Sleep this many milliseconds per chunk (a slow rank).
const SLOW_MS: &str = "SAFELOAD_TEST_PREFETCH_SLOW_MS";
/// Create this file at the first chunk, then hang (a rank to kill).
const HANG_MARKER: &str = "SAFELOAD_TEST_PREFETCH_HANG_MARKER";
/// Set: each rank warms a fixed share (`shared_queue(false)`).
const STATIC: &str = "SAFELOAD_TEST_PREFETCH_STATIC";

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
    let options = PrefetchOptions::new()
        .streams(2)
        .chunk_size(PREFETCH_CHUNK)
        .shared_queue(std::env::var_os(STATIC).is_none())
        .on_chunk(move |_, _| {
            if let Some(pause) = slow {
                std::thread::sleep(pause);
            }
            if let Some(marker) = &marker {
                let _ = std::fs::write(marker, b"claimed");
                std::thread::sleep(Duration::from_secs(60));
            }
        });
    let report = prefetch(&path, &options).unwrap();
    println!(
        "PREFETCH-REPORT {} {} {} {} {} {}",
        report.rank(),
        report.local_size(),
        report.chunks_handled(),
        report.chunks(),
        report.warmed(),
        report
            .queue_path()
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

fn spawn_rank(
    path: &Path,
    (rank, size): (usize, usize),
    launcher: Launcher,
    job: &str,
    extra: &[(&str, String)],
) -> Child {
    let mut cmd = child_command("rank", path);
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
    queue: Option<PathBuf>,
}

/// Waits (at most 60 s) for a rank, checks it succeeded, and reads its report.
fn finish(mut child: Child) -> RankReport {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("a rank did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
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
    RankReport {
        rank: f[0].parse().unwrap(),
        size: f[1].parse().unwrap(),
        handled: f[2].parse().unwrap(),
        chunks: f[3].parse().unwrap(),
        warmed: f[4].parse().unwrap(),
        queue: (f[5] != "-").then(|| PathBuf::from(f[5])),
    }
}

/// A checkpoint on a fresh FUSE mount, evicted, its index read once (the
/// ranks read it to find the shards, which is not what is counted), and the
/// read counters at zero.
struct OnFuse {
    _source: tempfile::TempDir,
    fs: Mount,
    index: PathBuf,
    shards: Vec<PathBuf>,
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
    assert_all_resident(&shards);
    safeload::evict(&index).unwrap();
    assert_none_resident(&shards); // posix_fadvise(DONTNEED) works on FUSE files
    std::fs::read(&index).unwrap();
    fs.reset_stats();
    OnFuse {
        _source: source,
        fs,
        index,
        shards,
    }
}

/// Every chunk was fetched from storage once: the bytes the filesystem
/// served are the files' sizes (reads are clipped at the end of each file,
/// and chunks start on page boundaries, so there is no rounding to allow).
fn assert_read_once(setup: &OnFuse) {
    let total = total_size(&setup.shards);
    assert_eq!(setup.fs.stats().bytes_read, total, "every byte read once");
    assert_all_resident(&setup.shards);
}

fn ranks_warm_every_byte_once(size: usize, launcher: Launcher) {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(Some(Duration::from_millis(1)));
    let job = job_id();
    let children: Vec<Child> = (0..size)
        .map(|r| spawn_rank(&setup.index, (r, size), launcher, &job, &[]))
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
            spawn_rank(&setup.index, (r, 2), Launcher::Torchrun, &job, &extra)
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
        &setup.index,
        (0, 2),
        Launcher::Torchrun,
        &job,
        &[(SLOW_MS, "40".to_string())],
    );
    let fast = spawn_rank(&setup.index, (1, 2), Launcher::Torchrun, &job, &[]);
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
        &setup.index,
        (1, 3),
        Launcher::OpenMpi,
        &job,
        &[(HANG_MARKER, marker.display().to_string())],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(
            Instant::now() < deadline,
            "the victim never claimed a chunk"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // It holds claimed chunks (and hangs): start the others, then kill it,
    // leaving it a zombie until they are done.
    let others: Vec<Child> = [0, 2]
        .into_iter()
        .map(|r| spawn_rank(&setup.index, (r, 3), Launcher::OpenMpi, &job, &[]))
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
