//! The `safeload` command as a script and a person use it: what each subcommand prints, its JSON, its exit codes, and the progress bar on a terminal and not on a pipe.

mod util;

use std::collections::BTreeSet;

use serde_json::Value;
use tempfile::tempdir;
use util::{Run, has_bar, run, safeload, write_sharded};

fn as_u64(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

/// The tensors of a load's JSON report: each file's `tensors`, added up.
fn tensors_of(report: &Value) -> u64 {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| as_u64(&f["tensors"]))
        .sum()
}

// ---------------------------------------------------------------------------
// load

#[test]
fn load_demo_prints_the_report_and_nothing_else_on_stdout() {
    let out = run(&["load", "--demo"]).expect_code(0);
    assert!(out.stdout.starts_with("20 tensors from "), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("loaded 30.32 MiB tensor bytes from 3 file(s)")
    );
    for shard in 1..=3 {
        assert!(
            out.stdout
                .contains(&format!("model-0000{shard}-of-00003.safetensors")),
            "{}",
            out.stdout
        );
    }
    // Mapped lazily: no rate is claimed for bytes nobody read.
    assert!(
        out.stdout.contains("nothing read (mapped)"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("GiB/s"), "{}", out.stdout);
    // stderr, a pipe, tells where the demo went and draws no bar.
    assert!(out.stderr.contains("demo checkpoint written to"));
    assert!(!has_bar(&out.stderr), "{}", out.stderr);
}

#[test]
fn load_demo_json_is_one_object_with_three_lazy_files() {
    let out = run(&["load", "--demo", "--json"]).expect_code(0);
    let json = out.json();
    assert_eq!(tensors_of(&json), 20);
    assert_eq!(json["bytes_read"], 0);
    assert_eq!(json["gib_per_s"], Value::Null);
    let files = json["files"].as_array().unwrap();
    assert_eq!(files.len(), 3);
    for file in files {
        assert_eq!(file["strategy"], "mmap", "{file}");
        assert_eq!(file["lazy"], true);
        assert_eq!(file["gib_per_s"], Value::Null);
        assert_eq!(file["reason"]["code"], "auto", "{file}");
        assert_eq!(
            file["reason"]["kind"], file["mount"]["kind"],
            "the rule of the file's filesystem: {file}"
        );
        assert!(file["explain"].is_string(), "{file}");
        assert!(file["elapsed"].is_f64());
        assert!(file["mount"]["kind"].is_string());
    }
    let sum: u64 = files.iter().map(|f| as_u64(&f["tensor_bytes"])).sum();
    assert_eq!(sum, as_u64(&json["tensor_bytes"]));
    assert_eq!(json["notes"], serde_json::json!([]));
    // Nothing but the JSON: the demo's note is for a person, in text mode.
    assert_eq!(out.stderr, "");
}

#[test]
fn a_buffered_verified_converting_load_reports_rates_digests_and_conversions() {
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 3, 4);
    let out = run(&[
        "load",
        dir.path().to_str().unwrap(),
        "--disable-mmap",
        "--verify",
        "--dtype",
        "F32",
        "--threads",
        "2",
        "--io-concurrency",
        "3",
        "--json",
    ])
    .expect_code(0);
    let json = out.json();
    assert_eq!(json["io_concurrency"], 3);
    assert_eq!(json["io_concurrency_reason"]["code"], "reads_set");
    assert!(json["gib_per_s"].as_f64().unwrap() > 0.0);
    for file in json["files"].as_array().unwrap() {
        assert_eq!(file["strategy"], "buffered", "{file}");
        assert_eq!(file["reason"]["code"], "requested", "{file}");
        assert_eq!(file["reason"]["disable_mmap"], true, "{file}");
        assert!(
            file["explain"]
                .as_str()
                .unwrap()
                .contains("disable_mmap(true) was requested"),
            "{file}"
        );
        assert!(as_u64(&file["bytes_read"]) > 0);
        assert!(file["gib_per_s"].as_f64().unwrap() > 0.0, "{file}");
        assert_eq!(file["lazy"], false);
        let sha = file["sha256"].as_str().unwrap();
        assert!(
            sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
            "{sha}"
        );
        // Each shard holds a BF16 tensor, which becomes F32.
        assert_eq!(as_u64(&file["converted"]), 1, "{file}");
    }
}

