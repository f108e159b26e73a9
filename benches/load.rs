//! `cargo bench --bench load`: safeload against the loaders Rust engines use today.
//!
//! Generates a synthetic sharded checkpoint (kept between runs under
//! `bench-data/`), then for each scenario (warm page cache, cold, a FUSE mount
//! with 2 ms per read, the same with reads serialized) runs every arm in a
//! child process of its own, arms interleaved and rotated, for several rounds.
//! Each arm loads the checkpoint and checksums every tensor byte on the same
//! pool of threads, so lazy loaders pay for their reads; the child reports
//! seconds and peak RSS. A "limit" arm reads the same bytes with plain large
//! `pread`s: the storage's streaming speed. Prints a markdown table of
//! medians (min-max) and writes every sample as JSON.
//!
//! ```text
//! cargo bench --bench load -- [--size-gib 2] [--shards 8] [--rounds 3]
//!     [--scenarios warm,cold,fuse,fuse-serial] [--arms a,b,..] [--checksum-threads 4]
//!     [--dir bench-data] [--json bench-data/load.json] [--timeout 600]
//! ```

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

#[path = "../tests/common/random.rs"]
mod random;

/// The arms run by default.
const DEFAULT_ARMS: [&str; 12] = [
    "limit",
    "limit-direct",
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
/// Arms for tuning, run when named with `--arms`.
const EXTRA_ARMS: [&str; 6] = [
    "safeload-auto-prefetch",
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

/// The FUSE test filesystem as each of the hf-mount-like scenarios mounts
/// it (the measurement matrix of the adaptive-concurrency work).
fn mount_for(scenario: &str, root: &Path) -> Result<safeload_testfs::Mount, String> {
    let base = safeload_testfs::Options {
        fsname: "hf-mount".into(),
        ..Default::default()
    };
    let options = match scenario {
        "fuse-2ms-8t" => safeload_testfs::Options {
            latency: Some(Duration::from_millis(2)),
            daemon_threads: Some(8),
            ..base
        },
        "fuse-8ms-32t" => safeload_testfs::Options {
            latency: Some(Duration::from_millis(8)),
            daemon_threads: Some(32),
            ..base
        },
        "fuse-serial-2ms" => safeload_testfs::Options {
            latency: Some(Duration::from_millis(2)),
            daemon_threads: Some(1),
            ..base
        },
        _ => safeload_testfs::Options {
            latency: Some(Duration::from_millis(1)),
            daemon_threads: Some(16),
            first_byte_delay: Some(Duration::from_millis(60)),
            fetch_block: 32 << 20,
            bandwidth_bytes_per_sec: Some(900_000_000),
            ..base
        },
    };
    safeload_testfs::Mount::new(root, options)
        .map_err(|e| format!("mounting the FUSE test filesystem for {scenario}: {e}"))
}

/// Local ranks in the multi-process scenario.
const RANKS: usize = 3;
/// The version of the bytes `generate` writes, part of the cached
/// checkpoint's directory name: bump it when they change, so that a
/// checkpoint cached by an earlier version is written again instead of being
/// measured as the current one. Version 1 (directories named without a
/// version) was one xorshift stream over all tensors, a 64-bit word per step;
/// version 2 fills each tensor with `random::bytes_for` of its name.
const DATA_VERSION: u32 = 2;

fn usage() -> String {
    format!(
        "usage: cargo bench --bench load -- [--size-gib 2] [--shards 8] [--rounds 3] \
         [--scenarios a,b,..] [--arms a,b,..] [--checksum-threads 4] [--limit-threads 8] \
         [--dir bench-data] [--json bench-data/load.json] [--timeout 600]\n\
         scenarios: {SCENARIOS:?} (all by default)\n\
         arms: {DEFAULT_ARMS:?} by default, and {EXTRA_ARMS:?}"
    )
}

struct Options {
    size_gib: f64,
    shards: usize,
    rounds: usize,
    scenarios: Vec<String>,
    arms: Vec<String>,
    checksum_threads: usize,
    limit_threads: usize,
    dir: PathBuf,
    json: PathBuf,
    timeout: Duration,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        size_gib: 2.0,
        shards: 8,
        rounds: 3,
        scenarios: SCENARIOS.iter().map(|s| s.to_string()).collect(),
        arms: DEFAULT_ARMS.iter().map(|s| s.to_string()).collect(),
        checksum_threads: 4,
        limit_threads: 8,
        dir: PathBuf::from("bench-data"),
        json: PathBuf::from("bench-data/load.json"),
        timeout: Duration::from_secs(600),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--size-gib" => {
                o.size_gib = value()?.parse().map_err(|e| format!("--size-gib: {e}"))?
            }
            "--shards" => o.shards = value()?.parse().map_err(|e| format!("--shards: {e}"))?,
            "--rounds" => o.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--checksum-threads" => {
                o.checksum_threads = value()?.parse().map_err(|e| format!("{e}"))?
            }
            "--limit-threads" => o.limit_threads = value()?.parse().map_err(|e| format!("{e}"))?,
            "--timeout" => {
                o.timeout = Duration::from_secs(value()?.parse().map_err(|e| format!("{e}"))?)
            }
            "--scenarios" => o.scenarios = value()?.split(',').map(str::to_string).collect(),
            "--arms" => o.arms = value()?.split(',').map(str::to_string).collect(),
            "--dir" => o.dir = PathBuf::from(value()?),
            "--json" => o.json = PathBuf::from(value()?),
            "--bench" => {} // passed by `cargo bench`
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{}", usage())),
        }
    }
    for s in &o.scenarios {
        if !SCENARIOS.contains(&s.as_str()) {
            return Err(format!("unknown scenario {s}; known: {SCENARIOS:?}"));
        }
    }
    for a in &o.arms {
        if !DEFAULT_ARMS.contains(&a.as_str())
            && !EXTRA_ARMS.contains(&a.as_str())
            && limit_arm(a).is_none()
        {
            return Err(format!(
                "unknown arm {a}; known: {DEFAULT_ARMS:?} and {EXTRA_ARMS:?}"
            ));
        }
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        std::process::exit(child(&args[1..]));
    }
    let options = match parse_options(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = parent(&options) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- checkpoint

/// Writes `shards` files of about `size / shards` bytes each, with BF16 and
/// F32 tensors of a few sizes (uneven shards: the last is half as large), and
/// the index. Kept between runs, keyed by size, shard count and
/// `DATA_VERSION`.
fn generate(dir: &Path, size: u64, shards: usize) -> std::io::Result<PathBuf> {
    let root = dir.join(format!("ckpt-{}mib-{}-v{DATA_VERSION}", size >> 20, shards));
    let index = root.join("model.safetensors.index.json");
    if index.exists() {
        return Ok(root);
    }
    std::fs::create_dir_all(&root)?;
    let per_shard = size / shards as u64;
    let mut weight_map = serde_json::Map::new();
    for s in 0..shards {
        let name = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let target = if s + 1 == shards {
            per_shard / 2
        } else {
            per_shard
        };
        let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut bytes = 0u64;
        let mut i = 0;
        while bytes < target {
            // 48 MiB, 12 MiB, 3 MiB and 16 KiB tensors in turn.
            let (dtype, rows) = match i % 4 {
                0 => (Dtype::BF16, 6144),
                1 => (Dtype::F32, 768),
                2 => (Dtype::BF16, 384),
                _ => (Dtype::F32, 1),
            };
            let cols = 4096;
            let len = rows * cols * dtype.bitsize() / 8;
            let tensor = format!("layers.{s}.t{i}");
            let data = random::bytes_for(&tensor, len);
            tensors.push((tensor, dtype, vec![rows, cols], data));
            bytes += len as u64;
            i += 1;
        }
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, sh, b)| {
                (
                    n.clone(),
                    TensorView::new(*d, sh.clone(), b).expect("valid view"),
                )
            })
            .collect();
        for (n, ..) in &tensors {
            weight_map.insert(n.clone(), name.clone().into());
        }
        safetensors::serialize_to_file(views, None, &root.join(&name))
            .map_err(std::io::Error::other)?;
    }
    let body = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(&index, serde_json::to_vec(&body)?)?;
    Ok(root)
}

