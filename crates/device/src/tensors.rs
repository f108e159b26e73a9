//! What a load to a device hands out: tensors in device memory (an address, a dtype, a shape, and the slab that owns them), found by name, with the load's report.

use std::collections::HashMap;
use std::sync::Arc;

use safetensors::Dtype;

use crate::cpu::StandIn;
use crate::device::Device;
use crate::report::DeviceReport;

/// A tensor in device memory: where it is, what it holds, and the slab
/// (one per file) that owns its bytes, which it keeps alive.
pub struct DeviceTensor<D: Device> {
    pub(crate) name: Arc<str>,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    pub(crate) slab: Arc<D::Slab>,
    pub(crate) offset: usize,
    pub(crate) nbytes: usize,
    pub(crate) address: u64,
}

impl<D: Device> Clone for DeviceTensor<D> {
    fn clone(&self) -> Self {
        DeviceTensor {
            name: Arc::clone(&self.name),
            dtype: self.dtype,
            shape: self.shape.clone(),
            slab: Arc::clone(&self.slab),
            offset: self.offset,
            nbytes: self.nbytes,
            address: self.address,
        }
    }
}

impl<D: Device> std::fmt::Debug for DeviceTensor<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("address", &format_args!("{:#x}", self.address))
            .field("nbytes", &self.nbytes)
            .finish_non_exhaustive()
    }
}

impl<D: Device> DeviceTensor<D> {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its dtype on the device (the converted one, where the load converts).
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Its shape (a part's, for a shard or a slice).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Its bytes on the device.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The device address of its first byte.
    pub fn device_ptr(&self) -> u64 {
        self.address
    }

    /// Where it starts in its slab, in bytes (a multiple of the device's
    /// alignment).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The slab that holds it (with the other tensors of its file), kept
    /// alive by every tensor in it.
    pub fn slab(&self) -> &Arc<D::Slab> {
        &self.slab
    }
}

impl DeviceTensor<StandIn> {
    /// Its bytes, copied back from the stand-in's memory; `None` where the
    /// stand-in discards what it copies.
    pub fn to_host(&self) -> Option<Vec<u8>> {
        self.slab.read(self.offset..self.offset + self.nbytes)
    }
}

/// The tensors a load placed on a device, in file order, found by name, and
/// how each file's bytes got there ([`report`](Self::report)).
pub struct DeviceTensors<D: Device> {
    pub(crate) tensors: Vec<DeviceTensor<D>>,
    pub(crate) by_name: HashMap<Arc<str>, usize>,
    pub(crate) report: DeviceReport,
}

impl<D: Device> std::fmt::Debug for DeviceTensors<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensors")
            .field("tensors", &self.tensors.len())
            .field("report", &self.report)
            .finish()
    }
}

impl<D: Device> DeviceTensors<D> {
    /// The tensor called `name`.
    pub fn get(&self, name: &str) -> Option<&DeviceTensor<D>> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Every tensor, in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &DeviceTensor<D>> + '_ {
        self.tensors.iter()
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Per file: how its bytes reached the device, in how many chunks, how
    /// fast.
    pub fn report(&self) -> &DeviceReport {
        &self.report
    }

    /// The tensors, in file order, and the report.
    pub fn into_parts(self) -> (Vec<DeviceTensor<D>>, DeviceReport) {
        (self.tensors, self.report)
    }
}
