//! The `--json` shapes: the library's reports in their `serde` schema (the library's `report` module docs, "JSON"), with what each command adds; one place to read what a script gets.
//!
//! `safeload load --json` prints the load's `LoadReport` as the library
//! serializes it, nothing added or renamed: the same document an engine
//! gets from `serde_json::to_string(sd.report())`. `inspect` lists each file
//! as that schema's file (`files`), with the tensors beside. Every key is
//! always present (`null` where a value does not apply), paths are strings
//! (lossy where not UTF-8), byte counts are integers, durations seconds as
//! floats. Rates (`gib_per_s`) are `null` where nothing was read: a lazily
//! mapped file is read after the load, when its pages are touched.

use std::collections::BTreeMap;
use std::path::Path;

use safeload::mount::{Mount, MountEntry, MountKind};
use safeload::report::{FileReport, Strategy};
use safeload::{AutoPolicy, Checkpoint};
use serde::Serialize;

/// `safeload inspect --json`.
#[derive(Serialize)]
pub struct Inspect<'a> {
    pub path: String,
    pub demo: bool,
    pub tensor_count: usize,
    pub tensor_bytes: u64,
    /// The files' `__metadata__` merged (the first file that sets a key wins).
    pub metadata: BTreeMap<String, String>,
    /// The sharded index's `metadata` object (values that are not strings
    /// as their JSON text).
    pub index_metadata: Option<BTreeMap<String, String>>,
    /// Each file as a load's report has it: totals, metadata, and how a load
    /// would read it (nothing read yet).
    pub files: &'a [FileReport],
    pub tensors: Vec<TensorEntry>,
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
    pub strategy: Strategy,
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
    pub kind: MountKind,
}

fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl<'a> Inspect<'a> {
    /// The JSON of an opened checkpoint.
    pub fn new(path: &Path, demo: bool, checkpoint: &'a Checkpoint) -> Inspect<'a> {
        Inspect {
            path: text(path),
            demo,
            tensor_count: checkpoint.len(),
            tensor_bytes: checkpoint.total_bytes(),
            metadata: checkpoint.metadata().clone(),
            index_metadata: checkpoint.index_metadata().cloned(),
            files: &checkpoint.report().files,
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
            strategy: policy.strategy,
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
            kind: entry.kind(),
        }
    }
}
