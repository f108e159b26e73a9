//! Weights straight into device memory: the `Device` seam (a slab of device memory per file, staging buffers, asynchronous copies and their completion) and its contract, the staging ring the core's readers fill, the tensors and report a load to a device hands out, and the devices (a CPU stand-in; CUDA with the feature `cuda`). `safeload::device` re-exports it.
//!
//! A load to a device never holds the checkpoint in host memory: the
//! readers fill a few staging buffers (the ring) in file order, each with up
//! to one chunk of a file's tensors as they will lie in device memory, and
//! hand each filled buffer to the device's asynchronous copy; a buffer is
//! filled again once its copy completes. [`ToDevice`] and [`LoadToDevice`]
//! add the loads to the core's `Checkpoint` and `Loader`.

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod load;
mod pipeline;
mod plan;
mod report;
mod ring;
mod tensors;

use std::io;
use std::path::Path;

use safeload_core::{Checkpoint, Loader, Result, TensorInfo};

pub use cpu::{StandIn, StandInCopy, StandInSlab, StandInStaging};
#[cfg(feature = "cuda")]
pub use cuda::{Cuda, CudaCopy, CudaSlab, CudaStaging};
pub use report::{DeviceFileReport, DeviceReport, Route};
pub use safeload_core::dest::device::Part;
pub use tensors::{DeviceTensor, DeviceTensors};

/// The staging buffers of a load to a device, by default.
///
/// NOTE: two buffers fill while one or two copy; with 4 the stand-in's
/// loads stayed within 1.11x of the slower of their reads and copies, warm
/// and on the FUSE mount (BENCHMARKS.md, "Weights to a device").
pub const STAGING_BUFFERS: usize = 4;

/// The size of one staging buffer, and so the most one copy moves, by
/// default.
///
/// NOTE: 32 MiB copies keep a GPU's copy engine near its bandwidth while a
/// 2-4 buffer ring stays small (pegainfer's measurements, issue 53).
pub const STAGING_BYTES: usize = 32 << 20;

/// A device whose memory the crate's readers fill: device memory for each
/// file's tensors, staging buffers in host memory the device copies from,
/// and asynchronous copies out of them. The crate implements it for a CPU
/// stand-in ([`StandIn`], what the tests use) and, with the feature `cuda`,
/// for an NVIDIA GPU (`Cuda`); an engine may implement it for its own.
///
/// # Contract
///
/// - [`allocate`](Self::allocate)`(len)` gives device memory of at least
///   `len` bytes (`len > 0`) for one file's tensors: a slab. The crate places
///   each tensor at an offset that is a multiple of
///   [`alignment`](Self::alignment) (a power of two), copies only within
///   `0..len`, and drops the slab (which frees it) only once no copy into it
///   is in flight. [`address`](Self::address) is the device address of its
///   first byte, the same for its whole life.
/// - [`staging`](Self::staging)`(len)` gives a staging buffer: `len` bytes of
///   host memory the device copies from quickly (pinned memory, for a GPU),
///   which [`staging_bytes`](Self::staging_bytes) hands out, exactly `len`
///   of them. Between being given (or given back by `complete`) and being
///   submitted, only the crate touches those bytes, from several threads at
///   once, in disjoint parts.
/// - [`submit`](Self::submit)`(staging, len, slab, offset)` starts copying the
///   first `len` bytes of the buffer to `offset..offset + len` of the slab
///   and returns without waiting for it; the buffer belongs to the copy until
///   [`complete`](Self::complete) gives it back. Copies are submitted from
///   several threads at once, into the same slab too (never the same bytes).
/// - [`complete`](Self::complete) waits for one copy and gives its buffer
///   back, to be filled again. An error, there or from `submit`, means that
///   the bytes may not have arrived: the load fails (naming the file and
///   offset), waits for every copy still in flight, and drops every slab
///   and buffer it was given.
/// - Nothing blocks forever: a device that may hang bounds its waits and
///   fails instead.
///
/// Errors are [`io::Error`]s carrying the device's own message.
pub trait Device: Send + Sync {
    /// Device memory holding one file's tensors.
    type Slab: Send + Sync;
    /// A staging buffer in host memory.
    type Staging: Send;
    /// A copy in flight, holding its staging buffer.
    type Copy: Send;

    /// The device in words, for the report ("CUDA device 0 (NVIDIA H100)").
    fn name(&self) -> String;

    /// The alignment of every tensor in a slab, a power of two (256 unless
    /// the device says otherwise: CUDA's allocations and most kernels'
    /// vector loads need no more).
    fn alignment(&self) -> usize {
        256
    }

    /// Device memory of at least `len` bytes.
    fn allocate(&self, len: usize) -> io::Result<Self::Slab>;

    /// The device address of the slab's first byte.
    fn address(&self, slab: &Self::Slab) -> u64;

    /// A staging buffer of `len` bytes.
    fn staging(&self, len: usize) -> io::Result<Self::Staging>;

    /// The buffer's bytes, exactly the `len` it was made with.
    fn staging_bytes<'s>(&self, staging: &'s mut Self::Staging) -> &'s mut [u8];

    /// Starts copying `len` bytes of `staging` to `offset` of `slab`.
    fn submit(
        &self,
        staging: Self::Staging,
        len: usize,
        slab: &Self::Slab,
        offset: usize,
    ) -> io::Result<Self::Copy>;

    /// Waits for `copy` to complete; its buffer, to be filled again.
    fn complete(&self, copy: Self::Copy) -> io::Result<Self::Staging>;
}

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
