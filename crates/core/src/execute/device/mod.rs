//! A load to a device: each file's slab laid out and allocated, its tensors cut into chunks and pieces (`plan::device`), the pieces read (or copied from the map) into the staging ring by the read loop and each filled chunk copied (`pipeline.rs`), every copy waited for, the tensors and the report handed out.

mod pipeline;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use safetensors::Dtype;

use crate::dest::device::ring::Ring;
use crate::dest::device::{
    Device, DeviceFileReport, DeviceReport, DeviceTensor, DeviceTensors, Route, STAGING_BUFFERS,
    STAGING_BYTES,
};
use crate::error::{Error, Operation, Result};
use crate::file::{OpenedFile, read_error};
use crate::jobs;
use crate::options::Options;
use crate::plan::device::{self as layout, Chunk, Sizes, Wanted};
use crate::policy;
use crate::slice::MERGE_GAP;
use crate::source::DirectGuard;
use pipeline::{Failure, FileIo, Pipeline};

/// The smallest staging buffer a caller may ask for (`Loader::staging`).
const MIN_STAGING_BYTES: usize = 4 << 10;

/// The most one piece reads through a reader's scratch buffer.
const SCRATCH: usize = 2 << 20;

/// One tensor (or part) to place: its name and shape there, and where its
/// bytes come from.
pub(crate) struct Placed {
    pub name: Arc<str>,
    pub shape: Vec<usize>,
    pub wanted: Wanted,
}

/// A file and the tensors to place from it, in file order.
pub(crate) struct FileRequest<'a> {
    pub file: &'a OpenedFile,
    pub tensors: Vec<Placed>,
}

/// A file as the load goes: its request, its slab's layout and the slab.
struct Placing<'a, D: Device> {
    request: FileRequest<'a>,
    layout: layout::Slab,
    slab: Arc<D::Slab>,
    route: Route,
}

/// Places the tensors of `files` on `device` (`files` in load order, none
/// without tensors), through a staging ring of the options' size, under the
/// cancel flags of the calling thread's load scope. `path` names the
/// checkpoint in errors about the whole load.
pub(crate) fn to_device<D: Device>(
    device: &D,
    files: Vec<FileRequest<'_>>,
    opts: &Options,
    path: &Path,
) -> Result<DeviceTensors<D>> {
    let clock = Instant::now();
    let (buffers, buffer_len) = staging(opts);
    let align = device.alignment().max(1).next_power_of_two();
    let mut placing = allocate(device, files, align)?;
    let mut direct = DirectGuard::default();
    for p in &mut placing {
        p.route = route(p.request.file, opts, &mut direct);
    }
    let (concurrency, read_size) = policy::io_defaults(
        placing.iter().map(|p| p.request.file.source()),
        opts.caller_reads(),
    );
    let sizes = Sizes {
        chunk: buffer_len,
        // NOTE: a quarter of a buffer at most, so that the chunks filling
        // at once keep the readers busy (BENCHMARKS.md, "Weights to a device").
        piece: read_size.min(buffer_len / 4).max(MIN_STAGING_BYTES),
        // NOTE: what each reader's scratch buffer may grow to (merged rows of
        // a part, a conversion's source read), so that the readers' scratch
        // stays small beside the ring (BENCHMARKS.md, "Weights to a device").
        scratch: SCRATCH.min(buffer_len / 4).max(MIN_STAGING_BYTES),
        merge_gap: MERGE_GAP,
    };
    let chunks: Vec<Chunk> = placing
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            let wanted: Vec<Wanted> = p.request.tensors.iter().map(|t| t.wanted.clone()).collect();
            layout::chunks(i, &wanted, &p.layout, sizes)
        })
        .collect();
    let pieces: usize = chunks.iter().map(|c| c.pieces.len()).sum();
    // More readers than the pieces of a full ring would only wait.
    let per_chunk = buffer_len.div_ceil(sizes.piece).max(1);
    let mut concurrency = concurrency;
    concurrency.max = concurrency.max.min(buffers * per_chunk).max(1);
    concurrency.start = concurrency.start.min(concurrency.max);
    let io: Vec<FileIo<'_, D::Slab>> = placing
        .iter()
        .map(|p| FileIo {
            source: p.request.file.source(),
            map: match p.route {
                Route::Mapped => p.request.file.map().map(|m| &**m),
                _ => None,
            },
            slab: Some(&*p.slab),
        })
        .collect();
    let ring = Ring::new(buffers, buffer_len);
    let (readers, cancel) = (concurrency.max, &opts.cancel);
    let mut pipeline = Pipeline::new(device, &io, &chunks, ring, readers, clock, cancel);
    let (read, started, _) = jobs::drain(&pipeline, concurrency, pieces, DEVICE_READER, cancel);
    // Every copy waited for, whatever the reads did: no slab is freed
    // under one.
    let copied = pipeline.finish();
    let costs = std::mem::take(&mut pipeline.costs);
    drop(pipeline);
    drop((io, direct));
    if let Err(failure) = read.and(copied) {
        return Err(error_of(failure, &placing, path));
    }
    let staging = (buffers, buffer_len, started.started);
    Ok(assemble(device, placing, &costs, staging, clock))
}

/// The name of the threads that read a load to a device.
const DEVICE_READER: &str = "safeload-device";

