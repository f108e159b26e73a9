//! Remote checkpoints (feature `remote`) through the public API: `http://` against the
//! crate's test server (`safeload-testhttp`), `hf://` against the same server as the hub
//! (`HF_ENDPOINT`), `s3://` against `moto_server`. Every load is compared with a naive load
//! of the same files (the twin); faults are the server's knobs. The variables that configure
//! the stores (`HF_ENDPOINT`, `AWS_*`) are process-wide: what needs them runs in a child.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use safeload::report::{LoadNote, Reason, Strategy};
use safeload::{Checkpoint, ErrorKind, Loader, RemoteFailure};
use safeload_testhttp::moto::Moto;
use safeload_testhttp::{DEFAULT_COMMIT, Fault, FaultEvery, Options, Server};
use safetensors::Dtype;
use tempfile::TempDir;

use crate::common::child::{PATH, child_command, run_role};
use crate::common::*;

const MODULE: &str = module_path!();

/// A sharded checkpoint (every dtype, and a few MiB of F32 so that reads span many
/// requests) in a temporary directory: the directory, and the naive load of its files.
fn sharded() -> (TempDir, Vec<Spec>) {
    let dir = tempfile::tempdir().unwrap();
    let mut specs = every_dtype();
    for i in 0..6 {
        specs.push(spec(&format!("big.{i}"), Dtype::F32, &[256, 1024 + i]));
    }
    write_sharded(dir.path(), &specs, 3);
    let expected = naive_load(&shards_of(dir.path()));
    (dir, expected)
}

fn serve(dir: &Path, options: Options) -> Server {
    Server::start(dir, options).unwrap()
}

/// The load's report says every file was read buffered, by ranged requests.
fn assert_remote_report(sd: &safeload::StateDict) {
    for file in &sd.report().files {
        assert_eq!(file.strategy, Strategy::Buffered, "{file:?}");
        assert_eq!(file.reason, Reason::Remote, "{file:?}");
    }
}

#[test]
fn http_loads_equal_local_loads_in_every_form() {
    let (dir, expected) = sharded();
    let server = serve(dir.path(), Options::default());
    let base = server.url();
    for url in [
        format!("{base}/"),
        format!("{base}/model.safetensors.index.json"),
        format!("{base}/org/repo/resolve/main/"),
    ] {
        for loader in [Loader::new(), Loader::new().disable_mmap(false)] {
            let sd = loader.load(&url).unwrap();
            assert_eq!(loaded(&sd), expected, "{url}");
            assert_remote_report(&sd);
            assert!(
                sd.report().files[0]
                    .path
                    .to_string_lossy()
                    .starts_with("http://"),
                "{:?}",
                sd.report().files[0].path
            );
        }
    }
    // A single file, named or found as model.safetensors, through load_state_dict.
    let single = tempfile::tempdir().unwrap();
    let specs = every_dtype();
    let path = write_single(single.path(), &specs);
    let server = serve(single.path(), Options::default());
    for url in [
        format!("{}/", server.url()),
        format!("{}/model.safetensors", server.url()),
    ] {
        let sd = safeload::load_state_dict(&url, None).unwrap();
        assert_eq!(loaded(&sd), naive_load(std::slice::from_ref(&path)));
    }
}

#[test]
fn conversion_filter_and_verify_work_on_remote_files() {
    let (dir, expected) = sharded();
    let server = serve(dir.path(), Options::default());
    let url = format!("{}/", server.url());
    let local = Loader::new()
        .dtype(Dtype::F16)
        .filter(|n| n.starts_with("big.") || n.starts_with("f32"))
        .load(dir.path())
        .unwrap();
    let remote = Loader::new()
        .dtype(Dtype::F16)
        .filter(|n| n.starts_with("big.") || n.starts_with("f32"))
        .verify(true)
        .load(&url)
        .unwrap();
    assert_eq!(loaded(&remote), loaded(&local));
    assert!(!loaded(&remote).is_empty());
    // Verify with a digest that is not the file's: the mismatch is found.
    let sd = Loader::new().verify(true).load(&url).unwrap();
    assert_eq!(loaded(&sd), expected);
    let shard = shard_name(0, 3);
    let e = Loader::new()
        .expect_sha256(&shard, &"0".repeat(64))
        .load(&url)
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::IntegrityMismatch { .. }),
        "{e}"
    );
}

