//! `cargo bench --bench stream`: the peak memory and the speed of
//! `Checkpoint::for_each` with a cap, against the bound it promises.
//!
//! Writes a synthetic sharded checkpoint (kept between runs under
//! `bench-data/`), then runs each arm in a child process of its own, arms
//! interleaved and rotated each run, for several runs: `stream` streams the checkpoint with the
//! cap, its callback checksumming each tensor on the calling thread and
//! dropping it; `load` loads it whole, buffered, and checksums the same
//! bytes, for contrast. Each child reports its time and its peak resident
//! memory (`VmHWM`) and the peak before it began (its baseline). Prints a
//! markdown table of every run, then medians (min-max), with the bound:
//! cap + 64 MiB + the largest tensor, above the baseline.
//!
//! ```text
//! cargo bench --bench stream -- [--size-gib 2] [--shards 8] [--cap-mib 256]
//!     [--runs 5] [--arms stream,load] [--cold] [--dir bench-data]
//! ```

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;

mod common;

use common::child::{self, Child, Job};
use common::data::{self, TensorSpec};
use common::stats::{Spread, gib_s};
use common::{args, proc};

const MIB: u64 = 1 << 20;
/// The margin the bound allows beyond the cap and the largest tensor.
const MARGIN: u64 = 64 * MIB;
const ARMS: [&str; 2] = ["stream", "load"];

/// The peak memory and speed of `Checkpoint::for_each` under a cap (the
/// module docs of benches/stream.rs say how).
#[derive(Parser)]
#[command(name = "stream")]
struct Options {
    /// The checkpoint's size, GiB.
    #[arg(long, default_value_t = 2.0)]
    size_gib: f64,
    #[arg(long, default_value_t = 8)]
    shards: usize,
    /// The cap given to `for_each`, MiB.
    #[arg(long, default_value_t = 256)]
    cap_mib: u64,
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long, value_delimiter = ',', default_values = ARMS, value_parser = ARMS)]
    arms: Vec<String>,
    /// Evict the checkpoint before each run (by default it is read once first).
    #[arg(long)]
    cold: bool,
    /// Where the checkpoint is written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
}

impl Options {
    fn cap(&self) -> u64 {
        self.cap_mib * MIB
    }
}

