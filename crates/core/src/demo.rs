//! A small built-in checkpoint to try the crate on without a download: three shards and an index, with the dtypes and shapes of a transformer's layers.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use crate::error::Operation;
use crate::error::{Error, Result};

/// Writes the demo checkpoint into `dir` (which must exist): three shards of
/// about 10 MiB (`model-0000N-of-00003.safetensors`) and its index, whose
/// path it returns. Float values are finite, so a model built from them
/// computes finite results.
///
/// ```
/// let dir = tempfile::tempdir()?;
/// let index = safeload::demo::write(dir.path())?;
/// let sd = safeload::load_state_dict(&index, None)?;
/// assert_eq!(sd.len(), 20);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// The error of writing a file, naming it.
pub fn write(dir: &Path) -> Result<PathBuf> {
    let layers: [(&str, Dtype, &[usize]); 6] = [
        ("attn.qkv.weight", Dtype::BF16, &[1536, 2048]),
        ("mlp.up.weight", Dtype::F16, &[2048, 1024]),
        ("norm.weight", Dtype::F32, &[2048]),
        ("rotary.positions", Dtype::I64, &[4096]),
        ("tokenizer.bytes", Dtype::U8, &[65536]),
        ("mask", Dtype::BOOL, &[64, 64]),
    ];
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for shard in 0..3usize {
        let file = format!("model-{:05}-of-00003.safetensors", shard + 1);
        let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
        for (layer, dtype, shape) in layers {
            let n: usize = shape.iter().product();
            tensors.push((
                format!("model.layers.{shard}.{layer}"),
                dtype,
                shape.to_vec(),
                values(dtype, n, shard),
            ));
        }
        if shard == 0 {
            tensors.push((
                "model.scale".into(),
                Dtype::F32,
                vec![],
                0.125f32.to_le_bytes().to_vec(),
            ));
            tensors.push(("model.unused".into(), Dtype::F16, vec![0], Vec::new()));
        }
        let mut views = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, bytes) in &tensors {
            let view = TensorView::new(*dtype, shape.clone(), bytes)
                .map_err(|e| failed(&dir.join(&file), e))?;
            views.push((name.clone(), view));
            weight_map.insert(name.clone(), file.clone().into());
            total += bytes.len();
        }
        let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, Some(meta), &path).map_err(|e| failed(&path, e))?;
    }
    let index = dir.join("model.safetensors.index.json");
    let body = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let text = serde_json::to_vec_pretty(&body).map_err(|e| failed(&index, e))?;
    std::fs::write(&index, text).map_err(|e| Error::io(Operation::Write, &index, None, e))?;
    Ok(index)
}

/// `n` values of `dtype`, little-endian: floats `sin(i + shard) / 8`,
/// integers counting, bools alternating.
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

fn failed(path: &Path, error: impl std::fmt::Display) -> Error {
    Error::io(
        Operation::Write,
        path,
        None,
        std::io::Error::other(error.to_string()),
    )
}
