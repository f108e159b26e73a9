//! Builders of checkpoints in temporary directories, written with the
//! `safetensors` crate's own serializer, and a naive reference loader.
//!
//! The test binary `tests/it` includes this module (`mod common;`, by
//! `#[path]`, so that the benchmarks find `random.rs` where it was); the
//! submodules serve the few tests that need more: `random` (the bytes of
//! every generated tensor, shared with the benchmarks), `residency`
//! (page-cache residency by `mincore(2)`), `cgroup` (a load under a memory
//! or pids limit) and `child` (the test binary run again as a child process).
#![allow(dead_code)]

#[cfg(unix)]
pub mod residency;

pub mod cgroup;
pub mod child;
pub mod random;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use safetensors::Dtype;
use safetensors::tensor::TensorView;

pub use random::bytes_for;

/// The three ways a file's bytes reach a load: mapped, read through the
/// page cache, read with `O_DIRECT`; tests add the variants they need.
pub fn read_modes() -> Vec<(&'static str, safeload::Loader)> {
    use safeload::Loader;
    vec![
        ("mmap", Loader::new().disable_mmap(false)),
        (
            "buffered",
            Loader::new().disable_mmap(true).direct_io(false),
        ),
        (
            "buffered-direct",
            Loader::new().disable_mmap(true).direct_io(true),
        ),
    ]
}

/// One tensor to write.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Every dtype the `safetensors` crate knows.
pub const ALL_DTYPES: [Dtype; 22] = [
    Dtype::BOOL,
    Dtype::F4,
    Dtype::F6_E2M3,
    Dtype::F6_E3M2,
    Dtype::U8,
    Dtype::I8,
    Dtype::F8_E5M2,
    Dtype::F8_E4M3,
    Dtype::F8_E8M0,
    Dtype::F8_E4M3FNUZ,
    Dtype::F8_E5M2FNUZ,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::C64,
    Dtype::F64,
    Dtype::I64,
    Dtype::U64,
];

/// A tensor `name` of `dtype` and `shape`, its bytes `bytes_for(name, ..)`
/// (for BOOL, each byte's lowest bit, so that every value is 0 or 1).
pub fn spec(name: &str, dtype: Dtype, shape: &[usize]) -> Spec {
    let bits: usize = shape.iter().product::<usize>() * dtype.bitsize();
    assert_eq!(bits % 8, 0, "{name}: whole bytes");
    let mut data = bytes_for(name, bits / 8);
    if dtype == Dtype::BOOL {
        data.iter_mut().for_each(|b| *b &= 1);
    }
    Spec {
        name: name.to_string(),
        dtype,
        shape: shape.to_vec(),
        data,
    }
}

/// Every dtype in three shapes: a matrix, a 0-dim scalar (where a single
/// element is whole bytes) and an empty tensor.
pub fn every_dtype() -> Vec<Spec> {
    let mut specs = Vec::new();
    for dtype in ALL_DTYPES {
        let name = format!("{dtype:?}").to_lowercase();
        // 4 x 6 elements: whole bytes for the 4- and 6-bit types too.
        specs.push(spec(&format!("{name}.matrix"), dtype, &[4, 6]));
        if dtype.bitsize() % 8 == 0 {
            specs.push(spec(&format!("{name}.scalar"), dtype, &[]));
        }
        specs.push(spec(&format!("{name}.empty"), dtype, &[0, 3]));
    }
    specs
}

pub fn metadata() -> HashMap<String, String> {
    HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("writer".to_string(), "safeload tests".to_string()),
    ])
}

/// Writes one safetensors file with the reference serializer.
pub fn write_file(path: &Path, specs: &[Spec], metadata: Option<HashMap<String, String>>) {
    let views: Vec<(String, TensorView<'_>)> = specs
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                TensorView::new(s.dtype, s.shape.clone(), &s.data).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, metadata, path).unwrap();
}

