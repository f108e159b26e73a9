//! The bytes the benchmarks read, from one seeded generator (`random`):
//! checkpoints written once and kept under the data directory, warmed or
//! evicted before each arm, and checksummed; and a stream of words for values
//! made in memory.

use std::io::Read;
use std::path::{Path, PathBuf};

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::random;

/// The version of the bytes [`checkpoint`] writes, part of every cached
/// checkpoint's directory name: bump it when they change, so that a
/// checkpoint cached by an earlier version is written again instead of being
/// measured as the current one. Version 1 (directories named without a
/// version) was one xorshift stream over all tensors, a 64-bit word per step;
/// version 2 fills each tensor with `random::bytes_for` of its name.
pub const DATA_VERSION: u32 = 2;

/// One tensor of a checkpoint to write.
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: Dtype, shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    /// Its size in bytes.
    pub fn len(&self) -> u64 {
        (self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8) as u64
    }
}

/// The `i`th tensor of a mixed shard, named `name`: 48 MiB BF16, 12 MiB F32,
/// 3 MiB BF16 and 16 KiB F32 in turn, 4096 columns each, as a language
/// model's projections, norms and biases come.
pub fn mixed(name: String, i: usize) -> TensorSpec {
    let (dtype, rows) = match i % 4 {
        0 => (Dtype::BF16, 6144),
        1 => (Dtype::F32, 768),
        2 => (Dtype::BF16, 384),
        _ => (Dtype::F32, 1),
    };
    TensorSpec::new(name, dtype, &[rows, 4096])
}

/// The directory stem of the checkpoint [`sharded`] lays out: `ckpt-{MiB}mib-{shards}`
/// (kept under the data directory as `{stem}-v{DATA_VERSION}`).
pub fn stem(size: u64, shards: usize) -> String {
    format!("ckpt-{}mib-{shards}", size >> 20)
}

/// The load benchmark's checkpoint: `shards` shards of about `size / shards`
/// bytes each, of the [`mixed`] tensors (uneven shards: the last is half as
/// large).
pub fn sharded(size: u64, shards: usize) -> Vec<Vec<TensorSpec>> {
    let per_shard = size / shards as u64;
    (0..shards)
        .map(|s| {
            let target = if s + 1 == shards {
                per_shard / 2
            } else {
                per_shard
            };
            let mut tensors = Vec::new();
            let mut bytes = 0;
            while bytes < target {
                let i = tensors.len();
                let tensor = mixed(format!("layers.{s}.t{i}"), i);
                bytes += tensor.len();
                tensors.push(tensor);
            }
            tensors
        })
        .collect()
}

/// The name of shard `s` (from 0) of `n`, as the Hugging Face hub names them.
pub fn shard_name(s: usize, n: usize) -> String {
    format!("model-{:05}-of-{n:05}.safetensors", s + 1)
}

/// Writes a sharded checkpoint, `shards[s]` the tensors of shard `s`, each
/// filled with `random::bytes_for` its name, with the reference serializer,
/// and its index last; returns its directory, `dir/{stem}-v{DATA_VERSION}`.
///
/// Kept between runs: if the index is there, nothing is written. One shard's
/// bytes are in memory at a time. Every file is synced, so that the first
/// cold arm can evict it (`posix_fadvise(DONTNEED)` drops clean pages only).
pub fn checkpoint(dir: &Path, stem: &str, shards: &[Vec<TensorSpec>]) -> std::io::Result<PathBuf> {
    let root = dir.join(format!("{stem}-v{DATA_VERSION}"));
    let index = root.join("model.safetensors.index.json");
    if index.exists() {
        return Ok(root);
    }
    eprintln!("writing {}", root.display());
    std::fs::create_dir_all(&root)?;
    let mut weight_map = serde_json::Map::new();
    for (s, tensors) in shards.iter().enumerate() {
        let name = shard_name(s, shards.len());
        let data: Vec<Vec<u8>> = tensors
            .iter()
            .map(|t| random::bytes_for(&t.name, t.len() as usize))
            .collect();
        let mut views = Vec::with_capacity(tensors.len());
        for (t, bytes) in tensors.iter().zip(&data) {
            let view =
                TensorView::new(t.dtype, t.shape.clone(), bytes).map_err(std::io::Error::other)?;
            views.push((t.name.clone(), view));
            weight_map.insert(t.name.clone(), name.clone().into());
        }
        let path = root.join(&name);
        safetensors::serialize_to_file(views, None, &path).map_err(std::io::Error::other)?;
        std::fs::File::open(&path)?.sync_all()?;
    }
    let body = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(&index, serde_json::to_vec(&body)?)?;
    std::fs::File::open(&index)?.sync_all()?;
    Ok(root)
}

/// The shards of the checkpoint in `root`, in order.
pub fn shard_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "safetensors"));
    files.sort();
    files
}

/// Reads every shard of the checkpoint in `root` once, so that an arm finds
/// them all in the page cache.
pub fn warm(root: &Path) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 << 20];
    for path in shard_files(root) {
        let mut file = std::fs::File::open(path)?;
        while file.read(&mut buf)? > 0 {}
    }
    Ok(())
}

/// Drops every file of each checkpoint (a directory, an index or a file)
/// from the page cache: `safeload::evict`, `posix_fadvise(DONTNEED)` on each
/// shard and the index. Each checkpoint is tried; the first error is
/// returned.
pub fn evict(checkpoints: &[&Path]) -> Result<(), String> {
    let mut first = Ok(());
    for path in checkpoints {
        if let Err(e) = safeload::evict(path) {
            first = first.and(Err(format!("evicting {}: {e}", path.display())));
        }
    }
    first
}

/// Sums bytes as little-endian u64 words (wrapping), the tail byte by byte:
/// order-independent, so every arm agrees however it splits the bytes (on
/// 8-byte boundaries).
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    let mut sum = 0u64;
    for w in &mut words {
        sum = sum.wrapping_add(u64::from_le_bytes(w.try_into().expect("8 bytes")));
    }
    for (i, b) in words.remainder().iter().enumerate() {
        sum = sum.wrapping_add(u64::from(*b) << (8 * i));
    }
    sum
}

/// An endless stream of seeded pseudo-random words, for values made by the
/// hundred million in memory (the conversion benchmark's weights):
/// `random::bytes_for(name, 16 MiB)` read as little-endian u64s, round and
/// round.
///
/// NOTE: a pool, not `random::fill` for every value: it takes a generator
/// step per byte, 3.7-4.1 ns on the development VM (2026-12-01, release
/// build, 256 MiB), so the 13 random bytes of a weight would cost some 50 ns
/// and the default sources' 640 M weights over 30 s. With the pool the
/// conversion benchmark at `--mib 64 --rounds 1` ran in 4.6 s, against 5.9 s
/// with the splitmix64 generator of its own that this replaced. The pool
/// repeats every 2 Mi words, far beyond what a branch predictor or a
/// prefetcher keeps.
pub struct Words {
    pool: Vec<u64>,
    at: usize,
}

impl Words {
    pub fn new(name: &str) -> Words {
        let bytes = random::bytes_for(name, 16 << 20);
        let pool = bytes
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        Words { pool, at: 0 }
    }

    /// The next word.
    pub fn word(&mut self) -> u64 {
        let word = self.pool[self.at];
        self.at = (self.at + 1) % self.pool.len();
        word
    }
}
