//! The examples' demo checkpoint, written with the `safetensors` crate alone: three shards
//! and an index, with the dtypes and shapes of a transformer's layers (BF16, F16, F32, I64,
//! U8 and BOOL tensors, a scalar and an empty tensor), about 30 MiB.

use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// The layers of each shard: a name under `model.layers.<shard>.`, a dtype, a shape.
const LAYERS: [(&str, Dtype, &[usize]); 6] = [
    ("attn.qkv.weight", Dtype::BF16, &[1536, 2048]),
    ("mlp.up.weight", Dtype::F16, &[2048, 1024]),
    ("norm.weight", Dtype::F32, &[2048]),
    ("rotary.positions", Dtype::I64, &[4096]),
    ("tokenizer.bytes", Dtype::U8, &[65536]),
    ("mask", Dtype::BOOL, &[64, 64]),
];

/// Writes the checkpoint into `dir` (which must exist); returns the index's path.
pub fn write(dir: &Path) -> Result<PathBuf, Box<dyn Error>> {
    let mut weight_map = BTreeMap::new();
    for shard in 0..3 {
        let file = format!("model-{:05}-of-00003.safetensors", shard + 1);
        let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = LAYERS
            .iter()
            .map(|&(layer, dtype, shape)| {
                let n = shape.iter().product();
                let name = format!("model.layers.{shard}.{layer}");
                (name, dtype, shape.to_vec(), values(dtype, n, shard))
            })
            .collect();
        if shard == 0 {
            let scale = 0.125f32.to_le_bytes().to_vec();
            tensors.push(("model.scale".into(), Dtype::F32, vec![], scale));
            tensors.push(("model.unused".into(), Dtype::F16, vec![0], Vec::new()));
        }
        let mut views = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, bytes) in &tensors {
            views.push((name.clone(), TensorView::new(*dtype, shape.clone(), bytes)?));
            weight_map.insert(name.clone(), file.clone());
        }
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), &dir.join(&file))?;
    }
    let index = dir.join("model.safetensors.index.json");
    let body = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(&index, serde_json::to_vec_pretty(&body)?)?;
    Ok(index)
}

/// `n` values of `dtype`, little-endian: floats from a sine (small and finite, so a model
/// built from them computes finite results), integers counting, bools alternating.
fn values(dtype: Dtype, n: usize, shard: usize) -> Vec<u8> {
    let float = |i: usize| ((i + shard) as f32).sin() / 8.0;
    match dtype {
        Dtype::F32 => (0..n).flat_map(|i| float(i).to_le_bytes()).collect(),
        Dtype::F16 => (0..n)
            .flat_map(|i| f16::from_f32(float(i)).to_le_bytes())
            .collect(),
        Dtype::BF16 => (0..n)
            .flat_map(|i| bf16::from_f32(float(i)).to_le_bytes())
            .collect(),
        Dtype::I64 => (0..n as i64).flat_map(|i| i.to_le_bytes()).collect(),
        Dtype::BOOL => (0..n).map(|i| u8::from(i % 2 == 0)).collect(),
        _ => (0..n).map(|i| ((i * 31 + shard * 7) % 251) as u8).collect(),
    }
}