/// What two runs of one load may differ in: the times, the rates, the
/// words and figures of the reads in flight (its code stays).
fn without_timings(value: &mut Value) {
    match value {
        Value::Object(map) => {
            // Times and rates, and the fresh memory's split between page
            // sizes and their rates, measured anew by each load.
            for key in [
                "elapsed",
                "gib_per_s",
                "huge_bytes",
                "base_bytes",
                "huge_gib_s",
                "base_gib_s",
            ] {
                if let Some(v) = map.get_mut(key) {
                    *v = Value::Null;
                }
            }
            if let Some(io) = map.get_mut("io_concurrency_reason") {
                *io = io["code"].clone();
            }
            map.values_mut().for_each(without_timings);
        }
        Value::Array(items) => items.iter_mut().for_each(without_timings),
        _ => {}
    }
}

/// `safeload load --json` prints the document the library's `serde` gives
/// for the same load: the same keys everywhere, the same values but for
/// the times and rates (and what each load measures of fresh memory).
#[test]
fn load_json_is_the_librarys_serde_document() {
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 3, 4);
    let path = dir.path().to_str().unwrap();
    let mut printed = run(&["load", path, "--disable-mmap", "--prefetch", "1", "--json"])
        .expect_code(0)
        .json();
    let sd = safeload::Loader::new()
        .disable_mmap(true)
        .prefetch(1)
        .load(path)
        .unwrap();
    let mut serialized = serde_json::to_value(sd.report()).unwrap();
    assert!(
        printed["files"][0]["reason"]["code"].is_string(),
        "{printed}"
    );
    assert!(
        printed["prefetch"]["reason"]["code"].is_string(),
        "{printed}"
    );
    without_timings(&mut printed);
    without_timings(&mut serialized);
    assert_eq!(printed, serialized);
}

#[test]
fn a_load_with_prefetch_reports_what_the_prefetch_did() {
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 3, 4);
    let path = dir.path().to_str().unwrap();
    let json = run(&["load", path, "--mmap", "--prefetch", "2", "--json"])
        .expect_code(0)
        .json();
    let prefetch = &json["prefetch"];
    assert_eq!(prefetch["streams"], 2, "{prefetch}");
    assert_eq!(prefetch["ran"], true);
    assert_eq!(prefetch["files"], 3);
    assert_eq!(prefetch["reason"]["code"], "prefetch_requested");
    assert_eq!(prefetch["reason"]["streams"], 2);
    assert!(
        prefetch["reason"]["text"]
            .as_str()
            .unwrap()
            .contains("prefetch(2)")
    );
    // Just written, so resident: nothing warmed, and no rate for it.
    let read = as_u64(&prefetch["warmed"]) + as_u64(&prefetch["reread"]);
    assert_eq!(prefetch["gib_per_s"].is_null(), read == 0, "{prefetch}");
}

#[test]
fn a_sharded_checkpoint_loads_from_its_directory_its_index_or_a_shard() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), 3, 4);
    let shard = dir.path().join("model-00002-of-00003.safetensors");
    for (path, tensors) in [
        (dir.path(), 12),
        (index.as_path(), 12),
        (shard.as_path(), 4),
    ] {
        let json = run(&["load", path.to_str().unwrap(), "--json"])
            .expect_code(0)
            .json();
        assert_eq!(tensors_of(&json), tensors, "{}", path.display());
    }
}

