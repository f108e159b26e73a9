//! The seam of a load to device memory (the crate safeload-device): `Part`, which part of each tensor it places, and what the core hands it of an opened checkpoint (`Checkpoint::device_load`): each file's source, map and route, the runs of each tensor's part, the options it follows.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use safetensors::Dtype;

use crate::adapt::Concurrency;
use crate::cancel::Cancel;
use crate::source::Source;
use crate::storage::Storage;

/// Which part of a tensor a load to a device places there
/// (`ToDevice::to_device_parts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// The whole tensor.
    Whole,
    /// Rank `rank`'s part along dimension `dim` of the tensor split `world`
    /// ways, as `Checkpoint::shard` cuts it.
    Shard {
        /// The dimension split.
        dim: usize,
        /// This rank.
        rank: usize,
        /// The ranks.
        world: usize,
    },
    /// A slice: one range per leading dimension, as
    /// `Checkpoint::read_slice` takes it.
    Slice(Vec<Range<usize>>),
    /// None of it: the tensor is left out.
    Skip,
}

/// A load to a device as the core plans it: the files in load order (none
/// without tensors), how to read them, and the options it follows.
#[doc(hidden)] // for the plug-in crates
pub struct DeviceLoad<'a> {
    /// The checkpoint, for errors about the whole load.
    pub path: &'a Path,
    pub cancel: &'a Cancel,
    /// The staging ring the caller asked for (`Loader::staging`).
    pub staging: Option<(usize, usize)>,
    /// The read loop's readers and the size of a read, as a load's.
    pub concurrency: Concurrency,
    pub read_size: usize,
    pub files: Vec<DeviceFile<'a>>,
}

/// One file of a [`DeviceLoad`].
#[doc(hidden)] // for the plug-in crates
pub struct DeviceFile<'a> {
    pub source: &'a dyn Source,
    pub path: &'a Path,
    /// Its length when opened.
    pub size: u64,
    /// Its map, where it is mapped: its pieces are copied from it.
    pub map: Option<&'a Storage>,
    /// Whether it is read with `O_DIRECT` (on until the load's end).
    pub direct: bool,
    /// The tensors it places, in file order.
    pub tensors: Vec<Placed>,
}

/// One tensor's part as it is placed: its name and shape there, its dtype
/// in the file and on the device (the load's, where it converts), and the
/// runs of the file that hold it (offset, length), in device order.
#[doc(hidden)] // for the plug-in crates
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub name: Arc<str>,
    pub shape: Vec<usize>,
    pub from: Dtype,
    pub to: Dtype,
    pub runs: Vec<(u64, usize)>,
}

/// Lets go of `len` bytes at `start` of a file's map once they are copied
/// (nothing for an owned buffer).
#[doc(hidden)] // for the plug-in crates
pub fn let_go(map: &Storage, start: usize, len: usize) {
    if let Some(m) = map.file_map() {
        crate::os::let_go(m, start, len);
    }
}
