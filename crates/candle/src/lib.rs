//! safeload for candle: tensors and state dicts as `candle_core` tensors ([`ToCandle`], [`IntoCandle`]), a lazy `VarBuilder` over an opened checkpoint (and a sharded one for tensor parallelism), the dtype mapping between the two, and (feature `cuda`) a load to a GPU handed to candle.
//!
//! The facade re-exports these items as `safeload::candle` (feature
//! `candle`). Every function answers with candle's `Result`, safeload's
//! errors wrapped (`candle_core::Error::wrap`). The dtype mapping is the
//! table on [`ToCandle`].
//!
//! ```no_run
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device};
//!
//! let device = Device::Cpu;
//! // Reads each tensor when the model asks for it: the map where the file
//! // is mapped, positional reads straight into candle's storage where not.
//! let vb = safeload::candle::var_builder("path/to/checkpoint", DType::BF16, &device)?;
//! let proj = candle_nn::linear(1024, 1024, vb.pp("model.layers.0.mlp.up_proj"))?;
//!
//! // Tensor parallelism: this rank's part of each tensor, read alone. A
//! // safeload error meets candle's `?` wrapped.
//! let checkpoint =
//!     safeload::Checkpoint::open("path/to/checkpoint").map_err(candle_core::Error::wrap)?;
//! let vb = safeload::candle::sharded_var_builder_from(checkpoint, DType::BF16, &device);
//! let shard = candle_nn::var_builder::Shard { dim: 0, rank: 1, world_size: 8 };
//! let up = vb.get_with_hints((4096 / 8, 1024), "model.layers.0.mlp.up_proj.weight", shard)?;
//!
//! // One tensor, or a whole state dict: the traits' methods.
//! use safeload::candle::{IntoCandle, ToCandle};
//! let sd = safeload::load_state_dict("path/to/checkpoint", None).map_err(candle_core::Error::wrap)?;
//! let norm = sd.get("model.norm.weight").unwrap().to_candle_as(DType::F32, &device)?;
//! let tensors = sd.into_candle(&device)?;
//! # Ok(()) }
//! ```
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod backend;
#[cfg(feature = "cuda")]
pub mod cuda;
mod tensor;

pub use backend::{ShardedCheckpoint, sharded_var_builder_from, var_builder, var_builder_from};
pub use tensor::{IntoCandle, ToCandle};