fn main() {
    let result = match Job::from_env() {
        Some(job) => run_child(&job),
        None => parent(&args::parse()),
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- checkpoint

/// `shards` shards of up to `size / shards` bytes each (short of it by less
/// than 16 KiB): the mixed tensors in turn, skipping those that would pass
/// the shard's size, until not even the smallest fits.
fn layout(size: u64, shards: usize) -> Vec<Vec<TensorSpec>> {
    let per_shard = size / shards as u64;
    (0..shards)
        .map(|s| {
            let (mut tensors, mut bytes) = (Vec::new(), 0);
            for i in 0.. {
                let tensor = data::mixed(format!("layers.{s}.t{i}"), i);
                if bytes + tensor.len() > per_shard {
                    if tensor.shape[0] == 1 {
                        break;
                    }
                    continue;
                }
                bytes += tensor.len();
                tensors.push(tensor);
            }
            tensors
        })
        .collect()
}

// ---------------------------------------------------------------- parent

/// What one child reports: its arm and time, the bytes it saw and their
/// checksum, and its peak RSS (`VmHWM`) before it began and at the end, in
/// bytes.
#[derive(serde::Serialize, serde::Deserialize)]
struct Sample {
    arm: String,
    seconds: f64,
    bytes: u64,
    checksum: u64,
    baseline: u64,
    peak: u64,
}

fn parent(o: &Options) -> Result<(), String> {
    let size = (o.size_gib * (1u64 << 30) as f64) as u64;
    let stem = format!("stream-{}mib-{}", size / MIB, o.shards);
    let root = data::checkpoint(&o.dir, &stem, &layout(size, o.shards))
        .map_err(|e| format!("generating: {e}"))?;
    let ck = safeload::Checkpoint::open(&root).map_err(|e| e.to_string())?;
    let largest = ck.tensors().map(|t| t.nbytes()).max().unwrap_or(0);
    let total = ck.total_bytes();
    let bound = o.cap() + MARGIN + largest;
    if !o.cold {
        data::warm(&root).map_err(|e| format!("warming: {e}"))?;
    }
    let mut samples: Vec<Sample> = Vec::new();
    for run in 0..o.runs {
        for a in common::rotated(o.arms.len(), run) {
            let arm = &o.arms[a];
            if o.cold {
                data::evict(&[&root])?;
            }
            let sample: Sample = Child::new(arm, &root)
                .arg(o.cap().to_string())
                .run()
                .map_err(|e| format!("{arm}, run {}: {e}", run + 1))?
                .figures;
            if sample.bytes != total {
                return Err(format!("{arm}: {} bytes of {total}", sample.bytes));
            }
            eprintln!(
                "run {}: {arm} {:.2} s, peak {} MiB",
                run + 1,
                sample.seconds,
                (sample.peak - sample.baseline) / MIB
            );
            samples.push(sample);
        }
    }
    if let Some(first) = samples.first() {
        if samples.iter().any(|s| s.checksum != first.checksum) {
            return Err("the arms read different bytes (checksums differ)".into());
        }
    }
    print!(
        "{}",
        markdown(&samples, o, total, largest, bound, &proc::machine())
    );
    Ok(())
}

fn markdown(
    samples: &[Sample],
    o: &Options,
    total: u64,
    largest: u64,
    bound: u64,
    machine: &str,
) -> String {
    let mut out = String::new();
    let cache = if o.cold {
        "cold (evicted before each run)"
    } else {
        "warm"
    };
    out += &format!(
        "\n{:.0} MiB in {} shards, largest tensor {:.0} MiB, cap {:.0} MiB, page cache {cache}; {machine}\n",
        mib(total),
        o.shards,
        mib(largest),
        mib(o.cap())
    );
    out += &format!(
        "bound for `stream`: cap + 64 MiB + largest tensor = {:.0} MiB above the baseline\n\n",
        mib(bound)
    );
    out += "| run | arm | seconds | GiB/s | peak RSS above baseline (MiB) | baseline (MiB) | within bound |\n";
    out += "|---|---|---|---|---|---|---|\n";
    for (i, s) in samples.iter().enumerate() {
        let above = s.peak.saturating_sub(s.baseline);
        let within = if s.arm == "stream" {
            if above <= bound { "yes" } else { "**no**" }
        } else {
            "-"
        };
        out += &format!(
            "| {} | {} | {:.2} | {:.2} | {:.0} | {:.0} | {within} |\n",
            i / o.arms.len() + 1,
            s.arm,
            s.seconds,
            gib_s(total, s.seconds),
            mib(above),
            mib(s.baseline),
        );
    }
    out += "\n| arm | runs | seconds, median (min-max) | GiB/s, median (min-max) | peak RSS above baseline, MiB, median (min-max) |\n";
    out += "|---|---|---|---|---|\n";
    for arm in &o.arms {
        let mine: Vec<&Sample> = samples.iter().filter(|s| &s.arm == arm).collect();
        let seconds: Vec<f64> = mine.iter().map(|s| s.seconds).collect();
        let speed: Vec<f64> = mine.iter().map(|s| gib_s(total, s.seconds)).collect();
        let peak: Vec<f64> = mine
            .iter()
            .map(|s| mib(s.peak.saturating_sub(s.baseline)))
            .collect();
        out += &format!(
            "| {arm} | {} | {:.2} | {:.2} | {:.0} |\n",
            mine.len(),
            Spread::of(&seconds),
            Spread::of(&speed),
            Spread::of(&peak),
        );
    }
    out
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

// ---------------------------------------------------------------- child

/// A child: `--child ARM PATH CAP`.
fn run_child(job: &Job) -> Result<(), String> {
    let cap: u64 = job.extra(0);
    let path = &job.path;
    let (mut bytes, mut sum) = (0u64, 0u64);
    let mut add = |data: &[u8]| {
        bytes += data.len() as u64;
        sum = sum.wrapping_add(data::checksum(data));
    };
    let baseline;
    let start;
    match job.arm.as_str() {
        "stream" => {
            let ck = safeload::Checkpoint::open(path).map_err(|e| e.to_string())?;
            baseline = peak_rss()?;
            start = Instant::now();
            ck.for_each(cap, |tensor| -> safeload::Result<()> {
                add(tensor.as_bytes());
                Ok(()) // dropped: its bytes go back to the budget
            })
            .map_err(|e| e.to_string())?;
        }
        "load" => {
            baseline = peak_rss()?;
            start = Instant::now();
            let sd = safeload::Loader::new()
                .disable_mmap(true)
                .load(path)
                .map_err(|e| e.to_string())?;
            for (_, tensor) in sd.iter() {
                add(tensor.as_bytes());
            }
        }
        other => return Err(format!("unknown arm {other}")),
    }
    let seconds = start.elapsed().as_secs_f64();
    child::report(&Sample {
        arm: job.arm.clone(),
        seconds,
        bytes,
        checksum: sum,
        baseline,
        peak: peak_rss()?,
    });
    Ok(())
}

/// The process's peak resident memory so far, in bytes.
fn peak_rss() -> Result<u64, String> {
    proc::status_kib("VmHWM:")
        .map(|kib| kib << 10)
        .ok_or("no VmHWM in /proc/self/status".into())
}
