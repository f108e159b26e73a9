//! The `candle` feature: safeload's tensors as `candle_core` tensors, a lazy `VarBuilder` over an opened checkpoint (and a sharded one for tensor parallelism), and the dtype mapping between the two.
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
//! // Tensor parallelism: this rank's part of each tensor, read alone.
//! let checkpoint = safeload::Checkpoint::open("path/to/checkpoint")?;
//! let vb = safeload::candle::sharded_var_builder_from(checkpoint, DType::BF16, &device);
//! let shard = candle_nn::var_builder::Shard { dim: 0, rank: 1, world_size: 8 };
//! let up = vb.get_with_hints((4096 / 8, 1024), "model.layers.0.mlp.up_proj.weight", shard)?;
//! # Ok(()) }
//! ```
//!
//! # Dtypes
//!
//! | safeload | candle |
//! |---|---|
//! | `U8`, `U32`, `I16`, `I32`, `I64`, `F16`, `BF16`, `F32`, `F64`, `F8_E4M3`, `F8_E8M0`, `F4`, `F6_E2M3`, `F6_E3M2` | the same |
//! | `BOOL` | `U8` (0 or 1) |
//! | `I8` | `I16` (widened, exact) |
//! | `U16` | `U32` (widened, exact) |
//! | `U64` | `I64` where every value fits, else an error |
//! | `F8_E5M2`, the FNUZ F8 types, `C64` | an error ([`ErrorKind::UnsupportedConversion`]); ask for a float dtype with [`to_candle_as`](crate::Tensor::to_candle_as) to convert them |
//!
//! A float tensor asked for as F32, F16 or BF16 is converted by safeload's
//! own conversion (round to nearest even, as `Loader::dtype`),
//! straight into candle's storage: one copy.

use std::sync::Mutex;

use candle_core::{DType, Device, Shape};
use safetensors::Dtype;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, ErrorKind, Result};
use crate::state_dict::StateDict;
use crate::tensor::Tensor;

#[cfg(feature = "candle-cuda")]
pub mod cuda;

/// Lets a `safeload::Error` pass through candle's `?`: it is wrapped
/// (`candle_core::Error::Wrapped`), its message intact.
impl From<Error> for candle_core::Error {
    fn from(error: Error) -> candle_core::Error {
        candle_core::Error::wrap(error)
    }
}

/// The candle dtype a safeload dtype loads as (the [table](self#dtypes));
/// [`ErrorKind::UnsupportedConversion`] for the dtypes candle has no room
/// for.
pub(crate) fn candle_dtype(dtype: Dtype) -> Result<DType> {
    Ok(match dtype {
        Dtype::BOOL | Dtype::U8 => DType::U8,
        Dtype::I8 | Dtype::I16 => DType::I16,
        Dtype::U16 | Dtype::U32 => DType::U32,
        Dtype::I32 => DType::I32,
        Dtype::I64 | Dtype::U64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::F8_E4M3 => DType::F8E4M3,
        Dtype::F8_E8M0 => DType::F8E8M0,
        Dtype::F4 => DType::F4,
        Dtype::F6_E2M3 => DType::F6E2M3,
        Dtype::F6_E3M2 => DType::F6E3M2,
        other => {
            return Err(Error::without_path(ErrorKind::UnsupportedConversion {
                tensor: None,
                from: other,
                to: other,
            }));
        }
    })
}

/// The safeload dtype of a candle float dtype that safeload converts to.
fn safeload_target(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::F32 => Some(Dtype::F32),
        DType::F16 => Some(Dtype::F16),
        DType::BF16 => Some(Dtype::BF16),
        _ => None,
    }
}

