//! `cargo bench --bench device`: weights to a device through the staging ring, on the CPU
//! stand-in, against the reads alone and the copies alone (issue 53's targets).
//!
//! Generates the load benchmark's checkpoint (kept under `bench-data/`), then for each
//! scenario (a warm page cache; the hf-mount-like FUSE test mount answering each request
//! after 2 ms with 8 daemon threads, every file evicted before each arm) runs every arm in
//! a child process of its own, arms shuffled each round:
//!
//! - `reads`: the load to a stand-in that copies at once: the reads into the ring alone;
//! - `copies`: the stand-in's copies alone, at the bandwidth, of the chunks the load
//!   makes (the same count and sizes, through a ring of the same buffers), nothing read;
//! - `load`: the load to the stand-in at the bandwidth: reads and copies overlapping;
//! - `limit`: 8 readers of 16 MiB `pread`s into reused buffers (`O_DIRECT` on FUSE, as
//!   the load reads there; through the page cache when warm): the storage's limit.
//!
//! The stand-in keeps no bytes (a GPU's copy takes no core of the host) and copies at
//! `--bandwidth-gbs`, by default the median speed of the `reads` arm measured first in
//! each scenario ("a bandwidth near the source's": the case where overlap matters most).
//! Prints a table of medians (min-max) with `load / max(reads, copies)`, copies per
//! 32 MiB and `reads / limit`, and writes every sample as JSON.
//!
//! ```text
//! cargo bench --bench device -- [--size-gib 2] [--shards 8] [--rounds 5]
//!     [--scenarios warm,fuse-2ms-8t] [--bandwidth-gbs G] [--dir bench-data]
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use safeload::device::{Device, LoadToDevice, StandIn};

mod common;

use common::child::{self, Child, Job};
use common::stats::{Spread, gib_s, median};
use common::{args, data, fuse, proc};

const ARMS: [&str; 4] = ["reads", "copies", "load", "limit"];
const SCENARIOS: [&str; 2] = ["warm", "fuse-2ms-8t"];
const GB: f64 = 1e9;

/// Weights to a device on the stand-in (the module docs say how).
#[derive(Parser)]
#[command(name = "device")]
struct Options {
    /// The checkpoint's size, GiB.
    #[arg(long, default_value_t = 2.0)]
    size_gib: f64,
    #[arg(long, default_value_t = 8)]
    shards: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, value_delimiter = ',', default_values = SCENARIOS, value_parser = SCENARIOS)]
    scenarios: Vec<String>,
    #[arg(long, value_delimiter = ',', default_values = ARMS, value_parser = ARMS)]
    arms: Vec<String>,
    /// The stand-in's bandwidth, GB/s; unset, the `reads` arm's median speed in a
    /// calibration run of each scenario.
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    /// Where the checkpoint is written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
    /// Where every sample is written.
    #[arg(long, default_value = "bench-data/device.json")]
    json: PathBuf,
    /// Seconds before an arm's process is killed.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
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
    /// Copies made (0 for `limit`).
    copies: u64,
    maxrss_kib: u64,
    bandwidth_gbs: f64,
    /// The load's report, its first line (the device, the chunks, the readers).
    note: Option<String>,
    error: Option<String>,
}

/// What a child prints.
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    seconds: f64,
    bytes: u64,
    copies: u64,
    maxrss_kib: u64,
    error: Option<String>,
}

