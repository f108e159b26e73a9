//! Builds a small candle model from a demo checkpoint (written here with the `safetensors`
//! crate, `examples/common/demo.rs`), through
//! safeload's lazy `VarBuilder`, and checks its output against the weights
//! safeload loads.
//!
//! ```text
//! cargo run --release --features candle --example candle
//! ```

use candle_core::{DType, Device, IndexOp, Module, Tensor};

/// The demo checkpoint, written with the `safetensors` crate.
#[path = "common/demo.rs"]
mod demo;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let index = demo::write(dir.path())?;
    let device = Device::Cpu;

    // The model: the demo's first MLP projection (2048 x 1024, F16 in the
    // file) as a linear layer without bias, in F32.
    let vb = safeload::candle::var_builder(&index, DType::F32, &device)?;
    let up = candle_nn::linear_no_bias(1024, 2048, vb.pp("model.layers.0.mlp.up"))?;

    // A one-hot input picks a column of the weight: the output is that
    // column, exactly.
    let column = 17;
    let mut x = vec![0f32; 1024];
    x[column] = 1.0;
    let y = up.forward(&Tensor::from_vec(x, (1, 1024), &device)?)?;
    let y: Vec<f32> = y.i(0)?.to_vec1()?;

    let sd = safeload::load_state_dict(&index, None)?;
    let w = sd
        .get("model.layers.0.mlp.up.weight")
        .ok_or("no such tensor")?;
    let w = w.to_f32()?; // row-major 2048 x 1024
    let expected: Vec<f32> = (0..2048).map(|row| w[row * 1024 + column]).collect();
    if y != expected {
        return Err("the candle model's output differs from the weights safeload loads".into());
    }
    println!(
        "candle linear 1024 -> 2048 from {}: column {column} of the weight, {} values, y[0..4] = {:?}: match",
        index.display(),
        y.len(),
        &y[..4]
    );
    Ok(())
}
