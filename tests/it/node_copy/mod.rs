//! One copy per node: local ranks of a job (this test binary run again as
//! separate processes, with the launchers' variables set) load a checkpoint
//! that the policy reads buffered, from a FUSE mount of the test filesystem
//! that counts every byte it serves; they fill one copy in shared memory and
//! each hands out tensors from it. Checked against a naive load of the
//! source files, the mount's byte counters and the node's `Shmem` (memory
//! files are shared memory, counted once however many ranks map them).
//! Ranks killed, stopped, late, another user's, in a memory cgroup, in a
//! private mount namespace with a 64 MiB `/dev/shm`: `faults.rs`; two jobs,
//! a replaced file, filters: `jobs.rs`; another local user planting names
//! in the queue directory: `attacks.rs` (the attacker's process:
//! `attacker.rs`, shared with the benchmark); a holder's serving thread while
//! idle: `serving.rs`; twenty cold runs in which no rank may read alone:
//! `served.rs`.
//!
//! Needs root and /dev/fuse: skipped (loudly) where they are missing, a
//! failure under `SAFELOAD_REQUIRE_FUSE=1`.

mod attacker;
mod attacks;
mod faults;
mod jobs;
mod served;
mod serving;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::child::{PATH, child_command, run_role, wait_for_go};
use crate::common::*;
use safeload::report::NodeCopy;
use safeload::{Loader, PrefetchOptions};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use safetensors::Dtype;
use tempfile::TempDir;

/// This module's path, for `child_command` (its `child` test runs the roles).
const MODULE: &str = module_path!();

/// Set: after loading, hold the tensors until a line arrives on stdin.
pub const HOLD: &str = "SAFELOAD_TEST_NODE_HOLD";
/// The directory of the queue, locks and sockets (`PrefetchOptions::queue_dir`).
const DIR: &str = "SAFELOAD_TEST_NODE_DIR";
/// The chunk size (`PrefetchOptions::chunk_size`).
const CHUNK: &str = "SAFELOAD_TEST_NODE_CHUNK";
/// Set: `disable_mmap(true)` (a local checkpoint, which auto would map).
const BUFFERED: &str = "SAFELOAD_TEST_NODE_BUFFERED";
/// Become this uid (and gid) before loading: another user's rank.
const SETUID: &str = "SAFELOAD_TEST_NODE_SETUID";
/// Set: wait for the parent's word before loading (to be moved into a cgroup).
const HELD: &str = "SAFELOAD_TEST_NODE_HELD";
/// Load only the tensors whose name starts with this (`Loader::filter`).
const FILTER: &str = "SAFELOAD_TEST_NODE_FILTER";

// ---------------------------------------------------------------------------
// The child side.

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[
        ("rank", act_as_rank),
        ("namespace", faults::act_as_namespace),
        ("attacker", attacker::act_from_env),
    ]);
}

fn act_as_rank() {
    if let Ok(uid) = std::env::var(SETUID) {
        let uid: u32 = uid.parse().unwrap();
        // SAFETY: plain system calls on ids; glibc applies them to every
        // thread of the process (this one has only the harness's).
        let (g, u) = unsafe { (libc::setgid(uid), libc::setuid(uid)) };
        assert_eq!((g, u), (0, 0), "setgid/setuid({uid})");
    }
    if std::env::var_os(HELD).is_some() {
        wait_for_go();
    }
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    let mut loader = Loader::new();
    if std::env::var_os(BUFFERED).is_some() {
        loader = loader.disable_mmap(true);
    }
    if let Ok(prefix) = std::env::var(FILTER) {
        loader = loader.filter(move |name| name.starts_with(&prefix));
    }
    let (dir, chunk) = (std::env::var(DIR).ok(), std::env::var(CHUNK).ok());
    if dir.is_some() || chunk.is_some() {
        let mut options = PrefetchOptions::new();
        if let Some(dir) = dir {
            options = options.queue_dir(dir);
        }
        if let Some(chunk) = chunk {
            options = options.chunk_size(chunk.parse().unwrap());
        }
        loader = loader.prefetch_with(options);
    }
    let started = Instant::now();
    let sd = loader.load(&path).unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let text = sd.report().to_string();
    println!("NODE-TIME {seconds:.6}");
    println!("NODE-DIGEST {:016x}", digest_of(&sd));
    for file in &sd.report().files {
        println!("NODE-STRATEGY {}", file.strategy);
        let Some(copy) = &file.node_copy else {
            continue;
        };
        println!("NODE-NOTE {copy}");
        let (maker, from, filled) = match copy {
            NodeCopy::Shared {
                made_by_pid,
                made_by_rank,
                received_from,
                filled_here,
                chunks,
                ..
            } => (
                format!("{made_by_pid}/{made_by_rank}"),
                received_from.map_or("-".to_string(), |p| p.to_string()),
                format!("{filled_here}/{chunks}"),
            ),
            _ => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "NODE-COPY {} {maker} {from} {filled} {} {}",
            copy.as_str(),
            file.bytes_read,
            file.tensor_bytes
        );
    }
    println!("NODE-END");
    eprintln!("{text}");
    std::io::stdout().flush().unwrap();
    if std::env::var_os(HOLD).is_some() {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
    }
    drop(sd);
}

