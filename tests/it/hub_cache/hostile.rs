//! Remote loads under slow, broken and hostile servers: a cancel (the flag, a dropped
//! future) mid-request on a slow link; a server that claims a terabyte body; a body that
//! drips and a HEAD never answered; a hub answering a pinned commit with another one's
//! files; repository names the hub refuses; a file planted in a snapshot under `verify`; a
//! 404 without the commit; an unreachable hub with a warm cache; another client's lock
//! files beside the blobs. Each load runs in a child (`hostile` role) that prints what it
//! got and when.

use std::io::{BufRead, BufReader, Write as _};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use safeload_testhttp::{DEFAULT_COMMIT, Options, Server};

use super::*;

/// Set in a child: set the cancel flag this many ms into the load.
const CANCEL_MS: &str = "SAFELOAD_TEST_HOSTILE_CANCEL_MS";
/// Set in a child: drop the load's future this many ms in, then live on for `LINGER_MS`.
const DROP_MS: &str = "SAFELOAD_TEST_HOSTILE_DROP_MS";
const LINGER_MS: &str = "SAFELOAD_TEST_HOSTILE_LINGER_MS";
/// Set in a child: `Loader::verify(true)`.
const VERIFY: &str = "SAFELOAD_TEST_HOSTILE_VERIFY";
/// Set in a child: this many reads in flight (`Loader::io_concurrency`).
const READERS: &str = "SAFELOAD_TEST_HOSTILE_READERS";

/// A slow link's checkpoint: 48 MiB of F32 in 3 shards, read by eight readers (`READERS`)
/// sharing a 4 MiB/s link: each request of several MiB takes seconds.
fn slow_hub() -> Hub {
    let specs: Vec<Spec> = (0..12)
        .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[1024, 1024]))
        .collect();
    Hub::of(
        &specs,
        Options {
            bandwidth_bytes_per_sec: Some(4 << 20),
            ..Options::default()
        },
    )
}

/// The variables of a slow hub's child: eight readers.
fn slow_vars(hub: &Hub) -> Vec<(&'static str, String)> {
    let mut vars = hub.vars();
    vars.push((READERS, "8".to_owned()));
    vars
}

// ---------------------------------------------------------------------------
// The child.

/// Loads `PATH` as the variables say; prints `HOSTILE-OK <s> <digest>` and a
/// `HOSTILE-FILE <name> <commit> <etag>` per file, or `HOSTILE-ERR <s> <ms since the
/// flag was set> cancelled=<bool> corrupt=<bool> :: <error>`; after a dropped future,
/// `HOSTILE-DROPPED`, then `HOSTILE-END` once it has lived on.
pub(super) fn act() {
    let url = std::env::var(PATH).unwrap();
    let var = |name| std::env::var(name).ok();
    let mut loader = Loader::new();
    if var(VERIFY).is_some() {
        loader = loader.verify(true);
    }
    if let Some(readers) = var(READERS) {
        loader = loader.io_concurrency(readers.parse().unwrap());
    }
    let set_at: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    if let Some(ms) = var(CANCEL_MS) {
        let flag = Arc::new(AtomicBool::new(false));
        loader = loader.cancel_on(Arc::clone(&flag));
        let set_at = Arc::clone(&set_at);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap()));
            *set_at.lock().unwrap() = Some(Instant::now());
            flag.store(true, Ordering::Relaxed);
        });
    }
    if let Some(ms) = var(DROP_MS) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let ms: u64 = ms.parse().unwrap();
        let out = runtime.block_on(async {
            tokio::time::timeout(Duration::from_millis(ms), loader.load_async(&url)).await
        });
        assert!(out.is_err(), "the load ended before its future was dropped");
        println!("HOSTILE-DROPPED");
        std::io::stdout().flush().unwrap();
        let linger: u64 = var(LINGER_MS).map_or(3000, |v| v.parse().unwrap());
        std::thread::sleep(Duration::from_millis(linger));
        println!("HOSTILE-END");
        return;
    }
    let start = Instant::now();
    match loader.load(&url) {
        Ok(sd) => {
            let seconds = start.elapsed().as_secs_f64();
            println!("HOSTILE-OK {seconds:.3} {}", digest_of(&loaded(&sd)));
            for file in &sd.report().files {
                let name = file.path.file_name().unwrap().to_string_lossy();
                let commit = file.commit.as_deref().unwrap_or("-");
                let etag = file.etag.as_deref().unwrap_or("-");
                println!("HOSTILE-FILE {name} {commit} {etag}");
            }
            let listing = safeload::hub::hub_cache(Some("org/model"));
            let blobs: usize = listing.repos.iter().map(|r| r.blobs).sum();
            println!("HOSTILE-BLOBS {blobs}");
        }
        Err(e) => {
            let seconds = start.elapsed().as_secs_f64();
            let since = set_at
                .lock()
                .unwrap()
                .map_or(-1.0, |t| t.elapsed().as_secs_f64() * 1000.0);
            let cancelled = e.kind() == &safeload::ErrorKind::Cancelled;
            let corrupt = e.is_corrupt();
            println!(
                "HOSTILE-ERR {seconds:.3} {since:.0} cancelled={cancelled} corrupt={corrupt} :: {e}"
            );
        }
    }
}

