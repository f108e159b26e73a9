//! `cargo bench --bench load`: safeload against the loaders Rust engines use today.
//!
//! Generates a synthetic sharded checkpoint (kept between runs under
//! `bench-data/`), then for each scenario (warm page cache, cold, a FUSE mount
//! with 2 ms per read, the same with reads serialized) runs every arm in a
//! child process of its own, arms interleaved (shuffled each round), for
//! several rounds.
//! Each arm loads the checkpoint and checksums every tensor byte on the same
//! pool of threads, so lazy loaders pay for their reads; the child reports
//! seconds, its CPU time in the kernel and peak RSS. A "limit" arm reads the
//! same bytes with plain large `pread`s into reused buffers: the storage's
//! streaming speed. A "fresh" arm makes the same reads into one map of fresh
//! memory the size of the checkpoint, faulted in by the reads: what a load
//! into memory of its own costs at best here (`x fresh`). Prints a markdown
//! table of medians (min-max), each arm's slowest round over its median, and
//! writes every sample as JSON.
//!
//! ```text
//! cargo bench --bench load -- [--size-gib 2] [--shards 8] [--rounds 3]
//!     [--scenarios warm,cold,fuse,fuse-serial] [--arms a,b,..] [--checksum-threads 4]
//!     [--limit-threads 8] [--dir bench-data] [--json bench-data/load.json] [--timeout 600]
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use safetensors::SafeTensors;

mod common;

use common::child::{self, Child, Job};
use common::data;
use common::stats::{Spread, gib_s, median};
use common::{args, fuse, proc};

/// The arms run by default.
const DEFAULT_ARMS: [&str; 13] = [
    "limit",
    "limit-direct",
    "fresh-direct",
    "safeload-auto",
    "safeload-mmap",
    "safeload-buffered",
    "safeload-buffered-direct",
    "safeload-populate",
    "safeload-prefetch",
    "memmap2",
    "memmap2-4t",
    "fs-read",
    "fs-read-4t",
];
/// Arms for tuning, run when named with `--arms` (and `fresh-...`, see
/// [`FreshArm`]).
const EXTRA_ARMS: [&str; 12] = [
    "safeload-auto-prefetch",
    "safeload-buffered-huge-on",
    "safeload-buffered-huge-off",
    "safeload-huge-on",
    "safeload-huge-off",
    "safeload-buffered-direct-huge-on",
    "safeload-buffered-direct-huge-off",
    "safeload-prefetch-static",
    "safeload-auto-io1",
    "safeload-auto-io32",
    "safeload-verify",
    "safeload-buffered-direct-verify",
];
const SCENARIOS: [&str; 9] = [
    "warm",
    "cold",
    "fuse",
    "fuse-serial",
    "cold-3ranks",
    // hf-mount-like mounts of the test filesystem (a daemon of N threads,
    // each request answered after its latency), and one modelling a remote
    // chunk store behind read-ahead (a first-byte delay per 32 MiB block,
    // a bandwidth cap).
    "fuse-2ms-8t",
    "fuse-8ms-32t",
    "fuse-serial-2ms",
    "fuse-remote",
];
/// The plain-read limit arms: `limit` and `limit-direct` (with
/// `--limit-threads` readers), `limit-N` and `limit-direct-N` (N readers);
/// `-fresh` after `limit` or `limit-direct` reads every chunk into memory of
/// its own, kept to the end, as a load must (the plain limit reuses one
/// buffer per reader, and so never pays for fresh memory).
#[derive(Debug, Clone, Copy, PartialEq)]
struct LimitArm {
    threads: Option<usize>,
    direct: bool,
    fresh: bool,
}

