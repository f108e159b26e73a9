//! The hub's own client, `huggingface_hub` (Python), and a load share one cache: the client
//! finds every file a load wrote (`hf_hub_download(..., local_files_only=True)`,
//! `scan_cache_dir()`), and a load reads what the client downloaded (`snapshot_download`)
//! offline without a request. Skipped, saying so, where `python3` cannot import
//! `huggingface_hub`, unless `SAFELOAD_REQUIRE_HF_HUB=1` (`.ci/run` installs it).

use std::process::{Command, Stdio};

use safeload_testhttp::{DEFAULT_COMMIT, Options};

use super::*;

/// The variable that makes a missing `huggingface_hub` a failure rather than a skip (CI).
const REQUIRE: &str = "SAFELOAD_REQUIRE_HF_HUB";

/// Whether `python3` has `huggingface_hub`; `false` after a `SKIPPED:` line where it has
/// not (a panic under `SAFELOAD_REQUIRE_HF_HUB=1`).
pub(super) fn has_hub_client() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import huggingface_hub"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let reason = "python3 cannot import huggingface_hub; pip install huggingface_hub";
        assert!(
            std::env::var_os(REQUIRE).is_none_or(|v| v != "1"),
            "{REQUIRE}=1 but {reason}"
        );
        eprintln!("SKIPPED: {reason}");
    }
    ok
}

/// Runs `script` with the hub's client pointed at `hub` and its cache, `args` as `sys.argv[1:]`;
/// returns its stdout, failing unless it succeeded.
pub(super) fn python(hub: &Hub, script: &str, args: &[&str], extra: &[(&str, &str)]) -> String {
    let mut cmd = Command::new("python3");
    cmd.arg("-c").arg(script).args(args);
    for var in safeload_testhttp::STORE_VARIABLES {
        cmd.env_remove(var);
    }
    for (k, v) in hub.vars() {
        cmd.env(k, v);
    }
    cmd.env("HF_HOME", std::env::temp_dir().join("safeload-no-hf-home"))
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("HF_HUB_DISABLE_XET", "1");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "python: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs [`FIND`] offline over the checkpoint's files: their names, and what it printed.
pub(super) fn find_offline(hub: &Hub) -> (Vec<String>, String) {
    let names = hub.names();
    let args: Vec<&str> = names.iter().map(String::as_str).collect();
    let out = python(hub, FIND, &args, &[("HF_HUB_OFFLINE", "1")]);
    (names, out)
}

/// The `FOUND` line [`FIND`] printed for `name`, and its fields.
pub(super) fn found<'a>(out: &'a str, name: &str) -> (&'a str, Vec<&'a str>) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("FOUND {name} ")))
        .unwrap_or_else(|| panic!("{name} not found by the hub's client:\n{out}"));
    (line, line.split(' ').collect())
}

/// For each file named in argv: the path `hf_hub_download` finds offline and the SHA-256 of
/// what it holds; then what `scan_cache_dir` sees.
const FIND: &str = r#"
import hashlib, sys
from huggingface_hub import hf_hub_download, scan_cache_dir
for name in sys.argv[1:]:
    path = hf_hub_download("org/model", name, local_files_only=True)
    with open(path, "rb") as f:
        print("FOUND", name, path, hashlib.sha256(f.read()).hexdigest())
info = scan_cache_dir()
for warning in info.warnings:
    print("WARNING", warning)
for repo in info.repos:
    for revision in repo.revisions:
        refs = ",".join(sorted(revision.refs))
        for f in revision.files:
            print("SCANNED", repo.repo_id, revision.commit_hash, refs, f.file_name, f.blob_path.name, f.size_on_disk)
"#;

#[test]
fn the_hubs_client_finds_every_file_a_load_wrote() {
    if !has_hub_client() {
        return;
    }
    let hub = Hub::new(Options::default());
    let report = hub.load("hf://org/model", &[]);
    assert_eq!(report.digest, hub.digest());
    let (names, out) = find_offline(&hub);
    for name in &names {
        let (line, fields) = found(&out, name);
        assert_eq!(
            fields[2],
            hub.snapshot().join(name).display().to_string(),
            "{line}"
        );
        assert_eq!(fields[3], sha256_hex(&hub.bytes(name)), "{line}");
        let scanned = out
            .lines()
            .find(|l| l.starts_with(&format!("SCANNED org/model {DEFAULT_COMMIT} main {name} ")))
            .unwrap_or_else(|| panic!("{name} not scanned:\n{out}"));
        let size: u64 = scanned.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(size, hub.bytes(name).len() as u64, "{scanned}");
    }
    assert!(!out.contains("WARNING"), "{out}");
}

/// Downloads the whole repository as the hub's client does.
const DOWNLOAD: &str = r#"
from huggingface_hub import snapshot_download
print("SNAPSHOT", snapshot_download("org/model"))
"#;

#[test]
fn a_cache_the_hubs_client_filled_loads_offline_without_a_request() {
    if !has_hub_client() {
        return;
    }
    let hub = Hub::new(Options {
        hub_redirect: true,
        ..Options::default()
    });
    let out = python(&hub, DOWNLOAD, &[], &[]);
    assert!(out.contains(&hub.snapshot().display().to_string()), "{out}");
    hub.server.reset_stats();
    let offline = hub.load("hf://org/model", &[("HF_HUB_OFFLINE", "1".to_owned())]);
    assert_eq!(offline.digest, hub.digest());
    assert!(offline.every("hit"), "{offline:#?}");
    assert_eq!(hub.server.stats().requests, 0, "{:?}", hub.server.stats());
    // Online, one question of the hub, and still every file from the cache, verified
    // against the names the client gave the blobs.
    let online = hub.load("hf://org/model", &[(VERIFY, "1".to_owned())]);
    assert!(online.every("hit"), "{online:#?}");
    assert!(hub.server.stats().requests <= 1);
}
