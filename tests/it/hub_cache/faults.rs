//! The hub cache when things go wrong: names another user planted, a cache that cannot be
//! written or runs out of space, a load killed half way, two processes and three local ranks
//! filling one cache at once. The load is never the worse for it; the cache holds only whole,
//! checked files.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use safeload_testhttp::{DEFAULT_COMMIT, Options};

use super::*;

/// Blobs published in the repository's folder (temporary files left out).
fn blobs(hub: &Hub) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(hub.repo_dir().join("blobs")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".incomplete"))
        .collect();
    names.sort();
    names
}

/// Every published blob holds the bytes its name says (a SHA-256, or a git blob id).
fn assert_blobs_whole(hub: &Hub) {
    let by_sha: BTreeMap<String, String> = hub
        .names()
        .into_iter()
        .map(|n| (sha256_hex(&hub.bytes(&n)), n))
        .collect();
    for blob in blobs(hub) {
        let bytes = std::fs::read(hub.repo_dir().join("blobs").join(&blob)).unwrap();
        if blob.len() == 64 {
            assert_eq!(sha256_hex(&bytes), blob, "a published blob is whole");
            assert!(by_sha.contains_key(&blob), "{blob} is none of the files");
        }
    }
}

#[test]
fn names_another_user_planted_in_the_cache_are_not_followed() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let outside = tempfile::tempdir().unwrap();
    // A snapshot link out of the cache, to a file holding the very bytes (the file's own
    // blob gone): not taken.
    let victim = shard_name(0, 3);
    let elsewhere = outside.path().join("copy.safetensors");
    std::fs::write(&elsewhere, hub.bytes(&victim)).unwrap();
    std::fs::remove_file(hub.snapshot().join(&victim)).unwrap();
    std::fs::remove_file(hub.blob(&victim)).unwrap();
    std::os::unix::fs::symlink(&elsewhere, hub.snapshot().join(&victim)).unwrap();
    // A link that climbs out through `..`, and a FIFO in place of a blob.
    let climber = shard_name(1, 3);
    std::fs::remove_file(hub.snapshot().join(&climber)).unwrap();
    std::fs::remove_file(hub.blob(&climber)).unwrap();
    std::os::unix::fs::symlink(
        format!("../../blobs/../../../{}", elsewhere.display()),
        hub.snapshot().join(&climber),
    )
    .unwrap();
    let fifo = shard_name(2, 3);
    let fifo_blob = sha256_hex(&hub.bytes(&fifo));
    let blob_path = hub.repo_dir().join("blobs").join(&fifo_blob);
    std::fs::remove_file(&blob_path).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&blob_path)
        .status();
    assert!(made.is_ok_and(|s| s.success()));
    // A FIFO at the lock's name of the first file: never waited on.
    let lock_dir = hub.cache.path().join(".locks/models--org--model");
    let lock = lock_dir.join(format!("{}.lock", sha256_hex(&hub.bytes(&victim))));
    std::fs::remove_file(&lock).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&lock)
            .status()
            .is_ok_and(|s| s.success())
    );
    let started = Instant::now();
    let report = hub.load("hf://org/model", &[]);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(report.digest, hub.digest());
    for name in [&victim, &climber, &fifo] {
        assert_ne!(report.code(name), "hit", "{name}: {report:#?}");
        // Fetched: named by its address, or where it was published.
        let (_, _, path) = &report.files[name.as_str()];
        let published = hub.snapshot().join(name.as_str()).display().to_string();
        assert!(
            path.starts_with("hf://") || *path == published,
            "{name} was read through the planted name: {path}"
        );
    }
    // The planted links led nowhere it was written through, and are the layout's again.
    assert_eq!(std::fs::read(&elsewhere).unwrap(), hub.bytes(&victim));
    assert_cached(&hub, &victim);
    assert_cached(&hub, &climber);
}

#[test]
fn a_cache_that_cannot_be_written_costs_the_cache_not_the_load() {
    let hub = Hub::new(Options::default());
    // The cache's path runs through a regular file: nothing can be made under it.
    let file = hub.cache.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let vars = [("HF_HUB_CACHE", file.join("hub").display().to_string())];
    let report = hub.load("hf://org/model", &vars);
    assert_eq!(report.digest, hub.digest());
    for i in 0..3 {
        let name = shard_name(i, 3);
        assert_eq!(report.code(&name), "not_cached", "{report:#?}");
        assert!(
            report.words(&name).contains("the cache cannot be written"),
            "{}",
            report.words(&name)
        );
    }
}

/// A tmpfs of `mib` MiB mounted on a temporary directory; unmounted on drop. `None`, after a
/// `SKIPPED:` line, where it cannot be mounted (not root), unless `SAFELOAD_REQUIRE_ROOT=1`.
struct Tmpfs(TempDir);

