//! What a load did, as data and as text: per file the filesystem, strategy, reason, bytes and time, the typed reasons in words, byte and rate formatting (a prefetch's report in `prefetch.rs`, the node copy's in `node_copy.rs`, the notes in `note.rs`).
//!
//! A [`LoadReport`] holds one [`FileReport`] per file and, where one ran or was considered, a
//! [`PrefetchReport`]. Every decision in them is data, one enum per field, with `Display` for
//! its words and, where it has data, `as_str()` for a stable code.
//!
//! # JSON
//!
//! With the `serde` feature every report type is `serde::Serialize` (`safeload load --json`
//! prints the same document), under the Rust names:
//!
//! - each field under its own name, every key present (`null` for `None`); a duration in
//!   seconds, as a float; a path as a string (lossy where not UTF-8);
//! - beside the fields, what the type computes, under its method's name (`bytes_read`,
//!   `gib_per_s`, `explain`, `commit`, ...);
//! - an enum without data is its code (`Display` words), e.g. `"buffered"`; an enum with data
//!   is an object of its `code` (`as_str()`), its `text` (`Display`) and its fields by name;
//! - a [`ConcurrencyReason`]'s `tried` lists `[readers, GiB/s]` for each count tried.
//!
//! A complete document: local rank 1 of 3 that took the node copy of one file from rank 0 and
//! read the other alone, the prefetch asked for by `HF_SHARD_PREFETCH`:
//!
//! ```json
#![doc = include_str!("example.json")]
//! ```
//!
//! Parsed back, it branches on codes and fields; a load's own report has the same keys:
//!
//! ```
//! # #[cfg(feature = "serde")] {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.safetensors");
//! # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4], &[1, 2, 3, 4])?;
//! # safetensors::serialize_to_file([("w", view)], None, &path)?;
//! # const EXAMPLE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/src/report/example.json"));
//! # /// The keys of `example` and `real` are the same wherever both have an
//! # /// object (of the same variant, where it has a code); arrays by their
//! # /// first elements; a file's own metadata aside.
//! # fn same_keys(example: &Value, real: &Value, at: &str) {
//! #     match (example, real) {
//! #         (Value::Object(e), Value::Object(r)) => {
//! #             if e.get("code") != r.get("code") {
//! #                 return;
//! #             }
//! #             let keys = |m: &serde_json::Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
//! #             assert_eq!(keys(e), keys(r), "the keys of {at}");
//! #             for (k, v) in e.iter().filter(|(k, _)| *k != "metadata") {
//! #                 same_keys(v, &r[k], &format!("{at}.{k}"));
//! #             }
//! #         }
//! #         (Value::Array(e), Value::Array(r)) => {
//! #             if let (Some(e), Some(r)) = (e.first(), r.first()) {
//! #                 same_keys(e, r, &format!("{at}[0]"));
//! #             }
//! #         }
//! #         _ => {}
//! #     }
//! # }
//! use serde_json::Value;
//!
//! let example: Value = serde_json::from_str(EXAMPLE)?;
//! let copy = &example["files"][0]["node_copy"];
//! assert_eq!(copy["code"], "shared");
//! assert_eq!((copy["made_by_rank"].as_u64(), copy["received_from"].as_u64()), (Some(0), Some(4211)));
//! assert_eq!(example["files"][1]["node_copy"]["code"], "does_not_fit");
//! assert_eq!(example["notes"][0]["code"], "threads_refused");
//!
//! let sd = safeload::Loader::new().disable_mmap(true).prefetch(1).load(&path)?;
//! let report = serde_json::to_value(sd.report())?;
//! assert_eq!(report["files"][0]["tensors"], 1);
//! same_keys(&example, &report, "report");
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## A remote file's
//!
//! A file of a remote checkpoint (feature `remote`) has its `cache` ([`CacheUse`]), its hub
//! `commit` and its `etag`. A shard of `hf://` fetched and written to the hub cache (16 MiB
//! of it resumed), one read from the cache, and one fetched but not written:
//!
//! ```json
#![doc = include_str!("example_cache.json")]
//! ```
//!
//! A [`CacheUse`] is `hit`, `written` (with the bytes `resumed` and `refetched`), `checking`
//! (its digest still being checked) or `not_cached`, with its `store` ([`CacheStore`]: `hub` or
//! `directory`); a `not_cached`'s `why` ([`NotCached`]) is `partial`, `no_space`, `unwritable`,
//! `locked`, `published_elsewhere`, `mismatch`, `no_digest`, `other_rank`, `exchange` or
//! `cancelled`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