#[test]
fn load_and_inspect_take_a_remote_address() {
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 3, 4);
    let server =
        safeload_testhttp::Server::start(dir.path(), safeload_testhttp::Options::default())
            .unwrap();
    let url = format!("{}/", server.url());
    let json = run(&["load", &url, "--json"]).expect_code(0).json();
    assert_eq!(tensors_of(&json), 12, "{json}");
    assert_eq!(json["files"][0]["strategy"], "buffered", "{json}");
    let json = run(&["inspect", &url, "--json"]).expect_code(0).json();
    assert_eq!(json["files"].as_array().map(Vec::len), Some(3), "{json}");
    let missing = format!("{}/nothing/", server.url());
    let failed = run(&["load", &missing]).expect_code(1);
    assert!(
        failed.stderr.contains(missing.trim_end_matches('/')),
        "{}",
        failed.stderr
    );
}

/// A repository served as the hub serves it (two shards) and an empty hub cache: each run of
/// the command line is pointed at both, nothing of the caller's store or cache variables kept.
struct Hub {
    _files: tempfile::TempDir,
    server: safeload_testhttp::Server,
    cache: tempfile::TempDir,
}

impl Hub {
    fn new() -> Hub {
        Hub::lying(false)
    }

    /// With `lie`, a hub that serves the first shard's tensor bytes damaged, under its true
    /// digest.
    fn lying(lie: bool) -> Hub {
        let files = tempdir().unwrap();
        write_sharded(files.path(), 2, 3);
        let mut options = safeload_testhttp::Options::default();
        if lie {
            let path = "model-00001-of-00002.safetensors".to_owned();
            let bytes = std::fs::read(files.path().join(&path)).unwrap();
            let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
            options.lie = Some(safeload_testhttp::Lie {
                path,
                from: 8 + header,
            });
        }
        let server = safeload_testhttp::Server::start(files.path(), options).unwrap();
        Hub {
            _files: files,
            server,
            cache: tempdir().unwrap(),
        }
    }

    /// Runs `safeload args` against this hub and cache.
    fn run(&self, args: &[&str]) -> Run {
        let mut command = safeload(args);
        for var in safeload_testhttp::STORE_VARIABLES {
            command.env_remove(var);
        }
        command
            .env("HF_ENDPOINT", self.server.url())
            .env("HF_HUB_CACHE", self.cache.path())
            .env("HF_HOME", self.cache.path().join("no-home"));
        Run::piped(command)
    }
}

