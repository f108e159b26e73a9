//! An opened checkpoint as a load to a device reads it (`dest::device`, the seam of safeload-device): the tensors the filter keeps, each the part asked for, cut as `shard` and `read_slice` cut them and grouped by file; each file's route; the load under its cancel flags.

use std::sync::Arc;

use super::{Checkpoint, TensorInfo};
use crate::cancel;
use crate::dest::device::{DeviceFile, DeviceLoad, Part, Placed};
use crate::error::Result;
use crate::extras::direct_on;
use crate::file::OpenedFile;
use crate::options::Options;
use crate::policy;
use crate::slice::SlicePlan;
use crate::source::DirectGuard;

impl<X> Checkpoint<X> {
    /// Runs `load` on this checkpoint's tensors as `part` cuts them, under
    /// the loader's cancel flags (a load they stop fails with
    /// `ErrorKind::Cancelled`), `O_DIRECT` on for the files read so until
    /// it returns.
    #[doc(hidden)] // for the plug-in crates
    pub fn device_load<T>(
        &self,
        part: &dyn Fn(&TensorInfo) -> Part,
        load: impl FnOnce(DeviceLoad<'_>) -> Result<T>,
    ) -> Result<T> {
        let inner = self.inner();
        let opts = &inner.opts;
        cancel::scope(&opts.cancel, &inner.path, || {
            let mut direct = DirectGuard::default();
            let mut files: Vec<DeviceFile<'_>> = Vec::new();
            let mut last: Option<&OpenedFile> = None;
            for info in &inner.tensors {
                if opts.filter.as_ref().is_some_and(|keep| !keep(info.name())) {
                    continue;
                }
                let Some(placed) = placed(info, part(info), opts)? else {
                    continue;
                };
                let file = self.file_of(info)?;
                match files.last_mut() {
                    Some(f) if last.is_some_and(|l| std::ptr::eq(l, file)) => {
                        f.tensors.push(placed)
                    }
                    _ => {
                        files.push(device_file(file, opts, &mut direct, placed));
                        last = Some(file);
                    }
                }
            }
            let (concurrency, read_size) = opts.io_defaults(files.iter().map(|f| f.source));
            let result = load(DeviceLoad {
                path: &inner.path,
                cancel: &opts.cancel,
                staging: opts.staging,
                concurrency,
                read_size,
                files,
            });
            drop(direct);
            result
        })
    }
}

/// `file` as a load to a device reads it: copied from its map, else read,
/// with `O_DIRECT` where the policy reads it so (an unaligned read through
/// the OS layer's bounce buffer).
fn device_file<'f>(
    file: &'f OpenedFile,
    opts: &Options,
    direct: &mut DirectGuard<'f>,
    first: Placed,
) -> DeviceFile<'f> {
    let map = file.map().map(|m| &**m);
    let kind = file.source().mount().map(|m| m.kind);
    let local = file.local().filter(|_| map.is_none());
    let on = local.is_some_and(|l| direct_on(direct, l, kind, opts.direct_io));
    DeviceFile {
        source: file.source(),
        path: file.path(),
        size: file.size(),
        map,
        direct: on,
        tensors: vec![first],
    }
}

/// `info`'s `part` as it is placed; `None` where it is skipped.
fn placed(info: &TensorInfo, part: Part, opts: &Options) -> Result<Option<Placed>> {
    if part == Part::Skip {
        return Ok(None);
    }
    let (plan, from) = (cut(info, part)?, info.dtype());
    let to = match opts.dtype {
        Some(to) if policy::converts_to(from, to).is_some() => to,
        _ => from,
    };
    Ok(Some(Placed {
        name: Arc::from(info.name()),
        shape: plan.shape,
        from,
        to,
        runs: plan
            .runs
            .iter()
            .map(|r| (info.offset + r.src as u64, r.len))
            .collect(),
    }))
}

/// `info`'s `part` as `shard` and `read_slice` cut it (`Skip` as `Whole`);
/// an error names its file.
pub(super) fn cut(info: &TensorInfo, part: Part) -> Result<SlicePlan> {
    let (name, dtype, shape) = (info.name(), info.dtype(), info.shape());
    match part {
        Part::Whole | Part::Skip => SlicePlan::new(name, dtype, shape, &[]),
        Part::Slice(ranges) => SlicePlan::new(name, dtype, shape, &ranges),
        Part::Shard { dim, rank, world } => SlicePlan::shard(name, dtype, shape, dim, rank, world),
    }
    .map_err(|e| e.or_path(info.file()))
}
