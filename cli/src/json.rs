//! The `--json` shapes: the library's reports in their `serde` schema, with what each command adds; one place to read what a script gets.
//!
//! Every key is always present (`null` where a value does not apply), paths
//! are strings (lossy where not UTF-8), byte counts are integers, times are
//! seconds as floats. Rates (`gib_per_s`) are `null` where nothing was read:
//! a lazily mapped file is read after the load, when its pages are touched.

use std::collections::BTreeMap;
use std::path::Path;

use safeload::mount::{Mount, MountEntry};
use safeload::report::Strategy;
use safeload::{AutoPolicy, Checkpoint, LoadReport, StateDict};
use serde::Serialize;

/// `safeload load --json`: the library's report (its `serde` schema),
/// with what the command knows beside it.
#[derive(Serialize)]
pub struct Load<'a> {
    pub path: String,
    pub demo: bool,
    pub tensor_count: usize,
    /// The dtype floating tensors were converted to, where asked.
    pub dtype: Option<String>,
    #[serde(flatten)]
    pub report: &'a LoadReport,
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
    /// The sharded index's `metadata` object (values that are not strings
    /// as their JSON text).
    pub index_metadata: Option<BTreeMap<String, String>>,
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
    pub strategy: Strategy,
    pub reason: String,
    pub reason_code: &'static str,
    pub mount: Option<Mount>,
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
    pub mount: Mount,
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

impl<'a> Load<'a> {
    /// The JSON of a finished load.
    pub fn new(
        path: &Path,
        demo: bool,
        sd: &'a StateDict,
        dtype: Option<safeload::Dtype>,
    ) -> Load<'a> {
        Load {
            path: text(path),
            demo,
            tensor_count: sd.len(),
            dtype: dtype.map(|d| d.to_string()),
            report: sd.report(),
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
                .files
                .iter()
                .map(|file| InspectedFile {
                    path: text(&file.path),
                    size: file.size,
                    tensor_count: file.tensors,
                    tensor_bytes: file.tensor_bytes,
                    metadata: file.metadata.clone(),
                    strategy: file.strategy,
                    reason: file.explain(),
                    reason_code: file.reason.as_str(),
                    mount: file.mount.clone(),
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