#[test]
fn load_inspect_and_cache_share_the_hub_cache() {
    let hub = Hub::new();
    let cache = &hub.cache;
    let with_hub = |args: &[&str]| hub.run(args);
    // Nothing cached yet: where the cache is, and nothing for the repository.
    let empty = with_hub(&["cache", "org/model", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(empty["root"], cache.path().to_str().unwrap(), "{empty}");
    assert_eq!(empty["repos"].as_array().map(Vec::len), Some(0), "{empty}");
    let cold = with_hub(&["load", "hf://org/model", "--json"])
        .expect_code(0)
        .json();
    for file in cold["files"].as_array().unwrap() {
        // `checking`: every byte written, its digest still checked as the load returned
        // (the process waits for it before it ends: the next load is a hit).
        let code = file["cache"]["code"].as_str();
        assert!(matches!(code, Some("written" | "checking")), "{file}");
        assert_eq!(file["cache"]["store"], "hub", "{file}");
    }
    // The load's one commit, in JSON and once in words.
    assert_eq!(cold["commit"], safeload_testhttp::DEFAULT_COMMIT, "{cold}");
    let warm = with_hub(&["load", "hf://org/model"]).expect_code(0);
    assert!(
        warm.stdout.contains("from the hub cache"),
        "{}",
        warm.stdout
    );
    let at = format!("at commit {}", safeload_testhttp::DEFAULT_COMMIT);
    assert_eq!(warm.stdout.matches(&at).count(), 1, "{}", warm.stdout);
    let inspected = with_hub(&["inspect", "hf://org/model", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(inspected["files"].as_array().map(Vec::len), Some(2));
    let listed = with_hub(&["cache", "org/model", "--json"])
        .expect_code(0)
        .json();
    let revision = &listed["repos"][0]["revisions"][0];
    assert_eq!(
        revision["commit"],
        safeload_testhttp::DEFAULT_COMMIT,
        "{listed}"
    );
    assert_eq!(revision["refs"][0], "main", "{listed}");
    // The two shards and the index, each with its blob.
    let files = revision["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{listed}");
    assert!(
        files
            .iter()
            .all(|f| f["blob"].is_string() && f["size"].is_u64())
    );
    let text = with_hub(&["cache"]).expect_code(0);
    assert!(text.stdout.contains("org/model"), "{}", text.stdout);
}

#[test]
fn a_digest_mismatch_found_after_the_load_fails_the_command_and_says_so() {
    let hub = Hub::lying(true);
    for args in [
        &["load", "hf://org/model"][..],
        &["load", "hf://org/model", "--json"],
    ] {
        let run = hub.run(args);
        // The report is printed (the load returned), then the check's verdict.
        let run = run.expect_code(1);
        assert!(
            run.stderr.contains("SHA-256 mismatch")
                && run.stderr.contains("model-00001-of-00002.safetensors"),
            "{}",
            run.stderr
        );
        assert!(!run.stdout.is_empty());
    }
    // Nothing of the damaged file was published.
    let blobs = hub.cache.path().join("models--org--model/blobs");
    let names: Vec<String> = std::fs::read_dir(&blobs)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        names.iter().all(|n| !n.contains("safeload-partial")),
        "{names:?}"
    );
}

#[test]
fn cache_rm_dry_run_json_says_what_would_go_and_prune_and_rm_remove_it() {
    let hub = Hub::new();
    let cache = &hub.cache;
    let with_hub = |args: &[&str]| hub.run(args);
    with_hub(&["load", "hf://org/model"]).expect_code(0);
    let repo = cache.path().join("models--org--model");
    let snapshot = repo
        .join("snapshots")
        .join(safeload_testhttp::DEFAULT_COMMIT);
    // A dry run: one JSON object saying what would go, and nothing gone.
    let planned = with_hub(&["cache", "rm", "org/model@main", "--dry-run", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(planned["mode"], "dry_run", "{planned}");
    assert_eq!(planned["root"], cache.path().to_str().unwrap(), "{planned}");
    let removed = planned["removed"].as_array().unwrap();
    let kinds: BTreeSet<&str> = removed
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    for kind in ["blob", "link", "ref", "folder"] {
        assert!(kinds.contains(kind), "{kind}: {planned}");
    }
    let blob_bytes: u64 = removed
        .iter()
        .filter(|e| e["kind"] == "blob")
        .map(|e| as_u64(&e["bytes"]))
        .sum();
    assert!(blob_bytes > 0, "{planned}");
    assert!(as_u64(&planned["bytes"]) >= blob_bytes, "{planned}");
    assert_eq!(
        planned["kept"].as_array().map(Vec::len),
        Some(0),
        "{planned}"
    );
    assert!(snapshot.is_dir() && repo.join("refs/main").is_file());
    // Prune: a blob no snapshot links to goes, in words.
    let orphan = repo.join("blobs").join("ab".repeat(32));
    std::fs::write(&orphan, b"left behind").unwrap();
    let pruned = with_hub(&["cache", "prune"]).expect_code(0);
    assert!(
        pruned.stdout.starts_with("hub cache: "),
        "{}",
        pruned.stdout
    );
    assert!(
        pruned
            .stdout
            .contains(&format!("removed blob {}", orphan.display())),
        "{}",
        pruned.stdout
    );
    assert!(
        pruned.stdout.contains("1 name(s) removed, 11 B freed"),
        "{}",
        pruned.stdout
    );
    assert!(!orphan.exists() && snapshot.is_dir());
    // The whole repository, then the listing has nothing of it.
    let gone = with_hub(&["cache", "rm", "org/model", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(gone["mode"], "remove", "{gone}");
    assert_eq!(as_u64(&gone["bytes"]), as_u64(&planned["bytes"]), "{gone}");
    assert!(!repo.exists());
    let listed = with_hub(&["cache", "org/model", "--json"])
        .expect_code(0)
        .json();
    assert_eq!(
        listed["repos"].as_array().map(Vec::len),
        Some(0),
        "{listed}"
    );
    // A name that could reach outside the cache: refused, exit 1, naming it.
    let refused = with_hub(&["cache", "rm", "org/../../etc"]).expect_code(1);
    assert!(
        refused.stderr.contains("org/../../etc"),
        "{}",
        refused.stderr
    );
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
}

// ---------------------------------------------------------------------------
// inspect

#[test]
fn inspect_json_of_a_sharded_checkpoint_lists_every_tensor_and_per_file_totals() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), 4, 5);
    let json = run(&["inspect", dir.path().to_str().unwrap(), "--json"])
        .expect_code(0)
        .json();

    // Every tensor, as the library's header-only open sees it, in its order.
    let checkpoint = safeload::Checkpoint::open(&index).unwrap();
    let expected: Vec<Value> = checkpoint
        .tensors()
        .map(|t| {
            serde_json::json!({
                "name": t.name(),
                "dtype": t.dtype().to_string(),
                "shape": t.shape(),
                "nbytes": t.nbytes(),
                "file": t.file().to_str().unwrap(),
            })
        })
        .collect();
    assert_eq!(expected.len(), 20);
    assert_eq!(json["tensors"], Value::Array(expected));
    assert_eq!(json["tensor_count"], 20);
    assert_eq!(as_u64(&json["tensor_bytes"]), checkpoint.total_bytes());

    // Per-file totals add up to the checkpoint's, and each file's tensors
    // are the ones listed under it.
    let files = json["files"].as_array().unwrap();
    assert_eq!(files.len(), 4);
    let bytes: u64 = files.iter().map(|f| as_u64(&f["tensor_bytes"])).sum();
    let count: u64 = files.iter().map(|f| as_u64(&f["tensors"])).sum();
    assert_eq!((bytes, count), (checkpoint.total_bytes(), 20));
    for file in files {
        let listed: Vec<&Value> = json["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["file"] == file["path"])
            .collect();
        assert_eq!(listed.len() as u64, as_u64(&file["tensors"]));
        let listed_bytes: u64 = listed.iter().map(|t| as_u64(&t["nbytes"])).sum();
        assert_eq!(listed_bytes, as_u64(&file["tensor_bytes"]));
        assert!(as_u64(&file["size"]) > as_u64(&file["tensor_bytes"]));
        assert!(file["strategy"].is_string() && file["reason"]["code"].is_string());
        assert_eq!(file["bytes_read"], 0, "an open reads no tensor byte");
    }

    // Metadata: the first file's own, merged, and the index's.
    assert_eq!(files[0]["metadata"]["written_by"], "cli tests");
    assert_eq!(files[1]["metadata"], Value::Null);
    assert_eq!(json["metadata"]["format"], "pt");
    // Index metadata values that are not strings come as their JSON text.
    assert_eq!(
        json["index_metadata"]["total_size"],
        checkpoint.total_bytes().to_string()
    );
}

#[test]
fn inspect_text_names_every_file_and_tensor_with_dtype_shape_and_size() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), 2, 4);
    let out = run(&["inspect", index.to_str().unwrap()]).expect_code(0);
    let checkpoint = safeload::Checkpoint::open(&index).unwrap();
    assert!(out.stdout.contains("8 tensors"), "{}", out.stdout);
    assert!(out.stdout.contains("index metadata: total_size="));
    for file in checkpoint.files() {
        assert!(
            out.stdout.contains(file.to_str().unwrap()),
            "{}",
            out.stdout
        );
    }
    for tensor in checkpoint.tensors() {
        let line = out
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(tensor.name()))
            .unwrap_or_else(|| panic!("{} not listed:\n{}", tensor.name(), out.stdout));
        assert!(line.contains(&tensor.dtype().to_string()), "{line}");
        assert!(line.contains(&format!("{:?}", tensor.shape())), "{line}");
    }
    assert!(out.stdout.contains("a load would map it"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("metadata: format=pt, written_by=cli tests")
    );
}

#[test]
fn inspect_demo_lists_the_demo() {
    let json = run(&["inspect", "--demo", "--json"]).expect_code(0).json();
    assert_eq!(json["demo"], true);
    assert_eq!(json["tensors"].as_array().unwrap().len(), 20);
    assert_eq!(json["files"].as_array().unwrap().len(), 3);
}

// ---------------------------------------------------------------------------
// exit codes and errors

#[test]
fn a_missing_path_fails_with_1_naming_it_and_its_cause() {
    let dir = tempdir().unwrap();
    let missing = dir.path().join("no-such-checkpoint");
    let missing = missing.to_str().unwrap();
    for command in ["load", "inspect", "prefetch"] {
        let out = run(&[command, missing]).expect_code(1);
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(
            first.starts_with(&format!("error: {missing}: ")),
            "{}",
            out.stderr
        );
        // The OS's reason on the same line, once.
        assert!(
            first.contains("No such file or directory"),
            "{}",
            out.stderr
        );
        assert_eq!(
            out.stderr.matches("os error 2").count(),
            1,
            "{}",
            out.stderr
        );
        assert_eq!(out.stdout, "");
    }
    // --json changes nothing of that: stdout stays empty for `jq`.
    let out = run(&["load", missing, "--json"]).expect_code(1);
    assert_eq!(out.stdout, "");
    assert!(out.stderr.contains(missing));

    let out = run(&["mounts", missing]).expect_code(1);
    assert!(
        out.stderr
            .starts_with(&format!("error: looking up the filesystem of {missing}"))
    );
}

#[test]
fn a_corrupt_file_fails_with_1_naming_the_file() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, [1, 2, 3]).unwrap();
    for command in ["load", "inspect"] {
        let out = run(&[command, path.to_str().unwrap()]).expect_code(1);
        assert!(
            out.stderr.starts_with(&format!(
                "error: {}: file of 3 bytes is too small",
                path.display()
            )),
            "{}",
            out.stderr
        );
    }
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["load"],
        &["load", "--demo", "--bogus"],
        &["load", "--demo", "some/path"],
        &["load", "--demo", "--mmap", "--disable-mmap"],
        &["load", "--demo", "--dtype", "f8"],
        &["load", "--demo", "--prefetch", "lots"],
        &["load", "--demo", "--threads", "0"],
        &["inspect"],
        &["mounts", "a", "b"],
        &["prefetch"],
        &["prefetch", "x", "--streams", "0"],
    ] {
        let out = run(args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
        // An error, or for no command at all, the usage.
        assert!(
            out.stderr.starts_with("error: ") || args.is_empty(),
            "{args:?}: {}",
            out.stderr
        );
        assert_eq!(out.stdout, "", "{args:?}");
    }
}

