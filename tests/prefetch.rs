//! Page-cache prefetch shared by the local ranks of a job: ranks are separate
//! processes (this test binary run again, see `child`), with the launchers'
//! variables set (or `local_rank()`), warming a checkpoint served by the FUSE
//! test filesystem so that every byte fetched from "storage" is counted; one
//! of them killed, or stopped. Residency is checked
//! with this file's own `mincore(2)`, independently of the crate's
//! `cachestat(2)`. FUSE tests need root and /dev/fuse: skipped (loudly)
//! where they are missing.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use rustix::process::{Pid, Signal, kill_process};
use safeload::mount::MountTable;
use safeload::{Dtype, Loader, PrefetchMethod, PrefetchOptions, PrefetchReport, prefetch};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

/// Set in a child process: what it is to do.
const ROLE: &str = "SAFELOAD_TEST_PREFETCH_ROLE";
const PATH: &str = "SAFELOAD_TEST_PREFETCH_PATH";
/// Sleep this many milliseconds per chunk (a slow rank).
const SLOW_MS: &str = "SAFELOAD_TEST_PREFETCH_SLOW_MS";
/// Create this file at the first chunk, then hang (a rank to kill).
const HANG_MARKER: &str = "SAFELOAD_TEST_PREFETCH_HANG_MARKER";
/// Write the first chunk's line (see `LOG`) to this file, then linger in
/// the callback, holding the chunk's claim, for a second (a rank to stop).
const STOP_MARKER: &str = "SAFELOAD_TEST_PREFETCH_STOP_MARKER";
/// Append a line `offset len path` to this file for each chunk handled.
const LOG: &str = "SAFELOAD_TEST_PREFETCH_LOG";
/// `rank/size`: set them with `local_rank()` instead of the launcher's
/// variables.
const LOCAL_RANK: &str = "SAFELOAD_TEST_PREFETCH_LOCAL_RANK";
/// Set: each rank warms a fixed share (`shared_queue(false)`).
const STATIC: &str = "SAFELOAD_TEST_PREFETCH_STATIC";
/// Set: the child refuses itself `cachestat(2)` with `EPERM` (a seccomp
/// filter, as a container runtime's that does not know the call).
const NO_CACHESTAT: &str = "SAFELOAD_TEST_PREFETCH_NO_CACHESTAT";
/// The chunk size the ranks use: small, so a few MiB make many chunks.
const CHUNK: usize = 128 << 10;

const LAUNCHER_VARS: [&str; 16] = [
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SAFELOAD_PREFETCH",
];

// ---------------------------------------------------------------------------
// The child side.

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "rank" => act_as_rank(),
        "env" => settings_from_the_environment(),
        "probe" => probe_residency(),
        other => panic!("unknown role {other}"),
    }
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
    let mut options = PrefetchOptions::new()
        .streams(2)
        .chunk_size(CHUNK)
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
            // The first chunk of either reader only (`create_new`).
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
    if let Ok(given) = std::env::var(LOCAL_RANK) {
        let (rank, size) = given.split_once('/').unwrap();
        options = options.local_rank(rank.parse().unwrap(), size.parse().unwrap());
    }
    let report = prefetch(&path, &options).unwrap();
    println!(
        "PREFETCH-REPORT {} {} {} {} {} {} {} {}",
        report.rank(),
        report.local_size(),
        report.chunks_handled(),
        report.chunks(),
        report.warmed(),
        report.skipped(),
        report.skip_reasons().len(),
        report
            .queue_path()
            .map_or("-".to_string(), |p| p.display().to_string()),
    );
    eprintln!("{report}");
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
    let report = prefetch(&path, &PrefetchOptions::new().local_rank(0, 1)).unwrap();
    println!(
        "PROBE-REPORT {} {} {} {}",
        report.residency_known(),
        report.resident_before(),
        report.warmed(),
        report.method(),
    );
}

