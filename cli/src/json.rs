//! The `--json` shapes, as plain structs built from the library's reports: one place to read what a script gets.
//!
//! Every key is always present (`null` where a value does not apply), paths
//! are strings (lossy where not UTF-8), byte counts are integers, times are
//! seconds as floats. Rates (`gib_per_s`) are `null` where nothing was read:
//! a lazily mapped file is read after the load, when its pages are touched.

use std::collections::BTreeMap;
use std::path::Path;

use safeload::mount::{Mount, MountEntry};
use safeload::{AutoPolicy, Checkpoint, FileReport, LoadReport, PrefetchReport, StateDict};
use serde::Serialize;

/// `safeload load --json`.
#[derive(Serialize)]
pub struct Load {
    pub path: String,
    pub demo: bool,
    pub tensor_count: usize,
    pub tensor_bytes: u64,
    pub bytes_read: u64,
    pub seconds: f64,
    pub gib_per_s: Option<f64>,
    pub threads: usize,
    pub io_concurrency: usize,
    /// The dtype floating tensors were converted to, where asked.
    pub dtype: Option<String>,
    pub overflowed: u64,
    pub prefetch: Option<Prefetch>,
    pub notes: Vec<String>,
    pub files: Vec<LoadedFile>,
}

/// One file of a load.
#[derive(Serialize)]
pub struct LoadedFile {
    pub path: String,
    pub size: u64,
    pub tensor_count: usize,
    pub tensor_bytes: u64,
    pub bytes_read: u64,
    pub strategy: &'static str,
    pub reason: String,
    pub direct_io: bool,
    /// Mapped and not read at load time.
    pub lazy: bool,
    pub seconds: f64,
    pub gib_per_s: Option<f64>,
    pub mount: Option<MountInfo>,
    pub sha256: Option<String>,
    pub converted: usize,
    pub overflowed: u64,
}

/// A filesystem, as a lookup found it.
#[derive(Serialize)]
pub struct MountInfo {
    pub kind: &'static str,
    pub fs_type: String,
    pub source: String,
    pub mount_point: String,
    pub detected_by: &'static str,
}

/// What a prefetch did (`load --json` with prefetch, `prefetch --json`).
#[derive(Serialize)]
pub struct Prefetch {
    pub ran: bool,
    pub reason: String,
    pub rank: usize,
    pub local_size: usize,
    pub rank_source: String,
    pub streams: usize,
    pub method: &'static str,
    pub shared_queue: bool,
    pub queue_path: Option<String>,
    pub queue_note: Option<String>,
    pub file_count: usize,
    pub total_bytes: u64,
    pub chunk_size: u64,
    pub chunks: usize,
    pub chunks_handled: usize,
    pub resident_before: u64,
    pub warmed: u64,
    pub reread: u64,
    pub skipped: u64,
    pub skip_reasons: Vec<String>,
    pub resident_after: Option<u64>,
    pub residency_known: bool,
    pub seconds: f64,
    /// Bytes this process read (warmed and re-read) per second.
    pub gib_per_s: Option<f64>,
}

/// `safeload inspect --json`.
#[derive(Serialize)]
pub struct Inspect {
    pub path: String,
    pub demo: bool,
    pub tensor_count: usize,
    pub tensor_bytes: u64,
    /// The files' `__metadata__` merged (the first file that sets a key wins).
    pub metadata: BTreeMap<String, String>,
    /// The sharded index's `metadata` object.
    pub index_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub files: Vec<InspectedFile>,
    pub tensors: Vec<TensorEntry>,
}

/// One file's totals, metadata, and how a load would read it.
#[derive(Serialize)]
pub struct InspectedFile {
    pub path: String,
    pub size: u64,
    pub tensor_count: usize,
    pub tensor_bytes: u64,
    pub metadata: Option<BTreeMap<String, String>>,
    pub strategy: &'static str,
    pub reason: String,
    pub mount: Option<MountInfo>,
}

/// One tensor, from its header.
#[derive(Serialize)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub nbytes: u64,
    pub file: String,
}

/// `safeload mounts --json`.
#[derive(Serialize)]
pub struct Mounts {
    pub path: String,
    pub mount: MountInfo,
    pub auto_policy: Policy,
    /// The variables set that a load follows instead of the auto policy.
    pub environment: Vec<Variable>,
    /// Every mount of the table, with `--all`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mounts: Option<Vec<TableEntry>>,
}

/// What the auto policy does with a file on a mount.
#[derive(Serialize)]
pub struct Policy {
    pub strategy: &'static str,
    pub reason: String,
    pub direct_io: bool,
    pub prefetch_streams: Option<usize>,
}

/// An environment variable and its value.
#[derive(Serialize)]
pub struct Variable {
    pub name: &'static str,
    pub value: String,
}