pub use crate::dest::pages::{FreshMemory, PageReason};
use crate::mount::Mount;
use crate::mount::MountKind;
pub use crate::policy::{DirectIo, Fallback, PrefetchMethod, Reason, Strategy};
pub use crate::progress::{Phase, Progress};
pub use crate::source::{CacheStore, CacheUse, NotCached};
pub use node_copy::NodeCopy;
pub use note::{ConcurrencyReason, CopyRemark, LoadNote};
pub use prefetch::{PrefetchReason, PrefetchReport, QueueNote, RankSource, SkipReason};

#[cfg(all(test, feature = "serde"))]
mod json_tests;
mod node_copy;
mod note;
mod prefetch;

use crate::policy::{DISABLE_MMAP_ENV, FileDecision, auto_rule};

reported! {
/// How a load went: one [`FileReport`] per file, and the totals. `Display` prints it for people.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let data = vec![0u8; 64 * 32 * 2];
/// # let mut weight_map = std::collections::BTreeMap::new();
/// # for i in 0..2 {
/// #     let (name, file) = (format!("model.layers.{i}.mlp.up.weight"), format!("model-0000{}-of-00002.safetensors", i + 1));
/// #     let view = safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![64, 32], &data)?;
/// #     safetensors::serialize_to_file([(name.as_str(), view)], None, &dir.path().join(&file))?;
/// #     weight_map.insert(name, file);
/// # }
/// # let index = dir.path().join("model.safetensors.index.json");
/// # std::fs::write(&index, serde_json::json!({ "weight_map": weight_map }).to_string())?;
/// use safeload::report::{DirectIo, Strategy};
///
/// let sd = safeload::Loader::new().disable_mmap(true).load(&index)?;
/// let report = sd.report();
/// assert_eq!(report.bytes_read(), report.tensor_bytes());
/// for file in &report.files {
///     assert_eq!(file.strategy, Strategy::Buffered);
///     eprintln!("{}: {} in {:?}, direct I/O {}", file.path.display(), file.explain(),
///         file.elapsed, file.direct_io == DirectIo::On);
/// }
/// eprintln!("{report}");                          // the table
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct LoadReport {
    /// Per file, in load order.
    pub files: Vec<FileReport>,
    /// Wall time of the whole load.
    pub elapsed: Duration => serialize_with = "crate::worded::seconds",
    /// Files opened and parsed at once.
    pub threads: usize,
    /// Reads in flight at once for buffered files: set (`Loader::io_concurrency`) or measured.
    pub io_concurrency: usize,
    /// How [`io_concurrency`](Self::io_concurrency) was found; `None` where nothing was read.
    pub io_concurrency_reason: Option<ConcurrencyReason>,
    /// What the page-cache prefetch before the load did and why, where it was asked for or
    /// considered (files on a network filesystem), also when it did not run.
    pub prefetch: Option<PrefetchReport>,
    /// How the memory buffered reads landed in was faulted in (`Loader::huge_pages`); `None`
    /// where nothing was read into memory of the load's own.
    pub fresh_memory: Option<FreshMemory>,
    /// What the load could not do as planned and did otherwise; empty when all went to plan.
    pub notes: Vec<LoadNote>,
    /// The repository's other files brought into the hub cache beside the weights
    /// (`hf://org/repo?with=engine`): by name, its path in the weights' snapshot, or `None`
    /// where the repository (or the cache) has none.
    pub extra_files: BTreeMap<String, Option<PathBuf>> => serialize_with = "crate::worded::path_map",
}
computed { bytes_read: u64, tensor_bytes: u64, overflowed: u64, gib_per_s: Option<f64>,
    commit: Option<&'a str> }
}

impl LoadReport {
    /// Values that became infinite when converted, over all files.
    pub fn overflowed(&self) -> u64 {
        self.files.iter().map(|f| f.overflowed).sum()
    }

    /// Bytes read into memory (buffered files).
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(|f| f.bytes_read).sum()
    }

    /// Bytes of tensor data loaded, read or mapped.
    pub fn tensor_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.tensor_bytes).sum()
    }

    /// Bytes read per second of wall time, in GiB/s: `None` where the load read nothing (every
    /// file mapped lazily).
    pub fn gib_per_s(&self) -> Option<f64> {
        gib_per_s(self.bytes_read(), self.elapsed)
    }

    /// The hub [`commit`](FileReport::commit) every file is at; `None` where a file has none,
    /// files disagree, or there is no file.
    pub fn commit(&self) -> Option<&str> {
        let (first, rest) = self.files.split_first()?;
        let commit = first.commit.as_deref()?;
        rest.iter()
            .all(|f| f.commit.as_deref() == Some(commit))
            .then_some(commit)
    }
}

