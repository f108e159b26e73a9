//! `cargo bench --bench stream`: the peak memory and the speed of
//! `Checkpoint::for_each` with a cap, against the bound it promises.
//!
//! Writes a synthetic sharded checkpoint (kept between runs under
//! `bench-data/`), then runs each arm in a child process of its own, arms
//! interleaved, for several runs: `stream` streams the checkpoint with the
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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

#[path = "../tests/common/random.rs"]
mod random;

const MIB: u64 = 1 << 20;
/// The margin the bound allows beyond the cap and the largest tensor.
const MARGIN: u64 = 64 * MIB;
/// The version of the bytes `generate` writes, part of the cached
/// checkpoint's directory name: bump it when they change.
const DATA_VERSION: u32 = 1;

const USAGE: &str = "usage: cargo bench --bench stream -- [--size-gib 2] [--shards 8] \
    [--cap-mib 256] [--runs 5] [--arms stream,load] [--cold] [--dir bench-data]";

struct Options {
    size_gib: f64,
    shards: usize,
    cap: u64,
    runs: usize,
    arms: Vec<String>,
    cold: bool,
    dir: PathBuf,
}

fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        size_gib: 2.0,
        shards: 8,
        cap: 256 * MIB,
        runs: 5,
        arms: vec!["stream".into(), "load".into()],
        cold: false,
        dir: PathBuf::from("bench-data"),
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--size-gib" => o.size_gib = value()?.parse().map_err(|e| format!("{arg}: {e}"))?,
            "--shards" => o.shards = value()?.parse().map_err(|e| format!("{arg}: {e}"))?,
            "--cap-mib" => {
                o.cap = value()?.parse::<u64>().map_err(|e| format!("{arg}: {e}"))? * MIB
            }
            "--runs" => o.runs = value()?.parse().map_err(|e| format!("{arg}: {e}"))?,
            "--arms" => o.arms = value()?.split(',').map(str::to_string).collect(),
            "--cold" => o.cold = true,
            "--dir" => o.dir = PathBuf::from(value()?),
            // What `cargo bench` passes to every bench binary.
            "--bench" => {}
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if let Some(arm) = o
        .arms
        .iter()
        .find(|a| !["stream", "load"].contains(&a.as_str()))
    {
        return Err(format!("unknown arm {arm}\n{USAGE}"));
    }
    Ok(o)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if args.first().map(String::as_str) == Some("--child") {
        child(&args[1..])
    } else {
        parse_options(&args).and_then(|o| parent(&o))
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- checkpoint

/// Writes `shards` files of up to `size / shards` bytes each (short of it
/// by less than 16 KiB), with BF16 and F32 tensors of 48 MiB, 12 MiB, 3 MiB
/// and 16 KiB in turn, and the index.
/// Kept between runs, keyed by size, shard count and `DATA_VERSION`.
/// Returns the directory.
fn generate(dir: &Path, size: u64, shards: usize) -> std::io::Result<PathBuf> {
    let root = dir.join(format!("stream-{}mib-{shards}-v{DATA_VERSION}", size / MIB));
    let index = root.join("model.safetensors.index.json");
    if index.exists() {
        return Ok(root);
    }
    eprintln!(
        "writing {} MiB in {shards} shards to {}",
        size / MIB,
        root.display()
    );
    std::fs::create_dir_all(&root)?;
    let per_shard = size / shards as u64;
    let mut weight_map = serde_json::Map::new();
    for s in 0..shards {
        let name = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        let mut bytes = 0u64;
        // The sizes in turn, skipping those that would pass the shard's
        // size, until not even the smallest fits.
        for i in 0.. {
            let (dtype, rows) = match i % 4 {
                0 => (Dtype::BF16, 6144),
                1 => (Dtype::F32, 768),
                2 => (Dtype::BF16, 384),
                _ => (Dtype::F32, 1),
            };
            let cols = 4096;
            let len = rows * cols * dtype.bitsize() / 8;
            if bytes + len as u64 > per_shard {
                if rows == 1 {
                    break;
                }
                continue;
            }
            let tensor = format!("layers.{s}.t{i}");
            let data = random::bytes_for(&tensor, len);
            tensors.push((tensor, dtype, vec![rows, cols], data));
            bytes += len as u64;
        }
        let mut views = Vec::with_capacity(tensors.len());
        for (n, d, shape, data) in &tensors {
            let view = TensorView::new(*d, shape.clone(), data).map_err(std::io::Error::other)?;
            views.push((n.clone(), view));
            weight_map.insert(n.clone(), name.clone().into());
        }
        safetensors::serialize_to_file(views, None, &root.join(&name))
            .map_err(std::io::Error::other)?;
    }
    let body = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(&index, serde_json::to_vec(&body)?)?;
    Ok(root)
}

// ---------------------------------------------------------------- parent

/// What one child reports.
#[derive(Debug, Clone)]
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
    let root = generate(&o.dir, size, o.shards).map_err(|e| format!("generating: {e}"))?;
    let ck = safeload::Checkpoint::open(&root).map_err(|e| e.to_string())?;
    let largest = ck.tensors().map(|t| t.nbytes()).max().unwrap_or(0);
    let total = ck.total_bytes();
    let bound = o.cap + MARGIN + largest;
    if !o.cold {
        warm(&root).map_err(|e| format!("warming: {e}"))?;
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut samples: Vec<Sample> = Vec::new();
    for run in 0..o.runs {
        for arm in &o.arms {
            if o.cold {
                safeload::evict(&root).map_err(|e| e.to_string())?;
            }
            let out = Command::new(&exe)
                .args(["--child", arm])
                .arg(&root)
                .arg(o.cap.to_string())
                .output()
                .map_err(|e| format!("starting a child: {e}"))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                return Err(format!(
                    "{arm}, run {}: {}\n{stdout}{}",
                    run + 1,
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            let sample = parse_sample(arm, &stdout)?;
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
        markdown(&samples, o, total, largest, bound, &machine())
    );
    Ok(())
}

/// Writes back and reads every file of the checkpoint once, so that the
/// first warm run neither waits on the writeback of a checkpoint just
/// written nor reads it from the disk.
fn warm(root: &Path) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 8 << 20];
    for entry in std::fs::read_dir(root)? {
        let mut file = std::fs::File::open(entry?.path())?;
        file.sync_all()?;
        while std::io::Read::read(&mut file, &mut buffer)? > 0 {}
    }
    Ok(())
}

fn parse_sample(arm: &str, stdout: &str) -> Result<Sample, String> {
    let field = |key: &str| -> Result<&str, String> {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .ok_or(format!("{arm}: no {key} in {stdout:?}"))
    };
    let int = |key: &str| -> Result<u64, String> {
        field(key)?
            .parse()
            .map_err(|e| format!("{arm}: {key}: {e}"))
    };
    Ok(Sample {
        arm: arm.to_string(),
        seconds: field("seconds")?
            .parse()
            .map_err(|e| format!("{arm}: seconds: {e}"))?,
        bytes: int("bytes")?,
        checksum: int("checksum")?,
        baseline: int("baseline")?,
        peak: int("peak")?,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn spread(v: &[f64], digits: usize) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.digits$} ({min:.digits$}-{max:.digits$})",
        median(v.to_vec())
    )
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
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
        mib(o.cap)
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
            "| {arm} | {} | {} | {} | {} |\n",
            mine.len(),
            spread(&seconds, 2),
            spread(&speed, 2),
            spread(&peak, 0)
        );
    }
    out
}

