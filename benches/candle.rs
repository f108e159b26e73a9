//! `cargo bench --bench candle --features candle`: a 2 GiB, 8-shard BF16
//! checkpoint loaded into candle tensors (every tensor asked for through a
//! `VarBuilder` and kept, as a model's constructor does), by candle's own
//! `VarBuilder::from_mmaped_safetensors` and by safeload's `var_builder`,
//! buffered and auto.
//!
//! Each arm its own process, arms interleaved and rotated each round, warm
//! (the files in the page cache) and cold (every file evicted with `posix_fadvise(DONTNEED)` before
//! each run). Each child prints its time, its peak resident memory
//! (`VmHWM`) and, at the end, its anonymous and file-backed resident memory
//! (`RssAnon`, `RssFile`): a mapped load's file pages are shared with the
//! page cache, its copies are not.
//!
//! ```text
//! cargo bench --bench candle --features candle -- [--runs 5] [--dir bench-data]
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device};
use clap::Parser;
use safetensors::Dtype;

mod common;

use common::child::{self, Child, Job};
use common::data::{self, TensorSpec};
use common::stats::{Spread, median};
use common::{args, proc};

const ARMS: [&str; 3] = ["candle-mmap", "safeload-buffered", "safeload-auto"];
const SHARDS: usize = 8;
/// 4 tensors of 4096 x 8192 BF16 (64 MiB) per shard: 2 GiB in all.
const PER_SHARD: usize = 4;
const ROWS: usize = 4096;
const COLS: usize = 8192;

/// candle's `from_mmaped_safetensors` against safeload's `var_builder` (the
/// module docs of benches/candle.rs say how).
#[derive(Parser)]
#[command(name = "candle")]
struct Options {
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Where the checkpoint is written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
}

/// What a child prints: its time, its peak RSS (`VmHWM`) and, at the end,
/// its anonymous and file-backed RSS, MiB.
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    seconds: f64,
    peak: f64,
    anon: f64,
    file: f64,
}

fn main() {
    if let Some(job) = Job::from_env() {
        return run_arm(&job.arm, &job.path);
    }
    let Options { runs, dir } = args::parse();
    let shards: Vec<Vec<TensorSpec>> = (0..SHARDS)
        .map(|s| {
            (0..PER_SHARD)
                .map(|t| {
                    let name = format!("layers.{}.weight", s * PER_SHARD + t);
                    TensorSpec::new(name, Dtype::BF16, &[ROWS, COLS])
                })
                .collect()
        })
        .collect();
    let ckpt = data::checkpoint(&dir, "candle-2gib-8", &shards).unwrap();
    println!(
        "2 GiB BF16 checkpoint in {SHARDS} shards; {runs} runs, arms interleaved, each its own process"
    );
    let mut table = String::from(
        "| cache | arm | time, median (min-max) | peak RSS | anonymous RSS at end | file RSS at end |\n|---|---|---|---|---|---|\n",
    );
    for cache in ["warm", "cold"] {
        if cache == "warm" {
            data::warm(&ckpt).unwrap();
        }
        let mut samples: Vec<Vec<Figures>> = ARMS.iter().map(|_| Vec::new()).collect();
        for round in 0..runs {
            for i in common::rotated(ARMS.len(), round) {
                let arm = ARMS[i];
                if cache == "cold" {
                    data::evict(&[&ckpt]).unwrap();
                }
                let f: Figures = Child::new(arm, &ckpt)
                    .run()
                    .unwrap_or_else(|e| panic!("{arm}: {e}"))
                    .figures;
                eprintln!(
                    "  {cache} round {round} {arm:<18} {:.3} s  peak {:.0} MiB  anon {:.0} MiB  file {:.0} MiB",
                    f.seconds, f.peak, f.anon, f.file
                );
                samples[i].push(f);
            }
        }
        for (arm, s) in ARMS.iter().zip(&samples) {
            let col = |k: fn(&Figures) -> f64| s.iter().map(k).collect::<Vec<_>>();
            writeln!(
                table,
                "| {cache} | {arm} | {:.2} | {:.0} MiB | {:.0} MiB | {:.0} MiB |",
                Spread::of(&col(|f| f.seconds)).unit(" s"),
                median(&col(|f| f.peak)),
                median(&col(|f| f.anon)),
                median(&col(|f| f.file)),
            )
            .unwrap();
        }
    }
    print!("{table}");
}

/// One arm (a child): every tensor through a `VarBuilder`, kept until the
/// end.
fn run_arm(arm: &str, dir: &Path) {
    let device = Device::Cpu;
    let names: Vec<String> = safeload::Checkpoint::open(dir)
        .unwrap()
        .tensors()
        .map(|t| t.name().to_string())
        .collect();
    let t = Instant::now();
    let vb = match arm {
        "candle-mmap" => {
            let files = data::shard_files(dir);
            // SAFETY: the benchmark's own files, not modified while mapped.
            unsafe {
                candle_nn::VarBuilder::from_mmaped_safetensors(&files, DType::BF16, &device)
                    .unwrap()
            }
        }
        "safeload-buffered" => {
            let checkpoint = safeload::Loader::new()
                .disable_mmap(true)
                .open(dir)
                .unwrap();
            safeload::candle::var_builder_from(checkpoint, DType::BF16, &device)
        }
        "safeload-auto" => safeload::candle::var_builder(dir, DType::BF16, &device).unwrap(),
        other => panic!("unknown arm {other}"),
    };
    let tensors: Vec<candle_core::Tensor> = names
        .iter()
        .map(|n| vb.get((ROWS, COLS), n).unwrap())
        .collect();
    let seconds = t.elapsed().as_secs_f64();
    assert_eq!(tensors.len(), SHARDS * PER_SHARD);
    child::report(&Figures {
        seconds,
        peak: proc::status_mib("VmHWM:"),
        anon: proc::status_mib("RssAnon:"),
        file: proc::status_mib("RssFile:"),
    });
}
