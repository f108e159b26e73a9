//! The `cuda` feature (the facade's `candle-cuda`): a load to a GPU as candle tensors on `Device::Cuda`, views of each file's slab where candle allows it, and a `VarBuilder` over them.
//!
//! ```no_run
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device};
//! use safeload::device::LoadToDevice;
//!
//! let device = Device::new_cuda(0)?;
//! // The load's copies run on candle's own stream, through the staging ring.
//! let vb = safeload::candle::cuda::var_builder("path/to/checkpoint", DType::BF16, &device)?;
//! let proj = candle_nn::linear(1024, 1024, vb.pp("model.layers.0.mlp.up_proj"))?;
//!
//! // Loader options, a rank's part, the report: load first, then hand the tensors over.
//! let gpu = safeload::candle::cuda::device(&device)?;
//! let loaded = safeload::Loader::new()
//!     .dtype(safeload::Dtype::BF16) // converted in the staging buffers
//!     .load_to_device("path/to/checkpoint", &gpu)
//!     .map_err(candle_core::Error::wrap)?;
//! eprintln!("{}", loaded.report());
//! let vb = safeload::candle::cuda::var_builder_from(loaded, DType::BF16, &device)?;
//! # Ok(()) }
//! ```
//!
//! # What is copied
//!
//! candle's CUDA storage owns one allocation of one dtype, while a load
//! places each file's tensors in one slab. So, per file, the tensors of the
//! dtype that holds most of its bytes become views of the slab itself (no
//! copy: the slab's memory becomes that storage, freed with the last of
//! them); a tensor of another dtype in the same file (a norm in F32 beside
//! BF16 weights, an I64 buffer) is copied, device to device, into memory of
//! its own, and its bytes in the slab stay unused while the slab lives.
//! Loading with `Loader::dtype` makes a file's floating tensors one
//! dtype. Where something else still holds a tensor of the file (a clone of
//! a [`DeviceTensor`]), its slab cannot be handed over, and every tensor of
//! it is copied.
//!
//! A tensor's dtype must be one candle holds with the same bytes: `BOOL` (as
//! `U8`), `U8`, `U32`, `I16`, `I32`, `I64`, `F16`, `BF16`, `F32`, `F64`.
//! The others are an error naming the tensor: convert them on the way
//! (`Loader::dtype`, for floats), or load them on the host
//! (`safeload::candle::var_builder`, which widens `I8`, `U16`, `U64`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::cuda::cudarc::driver::CudaSlice;
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{DType, Device, Storage, Tensor};
use safeload_core::Dtype;
use safeload_core::Loader;
use safeload_core::extras::Extras;
use safeload_device::{Cuda, CudaSlab, DeviceTensor, DeviceTensors, LoadToDevice};

use crate::tensor::IntoCandle;

/// The device a load for candle's `device` goes to: safeload's [`Cuda`] on
/// candle's own stream. No stream of its own: a second stream would turn on
/// cudarc's event tracking for every candle tensor after it. The load
/// returns once every copy is complete, so candle's work after it sees
/// every byte.
///
/// # Errors
///
/// candle's, where `device` is not a CUDA device.
pub fn device(device: &Device) -> candle_core::Result<Cuda> {
    Ok(Cuda::new(device.as_cuda_device()?.cuda_stream()))
}

/// A candle `VarBuilder` over the checkpoint at `path`, loaded into
/// `device`'s memory (`Loader::load_to_device` with the default options,
/// on candle's stream) and handed over as [`IntoCandle::into_candle`]
/// does.
///
/// # Errors
///
/// As [`device`], `Loader::load_to_device` (wrapped in candle's error)
/// and [`IntoCandle::into_candle`] of `DeviceTensors<Cuda>`.
///
/// `X` is what the checkpoint is read with beyond local paths (the facade's
/// `safeload::candle::cuda::var_builder` names its own).
pub fn var_builder<X: Extras + Default + 'static>(
    path: impl AsRef<Path>,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
    let loaded = Loader::<X>::new()
        .load_to_device(path, &self::device(device)?)
        .map_err(candle_core::Error::wrap)?;
    var_builder_from(loaded, dtype, device)
}