/// What a child printed.
struct Outcome {
    stdout: String,
}

impl Outcome {
    fn line(&self, key: &str) -> Option<&str> {
        self.stdout
            .lines()
            .find_map(|l| l.split_once(key).map(|(_, rest)| rest.trim()))
    }

    fn ok(&self) -> (f64, &str) {
        let rest = self
            .line("HOSTILE-OK ")
            .unwrap_or_else(|| panic!("not loaded:\n{}", self.stdout));
        let (seconds, digest) = rest.split_once(' ').unwrap();
        (seconds.parse().unwrap(), digest)
    }

    /// The error line: its seconds, ms since the flag, and the rest.
    fn err(&self) -> (f64, f64, &str) {
        let rest = self
            .line("HOSTILE-ERR ")
            .unwrap_or_else(|| panic!("no error:\n{}", self.stdout));
        let mut parts = rest.splitn(3, ' ');
        let seconds = parts.next().unwrap().parse().unwrap();
        let since = parts.next().unwrap().parse().unwrap();
        (seconds, since, parts.next().unwrap())
    }

    /// `(commit, etag)` of the file `name`.
    fn file(&self, name: &str) -> (String, String) {
        let line = self
            .line(&format!("HOSTILE-FILE {name} "))
            .unwrap_or_else(|| panic!("no {name}:\n{}", self.stdout));
        let (commit, etag) = line.split_once(' ').unwrap();
        (commit.to_owned(), etag.to_owned())
    }
}