fn shard_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "safetensors"));
    files.sort();
    files
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
    let root = generate(&o.dir, size, o.shards).map_err(|e| format!("generating: {e}"))?;
    let files = shard_files(&root);
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
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut samples: Vec<Sample> = Vec::new();
    for scenario in &o.scenarios {
        let mount = match scenario.as_str() {
            "fuse-2ms-8t" | "fuse-8ms-32t" | "fuse-serial-2ms" | "fuse-remote" => {
                Some(mount_for(scenario, &root)?)
            }
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
            let n = o.arms.len();
            for k in 0..n {
                let arm = &o.arms[(k + round) % n];
                if scenario == "warm" {
                    warm(&files);
                } else {
                    let _ = safeload::evict(&root);
                    let _ = safeload::evict(&path);
                    if let Some(mount) = &mount {
                        // The remote store's blocks are cold again too.
                        mount.forget_fetched();
                    }
                }
                if let Some(mount) = &mount {
                    mount.reset_stats();
                }
                let mut sample = if scenario == "cold-3ranks" {
                    run_ranks(&exe, o, scenario, arm, round, &path)
                } else {
                    run_child_env(&exe, o, scenario, arm, round, &path, None)
                };
                if let Some(mount) = &mount {
                    sample.served = mount.stats().bytes_read;
                }
                eprintln!(
                    "  {scenario:<11} round {round} {arm:<26} {:>8.3} s {:>7.2} GiB/s {:>7} MiB RSS {:>7} MiB read {:>5.2}x served{}{}",
                    sample.seconds,
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
    if let Some(parent) = o.json.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let json = serde_json::json!({
        "checkpoint": root,
        "files": files.len(),
        "bytes": total,
        "machine": machine(),
        "samples": samples,
    });
    std::fs::write(
        &o.json,
        serde_json::to_vec_pretty(&json).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("writing {}: {e}", o.json.display()))?;
    eprintln!("samples written to {}", o.json.display());
    Ok(())
}

fn warm(files: &[PathBuf]) {
    let mut buf = vec![0u8; 16 << 20];
    for f in files {
        if let Ok(mut file) = File::open(f) {
            use std::io::Read;
            while matches!(file.read(&mut buf), Ok(n) if n > 0) {}
        }
    }
}

/// Runs an arm in `RANKS` processes at once, as the local ranks of one job
/// (torchrun's variables): the sample's time is the slowest rank's, its
/// bytes read from storage the sum.
fn run_ranks(
    exe: &Path,
    o: &Options,
    scenario: &str,
    arm: &str,
    round: usize,
    path: &Path,
) -> Sample {
    let samples: Vec<Sample> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RANKS)
            .map(|rank| {
                scope.spawn(move || run_child_env(exe, o, scenario, arm, round, path, Some(rank)))
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
    merged.error = samples.iter().find_map(|s| s.error.clone());
    merged
}

fn run_child_env(
    exe: &Path,
    o: &Options,
    scenario: &str,
    arm: &str,
    round: usize,
    path: &Path,
    rank: Option<usize>,
) -> Sample {
    let mut sample = Sample {
        scenario: scenario.into(),
        arm: arm.into(),
        round,
        seconds: f64::NAN,
        bytes: 0,
        checksum: 0,
        maxrss_kib: 0,
        read_bytes: 0,
        served: 0,
        note: None,
        error: None,
    };
    let mut command = Command::new(exe);
    command
        .arg("--child")
        .arg(arm)
        .arg(path)
        .arg(o.checksum_threads.to_string())
        .arg(o.limit_threads.to_string())
        .env_remove("SAFELOAD_DISABLE_MMAP")
        .env_remove("SAFELOAD_PREFETCH")
        .env_remove("HF_SHARD_PREFETCH");
    for var in [
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "SLURM_LOCALID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
    ] {
        command.env_remove(var);
    }
    if let Some(rank) = rank {
        command
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", RANKS.to_string());
    }
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            sample.error = Some(e.to_string());
            return sample;
        }
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > o.timeout => {
                let _ = child.kill();
                let _ = child.wait();
                sample.error = Some(format!("timed out after {} s", o.timeout.as_secs()));
                return sample;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                sample.error = Some(e.to_string());
                return sample;
            }
        }
    }
    let out = match child.wait_with_output() {
        Ok(out) => out,
        Err(e) => {
            sample.error = Some(e.to_string());
            return sample;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    sample.note = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find(|l| l.contains("files buffered"))
        .map(str::to_string);
    match stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        Some(v) => {
            sample.seconds = v["seconds"].as_f64().unwrap_or(f64::NAN);
            sample.bytes = v["bytes"].as_u64().unwrap_or(0);
            sample.checksum = v["checksum"].as_u64().unwrap_or(0);
            sample.maxrss_kib = v["maxrss_kib"].as_u64().unwrap_or(0);
            sample.read_bytes = v["read_bytes"].as_u64().unwrap_or(0);
            sample.error = v["error"].as_str().map(str::to_string);
        }
        None => {
            sample.error = Some(format!(
                "no result (status {}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ))
        }
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn gib_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / seconds
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
        "| scenario | arm | seconds | GiB/s | x limit | peak RSS MiB | read from storage MiB | served by FUSE x checkpoint |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
    for scenario in &o.scenarios {
        let of = |arm: &str| -> Vec<&Sample> {
            samples
                .iter()
                .filter(|s| &s.scenario == scenario && s.arm == arm)
                .collect()
        };
        let med = |arm: &str| {
            median(
                of(arm)
                    .iter()
                    .filter(|s| s.error.is_none())
                    .map(|s| s.seconds)
                    .collect(),
            )
        };
        // The limit: the fastest of the plain-read arms run here.
        let limit = o
            .arms
            .iter()
            .filter(|a| limit_arm(a).is_some())
            .map(|a| med(a))
            .filter(|s| s.is_finite())
            .fold(f64::INFINITY, f64::min);
        for arm in &o.arms {
            let runs = of(arm);
            let ok: Vec<f64> = runs
                .iter()
                .filter(|s| s.error.is_none())
                .map(|s| s.seconds)
                .collect();
            let errors = runs.len() - ok.len();
            let m = median(ok.clone());
            let lo = ok.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ok.iter().copied().fold(0.0, f64::max);
            let rss = median(runs.iter().map(|s| s.maxrss_kib as f64 / 1024.0).collect());
            let read = median(
                runs.iter()
                    .map(|s| s.read_bytes as f64 / (1 << 20) as f64)
                    .collect(),
            );
            let served = median(
                runs.iter()
                    .map(|s| s.served as f64 / total as f64)
                    .collect(),
            );
            let err = if errors > 0 {
                format!(" ({errors} failed)")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {scenario} | {arm}{err} | {m:.3} ({lo:.3}-{hi:.3}) | {:.2} | {:.2} | {rss:.0} | {read:.0} | {served:.2} |",
                gib_s(total, m),
                limit / m,
            );
        }
    }
    out
}

use std::fmt::Write as _;

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().next().map(str::to_string))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpus} CPUs, {}, Linux {}",
        mem.split_whitespace().collect::<Vec<_>>().join(" "),
        kernel.trim()
    )
}

// ---------------------------------------------------------------- child

fn child(args: &[String]) -> i32 {
    let (Some(arm), Some(path), Some(threads), Some(limit_threads)) =
        (args.first(), args.get(1), args.get(2), args.get(3))
    else {
        eprintln!("usage: --child ARM PATH CHECKSUM_THREADS LIMIT_THREADS");
        return 2;
    };
    let path = PathBuf::from(path);
    let threads: usize = threads.parse().unwrap_or(4);
    let limit_threads: usize = limit_threads.parse().unwrap_or(8);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let start = Instant::now();
    let result = pool.install(|| run_arm(arm, &path, limit_threads));
    let seconds = start.elapsed().as_secs_f64();
    let (bytes, checksum, error) = match result {
        Ok((b, c)) => (b, c, None),
        Err(e) => (0, 0, Some(e)),
    };
    let line = serde_json::json!({
        "seconds": seconds, "bytes": bytes, "checksum": checksum,
        "maxrss_kib": maxrss_kib(), "read_bytes": read_bytes(), "error": error,
    });
    let mut stdout = std::io::stdout();
    let _ = writeln!(stdout, "{line}");
    0
}

/// Bytes this process caused to be fetched from storage (see proc(5)).
fn read_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("read_bytes:")
                    .and_then(|v| v.trim().parse().ok())
            })
        })
        .unwrap_or(0)
}