fn parent(o: &Options) -> Result<(), String> {
    let size = (o.size_gib * (1u64 << 30) as f64) as u64;
    let root = data::checkpoint(
        &o.dir,
        &data::stem(size, o.shards),
        &data::sharded(size, o.shards),
    )
    .map_err(|e| format!("generating: {e}"))?;
    let total: u64 = data::shard_files(&root)
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    eprintln!(
        "checkpoint: {} ({:.2} GiB); {} round(s), arms shuffled; {}",
        root.display(),
        total as f64 / (1u64 << 30) as f64,
        o.rounds,
        proc::machine()
    );
    let mut samples = Vec::new();
    for scenario in &o.scenarios {
        let mount = match scenario.as_str() {
            "warm" => None,
            s => Some(fuse::hf_mount(s, &root)?),
        };
        let path = mount
            .as_ref()
            .map_or(root.clone(), |m| m.path().to_path_buf());
        let prepare = || {
            if scenario == "warm" {
                let _ = data::warm(&root);
            } else {
                let _ = data::evict(&[&root, &path]);
            }
        };
        let bandwidth = match o.bandwidth_gbs {
            Some(b) => b,
            None => {
                let runs: Vec<f64> = (0..3)
                    .map(|_| {
                        prepare();
                        let s = run_arm(o, scenario, "reads", 0, &path, f64::INFINITY);
                        s.bytes as f64 / s.seconds / GB
                    })
                    .collect();
                median(&runs)
            }
        };
        eprintln!("{scenario}: the stand-in copies at {bandwidth:.2} GB/s");
        for round in 0..o.rounds {
            for a in common::shuffled(o.arms.len(), round) {
                prepare();
                let sample = run_arm(o, scenario, &o.arms[a], round, &path, bandwidth);
                eprintln!(
                    "  {scenario:<12} round {round} {:<7} {:>7.3} s {:>6.2} GiB/s {:>5} copies {:>6} MiB RSS{}{}",
                    sample.arm,
                    sample.seconds,
                    gib_s(sample.bytes, sample.seconds),
                    sample.copies,
                    sample.maxrss_kib >> 10,
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
    println!("{}", table(&samples, o));
    common::write_samples(&o.json, &root, o.shards, total, &samples)
}

fn run_arm(o: &Options, scenario: &str, arm: &str, round: usize, path: &Path, gbs: f64) -> Sample {
    let result = Child::new(arm, path)
        .arg(gbs.to_string())
        .arg(scenario)
        .timeout(Duration::from_secs(o.timeout))
        .run::<Figures>();
    let (f, error, note) = match result {
        Ok(out) => {
            let note = out.stderr.lines().next().map(str::to_owned);
            (out.figures, None, note)
        }
        Err(e) => (
            Figures {
                seconds: f64::NAN,
                bytes: 0,
                copies: 0,
                maxrss_kib: 0,
                error: None,
            },
            Some(e),
            None,
        ),
    };
    Sample {
        scenario: scenario.to_owned(),
        arm: arm.to_owned(),
        round,
        seconds: f.seconds,
        bytes: f.bytes,
        copies: f.copies,
        maxrss_kib: f.maxrss_kib,
        bandwidth_gbs: gbs,
        note,
        error: error.or(f.error),
    }
}

/// The table: per scenario and arm, seconds (median, min-max), GiB/s, copies per 32 MiB,
/// peak RSS; then the targets' ratios from the medians.
fn table(samples: &[Sample], o: &Options) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | arm | seconds | GiB/s | copies per 32 MiB | peak RSS MiB |\n|---|---|---|---|---|---|"
    );
    for scenario in &o.scenarios {
        let seconds = |arm: &str| -> Vec<f64> {
            samples
                .iter()
                .filter(|s| &s.scenario == scenario && s.arm == arm && s.error.is_none())
                .map(|s| s.seconds)
                .collect()
        };
        for arm in &o.arms {
            let of: Vec<&Sample> = samples
                .iter()
                .filter(|s| &s.scenario == scenario && &s.arm == arm && s.error.is_none())
                .collect();
            let Some(first) = of.first() else { continue };
            let secs = seconds(arm);
            let per_32 = first.copies as f64 / (first.bytes as f64 / (32 << 20) as f64);
            let rss = median(
                &of.iter()
                    .map(|s| s.maxrss_kib as f64 / 1024.0)
                    .collect::<Vec<_>>(),
            );
            let _ = writeln!(
                out,
                "| {scenario} | {arm} | {} | {:.2} | {:.2} | {rss:.0} |",
                Spread::of(&secs).unit(" s"),
                gib_s(first.bytes, median(&secs)),
                per_32,
            );
        }
        let m = |arm: &str| median(&seconds(arm));
        let _ = writeln!(
            out,
            "| {scenario} | load / max(reads, copies) | {:.3} | | | |\n| {scenario} | limit / reads (reads x limit) | {:.3} | | | |",
            m("load") / m("reads").max(m("copies")),
            m("limit") / m("reads"),
        );
    }
    out
}

// ---------------------------------------------------------------- child

/// A child: `--child ARM PATH BANDWIDTH_GBS SCENARIO`.
fn run_child(job: &Job) {
    let gbs: f64 = job.extra(0);
    let scenario: String = job.extra(1);
    let start = Instant::now();
    let result = match job.arm.as_str() {
        "reads" => load(&job.path, StandIn::new().discard_bytes()),
        "load" => load(
            &job.path,
            StandIn::new().discard_bytes().bandwidth(gbs * GB),
        ),
        "copies" => copies(&job.path, gbs),
        "limit" => limit(&job.path, scenario != "warm"),
        other => Err(format!("no arm {other}")),
    };
    let seconds = start.elapsed().as_secs_f64();
    let (bytes, copies, error) = match result {
        Ok((b, c)) => (b, c, None),
        Err(e) => (0, 0, Some(e)),
    };
    child::report(&Figures {
        seconds,
        bytes,
        copies,
        // `VmHWM`, not `ru_maxrss`, which keeps the parent's peak across `exec`.
        maxrss_kib: proc::status_kib("VmHWM:").unwrap_or(0),
        error,
    });
}

/// The checkpoint loaded to `device`: its bytes and copies.
fn load(path: &Path, device: StandIn) -> Result<(u64, u64), String> {
    let loaded = safeload::Loader::new()
        .load_to_device(path, &device)
        .map_err(|e| e.to_string())?;
    let report = loaded.report();
    eprintln!("{report}");
    Ok((report.bytes(), report.chunks() as u64))
}

/// The copies of a load alone: the chunks a load of `path` makes (each file's tensors
/// in 32 MiB pieces, into a slab per file), through a ring of 4 buffers, one after
/// another as the load submits them, at `gbs`.
fn copies(path: &Path, gbs: f64) -> Result<(u64, u64), String> {
    let ck = safeload::Checkpoint::open(path).map_err(|e| e.to_string())?;
    let mut per_file: Vec<u64> = Vec::new();
    let mut last = None;
    for t in ck.tensors() {
        if last != Some(t.file()) {
            per_file.push(0);
            last = Some(t.file());
        }
        *per_file.last_mut().unwrap() += t.nbytes();
    }
    let device = StandIn::new().discard_bytes().bandwidth(gbs * GB);
    let chunk = safeload::device::STAGING_BYTES;
    let io = |e: std::io::Error| e.to_string();
    let mut free: Vec<_> = (0..safeload::device::STAGING_BUFFERS)
        .map(|_| device.staging(chunk))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    let mut in_flight = std::collections::VecDeque::new();
    let mut slabs = Vec::new();
    let (mut bytes, mut copies) = (0, 0);
    for len in per_file {
        let slab = device.allocate(len as usize).map_err(io)?;
        let mut at = 0;
        while at < len as usize {
            let n = chunk.min(len as usize - at);
            let buffer = match free.pop() {
                Some(b) => b,
                None => device
                    .complete(in_flight.pop_front().unwrap())
                    .map_err(io)?,
            };
            in_flight.push_back(device.submit(buffer, n, &slab, at).map_err(io)?);
            at += n;
            bytes += n as u64;
            copies += 1;
        }
        slabs.push(slab);
    }
    for copy in in_flight {
        device.complete(copy).map_err(io)?;
    }
    drop(slabs);
    Ok((bytes, copies))
}

/// 8 readers of 16 MiB `pread`s into reused buffers, pulled from one queue: `O_DIRECT`
/// where `direct` (the FUSE mount), through the page cache elsewhere. The files' bytes,
/// no copies.
fn limit(path: &Path, direct: bool) -> Result<(u64, u64), String> {
    const PIECE: u64 = 16 << 20;
    let files = data::shard_files(path);
    let mut handles = Vec::new();
    let mut pieces = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let mut options = std::fs::OpenOptions::new();
        options.read(true);
        if direct {
            use std::os::unix::fs::OpenOptionsExt;
            options.custom_flags(libc::O_DIRECT);
        }
        let file: File = options.open(f).map_err(|e| e.to_string())?;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let mut at = 0;
        while at < len {
            pieces.push((i, at, PIECE.min(len - at)));
            at += PIECE;
        }
        handles.push(file);
    }
    let next = AtomicUsize::new(0);
    let bytes = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| -> Result<u64, String> {
                    let mut buf =
                        memmap2::MmapMut::map_anon(PIECE as usize).map_err(|e| e.to_string())?;
                    let mut bytes = 0;
                    while let Some(&(i, at, len)) = pieces.get(next.fetch_add(1, Ordering::Relaxed))
                    {
                        let want = len.next_multiple_of(4096) as usize;
                        let mut done = 0;
                        while (done as u64) < len {
                            let n = std::os::unix::fs::FileExt::read_at(
                                &handles[i],
                                &mut buf[done..want],
                                at + done as u64,
                            )
                            .map_err(|e| e.to_string())?;
                            if n == 0 {
                                return Err("short file".into());
                            }
                            done += n;
                        }
                        bytes += len;
                    }
                    Ok(bytes)
                })
            })
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().unwrap_or_else(|_| Err("panicked".into())))
            .sum::<Result<u64, String>>()
    })?;
    Ok((bytes, 0))
}
