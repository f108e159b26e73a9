//! Tests of the reports' JSON (feature `serde`): the documented example's keys are what the types give, a path that is not UTF-8 is written lossily and a duration in seconds. The JSON itself is derived where each type is declared (`worded!`, `reported!`, serde's derive).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::{
    ConcurrencyReason, CopyRemark, DirectIo, LoadNote, NodeCopy, PrefetchReason, PrefetchReport,
    QueueNote, RankSource, Reason, SkipReason,
};
use crate::mount::{Detection, Mount, MountKind};

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
        serde_json::to_value(Reason::Auto {
            kind: MountKind::HfMount,
        }),
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

// The caches' reports: what a cache did for a file.
#[path = "json_cache_tests.rs"]
mod cache;