/// FNV-1a over every tensor's name, dtype, shape and bytes, in name order.
pub fn digest(specs: &[Spec]) -> u64 {
    let tensors = specs
        .iter()
        .map(|s| (s.name.as_str(), s.dtype, &s.shape[..], &s.data[..]));
    digest_all(tensors)
}

/// [`digest`] of a load's tensors, without copying them (a rank in a small
/// memory cgroup has no room for a second checkpoint).
fn digest_of(sd: &safeload::StateDict) -> u64 {
    let mut tensors: Vec<_> = sd
        .iter()
        .map(|(n, t)| (n, t.dtype(), t.shape(), t.as_bytes()))
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(b.0));
    digest_all(tensors.into_iter())
}

fn digest_all<'a>(tensors: impl Iterator<Item = (&'a str, Dtype, &'a [usize], &'a [u8])>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for (name, dtype, shape, data) in tensors {
        eat(name.as_bytes());
        eat(format!("{dtype:?}{shape:?}").as_bytes());
        eat(data);
    }
    h
}

// ---------------------------------------------------------------------------
// The parent side.

static JOBS: AtomicUsize = AtomicUsize::new(0);

/// A job id no other test (or earlier run) shares.
pub fn job_id() -> String {
    format!(
        "safeload-node-test-{}-{}",
        std::process::id(),
        JOBS.fetch_add(1, Ordering::Relaxed)
    )
}

/// A checkpoint of `mib` MiB of F32 tensors (2 MiB each) in `shards`
/// files, in `dir`; returns the index and the naive load's digest.
pub fn write_checkpoint(dir: &Path, mib: usize, shards: usize, seed: &str) -> (PathBuf, u64) {
    let specs: Vec<Spec> = (0..mib / 2)
        .map(|i| spec(&format!("{seed}.w{i:03}"), Dtype::F32, &[512, 1024]))
        .collect();
    let index = write_sharded(dir, &specs, shards);
    (index, digest(&naive_load(&shards_of(dir))))
}

/// A checkpoint on a fresh FUSE mount with `options`, cold, counters at 0.
pub struct OnFuse {
    pub source: TempDir,
    pub fs: Mount,
    pub index: PathBuf,
    pub expected: u64,
    pub total: u64,
}

pub fn on_fuse(mib: usize, options: Options) -> OnFuse {
    let source = tempfile::tempdir().unwrap();
    let (_, expected) = write_checkpoint(source.path(), mib, 3, "m");
    let total = total_size(&shards_of(source.path()));
    let fs = Mount::new(source.path(), options).unwrap();
    let index = fs.path().join("model.safetensors.index.json");
    fs.reset_stats();
    OnFuse {
        source,
        fs,
        index,
        expected,
        total,
    }
}

/// A rank started, its stdin and stdout piped.
pub struct Rank {
    pub child: Child,
    out: BufReader<ChildStdout>,
}

/// What a rank printed about its load.
#[derive(Debug)]
pub struct Loaded {
    /// The wall time of the rank's `load` call, in seconds.
    pub seconds: f64,
    pub digest: u64,
    /// Each file's node copy in words.
    pub notes: Vec<String>,
    /// Each file's node copy as data.
    pub copies: Vec<Copied>,
    pub strategies: Vec<String>,
}

/// A file's `NodeCopy` as a rank printed it: its code, and for a shared
/// copy who made it, whom this rank took it from and the chunks it filled;
/// with the file's `bytes_read` and `tensor_bytes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Copied {
    pub code: String,
    /// The maker's pid and local rank.
    pub made_by: Option<(u32, usize)>,
    pub received_from: Option<u32>,
    /// Chunks filled here, of the copy's.
    pub filled: Option<(usize, usize)>,
    pub bytes_read: u64,
    pub tensor_bytes: u64,
}

