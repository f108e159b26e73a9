//! A `Loader`'s way to a device: its staging ring's size, and the load that places a checkpoint's tensors in a device's memory (`Checkpoint::to_device` on the checkpoint it opens).

use std::path::Path;

use super::Loader;
use crate::dest::device::{Device, DeviceTensors};
use crate::error::Result;

impl<X> Loader<X> {
    /// The staging ring of a load to a device
    /// ([`load_to_device`](Self::load_to_device),
    /// `Checkpoint::to_device`): `buffers`
    /// buffers of `bytes` each, the host memory such a load takes
    /// whatever the checkpoint's size (pinned memory on a GPU), and the
    /// most one copy moves. Default 4 of 32 MiB
    /// ([`device::STAGING_BUFFERS`](crate::device::STAGING_BUFFERS),
    /// [`device::STAGING_BYTES`](crate::device::STAGING_BYTES)); at least
    /// one buffer of 4 KiB. Two buffers already overlap reads with copies;
    /// more keep readers busy while copies queue.
    pub fn staging(mut self, buffers: usize, bytes: usize) -> Self {
        self.opts.staging = Some((buffers, bytes));
        self
    }

    /// Loads the checkpoint at `path` into `device`'s memory: opens it
    /// ([`open`](Self::open)) and places every tensor the filter keeps
    /// (`Checkpoint::to_device`), converted
    /// where [`dtype`](Self::dtype) says, through the staging ring
    /// ([`staging`](Self::staging)); [`cancel_on`](Self::cancel_on) stops it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data: Vec<u8> = [1.0f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2], &data)?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// use safeload::{Dtype, Loader, device::StandIn};
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
    /// As [`open`](Self::open), then as
    /// `Checkpoint::to_device`.
    pub fn load_to_device<D: Device>(
        &self,
        path: impl AsRef<Path>,
        device: &D,
    ) -> Result<DeviceTensors<D>> {
        self.open(path)?.to_device(device)
    }
}
