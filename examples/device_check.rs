//! The GPU half of `scripts/device_check.sh` (feature `cuda`): built here in release and
//! carried to a machine with one NVIDIA GPU, no Rust and no registry, it prints one line
//! per figure.
//!
//! ```text
//! device_check roofline [GIB]            pinned and pageable host-to-device copies of GIB (1)
//! device_check generate DIR [GIB] [N]    a checkpoint of N BF16 shards (16), GIB in all (8)
//! device_check load DIR [RANK/WORLD]     the staged load, warm, every byte copied back and
//!                                        compared; with RANK/WORLD a tensor-parallel part
//! ```
//!
//! Build: `cargo build --release --features cuda --example device_check`
//! (`target/release/examples/device_check`; `CUDARC_CUDA_VERSION=12020` picks the driver
//! API the bindings follow where there is no `nvcc` here).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use safeload::device::{Cuda, DeviceTensors, Part, ToDevice};
use safeload::{Checkpoint, Loader};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const GIB: u64 = 1 << 30;
/// One tensor of a generated shard: BF16 [4096, 8192], 64 MiB.
const ROWS: usize = 4096;
const COLS: usize = 8192;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let result = match arg(0) {
        Some("roofline") => roofline(arg(1).map_or(Ok(1.0), str::parse).unwrap_or(1.0)),
        Some("generate") => match arg(1) {
            Some(dir) => generate(
                Path::new(dir),
                arg(2).and_then(|g| g.parse().ok()).unwrap_or(8.0),
                arg(3).and_then(|n| n.parse().ok()).unwrap_or(16),
            ),
            None => Err("generate DIR [GIB] [SHARDS]".into()),
        },
        Some("load") => match arg(1) {
            Some(dir) => arg(2)
                .map(part_of)
                .transpose()
                .and_then(|part| load(Path::new(dir), part)),
            None => Err("load DIR [RANK/WORLD]".into()),
        },
        _ => Err("usage: device_check roofline | generate DIR | load DIR [RANK/WORLD]".into()),
    };
    if let Err(e) = result {
        eprintln!("device_check: {e}");
        std::process::exit(1);
    }
}

fn part_of(text: &str) -> Result<(usize, usize)> {
    let (rank, world) = text.split_once('/').ok_or("RANK/WORLD")?;
    Ok((rank.parse()?, world.parse()?))
}

/// Pinned and pageable host-to-device bandwidth for `gib` GiB: the best of three copies
/// each, on one stream.
fn roofline(gib: f64) -> Result<()> {
    let gpu = Cuda::on_device(0)?;
    let stream = gpu.stream();
    let len = (gib * GIB as f64) as usize;
    let mut device = stream.alloc_zeros::<u8>(len)?;
    // SAFETY: the pinned memory comes uninitialized; it is filled below, before it is
    // read, and any byte is a valid `u8`.
    let mut pinned = unsafe { stream.context().alloc_pinned::<u8>(len) }?;
    pinned.as_mut_slice()?.fill(7);
    let pageable = vec![7u8; len];
    let best = |copy: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let start = Instant::now();
            copy()?;
            stream.synchronize()?;
            best = best.min(start.elapsed().as_secs_f64());
        }
        Ok(len as f64 / best / 1e9)
    };
    let pinned_gbs = best(&mut || Ok(stream.memcpy_htod(&pinned, &mut device)?))?;
    let pageable_gbs = best(&mut || Ok(stream.memcpy_htod(&pageable, &mut device)?))?;
    println!("roofline: host-to-device {gib} GiB pinned {pinned_gbs:.2} GB/s");
    println!("roofline: host-to-device {gib} GiB pageable {pageable_gbs:.2} GB/s");
    Ok(())
}