impl Copied {
    fn parse(line: &str) -> Copied {
        let f: Vec<&str> = line.split(' ').collect();
        let pair = |s: &str| -> Option<(String, String)> {
            let (a, b) = s.split_once('/')?;
            Some((a.to_string(), b.to_string()))
        };
        Copied {
            code: f[0].to_string(),
            made_by: pair(f[1]).map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())),
            received_from: f[2].parse().ok(),
            filled: pair(f[3]).map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())),
            bytes_read: f[4].parse().unwrap(),
            tensor_bytes: f[5].parse().unwrap(),
        }
    }
}

impl Loaded {
    /// Asserts the rank's tensors are `expected`'s bytes and every file of
    /// its load came from the node copy.
    pub fn assert_copied(&self, expected: u64) {
        assert_eq!(self.digest, expected, "{self:?}");
        assert!(self.copies.iter().all(|c| c.code == "shared"), "{self:?}");
    }

    /// Chunks this rank filled, over every file, of the copies' chunks.
    pub fn filled(&self) -> (usize, usize) {
        self.copies
            .iter()
            .filter_map(|c| c.filled)
            .fold((0, 0), |(n, m), (a, b)| (n + a, m + b))
    }
}

/// The command of a rank `rank` of `size` of `job`, on `path`.
pub fn rank_command(
    path: &Path,
    (rank, size): (usize, usize),
    job: &str,
    extra: &[(&str, String)],
) -> Command {
    let mut cmd = child_command(MODULE, "rank", path);
    cmd.env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", size.to_string())
        .env("TORCHELASTIC_RUN_ID", job)
        .stdin(Stdio::piped());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

/// The `size` local ranks of `job` loading `path`, started together.
pub fn spawn_job(path: &Path, size: usize, job: &str, extra: &[(&str, String)]) -> Vec<Rank> {
    (0..size)
        .map(|r| Rank::spawn(path, (r, size), job, extra))
        .collect()
}

impl Rank {
    pub fn spawn(path: &Path, rank: (usize, usize), job: &str, extra: &[(&str, String)]) -> Rank {
        Rank::from_command(rank_command(path, rank, job, extra))
    }

    pub fn from_command(mut cmd: Command) -> Rank {
        let mut child = cmd.spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Rank { child, out }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads the rank's report (it has loaded, and holds its tensors if
    /// told to).
    pub fn loaded(&mut self) -> Loaded {
        self.loaded_within(Duration::from_secs(300))
    }

    /// [`Rank::loaded`], the rank killed and the test failed where no
    /// report came within `limit`, naming what each of its threads waited
    /// in (`/proc/<pid>/task/*/wchan`).
    pub fn loaded_within(&mut self, limit: Duration) -> Loaded {
        let pid = self.pid();
        let done = Arc::new(AtomicBool::new(false));
        let watching = Arc::clone(&done);
        let watchdog = std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < limit {
                if watching.load(Ordering::Acquire) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let threads = thread_waits(pid);
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid as i32).unwrap(),
                rustix::process::Signal::KILL,
            );
            Some(threads)
        });
        let report = self.read_report();
        done.store(true, Ordering::Release);
        let stuck = watchdog.join().unwrap();
        match (report, stuck) {
            (Some(loaded), None) => loaded,
            (_, Some(threads)) => {
                panic!("rank {pid} gave no report within {limit:?}; its threads: {threads:?}")
            }
            (None, None) => {
                let status = self.child.wait().unwrap();
                panic!("rank {pid} ended without a report: {status}");
            }
        }
    }

    /// The rank's report; `None` where its output ended first.
    fn read_report(&mut self) -> Option<Loaded> {
        let mut loaded = Loaded {
            seconds: 0.0,
            digest: 0,
            notes: Vec::new(),
            copies: Vec::new(),
            strategies: Vec::new(),
        };
        let mut line = String::new();
        loop {
            line.clear();
            if self.out.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            let line = line.trim_end();
            if let Some((_, t)) = line.split_once("NODE-TIME ") {
                loaded.seconds = t.parse().unwrap();
            } else if let Some(d) = line.split_once("NODE-DIGEST ").map(|(_, d)| d) {
                loaded.digest = u64::from_str_radix(d, 16).unwrap();
            } else if let Some((_, note)) = line.split_once("NODE-NOTE ") {
                loaded.notes.push(note.to_string());
            } else if let Some((_, copy)) = line.split_once("NODE-COPY ") {
                loaded.copies.push(Copied::parse(copy));
            } else if let Some((_, s)) = line.split_once("NODE-STRATEGY ") {
                loaded.strategies.push(s.to_string());
            } else if line.ends_with("NODE-END") {
                return Some(loaded);
            }
        }
    }

    /// Lets a holding rank go, and checks it exits cleanly.
    pub fn release(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = writeln!(stdin, "go");
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "rank failed: {status}");
    }
}

