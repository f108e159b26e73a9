//! The reports as JSON (feature `serde`): a load's report serialized and
//! parsed back has every file with its reason as a stable code beside the
//! words, the schema `safeload load --json` prints.

use serde_json::Value;
use tempfile::tempdir;

use crate::common::*;
use safeload::report::{DirectIo, Reason, Strategy};
use safeload::{Dtype, Loader};

#[test]
fn a_serialized_report_parses_back_with_codes_beside_the_words() {
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

    assert_eq!(json["tensor_bytes"], report.tensor_bytes());
    assert_eq!(json["bytes_read"], report.bytes_read());
    assert_eq!(json["threads"], report.threads);
    assert!(json["seconds"].as_f64().unwrap() > 0.0);
    let files = json["files"].as_array().unwrap();
    assert_eq!(files.len(), report.files.len());
    for (file, typed) in files.iter().zip(&report.files) {
        assert_eq!(typed.strategy, Strategy::Buffered);
        assert_eq!(typed.reason, Reason::Requested { disable_mmap: true });
        assert_eq!(typed.direct_io, DirectIo::Off);
        assert_eq!(file["path"], typed.path.to_str().unwrap());
        assert_eq!(file["strategy"], "buffered");
        assert_eq!(file["reason_code"], "requested");
        assert_eq!(file["reason"], typed.explain());
        assert_eq!(file["fallback"], Value::Null);
        assert_eq!(file["direct_io"], false);
        assert_eq!(file["direct_io_state"], "off");
        assert_eq!(file["tensor_count"], typed.tensors);
        assert_eq!(file["lazy"], false);
        assert_eq!(
            file["mount"]["kind"],
            typed.mount.as_ref().unwrap().kind.as_str()
        );
    }
    let prefetch = &json["prefetch"];
    let typed = report.prefetch.as_ref().unwrap();
    assert_eq!(prefetch["ran"], typed.ran);
    assert_eq!(prefetch["rank_source_code"], "alone");
    assert_eq!(prefetch["rank_source"], typed.rank_source.to_string());
    assert_eq!(prefetch["file_count"], typed.files);
}
