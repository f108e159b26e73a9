//! candle `VarBuilder`s over an opened checkpoint: a lazy backend that reads each tensor when the model asks for it, and a sharded one that reads only a rank's part.

use std::path::Path;

use candle_core::{DType, Device, Shape};
use safeload_core::extras::Extras;
use safeload_core::{Checkpoint, Dtype, TensorInfo};

use crate::tensor::{ToCandle, candle_dtype};

/// A candle `VarBuilder` backend over an opened checkpoint: each tensor is
/// read when the model asks for it (a view of the map where the file is
/// mapped, positional reads straight into candle's storage where it is
/// not), so a buffered load holds one copy, candle's.
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
        if !mapped && candle_dtype(info.dtype()) == Some(dtype) {
            if let Some(tensor) = read_straight(&self.checkpoint, info, dtype, device)? {
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

/// Reads the tensor of `info` into a vector of candle's element type, taken
/// as candle's storage without a copy; `None` for the dtypes that need a
/// mapping.
fn read_straight(
    checkpoint: &Checkpoint,
    info: &TensorInfo,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<Option<candle_core::Tensor>> {
    fn read<T: bytemuck::Pod + candle_core::WithDType>(
        checkpoint: &Checkpoint,
        info: &TensorInfo,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let mut out = vec![T::zeroed(); info.shape().iter().product()];
        checkpoint
            .read_into(info.name(), bytemuck::cast_slice_mut(&mut out))
            .map_err(candle_core::Error::wrap)?;
        candle_core::Tensor::from_vec(out, info.shape(), device)
    }
    if matches!(
        info.dtype(),
        Dtype::BOOL | Dtype::I8 | Dtype::U16 | Dtype::U64
    ) {
        return Ok(None);
    }
    Ok(Some(match dtype {
        DType::U8 => read::<u8>(checkpoint, info, device)?,
        DType::U32 => read::<u32>(checkpoint, info, device)?,
        DType::I16 => read::<i16>(checkpoint, info, device)?,
        DType::I32 => read::<i32>(checkpoint, info, device)?,
        DType::I64 => read::<i64>(checkpoint, info, device)?,
        DType::F16 => read::<half::f16>(checkpoint, info, device)?,
        DType::BF16 => read::<half::bf16>(checkpoint, info, device)?,
        DType::F32 => read::<f32>(checkpoint, info, device)?,
        DType::F64 => read::<f64>(checkpoint, info, device)?,
        _ => return Ok(None),
    }))
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
/// of the `Loader` that opened it
/// (`Loader::new().disable_mmap(true).open(path)` reads every tensor with
/// positional reads, for instance).
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