/// The fresh-memory arms, `fresh[-direct][-huge][-N]`: the limit's reads
/// (16 MiB `pread`s pulled from one queue by N readers, `--limit-threads`
/// without `-N`; `O_DIRECT` with `-direct`) into one fresh anonymous map the
/// size of the checkpoint, each
/// file at its offset, faulted in by the reads themselves (plain pages; with
/// `-huge`, `MADV_HUGEPAGE` on the map), then checksummed as the loaders'
/// arms are. What any load into memory of its own costs on this storage:
/// the bound a buffered load is measured against.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FreshArm {
    threads: Option<usize>,
    direct: bool,
    huge: bool,
}

fn fresh_arm(arm: &str) -> Option<FreshArm> {
    let rest = arm.strip_prefix("fresh")?;
    let (direct, rest) = match rest.strip_prefix("-direct") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let (huge, rest) = match rest.strip_prefix("-huge") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let threads = match rest {
        "" => None,
        n => Some(n.strip_prefix('-')?.parse().ok().filter(|&n| n > 0)?),
    };
    Some(FreshArm {
        threads,
        direct,
        huge,
    })
}

fn limit_arm(arm: &str) -> Option<LimitArm> {
    let (direct, rest) = match arm.strip_prefix("limit-direct") {
        Some(rest) => (true, rest),
        None => (false, arm.strip_prefix("limit")?),
    };
    let (fresh, rest) = match rest.strip_prefix("-fresh") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let threads = match rest {
        "" => None,
        n => Some(n.strip_prefix('-')?.parse().ok()?),
    };
    Some(LimitArm {
        threads,
        direct,
        fresh,
    })
}

/// Local ranks in the multi-process scenario.
const RANKS: usize = 3;