/// A candle `VarBuilder` over tensors a load placed on `device` (on a
/// [`Cuda`] of `device`'s GPU; [`device`] gives the one on candle's
/// stream). A tensor asked for in another dtype than its own is converted
/// by candle, on the GPU; `Loader::dtype` converts in the staging buffers
/// instead. A rank's part (`Checkpoint::to_device_parts`) is asked for by
/// its own shape, with no hint.
///
/// # Errors
///
/// As [`IntoCandle::into_candle`] of `DeviceTensors<Cuda>`.
pub fn var_builder_from(
    loaded: DeviceTensors<Cuda>,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<candle_nn::VarBuilder<'static>> {
    let tensors = loaded.into_candle(device)?;
    Ok(candle_nn::VarBuilder::from_tensors(tensors, dtype, device))
}

impl IntoCandle for DeviceTensors<Cuda> {
    /// Every tensor as a candle tensor on `device` (the GPU they were loaded
    /// on), by name: per file, the tensors of the dtype holding most of its
    /// bytes are views of its slab, the others copies on the GPU (the module
    /// `safeload::candle::cuda` says when). Read the report
    /// (`DeviceTensors::report`) first: it is dropped.
    ///
    /// # Errors
    ///
    /// A tensor of a dtype candle does not hold with the same bytes; tensors
    /// on another GPU than `device`'s; the driver's, where a copy fails.
    fn into_candle(self, device: &Device) -> candle_core::Result<HashMap<String, Tensor>> {
        let gpu = device.as_cuda_device()?;
        let (tensors, _) = self.into_parts();
        let mut out = HashMap::with_capacity(tensors.len());
        for file in by_slab(tensors) {
            file_into_candle(file, gpu, &mut out)?;
        }
        Ok(out)
    }
}

/// The tensors grouped by the slab (the file) that holds them, in order.
fn by_slab(tensors: Vec<DeviceTensor<Cuda>>) -> Vec<Vec<DeviceTensor<Cuda>>> {
    let mut files: Vec<Vec<DeviceTensor<Cuda>>> = Vec::new();
    for tensor in tensors {
        // A file's tensors come together, so the last group is the one.
        let group = files.iter_mut().rev().find(|g| {
            g.first()
                .is_some_and(|t| Arc::ptr_eq(t.slab(), tensor.slab()))
        });
        match group {
            Some(group) => group.push(tensor),
            None => files.push(vec![tensor]),
        }
    }
    files
}

/// A tensor's place in its slab, once the tensor itself is let go of.
struct View {
    name: String,
    shape: Vec<usize>,
    offset: usize,
    nbytes: usize,
}

/// One file's tensors into `out`: its main dtype's as views of the slab
/// (copies where the slab cannot be taken), the others copied.
fn file_into_candle(
    file: Vec<DeviceTensor<Cuda>>,
    gpu: &CudaDevice,
    out: &mut HashMap<String, Tensor>,
) -> candle_core::Result<()> {
    let Some(slab) = file.first().map(|t| Arc::clone(t.slab())) else {
        return Ok(());
    };
    let (slab_gpu, own_gpu) = (
        slab.memory().ordinal(),
        gpu.cuda_stream().context().ordinal(),
    );
    if slab_gpu != own_gpu {
        return Err(candle_core::Error::msg(format!(
            "tensors loaded on CUDA device {slab_gpu} handed to candle's device {own_gpu}"
        )));
    }
    let dtypes = file
        .iter()
        .map(candle_dtype)
        .collect::<candle_core::Result<Vec<_>>>()?;
    let main = main_dtype(&file, &dtypes);
    let mut views = Vec::new();
    for (tensor, dtype) in file.into_iter().zip(dtypes) {
        let view = View {
            name: tensor.name().to_string(),
            shape: tensor.shape().to_vec(),
            offset: tensor.offset(),
            nbytes: tensor.nbytes(),
        };
        // Let go of here: the slab is taken below once no tensor holds it.
        drop(tensor);
        if dtype == main && view.offset % dtype.size_in_bytes() == 0 {
            views.push(view);
        } else {
            let copy = copy_out(&slab, &view, dtype, gpu)?;
            out.insert(view.name, copy);
        }
    }
    // Every tensor of the file is let go of: the slab is ours, unless a
    // clone of one of them is held elsewhere.
    let slab = match Arc::try_unwrap(slab) {
        Ok(slab) => slab,
        Err(shared) => {
            for view in views {
                let copy = copy_out(&shared, &view, main, gpu)?;
                out.insert(view.name, copy);
            }
            return Ok(());
        }
    };
    let memory = slab.into_memory();
    let elements = memory.len() / main.size_in_bytes();
    let whole = Tensor::from_storage(
        Storage::Cuda(storage(memory, main, gpu)?),
        elements,
        BackpropOp::none(),
        false,
    );
    for view in views {
        let size = main.size_in_bytes();
        let tensor = whole
            .narrow(0, view.offset / size, view.nbytes / size)?
            .reshape(view.shape)?;
        out.insert(view.name, tensor);
    }
    Ok(())
}