#[test]
fn help_and_version_exit_with_0_on_stdout() {
    let top = run(&["--help"]).expect_code(0);
    for command in ["load", "inspect", "mounts", "prefetch"] {
        assert!(
            top.stdout.contains(&format!("  {command} ")),
            "{}",
            top.stdout
        );
    }
    assert!(top.stdout.contains("Exit status:"));
    for command in ["load", "inspect", "mounts", "prefetch"] {
        for flag in ["--help", "-h"] {
            let out = run(&[command, flag]).expect_code(0);
            assert!(
                out.stdout
                    .contains(&format!("Usage: safeload {command} [OPTIONS]")),
                "{command} {flag}: {}",
                out.stdout
            );
        }
        run(&["help", command]).expect_code(0);
    }
    let version = run(&["--version"]).expect_code(0);
    assert_eq!(
        version.stdout.trim(),
        format!("safeload {}", env!("CARGO_PKG_VERSION"))
    );
}

// ---------------------------------------------------------------------------
// mounts

#[test]
fn mounts_tells_the_kind_of_a_directory_and_why_the_policy_decides_as_it_does() {
    let dir = tempdir().unwrap();
    let expected = safeload::mount::lookup(dir.path()).unwrap();
    let policy = expected.auto_policy();
    let out = run(&["mounts", dir.path().to_str().unwrap()]).expect_code(0);
    assert!(
        out.stdout
            .contains(&format!("kind:         {}\n", expected.kind)),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!(
            "auto policy:  {}: {}\n",
            policy.strategy, policy.reason
        )),
        "{}",
        out.stdout
    );

    let json = run(&["mounts", dir.path().to_str().unwrap(), "--json"])
        .expect_code(0)
        .json();
    assert_eq!(json["mount"]["kind"], expected.kind.to_string());
    assert_eq!(json["auto_policy"]["strategy"], policy.strategy.to_string());
    assert_eq!(json["auto_policy"]["reason"], policy.reason.as_str());
    assert_eq!(json["environment"], serde_json::json!([]));
    assert!(json.get("mounts").is_none(), "only with --all");
}