/// safeload against the loaders Rust engines use today (the module docs of
/// benches/load.rs say how).
#[derive(Parser)]
#[command(name = "load", after_help = arms_help())]
struct Options {
    /// The checkpoint's size, GiB.
    #[arg(long, default_value_t = 2.0)]
    size_gib: f64,
    #[arg(long, default_value_t = 8)]
    shards: usize,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    #[arg(long, value_delimiter = ',', default_values = SCENARIOS, value_parser = SCENARIOS)]
    scenarios: Vec<String>,
    #[arg(long, value_delimiter = ',', default_values = DEFAULT_ARMS, value_parser = arm_name)]
    arms: Vec<String>,
    /// Threads that checksum the tensors in each child.
    #[arg(long, default_value_t = 4)]
    checksum_threads: usize,
    /// Readers of the `limit` and `limit-direct` arms.
    #[arg(long, default_value_t = 8)]
    limit_threads: usize,
    /// Where the checkpoint is written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
    /// Where every sample is written.
    #[arg(long, default_value = "bench-data/load.json")]
    json: PathBuf,
    /// Seconds before an arm's process is killed.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

fn arms_help() -> String {
    format!(
        "arms: {DEFAULT_ARMS:?} by default, and {EXTRA_ARMS:?}, and \
         limit[-direct][-fresh][-N] (N readers), fresh[-direct][-huge][-N]"
    )
}

fn arm_name(arm: &str) -> Result<String, String> {
    if DEFAULT_ARMS.contains(&arm)
        || EXTRA_ARMS.contains(&arm)
        || limit_arm(arm).is_some()
        || fresh_arm(arm).is_some()
    {
        Ok(arm.to_string())
    } else {
        Err(arms_help())
    }
}

fn main() {
    if let Some(job) = Job::from_env() {
        run_child(&job);
        return;
    }
    if let Err(e) = parent(&args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- parent

#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Sample {
    scenario: String,
    arm: String,
    round: usize,
    seconds: f64,
    bytes: u64,
    checksum: u64,
    maxrss_kib: u64,
    /// CPU seconds of the arm's process(es), in the kernel and in user
    /// space (`getrusage(2)`, summed over ranks).
    #[serde(default)]
    sys_seconds: f64,
    #[serde(default)]
    user_seconds: f64,
    /// Bytes this arm's process(es) caused to be read from storage
    /// (`read_bytes` of /proc/self/io, summed over ranks).
    read_bytes: u64,
    /// Bytes the FUSE test mount served in answers to `READ` requests
    /// during the arm (0 off FUSE).
    #[serde(default)]
    served: u64,
    /// What safeload said of the files (strategies, direct I/O).
    note: Option<String>,
    error: Option<String>,
}

fn parent(o: &Options) -> Result<(), String> {
    let size = (o.size_gib * (1u64 << 30) as f64) as u64;
    let stem = data::stem(size, o.shards);
    let root = data::checkpoint(&o.dir, &stem, &data::sharded(size, o.shards))
        .map_err(|e| format!("generating: {e}"))?;
    let files = data::shard_files(&root);
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    eprintln!(
        "checkpoint: {} ({} files, {:.2} GiB); {} round(s), arms interleaved",
        root.display(),
        files.len(),
        total as f64 / (1u64 << 30) as f64,
        o.rounds
    );
    let mut samples: Vec<Sample> = Vec::new();
    for scenario in &o.scenarios {
        let mount = match scenario.as_str() {
            s if fuse::HF_MOUNT_SCENARIOS.contains(&s) => Some(fuse::hf_mount(s, &root)?),
            "fuse" | "fuse-serial" => Some(
                safeload_testfs::Mount::new(
                    &root,
                    safeload_testfs::Options {
                        fsname: "bench-fuse".into(),
                        latency: Some(Duration::from_millis(2)),
                        max_concurrent_reads: (scenario == "fuse-serial").then_some(1),
                        ..Default::default()
                    },
                )
                .map_err(|e| format!("mounting the FUSE test filesystem: {e}"))?,
            ),
            _ => None,
        };
        let path = mount
            .as_ref()
            .map_or(root.clone(), |m| m.path().to_path_buf());
        for round in 0..o.rounds {
            for a in common::shuffled(o.arms.len(), round) {
                let arm = &o.arms[a];
                if scenario == "warm" {
                    let _ = data::warm(&root);
                } else {
                    let _ = data::evict(&[&root, &path]);
                    if let Some(mount) = &mount {
                        // The remote store's blocks are cold again too.
                        mount.forget_fetched();
                    }
                }
                if let Some(mount) = &mount {
                    mount.reset_stats();
                }
                let mut sample = if scenario == "cold-3ranks" {
                    run_ranks(o, scenario, arm, round, &path)
                } else {
                    run_arm_child(o, scenario, arm, round, &path, None)
                };
                if let Some(mount) = &mount {
                    sample.served = mount.stats().bytes_read;
                }
                eprintln!(
                    "  {scenario:<11} round {round} {arm:<26} {:>8.3} s {:>6.2} s sys {:>7.2} GiB/s {:>7} MiB RSS {:>7} MiB read {:>5.2}x served{}{}",
                    sample.seconds,
                    sample.sys_seconds,
                    gib_s(sample.bytes, sample.seconds),
                    sample.maxrss_kib >> 10,
                    sample.read_bytes >> 20,
                    sample.served as f64 / total as f64,
                    sample
                        .note
                        .as_deref()
                        .map(|n| format!("  ({n})"))
                        .unwrap_or_default(),
                    sample
                        .error
                        .as_deref()
                        .map(|e| format!("  ERROR {e}"))
                        .unwrap_or_default()
                );
                samples.push(sample);
            }
        }
        drop(mount);
    }
    check_checksums(&samples);
    let table = markdown(&samples, o, total);
    println!("{table}");
    common::write_samples(&o.json, &root, files.len(), total, &samples)?;
    Ok(())
}

/// Runs an arm in `RANKS` processes at once, as the local ranks of one job
/// (torchrun's variables): the sample's time is the slowest rank's, its
/// bytes read from storage the sum.
fn run_ranks(o: &Options, scenario: &str, arm: &str, round: usize, path: &Path) -> Sample {
    let samples: Vec<Sample> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RANKS)
            .map(|rank| {
                scope.spawn(move || run_arm_child(o, scenario, arm, round, path, Some(rank)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    let mut merged = samples[0].clone();
    merged.seconds = samples.iter().map(|s| s.seconds).fold(0.0, f64::max);
    merged.read_bytes = samples.iter().map(|s| s.read_bytes).sum();
    merged.maxrss_kib = samples.iter().map(|s| s.maxrss_kib).max().unwrap_or(0);
    merged.sys_seconds = samples.iter().map(|s| s.sys_seconds).sum();
    merged.user_seconds = samples.iter().map(|s| s.user_seconds).sum();
    merged.error = samples.iter().find_map(|s| s.error.clone());
    merged
}

/// What a child prints.
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    seconds: f64,
    bytes: u64,
    checksum: u64,
    maxrss_kib: u64,
    sys_seconds: f64,
    user_seconds: f64,
    read_bytes: u64,
    error: Option<String>,
}

/// Runs `arm` in a child process (as local rank `rank` of `RANKS`, if
/// given), with none of the environment variables that would change what
/// safeload does.
fn run_arm_child(
    o: &Options,
    scenario: &str,
    arm: &str,
    round: usize,
    path: &Path,
    rank: Option<usize>,
) -> Sample {
    let mut child = Child::new(arm, path)
        .arg(o.checksum_threads.to_string())
        .arg(o.limit_threads.to_string())
        .env_remove(&[
            "SAFELOAD_DISABLE_MMAP",
            "SAFELOAD_PREFETCH",
            "SAFELOAD_HUGE_PAGES",
            "HF_SHARD_PREFETCH",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "SLURM_LOCALID",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
        ])
        .timeout(Duration::from_secs(o.timeout));
    if let Some(rank) = rank {
        child = child
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", RANKS.to_string());
    }
    let mut sample = Sample {
        scenario: scenario.into(),
        arm: arm.into(),
        round,
        seconds: f64::NAN,
        bytes: 0,
        checksum: 0,
        maxrss_kib: 0,
        sys_seconds: f64::NAN,
        user_seconds: f64::NAN,
        read_bytes: 0,
        served: 0,
        note: None,
        error: None,
    };
    match child.run::<Figures>() {
        Ok(out) => {
            let f = out.figures;
            sample.seconds = f.seconds;
            sample.bytes = f.bytes;
            sample.checksum = f.checksum;
            sample.maxrss_kib = f.maxrss_kib;
            sample.sys_seconds = f.sys_seconds;
            sample.user_seconds = f.user_seconds;
            sample.read_bytes = f.read_bytes;
            sample.error = f.error;
            sample.note = out
                .stderr
                .lines()
                .find(|l| l.contains("files buffered"))
                .map(str::to_string);
        }
        Err(e) => sample.error = Some(e),
    }
    sample
}

fn check_checksums(samples: &[Sample]) {
    let mut seen: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.error.is_none()) {
        seen.entry(s.checksum)
            .or_default()
            .push(format!("{}/{}", s.scenario, s.arm));
    }
    if seen.len() > 1 {
        eprintln!("CHECKSUM MISMATCH between arms: {seen:?}");
        std::process::exit(3);
    }
}

fn markdown(samples: &[Sample], o: &Options, total: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "checkpoint {:.2} GiB in {} shards; {} rounds; medians (min-max); checksum on {} threads\n",
        total as f64 / (1u64 << 30) as f64,
        o.shards,
        o.rounds,
        o.checksum_threads
    );
    let _ = writeln!(
        out,
        "| scenario | arm | seconds | slowest / median | sys s | GiB/s | x limit | x fresh | peak RSS MiB | read from storage MiB | served by FUSE x checkpoint |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for scenario in &o.scenarios {
        let of = |arm: &str| -> Vec<&Sample> {
            samples
                .iter()
                .filter(|s| &s.scenario == scenario && s.arm == arm)
                .collect()
        };
        let ok = |arm: &str| -> Vec<f64> {
            of(arm)
                .iter()
                .filter(|s| s.error.is_none())
                .map(|s| s.seconds)
                .collect()
        };
        // The limit: the fastest of the plain-read arms run here.
        let limit = o
            .arms
            .iter()
            .filter(|a| limit_arm(a).is_some())
            .map(|a| median(&ok(a)))
            .filter(|s| s.is_finite())
            .fold(f64::INFINITY, f64::min);
        // The bound of a load into memory of its own: the fastest of the
        // fresh-memory arms run here.
        let fresh = o
            .arms
            .iter()
            .filter(|a| fresh_arm(a).is_some())
            .map(|a| median(&ok(a)))
            .filter(|s| s.is_finite())
            .fold(f64::INFINITY, f64::min);
        for arm in &o.arms {
            let runs = of(arm);
            let seconds = Spread::of(&ok(arm));
            let errors = runs.len() - ok(arm).len();
            let m = seconds.median;
            let of_runs =
                |f: fn(&Sample) -> f64| median(&runs.iter().map(|s| f(s)).collect::<Vec<_>>());
            let rss = of_runs(|s| s.maxrss_kib as f64 / 1024.0);
            let sys = Spread::of(
                &runs
                    .iter()
                    .filter(|s| s.error.is_none())
                    .map(|s| s.sys_seconds)
                    .collect::<Vec<_>>(),
            );
            let read = of_runs(|s| s.read_bytes as f64 / (1 << 20) as f64);
            let served = median(
                &runs
                    .iter()
                    .map(|s| s.served as f64 / total as f64)
                    .collect::<Vec<_>>(),
            );
            let err = if errors > 0 {
                format!(" ({errors} failed)")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {scenario} | {arm}{err} | {seconds:.3} | {:.2} | {sys:.2} | {:.2} | {} | {} | {rss:.0} | {read:.0} | {served:.2} |",
                seconds.max / m,
                gib_s(total, m),
                ratio(limit, m),
                ratio(fresh, m),
            );
        }
    }
    out
}

/// `bound / seconds` to two places, or nothing where no bound arm ran.
fn ratio(bound: f64, seconds: f64) -> String {
    let x = bound / seconds;
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        String::new()
    }
}

// ---------------------------------------------------------------- child

/// A child: `--child ARM PATH CHECKSUM_THREADS LIMIT_THREADS`.
fn run_child(job: &Job) {
    let threads: usize = job.extra(0);
    let limit_threads: usize = job.extra(1);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let start = Instant::now();
    let result = pool.install(|| run_arm(&job.arm, &job.path, limit_threads));
    let seconds = start.elapsed().as_secs_f64();
    let (bytes, checksum, error) = match result {
        Ok((b, c)) => (b, c, None),
        Err(e) => (0, 0, Some(e)),
    };
    let (user_seconds, sys_seconds) = proc::cpu_seconds();
    child::report(&Figures {
        seconds,
        sys_seconds,
        user_seconds,
        bytes,
        checksum,
        maxrss_kib: proc::max_rss_kib(),
        read_bytes: proc::read_bytes(),
        error,
    });
}

/// Bytes and checksum of tensors, on the current rayon pool: every tensor
/// cut into 4 MiB pieces, all pieces in parallel, so that many small tensors
/// and a few large ones keep every thread busy alike.
fn sum_tensors<'a>(tensors: impl Iterator<Item = &'a [u8]>) -> (u64, u64) {
    use rayon::prelude::*;
    let pieces: Vec<&[u8]> = tensors.flat_map(|t| t.chunks(4 << 20)).collect();
    pieces
        .par_iter()
        .map(|p| (p.len() as u64, data::checksum(p)))
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1.wrapping_add(b.1)))
}

