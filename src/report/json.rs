//! `serde::Serialize` for the reports and mounts (feature `serde`), in the schema the CLI's `--json` prints: every key always present, paths as strings, times in seconds, each reason as a stable code beside its words.
//!
//! The shapes are written out here, as borrowed views derived with serde,
//! rather than derived on the report types: the JSON names its keys for
//! scripts (`tensor_count`, `seconds`) and adds what a script needs and the
//! types only compute (`explain()`, `gib_per_s()`, `lazy()`), while the
//! types stay plain data for Rust callers.

use std::path::Path;

use serde::ser::{Serialize, Serializer};

use super::{DirectIo, Fallback, FileReport, LoadReport, PrefetchReport, SkipReason, Strategy};
use super::{FreshMemory, RankSource};
use crate::mount::{Detection, Mount, MountKind};
use crate::policy::PrefetchMethod;

/// A path as a string (lossy where not UTF-8).
fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl Serialize for LoadReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            tensor_bytes: u64,
            bytes_read: u64,
            seconds: f64,
            gib_per_s: Option<f64>,
            threads: usize,
            io_concurrency: usize,
            io_concurrency_reason: &'a Option<String>,
            overflowed: u64,
            prefetch: &'a Option<PrefetchReport>,
            fresh_memory: &'a Option<FreshMemory>,
            notes: &'a [String],
            files: &'a [FileReport],
        }
        View {
            tensor_bytes: self.tensor_bytes(),
            bytes_read: self.bytes_read(),
            seconds: self.elapsed.as_secs_f64(),
            gib_per_s: self.gib_per_s(),
            threads: self.threads,
            io_concurrency: self.io_concurrency,
            io_concurrency_reason: &self.io_concurrency_reason,
            overflowed: self.overflowed(),
            prefetch: &self.prefetch,
            fresh_memory: &self.fresh_memory,
            notes: &self.notes,
            files: &self.files,
        }
        .serialize(serializer)
    }
}

impl Serialize for FreshMemory {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View {
            /// `auto`, `on` or `off`.
            mode: &'static str,
            /// Why, in words.
            reason: String,
            /// `caller`, `environment`, `unavailable` or `measured`.
            reason_code: &'static str,
            huge_bytes: u64,
            base_bytes: u64,
            huge_gib_s: Option<f64>,
            base_gib_s: Option<f64>,
        }
        View {
            mode: self.mode.as_str(),
            reason: self.reason.to_string(),
            reason_code: self.reason.as_str(),
            huge_bytes: self.huge_bytes,
            base_bytes: self.base_bytes,
            huge_gib_s: self.huge_gib_s,
            base_gib_s: self.base_gib_s,
        }
        .serialize(serializer)
    }
}

impl Serialize for FileReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            path: String,
            size: u64,
            tensor_count: usize,
            tensor_bytes: u64,
            bytes_read: u64,
            strategy: Strategy,
            /// The whole reason in words.
            reason: String,
            /// The rule's stable name: `auto`, `requested`, `environment`.
            reason_code: &'static str,
            /// What overrode it: `mmap_refused`, `memory_guard`, or null.
            fallback: Option<&'static str>,
            direct_io: bool,
            /// `off`, `on`, `refused` or `dropped`.
            direct_io_state: &'static str,
            lazy: bool,
            seconds: f64,
            gib_per_s: Option<f64>,
            mount: &'a Option<Mount>,
            sha256: &'a Option<String>,
            converted: usize,
            overflowed: u64,
            /// What the node copy did, in words, where several local ranks
            /// loaded the file.
            node_copy: &'a Option<String>,
        }
        View {
            path: text(&self.path),
            size: self.size,
            tensor_count: self.tensors,
            tensor_bytes: self.tensor_bytes,
            bytes_read: self.bytes_read,
            strategy: self.strategy,
            reason: self.explain(),
            reason_code: self.reason.as_str(),
            fallback: self.fallback.as_ref().map(|f| match f {
                Fallback::MmapRefused(_) => "mmap_refused",
                Fallback::MemoryGuard { .. } => "memory_guard",
            }),
            direct_io: self.direct_io == DirectIo::On,
            direct_io_state: match self.direct_io {
                DirectIo::Off => "off",
                DirectIo::On => "on",
                DirectIo::Refused(_) => "refused",
                DirectIo::Dropped(_) => "dropped",
            },
            lazy: self.lazy(),
            seconds: self.elapsed.as_secs_f64(),
            gib_per_s: self.gib_per_s(),
            mount: &self.mount,
            sha256: &self.sha256,
            converted: self.converted,
            overflowed: self.overflowed,
            node_copy: &self.node_copy,
        }
        .serialize(serializer)
    }
}