/// Per thread of process `pid`: its name and the kernel function it
/// sleeps in (`wchan`), to say where a rank that hangs waits.
pub fn thread_waits(pid: u32) -> Vec<(String, String)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .map(|t| {
            let read = |f: &str| {
                std::fs::read_to_string(t.path().join(f))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            };
            (read("comm"), read("wchan"))
        })
        .collect()
}

/// Whether this test must be skipped for want of root (playing another
/// user): says so, or fails under `SAFELOAD_REQUIRE_ROOT=1` (CI).
pub fn skip_without_root() -> bool {
    if rustix::process::geteuid().is_root() {
        return false;
    }
    if std::env::var_os("SAFELOAD_REQUIRE_ROOT").is_some_and(|v| v == "1") {
        panic!("root is required (SAFELOAD_REQUIRE_ROOT=1): the test plays other users");
    }
    eprintln!("SKIPPED: playing another user needs root");
    true
}

/// The node's shared memory (`Shmem` of /proc/meminfo), in bytes: memory
/// files count there once, however many processes map them.
pub fn shmem() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("Shmem:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kb << 10
}

/// The node copies mapped by the process `pid`: per map, the memory
/// file's inode and the map's length (from `/proc/<pid>/maps`).
pub fn copies_mapped(pid: u32) -> Vec<(u64, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|l| l.contains("memfd:safeload-node-copy"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (start, end) = f[0].split_once('-').unwrap();
            let len =
                u64::from_str_radix(end, 16).unwrap() - u64::from_str_radix(start, 16).unwrap();
            (f[4].parse().unwrap(), len)
        })
        .collect()
}

/// The safeload files left in `dir`.
pub fn leftovers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("safeload-"))
        .collect();
    names.sort();
    names
}

/// Asserts that no safeload file is left in `dir`.
pub fn assert_no_leftovers(dir: &Path) {
    let left = leftovers(dir);
    assert!(left.is_empty(), "{left:?}");
}

/// A private directory for the queue, locks and sockets, open to every
/// user (as `/dev/shm` is).
pub fn private_dir() -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// Three ranks of one job, no option set, on the 2 ms mount: each byte is
/// served once, every rank hands out the same tensors as a naive load, the
/// node holds the checkpoint once in shared memory while they all hold
/// their tensors, each chunk was filled by exactly one rank, and they leave
/// nothing behind. Each rank's report carries the copy as data: one rank
/// made every copy, the other two took them from a rank of the job (the
/// maker's pid and local rank named), the chunks filled add up to the
/// copies' chunks, and the `bytes_read` of the three ranks to the tensor
/// data once (the headers the chunks hold counted nowhere).
#[test]
fn three_ranks_fill_one_copy_and_each_maps_it() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(
        48,
        Options {
            latency: Some(Duration::from_millis(2)),
            ..Options::default()
        },
    );
    let job = job_id();
    let shm_before = shmem();
    let hold = [(HOLD, "1".to_string())];
    let mut ranks = spawn_job(&setup.index, 3, &job, &hold);
    let reports: Vec<Loaded> = ranks.iter_mut().map(Rank::loaded).collect();
    let shm_held = shmem().saturating_sub(shm_before);
    let maps: Vec<Vec<(u64, u64)>> = ranks.iter().map(|r| copies_mapped(r.pid())).collect();
    let served = setup.fs.stats().bytes_read;
    let pids: Vec<u32> = ranks.iter().map(Rank::pid).collect();
    for rank in ranks {
        rank.release();
    }
    let total = setup.total;
    eprintln!(
        "3 ranks, {total} bytes: {served} served ({:.3}x), shared memory +{shm_held} ({:.3}x)",
        served as f64 / total as f64,
        shm_held as f64 / total as f64
    );
    for r in &reports {
        assert_eq!(
            r.digest, setup.expected,
            "byte-identical to a naive load: {r:?}"
        );
        assert_eq!(r.notes.len(), 3, "{r:?}");
        assert!(
            r.notes.iter().all(|n| n.starts_with("filled here")),
            "{r:?}"
        );
        assert_eq!(r.copies.len(), 3, "{r:?}");
        assert!(r.copies.iter().all(|c| c.code == "shared"), "{r:?}");
    }
    // The typed node copy: who made it, whom each rank took it from.
    let makers: Vec<usize> = (0..3)
        .filter(|&i| reports[i].copies.iter().all(|c| c.received_from.is_none()))
        .collect();
    assert_eq!(makers.len(), 1, "one rank made the copies: {reports:?}");
    let maker = makers[0];
    for (i, r) in reports.iter().enumerate() {
        for c in &r.copies {
            assert_eq!(c.made_by, Some((pids[maker], maker)), "rank {i}: {c:?}");
            if i != maker {
                let from = c.received_from.expect("taken from another rank");
                assert!(from != pids[i] && pids.contains(&from), "rank {i}: {c:?}");
            }
        }
    }
    let tensor_data: u64 = reports[0].copies.iter().map(|c| c.tensor_bytes).sum();
    let read: u64 = reports
        .iter()
        .flat_map(|r| &r.copies)
        .map(|c| c.bytes_read)
        .sum();
    assert_eq!(read, tensor_data, "bytes_read counts tensor data, once");
    assert!(
        served as f64 <= 1.05 * total as f64,
        "{served} bytes served for {total}"
    );
    // The node's memory for the copy: each rank maps the same three memory
    // files, whose sizes add up to the checkpoint once. (`Shmem`, printed
    // above, says the same when no other test of the binary runs beside.)
    let mut unique: Vec<(u64, u64)> = maps.concat();
    unique.sort_unstable();
    unique.dedup();
    assert!(maps.iter().all(|m| m.len() == 3), "{maps:?}");
    assert_eq!(
        unique.len(),
        3,
        "one memory file per file, shared: {maps:?}"
    );
    let copy: u64 = unique.iter().map(|&(_, len)| len).sum();
    assert!(
        copy >= total && copy <= total + 3 * 4096,
        "{copy} for {total}"
    );
    let (filled, chunks): (Vec<usize>, Vec<usize>) = reports.iter().map(Loaded::filled).unzip();
    assert_eq!(
        filled.iter().sum::<usize>(),
        chunks[0],
        "each chunk once: {filled:?}"
    );
    assert_eq!(
        reports
            .iter()
            .filter(|r| r.notes[0].contains("made here"))
            .count(),
        1
    );
    // Nothing of theirs is left in /dev/shm.
    let left: Vec<String> = leftovers(Path::new("/dev/shm"))
        .into_iter()
        .filter(|n| pids.iter().any(|p| n.contains(&format!("{p:08x}.sock"))))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// One rank alone loads as before: no copy, nothing said.
