//! Weights straight into device memory: the `Device` seam (a slab of device memory per file, staging buffers, asynchronous copies and their completion) and its contract, the staging ring the core's readers fill, the tensors and report a load to a device hands out, and the devices (a CPU stand-in; CUDA with the feature `cuda`). `safeload::device` re-exports it.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod load;
mod pipeline;
mod plan;
mod report;
mod ring;
mod tensors;

use std::path::Path;

use safeload_core::{Checkpoint, Loader, Result, TensorInfo};

pub use cpu::{StandIn, StandInCopy, StandInSlab, StandInStaging};
#[cfg(feature = "cuda")]
pub use cuda::{Cuda, CudaCopy, CudaSlab, CudaStaging};
pub use device::{Device, STAGING_BUFFERS, STAGING_BYTES};
pub use report::{DeviceFileReport, DeviceReport, Route};
pub use safeload_core::dest::device::Part;
pub use tensors::{DeviceTensor, DeviceTensors};

/// A checkpoint's tensors placed in a device's memory: `use safeload::device::ToDevice;`
/// adds these to `Checkpoint`.
pub trait ToDevice {
    /// Places every tensor in `device`'s memory: one slab per file, each
    /// tensor a view of it (at a multiple of the device's alignment), with
    /// no copy of the checkpoint in host memory.
    ///
    /// The readers fill the staging ring (`Loader::staging`: by default 4
    /// buffers of 32 MiB, pinned memory on a GPU) and the device copies
    /// each filled buffer while the next fill: host memory is the ring,
    /// whatever the checkpoint's size. A file read with positional reads
    /// (FUSE, a network mount, direct I/O, a remote object, a cache) is
    /// read straight into the ring; a mapped one is copied from its map,
    /// its pages let go of as they are copied. With `Loader::dtype`,
    /// floating tensors are converted in the staging buffers; the options'
    /// filter leaves tensors out. The report says, per file, how its bytes
    /// went, in how many copies, how fast ([`DeviceTensors::report`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = (0..48u8).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4, 6], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// use safeload::device::{StandIn, ToDevice}; // with the feature `cuda`: device::Cuda::new(stream)
    ///
    /// let device = StandIn::new();
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// let on_device = ck.to_device(&device)?;
    /// let w = on_device.get("w").unwrap();
    /// assert_eq!((w.dtype(), w.shape(), w.nbytes()), (safeload::Dtype::BF16, &[4, 6][..], 48));
    /// let _pointer: u64 = w.device_ptr(); // what an engine's kernels take
    /// assert_eq!(w.to_host().unwrap(), data);
    /// eprintln!("{}", on_device.report());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// A read's error, naming the file and offset; the device's, where it
    /// cannot allocate or a copy fails, naming the file;
    /// [`ErrorKind::Cancelled`](safeload_core::ErrorKind::Cancelled) where
    /// the loader's `cancel_on` flag is set during the load. Whatever the error, every copy in flight has
    /// completed or failed before it returns, and every slab and staging
    /// buffer is dropped.
    fn to_device<D: Device>(&self, device: &D) -> Result<DeviceTensors<D>> {
        self.to_device_parts(device, |_| Part::Whole)
    }

    /// [`to_device`](Self::to_device), with the part of each tensor that
    /// `part` names: whole, a tensor-parallel rank's part or a slice (cut as
    /// `Checkpoint::shard` and `read_slice` cut them; only those bytes are
    /// read and copied), or none.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = (0..35u8).collect();
    /// # let views = [("w", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![5, 7], &data)?),
    /// #              ("norm", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![7], &data[..7])?)];
    /// # safetensors::serialize_to_file(views, None, &path)?;
    /// use safeload::device::{Part, StandIn, ToDevice};
    ///
    /// let (rank, world) = (1, 2);
    /// let device = StandIn::new();
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// let mine = ck.to_device_parts(&device, |info| match info.shape() {
    ///     [_, _] => Part::Shard { dim: 1, rank, world }, // column-parallel
    ///     _ => Part::Whole,                              // replicated
    /// })?;
    /// let w = mine.get("w").unwrap();
    /// assert_eq!(w.shape(), [5, 3]); // columns 4..7 of each row
    /// assert_eq!(w.to_host().unwrap()[..3], [4, 5, 6]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`to_device`](Self::to_device), and as `Checkpoint::shard` and
    /// `read_slice` for a part they refuse.
    fn to_device_parts<D: Device>(
        &self,
        device: &D,
        part: impl Fn(&TensorInfo) -> Part,
    ) -> Result<DeviceTensors<D>>;
}

impl<X> ToDevice for Checkpoint<X> {
    fn to_device_parts<D: Device>(
        &self,
        device: &D,
        part: impl Fn(&TensorInfo) -> Part,
    ) -> Result<DeviceTensors<D>> {
        self.device_load(&part, |load| load::to_device(device, load))
    }
}

/// A checkpoint loaded into a device's memory: `use safeload::device::LoadToDevice;`
/// adds this to `Loader`.
pub trait LoadToDevice {
    /// Loads the checkpoint at `path` into `device`'s memory: opens it
    /// (`Loader::open`) and places every tensor the filter keeps
    /// ([`ToDevice::to_device`]), converted where `Loader::dtype` says,
    /// through the staging ring (`Loader::staging`); `Loader::cancel_on`
    /// stops it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// use safeload::{Dtype, Loader, device::{LoadToDevice, StandIn}};
    ///
    /// let device = StandIn::new();
    /// let on_device = Loader::new()
    ///     .dtype(Dtype::BF16)            // converted in the staging buffers
    ///     .staging(2, 8 << 20)           // two 8 MiB buffers of host memory
    ///     .load_to_device(&path, &device)?;
    /// let w = on_device.get("w").unwrap();
    /// assert_eq!((w.dtype(), w.nbytes()), (Dtype::BF16, 4));
    /// assert_eq!(on_device.report().files[0].converted, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As `Loader::open`, then as [`ToDevice::to_device`].
    fn load_to_device<D: Device>(
        &self,
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<DeviceTensors<D>>;
}

impl<X> LoadToDevice for Loader<X> {
    fn load_to_device<D: Device>(
        &self,
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<DeviceTensors<D>> {
        self.open(path)?.to_device(device)
    }
}
