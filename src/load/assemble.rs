//! Assembling a load's result: every selected tensor a view of its file's storage, in file order, with the merged metadata and the report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::checkpoint::Resolved;
use crate::checkpoint::open::{Body, ConvertBuffer, OpenFile, size_mismatch};

/// Whether a file's own tensors are views of its map or of a buffer read.
enum StorageKind {
    Mapped,
    Read,
}
use crate::error::Result;
use crate::report::{FileReport, LoadReport};
use crate::state_dict::StateDict;
use crate::storage::Storage;
use crate::tensor::Tensor;

pub(crate) fn assemble(
    checkpoint: &Resolved,
    opened: Vec<OpenFile>,
    clock: Instant,
    threads: usize,
    io_concurrency: usize,
) -> Result<StateDict> {
    let mut tensors = Vec::new();
    let mut by_name = HashMap::new();
    let mut metadata = BTreeMap::new();
    let mut files = Vec::with_capacity(opened.len());
    for shard in opened {
        let storage_kind = match shard.body {
            Body::Mapped(_) => StorageKind::Mapped,
            _ => StorageKind::Read,
        };
        let (storage, layout) = match shard.body {
            Body::Mapped(storage) => (storage, None),
            Body::Read { map, layout } => (
                Arc::new(Storage::new(map, shard.path.clone())),
                Some(layout),
            ),
            // `run_io` seals every buffer, or fails.
            Body::Unread | Body::Pending(_) | Body::Buffered { .. } | Body::Taken => continue,
        };
        let buffered = layout.is_some();
        let mut count = 0;
        let mut bytes = 0u64;
        let mut bytes_read = 0u64;
        let (mut converted, mut overflowed) = (0usize, 0u64);
        for (i, entry) in shard.header.tensors.iter().enumerate() {
            if !shard.selected.get(i).copied().unwrap_or(false) {
                continue;
            }
            // Where the tensor's bytes are: a converted part of its own, or
            // the file's storage; and the bytes read from the file for it.
            let converted_place = shard
                .convert
                .as_ref()
                .and_then(|part| Some((part, part.placements.get(i).copied().flatten()?)));
            let (dtype, holder, range, read) = if let Some((part, place)) = converted_place {
                let ConvertBuffer::Sealed(into) = &part.buffer else {
                    continue; // `read_all` seals every buffer, or fails
                };
                let len = entry.num_elements().unwrap_or(0) * (part.to.bitsize() / 8);
                let range = usize::try_from(place)
                    .ok()
                    .and_then(|s| Some(s..s.checked_add(len)?))
                    .filter(|r| r.end <= into.bytes().len());
                converted += 1;
                let read = !matches!(storage_kind, StorageKind::Mapped);
                (part.to, into, range, read)
            } else {
                let start = match &layout {
                    Some(layout) => layout.placements.get(i).copied().flatten(),
                    None => Some(shard.header.data_start + entry.start),
                };
                let range = start.and_then(|s| {
                    let s = usize::try_from(s).ok()?;
                    let e = s.checked_add(usize::try_from(entry.end - entry.start).ok()?)?;
                    (e <= storage.bytes().len()).then_some(s..e)
                });
                (entry.dtype, &storage, range, buffered)
            };
            let Some(range) = range else {
                return Err(size_mismatch(
                    &shard.path,
                    shard.header.file_len(),
                    shard.size,
                ));
            };
            count += 1;
            bytes += range.len() as u64;
            if read {
                bytes_read += entry.end - entry.start;
            }
            by_name.insert(entry.name.clone(), tensors.len());
            tensors.push(Tensor::new(
                Arc::from(entry.name.as_str()),
                dtype,
                entry.shape.clone(),
                Arc::clone(holder),
                range,
            ));
        }
        if let Some(part) = &shard.convert {
            overflowed = part.overflowed.load(Ordering::Relaxed);
        }
        if let Some(meta) = &shard.header.metadata {
            for (k, v) in meta {
                metadata.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let finished = shard.finished_at.load(Ordering::Relaxed);
        files.push(FileReport {
            path: shard.path,
            size: shard.size,
            tensors: count,
            tensor_bytes: bytes,
            bytes_read: if shard.populated {
                shard.size
            } else {
                bytes_read
            },
            converted,
            overflowed,
            direct_io: shard.decision.direct_io(),
            strategy: shard.decision.strategy,
            reason: shard.decision.to_string(),
            mount: shard.mount,
            elapsed: Duration::from_nanos(finished.saturating_sub(shard.opened_at)),
            metadata: shard.header.metadata,
            sha256: shard.sha256.as_ref().map(crate::verify::hex),
        });
    }
    Ok(StateDict {
        tensors,
        by_name,
        metadata,
        index_metadata: checkpoint.index.as_ref().and_then(|i| i.metadata.clone()),
        report: LoadReport {
            files,
            elapsed: clock.elapsed(),
            threads,
            io_concurrency,
            prefetch: None,
            notes: Vec::new(),
            io: None,
        },
    })
}
