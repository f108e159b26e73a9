//! An NVIDIA GPU as the device (feature `cuda`): slabs allocated on the engine's stream, pinned staging buffers, `cuMemcpyHtoDAsync` of each filled chunk on that stream, an event recorded after it for its completion; cudarc's safe API, the driver loaded at run time.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DriverError, PinnedHostSlice,
};

use crate::device::Device;

/// An NVIDIA GPU, reached through the CUDA driver on a stream of the
/// engine's context (feature `cuda`).
///
/// Slabs are allocated on the stream (zeroed, so that the padding between
/// tensors is too); staging buffers are pinned host memory (write-combined:
/// the crate only writes them, the GPU reads them); each filled chunk is one
/// `cuMemcpyHtoDAsync` on the stream, followed by an event whose completion
/// gives the buffer back. The copies are ordered on the engine's stream with
/// its own work: a kernel it launches on that stream after the load sees
/// every byte. The driver is loaded when first used: a build with this
/// feature needs no CUDA, and fails at run time, with the driver's error,
/// where there is no GPU.
///
/// ```no_run
/// use safeload::device::{Cuda, LoadToDevice};
///
/// let gpu = Cuda::on_device(0)?;                 // or Cuda::new(engine_stream)
/// let weights = safeload::Loader::new().load_to_device("model/", &gpu)?;
/// let w = weights.get("lm_head.weight").unwrap();
/// let _ = (w.device_ptr(), w.dtype(), w.shape());  // what a kernel takes
/// eprintln!("{}", weights.report());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Cuda {
    stream: Arc<CudaStream>,
}

impl Cuda {
    /// The device of `stream`'s context, its copies on `stream`.
    pub fn new(stream: Arc<CudaStream>) -> Cuda {
        Cuda { stream }
    }

    /// GPU `ordinal`'s primary context, on a new stream of it.
    ///
    /// # Errors
    ///
    /// The driver's (no such device, no GPU), or
    /// [`io::ErrorKind::NotFound`] where the driver library cannot be loaded:
    /// cudarc panics then, and this catches it (the panic hook, the
    /// process's, may still print cudarc's message).
    pub fn on_device(ordinal: usize) -> io::Result<Cuda> {
        let context = std::panic::catch_unwind(|| CudaContext::new(ordinal)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "the CUDA driver library (libcuda) could not be loaded",
            )
        })?;
        let context = context.map_err(driver)?;
        Ok(Cuda::new(context.new_stream().map_err(driver)?))
    }

    /// The stream its copies are on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// The driver's error as an I/O error, its message kept.
fn driver(error: DriverError) -> io::Error {
    io::Error::other(error)
}

/// One file's device memory on a [`Cuda`] device.
#[derive(Debug)]
pub struct CudaSlab {
    /// Locked only to make a view of it for a copy (cudarc writes through
    /// `&mut`); the copies themselves run on the stream, unlocked.
    memory: Mutex<CudaSlice<u8>>,
    address: u64,
}

impl CudaSlab {
    /// The slab's device memory, for an engine to make its own tensors of
    /// (cudarc views at a tensor's offset and length).
    pub fn memory(&self) -> MutexGuard<'_, CudaSlice<u8>> {
        self.memory.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The slab's device memory, owned: for an engine that takes the slab
    /// once no tensor of it is left (`Arc::try_unwrap` of
    /// [`DeviceTensor::slab`](crate::DeviceTensor::slab)).
    pub fn into_memory(self) -> CudaSlice<u8> {
        self.memory
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A pinned staging buffer of a [`Cuda`] device.
#[derive(Debug)]
pub struct CudaStaging {
    host: PinnedHostSlice<u8>,
}

/// A copy in flight on a [`Cuda`] device: its buffer, and the event recorded
/// after it.
#[derive(Debug)]
pub struct CudaCopy {
    staging: CudaStaging,
    done: CudaEvent,
}

impl Device for Cuda {
    type Slab = CudaSlab;
    type Staging = CudaStaging;
    type Copy = CudaCopy;

    fn name(&self) -> String {
        let context = self.stream.context();
        let name = context.name().unwrap_or_else(|e| e.to_string());
        format!("CUDA device {} ({name})", context.ordinal())
    }

    fn allocate(&self, len: usize) -> io::Result<CudaSlab> {
        let memory = self.stream.alloc_zeros::<u8>(len).map_err(driver)?;
        // The copies are submitted from the readers' threads: where the
        // stream is the per-thread default stream (candle's `Device::new_cuda`),
        // each thread's is another, not ordered after this allocation and
        // its zeroing; they are complete before any copy, whatever the stream.
        self.stream.synchronize().map_err(driver)?;
        let address = memory.device_ptr(&self.stream).0;
        Ok(CudaSlab {
            address,
            memory: Mutex::new(memory),
        })
    }

    fn address(&self, slab: &CudaSlab) -> u64 {
        slab.address
    }

    fn staging(&self, len: usize) -> io::Result<CudaStaging> {
        // SAFETY: the pinned memory comes uninitialized; it is zeroed below,
        // before anything reads it, and any byte is a valid `u8`.
        let mut host = unsafe { self.stream.context().alloc_pinned::<u8>(len) }.map_err(driver)?;
        host.as_mut_slice().map_err(driver)?.fill(0);
        Ok(CudaStaging { host })
    }

    fn staging_bytes<'s>(&self, staging: &'s mut CudaStaging) -> &'s mut [u8] {
        // No copy of this buffer is in flight (the crate holds it), so the
        // wait on its event returns at once; were it to fail, an empty
        // buffer fails the chunk that was to use it.
        staging.host.as_mut_slice().unwrap_or_default()
    }

    fn submit(
        &self,
        staging: CudaStaging,
        len: usize,
        slab: &CudaSlab,
        offset: usize,
    ) -> io::Result<CudaCopy> {
        let src = staging.host.as_slice().map_err(driver)?;
        let src = src
            .get(..len)
            .ok_or_else(|| io::Error::other("a copy longer than its staging buffer"))?;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| io::Error::other("a copy past the end of its slab"))?;
        {
            let mut memory = slab.memory.lock().unwrap_or_else(PoisonError::into_inner);
            let mut dst = memory
                .try_slice_mut(offset..end)
                .ok_or_else(|| io::Error::other("a copy past the end of its slab"))?;
            // Pinned memory: the copy runs after this returns, reading the
            // buffer, which `CudaCopy` holds until its event completes.
            self.stream.memcpy_htod(src, &mut dst).map_err(driver)?;
        }
        match self
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_BLOCKING_SYNC))
        {
            Ok(done) => Ok(CudaCopy { staging, done }),
            Err(e) => {
                // No event to wait for: the stream, so that the buffer is not
                // freed under the copy.
                let _ = self.stream.synchronize();
                Err(driver(e))
            }
        }
    }

    fn complete(&self, copy: CudaCopy) -> io::Result<CudaStaging> {
        copy.done.synchronize().map_err(driver)?;
        Ok(copy.staging)
    }
}