#[test]
fn mounts_without_a_path_is_about_the_current_directory() {
    let dir = tempdir().unwrap();
    let mut command = safeload(&["mounts", "--json"]);
    command.current_dir(dir.path());
    let json = Run::piped(command).expect_code(0).json();
    let expected = safeload::mount::lookup(dir.path()).unwrap();
    assert_eq!(json["path"], ".");
    assert_eq!(json["mount"]["kind"], expected.kind.to_string());
    assert_eq!(
        json["mount"]["mount_point"],
        expected.mount_point.to_str().unwrap()
    );
}

#[test]
fn mounts_all_lists_the_table_and_says_which_variables_override_the_policy() {
    let mut command = safeload(&["mounts", "/", "--all", "--json"]);
    command.env("SAFELOAD_DISABLE_MMAP", "1");
    let json = Run::piped(command).expect_code(0).json();
    assert_eq!(
        json["environment"],
        serde_json::json!([{"name": "SAFELOAD_DISABLE_MMAP", "value": "1"}])
    );
    let table = safeload::mount::MountTable::current().unwrap();
    let mounts = json["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), table.entries().len());
    if cfg!(target_os = "linux") {
        assert!(mounts.iter().any(|m| m["mount_point"] == "/"));
    }

    let mut command = safeload(&["mounts", "/", "--all"]);
    command.env("SAFELOAD_DISABLE_MMAP", "1");
    let out = Run::piped(command).expect_code(0);
    assert!(
        out.stdout
            .contains("note:         SAFELOAD_DISABLE_MMAP=1 is set")
    );
    assert!(out.stdout.contains("KIND "), "{}", out.stdout);
}

// ---------------------------------------------------------------------------
// prefetch

#[test]
fn prefetch_warms_a_checkpoint_and_prints_its_report() {
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 2, 4);
    let out = run(&["prefetch", dir.path().to_str().unwrap(), "--streams", "2"]).expect_code(0);
    assert!(out.stdout.starts_with("prefetched: "), "{}", out.stdout);
    assert!(out.stdout.contains("2 stream(s)"), "{}", out.stdout);
    assert!(out.stdout.contains("rank 0 of 1"), "{}", out.stdout);
    assert!(!has_bar(&out.stderr), "{}", out.stderr);
}