impl Tensor {
    /// This tensor as a candle tensor on `device`, in the candle dtype of
    /// its own (see the table): one copy into
    /// candle's storage.
    ///
    /// # Errors
    ///
    /// A dtype candle cannot hold, or candle's own error on `device`.
    pub fn to_candle(&self, device: &Device) -> Result<candle_core::Tensor, candle_core::Error> {
        let dtype = candle_dtype(self.dtype()).map_err(|e| self.name_error(e))?;
        let shape = self.shape();
        match self.dtype() {
            Dtype::BOOL => {
                let bytes: Vec<u8> = self.as_bytes().iter().map(|&b| u8::from(b != 0)).collect();
                candle_core::Tensor::from_vec(bytes, shape, device)
            }
            Dtype::I8 => {
                let wide: Vec<i16> = self
                    .as_bytes()
                    .iter()
                    .map(|&b| i16::from(b as i8))
                    .collect();
                candle_core::Tensor::from_vec(wide, shape, device)
            }
            Dtype::U16 => {
                let wide: Vec<u32> = self
                    .as_bytes()
                    .chunks_exact(2)
                    .filter_map(|c| <[u8; 2]>::try_from(c).ok())
                    .map(|c| u32::from(u16::from_le_bytes(c)))
                    .collect();
                candle_core::Tensor::from_vec(wide, shape, device)
            }
            Dtype::U64 => {
                let mut narrow = Vec::with_capacity(self.num_elements());
                for word in self
                    .as_bytes()
                    .chunks_exact(8)
                    .filter_map(|c| <[u8; 8]>::try_from(c).ok())
                {
                    let value = u64::from_le_bytes(word);
                    let Ok(value) = i64::try_from(value) else {
                        return Err(candle_core::Error::msg(format!(
                            "tensor {:?}: U64 value {value} does not fit candle's I64",
                            self.name()
                        )));
                    };
                    narrow.push(value);
                }
                candle_core::Tensor::from_vec(narrow, shape, device)
            }
            _ => candle_core::Tensor::from_raw_buffer(self.as_bytes(), dtype, shape, device),
        }
    }

    /// This tensor as a candle tensor of `dtype` on `device`. A float tensor
    /// asked for as F32, F16 or BF16 is converted by safeload's conversion
    /// straight into candle's storage (one copy); any other pair is
    /// [`to_candle`](Self::to_candle) then candle's `to_dtype`.
    ///
    /// # Errors
    ///
    /// As [`to_candle`](Self::to_candle), or candle's own conversion error.
    pub fn to_candle_as(
        &self,
        dtype: DType,
        device: &Device,
    ) -> Result<candle_core::Tensor, candle_core::Error> {
        if let Some(to) = safeload_target(dtype) {
            if self.dtype() != to && crate::policy::converts_to(self.dtype(), to).is_some() {
                return convert_into_candle(self, to, dtype, device);
            }
        }
        let tensor = self.to_candle(device)?;
        if tensor.dtype() == dtype {
            Ok(tensor)
        } else {
            tensor.to_dtype(dtype)
        }
    }

    fn name_error(&self, error: Error) -> candle_core::Error {
        candle_core::Error::msg(format!("tensor {:?}: {error}", self.name()))
    }
}

/// Converts `tensor` to `to` into a vector candle takes as its storage.
fn convert_into_candle(
    tensor: &Tensor,
    to: Dtype,
    dtype: DType,
    device: &Device,
) -> Result<candle_core::Tensor, candle_core::Error> {
    fn into<T: bytemuck::Pod + candle_core::WithDType>(
        tensor: &Tensor,
        to: Dtype,
        device: &Device,
    ) -> Result<candle_core::Tensor, candle_core::Error> {
        let mut out = vec![T::zeroed(); tensor.num_elements()];
        crate::convert::convert(
            tensor.dtype(),
            to,
            tensor.as_bytes(),
            bytemuck::cast_slice_mut(&mut out),
        )
        .map_err(|e| tensor.name_error(e))?;
        candle_core::Tensor::from_vec(out, tensor.shape(), device)
    }
    match dtype {
        DType::F32 => into::<f32>(tensor, to, device),
        DType::F16 => into::<half::f16>(tensor, to, device),
        _ => into::<half::bf16>(tensor, to, device),
    }
}

impl StateDict {
    /// Every tensor as a candle tensor on `device`, in its own candle dtype,
    /// converted in parallel; each file's storage is freed as its last
    /// tensor is converted, so a buffered load does not hold two copies.
    ///
    /// # Errors
    ///
    /// The first conversion that fails.
    pub fn into_candle(
        self,
        device: &Device,
    ) -> Result<std::collections::HashMap<String, candle_core::Tensor>, candle_core::Error> {
        let tensors: Vec<Mutex<Option<Tensor>>> = self
            .into_tensors()
            .into_iter()
            .map(|t| Mutex::new(Some(t)))
            .collect();
        let (converted, _) = crate::workers::map(
            &tensors,
            crate::workers::default_width(),
            "safeload-candle",
            |slot| {
                // Taken out and dropped here: the file's storage goes with
                // its last tensor.
                let tensor = slot.lock().ok().and_then(|mut s| s.take());
                let Some(tensor) = tensor else {
                    return Ok(None);
                };
                let name = tensor.name().to_string();
                let result = tensor.to_candle(device).map(|t| (name, t));
                drop(tensor);
                Ok(Some(result))
            },
        )
        .map_err(candle_core::Error::from)?;
        converted.into_iter().flatten().collect()
    }
}