/// The byte at `offset` of tensor `t` of shard `s`: cheap, and different across tensors
/// and shards.
fn byte(s: usize, t: usize, offset: usize) -> u8 {
    let x = (offset as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((s * 131 + t) as u64);
    (x >> 29) as u8
}

/// Writes `shards` BF16 shards of about `gib / shards` GiB each, of [ROWS, COLS] tensors,
/// and the index, unless the index is there already.
fn generate(dir: &Path, gib: f64, shards: usize) -> Result<()> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        println!("generate: {} already there", dir.display());
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let start = Instant::now();
    let tensor = ROWS * COLS * 2;
    let per_shard = ((gib * GIB as f64) as usize / shards / tensor).max(1);
    let mut weight_map = serde_json::Map::new();
    for s in 0..shards {
        let name = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let mut header = serde_json::Map::new();
        for t in 0..per_shard {
            let tname = format!("layers.{s}.w{t}");
            let span = [t * tensor, (t + 1) * tensor];
            let entry =
                serde_json::json!({"dtype": "BF16", "shape": [ROWS, COLS], "data_offsets": span});
            header.insert(tname.clone(), entry);
            weight_map.insert(tname, name.clone().into());
        }
        let mut json = serde_json::Value::Object(header).to_string();
        while json.len() % 8 != 0 {
            json.push(' ');
        }
        let mut file =
            std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(dir.join(&name))?);
        file.write_all(&(json.len() as u64).to_le_bytes())?;
        file.write_all(json.as_bytes())?;
        let mut bytes = vec![0u8; tensor];
        for t in 0..per_shard {
            for (offset, b) in bytes.iter_mut().enumerate() {
                *b = byte(s, t, offset);
            }
            file.write_all(&bytes)?;
        }
        file.flush()?;
    }
    let index_json = serde_json::json!({ "weight_map": weight_map });
    std::fs::write(index, serde_json::to_vec(&index_json)?)?;
    println!(
        "generate: {} BF16 shards of {} tensors ({:.2} GiB) in {:.1} s",
        shards,
        per_shard,
        (shards * per_shard * tensor) as f64 / GIB as f64,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Reads every shard once, so that the load is warm.
fn warm(files: &[PathBuf]) -> Result<()> {
    let mut buf = vec![0u8; 16 << 20];
    for f in files {
        let mut file = std::fs::File::open(f)?;
        while std::io::Read::read(&mut file, &mut buf)? > 0 {}
    }
    Ok(())
}

/// The staged load of `dir`, warm: the best of three, then every byte copied back and
/// compared with the file's (for a tensor-parallel part, the part's).
fn load(dir: &Path, part: Option<(usize, usize)>) -> Result<()> {
    let gpu = Cuda::on_device(0)?;
    let ck = Loader::new().open(dir)?;
    let files: Vec<PathBuf> = ck.files().map(Path::to_path_buf).collect();
    warm(&files)?;
    let parts = |info: &safeload::TensorInfo| match part {
        // Row-parallel for even tensors, column-parallel for odd ones.
        Some((rank, world)) => Part::Shard {
            dim: usize::from(info.name().ends_with(['1', '3', '5', '7', '9'])),
            rank,
            world,
        },
        None => Part::Whole,
    };
    let mut best: Option<(f64, DeviceTensors<Cuda>)> = None;
    for _ in 0..3 {
        let start = Instant::now();
        let loaded = ck.to_device_parts(&gpu, parts)?;
        gpu.stream().synchronize()?;
        let seconds = start.elapsed().as_secs_f64();
        if best.as_ref().is_none_or(|(b, _)| seconds < *b) {
            best = Some((seconds, loaded));
        }
    }
    let (seconds, loaded) = best.ok_or("no load")?;
    let report = loaded.report();
    let what = match part {
        Some((rank, world)) => format!("TP rank {rank}/{world} part"),
        None => "whole".to_owned(),
    };
    println!(
        "staged load ({what}) of {:.2} GiB warm: {:.2} GB/s ({} chunks of {} MiB, {} staging buffers, {} readers, {})",
        report.bytes() as f64 / GIB as f64,
        report.bytes() as f64 / seconds / 1e9,
        report.chunks(),
        report.staging_bytes >> 20,
        report.staging_buffers,
        report.readers,
        report.device,
    );
    check(&gpu, &ck, &loaded, part)?;
    println!("staged load ({what}): every byte copied back and compared: equal");
    Ok(())
}

/// Every tensor of `loaded` copied back and compared with the bytes `ck` reads for it.
fn check(
    gpu: &Cuda,
    ck: &Checkpoint,
    loaded: &DeviceTensors<Cuda>,
    part: Option<(usize, usize)>,
) -> Result<()> {
    for t in loaded.iter() {
        let memory = t.slab().memory();
        let view = memory.slice(t.offset()..t.offset() + t.nbytes());
        let got = gpu.stream().clone_dtoh(&view)?;
        gpu.stream().synchronize()?;
        drop(memory);
        let want = match part {
            Some((rank, world)) => {
                let dim = usize::from(t.name().ends_with(['1', '3', '5', '7', '9']));
                ck.shard(t.name(), dim, rank, world)?
            }
            None => ck.read(t.name())?,
        };
        if got != want.as_bytes() {
            return Err(format!("{}: the device's bytes differ from the file's", t.name()).into());
        }
    }
    Ok(())
}