type ArmResult = Result<(u64, u64), String>;

fn run_arm(arm: &str, path: &Path, limit_threads: usize) -> ArmResult {
    let files = data::shard_files(path);
    match arm {
        _ if let Some(l) = limit_arm(arm) => limit(
            &files,
            l.threads.unwrap_or(limit_threads),
            (l.direct, l.fresh),
        ),
        _ if let Some(f) = fresh_arm(arm) => fresh(&files, f.threads.unwrap_or(limit_threads), f),
        "memmap2" => baseline(&files, 1, true),
        "memmap2-4t" => baseline(&files, 4, true),
        "fs-read" => baseline(&files, 1, false),
        "fs-read-4t" => baseline(&files, 4, false),
        _ => {
            let loader = match arm {
                "safeload-auto" => safeload::Loader::new(),
                "safeload-auto-io1" => safeload::Loader::new().io_concurrency(1),
                // The page size of fresh memory forced, beside auto's measured choice.
                "safeload-huge-on" => safeload::Loader::new().huge_pages(safeload::HugePages::On),
                "safeload-huge-off" => safeload::Loader::new().huge_pages(safeload::HugePages::Off),
                "safeload-auto-io32" => safeload::Loader::new().io_concurrency(32),
                "safeload-mmap" => safeload::Loader::new().disable_mmap(false),
                "safeload-buffered" => safeload::Loader::new().disable_mmap(true).direct_io(false),
                "safeload-buffered-direct" => {
                    safeload::Loader::new().disable_mmap(true).direct_io(true)
                }
                "safeload-buffered-huge-on" => safeload::Loader::new()
                    .disable_mmap(true)
                    .direct_io(false)
                    .huge_pages(safeload::HugePages::On),
                "safeload-buffered-huge-off" => safeload::Loader::new()
                    .disable_mmap(true)
                    .direct_io(false)
                    .huge_pages(safeload::HugePages::Off),
                "safeload-buffered-direct-huge-on" => safeload::Loader::new()
                    .disable_mmap(true)
                    .direct_io(true)
                    .huge_pages(safeload::HugePages::On),
                "safeload-buffered-direct-huge-off" => safeload::Loader::new()
                    .disable_mmap(true)
                    .direct_io(true)
                    .huge_pages(safeload::HugePages::Off),
                "safeload-populate" => safeload::Loader::new().disable_mmap(false).populate(true),
                // The cost of integrity: every file's SHA-256, mapped files in a
                // pass of their own, buffered ones as their chunks land.
                "safeload-verify" => safeload::Loader::new().verify(true),
                "safeload-buffered-direct-verify" => safeload::Loader::new()
                    .disable_mmap(true)
                    .direct_io(true)
                    .verify(true),
                "safeload-prefetch" => safeload::Loader::new().disable_mmap(false).prefetch(4),
                // A prefetch under the auto policy (`SAFELOAD_PREFETCH=4`): on
                // FUSE the files are then read buffered, from the page cache.
                "safeload-auto-prefetch" => safeload::Loader::new().prefetch(4),
                "safeload-prefetch-static" => {
                    safeload::Loader::new().disable_mmap(false).prefetch_with(
                        safeload::PrefetchOptions::new()
                            .streams(4)
                            .shared_queue(false),
                    )
                }
                other => return Err(format!("unknown arm {other}")),
            };
            let sd = loader.load(path).map_err(|e| e.to_string())?;
            let files = &sd.report().files;
            let direct = files
                .iter()
                .filter(|f| f.direct_io == safeload::report::DirectIo::On)
                .count();
            let buffered = files
                .iter()
                .filter(|f| f.strategy == safeload::report::Strategy::Buffered)
                .count();
            let io = sd
                .report()
                .io_concurrency_reason
                .as_ref()
                .map(|r| format!("; {r}"))
                .unwrap_or_default();
            let fresh = sd
                .report()
                .fresh_memory
                .as_ref()
                .map(|f| format!("; {f}"))
                .unwrap_or_default();
            eprintln!(
                "{buffered}/{} files buffered, {direct} with O_DIRECT{io}{fresh}",
                files.len()
            );
            Ok(sum_tensors(sd.tensors().iter().map(|t| t.as_bytes())))
        }
    }
}