#[test]
fn prefetch_in_two_local_ranks_splits_the_chunks_between_them() {
    let dir = tempdir().unwrap();
    // Each file is one chunk at least: work for two ranks.
    write_sharded(dir.path(), 6, 4);
    // Cold, so that there is work to split: written back, then dropped
    // from the page cache (dirty pages would stay).
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::fs::File::open(entry.unwrap().path())
            .unwrap()
            .sync_all()
            .unwrap();
    }
    safeload::evict(dir.path()).unwrap();
    let path = dir.path().to_str().unwrap();
    // One job id for both ranks, and one of this test's own, so that they
    // share a queue with each other and with no other test.
    let job = format!("cli-test-{}", std::process::id());
    let ranks: Vec<std::process::Child> = (0..2)
        .map(|rank| {
            let mut command = safeload(&["prefetch", path, "--streams", "1", "--json"]);
            command
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", "2")
                .env("TORCHELASTIC_RUN_ID", &job)
                .stdout(std::process::Stdio::piped());
            command.spawn().unwrap()
        })
        .collect();
    let reports: Vec<Value> = ranks
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success());
            serde_json::from_slice(&output.stdout).unwrap()
        })
        .collect();
    let seen: BTreeSet<u64> = reports.iter().map(|r| as_u64(&r["rank"])).collect();
    assert_eq!(seen, BTreeSet::from([0, 1]));
    for report in &reports {
        assert_eq!(report["local_size"], 2, "{report}");
        assert_eq!(report["rank_source"]["code"], "launcher", "{report}");
        assert_eq!(report["rank_source"]["rank_var"], "LOCAL_RANK", "{report}");
        assert_eq!(report["shared_queue"], true, "{report}");
    }
    // No chunk read twice on the node: each cold chunk handled by one rank
    // or the other. (Where eviction is a no-op, as on tmpfs, every chunk
    // was resident and done when the queue was made.)
    let handled: u64 = reports.iter().map(|r| as_u64(&r["chunks_handled"])).sum();
    let warmed: u64 = reports.iter().map(|r| as_u64(&r["warmed"])).sum();
    let total = as_u64(&reports[0]["total_bytes"]);
    assert!(warmed <= total, "{reports:?}");
    if as_u64(&reports[0]["resident_before"]) == 0 {
        assert_eq!(handled, as_u64(&reports[0]["chunks"]), "{reports:?}");
    } else {
        assert!(handled <= as_u64(&reports[0]["chunks"]), "{reports:?}");
    }
}

