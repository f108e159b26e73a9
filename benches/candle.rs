//! `cargo bench --bench candle --features candle`: a 2 GiB, 8-shard BF16
//! checkpoint loaded into candle tensors (every tensor asked for through a
//! `VarBuilder` and kept, as a model's constructor does), by candle's own
//! `VarBuilder::from_mmaped_safetensors` and by safeload's `var_builder`,
//! buffered and auto.
//!
//! Each arm its own process, arms interleaved, warm (the files in the page
//! cache) and cold (every file evicted with `posix_fadvise(DONTNEED)` before
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

#[path = "common/child.rs"]
mod child;

const ARMS: [&str; 3] = ["candle-mmap", "safeload-buffered", "safeload-auto"];
const SHARDS: usize = 8;
/// 4 tensors of 4096 x 8192 BF16 (64 MiB) per shard: 2 GiB in all.
const PER_SHARD: usize = 4;
const ROWS: usize = 4096;
const COLS: usize = 8192;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if child::as_child(&args, run_arm) {
        return;
    }
    let (runs, dir) = child::runs_and_dir(&args, 5);
    let ckpt = write_checkpoint(&dir.join("candle-2gib-8"));
    println!(
        "2 GiB BF16 checkpoint in {SHARDS} shards; {runs} runs, arms interleaved, each its own process"
    );
    let mut table = String::from(
        "| cache | arm | time, median (min-max) | peak RSS | anonymous RSS at end | file RSS at end |\n|---|---|---|---|---|---|\n",
    );
    for cache in ["warm", "cold"] {
        if cache == "warm" {
            for s in 0..SHARDS {
                std::fs::read(ckpt.join(shard_name(s))).unwrap();
            }
        }
        let mut samples: Vec<Vec<[f64; 4]>> = vec![Vec::new(); ARMS.len()];
        for round in 0..runs {
            for (i, arm) in ARMS.iter().enumerate() {
                if cache == "cold" {
                    safeload::evict(&ckpt).unwrap();
                }
                let v = child::run_child("--child", Some(arm), &ckpt);
                eprintln!(
                    "  {cache} round {round} {arm:<18} {:.3} s  peak {:.0} MiB  anon {:.0} MiB  file {:.0} MiB",
                    v[0], v[1], v[2], v[3]
                );
                samples[i].push([v[0], v[1], v[2], v[3]]);
            }
        }
        for (arm, s) in ARMS.iter().zip(&samples) {
            let col = |k: usize| child::median(s.iter().map(|x| x[k]).collect());
            let (t, lo, hi) = col(0);
            writeln!(
                table,
                "| {cache} | {arm} | {t:.2} s ({lo:.2}-{hi:.2}) | {:.0} MiB | {:.0} MiB | {:.0} MiB |",
                col(1).0,
                col(2).0,
                col(3).0
            )
            .unwrap();
        }
    }
    print!("{table}");
}

/// One arm: every tensor through a `VarBuilder`, kept until the end.
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
            let files: Vec<PathBuf> = (0..SHARDS).map(|s| dir.join(shard_name(s))).collect();
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
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(tensors.len(), SHARDS * PER_SHARD);
    let field = child::status_mib;
    println!(
        "{secs} {} {} {}",
        field("VmHWM:"),
        field("RssAnon:"),
        field("RssFile:")
    );
}

fn shard_name(s: usize) -> String {
    format!("model-{:05}-of-{SHARDS:05}.safetensors", s + 1)
}

/// The checkpoint's directory, written once with the `safetensors` crate
/// and reused.
fn write_checkpoint(dir: &Path) -> PathBuf {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        return dir.to_path_buf();
    }
    std::fs::create_dir_all(dir).unwrap();
    let mut weight_map = serde_json::Map::new();
    for s in 0..SHARDS {
        let data: Vec<Vec<u8>> = (0..PER_SHARD)
            .map(|t| {
                let seed = (s * PER_SHARD + t) as u16;
                (0..ROWS * COLS)
                    .flat_map(|i| {
                        half::bf16::from_f32(((i as u16) ^ seed) as f32 * 1e-3).to_le_bytes()
                    })
                    .collect()
            })
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .iter()
            .enumerate()
            .map(|(t, bytes)| {
                let name = format!("layers.{}.weight", s * PER_SHARD + t);
                weight_map.insert(name.clone(), shard_name(s).into());
                let view = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::BF16,
                    vec![ROWS, COLS],
                    bytes,
                )
                .unwrap();
                (name, view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(shard_name(s))).unwrap();
    }
    let body = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(&index, serde_json::to_vec(&body).unwrap()).unwrap();
    dir.to_path_buf()
}