/// What engines do today: per shard, map it (or read it whole) and parse it
/// with `safetensors`, on `threads` threads; every tensor is checksummed.
fn baseline(files: &[PathBuf], threads: usize, mmap: bool) -> ArmResult {
    let next = AtomicUsize::new(0);
    let results: Vec<ArmResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut acc = (0u64, 0u64);
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(file) = files.get(i) else { break };
                        let f = File::open(file).map_err(|e| e.to_string())?;
                        let (b, c) = if mmap {
                            // SAFETY: the benchmark's files are not modified while mapped.
                            let map =
                                unsafe { memmap2::Mmap::map(&f) }.map_err(|e| e.to_string())?;
                            let st = SafeTensors::deserialize(&map).map_err(|e| e.to_string())?;
                            sum_tensors(st.tensors().iter().map(|(_, v)| v.data()))
                        } else {
                            let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
                            let st = SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
                            sum_tensors(st.tensors().iter().map(|(_, v)| v.data()))
                        };
                        acc = (acc.0 + b, acc.1.wrapping_add(c));
                    }
                    Ok(acc)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    results.into_iter().try_fold((0u64, 0u64), |acc, r| {
        r.map(|(b, c)| (acc.0 + b, acc.1.wrapping_add(c)))
    })
}

/// The storage's streaming speed: `threads` readers pulling 16 MiB chunks of
/// every file from one queue, `pread` into a reused buffer, checksumming the
/// tensor bytes of each (the header is skipped, so the sum matches).
fn limit(files: &[PathBuf], threads: usize, (direct, fresh): (bool, bool)) -> ArmResult {
    let chunk_mib: u64 = std::env::var("SAFELOAD_BENCH_LIMIT_CHUNK_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let chunk_len = chunk_mib << 20;
    let mut chunks: Vec<(usize, u64, u64, u64)> = Vec::new(); // file, offset, len, data_start
    let mut handles = Vec::new();
    for (i, path) in files.iter().enumerate() {
        let f = File::open(path).map_err(|e| e.to_string())?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let mut prefix = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut prefix, 0).map_err(|e| e.to_string())?;
        let data_start = 8 + u64::from_le_bytes(prefix);
        let f = if direct {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(|e| e.to_string())?
        } else {
            f
        };
        handles.push(f);
        let mut off = 0;
        while off < len {
            chunks.push((i, off, chunk_len.min(len - off), data_start));
            off += chunk_len;
        }
    }
    let next = AtomicUsize::new(0);
    let results: Vec<ArmResult> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut buf = memmap2::MmapMut::map_anon(chunk_len as usize)
                        .map_err(|e| e.to_string())?;
                    // Huge pages: fewer TLB misses for the copy, and direct
                    // reads go out in fewer, larger pieces.
                    let _ = buf.advise(memmap2::Advice::HugePage);
                    let (mut bytes, mut sum) = (0u64, 0u64);
                    let mut kept = Vec::new();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(i, off, len, data_start)) = chunks.get(k) else {
                            break;
                        };
                        if fresh {
                            let new = memmap2::MmapMut::map_anon(chunk_len as usize)
                                .map_err(|e| e.to_string())?;
                            let _ = new.advise(memmap2::Advice::HugePage);
                            kept.push(std::mem::replace(&mut buf, new));
                        }
                        read_piece(&handles[i], &mut buf, off, len, direct)?;
                        // Only tensor bytes count, as for the other arms.
                        let skip = data_start.saturating_sub(off).min(len) as usize;
                        let piece = &buf[skip..len as usize];
                        bytes += piece.len() as u64;
                        sum = sum
                            .wrapping_add(checksum_aligned(piece, off + skip as u64 - data_start));
                    }
                    Ok((bytes, sum))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    results.into_iter().try_fold((0u64, 0u64), |acc, r| {
        r.map(|(b, c)| (acc.0 + b, acc.1.wrapping_add(c)))
    })
}