fn gib_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / seconds
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cpus} CPUs, {mem}, Linux {}", kernel.trim())
}

// ---------------------------------------------------------------- child

/// A child: `--child ARM PATH CAP`. Prints one line of `key=value`s.
fn child(args: &[String]) -> Result<(), String> {
    let (Some(arm), Some(path), Some(cap)) = (args.first(), args.get(1), args.get(2)) else {
        return Err("usage: --child ARM PATH CAP".into());
    };
    let cap: u64 = cap.parse().map_err(|e| format!("cap: {e}"))?;
    let (mut bytes, mut sum) = (0u64, 0u64);
    let mut add = |data: &[u8]| {
        bytes += data.len() as u64;
        sum = sum.wrapping_add(checksum(data));
    };
    let baseline;
    let start;
    match arm.as_str() {
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
    let line = format!(
        "seconds={seconds} bytes={bytes} checksum={sum} baseline={baseline} peak={}",
        peak_rss()?
    );
    let mut stdout = std::io::stdout();
    writeln!(stdout, "{line}").map_err(|e| e.to_string())
}

/// The process's peak resident memory so far (`VmHWM` of
/// `/proc/self/status`), in bytes.
fn peak_rss() -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(|e| e.to_string())?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib << 10)
        .ok_or("no VmHWM in /proc/self/status".into())
}

/// Sums the bytes as little-endian u64 words (wrapping), the tail byte by
/// byte: the same whichever way a reader gets them, a tensor at a time.
fn checksum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    for w in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        sum = sum.wrapping_add(u64::from_le_bytes(word));
    }
    for (i, b) in words.remainder().iter().enumerate() {
        sum = sum.wrapping_add(u64::from(*b) << (8 * i));
    }
    sum
}
