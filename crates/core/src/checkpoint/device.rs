//! An opened checkpoint's tensors (or a part of each) placed in a device's memory through the staging ring: what each file sends, planned from the headers, a rank's part or a slice cut as `shard` and `read_slice` cut them, converted where the options convert.

use std::sync::Arc;

use super::{Checkpoint, TensorInfo};
use crate::cancel;
use crate::dest::device::{Device, DeviceTensors, Part};
use crate::error::Result;
use crate::execute::device::{self, FileRequest, Placed};
use crate::plan::device::{SourceRun, Wanted};
use crate::slice::SlicePlan;

impl<X> Checkpoint<X> {
    /// Places every tensor in `device`'s memory: one slab per file, each
    /// tensor a view of it (at a multiple of the device's alignment), with
    /// no copy of the checkpoint in host memory.
    ///
    /// The crate's readers fill a small ring of staging buffers
    /// (`Loader::staging`: by default 4 of 32 MiB,
    /// pinned memory on a GPU) in file order, each with up to one buffer of
    /// a file's tensors as they lie on the device, and hand each filled
    /// buffer to the device's asynchronous copy; reads and copies overlap,
    /// and host memory is the ring, whatever the checkpoint's size. A file
    /// read with positional reads (FUSE, a network mount, direct I/O, a
    /// remote object, a cache) is read straight into the ring; a mapped one
    /// is copied from its map by the readers, its pages let go of as they
    /// are copied. With `Loader::dtype`, floating
    /// tensors are converted in the staging buffers; the options' filter
    /// leaves tensors out. The report says, per file, how its bytes went,
    /// in how many copies, how fast ([`DeviceTensors::report`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = (0..48u8).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![4, 6], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// use safeload::device::StandIn; // with the feature `cuda`: device::Cuda::new(stream)
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
    /// cannot allocate or a copy fails, naming the file; [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled)
    /// where the loader's `cancel_on` flag is set
    /// during the load. Whatever the error, every copy in flight has
    /// completed or failed before it returns, and every slab and staging
    /// buffer is dropped.
    pub fn to_device<D: Device>(&self, device: &D) -> Result<DeviceTensors<D>> {
        self.to_device_parts(device, |_| Part::Whole)
    }

    /// [`to_device`](Self::to_device), with the part of each tensor that
    /// `part` names: whole, a tensor-parallel rank's part or a slice (cut as
    /// [`shard`](Self::shard) and [`read_slice`](Self::read_slice) cut them;
    /// only those bytes are read and copied), or none.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = (0..35u8).collect();
    /// # let views = [("w", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![5, 7], &data)?),
    /// #              ("norm", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![7], &data[..7])?)];
    /// # safetensors::serialize_to_file(views, None, &path)?;
    /// use safeload::device::{Part, StandIn};
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
    /// As [`to_device`](Self::to_device), and as [`shard`](Self::shard) and
    /// [`read_slice`](Self::read_slice) for a part they refuse.
    pub fn to_device_parts<D: Device>(
        &self,
        device: &D,
        part: impl Fn(&TensorInfo) -> Part,
    ) -> Result<DeviceTensors<D>> {
        let inner = self.inner();
        cancel::scope(&inner.opts.cancel, &inner.path, || {
            let files = self.device_requests(&part)?;
            device::to_device(device, files, &inner.opts, &inner.path)
        })
    }

    /// What each file places on the device: the tensors the filter keeps,
    /// each the part `part` names, in file order; files with none left out.
    fn device_requests(&self, part: &dyn Fn(&TensorInfo) -> Part) -> Result<Vec<FileRequest<'_>>> {
        let inner = self.inner();
        let mut files: Vec<FileRequest<'_>> = Vec::new();
        for info in &inner.tensors {
            if inner
                .opts
                .filter
                .as_ref()
                .is_some_and(|keep| !keep(info.name()))
            {
                continue;
            }
            let Some(placed) =
                placed(info, part(info), inner.opts.dtype).map_err(|e| e.or_path(info.file()))?
            else {
                continue;
            };
            let file = self.file_of(info)?;
            match files.last_mut() {
                Some(last) if std::ptr::eq(last.file, file) => last.tensors.push(placed),
                _ => files.push(FileRequest {
                    file,
                    tensors: vec![placed],
                }),
            }
        }
        Ok(files)
    }
}

/// `info`'s `part` as it is placed: its runs of the file, its shape and
/// dtype on the device; `None` where it is skipped.
fn placed(
    info: &TensorInfo,
    part: Part,
    dtype: Option<safetensors::Dtype>,
) -> Result<Option<Placed>> {
    let (name, from, shape) = (info.name(), info.dtype(), info.shape());
    let plan = match part {
        Part::Skip => return Ok(None),
        Part::Whole => SlicePlan::new(name, from, shape, &[])?,
        Part::Slice(ranges) => SlicePlan::new(name, from, shape, &ranges)?,
        Part::Shard { dim, rank, world } => SlicePlan::shard(name, from, shape, dim, rank, world)?,
    };
    let runs = plan
        .runs
        .iter()
        .map(|r| SourceRun {
            at: info.offset + r.src as u64,
            len: r.len,
        })
        .collect();
    Ok(Some(Placed {
        name: Arc::from(name),
        shape: plan.shape,
        wanted: Wanted {
            from,
            to: device::device_dtype(from, dtype),
            runs,
        },
    }))
}