#[test]
fn header_only_open_takes_at_most_two_requests_per_file() {
    let (dir, expected) = sharded();
    let server = serve(dir.path(), Options::default());
    let ck = Checkpoint::open(format!("{}/", server.url())).unwrap();
    assert_eq!(ck.len(), expected.len());
    let stats = server.stats();
    // The index (read whole), then per shard one ranged GET of its first bytes, which hold
    // its header.
    for i in 0..3 {
        let name = shard_name(i, 3);
        let per = server.path_stats(&name);
        assert!(per.requests <= 2, "{name}: {per:?}");
        assert!(per.requests >= 1, "{name}: {per:?}");
    }
    assert!(stats.bytes_sent < 1 << 20, "{stats:?}");
    // A tensor read afterwards moves its bytes, not the file's.
    server.reset_stats();
    let info = ck.get("big.3").unwrap();
    let t = ck.read("big.3").unwrap();
    let want = expected.iter().find(|s| s.name == "big.3").unwrap();
    assert_eq!(t.as_bytes(), &want.data[..]);
    let sent = server.stats().bytes_sent;
    assert!(
        sent >= info.nbytes() && sent <= info.nbytes() + (64 << 10),
        "{sent} for {} bytes",
        info.nbytes()
    );
}

#[test]
fn a_rank_slice_moves_only_its_rows() {
    let (dir, expected) = sharded();
    let server = serve(dir.path(), Options::default());
    let ck = Checkpoint::open(format!("{}/", server.url())).unwrap();
    server.reset_stats();
    let t = ck.shard("big.5", 0, 1, 8).unwrap();
    let want = expected.iter().find(|s| s.name == "big.5").unwrap();
    let row = want.data.len() / 256;
    assert_eq!(t.as_bytes(), &want.data[32 * row..64 * row]);
    let sent = server.stats().bytes_sent;
    assert!(sent <= (32 * row) as u64 + 4096, "{sent}");
}

#[test]
fn faults_are_retried_and_the_load_is_exact() {
    let (dir, expected) = sharded();
    for fault in [
        Fault::ServiceUnavailable,
        Fault::ResetMidBody,
        Fault::ShortBody,
    ] {
        let server = serve(
            dir.path(),
            Options {
                fault: Some(FaultEvery { every: 4, fault }),
                ..Options::default()
            },
        );
        let sd = Loader::new()
            .read_size(1 << 20)
            .load(format!("{}/", server.url()))
            .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
        assert_eq!(loaded(&sd), expected, "{fault:?}");
        assert!(server.stats().faults > 0, "{fault:?}");
    }
}