/// The ring's buffers and their size: the caller's, else the defaults.
fn staging(opts: &Options) -> (usize, usize) {
    let (buffers, len) = opts.staging.unwrap_or((STAGING_BUFFERS, STAGING_BYTES));
    (buffers.max(1), len.max(MIN_STAGING_BYTES))
}

/// Each file's slab laid out and allocated (at least one byte, so that a
/// file of empty tensors has one to name).
fn allocate<'a, D: Device>(
    device: &D,
    files: Vec<FileRequest<'a>>,
    align: usize,
) -> Result<Vec<Placing<'a, D>>> {
    let mut placing = Vec::with_capacity(files.len());
    for request in files {
        let path = request.file.path();
        let wanted: Vec<Wanted> = request.tensors.iter().map(|t| t.wanted.clone()).collect();
        let layout = layout::slab(&wanted, align).ok_or_else(|| {
            let e = std::io::Error::from(std::io::ErrorKind::OutOfMemory);
            Error::io(Operation::Allocate, path, None, e)
        })?;
        let slab = device
            .allocate(layout.len.max(1))
            .map_err(|e| Error::io(Operation::Allocate, path, None, e))?;
        placing.push(Placing {
            request,
            layout,
            slab: Arc::new(slab),
            route: Route::Read,
        });
    }
    Ok(placing)
}

/// How `file`'s bytes reach the staging buffers: copied from its map where
/// it is mapped, else read, with `O_DIRECT` where the policy reads it so
/// (turned on here, off when `direct` is dropped).
fn route<'f>(file: &'f OpenedFile, opts: &Options, direct: &mut DirectGuard<'f>) -> Route {
    if file.map().is_some() {
        return Route::Mapped;
    }
    let Some(local) = file.local() else {
        return Route::Read;
    };
    let kind = file.source().mount().map(|m| m.kind);
    // The staging buffers are laid out as the device wants, not in whole
    // blocks: a read the file system refuses unaligned goes through the OS
    // layer's aligned bounce buffer.
    let wanted = policy::wants_direct_io(opts.direct_io, kind, true, || local.mostly_cached());
    match wanted && direct.add(local).is_ok() {
        true => Route::Direct,
        false => Route::Read,
    }
}

/// The crate's error for a failed load: a read's names its file and
/// offset as any read's does; a device's, the file whose copy failed.
fn error_of<D: Device>(failure: Failure, placing: &[Placing<'_, D>], path: &Path) -> Error {
    let file = failure
        .file
        .and_then(|i| placing.get(i))
        .map(|p| p.request.file);
    match (file, failure.device) {
        (Some(f), false) => read_error(
            failure.operation,
            f.source(),
            f.size(),
            failure.offset.unwrap_or(0),
            failure.error,
        ),
        (Some(f), true) => Error::io(failure.operation, f.path(), failure.offset, failure.error),
        (None, _) => Error::io(failure.operation, path, failure.offset, failure.error),
    }
}

/// The tensors, each a view of its file's slab, and the report.
fn assemble<D: Device>(
    device: &D,
    placing: Vec<Placing<'_, D>>,
    costs: &[pipeline::FileCost],
    (buffers, buffer_len, readers): (usize, usize, usize),
    clock: Instant,
) -> DeviceTensors<D> {
    let mut tensors = Vec::new();
    let mut files = Vec::with_capacity(placing.len());
    for (p, cost) in placing.into_iter().zip(costs) {
        let base = device.address(&p.slab);
        let mut report = DeviceFileReport {
            path: p.request.file.path().to_path_buf(),
            route: p.route,
            tensors: p.request.tensors.len(),
            converted: 0,
            overflowed: cost.overflowed.load(Ordering::Relaxed),
            bytes: 0,
            bytes_read: cost.bytes_read.load(Ordering::Relaxed),
            chunks: cost.chunks.load(Ordering::Relaxed),
            elapsed: cost.elapsed(),
        };
        for (t, &offset) in p.request.tensors.into_iter().zip(&p.layout.offsets) {
            let nbytes = t.wanted.out_len();
            report.bytes += nbytes as u64;
            report.converted += usize::from(t.wanted.to != t.wanted.from);
            tensors.push(DeviceTensor {
                name: t.name,
                dtype: t.wanted.to,
                shape: t.shape,
                slab: Arc::clone(&p.slab),
                offset,
                nbytes,
                address: base + offset as u64,
            });
        }
        files.push(report);
    }
    let by_name = tensors
        .iter()
        .enumerate()
        .map(|(i, t)| (Arc::clone(&t.name), i))
        .collect::<HashMap<_, _>>();
    DeviceTensors {
        tensors,
        by_name,
        report: DeviceReport {
            device: device.name(),
            staging_buffers: buffers,
            staging_bytes: buffer_len,
            readers,
            files,
            elapsed: clock.elapsed(),
        },
    }
}

/// The dtype a tensor of `from` has on the device when the load converts
/// to `to` (`Loader::dtype`): `to` where the conversion applies to it.
pub(crate) fn device_dtype(from: Dtype, to: Option<Dtype>) -> Dtype {
    match to {
        Some(to) if policy::converts_to(from, to).is_some() => to,
        _ => from,
    }
}