impl Serialize for PrefetchReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            ran: bool,
            reason: &'a str,
            rank: usize,
            local_size: usize,
            /// In words, e.g. `LOCAL_RANK=1 LOCAL_WORLD_SIZE=8 (torchrun)`.
            rank_source: String,
            /// `caller`, `launcher` or `alone`.
            rank_source_code: &'static str,
            streams: usize,
            method: PrefetchMethod,
            shared_queue: bool,
            queue_path: Option<String>,
            queue_note: &'a Option<String>,
            file_count: usize,
            total_bytes: u64,
            chunk_size: u64,
            chunks: usize,
            chunks_handled: usize,
            resident_before: u64,
            warmed: u64,
            reread: u64,
            skipped: u64,
            /// In words.
            skip_reasons: Vec<String>,
            /// Each reason's stable name: `memory_guard`, `read_by_this_rank`, `stalled`.
            skip_reason_codes: Vec<&'static str>,
            resident_after: Option<u64>,
            residency_known: bool,
            seconds: f64,
            /// Bytes this process read (warmed and re-read) per second.
            gib_per_s: Option<f64>,
        }
        View {
            ran: self.ran,
            reason: &self.reason,
            rank: self.rank,
            local_size: self.local_size,
            rank_source: self.rank_source.to_string(),
            rank_source_code: match self.rank_source {
                RankSource::Caller { .. } => "caller",
                RankSource::Launcher { .. } => "launcher",
                RankSource::Alone => "alone",
            },
            streams: self.streams,
            method: self.method,
            shared_queue: self.shared_queue,
            queue_path: self.queue_path.as_deref().map(text),
            queue_note: &self.queue_note,
            file_count: self.files,
            total_bytes: self.total_bytes,
            chunk_size: self.chunk_size,
            chunks: self.chunks,
            chunks_handled: self.chunks_handled,
            resident_before: self.resident_before,
            warmed: self.warmed,
            reread: self.reread,
            skipped: self.skipped,
            skip_reasons: self.skip_reasons.iter().map(ToString::to_string).collect(),
            skip_reason_codes: self
                .skip_reasons
                .iter()
                .map(|r| match r {
                    SkipReason::MemoryGuard { .. } => "memory_guard",
                    SkipReason::ReadByThisRank { .. } => "read_by_this_rank",
                    SkipReason::Stalled { .. } => "stalled",
                })
                .collect(),
            resident_after: self.resident_after,
            residency_known: self.residency_known,
            seconds: self.elapsed.as_secs_f64(),
            gib_per_s: super::gib_per_s(self.warmed + self.reread, self.elapsed),
        }
        .serialize(serializer)
    }
}

impl Serialize for Mount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            kind: MountKind,
            fs_type: &'a str,
            source: &'a str,
            mount_point: String,
            detected_by: Detection,
        }
        View {
            kind: self.kind,
            fs_type: &self.fs_type,
            source: &self.source,
            mount_point: text(&self.mount_point),
            detected_by: self.detected_by,
        }
        .serialize(serializer)
    }
}

/// The enums whose JSON is their stable name (`as_str`).
macro_rules! as_str {
    ($($ty:ty),*) => {$(
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    )*};
}

as_str!(Strategy, MountKind, Detection, PrefetchMethod);