fn gib_per_s(bytes: u64, elapsed: Duration) -> Option<f64> {
    let secs = elapsed.as_secs_f64();
    (bytes > 0 && secs > 0.0).then(|| bytes as f64 / (1u64 << 30) as f64 / secs)
}

reported! {
/// How one file was read: what, how, why and how fast.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FileReport {
    /// The file's path, as opened (symlinks not resolved).
    pub path: PathBuf => serialize_with = "crate::worded::path_text",
    /// The file's size in bytes.
    pub size: u64,
    /// Tensors loaded from it (after the filter).
    pub tensors: usize,
    /// Bytes of tensor data loaded from it (after the filter).
    pub tensor_bytes: u64,
    /// Bytes read at load time (the whole file where a map was populated; of a node copy, the
    /// chunks this rank filled); zero for a file mapped lazily.
    pub bytes_read: u64,
    /// Whether it was mapped or read.
    pub strategy: Strategy,
    /// The rule that chose the strategy first.
    pub reason: Reason,
    /// What overrode that choice, if anything.
    pub fallback: Option<Fallback>,
    /// Whether its buffered reads bypassed the page cache, or why not.
    pub direct_io: DirectIo,
    /// The filesystem it lives on, where it could be found.
    pub mount: Option<Mount>,
    /// From opening the file to its last byte read or its map made.
    pub elapsed: Duration => serialize_with = "crate::worded::seconds",
    /// Tensors converted to another dtype while loading (`Loader::dtype`).
    pub converted: usize,
    /// Values that were finite in the file and became infinite when converted.
    pub overflowed: u64,
    /// The file's SHA-256 in lowercase hex, where the load computed it (`Loader::verify`),
    /// checked against the one expected, if any.
    pub sha256: Option<String>,
    /// The file's own `__metadata__`.
    pub metadata: Option<BTreeMap<String, String>>,
    /// What the node copy did for it, where several local ranks loaded it read buffered.
    pub node_copy: Option<NodeCopy>,
    /// What the cache did for it, where it came through one (feature `remote`).
    pub cache: Option<CacheUse>,
    /// The hub commit the file is at (`hf://`): what an engine pins its next start to.
    pub commit: Option<String>,
    /// The entity tag of a remote object: the version every read required.
    pub etag: Option<String>,
}
computed { explain: String, gib_per_s: Option<f64>, lazy: bool }
}

impl FileReport {
    /// Why the file was read as it was, in words, e.g. `on hf-mount (fuse) at /mnt/hub — mmap
    /// page faults stall on FUSE`.
    pub fn explain(&self) -> String {
        explain(
            &self.reason,
            self.fallback.as_ref(),
            &self.direct_io,
            self.mount.as_ref(),
        )
    }

    /// Bytes read per second over [`elapsed`](Self::elapsed), in GiB/s; `None` for none.
    pub fn gib_per_s(&self) -> Option<f64> {
        gib_per_s(self.bytes_read, self.elapsed)
    }

    /// Whether the file was mapped and not read at load time.
    pub fn lazy(&self) -> bool {
        self.strategy == Strategy::Mmap && self.bytes_read == 0
    }
}

/// A file's lines of the report's table; its commit where it is not the load's.
fn file_lines(
    f: &mut fmt::Formatter<'_>,
    file: &FileReport,
    load_commit: Option<&str>,
) -> fmt::Result {
    write!(
        f,
        "  {}  {}  {} tensors, {}",
        file.path.display(),
        file.strategy,
        file.tensors,
        human_bytes(file.tensor_bytes),
    )?;
    match file.gib_per_s() {
        Some(rate) => writeln!(
            f,
            "  {} read in {:.3} s  {rate:.2} GiB/s",
            human_bytes(file.bytes_read),
            file.elapsed.as_secs_f64()
        )?,
        None if matches!(file.node_copy, Some(NodeCopy::Shared { .. })) => {
            writeln!(f, "  views of the node copy")?
        }
        None => writeln!(f, "  mapped (pages are read when first touched)")?,
    }
    let direct = if file.direct_io == DirectIo::On {
        " (O_DIRECT)"
    } else {
        ""
    };
    writeln!(f, "    {}{direct}: {}", file.strategy, file.explain())?;
    if let Some(note) = &file.node_copy {
        writeln!(f, "    node copy: {note}")?;
    }
    if let Some(cache) = &file.cache {
        writeln!(f, "    {cache}")?;
    }
    match (&file.commit, &file.etag) {
        (Some(commit), _) if load_commit == Some(commit.as_str()) => {}
        (Some(commit), _) => writeln!(f, "    at commit {commit}")?,
        (None, Some(etag)) => writeln!(f, "    etag {etag}")?,
        (None, None) => {}
    }
    if file.converted > 0 {
        writeln!(
            f,
            "    {} tensor(s) converted, {} value(s) became infinite",
            file.converted, file.overflowed
        )?;
    }
    if let Some(sha) = &file.sha256 {
        writeln!(f, "    sha256 {sha}")?;
    }
    Ok(())
}