/// Installs a seccomp filter on this thread (inherited by the threads it
/// starts) that answers `cachestat(2)` with `EPERM` and allows the rest,
/// then checks that it does.
fn refuse_cachestat() -> Result<(), String> {
    // The same number on every architecture (include/uapi/asm-generic/unistd.h).
    const SYS_CACHESTAT: libc::c_long = 451;
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

#[derive(Clone, Copy)]
enum Launcher {
    Torchrun,
    Slurm,
    OpenMpi,
    /// `local_rank()` in the child, the job from `TORCHELASTIC_RUN_ID`.
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

fn child_command(role: &str, path: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env_remove("HF_SHARD_PREFETCH")
        .stdout(Stdio::piped());
    for var in LAUNCHER_VARS {
        cmd.env_remove(var);
    }
    cmd
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

/// A sharded checkpoint of about 3.3 MiB in three shards of uneven size, none
/// a whole number of pages. Returns the index path.
fn write_checkpoint(dir: &Path) -> PathBuf {
    let specs = [
        spec("a", Dtype::U8, &[1_500_001]),
        spec("b", Dtype::U8, &[700_003]),
        spec("c", Dtype::U8, &[900_007]),
        spec("d", Dtype::U8, &[123_457]),
        spec("e", Dtype::F32, &[12_345]),
    ];
    write_sharded(dir, &specs, 3)
}

fn shards_of(dir: &Path) -> Vec<PathBuf> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    shards
}

/// Resident and total pages of a file, by `mincore(2)` on a fresh map (this
/// process is root, so the kernel shows all of the page cache).
fn residency(path: &Path) -> (usize, usize) {
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

fn assert_all_resident(files: &[PathBuf]) {
    for f in files {
        let (resident, pages) = residency(f);
        assert_eq!(resident, pages, "{} fully in the page cache", f.display());
    }
}

fn assert_none_resident(files: &[PathBuf]) {
    for f in files {
        assert_eq!(residency(f).0, 0, "{} evicted", f.display());
    }
}

fn total_size(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum()
}

/// Makes the files clean (written back) so that eviction can drop them.
fn sync(files: &[PathBuf]) {
    for f in files {
        std::fs::File::open(f).unwrap().sync_all().unwrap();
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
    write_checkpoint(source.path());
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
        .map(|s| total_size(std::slice::from_ref(s)).div_ceil(CHUNK as u64))
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
    wait_for_claim(&marker);
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
    let total = total_size(&setup.shards);
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
                Some(spawn_rank(
                    &setup.index,
                    (r, 3),
                    Launcher::Builder,
                    &job,
                    &extra,
                ))
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
    assert_all_resident(&setup.shards);
    // The chunk the victim held was taken over: handled by another rank.
    let others: BTreeSet<String> = [0, 2].into_iter().flat_map(|r| logged(&log(r))).collect();
    assert!(others.contains(&held), "{held:?} taken over: {others:?}");
    let every = others.union(&logged(&log(victim))).count();
    assert_eq!(every, reports[0].chunks, "every chunk handled by someone");
    // At worst the chunks the victim's two readers held are read twice.
    let read = setup.fs.stats().bytes_read;
    assert!(
        read <= total + 2 * CHUNK as u64,
        "{read} bytes read for {total}"
    );
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

#[test]
fn settings_come_from_the_environment_and_the_builder_wins() {
    let dir = tempdir().unwrap();
    let index = write_checkpoint(dir.path());
    let out = child_command("env", &index).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ENV-OK"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------
// One process.

fn local_checkpoint() -> (tempfile::TempDir, PathBuf, Vec<PathBuf>) {
    let dir = tempdir().unwrap();
    let index = write_checkpoint(dir.path());
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
    let report = prefetch(
        &index,
        &PrefetchOptions::new()
            .local_rank(0, 1)
            .chunk_size(CHUNK)
            .memory_available(available),
    )
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
    let options = PrefetchOptions::new().local_rank(0, 1).chunk_size(CHUNK);
    let cold = prefetch(&index, &options).unwrap();
    // Some chunks arrive with the kernel's read-ahead for the one before.
    assert!(cold.warmed() > 0 && cold.warmed() <= total, "{cold}");
    assert_eq!(cold.resident_after(), Some(total));
    assert_all_resident(&shards);
    let warm = prefetch(&index, &options).unwrap();
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
        let report: PrefetchReport = prefetch(
            &index,
            &PrefetchOptions::new()
                .local_rank(0, 1)
                .chunk_size(CHUNK)
                .method(method),
        )
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

/// A checkpoint of one 1 MiB file in a directory anyone may read; its size.
fn readable_checkpoint() -> (tempfile::TempDir, PathBuf, u64) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = write_single(dir.path(), &[spec("w", Dtype::U8, &[1 << 20])]);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    sync(std::slice::from_ref(&path));
    let size = total_size(std::slice::from_ref(&path));
    (dir, path, size)
}

#[test]
fn when_cachestat_is_refused_mincore_tells_residency() {
    let (_dir, path, size) = readable_checkpoint();
    let run = || {
        let mut cmd = child_command("probe", &path);
        cmd.env(NO_CACHESTAT, "1");
        probe(cmd)
    };
    // Warm: seen through mincore(2), nothing read.
    std::fs::read(&path).unwrap();
    let Some((known, resident, warmed, method)) = run() else {
        return;
    };
    assert!(known, "residency seen without cachestat(2)");
    assert_eq!((resident, warmed), (size, 0));
    assert_eq!(method, "willneed", "mincore(2) watches the pages land");
    // Cold: mincore(2) says so (it is not "every page present"), and the
    // file is warmed.
    safeload::evict(&path).unwrap();
    let (known, resident, warmed, _) = run().unwrap();
    assert!(known);
    assert_eq!((resident, warmed), (0, size));
    assert_all_resident(std::slice::from_ref(&path));
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
    let (_dir, path, size) = readable_checkpoint();
    safeload::evict(&path).unwrap();
    let mut cmd = child_command("probe", &path);
    cmd.uid(65534).gid(65534);
    let (known, resident, warmed, method) = probe(cmd).unwrap();
    assert!(!known, "hidden, not guessed");
    assert_eq!((resident, warmed), (0, size), "every byte read");
    assert_eq!(method, "pread", "nothing to watch pages land with");
    assert_all_resident(std::slice::from_ref(&path));
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<PrefetchOptions>();
    check::<PrefetchReport>();
    check::<PrefetchMethod>();
}