/// The reads of [`limit`] into one fresh map (see [`FreshArm`]), then every
/// tensor byte checksummed on the current rayon pool, as the loaders' arms.
fn fresh(files: &[PathBuf], threads: usize, arm: FreshArm) -> ArmResult {
    const CHUNK: u64 = 16 << 20;
    // Per file: its descriptor, length, data section start and offset in the map.
    let mut opened = Vec::new();
    let mut total = 0u64;
    for path in files {
        let f = File::open(path).map_err(|e| e.to_string())?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let mut prefix = [0u8; 8];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut prefix, 0).map_err(|e| e.to_string())?;
        let data_start = 8 + u64::from_le_bytes(prefix);
        let f = if arm.direct {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(|e| e.to_string())?
        } else {
            f
        };
        opened.push((f, len, data_start, total));
        total += len.next_multiple_of(CHUNK.max(4096));
    }
    let mut map = memmap2::MmapMut::map_anon(total as usize).map_err(|e| e.to_string())?;
    if arm.huge {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
    // Every chunk of every file (file, offset, length, its place), a
    // disjoint part of the map each.
    type Chunk<'a> = (usize, u64, u64, &'a mut [u8]);
    let mut chunks: Vec<Chunk<'_>> = Vec::new();
    let mut rest: &mut [u8] = &mut map;
    for (i, &(_, len, _, _)) in opened.iter().enumerate() {
        let (mine, tail) = rest.split_at_mut(len.next_multiple_of(CHUNK) as usize);
        rest = tail;
        for (k, piece) in mine.chunks_mut(CHUNK as usize).enumerate() {
            let off = k as u64 * CHUNK;
            if off < len {
                chunks.push((i, off, (len - off).min(CHUNK), piece));
            }
        }
    }
    let queue: Vec<std::sync::Mutex<Option<Chunk<'_>>>> = chunks
        .into_iter()
        .map(|c| std::sync::Mutex::new(Some(c)))
        .collect();
    let next = AtomicUsize::new(0);
    let failed: Vec<String> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| -> Result<(), String> {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        let Some(slot) = queue.get(k) else {
                            return Ok(());
                        };
                        let Some((i, off, len, buf)) = slot.lock().expect("slot").take() else {
                            continue;
                        };
                        read_piece(&opened[i].0, buf, off, len, arm.direct)?;
                    }
                })
            })
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())).err())
            .collect()
    });
    if let Some(e) = failed.into_iter().next() {
        return Err(e);
    }
    let tensors = opened
        .iter()
        .map(|&(_, len, data_start, at)| &map[(at + data_start) as usize..(at + len) as usize]);
    Ok(sum_tensors(tensors))
}

/// The checksum of a piece of the data section that starts `offset` bytes
/// into it: the same words as `checksum` sums tensor by tensor, since every
/// tensor of the generated checkpoint starts and ends on an 8-byte boundary.
fn checksum_aligned(piece: &[u8], offset: u64) -> u64 {
    debug_assert_eq!(offset % 8, 0);
    data::checksum(piece)
}

/// Reads `len` bytes of `file` at `off` into the start of `buf`, in as many
/// reads as it takes; with `direct`, each read asks for whole 4 KiB blocks
/// (`buf` holds `len` rounded up).
fn read_piece(
    file: &std::fs::File,
    buf: &mut [u8],
    off: u64,
    len: u64,
    direct: bool,
) -> Result<(), String> {
    let want = if direct {
        len.next_multiple_of(4096)
    } else {
        len
    } as usize;
    let mut done = 0usize;
    while (done as u64) < len {
        let n = std::os::unix::fs::FileExt::read_at(file, &mut buf[done..want], off + done as u64)
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("short file".into());
        }
        done += n;
    }
    Ok(())
}