#[test]
fn one_rank_alone_makes_no_copy() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(8, Options::default());
    let mut rank = Rank::spawn(&setup.index, (0, 1), &job_id(), &[]);
    let r = rank.loaded();
    rank.release();
    assert_eq!(r.digest, setup.expected);
    assert!(r.notes.is_empty(), "{r:?}");
    assert!(r.strategies.iter().all(|s| s == "buffered"), "{r:?}");
}

/// `HF_SHARD_PREFETCH` set for ranks whose files are read buffered: the
/// copy is filled, and nothing is read a second time to warm the page cache.
#[test]
fn prefetch_from_the_environment_fills_the_copy_and_reads_nothing_twice() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(16, Options::default());
    let job = job_id();
    let env = [("HF_SHARD_PREFETCH", "4".to_string())];
    let mut ranks = spawn_job(&setup.index, 2, &job, &env);
    for rank in &mut ranks {
        let r = rank.loaded();
        r.assert_copied(setup.expected);
    }
    for rank in ranks {
        rank.release();
    }
    let served = setup.fs.stats().bytes_read;
    assert!(
        served as f64 <= 1.05 * setup.total as f64,
        "{served} served for {}",
        setup.total
    );
}

/// The benchmark's seam (`SAFELOAD_NODE_COPY=0`, benches/node_copy.rs's
/// "today" arms): two ranks each read every file alone, as before the node
/// copy, with nothing said; the same bytes.
#[test]
fn the_benchmarks_switch_turns_the_copy_off() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(8, Options::default());
    let job = job_id();
    let off = [(safeload::NODE_COPY_ENV, "0".to_string())];
    let mut ranks: Vec<Rank> = (0..2)
        .map(|r| Rank::spawn(&setup.index, (r, 2), &job, &off))
        .collect();
    for rank in &mut ranks {
        let r = rank.loaded();
        assert_eq!(r.digest, setup.expected, "{r:?}");
        assert!(r.notes.is_empty(), "{r:?}");
        assert!(r.strategies.iter().all(|s| s == "buffered"), "{r:?}");
    }
    for rank in ranks {
        rank.release();
    }
    // Each rank read every byte (and its headers, and O_DIRECT's rounding).
    let served = setup.fs.stats().bytes_read;
    assert!(
        served as f64 >= 1.95 * setup.total as f64,
        "{served} served for {}",
        setup.total
    );
}