impl Tmpfs {
    fn mount(mib: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Tmpfs(dir)),
            other => {
                let reason = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                    Err(e) => e.to_string(),
                };
                let reason = format!("cannot mount a tmpfs (root is needed): {reason}");
                assert!(
                    std::env::var_os("SAFELOAD_REQUIRE_ROOT").is_none_or(|v| v != "1"),
                    "SAFELOAD_REQUIRE_ROOT=1 but {reason}"
                );
                eprintln!("SKIPPED: {reason}");
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_cache_too_small_for_the_checkpoint_costs_the_cache_not_the_load() {
    let Some(small) = Tmpfs::mount(64) else {
        return;
    };
    // 96 MiB in three shards: two at most fit.
    let files = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..48)
        .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[512, 1024]))
        .collect();
    write_sharded(files.path(), &specs, 3);
    let server = safeload_testhttp::Server::start(files.path(), Options::default()).unwrap();
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_HUB_CACHE", small.0.path().display().to_string()),
    ];
    let report = run_load("hf://org/big", &vars);
    assert_eq!(
        report.digest,
        digest_of(&naive_load(&shards_of(files.path())))
    );
    let full: Vec<&String> = report
        .files
        .iter()
        .filter(|(_, (code, words, _))| code == "not_cached" && words.contains("no space"))
        .map(|(name, _)| name)
        .collect();
    assert!(!full.is_empty(), "{report:#?}");
    assert!(
        incomplete(small.0.path()).is_empty(),
        "{:?}",
        tree(small.0.path())
    );
    // What was published is whole.
    let repo = small.0.path().join("models--org--big");
    for (name, (code, _, _)) in &report.files {
        if code == "written" {
            let cached = std::fs::read(repo.join("snapshots").join(DEFAULT_COMMIT).join(name));
            assert!(cached.unwrap() == std::fs::read(files.path().join(name)).unwrap());
        }
    }
}

