//! Tensors and state dicts as candle tensors: the traits [`ToCandle`] and [`IntoCandle`], the dtype mapping of the crate's table, and safeload's conversion straight into candle's storage.

use std::collections::HashMap;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor as CandleTensor};
use safeload_core::{Dtype, StateDict, Tensor};

/// One tensor of safeload's as a candle tensor: implemented for
/// `safeload::Tensor`.
///
/// # Dtypes
///
/// | safeload | candle |
/// |---|---|
/// | `U8`, `U32`, `I16`, `I32`, `I64`, `F16`, `BF16`, `F32`, `F64`, `F8_E4M3`, `F8_E8M0`, `F4`, `F6_E2M3`, `F6_E3M2` | the same |
/// | `BOOL` | `U8` (0 or 1) |
/// | `I8` | `I16` (widened, exact) |
/// | `U16` | `U32` (widened, exact) |
/// | `U64` | `I64` where every value fits, else an error |
/// | `F8_E5M2`, the FNUZ F8 types, `C64` | an error naming the tensor; ask for a float dtype with [`to_candle_as`](ToCandle::to_candle_as) to convert them |
///
/// A float tensor asked for as F32, F16 or BF16 is converted by safeload's
/// own conversion (round to nearest even, as `Loader::dtype`) straight into
/// candle's storage. The lazy `VarBuilder`s map dtypes the same way.
pub trait ToCandle {
    /// This tensor as a candle tensor on `device`, in the candle dtype of
    /// its own (the [table](ToCandle#dtypes)).
    ///
    /// # Errors
    ///
    /// A dtype candle cannot hold, or candle's own error on `device`.
    fn to_candle(&self, device: &Device) -> candle_core::Result<CandleTensor>;

    /// This tensor as a candle tensor of `dtype` on `device`: safeload's
    /// conversion where it converts, else [`to_candle`](Self::to_candle) then
    /// candle's `to_dtype`.
    ///
    /// # Errors
    ///
    /// As [`to_candle`](Self::to_candle), or candle's own conversion error.
    fn to_candle_as(&self, dtype: DType, device: &Device) -> candle_core::Result<CandleTensor>;
}

/// A set of loaded tensors turned, whole, into candle tensors by name:
/// implemented for `safeload::StateDict` and (feature `cuda`) for a load to
/// a GPU, `DeviceTensors<Cuda>`.
pub trait IntoCandle {
    /// Every tensor as a candle tensor on `device`, by name.
    ///
    /// # Errors
    ///
    /// The first tensor that cannot be handed over, or candle's own error.
    fn into_candle(
        self,
        device: &Device,
    ) -> candle_core::Result<HashMap<String, candle_core::Tensor>>;
}

/// The candle dtype a safeload dtype loads as (the table on [`ToCandle`]); `None`
/// for the dtypes candle has no room for.
pub(crate) fn candle_dtype(dtype: Dtype) -> Option<DType> {
    Some(match dtype {
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
        _ => return None,
    })
}

/// An error of safeload's about `tensor`, as candle's, naming it.
fn name_error(tensor: &Tensor, error: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::msg(format!("tensor {:?}: {error}", tensor.name()))
}

impl ToCandle for Tensor {
    fn to_candle(&self, device: &Device) -> candle_core::Result<CandleTensor> {
        let Some(dtype) = candle_dtype(self.dtype()) else {
            let error = format!(
                "candle has no dtype for {} (ask for a float dtype with to_candle_as)",
                self.dtype()
            );
            return Err(name_error(self, error));
        };
        let (bytes, shape) = (self.as_bytes(), self.shape());
        match self.dtype() {
            Dtype::BOOL => {
                let bytes: Vec<u8> = bytes.iter().map(|&b| u8::from(b != 0)).collect();
                candle_core::Tensor::from_vec(bytes, shape, device)
            }
            Dtype::I8 => {
                let wide: Vec<i16> = bytes.iter().map(|&b| i16::from(b as i8)).collect();
                candle_core::Tensor::from_vec(wide, shape, device)
            }
            Dtype::U16 => {
                let pairs = bytes
                    .chunks_exact(2)
                    .filter_map(|c| <[u8; 2]>::try_from(c).ok());
                let wide: Vec<u32> = pairs.map(|c| u32::from(u16::from_le_bytes(c))).collect();
                candle_core::Tensor::from_vec(wide, shape, device)
            }
            Dtype::U64 => {
                let words = bytes.chunks_exact(8);
                let narrow = words
                    .filter_map(|c| <[u8; 8]>::try_from(c).ok())
                    .map(|word| {
                        let value = u64::from_le_bytes(word);
                        i64::try_from(value).map_err(|_| {
                            name_error(self, format!("U64 value {value} does not fit candle's I64"))
                        })
                    });
                candle_core::Tensor::from_vec(narrow.collect::<Result<Vec<_>, _>>()?, shape, device)
            }
            _ => candle_core::Tensor::from_raw_buffer(bytes, dtype, shape, device),
        }
    }

