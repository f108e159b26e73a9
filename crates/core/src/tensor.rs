//! `Tensor`: a zero-copy view (dtype, shape, bytes) into its file's shared storage, with typed access and conversion.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use half::{bf16, f16, slice::HalfFloatSliceExt};
use safetensors::Dtype;

use crate::error::Operation;
use crate::error::{Error, ErrorKind, Result};
use crate::storage::Storage;

/// One tensor of a loaded checkpoint: an [`Arc`] of its file's storage (a map or a buffer) and
/// a byte range, so cloning is cheap and the bytes outlive the [`StateDict`](crate::StateDict).
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// let sd = safeload::load_state_dict(&path, None)?;
/// let w = sd.get("w").unwrap().clone();
/// drop(sd);                                      // the tensor keeps its bytes alive
/// assert_eq!(w.shape(), [2, 3]);
/// let values: &[f32] = w.as_slice()?;            // zero-copy, checked
/// assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
/// assert_eq!(w.to_dtype(safeload::Dtype::BF16)?.nbytes(), 12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Tensor {
    name: Arc<str>,
    dtype: Dtype,
    shape: Vec<usize>,
    storage: Arc<Storage>,
    range: Range<usize>,
}

/// Element types that [`Tensor::as_slice`] can view without a copy. Sealed: the dtype check
/// depends on the exact mapping.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// let sd = safeload::load_state_dict(&path, None)?;
/// let w = sd.get("w").unwrap();
/// assert!(w.as_slice::<f32>().is_ok());
/// assert!(w.as_slice::<half::bf16>().is_err());  // the dtype is checked
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The safetensors dtype whose bytes this type views.
    const DTYPE: Dtype;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl sealed::Sealed for $ty {}
        impl Element for $ty {
            const DTYPE: Dtype = Dtype::$dtype;
        }
    )*};
}

element! {
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f16 => F16, bf16 => BF16, f32 => F32, f64 => F64,
}

impl Tensor {
    /// The tensor `name` of `dtype` and `shape` at `range` of `storage`: the one way a tensor is
    /// made, where its range is checked against what `dtype` and `shape` need.
    pub(crate) fn new(
        name: Arc<str>,
        dtype: Dtype,
        shape: Vec<usize>,
        storage: Arc<Storage>,
        range: Range<usize>,
    ) -> Result<Tensor> {
        let needed = crate::format::byte_len(dtype, &shape);
        let within = range.start <= range.end && range.end <= storage.bytes().len();
        if needed != Some(range.len() as u64) || !within {
            return Err(Error::new(
                ErrorKind::LengthMismatch {
                    tensor: Some(name.to_string()),
                    expected: needed.unwrap_or(u64::MAX),
                    actual: if within {
                        range.len() as u64
                    } else {
                        storage.bytes().len().saturating_sub(range.start) as u64
                    },
                },
                storage.path(),
            ));
        }
        Ok(Tensor {
            name,
            dtype,
            shape,
            storage,
            range,
        })
    }

    /// The tensor's name in the checkpoint.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The element type, as the header gives it.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// The shape; empty for a 0-dimensional scalar.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The number of elements (the product of the shape; 1 for a scalar).
    pub fn num_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// The tensor's bytes, little-endian, row-major, exactly as in the file.
    pub fn as_bytes(&self) -> &[u8] {
        self.storage.bytes().get(self.range.clone()).unwrap_or(&[])
    }

    /// The number of bytes of the tensor's data, a `u64` as every byte count of the crate.
    pub fn nbytes(&self) -> u64 {
        self.range.len() as u64
    }

    /// Whether its dtype is a floating-point type.
    pub fn is_float(&self) -> bool {
        crate::format::is_float(self.dtype)
    }

    /// Whether the tensor's bytes are aligned for its dtype, so that [`as_slice`](Self::as_slice)
    /// can view them (always for buffered loads).
    pub fn is_aligned(&self) -> bool {
        let align = crate::format::header::dtype_align(self.dtype) as usize;
        self.as_bytes().as_ptr() as usize % align == 0
    }