/// One line of the mount table.
#[derive(Serialize)]
pub struct TableEntry {
    pub mount_point: String,
    pub fs_type: String,
    pub source: String,
    pub kind: &'static str,
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

fn sorted(map: &std::collections::HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

impl Load {
    /// The JSON of a finished load.
    pub fn new(path: &Path, demo: bool, sd: &StateDict, dtype: Option<safeload::Dtype>) -> Load {
        let report: &LoadReport = sd.report();
        Load {
            path: text(path),
            demo,
            tensor_count: sd.len(),
            tensor_bytes: report.tensor_bytes(),
            bytes_read: report.bytes_read(),
            seconds: report.elapsed().as_secs_f64(),
            gib_per_s: report.gib_per_s(),
            threads: report.threads(),
            io_concurrency: report.io_concurrency(),
            dtype: dtype.map(|d| d.to_string()),
            overflowed: report.overflowed(),
            prefetch: report.prefetch().map(Prefetch::new),
            notes: report.notes().to_vec(),
            files: report.files().iter().map(LoadedFile::new).collect(),
        }
    }
}

impl LoadedFile {
    fn new(file: &FileReport) -> LoadedFile {
        LoadedFile {
            path: text(file.path()),
            size: file.size(),
            tensor_count: file.tensors(),
            tensor_bytes: file.tensor_bytes(),
            bytes_read: file.bytes_read(),
            strategy: file.strategy().as_str(),
            reason: file.reason().to_string(),
            direct_io: file.direct_io(),
            lazy: file.lazy(),
            seconds: file.elapsed().as_secs_f64(),
            gib_per_s: file.gib_per_s(),
            mount: file.mount().map(MountInfo::new),
            sha256: file.sha256().map(str::to_string),
            converted: file.converted(),
            overflowed: file.overflowed(),
        }
    }
}

impl MountInfo {
    /// The JSON of a lookup's answer.
    pub fn new(mount: &Mount) -> MountInfo {
        MountInfo {
            kind: mount.kind.as_str(),
            fs_type: mount.fs_type.clone(),
            source: mount.source.clone(),
            mount_point: text(&mount.mount_point),
            detected_by: mount.detected_by.as_str(),
        }
    }
}

impl Prefetch {
    /// The JSON of a prefetch report.
    pub fn new(report: &PrefetchReport) -> Prefetch {
        let seconds = report.elapsed().as_secs_f64();
        let read = report.warmed() + report.reread();
        Prefetch {
            ran: report.ran(),
            reason: report.reason().to_string(),
            rank: report.rank(),
            local_size: report.local_size(),
            rank_source: report.rank_source().to_string(),
            streams: report.streams(),
            method: report.method().as_str(),
            shared_queue: report.shared_queue(),
            queue_path: report.queue_path().map(text),
            queue_note: report.queue_note().map(str::to_string),
            file_count: report.files(),
            total_bytes: report.total_bytes(),
            chunk_size: report.chunk_size(),
            chunks: report.chunks(),
            chunks_handled: report.chunks_handled(),
            resident_before: report.resident_before(),
            warmed: report.warmed(),
            reread: report.reread(),
            skipped: report.skipped(),
            skip_reasons: report.skip_reasons().to_vec(),
            resident_after: report.resident_after(),
            residency_known: report.residency_known(),
            seconds,
            gib_per_s: (read > 0 && seconds > 0.0)
                .then(|| read as f64 / (1u64 << 30) as f64 / seconds),
        }
    }
}

impl Inspect {
    /// The JSON of an opened checkpoint.
    pub fn new(path: &Path, demo: bool, checkpoint: &Checkpoint) -> Inspect {
        let report = checkpoint.report();
        Inspect {
            path: text(path),
            demo,
            tensor_count: checkpoint.len(),
            tensor_bytes: checkpoint.total_bytes(),
            metadata: checkpoint.metadata().clone(),
            index_metadata: checkpoint.index_metadata().cloned(),
            files: report
                .files()
                .iter()
                .map(|file| InspectedFile {
                    path: text(file.path()),
                    size: file.size(),
                    tensor_count: file.tensors(),
                    tensor_bytes: file.tensor_bytes(),
                    metadata: file.metadata().map(sorted),
                    strategy: file.strategy().as_str(),
                    reason: file.reason().to_string(),
                    mount: file.mount().map(MountInfo::new),
                })
                .collect(),
            tensors: checkpoint
                .tensors()
                .map(|t| TensorEntry {
                    name: t.name().to_string(),
                    dtype: t.dtype().to_string(),
                    shape: t.shape().to_vec(),
                    nbytes: t.nbytes(),
                    file: text(t.file()),
                })
                .collect(),
        }
    }
}

impl Policy {
    /// The JSON of an auto decision.
    pub fn new(policy: &AutoPolicy) -> Policy {
        Policy {
            strategy: policy.strategy.as_str(),
            reason: policy.reason.clone(),
            direct_io: policy.direct_io,
            prefetch_streams: policy.prefetch_streams,
        }
    }
}

impl TableEntry {
    /// The JSON of a mount table line.
    pub fn new(entry: &MountEntry) -> TableEntry {
        TableEntry {
            mount_point: text(entry.mount_point()),
            fs_type: entry.fs_type().to_string(),
            source: entry.source().to_string(),
            kind: entry.kind().as_str(),
        }
    }
}
