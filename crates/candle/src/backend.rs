//! candle `VarBuilder`s over an opened checkpoint: a lazy backend that reads each tensor when the model asks for it, and a sharded one that reads only a rank's part.

use std::path::Path;

use candle_core::{DType, Device, Shape};
use safeload_core::extras::Extras;
use safeload_core::{Checkpoint, Dtype};

use crate::tensor::{ToCandle, candle_dtype, filled};

/// A candle `VarBuilder` backend over an opened checkpoint: each tensor read
/// when the model asks for it, a buffered one straight into candle's storage.
#[derive(Debug, Clone)]
struct CheckpointBackend {
    checkpoint: Checkpoint,
}

impl CheckpointBackend {
    fn load(
        &self,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let (info, mapped) = self
            .checkpoint
            .info_mapped(name)
            .map_err(candle_core::Error::wrap)?;
        // A file that is read, in its own dtype: straight into candle's
        // vector, one copy and no buffer of safeload's.
        let remapped = matches!(
            info.dtype(),
            Dtype::BOOL | Dtype::I8 | Dtype::U16 | Dtype::U64
        );
        if !mapped && !remapped && candle_dtype(info.dtype()) == Some(dtype) {
            let read = |out: &mut [u8]| {
                let read = self.checkpoint.read_into(name, out);
                read.map_err(candle_core::Error::wrap)
            };
            if let Some(tensor) = filled(dtype, info.shape(), device, read)? {
                return Ok(tensor);
            }
        }
        let tensor = self
            .checkpoint
            .read(name)
            .map_err(candle_core::Error::wrap)?;
        tensor.to_candle_as(dtype, device)
    }
}

fn check_shape(
    name: &str,
    expected: Shape,
    tensor: candle_core::Tensor,
) -> candle_core::Result<candle_core::Tensor> {
    if tensor.shape() != &expected {
        return Err(candle_core::Error::UnexpectedShape {
            msg: format!("shape mismatch for {name}"),
            expected,
            got: tensor.shape().clone(),
        }
        .bt());
    }
    Ok(tensor)
}

impl candle_nn::var_builder::SimpleBackend for CheckpointBackend {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        check_shape(name, shape, self.load(name, dtype, device)?)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.load(name, dtype, device)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.checkpoint.get(name).is_some()
    }
}

/// A candle `VarBuilder` over the checkpoint at `path`, opened from its
/// headers alone: the one-liner for an engine built on candle.
///
/// # Errors
///
/// As `Checkpoint::open`, wrapped in candle's error.
///
/// `X` is what the checkpoint is read with beyond local paths (the facade's
/// `safeload::candle::var_builder` names its own).
pub fn var_builder<X: Extras + Default + 'static>(
    path: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
    let checkpoint = Checkpoint::<X>::open(path).map_err(candle_core::Error::wrap)?;
    Ok(var_builder_from(checkpoint, dtype, device))
}

/// A candle `VarBuilder` over a checkpoint already opened, with the options
/// of the `Loader` that opened it.
pub fn var_builder_from<X>(
    checkpoint: Checkpoint<X>,
    dtype: DType,
    device: &Device,
) -> candle_nn::VarBuilder<'static> {
    let backend = CheckpointBackend {
        checkpoint: checkpoint.plain(),
    };
    candle_nn::VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
}

/// A candle backend for tensor parallelism over an opened checkpoint: each
/// tensor asked for with a [`Shard`](https://docs.rs/candle-nn/0.11/candle_nn/var_builder/struct.Shard.html) hint is
/// read as `Checkpoint::shard` reads it (only the rank's bytes); split as
/// `torch.tensor_split` does, so a dimension need not divide evenly.
#[derive(Debug, Clone)]
pub struct ShardedCheckpoint {
    inner: CheckpointBackend,
}

impl candle_nn::var_builder::Backend for ShardedCheckpoint {
    type Hints = candle_nn::var_builder::Shard;

    fn get(
        &self,
        shape: Shape,
        name: &str,
        shard: Self::Hints,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        if shard.world_size <= 1 {
            return check_shape(name, shape, self.inner.load(name, dtype, device)?);
        }
        let part = self
            .inner
            .checkpoint
            .shard(name, shard.dim, shard.rank, shard.world_size)
            .map_err(candle_core::Error::wrap)?;
        check_shape(name, shape, part.to_candle_as(dtype, device)?)
    }

    fn get_unchecked(
        &self,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        self.inner.load(name, dtype, device)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.checkpoint.get(name).is_some()
    }
}

/// A `VarBuilder` over a checkpoint already opened whose hints are the
/// rank's [`Shard`](https://docs.rs/candle-nn/0.11/candle_nn/var_builder/struct.Shard.html):
/// each tensor asked for with one is read as `Checkpoint::shard` reads it.
///
/// ```no_run
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device};
///
/// let checkpoint =
///     safeload::Checkpoint::open("path/to/checkpoint").map_err(candle_core::Error::wrap)?;
/// let vb = safeload::candle::sharded_var_builder_from(checkpoint, DType::BF16, &Device::Cpu);
/// # Ok(()) }
/// ```
pub fn sharded_var_builder_from<X>(
    checkpoint: Checkpoint<X>,
    dtype: DType,
    device: &Device,
) -> candle_nn::var_builder::VarBuilderArgs<'static, ShardedCheckpoint> {
    let backend = ShardedCheckpoint {
        inner: CheckpointBackend {
            checkpoint: checkpoint.plain(),
        },
    };
    candle_nn::var_builder::VarBuilderArgs::new_with_args(backend, dtype, device)
}