/// Writes `model.safetensors` in `dir`.
pub fn write_single(dir: &Path, specs: &[Spec]) -> PathBuf {
    let path = dir.join("model.safetensors");
    write_file(&path, specs, Some(metadata()));
    path
}

/// Splits `specs` round-robin over `shards` files and writes them with
/// `model.safetensors.index.json`. Returns the index's path.
pub fn write_sharded(dir: &Path, specs: &[Spec], shards: usize) -> PathBuf {
    let mut groups: Vec<Vec<Spec>> = vec![Vec::new(); shards];
    for (i, s) in specs.iter().enumerate() {
        groups[i % shards].push(s.clone());
    }
    let mut weight_map = serde_json::Map::new();
    for (i, group) in groups.iter().enumerate() {
        let name = shard_name(i, shards);
        write_file(&dir.join(&name), group, Some(metadata()));
        for s in group {
            weight_map.insert(s.name.clone(), name.clone().into());
        }
    }
    let total: usize = specs.iter().map(|s| s.data.len()).sum();
    write_index(
        dir,
        serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        }),
    )
}

pub fn shard_name(i: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", i + 1, n)
}

/// Writes `index` as `model.safetensors.index.json` in `dir`. Returns its path.
pub fn write_index(dir: &Path, index: serde_json::Value) -> PathBuf {
    let path = dir.join("model.safetensors.index.json");
    fs::write(&path, serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    path
}

/// Writes a file from a raw header string and data, for files the reference
/// serializer would refuse or lay out differently.
pub fn write_raw(path: &Path, header: &str, data: &[u8]) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    fs::write(path, bytes).unwrap();
}

/// A sharded checkpoint of about 3.3 MiB in three shards of uneven size, none
/// a whole number of pages, for the prefetch tests. Returns the index path.
pub fn write_uneven_shards(dir: &Path) -> PathBuf {
    let specs = [
        spec("a", Dtype::U8, &[1_500_001]),
        spec("b", Dtype::U8, &[700_003]),
        spec("c", Dtype::U8, &[900_007]),
        spec("d", Dtype::U8, &[123_457]),
        spec("e", Dtype::F32, &[12_345]),
    ];
    write_sharded(dir, &specs, 3)
}

/// The chunk size the prefetch tests use: small, so that the few MiB of
/// `write_uneven_shards` make many chunks.
pub const PREFETCH_CHUNK: usize = 128 << 10;

/// The `*.safetensors` files directly in `dir`, sorted.
pub fn shards_of(dir: &Path) -> Vec<PathBuf> {
    let mut shards: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    shards.sort();
    shards
}

/// The sizes of `files` added up.
pub fn total_size(files: &[PathBuf]) -> u64 {
    files.iter().map(|f| fs::metadata(f).unwrap().len()).sum()
}

/// The naive reference: read the whole file, parse it with the `safetensors`
/// crate, copy every tensor out. Sorted by name.
pub fn naive_load(files: &[PathBuf]) -> Vec<Spec> {
    let mut out = Vec::new();
    for file in files {
        let bytes = fs::read(file).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, view) in st.tensors() {
            out.push(Spec {
                name,
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The loaded tensors as specs, sorted by name.
pub fn loaded(sd: &safeload::StateDict) -> Vec<Spec> {
    let mut out: Vec<Spec> = sd
        .iter()
        .map(|(name, t)| Spec {
            name: name.to_string(),
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: t.as_bytes().to_vec(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

pub fn sorted(specs: &[Spec]) -> Vec<Spec> {
    let mut specs = specs.to_vec();
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    specs
}

/// Both strategies, by their `disable_mmap` value.
pub const MODES: [bool; 2] = [false, true];

/// Held by every test that streams (`Checkpoint::for_each`), in any module:
/// the stream tests count the stream's reader threads of the whole process
/// (by name), which another test's stream would add to.
pub fn streaming() -> MutexGuard<'static, ()> {
    static STREAMING: Mutex<()> = Mutex::new(());
    STREAMING.lock().unwrap_or_else(|e| e.into_inner())
}