/// A server that ignores `Range` (as `python3 -m http.server` does) is asked
/// once for a file no longer than the open's range (the index), and twice for
/// a longer one: the open keeps the first bytes it asked for and drops the
/// connection with the rest (so that a header is checked before a body is
/// held), then one whole GET serves every read. No HEAD; the tensors are
/// right, and the report says so, typed.
#[test]
fn a_server_that_ignores_range_answers_at_most_two_requests_per_file() {
    let (dir, expected) = sharded();
    let server = serve(
        dir.path(),
        Options {
            ignore_range: true,
            ..Options::default()
        },
    );
    let sd = Loader::new()
        .read_size(1 << 20)
        .load(format!("{}/", server.url()))
        .unwrap();
    assert_eq!(loaded(&sd), expected);
    let shards = shards_of(dir.path());
    let index = "model.safetensors.index.json";
    let mut sent = 0;
    for name in shards
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_owned())
        .chain([index.to_owned()])
    {
        let file = server.path_stats(&name);
        let len = std::fs::metadata(dir.path().join(&name)).unwrap().len();
        let asked = if len <= 64 << 10 { 1 } else { 2 };
        assert_eq!(file.requests, asked, "{name}: {file:?}");
        // Whole once; the open's answer cut where the connection was dropped.
        assert!(
            (len..=asked * len).contains(&file.bytes_sent),
            "{name}: {file:?} for {len}"
        );
        sent += file.bytes_sent;
    }
    // Besides: the directory's probe for a single `model.safetensors` (404).
    let probe = server.path_stats("model.safetensors");
    assert_eq!((probe.requests, probe.bytes_sent), (1, 0));
    let stats = server.stats();
    assert_eq!(stats.head_requests, 0, "{stats:?}");
    assert_eq!(stats.requests, 2 * shards.len() as u64 + 2, "{stats:?}");
    assert_eq!(stats.bytes_sent, sent, "{stats:?}");
    let notes = &sd.report().notes;
    assert_eq!(
        notes,
        &[LoadNote::RangesIgnored {
            files: shards.len()
        }],
        "{notes:?}"
    );
    assert!(
        sd.report()
            .to_string()
            .contains("note: the server ignores Range: each file fetched whole"),
        "{}",
        sd.report()
    );
}

#[test]
fn missing_and_denied_are_typed_errors_at_once() {
    let (dir, _) = sharded();
    let server = serve(dir.path(), Options::default());
    let e = Loader::new()
        .load(format!("{}/nothing-here/", server.url()))
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(matches!(e.kind(), ErrorKind::NoCheckpoint { .. }), "{e}");
    let e = Loader::new()
        .load(format!("{}/missing.safetensors", server.url()))
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(matches!(e.kind(), ErrorKind::Remote { .. }), "{e}");
    assert_eq!(e.remote_failure(), Some(RemoteFailure::FileNotFound), "{e}");
    assert!(
        e.path()
            .is_some_and(|p| p.to_string_lossy().ends_with("/missing.safetensors")),
        "{e}"
    );
    // A shard the index names is gone: the shard's address in the error.
    std::fs::remove_file(dir.path().join(shard_name(1, 3))).unwrap();
    let e = Loader::new()
        .load(format!("{}/", server.url()))
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.remote_failure(), Some(RemoteFailure::FileNotFound), "{e}");
    assert!(e.to_string().contains(&shard_name(1, 3)), "{e}");
}

#[test]
fn an_object_replaced_mid_load_is_an_error_never_a_mix() {
    let (dir, _) = sharded();
    let name = shard_name(0, 3);
    let len = std::fs::metadata(dir.path().join(&name)).unwrap().len() as usize;
    let other = bytes_for("another version", len);
    let server = serve(
        dir.path(),
        Options {
            latency: Some(Duration::from_millis(30)),
            ..Options::default()
        },
    );
    // Opened before the replacement, read after it (replaced once the open is over, not
    // after a delay a busy machine's open can outlast).
    let ck = Checkpoint::open(format!("{}/", server.url())).unwrap();
    server.replace(&name, other);
    let e = ck.load_filtered(|_| true).unwrap_err();
    match e.kind() {
        ErrorKind::Remote { reason, range, .. } => {
            assert!(reason.contains("changed since it was opened"), "{e}");
            assert!(range.is_some(), "{e}");
        }
        other => panic!("{other}: {e}"),
    }
    assert!(e.to_string().contains(&name), "{e}");
}

#[test]
fn an_unreachable_server_is_a_remote_error_naming_it() {
    // Not a missing local file: the address, and what failed.
    let e = safeload::load_state_dict("http://127.0.0.1:9/m/", None).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Remote { .. }), "{e}");
    assert!(e.to_string().starts_with("http://127.0.0.1:9/m"), "{e}");
}

// ---------------------------------------------------------------------------
// What needs the process's environment: in a child.

/// Set in a child: the value of `HF_ENDPOINT`/`AWS_ENDPOINT_URL` etc. come with it.
const EXPECT: &str = "SAFELOAD_TEST_REMOTE_EXPECT";

#[test]
fn child() {
    run_role(&[("load", act_load), ("denied", act_denied)]);
}

