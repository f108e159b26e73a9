//! `StateDict`: the loaded tensors in a deterministic order, the files' metadata, and the report of how each file was read.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::mount::Mount;
use crate::prefetch::PrefetchReport;
use crate::storage::Strategy;
use crate::tensor::Tensor;

/// The tensors of a checkpoint, in file order: shard by shard (sorted by
/// name), then by offset within each file.
///
/// Tensors share their file's storage, so a `StateDict` costs one copy of the
/// selected bytes at most (buffered), or none (mapped). It is `Send + Sync`,
/// and tensors taken out of it (cloned) stay valid after it is dropped.
#[derive(Debug, Clone)]
pub struct StateDict {
    pub(crate) tensors: Vec<Tensor>,
    pub(crate) by_name: HashMap<String, usize>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) index_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub(crate) report: LoadReport,
}

impl StateDict {
    /// The tensor called `name`, if loaded.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.by_name.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// Whether a tensor called `name` was loaded.
    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// `(name, tensor)` pairs in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Tensor)> + '_ {
        self.tensors.iter().map(|t| (t.name(), t))
    }

    /// The tensors in file order.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// Tensor names in file order.
    pub fn names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.tensors.iter().map(|t| t.name())
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no tensor was loaded.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The bytes of all tensors' data.
    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.len_bytes() as u64).sum()
    }

    /// The files' `__metadata__` entries merged (the first file that sets a
    /// key wins; shards normally agree, e.g. `{"format": "pt"}`). Each file's
    /// own is in [`FileReport::metadata`].
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The `metadata` object of the sharded index (e.g. `total_size`), for a
    /// sharded checkpoint that has one.
    pub fn index_metadata(&self) -> Option<&serde_json::Map<String, serde_json::Value>> {
        self.index_metadata.as_ref()
    }

    /// How each file was read, why, and how fast. `Display` prints it as a
    /// table; [`LoadReport::files`] gives it as data.
    pub fn report(&self) -> &LoadReport {
        &self.report
    }

    /// Takes the tensors out, in file order.
    pub fn into_tensors(self) -> Vec<Tensor> {
        self.tensors
    }
}

impl<'a> IntoIterator for &'a StateDict {
    type Item = (&'a str, &'a Tensor);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a Tensor)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// How a load went: one [`FileReport`] per file, and the totals.
#[derive(Debug, Clone, Default)]
pub struct LoadReport {
    pub(crate) files: Vec<FileReport>,
    pub(crate) elapsed: Duration,
    pub(crate) threads: usize,
    pub(crate) io_concurrency: usize,
    pub(crate) prefetch: Option<PrefetchReport>,
}

impl LoadReport {
    /// Per file, in load order.
    pub fn files(&self) -> &[FileReport] {
        &self.files
    }

    /// Wall time of the whole load.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Files opened and parsed at once.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Reads in flight at once for buffered files.
    pub fn io_concurrency(&self) -> usize {
        self.io_concurrency
    }

    /// What the page-cache prefetch before the load did and why: `Some`
    /// where it was asked for ([`Loader::prefetch`](crate::Loader::prefetch),
    /// `SAFELOAD_PREFETCH`) or considered by the auto policy (files on a
    /// network filesystem), also when it decided not to run.
    pub fn prefetch(&self) -> Option<&PrefetchReport> {
        self.prefetch.as_ref()
    }

    /// Bytes read into memory (buffered files).
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(|f| f.bytes_read).sum()
    }

    /// Bytes of tensor data loaded, read or mapped.
    pub fn tensor_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.tensor_bytes).sum()
    }

    /// Tensor bytes per second of wall time, in GiB/s.
    pub fn gib_per_s(&self) -> f64 {
        gib_per_s(self.tensor_bytes(), self.elapsed)
    }
}

fn gib_per_s(bytes: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 {
        bytes as f64 / (1u64 << 30) as f64 / secs
    } else {
        0.0
    }
}

/// How one file was read.
#[derive(Debug, Clone)]
pub struct FileReport {
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
    pub(crate) tensors: usize,
    pub(crate) tensor_bytes: u64,
    pub(crate) bytes_read: u64,
    pub(crate) direct_io: bool,
    pub(crate) strategy: Strategy,
    pub(crate) reason: String,
    pub(crate) mount: Option<Mount>,
    pub(crate) elapsed: Duration,
    pub(crate) metadata: Option<HashMap<String, String>>,
}

impl FileReport {
    /// The file's path, as opened (symlinks not resolved).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Tensors loaded from it (after the filter).
    pub fn tensors(&self) -> usize {
        self.tensors
    }

    /// Bytes of tensor data loaded from it (after the filter).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensor_bytes
    }

    /// Bytes read into memory: the tensor data for a buffered file, zero for
    /// a mapped one.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Whether its buffered reads bypassed the page cache (`O_DIRECT`).
    pub fn direct_io(&self) -> bool {
        self.direct_io
    }

    /// Whether it was mapped or read.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Why, in words.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The filesystem it lives on, where it could be found.
    pub fn mount(&self) -> Option<&Mount> {
        self.mount.as_ref()
    }

    /// From opening the file to its last byte read (buffered) or its map
    /// made (mapped).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Tensor bytes per second over [`elapsed`](Self::elapsed), in GiB/s.
    pub fn gib_per_s(&self) -> f64 {
        gib_per_s(self.tensor_bytes, self.elapsed)
    }

    /// The file's own `__metadata__`.
    pub fn metadata(&self) -> Option<&HashMap<String, String>> {
        self.metadata.as_ref()
    }
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "loaded {} tensor bytes from {} file(s) in {:.3} s ({:.2} GiB/s), {} file(s) at once, {} read(s) in flight",
            human_bytes(self.tensor_bytes()),
            self.files.len(),
            self.elapsed.as_secs_f64(),
            self.gib_per_s(),
            self.threads,
            self.io_concurrency,
        )?;
        if let Some(prefetch) = &self.prefetch {
            writeln!(f, "  {prefetch}")?;
        }
        for file in &self.files {
            writeln!(
                f,
                "  {}  {}  {} tensors, {}  {:.3} s  {:.2} GiB/s",
                file.path.display(),
                file.strategy,
                file.tensors,
                human_bytes(file.tensor_bytes),
                file.elapsed.as_secs_f64(),
                file.gib_per_s(),
            )?;
            let direct = if file.direct_io { " (O_DIRECT)" } else { "" };
            writeln!(f, "    {}{direct}: {}", file.strategy, file.reason)?;
        }
        Ok(())
    }
}

pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let name = UNITS.get(unit).copied().unwrap_or("B");
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {name}")
    }
}