    /// A zero-copy typed view of the tensor: [`ErrorKind::DtypeMismatch`] or
    /// [`ErrorKind::Misaligned`] where it cannot be had.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let sd = safeload::load_state_dict(&path, None)?;
    /// let w: &[f32] = sd.get("w").unwrap().as_slice()?;
    /// assert_eq!(w, [1.5, -2.0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if self.dtype != T::DTYPE {
            return Err(self.error(ErrorKind::DtypeMismatch {
                tensor: self.name.to_string(),
                actual: self.dtype,
                requested: std::any::type_name::<T>(),
            }));
        }
        let bytes = self.as_bytes();
        if bytes.is_empty() {
            // No pointer is formed for an empty tensor.
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(bytes).map_err(|_| {
            self.error(ErrorKind::Misaligned {
                tensor: self.name.to_string(),
                align: std::mem::align_of::<T>(),
            })
        })
    }

    /// The elements converted to `f32`, for `F16`, `BF16`, `F32` and `F64` (rounded to nearest);
    /// unaligned bytes too.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let bytes = self.as_bytes();
        match self.dtype {
            Dtype::F32 => Ok(match bytemuck::try_cast_slice::<u8, f32>(bytes) {
                Ok(slice) => slice.to_vec(),
                Err(_) => decode(bytes, f32::from_le_bytes),
            }),
            Dtype::F64 => Ok(decode(bytes, |b| f64::from_le_bytes(b) as f32)),
            Dtype::F16 => Ok(convert_half::<f16>(bytes, |b| {
                f16::from_le_bytes(b).to_f32()
            })),
            Dtype::BF16 => Ok(convert_half::<bf16>(bytes, |b| {
                bf16::from_le_bytes(b).to_f32()
            })),
            actual => Err(self.error(ErrorKind::DtypeMismatch {
                tensor: self.name.to_string(),
                actual,
                requested: "f32 (from F16, BF16, F32 or F64)",
            })),
        }
    }

    /// The tensor converted to `dtype`, into an allocation of its own, with the rules of
    /// `Loader::dtype`. The same dtype is a clone (no copy).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = [1.5f32, -0.25].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// let sd = safeload::load_state_dict(&path, None)?;
    /// let bf16 = sd.get("w").unwrap().to_dtype(safeload::Dtype::BF16)?;
    /// assert_eq!(bf16.as_slice::<half::bf16>()?, [half::bf16::from_f32(1.5), half::bf16::from_f32(-0.25)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::UnsupportedConversion`] for a pair `convert` does not
    /// handle (an integer tensor to a float, a float to F64, ...).
    pub fn to_dtype(&self, dtype: Dtype) -> Result<Tensor> {
        if self.dtype == dtype {
            return Ok(self.clone());
        }
        let unsupported = || {
            self.error(ErrorKind::UnsupportedConversion {
                tensor: Some(self.name.to_string()),
                from: self.dtype,
                to: dtype,
            })
        };
        if !crate::convert::is_supported(self.dtype, dtype) {
            return Err(unsupported());
        }
        let len = self
            .num_elements()
            .checked_mul(dtype.bitsize() / 8)
            .ok_or_else(unsupported)?;
        let mut buffer = crate::storage::Buffer::new(len)
            .map_err(|e| Error::io(Operation::Allocate, self.storage.path(), None, e))?;
        let dst = buffer.bytes_mut();
        crate::convert::convert(self.dtype, dtype, self.as_bytes(), dst).map_err(|e| {
            // Only a tensor whose bytes disagree with its shape lands here: name it.
            let mut kind = e.kind().clone();
            if let ErrorKind::LengthMismatch { tensor, .. } = &mut kind {
                *tensor = Some(self.name.to_string());
            }
            self.error(kind)
        })?;
        let path = self.storage.path();
        let storage = buffer
            .seal(path.to_path_buf(), None)
            .map_err(|e| Error::io(Operation::Seal, path, None, e))?;
        Tensor::new(
            Arc::clone(&self.name),
            dtype,
            self.shape.clone(),
            Arc::new(storage),
            0..len,
        )
    }

    fn error(&self, kind: ErrorKind) -> Error {
        Error::new(kind, self.storage.path())
    }
}

/// Converts little-endian half floats to `f32`: in one vectorized pass when aligned, by `one`
/// element at a time otherwise.
fn convert_half<H: bytemuck::Pod>(bytes: &[u8], one: impl Fn([u8; 2]) -> f32) -> Vec<f32>
where
    [H]: HalfFloatSliceExt,
{
    match bytemuck::try_cast_slice::<u8, H>(bytes) {
        Ok(halves) => {
            let mut out = vec![0f32; halves.len()];
            halves.convert_to_f32_slice(&mut out);
            out
        }
        Err(_) => decode(bytes, one),
    }
}

fn decode<const N: usize>(bytes: &[u8], f: impl Fn([u8; N]) -> f32) -> Vec<f32> {
    bytes
        .chunks_exact(N)
        .filter_map(|chunk| <[u8; N]>::try_from(chunk).ok())
        .map(f)
        .collect()
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.range.len())
            .finish()
    }
}

/// Two tensors are equal when their names, dtypes, shapes and bytes are.
impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.name == other.name
            && self.dtype == other.dtype
            && self.shape == other.shape
            && self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Tensor {}
