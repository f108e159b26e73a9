//! `serde::Serialize` for the reports and mounts (feature `serde`): one schema, the Rust names (the `report` module's "JSON" section), also what the CLI's `--json` prints.
//!
//! The plain types derive theirs where they are defined (with serde's
//! attributes: a path as lossy text, an enum without data as its code).
//! Written out here are the two shapes serde's derive cannot give: a report
//! whose computed values (`gib_per_s()`, `explain()`, `lazy()`, the totals)
//! sit beside its fields under their method's name, and an enum with data
//! as an object of its `code` (`as_str()`), its `text` (`Display`, no field
//! of the enum) and its data by field name.

use std::path::Path;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::{
    CacheUse, ConcurrencyReason, CopyRemark, DirectIo, Fallback, FileReport, FreshMemory, LoadNote,
    LoadReport, NodeCopy, PrefetchReason, PrefetchReport, QueueNote, RankSource, Reason,
    SkipReason, Strategy,
};
use crate::mount::Mount;
use crate::policy::PrefetchMethod;

/// A path as a string (lossy where not UTF-8).
fn text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// A value of an enum's data, for [`tagged`].
fn value<T: Serialize + ?Sized, E: serde::ser::Error>(data: &T) -> Result<Value, E> {
    serde_json::to_value(data).map_err(E::custom)
}

/// The enum's data by field name: `fields!(s; a, b)` for fields bound by
/// those names.
macro_rules! fields {
    ($s:ty; $($name:ident),* $(,)?) => {
        vec![$((stringify!($name), value::<_, <$s as Serializer>::Error>($name)?)),*]
    };
}

/// An enum as the schema has it: `{"code": .., "text": .., <data>}`.
fn tagged<S: Serializer>(
    serializer: S,
    code: &str,
    words: String,
    data: Vec<(&'static str, Value)>,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(2 + data.len()))?;
    map.serialize_entry("code", code)?;
    map.serialize_entry("text", &words)?;
    for (name, value) in &data {
        map.serialize_entry(name, value)?;
    }
    map.end()
}

impl Serialize for LoadReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            files: &'a [FileReport],
            elapsed: f64,
            threads: usize,
            io_concurrency: usize,
            io_concurrency_reason: &'a Option<ConcurrencyReason>,
            prefetch: &'a Option<PrefetchReport>,
            fresh_memory: &'a Option<FreshMemory>,
            notes: &'a [LoadNote],
            bytes_read: u64,
            tensor_bytes: u64,
            overflowed: u64,
            gib_per_s: Option<f64>,
        }
        View {
            files: &self.files,
            elapsed: self.elapsed.as_secs_f64(),
            threads: self.threads,
            io_concurrency: self.io_concurrency,
            io_concurrency_reason: &self.io_concurrency_reason,
            prefetch: &self.prefetch,
            fresh_memory: &self.fresh_memory,
            notes: &self.notes,
            bytes_read: self.bytes_read(),
            tensor_bytes: self.tensor_bytes(),
            overflowed: self.overflowed(),
            gib_per_s: self.gib_per_s(),
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
            tensors: usize,
            tensor_bytes: u64,
            bytes_read: u64,
            strategy: Strategy,
            reason: &'a Reason,
            fallback: &'a Option<Fallback>,
            direct_io: &'a DirectIo,
            mount: &'a Option<Mount>,
            elapsed: f64,
            converted: usize,
            overflowed: u64,
            sha256: &'a Option<String>,
            metadata: &'a Option<std::collections::BTreeMap<String, String>>,
            node_copy: &'a Option<NodeCopy>,
            cache: &'a Option<CacheUse>,
            commit: &'a Option<String>,
            etag: &'a Option<String>,
            explain: String,
            gib_per_s: Option<f64>,
            lazy: bool,
        }
        View {
            path: text(&self.path),
            size: self.size,
            tensors: self.tensors,
            tensor_bytes: self.tensor_bytes,
            bytes_read: self.bytes_read,
            strategy: self.strategy,
            reason: &self.reason,
            fallback: &self.fallback,
            direct_io: &self.direct_io,
            mount: &self.mount,
            elapsed: self.elapsed.as_secs_f64(),
            converted: self.converted,
            overflowed: self.overflowed,
            sha256: &self.sha256,
            metadata: &self.metadata,
            node_copy: &self.node_copy,
            cache: &self.cache,
            commit: &self.commit,
            etag: &self.etag,
            explain: self.explain(),
            gib_per_s: self.gib_per_s(),
            lazy: self.lazy(),
        }
        .serialize(serializer)
    }
}