// ---------------------------------------------------------------------------
// the progress bar

#[cfg(unix)]
#[test]
fn a_buffered_load_draws_a_progress_bar_on_a_terminal() {
    let out = util::pty::run_on_terminal(safeload(&["load", "--demo", "--disable-mmap"]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // The bar: its phase, its frame, bytes of the total, the rate.
    assert!(out.stderr.contains("read ["), "{:?}", out.stderr);
    assert!(
        out.stderr.contains("30.32 MiB/30.32 MiB"),
        "{:?}",
        out.stderr
    );
    assert!(out.stderr.contains("GiB/s, 3/3 files"), "{:?}", out.stderr);
    // The report is on stdout, a pipe, untouched by the bar.
    assert!(out.stdout.starts_with("20 tensors from "), "{}", out.stdout);
    assert!(!out.stdout.contains('\x1b'));
}

#[cfg(unix)]
#[test]
fn a_load_too_fast_for_a_second_frame_still_draws_its_bar_once() {
    // A few KiB: the library reports once, at the end of the phase.
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 2, 4);
    let out = util::pty::run_on_terminal(safeload(&[
        "load",
        dir.path().to_str().unwrap(),
        "--disable-mmap",
    ]));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("read ["), "{:?}", out.stderr);
    assert!(out.stderr.contains("2/2 files"), "{:?}", out.stderr);
}

#[test]
fn a_buffered_load_draws_no_bar_when_stderr_is_a_pipe() {
    let out = run(&["load", "--demo", "--disable-mmap"]).expect_code(0);
    assert!(!has_bar(&out.stderr), "{:?}", out.stderr);
    assert!(!out.stderr.contains('\x1b') && !out.stderr.contains('\r'));
    // Only the demo's note, and the report on stdout.
    assert_eq!(out.stderr.lines().count(), 1, "{:?}", out.stderr);
    assert!(out.stdout.contains("GiB/s"), "{}", out.stdout);
}

#[cfg(unix)]
#[test]
fn no_bar_on_a_terminal_with_no_progress_or_when_nothing_is_read() {
    let dir = tempdir().unwrap();
    write_sharded(dir.path(), 3, 4);
    let path = dir.path().to_str().unwrap();
    for args in [
        &["load", path, "--disable-mmap", "--no-progress"][..],
        // Mapped lazily: there are no bytes to count and no rate to show.
        &["load", path, "--mmap"],
    ] {
        let out = util::pty::run_on_terminal(safeload(args));
        assert_eq!(out.code, Some(0), "{args:?}: {}", out.stderr);
        assert!(!has_bar(&out.stderr), "{args:?}: {:?}", out.stderr);
    }
}