impl fmt::Display for LoadReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loaded {} tensor bytes from {} file(s) in {:.3} s",
            human_bytes(self.tensor_bytes()),
            self.files.len(),
            self.elapsed.as_secs_f64(),
        )?;
        match self.gib_per_s() {
            Some(rate) => write!(
                f,
                ", {} read at {rate:.2} GiB/s",
                human_bytes(self.bytes_read())
            )?,
            None => write!(f, ", nothing read (mapped)")?,
        }
        match &self.io_concurrency_reason {
            Some(io) => writeln!(f, "; {} file(s) at once, {io}", self.threads)?,
            None => writeln!(f, "; {} file(s) at once", self.threads)?,
        }
        if let Some(prefetch) = &self.prefetch {
            writeln!(f, "  {prefetch}")?;
        }
        if let Some(fresh) = &self.fresh_memory {
            writeln!(f, "  {fresh}")?;
        }
        for note in &self.notes {
            writeln!(f, "  note: {note}")?;
        }
        let commit = self.commit();
        if let Some(commit) = commit {
            writeln!(f, "  at commit {commit}")?;
        }
        for (name, path) in &self.extra_files {
            match path {
                Some(path) => writeln!(f, "  with {name}: {}", path.display())?,
                None => writeln!(f, "  with {name}: not in the repository at this commit")?,
            }
        }
        for file in &self.files {
            file_lines(f, file, commit)?;
        }
        Ok(())
    }
}

#[doc(hidden)]
pub fn human_bytes(bytes: u64) -> String {
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

impl fmt::Display for FileDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&explain(
            &self.reason(),
            self.fallback.as_ref(),
            &self.direct,
            self.mount.as_ref(),
        ))
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Auto { kind } => f.write_str(auto_rule(*kind).1),
            Reason::Requested { disable_mmap } => {
                write!(f, "disable_mmap({disable_mmap}) was requested")
            }
            Reason::Environment { disable_mmap } => {
                write!(f, "{DISABLE_MMAP_ENV}={} is set", u8::from(*disable_mmap))
            }
            Reason::Remote => f.write_str("a remote object, read into memory (no file to map)"),
        }
    }
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::MmapRefused { error: e } => write!(f, "mmap failed ({e}), read instead"),
            Fallback::MemoryGuard {
                needed,
                available,
                kept,
                files,
            } => write!(
                f,
                "buffered reads would need {} (margin included) but {} of memory is available, \
                 mapped instead ({kept} of {files} files read)",
                human_bytes(*needed),
                human_bytes(*available)
            ),
        }
    }
}

impl fmt::Display for DirectIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DirectIo::Off => f.write_str("off"),
            DirectIo::On => f.write_str("on"),
            DirectIo::Refused { error: e } => write!(f, "O_DIRECT refused ({e})"),
            DirectIo::Dropped { why } => write!(f, "direct I/O dropped: {why}"),
        }
    }
}

/// A file's reason in one line: the fallback, the rule and where, what became of direct I/O.
fn explain(
    reason: &Reason,
    fallback: Option<&Fallback>,
    direct: &DirectIo,
    mount: Option<&Mount>,
) -> String {
    let mut out = String::new();
    if let Some(fallback) = fallback {
        out.push_str(&format!("{fallback}; "));
    }
    match (reason, mount) {
        (Reason::Auto { .. }, None) => out.push_str("filesystem unknown — mapping is the default"),
        (Reason::Auto { .. }, Some(m)) => out.push_str(&format!("{} — {reason}", describe(m))),
        (_, None) => out.push_str(&reason.to_string()),
        (_, Some(m)) => out.push_str(&format!("{reason} ({})", describe(m))),
    }
    if matches!(direct, DirectIo::Refused { .. } | DirectIo::Dropped { .. }) {
        out.push_str(&format!("; {direct}"));
    }
    out
}

/// `on hf-mount (fuse) at /mnt/hub`: a mount in words, for reasons.
pub(crate) fn describe(mount: &Mount) -> String {
    let kind = match mount.kind {
        MountKind::HfMount => "hf-mount",
        MountKind::Fuse => "FUSE",
        MountKind::Network => "network filesystem",
        MountKind::Local => "local filesystem",
        _ => "filesystem",
    };
    if mount.mount_point.as_os_str().is_empty() {
        format!("on {kind} ({})", mount.fs_type)
    } else {
        format!(
            "on {kind} ({}) at {}",
            mount.fs_type,
            mount.mount_point.display()
        )
    }
}
