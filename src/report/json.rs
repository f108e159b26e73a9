//! `serde::Serialize` for the reports and mounts (feature `serde`): one schema, the Rust names (the `report` module's "JSON" section), also what the CLI's `--json` prints.
//!
//! Written out here rather than derived: a duration is seconds, a path a
//! string (lossy where not UTF-8), the values a type computes (`gib_per_s()`,
//! `explain()`, `lazy()`, the totals) sit beside its fields under their
//! method's name, and every enum with data is an object of its `code`
//! (`as_str()`), its `text` (`Display`) and its data by field name.

use std::path::Path;

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::{
    CacheUse, DirectIo, Fallback, FileReport, FreshMemory, LoadReport, NodeCopy, Note, PageReason,
    PrefetchReport, RankSource, Reason, SkipReason, Strategy,
};
use crate::dest::pages::HugePages;
use crate::mount::{Detection, Mount, MountKind};
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
            io_concurrency_reason: &'a Option<Note>,
            prefetch: &'a Option<PrefetchReport>,
            fresh_memory: &'a Option<FreshMemory>,
            notes: &'a [Note],
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

impl Serialize for FreshMemory {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View {
            mode: HugePages,
            reason: PageReason,
            huge_bytes: u64,
            base_bytes: u64,
            huge_gib_s: Option<f64>,
            base_gib_s: Option<f64>,
        }
        View {
            mode: self.mode,
            reason: self.reason,
            huge_bytes: self.huge_bytes,
            base_bytes: self.base_bytes,
            huge_gib_s: self.huge_gib_s,
            base_gib_s: self.base_gib_s,
        }
        .serialize(serializer)
    }
}

impl Serialize for PrefetchReport {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            ran: bool,
            reason: &'a Note,
            rank: usize,
            local_size: usize,
            rank_source: &'a RankSource,
            streams: usize,
            method: PrefetchMethod,
            shared_queue: bool,
            queue_note: &'a Option<Note>,
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

impl Serialize for Mount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct View<'a> {
            source: &'a str,
            mount_point: String,
            fs_type: &'a str,
            kind: MountKind,
            detected_by: Detection,
        }
        View {
            source: &self.source,
            mount_point: text(&self.mount_point),
            fs_type: &self.fs_type,
            kind: self.kind,
            detected_by: self.detected_by,
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

impl Serialize for Note {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let data = match self {
            Note::ThreadsRefused {
                work,
                started,
                requested,
                error,
            } => fields!(S; work, started, requested, error),
            Note::RangesIgnored { files } => fields!(S; files),
            Note::ReadOncePerCluster {
                node,
                nodes,
                read,
                total,
            } => fields!(S; node, nodes, read, total),
            Note::NodesReadAlone { why } | Note::NotHandedOut { why } => fields!(S; why),
            Note::HolderFailed { pid, why } => fields!(S; pid, why),
            Note::PrefetchRequested { streams } => fields!(S; streams),
            Note::PrefetchFromEnvironment { variable, streams } => fields!(S; variable, streams),
            Note::PrefetchOff | Note::FixedShares => Vec::new(),
            Note::PrefetchAuto {
                mount,
                needed,
                total,
            } => fields!(S; mount, needed, total),
            Note::PrefetchAutoResident { mount } | Note::PrefetchAutoDoesNotFit { mount } => {
                fields!(S; mount)
            }
            Note::QueueNotShared {
                path,
                why,
                node_copy,
            } => {
                let path = text(path);
                let path = &path;
                fields!(S; path, why, node_copy)
            }
            Note::QueueReplaced { why } => fields!(S; why),
            Note::OfferRefused { pid, uid } => fields!(S; pid, uid),
            Note::FinishedAfterStall { chunks } => fields!(S; chunks),
            Note::DeadJobsRemoved { files } => fields!(S; files),
            Note::ForeignName {
                name,
                kind,
                uid,
                this_user,
            } => fields!(S; name, kind, uid, this_user),
            Note::MoreForeignNames { count } => fields!(S; count),
            Note::ReadsSet { readers } | Note::ReadsUnmeasured { readers } => fields!(S; readers),
            Note::ReadsSettled { readers, tried }
            | Note::ReadsAtMost { readers, tried }
            | Note::ReadsUntilEnd { readers, tried } => fields!(S; readers, tried),
        };
        tagged(serializer, self.as_str(), self.to_string(), data)
    }
}

/// The enums without data, whose JSON is their stable name (`as_str`).
macro_rules! as_str {
    ($($ty:ty),*) => {$(
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    )*};
}

as_str!(
    Strategy,
    MountKind,
    Detection,
    PrefetchMethod,
    HugePages,
    PageReason
);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

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
                remarks: vec![Note::ForeignName {
                    name: "n".into(),
                    kind: "a FIFO".into(),
                    uid: Some(7),
                    this_user: false,
                }],
            }),
            serde_json::to_value(Note::ReadsSettled {
                readers: 8,
                tried: vec![(4, 0.3)],
            }),
            serde_json::to_value(Note::PrefetchFromEnvironment {
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
            serde_json::to_value(Note::ThreadsRefused {
                work: "reading",
                started: 3,
                requested: 8,
                error: "no".into(),
            }),
            serde_json::to_value(Note::PrefetchAuto {
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
        let note = Note::RangesIgnored { files: 2 };
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
        let note = Note::QueueNotShared {
            path,
            why: "busy".into(),
            node_copy: false,
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