impl Serialize for PrefetchReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            ran: bool,
            reason: &'a PrefetchReason,
            rank: usize,
            local_size: usize,
            rank_source: &'a RankSource,
            streams: usize,
            method: PrefetchMethod,
            shared_queue: bool,
            queue_note: &'a Option<QueueNote>,
            files: usize,
            total_bytes: u64,
            chunk_size: u64,
            chunks: usize,
            chunks_handled: usize,
            resident_before: u64,
            warmed: u64,
            reread: u64,
            skipped: u64,
            skip_reasons: &'a [SkipReason],
            resident_after: Option<u64>,
            residency_known: bool,
            elapsed: f64,
            gib_per_s: Option<f64>,
        }
        View {
            ran: self.ran,
            reason: &self.reason,
            rank: self.rank,
            local_size: self.local_size,
            rank_source: &self.rank_source,
            streams: self.streams,
            method: self.method,
            shared_queue: self.shared_queue,
            queue_note: &self.queue_note,
            files: self.files,
            total_bytes: self.total_bytes,
            chunk_size: self.chunk_size,
            chunks: self.chunks,
            chunks_handled: self.chunks_handled,
            resident_before: self.resident_before,
            warmed: self.warmed,
            reread: self.reread,
            skipped: self.skipped,
            skip_reasons: &self.skip_reasons,
            resident_after: self.resident_after,
            residency_known: self.residency_known,
            elapsed: self.elapsed.as_secs_f64(),
            gib_per_s: self.gib_per_s(),
        }
        .serialize(serializer)
    }
}