/// A candle `VarBuilder` backend over an opened checkpoint: each tensor is
/// read when the model asks for it (a view of the map where the file is
/// mapped, positional reads straight into candle's storage where it is
/// not), so a buffered load holds one copy, candle's.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointBackend {
    checkpoint: Checkpoint,
}

impl CheckpointBackend {
    /// A backend over `checkpoint`.
    pub(crate) fn new(checkpoint: Checkpoint) -> CheckpointBackend {
        CheckpointBackend { checkpoint }
    }

    fn load(
        &self,
        name: &str,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let info = self.checkpoint.info(name)?;
        let file = self.checkpoint.file_of(info)?;
        // A file that is read, in its own dtype: straight into candle's
        // vector, one copy and no buffer of safeload's.
        if file.map().is_none() && candle_dtype(info.dtype()).ok() == Some(dtype) {
            if let Some(tensor) =
                read_straight(&self.checkpoint, name, dtype, info.shape(), device)?
            {
                return Ok(tensor);
            }
        }
        self.checkpoint.read(name)?.to_candle_as(dtype, device)
    }
}

/// Reads `name` into a vector of candle's element type, taken as candle's
/// storage without a copy; `None` for the dtypes that need a mapping.
fn read_straight(
    checkpoint: &Checkpoint,
    name: &str,
    dtype: DType,
    shape: &[usize],
    device: &Device,
) -> candle_core::Result<Option<candle_core::Tensor>> {
    fn read<T: bytemuck::Pod + candle_core::WithDType>(
        checkpoint: &Checkpoint,
        name: &str,
        shape: &[usize],
        device: &Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        let mut out = vec![T::zeroed(); shape.iter().product()];
        checkpoint.read_into(name, bytemuck::cast_slice_mut(&mut out))?;
        candle_core::Tensor::from_vec(out, shape, device)
    }
    let info = checkpoint.info(name)?;
    if matches!(
        info.dtype(),
        Dtype::BOOL | Dtype::I8 | Dtype::U16 | Dtype::U64
    ) {
        return Ok(None);
    }
    Ok(Some(match dtype {
        DType::U8 => read::<u8>(checkpoint, name, shape, device)?,
        DType::U32 => read::<u32>(checkpoint, name, shape, device)?,
        DType::I16 => read::<i16>(checkpoint, name, shape, device)?,
        DType::I32 => read::<i32>(checkpoint, name, shape, device)?,
        DType::I64 => read::<i64>(checkpoint, name, shape, device)?,
        DType::F16 => read::<half::f16>(checkpoint, name, shape, device)?,
        DType::BF16 => read::<half::bf16>(checkpoint, name, shape, device)?,
        DType::F32 => read::<f32>(checkpoint, name, shape, device)?,
        DType::F64 => read::<f64>(checkpoint, name, shape, device)?,
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
/// As `Checkpoint::open`.
///
/// `X` is what the checkpoint is read with beyond local paths (the facade's
/// `safeload::candle::var_builder` names its own).
pub fn var_builder<X: crate::extras::Extras + Default + 'static>(
    path: impl AsRef<std::path::Path>,
    dtype: DType,
    device: &Device,
) -> Result<candle_nn::VarBuilder<'static>> {
    Ok(var_builder_from(
        Checkpoint::<X>::open(path)?,
        dtype,
        device,
    ))
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
    candle_nn::VarBuilder::from_backend(
        Box::new(CheckpointBackend::new(checkpoint.plain())),
        dtype,
        device.clone(),
    )
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
            .shard(name, shard.dim, shard.rank, shard.world_size)?;
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
/// let checkpoint = safeload::Checkpoint::open("path/to/checkpoint")?;
/// let vb = safeload::candle::sharded_var_builder_from(checkpoint, DType::BF16, &Device::Cpu);
/// # Ok(()) }
/// ```
pub fn sharded_var_builder_from<X>(
    checkpoint: Checkpoint<X>,
    dtype: DType,
    device: &Device,
) -> candle_nn::var_builder::VarBuilderArgs<'static, ShardedCheckpoint> {
    let backend = ShardedCheckpoint {
        inner: CheckpointBackend::new(checkpoint.plain()),
    };
    candle_nn::var_builder::VarBuilderArgs::new_with_args(backend, dtype, device)
}