    fn to_candle_as(&self, dtype: DType, device: &Device) -> candle_core::Result<CandleTensor> {
        // The float dtypes safeload's conversion writes.
        let floats = [Dtype::F32, Dtype::F16, Dtype::BF16];
        if let Some(to) = floats.into_iter().find(|&d| candle_dtype(d) == Some(dtype)) {
            let converts = safeload_core::policy::converts_to(self.dtype(), to).is_some();
            let convert = |out: &mut [u8]| {
                safeload_core::convert::convert(self.dtype(), to, self.as_bytes(), out)
                    .map(drop)
                    .map_err(|e| name_error(self, e))
            };
            if self.dtype() != to && converts {
                if let Some(tensor) = filled(dtype, self.shape(), device, convert)? {
                    return Ok(tensor);
                }
            }
        }
        let tensor = self.to_candle(device)?;
        if tensor.dtype() == dtype {
            Ok(tensor)
        } else {
            tensor.to_dtype(dtype)
        }
    }
}

/// A candle tensor of `dtype` whose storage, a vector of candle's element
/// type, `fill` writes as bytes (taken without a copy); `None` for the dtypes
/// candle has no vector of.
pub(crate) fn filled(
    dtype: DType,
    shape: &[usize],
    device: &Device,
    fill: impl FnOnce(&mut [u8]) -> candle_core::Result<()>,
) -> candle_core::Result<Option<candle_core::Tensor>> {
    fn make<T: bytemuck::Pod + candle_core::WithDType>(
        shape: &[usize],
        device: &Device,
        fill: impl FnOnce(&mut [u8]) -> candle_core::Result<()>,
    ) -> candle_core::Result<candle_core::Tensor> {
        let mut out = vec![T::zeroed(); shape.iter().product()];
        fill(bytemuck::cast_slice_mut(&mut out))?;
        candle_core::Tensor::from_vec(out, shape, device)
    }
    Ok(Some(match dtype {
        DType::U8 => make::<u8>(shape, device, fill)?,
        DType::U32 => make::<u32>(shape, device, fill)?,
        DType::I16 => make::<i16>(shape, device, fill)?,
        DType::I32 => make::<i32>(shape, device, fill)?,
        DType::I64 => make::<i64>(shape, device, fill)?,
        DType::F16 => make::<half::f16>(shape, device, fill)?,
        DType::BF16 => make::<half::bf16>(shape, device, fill)?,
        DType::F32 => make::<f32>(shape, device, fill)?,
        DType::F64 => make::<f64>(shape, device, fill)?,
        _ => return Ok(None),
    }))
}

impl IntoCandle for StateDict {
    /// Every tensor in its own candle dtype, converted in parallel; each
    /// file's storage is freed with its last tensor (never two copies held).
    fn into_candle(
        self,
        device: &Device,
    ) -> candle_core::Result<HashMap<String, candle_core::Tensor>> {
        let tensors: Vec<Mutex<Option<Tensor>>> = self
            .into_tensors()
            .into_iter()
            .map(|t| Mutex::new(Some(t)))
            .collect();
        let (converted, _) = safeload_core::workers::map(
            &tensors,
            safeload_core::workers::default_width(),
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
        .map_err(candle_core::Error::wrap)?;
        converted.into_iter().flatten().collect()
    }
}