/// Loads `PATH` (a URL) with `verify`, prints the tensors' digest and each file's path.
fn act_load() {
    let url = std::env::var(PATH).unwrap();
    let sd = Loader::new().verify(true).load(&url).unwrap();
    assert_remote_report(&sd);
    println!("REMOTE-DIGEST {}", digest_of_specs(&loaded(&sd)));
    for file in &sd.report().files {
        println!("REMOTE-FILE {}", file.path.display());
        assert!(file.sha256.is_some(), "{file:?}");
    }
    let ck = Checkpoint::open(&url).unwrap();
    println!("REMOTE-TENSORS {}", ck.len());
    let expect: usize = std::env::var(EXPECT).unwrap().parse().unwrap();
    assert_eq!(ck.len(), expect);
}

/// Loads `PATH` and expects access to be denied, without the token in the error.
fn act_denied() {
    let url = std::env::var(PATH).unwrap();
    let e = Loader::new().load(&url).unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(
        e.io_error()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied),
        "{text}"
    );
    assert_eq!(
        e.remote_failure(),
        Some(RemoteFailure::Unauthorized),
        "{text}"
    );
    for secret in ["hf_wrong_token_value", "moto-secret-key-123"] {
        assert!(!text.contains(secret), "{text}");
    }
    println!("REMOTE-DENIED");
}

fn digest_of_specs(specs: &[Spec]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for s in specs {
        s.name.hash(&mut h);
        format!("{:?}{:?}", s.dtype, s.shape).hash(&mut h);
        s.data.hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

/// Runs role `role` on `url` with `vars` set; returns its stdout.
fn run_child(role: &str, url: &str, vars: &[(&str, String)]) -> String {
    let mut cmd = child_command(MODULE, role, Path::new(url));
    for var in safeload_testhttp::STORE_VARIABLES {
        cmd.env_remove(var);
    }
    // No token file of a real user is read; these loads stream (the hub cache's own tests
    // are `tests/it/hub_cache.rs`).
    cmd.env("HF_HOME", std::env::temp_dir().join("safeload-no-hf-home"));
    cmd.env("SAFELOAD_HUB_CACHE", "0");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.stderr(Stdio::inherit()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains(&format!("CHILD-DONE {role}")),
        "{role} {url}: {}\n{stdout}",
        out.status
    );
    stdout
}

fn line_of<'a>(stdout: &'a str, key: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.split_once(key).map(|(_, v)| v.trim()))
        .unwrap_or_else(|| panic!("no {key} in\n{stdout}"))
}

#[test]
fn hub_loads_pin_one_commit_and_check_the_lfs_digest() {
    let (dir, expected) = sharded();
    let server = serve(
        dir.path(),
        Options {
            token: Some("hf_right_token_value".into()),
            hub_redirect: true,
            ..Options::default()
        },
    );
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_TOKEN", "hf_right_token_value".to_owned()),
        (EXPECT, expected.len().to_string()),
    ];
    let stdout = run_child("load", "hf://org/model", &vars);
    assert_eq!(
        line_of(&stdout, "REMOTE-DIGEST "),
        digest_of_specs(&expected)
    );
    // Every file at the commit the first answer named, whatever revision was asked.
    for line in stdout.lines().filter_map(|l| l.split_once("REMOTE-FILE ")) {
        assert!(
            line.1
                .starts_with(&format!("hf://org/model@{DEFAULT_COMMIT}/")),
            "{line:?}"
        );
    }
    assert!(server.revision_requests(DEFAULT_COMMIT) > 0);
    let stdout = run_child("load", "hf://org/model@main", &vars);
    assert_eq!(
        line_of(&stdout, "REMOTE-DIGEST "),
        digest_of_specs(&expected)
    );
    // A wrong token: denied at once, and the token in no error.
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_TOKEN", "hf_wrong_token_value".to_owned()),
    ];
    run_child("denied", "hf://org/model", &vars);
}

