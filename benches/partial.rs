//! `cargo bench --bench partial`: reading only what is needed.
//!
//! 1. Header-only open of a large sparse checkpoint (hundreds of GiB of
//!    tensors that take no disk: the files are sparse), its headers evicted
//!    from the page cache before each run, each run in a child process.
//! 2. A rank's tensor-parallel part on the FUSE test filesystem (hf-mount,
//!    2 ms per read, files served with `FOPEN_DIRECT_IO` so the daemon counts
//!    exactly what is read): bytes read and time for one rank's dim-0 and
//!    dim-1 parts of every tensor, against loading every tensor whole.
//!
//! ```text
//! cargo bench --bench partial -- [--runs 7] [--dir bench-data]
//! ```

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use safeload::{Checkpoint, Loader};
use safetensors::Dtype;

mod common;

use common::args;
use common::child::{self, Child, Job};
use common::data::{self, TensorSpec};
use common::stats::Spread;

const SHARDS: usize = 30;
const TENSORS_PER_SHARD: usize = 100;
/// 10 GiB per shard: 300 GiB in all.
const SHARD_BYTES: u64 = 10 << 30;

/// Reading only what is needed (the module docs of benches/partial.rs say
/// how).
#[derive(Parser)]
#[command(name = "partial")]
struct Options {
    #[arg(long, default_value_t = 7)]
    runs: usize,
    /// Where the checkpoints are written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
}

/// What the header-only open prints: its time and what it found.
#[derive(serde::Serialize, serde::Deserialize)]
struct Opened {
    seconds: f64,
    tensors: usize,
    bytes: u64,
}

fn main() {
    if let Some(job) = Job::from_env() {
        let t = Instant::now();
        let ck = Checkpoint::open(&job.path).unwrap();
        let seconds = t.elapsed().as_secs_f64();
        return child::report(&Opened {
            seconds,
            tensors: ck.len(),
            bytes: ck.total_bytes(),
        });
    }
    let Options { runs, dir } = args::parse();
    open_arm(&dir.join("sparse-300gib"), runs);
    tp_arm(&dir, runs);
}

/// A sparse checkpoint: real headers, tensor data left unwritten.
fn write_sparse(dir: &Path) -> PathBuf {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        return index;
    }
    std::fs::create_dir_all(dir).unwrap();
    let per_tensor = SHARD_BYTES / TENSORS_PER_SHARD as u64;
    let cols = 8192u64;
    let rows = per_tensor / 2 / cols;
    let mut weight_map = serde_json::Map::new();
    for s in 0..SHARDS {
        let name = format!("model-{:05}-of-{SHARDS:05}.safetensors", s + 1);
        let mut header = serde_json::Map::new();
        let mut at = 0u64;
        for t in 0..TENSORS_PER_SHARD {
            let tensor = format!("model.layers.{s}.t{t}.weight");
            let len = rows * cols * 2;
            header.insert(
                tensor.clone(),
                serde_json::json!({"dtype": "BF16", "shape": [rows, cols], "data_offsets": [at, at + len]}),
            );
            at += len;
            weight_map.insert(tensor, name.clone().into());
        }
        let mut json = serde_json::to_vec(&header).unwrap();
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let mut f = File::create(dir.join(&name)).unwrap();
        f.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
        f.write_all(&json).unwrap();
        f.set_len(8 + json.len() as u64 + at).unwrap();
    }
    let body = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(&index, serde_json::to_vec(&body).unwrap()).unwrap();
    index
}

fn open_arm(dir: &Path, runs: usize) {
    let index = write_sparse(dir);
    let mut times = Vec::new();
    let mut shape = String::new();
    for _ in 0..runs {
        data::evict(&[&index]).unwrap();
        let opened: Opened = Child::new("open", &index)
            .run()
            .unwrap_or_else(|e| panic!("open: {e}"))
            .figures;
        times.push(opened.seconds * 1000.0);
        shape = format!("{} tensors, {} GiB", opened.tensors, opened.bytes >> 30);
    }
    let time = Spread::of(&times).unit(" ms");
    println!("| header-only open, cold, {SHARDS} shards, {shape} | {time:.1} |");
}

/// A rank's tensor-parallel parts on the FUSE test filesystem, of a
/// checkpoint kept in `dir`.
fn tp_arm(dir: &Path, runs: usize) {
    if safeload_testfs::skip_without_fuse() {
        return;
    }
    // 32 BF16 matrices of 4096 x 4096 (32 MiB each) in 4 shards: 1 GiB.
    let shards: Vec<Vec<TensorSpec>> = (0..4)
        .map(|s| {
            (0..8)
                .map(|t| {
                    TensorSpec::new(format!("layers.{s}.{t}.weight"), Dtype::BF16, &[4096, 4096])
                })
                .collect()
        })
        .collect();
    let root = data::checkpoint(dir, "tp-1gib", &shards).unwrap();
    let fs = safeload_testfs::Mount::new(
        &root,
        safeload_testfs::Options {
            fsname: "hf-mount".into(),
            direct_io: true,
            latency: Some(Duration::from_millis(2)),
            daemon_threads: Some(16),
            ..safeload_testfs::Options::default()
        },
    )
    .unwrap();
    let mut results: HashMap<&str, (Vec<f64>, u64)> = HashMap::new();
    let arms = ["whole", "rank 3 of 8, dim 0", "rank 3 of 8, dim 1"];
    for round in 0..runs {
        for a in common::rotated(arms.len(), round) {
            let arm = arms[a];
            let ck = Loader::new().open(fs.path()).unwrap();
            fs.reset_stats();
            let t = Instant::now();
            match arm {
                "whole" => drop(ck.load_filtered(|_| true).unwrap()),
                "rank 3 of 8, dim 0" => {
                    for info in ck.tensors() {
                        drop(ck.shard(info.name(), 0, 3, 8).unwrap());
                    }
                }
                _ => {
                    for info in ck.tensors() {
                        drop(ck.shard(info.name(), 1, 3, 8).unwrap());
                    }
                }
            }
            let secs = t.elapsed().as_secs_f64();
            let e = results.entry(arm).or_default();
            e.0.push(secs);
            e.1 = fs.stats().bytes_read;
        }
    }
    println!("| FUSE 2 ms, 1 GiB in 32 BF16 matrices | seconds | MiB read |");
    println!("|---|---|---|");
    for arm in arms {
        let (t, bytes) = results.remove(arm).unwrap();
        println!("| {arm} | {:.3} | {} |", Spread::of(&t), bytes >> 20);
    }
}