impl Serialize for Reason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            Reason::Auto(kind) => fields!(S; kind),
            Reason::Requested { disable_mmap } | Reason::Environment { disable_mmap } => {
                fields!(S; disable_mmap)
            }
            Reason::Remote => Vec::new(),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for Fallback {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            Fallback::MmapRefused(error) => fields!(S; error),
            Fallback::MemoryGuard {
                needed,
                available,
                kept,
                files,
            } => fields!(S; needed, available, kept, files),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for DirectIo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            DirectIo::Off | DirectIo::On => Vec::new(),
            DirectIo::Refused(error) => fields!(S; error),
            DirectIo::Dropped(why) => fields!(S; why),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for RankSource {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            RankSource::Caller { valid } => fields!(S; valid),
            RankSource::Launcher {
                launcher,
                rank_var,
                rank,
                size_var,
                size,
                valid,
            } => fields!(S; launcher, rank_var, rank, size_var, size, valid),
            RankSource::Alone => Vec::new(),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for SkipReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            SkipReason::MemoryGuard {
                needed,
                budget,
                available,
                resident,
                total,
                skipped,
            } => fields!(S; needed, budget, available, resident, total, skipped),
            SkipReason::ReadByThisRank { bytes, files } => fields!(S; bytes, files),
            SkipReason::Stalled {
                seconds,
                chunks,
                pids,
            } => fields!(S; seconds, chunks, pids),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for NodeCopy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            NodeCopy::Shared {
                made_by_pid,
                made_by_rank,
                received_from,
                filled_here,
                chunks,
                by_exchange,
                bytes,
                ranks,
                remarks,
            } => fields!(S;
                made_by_pid, made_by_rank, received_from, filled_here, chunks, by_exchange,
                bytes, ranks, remarks,
            ),
            NodeCopy::Filtered
            | NodeCopy::Converting
            | NodeCopy::Unaligned
            | NodeCopy::NoIdentity
            | NodeCopy::LeftOut => Vec::new(),
            NodeCopy::TooManyFiles { most } => fields!(S; most),
            NodeCopy::DoesNotFit { needed, available } => fields!(S; needed, available),
            NodeCopy::Failed { why } => fields!(S; why),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for LoadNote {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            LoadNote::ThreadsRefused {
                work,
                started,
                requested,
                error,
            } => fields!(S; work, started, requested, error),
            LoadNote::RangesIgnored { files } => fields!(S; files),
            LoadNote::ReadOncePerCluster {
                node,
                nodes,
                read,
                total,
            } => fields!(S; node, nodes, read, total),
            LoadNote::NodesReadAlone { why } => fields!(S; why),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for ConcurrencyReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            ConcurrencyReason::Set { readers } | ConcurrencyReason::Unmeasured { readers } => {
                fields!(S; readers)
            }
            ConcurrencyReason::Settled { readers, tried }
            | ConcurrencyReason::AtMost { readers, tried }
            | ConcurrencyReason::UntilEnd { readers, tried } => fields!(S; readers, tried),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for PrefetchReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            PrefetchReason::Requested { streams } => fields!(S; streams),
            PrefetchReason::FromEnvironment { variable, streams } => fields!(S; variable, streams),
            PrefetchReason::Off => Vec::new(),
            PrefetchReason::Auto {
                mount,
                needed,
                total,
            } => fields!(S; mount, needed, total),
            PrefetchReason::AutoResident { mount } | PrefetchReason::AutoDoesNotFit { mount } => {
                fields!(S; mount)
            }
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for QueueNote {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            QueueNote::FixedShares => Vec::new(),
            QueueNote::NotShared { path, why } => {
                let path = &text(path);
                fields!(S; path, why)
            }
            QueueNote::Replaced { why } => fields!(S; why),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

impl Serialize for CopyRemark {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            CopyRemark::OfferRefused { pid, uid } => fields!(S; pid, uid),
            CopyRemark::HolderFailed { pid, why } => fields!(S; pid, why),
            CopyRemark::NotHandedOut { why } => fields!(S; why),
            CopyRemark::QueueNotShared { path, why } => {
                let path = &text(path);
                fields!(S; path, why)
            }
            CopyRemark::FinishedAfterStall { chunks } => fields!(S; chunks),
            CopyRemark::DeadJobsRemoved { files } => fields!(S; files),
            CopyRemark::ForeignName {
                name,
                kind,
                uid,
                this_user,
            } => fields!(S; name, kind, uid, this_user),
            CopyRemark::MoreForeignNames { count } => fields!(S; count),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::mount::{Detection, MountKind};

    /// Per code, the keys of the objects that carry it in `value`.
    fn codes(value: &Value, out: &mut BTreeMap<String, Vec<String>>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(code)) = map.get("code") {
                    out.insert(code.clone(), map.keys().cloned().collect());
                }
                map.values().for_each(|v| codes(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| codes(v, out)),
            _ => {}
        }
    }

    /// Every typed object of the documented example has the keys this
    /// module gives a value of its variant.
    #[test]
    fn the_documented_example_has_the_keys_of_each_variant() {
        let example: Value = serde_json::from_str(include_str!("example.json")).unwrap();
        let mut documented = BTreeMap::new();
        codes(&example, &mut documented);
        let mount = Mount {
            source: "hf-mount".into(),
            mount_point: "/mnt/hub".into(),
            fs_type: "fuse".into(),
            kind: MountKind::HfMount,
            detected_by: Detection::Device,
        };
        let values: Vec<Value> = [
            serde_json::to_value(Reason::Auto(MountKind::HfMount)),
            serde_json::to_value(DirectIo::On),
            serde_json::to_value(DirectIo::Off),
            serde_json::to_value(NodeCopy::DoesNotFit {
                needed: 1,
                available: 0,
            }),
            serde_json::to_value(NodeCopy::Shared {
                made_by_pid: 1,
                made_by_rank: 0,
                received_from: Some(1),
                filled_here: 1,
                chunks: 2,
                by_exchange: false,
                bytes: 3,
                ranks: 3,
                remarks: vec![CopyRemark::ForeignName {
                    name: "n".into(),
                    kind: "a FIFO".into(),
                    uid: Some(7),
                    this_user: false,
                }],
            }),
            serde_json::to_value(ConcurrencyReason::Settled {
                readers: 8,
                tried: vec![(4, 0.3)],
            }),
            serde_json::to_value(PrefetchReason::FromEnvironment {
                variable: "HF_SHARD_PREFETCH",
                streams: 4,
            }),
            serde_json::to_value(RankSource::Launcher {
                launcher: "torchrun",
                rank_var: "LOCAL_RANK",
                rank: "1".into(),
                size_var: "LOCAL_WORLD_SIZE",
                size: "3".into(),
                valid: true,
            }),
            serde_json::to_value(SkipReason::Stalled {
                seconds: 10,
                chunks: 1,
                pids: vec![2],
            }),
            serde_json::to_value(LoadNote::ThreadsRefused {
                work: "reading",
                started: 3,
                requested: 8,
                error: "no".into(),
            }),
            serde_json::to_value(PrefetchReason::Auto {
                mount,
                needed: 1,
                total: 2,
            }),
        ]
        .into_iter()
        .map(Result::unwrap)
        .collect();
        let mut made = BTreeMap::new();
        values.iter().for_each(|v| codes(v, &mut made));
        for (code, keys) in &documented {
            assert_eq!(Some(keys), made.get(code), "the keys of a {code:?} object");
        }
        // Each enum with data says its code and its words.
        let note = LoadNote::RangesIgnored { files: 2 };
        let json = serde_json::to_value(&note).unwrap();
        assert_eq!(json["code"], note.as_str());
        assert_eq!(json["text"], note.to_string());
        assert_eq!(json["files"], 2);
        let mount_json = &made["prefetch_auto"];
        assert!(mount_json.contains(&"mount".to_string()), "{mount_json:?}");
    }

    #[cfg(unix)]
    #[test]
    fn a_path_that_is_not_utf8_is_written_lossily_and_a_duration_in_seconds() {
        use std::os::unix::ffi::OsStrExt;
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b"/q/\xff.queue"));
        let note = QueueNote::NotShared {
            path,
            why: "busy".into(),
        };
        let json = serde_json::to_value(&note).unwrap();
        assert_eq!(json["path"], "/q/\u{fffd}.queue");
        let report = PrefetchReport {
            elapsed: Duration::from_millis(1500),
            ..PrefetchReport::default()
        };
        assert_eq!(serde_json::to_value(&report).unwrap()["elapsed"], 1.5);
    }
}

// The caches' reports (feature `remote`): what a cache did for a file, what the hub cache holds.
#[path = "json_cache.rs"]
mod cache;
