//! The reports as JSON (feature `serde`): a load's report serialized and
//! parsed back has the Rust names, each enum with data an object of its
//! code, its words and its fields, the schema `safeload load --json` prints.

use serde_json::Value;
use tempfile::tempdir;

use crate::common::*;
use safeload::report::{DirectIo, Reason, Strategy};
use safeload::{Dtype, Loader};

#[test]
fn a_serialized_report_parses_back_under_the_rust_names() {
    let dir = tempdir().unwrap();
    let specs = vec![
        spec("a", Dtype::F32, &[64, 64]),
        spec("b", Dtype::BF16, &[3, 5]),
    ];
    write_sharded(dir.path(), &specs, 2);
    let sd = Loader::new()
        .disable_mmap(true)
        .direct_io(false)
        .prefetch(1)
        .load(dir.path())
        .unwrap();
    let report = sd.report();
    let json: Value = serde_json::from_str(&serde_json::to_string(report).unwrap()).unwrap();
    if std::env::var_os("SAFELOAD_TEST_PRINT_JSON").is_some() {
        println!("{}", serde_json::to_string_pretty(&json).unwrap());
    }

    assert_eq!(json["tensor_bytes"], report.tensor_bytes());
    assert_eq!(json["bytes_read"], report.bytes_read());
    assert_eq!(json["threads"], report.threads);
    assert!(json["elapsed"].as_f64().unwrap() > 0.0);
    assert_eq!(
        json["io_concurrency_reason"]["code"],
        report.io_concurrency_reason.as_ref().unwrap().as_str()
    );
    assert_eq!(json["notes"], Value::Array(Vec::new()));
    let files = json["files"].as_array().unwrap();
    assert_eq!(files.len(), report.files.len());
    for (file, typed) in files.iter().zip(&report.files) {
        assert_eq!(typed.strategy, Strategy::Buffered);
        assert_eq!(typed.reason, Reason::Requested { disable_mmap: true });
        assert_eq!(typed.direct_io, DirectIo::Off);
        assert_eq!(file["path"], typed.path.to_str().unwrap());
        assert_eq!(file["strategy"], "buffered");
        assert_eq!(file["reason"]["code"], "requested");
        assert_eq!(file["reason"]["text"], typed.reason.to_string());
        assert_eq!(file["reason"]["disable_mmap"], true);
        assert_eq!(file["explain"], typed.explain());
        assert_eq!(file["fallback"], Value::Null);
        assert_eq!(file["direct_io"]["code"], "off");
        assert_eq!(file["tensors"], typed.tensors);
        assert_eq!(file["lazy"], false);
        assert_eq!(file["node_copy"], Value::Null);
        assert_eq!(
            file["mount"]["kind"],
            typed.mount.as_ref().unwrap().kind.to_string()
        );
    }
    let prefetch = &json["prefetch"];
    let typed = report.prefetch.as_ref().unwrap();
    assert_eq!(prefetch["ran"], typed.ran);
    assert_eq!(prefetch["reason"]["code"], "prefetch_requested");
    assert_eq!(prefetch["reason"]["streams"], 1);
    assert_eq!(prefetch["rank_source"]["code"], "alone");
    assert_eq!(
        prefetch["rank_source"]["text"],
        typed.rank_source.to_string()
    );
    assert_eq!(prefetch["files"], typed.files);
}

#[test]
fn a_loads_commit_is_the_one_its_files_share_in_json_and_in_words() {
    let dir = tempdir().unwrap();
    let specs = vec![
        spec("a", Dtype::F32, &[16, 16]),
        spec("b", Dtype::F32, &[16, 16]),
    ];
    write_sharded(dir.path(), &specs, 2);
    let sd = Loader::new().load(dir.path()).unwrap();
    // Local files: no commit.
    let local = sd.report();
    assert_eq!(local.commit(), None);
    assert_eq!(serde_json::to_value(local).unwrap()["commit"], Value::Null);

    let (one, other) = ("1".repeat(40), "2".repeat(40));
    let mut shared = local.clone();
    for file in &mut shared.files {
        file.commit = Some(one.clone());
    }
    assert_eq!(shared.commit(), Some(one.as_str()));
    assert_eq!(serde_json::to_value(&shared).unwrap()["commit"], one);
    // Said once, above the files.
    let text = shared.to_string();
    assert_eq!(
        text.matches(&format!("at commit {one}")).count(),
        1,
        "{text}"
    );

    let mut split = shared.clone();
    split.files[1].commit = Some(other.clone());
    assert_eq!(split.commit(), None);
    assert_eq!(serde_json::to_value(&split).unwrap()["commit"], Value::Null);
    // Each file's, where they differ.
    let text = split.to_string();
    for commit in [&one, &other] {
        assert_eq!(
            text.matches(&format!("at commit {commit}")).count(),
            1,
            "{text}"
        );
    }
    let mut partly = shared;
    partly.files[0].commit = None;
    assert_eq!(partly.commit(), None);
}