fn maxrss_kib() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0 {
            usage.ru_maxrss as u64
        } else {
            0
        }
    }
}

/// Sums a byte slice as little-endian u64 words (wrapping). Order-independent,
/// so every arm agrees however it splits the bytes (on 8-byte boundaries).
fn checksum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    for w in &mut words {
        sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    for (i, b) in words.remainder().iter().enumerate() {
        sum = sum.wrapping_add((*b as u64) << (8 * i));
    }
    sum
}

/// Bytes and checksum of tensors, on the current rayon pool: every tensor
/// cut into 4 MiB pieces, all pieces in parallel, so that many small tensors
/// and a few large ones keep every thread busy alike.
fn sum_tensors<'a>(tensors: impl Iterator<Item = &'a [u8]>) -> (u64, u64) {
    use rayon::prelude::*;
    let pieces: Vec<&[u8]> = tensors.flat_map(|t| t.chunks(4 << 20)).collect();
    pieces
        .par_iter()
        .map(|p| (p.len() as u64, checksum(p)))
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1.wrapping_add(b.1)))
}

type ArmResult = Result<(u64, u64), String>;

fn run_arm(arm: &str, path: &Path, limit_threads: usize) -> ArmResult {
    let files = shard_files(path);
    match arm {
        _ if let Some(l) = limit_arm(arm) => limit(
            &files,
            l.threads.unwrap_or(limit_threads),
            (l.direct, l.fresh),
        ),
        "memmap2" => baseline(&files, 1, true),
        "memmap2-4t" => baseline(&files, 4, true),
        "fs-read" => baseline(&files, 1, false),
        "fs-read-4t" => baseline(&files, 4, false),
        _ => {
            let loader = match arm {
                "safeload-auto" => safeload::Loader::new(),
                "safeload-auto-io1" => safeload::Loader::new().io_concurrency(1),
                "safeload-auto-io32" => safeload::Loader::new().io_concurrency(32),
                "safeload-mmap" => safeload::Loader::new().disable_mmap(false),
                "safeload-buffered" => safeload::Loader::new().disable_mmap(true).direct_io(false),
                "safeload-buffered-direct" => {
                    safeload::Loader::new().disable_mmap(true).direct_io(true)
                }
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
            let files = sd.report().files();
            let direct = files.iter().filter(|f| f.direct_io()).count();
            let buffered = files
                .iter()
                .filter(|f| f.strategy() == safeload::Strategy::Buffered)
                .count();
            let io = sd
                .report()
                .io_concurrency_reason()
                .map(|r| format!("; {r}"))
                .unwrap_or_default();
            eprintln!(
                "{buffered}/{} files buffered, {direct} with O_DIRECT{io}",
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
                        let want = if direct {
                            len.next_multiple_of(4096)
                        } else {
                            len
                        } as usize;
                        let mut done = 0usize;
                        while (done as u64) < len {
                            let n = std::os::unix::fs::FileExt::read_at(
                                &handles[i],
                                &mut buf[done..want],
                                off + done as u64,
                            )
                            .map_err(|e| e.to_string())?;
                            if n == 0 {
                                return Err("short file".into());
                            }
                            done += n;
                        }
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

/// The checksum of a piece of the data section that starts `offset` bytes
/// into it: the same words as `checksum` sums tensor by tensor, since every
/// tensor of the generated checkpoint starts and ends on an 8-byte boundary.
fn checksum_aligned(piece: &[u8], offset: u64) -> u64 {
    debug_assert_eq!(offset % 8, 0);
    checksum(piece)
}