/// The dtype holding most of a file's bytes (the first, on a tie).
fn main_dtype(file: &[DeviceTensor<Cuda>], dtypes: &[DType]) -> DType {
    let mut bytes: Vec<(DType, usize)> = Vec::new();
    for (tensor, &dtype) in file.iter().zip(dtypes) {
        match bytes.iter_mut().find(|(d, _)| *d == dtype) {
            Some((_, n)) => *n += tensor.nbytes(),
            None => bytes.push((dtype, tensor.nbytes())),
        }
    }
    let mut main: Option<(DType, usize)> = None;
    for (dtype, n) in bytes {
        if main.is_none_or(|(_, most)| n > most) {
            main = Some((dtype, n));
        }
    }
    main.map_or(DType::U8, |(dtype, _)| dtype)
}

/// The candle dtype whose bytes are the tensor's as they lie on the device.
fn candle_dtype(tensor: &DeviceTensor<Cuda>) -> candle_core::Result<DType> {
    Ok(match tensor.dtype() {
        // A BOOL is one byte, 0 or 1: candle's U8, as on the host.
        Dtype::BOOL | Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        other => {
            return Err(candle_core::Error::msg(format!(
                "tensor {:?}: {other:?} on the GPU has no candle dtype with the same bytes \
                 (convert it with Loader::dtype, or load it on the host)",
                tensor.name()
            )));
        }
    })
}

/// A view's bytes copied, on the GPU, into memory of its own, as a tensor.
fn copy_out(
    slab: &CudaSlab,
    view: &View,
    dtype: DType,
    gpu: &CudaDevice,
) -> candle_core::Result<Tensor> {
    let device = Device::Cuda(gpu.clone());
    if view.nbytes == 0 {
        return Tensor::zeros(view.shape.as_slice(), dtype, &device);
    }
    let bytes = {
        let memory = slab.memory();
        let end = view.offset.checked_add(view.nbytes);
        let Some(part) = end.and_then(|end| memory.try_slice(view.offset..end)) else {
            return Err(candle_core::Error::msg(format!(
                "tensor {:?} lies past the end of its slab",
                view.name
            )));
        };
        gpu.cuda_stream()
            .clone_dtod(&part)
            .map_err(candle_core::Error::wrap)?
    };
    Ok(Tensor::from_storage(
        Storage::Cuda(storage(bytes, dtype, gpu)?),
        view.shape.as_slice(),
        BackpropOp::none(),
        false,
    ))
}

/// Device memory of this context as candle's storage of `dtype`, owning
/// it from here on (no copy).
fn storage(
    bytes: CudaSlice<u8>,
    dtype: DType,
    gpu: &CudaDevice,
) -> candle_core::Result<CudaStorage> {
    fn typed<T: CudaDType>(bytes: CudaSlice<u8>, gpu: &CudaDevice) -> CudaStorage {
        let len = bytes.len() / std::mem::size_of::<T>();
        let stream = gpu.cuda_stream();
        let address = bytes.leak();
        // SAFETY: `address` starts an allocation of this GPU's context (the
        // caller checked the ordinal; a slab, or a copy out of one) of at
        // least `len * size_of::<T>()` bytes, whose copies have completed
        // (a load returns once every copy has); `leak` gave it up without
        // freeing it, so the new slice is its one owner and frees it. Every
        // bit pattern is a valid `T` (integers, IEEE floats).
        let typed = unsafe { stream.upgrade_device_ptr::<T>(address, len) };
        CudaStorage::wrap_cuda_slice(typed, gpu.clone())
    }
    Ok(match dtype {
        DType::U8 => CudaStorage::wrap_cuda_slice(bytes, gpu.clone()),
        DType::U32 => typed::<u32>(bytes, gpu),
        DType::I16 => typed::<i16>(bytes, gpu),
        DType::I32 => typed::<i32>(bytes, gpu),
        DType::I64 => typed::<i64>(bytes, gpu),
        DType::F16 => typed::<half::f16>(bytes, gpu),
        DType::BF16 => typed::<half::bf16>(bytes, gpu),
        DType::F32 => typed::<f32>(bytes, gpu),
        DType::F64 => typed::<f64>(bytes, gpu),
        other => {
            return Err(candle_core::Error::msg(format!(
                "no CUDA storage of {other:?} here"
            )));
        }
    })
}