#[test]
fn s3_loads_through_moto_equal_local_loads() {
    let Some(moto) = Moto::start() else {
        return;
    };
    let (dir, expected) = sharded();
    moto.create_bucket("models").unwrap();
    for file in std::fs::read_dir(dir.path()).unwrap() {
        let path: PathBuf = file.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        moto.put(
            "models",
            &format!("llama/{name}"),
            &std::fs::read(&path).unwrap(),
        )
        .unwrap();
    }
    let mut vars = moto.s3_vars();
    vars.push((EXPECT, expected.len().to_string()));
    let stdout = run_child("load", "s3://models/llama", &vars);
    assert_eq!(
        line_of(&stdout, "REMOTE-DIGEST "),
        digest_of_specs(&expected)
    );
    assert!(
        stdout.contains(&format!(
            "REMOTE-FILE s3://models/llama/{}",
            shard_name(0, 3)
        )),
        "{stdout}"
    );
    // A wrong secret key is refused... moto checks none; a missing bucket is not found.
    let mut vars = moto.s3_vars();
    vars.push((EXPECT, "0".to_owned()));
    let mut cmd = child_command(MODULE, "load", Path::new("s3://no-such-bucket/m"));
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let out = cmd.stderr(Stdio::piped()).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("moto-secret-key-123"), "{stderr}");
}

#[test]
fn local_ranks_fetch_each_byte_once_per_node() {
    use crate::node_copy::{HOLD, digest, job_id, spawn_job};
    let (dir, expected) = sharded();
    let server = serve(dir.path(), Options::default());
    let url = format!("{}/", server.url());
    let total = total_size(&shards_of(dir.path()));
    server.reset_stats();
    // Each rank holds its tensors until all have loaded, as ranks of one job do.
    let hold = [(HOLD, "1".to_string())];
    let mut ranks = spawn_job(Path::new(&url), 3, &job_id(), &hold);
    let want = digest(&expected);
    for rank in &mut ranks {
        rank.loaded().assert_copied(want);
    }
    for rank in ranks {
        rank.release();
    }
    // The shards' bytes once (and each rank's header-only open: at most 64 KiB a file).
    let shards: u64 = (0..3)
        .map(|i| server.path_stats(&shard_name(i, 3)).bytes_sent)
        .sum();
    let opens = 3 * 3 * (64 << 10);
    assert!(
        shards <= total + opens,
        "{shards} bytes sent for {total} bytes of shards"
    );
}

#[test]
fn an_async_remote_load_leaves_the_callers_runtime_free() {
    use std::sync::{Arc, Mutex};
    let (dir, expected) = sharded();
    // 20 ms a request: the load takes a while, all of it off the runtime's thread.
    let server = serve(
        dir.path(),
        Options {
            latency: Some(Duration::from_millis(20)),
            ..Options::default()
        },
    );
    let url = format!("{}/", server.url());
    // On a busy machine one run may see the runtime's thread descheduled: the bound must
    // hold in one of three (an executor the load blocked would miss it in every one).
    let mut seen = Vec::new();
    for _ in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let beats = Arc::new(Mutex::new((0u32, Duration::ZERO)));
        let sd = runtime.block_on(async {
            let counter = Arc::clone(&beats);
            let beat = tokio::spawn(async move {
                let mut interval = tokio::time::interval(Duration::from_millis(10));
                let mut last = std::time::Instant::now();
                loop {
                    interval.tick().await;
                    let now = std::time::Instant::now();
                    let mut c = counter.lock().unwrap();
                    c.0 += 1;
                    c.1 = c.1.max(now - last);
                    last = now;
                }
            });
            let sd = Loader::new().read_size(1 << 20).load_async(&url).await;
            beat.abort();
            sd
        });
        assert_eq!(loaded(&sd.unwrap()), expected);
        let (ticks, gap) = *beats.lock().unwrap();
        seen.push((ticks, gap));
        if ticks >= 3 && gap <= Duration::from_millis(50) {
            return;
        }
    }
    panic!("the heartbeat stalled in every run: (ticks, longest gap) {seen:?}");
}