fn hostile_command(url: &str, vars: &[(&'static str, String)]) -> std::process::Command {
    let mut cmd = load_command(url, vars);
    cmd.env(crate::common::child::ROLE, "hostile");
    cmd
}

fn run_hostile(url: &str, vars: &[(&'static str, String)]) -> Outcome {
    let out = hostile_command(url, vars)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE hostile"),
        "{url}: {}\n{stdout}",
        out.status
    );
    Outcome { stdout }
}

/// The blobs of shards published in the hub's repository folder.
fn published_shards(hub: &Hub) -> Vec<String> {
    (0..3)
        .map(|i| shard_name(i, 3))
        .filter(|name| {
            let blob = hub
                .repo_dir()
                .join("blobs")
                .join(sha256_hex(&hub.bytes(name)));
            blob.exists() || std::fs::symlink_metadata(hub.snapshot().join(name)).is_ok()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Cancel.

#[test]
fn a_cancel_mid_request_returns_cancelled_within_a_second_and_publishes_nothing() {
    let hub = slow_hub();
    let mut vars = slow_vars(&hub);
    vars.push((CANCEL_MS, "700".to_owned()));
    let out = run_hostile("hf://org/model", &vars);
    let (seconds, since, rest) = out.err();
    assert!(rest.starts_with("cancelled=true"), "{rest}");
    eprintln!("MEASURED cancel flag: returned {since:.0} ms after it, {seconds:.3} s in all");
    assert!(
        (0.0..1000.0).contains(&since),
        "returned {since} ms after the flag: {rest}"
    );
    assert!(seconds < 2.5, "{seconds} s");
    // The link moves 4 MiB/s: the load stopped well before the checkpoint's 48 MiB.
    assert!(
        hub.server.stats().bytes_sent < 16 << 20,
        "{:?}",
        hub.server.stats()
    );
    assert!(
        published_shards(&hub).is_empty(),
        "{:?}",
        tree(hub.cache.path())
    );
}

#[test]
fn a_dropped_load_future_stops_its_requests_and_publishes_nothing() {
    let hub = slow_hub();
    let mut vars = slow_vars(&hub);
    vars.push((DROP_MS, "700".to_owned()));
    vars.push((LINGER_MS, "3000".to_owned()));
    let mut child = hostile_command("hf://org/model", &vars)
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("HOSTILE-DROPPED") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended early"
        );
    }
    // The child lives on for 3 s; what the server sends from 1 s after the drop on is what
    // a load that kept going would send (4 MiB/s).
    std::thread::sleep(Duration::from_secs(1));
    let at_one = hub.server.stats().bytes_sent;
    std::thread::sleep(Duration::from_millis(1500));
    let later = hub.server.stats().bytes_sent;
    eprintln!(
        "MEASURED dropped future: {} bytes sent 1-2.5 s after the drop",
        later - at_one
    );
    assert_eq!(
        later,
        at_one,
        "the server still sent {} bytes",
        later - at_one
    );
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(
        child.wait().unwrap().success() && rest.contains("HOSTILE-END"),
        "{rest}"
    );
    assert!(
        published_shards(&hub).is_empty(),
        "{:?}",
        tree(hub.cache.path())
    );
}

// ---------------------------------------------------------------------------
// Servers that lie or stall.

/// A single 20 MiB file behind a server that ignores `Range` and claims a 1 TiB body: a
/// clear error at once, and no allocation of the claim's size (the largest is below the
/// checkpoint's). In a child of its own: the allocation watch sees the whole process.
#[test]
fn a_terabyte_claimed_body_is_a_clear_error_without_an_allocation_of_its_size() {
    crate::common::child::run_alone(MODULE, "claim");
}

pub(super) fn act_claim() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..5)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[1024, 1024]))
        .collect();
    write_single(dir.path(), &specs);
    let size = std::fs::metadata(dir.path().join("model.safetensors"))
        .unwrap()
        .len() as usize;
    let server = Server::start(
        dir.path(),
        Options {
            ignore_range: true,
            claimed_len: Some(1 << 40),
            ..Options::default()
        },
    )
    .unwrap();
    let url = format!("{}/model.safetensors", server.url());
    let start = Instant::now();
    let mut error = None;
    let largest = crate::malformed::largest_allocation_during(|| {
        error = Loader::new().load(&url).err();
    });
    let e = error.expect("a terabyte body was taken");
    let text = e.to_string();
    assert!(text.contains("1099511627776 bytes"), "{text}");
    assert!(text.contains("ignores Range"), "{text}");
    assert!(
        largest < size,
        "an allocation of {largest} bytes, the checkpoint is {size}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    println!("CLAIM largest allocation {largest} bytes of a {size}-byte checkpoint");
}

/// The documented bound: a stalled server ends a load within 60 s by default, whatever
/// the number of files (each phase's requests run in parallel, each dropped after 10 s
/// without 64 KiB, and tried once more).
const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn a_dripping_body_ends_the_load_within_the_deadline_naming_the_file_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..8)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[64, 1024]))
        .collect();
    write_sharded(dir.path(), &specs, 8);
    let server = Server::start(
        dir.path(),
        Options {
            drip: Some(Duration::from_secs(2)),
            ..Options::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    let e = Loader::new()
        .load(format!("{}/", server.url()))
        .unwrap_err();
    let took = start.elapsed();
    let text = e.to_string();
    eprintln!("MEASURED dripping body: {took:?}: {text}");
    assert!(took < DEADLINE, "{took:?}: {text}");
    assert!(text.contains("stalled at byte"), "{text}");
    assert!(
        text.contains(&server.url()),
        "the server and the file: {text}"
    );
    assert!(text.contains("SAFELOAD_REMOTE_STALL_SECS"), "{text}");
}

#[test]
fn an_unanswered_head_ends_the_load_within_the_deadline() {
    let hub = Hub::new(Options {
        silent_heads: true,
        ..Options::default()
    });
    let start = Instant::now();
    let out = run_hostile("hf://org/model", &hub.vars());
    let took = start.elapsed();
    let (_, _, rest) = out.err();
    eprintln!("MEASURED unanswered HEAD: {took:?}: {rest}");
    assert!(took < DEADLINE, "{took:?}: {rest}");
    assert!(rest.contains("no answer to a HEAD"), "{rest}");
    assert!(rest.contains("hf://org/model"), "{rest}");
    assert!(
        hub.server.stats().unanswered >= 2,
        "{:?}",
        hub.server.stats()
    );
}

#[test]
fn a_pinned_commit_answered_for_another_is_refused_and_nothing_is_filed() {
    let foreign = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0";
    let hub = Hub::new(Options {
        foreign_commit: Some(foreign.to_owned()),
        ..Options::default()
    });
    for cache in ["1", "0"] {
        let mut vars = hub.vars();
        vars.push(("SAFELOAD_HUB_CACHE", cache.to_owned()));
        let out = run_hostile(&format!("hf://org/model@{foreign}"), &vars);
        let (_, _, rest) = out.err();
        assert!(
            rest.contains(&format!(
                "answered for commit {DEFAULT_COMMIT}, not {foreign}"
            )),
            "{rest}"
        );
    }
    let repo = hub.repo_dir();
    assert!(
        !repo.join("snapshots").join(foreign).exists(),
        "{:?}",
        tree(hub.cache.path())
    );
    assert!(!repo.join("refs").exists(), "{:?}", tree(hub.cache.path()));
    assert!(published_shards(&hub).is_empty());
}

#[test]
fn names_the_hub_refuses_are_refused_so_that_no_two_share_a_folder() {
    for bad in [
        "hf://org/repo--x",
        "hf://org--repo/x",
        "hf://org/-x",
        "hf://org/x.",
        "hf://org/a..b",
    ] {
        let e = Loader::new().load(bad).unwrap_err();
        assert!(e.to_string().contains("no -- or .."), "{bad}: {e}");
    }
}

#[test]
fn a_planted_regular_snapshot_file_fails_verify() {
    let hub = Hub::new(Options::default());
    let warm = hub.load("hf://org/model", &[]);
    assert_eq!(warm.digest, hub.digest());
    // The link replaced by a regular file of the same length, one byte of a tensor altered.
    let name = shard_name(0, 3);
    let link = hub.snapshot().join(&name);
    let mut bytes = hub.bytes(&name);
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a;
    std::fs::remove_file(&link).unwrap();
    std::fs::write(&link, &bytes).unwrap();
    let mut vars = hub.vars();
    vars.push((VERIFY, "1".to_owned()));
    let out = run_hostile("hf://org/model", &vars);
    let (_, _, rest) = out.err();
    assert!(rest.contains("corrupt=true"), "{rest}");
    // Offline, the hub cannot be asked for the digest: refused, never loaded unchecked.
    vars.push(("HF_HUB_OFFLINE", "1".to_owned()));
    let out = run_hostile("hf://org/model", &vars);
    let (_, _, rest) = out.err();
    assert!(rest.contains("cannot verify a snapshot file"), "{rest}");
    // A regular file holding the right bytes is checked against the hub's digest, and
    // loads.
    std::fs::write(&link, hub.bytes(&name)).unwrap();
    vars.pop();
    let out = run_hostile("hf://org/model", &vars);
    assert_eq!(out.ok().1, hub.digest());
}

#[test]
fn a_404_without_the_commit_loads_a_sharded_repository_through_the_cache() {
    let hub = Hub::new(Options {
        no_commit_on_404: true,
        ..Options::default()
    });
    let out = run_hostile("hf://org/model", &hub.vars());
    assert_eq!(out.ok().1, hub.digest());
    for i in 0..3 {
        let name = shard_name(i, 3);
        assert_eq!(out.file(&name).0, DEFAULT_COMMIT, "{name}");
        assert_cached(&hub, &name);
    }
}

#[test]
fn the_report_names_each_files_commit_and_an_unreachable_hub_falls_back_at_once() {
    let hub = Hub::new(Options::default());
    let cold = run_hostile("hf://org/model", &hub.vars());
    for i in 0..3 {
        let (commit, etag) = cold.file(&shard_name(i, 3));
        assert_eq!(commit, DEFAULT_COMMIT);
        assert_ne!(etag, "-", "a fetched file's ETag");
    }
    // Another client's lock files beside the blobs are not blobs.
    let blobs = hub.repo_dir().join("blobs");
    let published = std::fs::read_dir(&blobs).unwrap().count();
    for i in 0..3 {
        let sha = sha256_hex(&hub.bytes(&shard_name(i, 3)));
        std::fs::write(blobs.join(format!("{sha}.lock")), b"").unwrap();
    }
    // The hub gone (a port closed), the cache's ref: at once, and each file at its commit.
    let url = hub.server.url();
    let dead_url = Server::start(hub.files.path(), Options::default())
        .unwrap()
        .url();
    let vars: Vec<(&'static str, String)> = hub
        .vars()
        .into_iter()
        .map(|(k, v)| {
            if v == url {
                (k, dead_url.clone())
            } else {
                (k, v)
            }
        })
        .collect();
    let warm = run_hostile("hf://org/model", &vars);
    let (seconds, digest) = warm.ok();
    assert_eq!(digest, hub.digest());
    eprintln!("MEASURED unreachable hub, warm cache: {seconds:.3} s");
    assert!(seconds < 1.5, "{seconds} s to fall back to the cache's ref");
    assert_eq!(warm.file(&shard_name(0, 3)).0, DEFAULT_COMMIT);
    assert_eq!(
        warm.line("HOSTILE-BLOBS ")
            .unwrap()
            .parse::<usize>()
            .unwrap(),
        published,
        "{:?}",
        tree(hub.cache.path())
    );
}

/// `http://` through a cache directory, cancelled by the flag mid-request on a 4 MiB/s
/// link: `Cancelled` within a second of the flag, nothing published in the directory.
#[test]
fn a_cancelled_http_load_through_a_cache_directory_stops_at_once_and_publishes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..12)
        .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[1024, 1024]))
        .collect();
    write_sharded(dir.path(), &specs, 3);
    let server = Server::start(
        dir.path(),
        Options {
            bandwidth_bytes_per_sec: Some(4 << 20),
            ..Options::default()
        },
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let flag = Arc::new(AtomicBool::new(false));
    let setter = Arc::clone(&flag);
    let set_at = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        setter.store(true, Ordering::Relaxed);
        Instant::now()
    });
    let e = Loader::new()
        .cache_dir(cache.path())
        .io_concurrency(2)
        .cancel_on(flag)
        .load(format!("{}/", server.url()))
        .unwrap_err();
    let returned = Instant::now();
    let after = returned.duration_since(set_at.join().unwrap());
    eprintln!("MEASURED cancelled http:// through a cache directory: {after:?} after the flag");
    assert_eq!(e.kind(), &safeload::ErrorKind::Cancelled, "{e}");
    assert!(after < Duration::from_secs(1), "{after:?}");
    assert!(server.stats().bytes_sent < 16 << 20, "{:?}", server.stats());
    let published: Vec<String> = tree(cache.path())
        .into_iter()
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert!(published.is_empty(), "{published:?}");
}
