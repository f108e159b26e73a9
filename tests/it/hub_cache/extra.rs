//! The repository's other files brought beside the weights (`hf://org/model?with=engine`):
//! into the snapshot of the weights' commit, linked to their blobs as the hub's client links
//! them, the missing ones marked in `.no_exist`, their paths in the report; a plain load
//! brings none, and a load whose cache has them asks the hub nothing more.

use super::python::{has_hub_client, python};
use super::*;

/// The engine preset's files this repository has: `config.json` (every `Hub` serves one) and
/// a tokenizer written here; the others it lacks.
const PRESENT: [&str; 2] = ["config.json", "tokenizer.json"];
const MISSING: [&str; 4] = [
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
];

fn hub_with_a_tokenizer() -> Hub {
    let hub = Hub::aligned(Options::default());
    let tokenizer = br#"{"version": "1.0", "model": {"type": "BPE"}}"#;
    std::fs::write(hub.files.path().join("tokenizer.json"), tokenizer).unwrap();
    hub
}

#[test]
fn the_engine_preset_brings_the_repositorys_small_files_at_the_weights_commit() {
    let hub = hub_with_a_tokenizer();
    let report = hub.load("hf://org/model?with=engine", &[]);
    assert_eq!(report.digest, hub.digest());
    assert_eq!(
        report.extra.len(),
        PRESENT.len() + MISSING.len(),
        "{report:?}"
    );
    for name in PRESENT {
        let path = report.extra[name].clone().expect(name);
        assert_eq!(path, hub.snapshot().join(name));
        assert_eq!(std::fs::read(&path).unwrap(), hub.bytes(name), "{name}");
        let link = std::fs::symlink_metadata(&path).unwrap();
        assert!(
            link.file_type().is_symlink(),
            "{name} is a link to its blob"
        );
        let blob = std::fs::canonicalize(&path).unwrap();
        assert!(blob.starts_with(hub.repo_dir().join("blobs")), "{blob:?}");
    }
    for name in MISSING {
        assert_eq!(report.extra[name], None, "{name}");
        let marker = hub
            .repo_dir()
            .join(".no_exist")
            .join(DEFAULT_COMMIT)
            .join(name);
        assert!(marker.is_file(), "{marker:?}");
    }
    // Again: the files and the markers are found in the cache; nothing more is asked
    // than of a load without the option.
    let before = hub.server.stats().requests;
    let again = hub.load("hf://org/model?with=engine", &[]);
    let with = hub.server.stats().requests - before;
    assert_eq!(again.extra, report.extra);
    let before = hub.server.stats().requests;
    hub.load("hf://org/model", &[]);
    let without = hub.server.stats().requests - before;
    assert_eq!(
        with, without,
        "requests of a warm load with the files and without"
    );
}

#[test]
fn a_plain_load_brings_only_the_weights() {
    let hub = hub_with_a_tokenizer();
    let report = hub.load("hf://org/model", &[]);
    assert!(report.extra.is_empty(), "{report:?}");
    for name in PRESENT {
        assert!(!hub.snapshot().join(name).exists(), "{name}");
    }
    let no_exist = hub.repo_dir().join(".no_exist").join(DEFAULT_COMMIT);
    for name in MISSING {
        assert!(!no_exist.join(name).exists(), "{name}");
    }
}

#[test]
fn named_files_are_brought_and_a_bad_name_or_no_hub_cache_is_an_error() {
    let hub = hub_with_a_tokenizer();
    let report = hub.load("hf://org/model?with=tokenizer.json,vocab.txt", &[]);
    let names: Vec<&String> = report.extra.keys().collect();
    assert_eq!(names, ["tokenizer.json", "vocab.txt"]);
    assert!(report.extra["tokenizer.json"].is_some());
    assert_eq!(report.extra["vocab.txt"], None);
    let error = hub.fail("hf://org/model?with=../../etc/passwd", &[]);
    assert!(error.contains("a bad file name"), "{error}");
    let off = [("SAFELOAD_HUB_CACHE", "0".to_owned())];
    let error = hub.fail("hf://org/model?with=engine", &off);
    assert!(error.contains("hub cache, which is off"), "{error}");
}

/// What the hub's client finds offline: each file's path, or `MISSING` where the cache
/// records that the repository has none.
const TRY: &str = r#"
import sys
from huggingface_hub import try_to_load_from_cache, _CACHED_NO_EXIST
for name in sys.argv[1:]:
    found = try_to_load_from_cache("org/model", name)
    if found is _CACHED_NO_EXIST:
        print("MISSING", name)
    elif isinstance(found, str):
        print("FOUND", name, found)
    else:
        print("UNKNOWN", name)
"#;

#[test]
fn the_hubs_client_finds_the_files_brought_and_the_missing_ones_marked() {
    if !has_hub_client() {
        return;
    }
    let hub = hub_with_a_tokenizer();
    hub.load("hf://org/model?with=engine", &[]);
    let names: Vec<&str> = PRESENT.iter().chain(&MISSING).copied().collect();
    let out = python(&hub, TRY, &names, &[("HF_HUB_OFFLINE", "1")]);
    for name in PRESENT {
        let line = format!("FOUND {name} {}", hub.snapshot().join(name).display());
        assert!(out.lines().any(|l| l == line), "{name}:\n{out}");
    }
    for name in MISSING {
        assert!(
            out.lines().any(|l| l == format!("MISSING {name}")),
            "{name}:\n{out}"
        );
    }
}
