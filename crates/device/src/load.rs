//! A load to a device: each file's slab laid out and allocated, its tensors cut into chunks and pieces (`plan.rs`), the pieces read (or copied from the map) into the staging ring by the read loop and each filled chunk copied (`pipeline.rs`), every copy waited for, the tensors and the report handed out.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use safeload_core::MERGE_GAP;
use safeload_core::dest::device::{DeviceFile, DeviceLoad};
use safeload_core::error::{Error, Operation, Result};
use safeload_core::jobs;
use safeload_core::source::read_error;

use crate::device::{Device, STAGING_BUFFERS, STAGING_BYTES};
use crate::pipeline::{Failure, FileCost, Pipeline, Placing};
use crate::plan::{self, Chunk, Sizes};
use crate::report::{DeviceFileReport, DeviceReport, Route};
use crate::ring::Ring;
use crate::tensors::{DeviceTensor, DeviceTensors};

/// The smallest staging buffer a caller may ask for (`Loader::staging`).
const MIN_STAGING_BYTES: usize = 4 << 10;

/// The most one piece reads through a reader's scratch buffer.
const SCRATCH: usize = 2 << 20;

/// Places the tensors of `load`'s files on `device` through a staging ring
/// of the options' size, under the load's cancel flags.
pub(crate) fn to_device<D: Device>(device: &D, load: DeviceLoad<'_>) -> Result<DeviceTensors<D>> {
    let clock = Instant::now();
    let (buffers, buffer_len) = staging(load.staging);
    let align = device.alignment().max(1).next_power_of_two();
    let placing = allocate(device, load.files, align)?;
    let mut concurrency = load.concurrency;
    let sizes = Sizes {
        chunk: buffer_len,
        // NOTE: a quarter of a buffer at most, so that the chunks filling
        // at once keep the readers busy (BENCHMARKS.md, "Weights to a device").
        piece: load.read_size.min(buffer_len / 4).max(MIN_STAGING_BYTES),
        // NOTE: what each reader's scratch buffer may grow to (merged rows of
        // a part, a conversion's source read), so that the readers' scratch
        // stays small beside the ring (BENCHMARKS.md, "Weights to a device").
        scratch: SCRATCH.min(buffer_len / 4).max(MIN_STAGING_BYTES),
        merge_gap: MERGE_GAP,
    };
    let chunks: Vec<Chunk> = placing
        .iter()
        .enumerate()
        .flat_map(|(i, p)| plan::chunks(i, &p.file.tensors, &p.layout, sizes))
        .collect();
    let pieces: usize = chunks.iter().map(|c| c.pieces.len()).sum();
    // More readers than the pieces of a full ring would only wait.
    let per_chunk = buffer_len.div_ceil(sizes.piece).max(1);
    concurrency.max = concurrency.max.min(buffers * per_chunk).max(1);
    concurrency.start = concurrency.start.min(concurrency.max);
    let ring = Ring::new(buffers, buffer_len);
    let (readers, cancel) = (concurrency.max, load.cancel);
    let mut pipeline = Pipeline::new(device, &placing, &chunks, ring, readers, clock, cancel);
    let (read, started, _) = jobs::drain(&pipeline, concurrency, pieces, DEVICE_READER, cancel);
    // Every copy waited for, whatever the reads did: no slab is freed
    // under one.
    let copied = pipeline.finish();
    let costs = std::mem::take(&mut pipeline.costs);
    drop(pipeline);
    if let Err(failure) = read.and(copied) {
        return Err(error_of(failure, &placing, load.path));
    }
    let staging = (buffers, buffer_len, started.started);
    Ok(assemble(device, placing, &costs, staging, clock))
}

/// The name of the threads that read a load to a device.
const DEVICE_READER: &str = "safeload-device";

/// The ring's buffers and their size: the caller's, else the defaults.
fn staging(asked: Option<(usize, usize)>) -> (usize, usize) {
    let (buffers, len) = asked.unwrap_or((STAGING_BUFFERS, STAGING_BYTES));
    (buffers.max(1), len.max(MIN_STAGING_BYTES))
}

/// Each file's slab laid out and allocated (at least one byte, so that a
/// file of empty tensors has one to name).
fn allocate<'a, D: Device>(
    device: &D,
    files: Vec<DeviceFile<'a>>,
    align: usize,
) -> Result<Vec<Placing<'a, D>>> {
    let mut placing = Vec::with_capacity(files.len());
    for file in files {
        let layout = plan::slab(&file.tensors, align).ok_or_else(|| {
            let e = std::io::Error::from(std::io::ErrorKind::OutOfMemory);
            Error::io(Operation::Allocate, file.path, None, e)
        })?;
        let slab = device
            .allocate(layout.len.max(1))
            .map_err(|e| Error::io(Operation::Allocate, file.path, None, e))?;
        placing.push(Placing {
            file,
            layout,
            slab: Arc::new(slab),
        });
    }
    Ok(placing)
}

/// The crate's error for a failed load: a read's names its file and
/// offset as any read's does; a device's, the file whose copy failed.
fn error_of<D: Device>(failure: Failure, placing: &[Placing<'_, D>], path: &Path) -> Error {
    let file = failure.file.and_then(|i| placing.get(i)).map(|p| &p.file);
    match (file, failure.device) {
        (Some(f), false) => read_error(
            failure.operation,
            f.source,
            f.size,
            failure.offset.unwrap_or(0),
            failure.error,
        ),
        (Some(f), true) => Error::io(failure.operation, f.path, failure.offset, failure.error),
        (None, _) => Error::io(failure.operation, path, failure.offset, failure.error),
    }
}

/// The tensors, each a view of its file's slab, and the report.
fn assemble<D: Device>(
    device: &D,
    placing: Vec<Placing<'_, D>>,
    costs: &[FileCost],
    (buffers, buffer_len, readers): (usize, usize, usize),
    clock: Instant,
) -> DeviceTensors<D> {
    let mut tensors = Vec::new();
    let mut files = Vec::with_capacity(placing.len());
    for (p, cost) in placing.into_iter().zip(costs) {
        let base = device.address(&p.slab);
        let route = match (p.file.map, p.file.direct) {
            (Some(_), _) => Route::Mapped,
            (None, true) => Route::Direct,
            (None, false) => Route::Read,
        };
        let mut report = DeviceFileReport {
            path: p.file.path.to_path_buf(),
            route,
            tensors: p.file.tensors.len(),
            converted: 0,
            overflowed: cost.overflowed.load(Ordering::Relaxed),
            bytes: 0,
            bytes_read: cost.bytes_read.load(Ordering::Relaxed),
            chunks: cost.chunks.load(Ordering::Relaxed),
            elapsed: cost.elapsed(),
        };
        for (t, &offset) in p.file.tensors.into_iter().zip(&p.layout.offsets) {
            let nbytes = plan::out_len(&t);
            report.bytes += nbytes as u64;
            report.converted += usize::from(t.to != t.from);
            tensors.push(DeviceTensor {
                name: t.name,
                dtype: t.to,
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
