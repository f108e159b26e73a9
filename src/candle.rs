//! Tensors as candle tensors, a lazy `VarBuilder` over a checkpoint, and a
//! sharded one for tensor parallelism (feature `candle`: the crate
//! `safeload-candle`): see [`var_builder`], and [`ToCandle::to_candle`] for
//! one tensor ([`ToCandle`] has the table of which candle dtype each of
//! safeload's becomes). Every function answers with candle's `Result`; where a
//! safeload error meets candle's `?`, wrap it:
//! `.map_err(candle_core::Error::wrap)?`.

#[doc(inline)]
pub use safeload_candle::{
    IntoCandle, ShardedCheckpoint, ToCandle, sharded_var_builder_from, var_builder_from,
};

/// A candle `VarBuilder` over the checkpoint at `path` (or, feature
/// `remote`, the address of one), opened from its headers alone: the
/// one-liner for an engine built on candle.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device};
///
/// let vb = safeload::candle::var_builder("path/to/checkpoint", DType::BF16, &Device::Cpu)?;
/// let proj = candle_nn::linear(1024, 1024, vb.pp("model.layers.0.mlp.up_proj"))?;
/// # let _ = proj; Ok(()) }
/// ```
///
/// # Errors
///
/// As `Checkpoint::open`, wrapped in candle's error (its message intact).
pub fn var_builder(
    path: impl AsRef<std::path::Path>,
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
    safeload_candle::var_builder::<crate::extras::Builtin>(path, dtype, device)
}

/// A load to a GPU as candle tensors on `Device::Cuda` and a `VarBuilder`
/// over them (feature `candle-cuda`).
#[cfg(feature = "candle-cuda")]
pub mod cuda {
    #[doc(inline)]
    pub use safeload_candle::cuda::*;

    /// A candle `VarBuilder` over the checkpoint at `path` (or, feature
    /// `remote`, the address of one), loaded into `device`'s memory on
    /// candle's stream ([`device`]) and handed over as
    /// `IntoCandle::into_candle` of `DeviceTensors<Cuda>` does: each file's main dtype as views
    /// of its slab, the others copied on the GPU.
    ///
    /// # Errors
    ///
    /// As [`device`], `Loader::load_to_device` and
    /// `IntoCandle::into_candle`.
    pub fn var_builder(
        path: impl AsRef<std::path::Path>,
        dtype: candle_core::DType,
        device: &candle_core::Device,
    ) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
        safeload_candle::cuda::var_builder::<crate::extras::Builtin>(path, dtype, device)
    }
}