#[test]
fn a_killed_load_publishes_nothing_and_the_next_load_does() {
    // Slow enough to be killed half way: 1 MiB/s for ~6 MiB (each file fetched into the
    // file being written).
    let hub = Hub::aligned(Options {
        bandwidth_bytes_per_sec: Some(1 << 20),
        latency: Some(Duration::from_millis(20)),
        ..Options::default()
    });
    let mut child = load_command("hf://org/model", &hub.vars())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let blobs_dir = hub.repo_dir().join("blobs");
    let deadline = Instant::now() + Duration::from_secs(60);
    while partials(&blobs_dir).is_empty() {
        assert!(Instant::now() < deadline, "no write began");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the load ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // No shard was published: no blob of one, no link to one.
    let shards: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
    for name in &shards {
        assert!(
            !blobs(&hub).contains(&sha256_hex(&hub.bytes(name))),
            "{name} published by a killed load"
        );
        assert!(std::fs::symlink_metadata(hub.snapshot().join(name)).is_err());
    }
    assert_blobs_whole(&hub);
    let next = hub.load("hf://org/model", &[]);
    assert_eq!(next.digest, hub.digest());
    for name in &shards {
        assert_eq!(next.code(name), "written", "{next:#?}");
        assert_cached(&hub, name);
    }
}

#[test]
fn what_dead_writers_left_is_swept_and_what_live_ones_write_is_not() {
    let hub = Hub::new(Options::default());
    let blobs_dir = hub.repo_dir().join("blobs");
    std::fs::create_dir_all(&blobs_dir).unwrap();
    let sha = sha256_hex(&hub.bytes(&shard_name(0, 3)));
    let old = blobs_dir.join(format!("{sha}.deadbeef.incomplete"));
    let fresh = blobs_dir.join(format!("{sha}.cafef00d.incomplete"));
    for path in [&old, &fresh] {
        std::fs::write(path, b"half a file").unwrap();
    }
    // Not written to for two hours: its writer is gone.
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    let report = hub.load("hf://org/model", &[]);
    assert_eq!(report.digest, hub.digest());
    assert!(!old.exists(), "a dead writer's file is swept");
    assert!(fresh.exists(), "a live writer's file is left alone");
    assert_cached(&hub, &shard_name(0, 3));
}

#[test]
fn a_cancelled_load_publishes_nothing_and_leaves_only_what_the_next_load_resumes() {
    // ~6 MiB at 1 MiB/s, each file fetched into the file being written: cancelled half a
    // second in.
    let hub = Hub::aligned(Options {
        bandwidth_bytes_per_sec: Some(1 << 20),
        ..Options::default()
    });
    // Reads of 64 KiB: a reader stops at its next one.
    let vars = [
        ("SAFELOAD_TEST_HUB_CANCEL_MS", "500".to_owned()),
        ("SAFELOAD_TEST_HUB_READ_SIZE", (64 << 10).to_string()),
    ];
    let e = hub.fail("hf://org/model", &vars);
    assert!(e.contains("cancelled=true"), "{e}");
    for i in 0..3 {
        let name = shard_name(i, 3);
        assert!(
            !blobs(&hub).contains(&sha256_hex(&hub.bytes(&name))),
            "{name}"
        );
        assert!(std::fs::symlink_metadata(hub.snapshot().join(&name)).is_err());
    }
    // Only the partial files kept for the next load (and their records).
    assert!(
        incomplete(hub.cache.path()).is_empty(),
        "{:?}",
        tree(hub.cache.path())
    );
    let next = hub.load("hf://org/model", &[]);
    assert_eq!(next.digest, hub.digest());
    assert!(
        partials(hub.cache.path()).is_empty(),
        "{:?}",
        tree(hub.cache.path())
    );
}

/// Starts a load that holds its tensors once loaded until told to go.
fn spawn_holding(
    url: &str,
    vars: &[(&'static str, String)],
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = load_command(url, vars)
        .env(HOLD, "1")
        .stdin(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

/// Reads a holding child's report, up to its `HUB-HOLDING` line.
fn read_until_holding(out: &mut BufReader<std::process::ChildStdout>) -> Report {
    let mut text = String::new();
    loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "ended early:\n{text}"
        );
        text.push_str(&line);
        if line.contains("HUB-HOLDING") {
            return parse(&text);
        }
    }
}

/// Lets a holding child go, reads the rest of what it prints, and checks it ends well.
fn release(mut child: std::process::Child, mut out: BufReader<std::process::ChildStdout>) {
    if let Some(mut stdin) = child.stdin.take() {
        let _ = writeln!(stdin, "go");
    }
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    assert!(child.wait().unwrap().success(), "{rest}");
}

#[test]
fn two_processes_loading_one_cold_repository_both_load_and_publish_each_file_once() {
    // Each file fetched into the file being written by the process whose lock it is.
    let hub = Hub::aligned(Options {
        latency: Some(Duration::from_millis(10)),
        ..Options::default()
    });
    let first = spawn_holding("hf://org/model", &hub.vars());
    let second = spawn_holding("hf://org/model", &hub.vars());
    let mut reports = Vec::new();
    let mut children = Vec::new();
    for (child, mut out) in [first, second] {
        reports.push(read_until_holding(&mut out));
        children.push((child, out));
    }
    for (child, out) in children {
        release(child, out);
    }
    for report in &reports {
        assert_eq!(report.digest, hub.digest(), "{report:#?}");
    }
    for i in 0..3 {
        let name = shard_name(i, 3);
        let written = reports
            .iter()
            .filter(|r| r.code(&name) == "written")
            .count();
        assert!(written <= 1, "{name} published twice: {reports:#?}");
        assert_cached(&hub, &name);
    }
    assert!(incomplete(hub.cache.path()).is_empty());
    assert_blobs_whole(&hub);
}

#[test]
fn three_local_ranks_fetch_each_byte_once_and_write_each_blob_once() {
    let hub = Hub::new(Options::default());
    let job = format!("safeload-hub-cache-test-{}", std::process::id());
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            let mut vars = hub.vars();
            vars.push(("LOCAL_RANK", rank.to_string()));
            vars.push(("LOCAL_WORLD_SIZE", "3".to_owned()));
            vars.push(("TORCHELASTIC_RUN_ID", job.clone()));
            spawn_holding("hf://org/model", &vars)
        })
        .collect();
    let mut reports = Vec::new();
    let mut children = Vec::new();
    for (child, mut out) in ranks {
        reports.push(read_until_holding(&mut out));
        children.push((child, out));
    }
    for (child, out) in children {
        release(child, out);
    }
    let mut total = 0;
    for i in 0..3 {
        let name = shard_name(i, 3);
        let written = reports
            .iter()
            .filter(|r| r.code(&name) == "written")
            .count();
        assert_eq!(written, 1, "{name}: {reports:#?}");
        for report in &reports {
            assert_eq!(report.digest, hub.digest());
            // A rank that waits for the one that writes it says so; one whose
            // process started after that write was published (a loaded machine
            // can start a process seconds late) finds it in the cache instead,
            // which is as right: no byte fetched twice, no blob written twice.
            if report.code(&name) != "written" {
                let words = report.words(&name);
                assert!(
                    words.contains("another local rank writes it") || report.code(&name) == "hit",
                    "{words}"
                );
            }
        }
        assert_cached(&hub, &name);
        total += hub.bytes(&name).len() as u64;
    }
    // Each byte of the shards once (and each rank's header request: 64 KiB a file).
    let sent: u64 = (0..3)
        .map(|i| hub.server.path_stats(&shard_name(i, 3)).bytes_sent)
        .sum();
    assert!(
        sent <= total + 3 * 3 * (64 << 10),
        "{sent} bytes sent for {total}"
    );
    assert!(incomplete(hub.cache.path()).is_empty());
}
