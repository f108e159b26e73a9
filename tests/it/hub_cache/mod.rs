//! The hub cache (feature `remote`): `hf://` against the crate's test server acting as the hub
//! (`HF_ENDPOINT`), the cache in a temporary directory (`HF_HUB_CACHE`). Each load runs in a
//! child (the variables are the process's), which prints its tensors' digest and what the
//! cache did for each file; the server's counters say what was fetched.
//!
//! - this file: cold, warm, partial, offline and verifying loads, the switches, the layout
//!   written;
//! - `python.rs`: the hub's own client (`huggingface_hub`) reads what a load wrote, and a
//!   load reads what it wrote;
//! - `faults.rs`: hostile names, a read-only or full cache, a killed load, two processes and
//!   three local ranks at once;
//! - `store.rs`: the cache directory of `s3://` (moto), an object replaced between loads;
//! - `clean.rs`: a revision or a repository removed, the cache pruned, dry runs, what is
//!   kept (locked, fresh, another user's), names refused, the hub's client after a removal.
//! - `extra.rs`: the repository's other files brought beside the weights (`?with=engine`).
//! - `resume.rs`: an interrupted download resumed (killed, cancelled, two loads at once, a
//!   damaged piece, another user's partial file).
//! - `memory.rs`: a hub or server sending far more than asked, met in bounded memory (under
//!   `RLIMIT_AS`, under a cgroup's limit).
//! - `requests.rs`: what a cold load asks: each shard's bytes sent once, missing `?with=`
//!   names asked several at a time.
//! - `proof.rs`: what a lying hub left in a partial file is proven and fetched again, a
//!   mismatch found after the load is said, a cancel after the load unpublishes nothing,
//!   progress through the cache.
//! - `once.rs`: two engines started at once, and three local ranks, fetch each byte once.

mod clean;
mod errors;
mod extra;
mod faults;
mod hostile;
mod memory;
mod once;
mod proof;
mod python;
mod requests;
mod resume;
mod store;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use safeload::Loader;
use safeload::report::CacheUse;
use safeload_testhttp::{DEFAULT_COMMIT, Options, Server};
use safetensors::Dtype;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::common::child::{PATH, child_command, run_role};
use crate::common::*;

const MODULE: &str = module_path!();
/// Set in a child: `1` verifies, a tensor name prefix filters, `0` turns the hub cache off
/// by the builder.
const VERIFY: &str = "SAFELOAD_TEST_HUB_VERIFY";
const FILTER: &str = "SAFELOAD_TEST_HUB_FILTER";
const BUILDER_CACHE: &str = "SAFELOAD_TEST_HUB_BUILDER_CACHE";
/// Set in a child: wait for a line on stdin after loading, holding the tensors.
const HOLD: &str = "SAFELOAD_TEST_HUB_HOLD";
/// Set in a child: cancel the load when a line arrives on stdin.
const CANCEL_ON_LINE: &str = "SAFELOAD_TEST_HUB_CANCEL_ON_LINE";
/// Set in a child: after loading, wait for the cache's checks (`settle_cache`) and print
/// their verdict (`HUB-SETTLE ok`, or the error with its kind).
const SETTLE: &str = "SAFELOAD_TEST_HUB_SETTLE";
/// Set in a child: load with a cancel flag, and set it once the load returned (an engine's
/// shutdown), before the tensors are dropped.
const CANCEL_AFTER: &str = "SAFELOAD_TEST_HUB_CANCEL_AFTER";
/// Set in a child: record `on_progress` and print what it saw (`HUB-PROGRESS ...`).
const PROGRESS: &str = "SAFELOAD_TEST_HUB_PROGRESS";

/// A checkpoint of three shards (every dtype, and a few MiB of F32) served as the hub serves
/// a repository, with a `config.json` no load needs; and an empty cache.
struct Hub {
    files: TempDir,
    server: Server,
    expected: Vec<Spec>,
    cache: TempDir,
}

impl Hub {
    fn new(options: Options) -> Hub {
        let mut specs = every_dtype();
        for i in 0..6 {
            specs.push(spec(&format!("big.{i}"), Dtype::F32, &[256, 1024 + i]));
        }
        Hub::of(&specs, options)
    }

    /// Tensors aligned in their files (F32 only, ~6 MiB): each file read whole is fetched
    /// into a shared map of the file being written.
    fn aligned(options: Options) -> Hub {
        let specs: Vec<Spec> = (0..12)
            .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[128, 1024]))
            .collect();
        Hub::of(&specs, options)
    }

    fn of(specs: &[Spec], options: Options) -> Hub {
        let files = tempfile::tempdir().unwrap();
        write_sharded(files.path(), specs, 3);
        std::fs::write(
            files.path().join("config.json"),
            br#"{"model_type": "test"}"#,
        )
        .unwrap();
        let expected = naive_load(&shards_of(files.path()));
        let server = Server::start(files.path(), options).unwrap();
        Hub {
            files,
            server,
            expected,
            cache: tempfile::tempdir().unwrap(),
        }
    }

    /// The variables of a child that loads from this hub into this cache.
    fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("HF_ENDPOINT", self.server.url()),
            ("HF_HUB_CACHE", self.cache.path().display().to_string()),
        ]
    }

    fn repo_dir(&self) -> PathBuf {
        self.cache.path().join("models--org--model")
    }

    fn snapshot(&self) -> PathBuf {
        self.repo_dir().join("snapshots").join(DEFAULT_COMMIT)
    }

    /// The served file `name`'s bytes.
    fn bytes(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.files.path().join(name)).unwrap()
    }

    /// The names of the checkpoint's files (the index and its shards).
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
        names.push("model.safetensors.index.json".to_owned());
        names
    }

    /// Loads `hf://org/model` (or `url`) in a child with `extra` variables.
    fn load(&self, url: &str, extra: &[(&'static str, String)]) -> Report {
        let mut vars = self.vars();
        vars.extend(extra.iter().cloned());
        run_load(url, &vars)
    }

    /// Loads `url` in a child that is to fail; returns its error line.
    fn fail(&self, url: &str, extra: &[(&'static str, String)]) -> String {
        let mut vars = self.vars();
        vars.extend(extra.iter().cloned());
        failed_load(url, &vars)
    }

    /// The blob of the served file `name`, in the cache.
    fn blob(&self, name: &str) -> PathBuf {
        self.repo_dir()
            .join("blobs")
            .join(sha256_hex(&self.bytes(name)))
    }

    /// The digest of the whole checkpoint, as a child prints it.
    fn digest(&self) -> String {
        digest_of(&self.expected)
    }
}

/// What a child's load printed: its tensors' digest and, per file name, the cache's use.
#[derive(Debug, Clone, Default)]
struct Report {
    digest: String,
    /// File name -> (the cache's use as a code, its words, the path loaded).
    files: BTreeMap<String, (String, String, String)>,
    /// File name -> (bytes the load read of it, its size).
    read: BTreeMap<String, (u64, u64)>,
    /// The repository's other files brought (`?with=`): name -> its path, `None` where the
    /// repository has none.
    extra: BTreeMap<String, Option<PathBuf>>,
    /// What `settle_cache` said, where the child was asked (`SETTLE`).
    settle: Option<String>,
    /// What `on_progress` saw, where the child was asked (`PROGRESS`): its words.
    progress: Option<String>,
}

impl Report {
    fn code(&self, name: &str) -> &str {
        self.files
            .get(name)
            .map_or("none", |(code, _, _)| code.as_str())
    }

    fn words(&self, name: &str) -> &str {
        self.files
            .get(name)
            .map_or("", |(_, words, _)| words.as_str())
    }

    fn every(&self, code: &str) -> bool {
        !self.files.is_empty() && self.files.values().all(|(c, _, _)| c == code)
    }
}

fn digest_of(specs: &[Spec]) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for s in sorted(specs) {
        s.name.hash(&mut h);
        format!("{:?}{:?}", s.dtype, s.shape).hash(&mut h);
        s.data.hash(&mut h);
    }
    format!("{:016x}", h.finish())
}

/// The command of a child loading `url` with `vars` (nothing of the caller's store or cache
/// variables inherited).
fn load_command(url: &str, vars: &[(&'static str, String)]) -> std::process::Command {
    let mut cmd = child_command(MODULE, "load", Path::new(url));
    for var in safeload_testhttp::STORE_VARIABLES {
        cmd.env_remove(var);
    }
    // No token file of a real user is read.
    cmd.env("HF_HOME", std::env::temp_dir().join("safeload-no-hf-home"));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd
}

fn parse(stdout: &str) -> Report {
    let mut report = Report::default();
    for line in stdout.lines() {
        if let Some((_, rest)) = line.split_once("HUB-READ ") {
            let parts: Vec<&str> = rest.split(' ').collect();
            if let [name, read, size] = parts[..] {
                let n = |t: &str| t.parse::<u64>().unwrap_or_default();
                report.read.insert(name.to_owned(), (n(read), n(size)));
            }
        } else if let Some((_, rest)) = line.split_once("HUB-EXTRA ") {
            if let Some((name, path)) = rest.split_once('\t') {
                let path = (path != "-").then(|| PathBuf::from(path));
                report.extra.insert(name.to_owned(), path);
            }
        } else if let Some((_, seen)) = line.split_once("HUB-PROGRESS ") {
            report.progress = Some(seen.to_owned());
        } else if let Some((_, verdict)) = line.split_once("HUB-SETTLE ") {
            report.settle = Some(verdict.to_owned());
        } else if let Some((_, d)) = line.split_once("HUB-DIGEST ") {
            report.digest = d.trim().to_owned();
        } else if let Some((_, rest)) = line.split_once("HUB-FILE ") {
            let mut parts = rest.splitn(4, '\t');
            let (Some(name), Some(code), Some(words), Some(path)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            // Every byte written, its digest still checked when the load returned: the
            // child waited for the check as it dropped its tensors, before it ended.
            let code = if code == "checking" { "written" } else { code };
            let words = words
                .strip_suffix(", its digest being checked")
                .unwrap_or(words);
            report
                .files
                .insert(name.into(), (code.into(), words.into(), path.into()));
        }
    }
    report
}

/// Runs a load in a child and returns what it printed; fails unless it loaded.
fn run_load(url: &str, vars: &[(&'static str, String)]) -> Report {
    let out = load_command(url, vars)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE load"),
        "{url}: {}\n{stdout}",
        out.status
    );
    parse(&stdout)
}

/// Runs a load in a child that is to fail; returns its stderr.
fn failed_load(url: &str, vars: &[(&'static str, String)]) -> String {
    let out = load_command(url, vars)
        .env("SAFELOAD_TEST_HUB_EXPECT_ERROR", "1")
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE load"),
        "{url}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split_once("HUB-ERROR ").map(|(_, e)| e.to_owned()))
        .unwrap_or_default()
}

#[test]
fn child() {
    run_role(&[
        ("load", act_load),
        ("hostile", hostile::act),
        ("claim", hostile::act_claim),
        ("clean", clean::act),
        ("bounded", memory::act),
        ("timed", requests::act),
    ]);
}

/// Loads `PATH`, prints the digest and each file's cache use; with
/// `SAFELOAD_TEST_HUB_EXPECT_ERROR`, prints the error and whether it is "not found".
fn act_load() {
    let url = std::env::var(PATH).unwrap();
    let mut loader = Loader::new();
    if std::env::var(VERIFY).is_ok_and(|v| v == "1") {
        loader = loader.verify(true);
    }
    if let Ok(prefix) = std::env::var(FILTER) {
        loader = loader.filter(move |name| name.starts_with(&prefix));
    }
    if std::env::var(BUILDER_CACHE).is_ok_and(|v| v == "0") {
        loader = loader.hub_cache(false);
    }
    if let Ok(bytes) = std::env::var("SAFELOAD_TEST_HUB_READ_SIZE") {
        loader = loader.read_size(bytes.parse().unwrap());
    }
    if let Ok(ms) = std::env::var("SAFELOAD_TEST_HUB_CANCEL_MS") {
        // Cancelled from another thread while it reads.
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        loader = loader.cancel_on(std::sync::Arc::clone(&flag));
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap()));
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    if std::env::var_os(CANCEL_ON_LINE).is_some() {
        // Cancelled once the parent writes a line (when its server has sent enough).
        let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        loader = loader.cancel_on(std::sync::Arc::clone(&flag));
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            flag.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let seen: std::sync::Arc<std::sync::Mutex<Vec<safeload::report::Progress>>> =
        std::sync::Arc::default();
    if std::env::var_os(PROGRESS).is_some() {
        let sink = std::sync::Arc::clone(&seen);
        loader = loader.on_progress(move |p| sink.lock().unwrap().push(*p));
    }
    let after = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    if std::env::var_os(CANCEL_AFTER).is_some() {
        loader = loader.cancel_on(std::sync::Arc::clone(&after));
    }
    if std::env::var_os("SAFELOAD_TEST_HUB_EXPECT_ERROR").is_some() {
        let e = loader.load(&url).unwrap_err();
        println!(
            "HUB-ERROR {e} [not_found={} corrupt={} cancelled={}]",
            e.is_not_found(),
            e.is_corrupt(),
            e.kind() == &safeload::ErrorKind::Cancelled
        );
        return;
    }
    let sd = loader.load(&url).unwrap();
    println!("HUB-DIGEST {}", digest_of(&loaded(&sd)));
    for (name, path) in &sd.report().extra_files {
        let path = path
            .as_ref()
            .map_or("-".to_owned(), |p| p.display().to_string());
        println!("HUB-EXTRA {name}\t{path}");
    }
    for file in &sd.report().files {
        let name = file.path.file_name().unwrap().to_string_lossy();
        let (code, words) = match &file.cache {
            Some(c) => (c.as_str().to_owned(), c.to_string()),
            None => ("none".to_owned(), String::new()),
        };
        println!("HUB-FILE {name}\t{code}\t{words}\t{}", file.path.display());
        println!("HUB-READ {name} {} {}", file.bytes_read, file.size);
        // A hit is the ordinary local path: mapped on a local disk.
        if matches!(file.cache, Some(CacheUse::Hit { .. })) {
            assert_eq!(file.strategy, safeload::report::Strategy::Mmap, "{file:?}");
        }
    }
    after.store(true, std::sync::atomic::Ordering::Relaxed);
    print_progress(&seen.lock().unwrap());
    if std::env::var_os(SETTLE).is_some() {
        match sd.settle_cache() {
            Ok(()) => println!("HUB-SETTLE ok"),
            Err(e) => println!(
                "HUB-SETTLE mismatch={} path={} {e}",
                matches!(e.kind(), safeload::ErrorKind::IntegrityMismatch { .. }),
                e.path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
        }
    }
    if std::env::var_os(HOLD).is_some() {
        println!("HUB-HOLDING");
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
}

/// What `on_progress` said of the read phase, where it was recorded: how many calls, the
/// last call's bytes done and total, the totals seen, the bytes done never going back, and
/// the files done and in all at the last call.
fn print_progress(seen: &[safeload::report::Progress]) {
    let reads: Vec<_> = seen
        .iter()
        .filter(|p| p.phase == safeload::report::Phase::Read)
        .collect();
    let Some(last) = reads.last() else {
        return;
    };
    let mut totals: Vec<u64> = reads.iter().map(|p| p.bytes_total).collect();
    totals.dedup();
    let monotonic = reads.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done);
    println!(
        "HUB-PROGRESS calls={} done={} total={} totals={} monotonic={monotonic} files={}/{}",
        reads.len(),
        last.bytes_done,
        last.bytes_total,
        totals.len(),
        last.files_done,
        last.files_total
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every name under `dir`, recursively, relative to it (symlinks not followed).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            out.push(path.strip_prefix(dir).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Temporary files left anywhere under `dir`.
fn incomplete(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|n| n.ends_with(".incomplete"))
        .collect()
}

/// Partial files kept for a later load to resume, and their records, anywhere under `dir`.
fn partials(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|n| n.ends_with(".safeload-partial") || n.ends_with(".safeload-pieces"))
        .collect()
}

/// Asserts the cache holds `name` as the hub's client writes it: its bytes in
/// `blobs/<sha256>` (a git blob id for the index), the snapshot's link to it, relative.
fn assert_cached(hub: &Hub, name: &str) {
    let bytes = hub.bytes(name);
    let link = hub.snapshot().join(name);
    let target = std::fs::read_link(&link)
        .unwrap_or_else(|e| panic!("{}: {e}\n{:#?}", link.display(), tree(hub.cache.path())));
    let blob = target.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(target, Path::new("../../blobs").join(&blob), "{name}");
    if name.ends_with(".json") {
        assert_eq!(
            blob.len(),
            40,
            "a small file's blob is its git blob id: {blob}"
        );
    } else {
        assert_eq!(blob, sha256_hex(&bytes), "{name}");
    }
    let stored = std::fs::read(hub.repo_dir().join("blobs").join(&blob)).unwrap();
    assert!(stored == bytes, "{name}: the blob holds other bytes");
}

#[test]
fn a_cold_load_fills_the_cache_in_the_hubs_layout() {
    let hub = Hub::new(Options::default());
    let report = hub.load("hf://org/model", &[]);
    assert_eq!(report.digest, hub.digest());
    for i in 0..3 {
        let name = shard_name(i, 3);
        assert_eq!(report.code(&name), "written", "{report:#?}");
        // `, its digest being checked` (where the check outlived the load) is taken off
        // by `parse`, as `checking` is read as `written`.
        assert_eq!(report.words(&name), "from the hub, written to the cache");
    }
    for name in hub.names() {
        assert_cached(&hub, &name);
    }
    let refs = std::fs::read_to_string(hub.repo_dir().join("refs/main")).unwrap();
    assert_eq!(refs, DEFAULT_COMMIT);
    // The hub said model.safetensors does not exist at the commit: remembered as its client does.
    assert!(
        hub.repo_dir()
            .join(".no_exist")
            .join(DEFAULT_COMMIT)
            .join("model.safetensors")
            .is_file()
    );
    assert!(incomplete(hub.cache.path()).is_empty());
    // A file of the snapshot the load does not need is not fetched.
    assert_eq!(hub.server.path_stats("config.json").requests, 0);
    // Each shard's bytes crossed the link once (and its header's first request).
    for i in 0..3 {
        let name = shard_name(i, 3);
        let sent = hub.server.path_stats(&name).bytes_sent;
        let len = hub.bytes(&name).len() as u64;
        assert!(sent <= len + (64 << 10), "{name}: {sent} bytes for {len}");
    }
}

#[test]
fn a_second_load_reads_the_cache_and_asks_the_hub_one_question_at_most() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    hub.server.reset_stats();
    let again = hub.load("hf://org/model", &[]);
    assert_eq!(again.digest, hub.digest());
    assert!(again.every("hit"), "{again:#?}");
    for (name, (_, words, path)) in &again.files {
        assert_eq!(words, "from the hub cache");
        assert_eq!(*path, hub.snapshot().join(name).display().to_string());
    }
    let stats = hub.server.stats();
    assert!(stats.requests <= 1, "{stats:?}");
    assert_eq!(stats.bytes_sent, 0, "{stats:?}");
    // A commit, or offline: not a request.
    hub.server.reset_stats();
    let pinned = hub.load(&format!("hf://org/model@{DEFAULT_COMMIT}"), &[]);
    assert!(pinned.every("hit"), "{pinned:#?}");
    let offline = hub.load("hf://org/model", &[("HF_HUB_OFFLINE", "1".to_owned())]);
    assert!(offline.every("hit"), "{offline:#?}");
    assert_eq!(offline.digest, hub.digest());
    assert_eq!(hub.server.stats().requests, 0);
}

#[test]
fn a_partial_cache_reads_what_it_holds_and_fetches_the_rest_at_the_same_commit() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    // One file gone from the cache; another's snapshot link lost, its blob kept.
    let gone = shard_name(1, 3);
    std::fs::remove_file(hub.snapshot().join(&gone)).unwrap();
    std::fs::remove_file(hub.blob(&gone)).unwrap();
    let unlinked = shard_name(2, 3);
    std::fs::remove_file(hub.snapshot().join(&unlinked)).unwrap();
    hub.server.reset_stats();
    let report = hub.load("hf://org/model", &[]);
    assert_eq!(report.digest, hub.digest());
    assert_eq!(report.code(&gone), "written", "{report:#?}");
    assert_eq!(report.code(&shard_name(0, 3)), "hit");
    // The blob found by its name (the hub's answer), linked again as the hub's client does.
    assert_eq!(report.code(&unlinked), "hit", "{report:#?}");
    assert_cached(&hub, &unlinked);
    assert!(hub.server.path_stats(&unlinked).bytes_sent <= 64 << 10);
    // Only the missing file crossed the link, at the commit the revision named.
    assert_eq!(hub.server.path_stats(&shard_name(0, 3)).requests, 0);
    assert!(hub.server.revision_requests(DEFAULT_COMMIT) > 0);
    assert_cached(&hub, &gone);
    // Offline, a file the cache lacks is an error naming it.
    std::fs::remove_file(hub.snapshot().join(&gone)).unwrap();
    let e = hub.fail("hf://org/model", &[("HF_HUB_OFFLINE", "1".to_owned())]);
    assert!(e.contains(&gone) && e.contains("not_found=true"), "{e}");
    assert!(e.contains("HF_HUB_OFFLINE"), "{e}");
    // Offline with no ref at all: says so.
    let empty = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_HUB_OFFLINE", "1".to_owned()),
        ("HF_HUB_CACHE", empty.path().display().to_string()),
    ];
    let e = hub.fail("hf://org/model", &vars);
    assert!(
        e.contains("refs/main") && e.contains("not_found=true"),
        "{e}"
    );
}

#[test]
fn verify_checks_a_snapshots_blob_against_its_name() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    let name = shard_name(2, 3);
    let verified = hub.load("hf://org/model", &[(VERIFY, "1".to_owned())]);
    assert!(verified.every("hit"), "{verified:#?}");
    // One byte of the blob changed, its length kept: only a digest finds it.
    let blob = std::fs::canonicalize(hub.snapshot().join(&name)).unwrap();
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let e = hub.fail("hf://org/model", &[(VERIFY, "1".to_owned())]);
    assert!(e.contains("corrupt=true") && e.contains(&name), "{e}");
}

#[test]
fn blobs_that_link_into_the_hubs_shared_store_are_followed_and_verified() {
    let hub = Hub::new(Options::default());
    hub.load("hf://org/model", &[]);
    // One blob moved into the shared store, as the hub's client keeps Xet files: the
    // store's name is not the file's SHA-256, the repository's link to it is.
    let name = shard_name(1, 3);
    let store_hash = sha256_hex(b"a xet hash stands here");
    let store = hub.cache.path().join("blobs");
    let entry = store.join(&store_hash[..2]).join(&store_hash);
    std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
    std::fs::rename(hub.blob(&name), &entry).unwrap();
    let link = format!("../../blobs/{}/{store_hash}", &store_hash[..2]);
    std::os::unix::fs::symlink(&link, hub.blob(&name)).unwrap();
    // Unmarked, `blobs/` is no store of the hub's: not followed, the file fetched again.
    let unmarked = hub.load("hf://org/model", &[]);
    assert_eq!(unmarked.digest, hub.digest());
    assert_ne!(unmarked.code(&name), "hit", "{unmarked:#?}");
    std::fs::write(store.join(".huggingface-shared-blobs"), "1\n").unwrap();
    let marked = hub.load("hf://org/model", &[(VERIFY, "1".to_owned())]);
    assert_eq!(marked.digest, hub.digest());
    assert!(marked.every("hit"), "{marked:#?}");
    // Checked against the repository's name of the blob.
    let mut bytes = std::fs::read(&entry).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&entry, &bytes).unwrap();
    let e = hub.fail("hf://org/model", &[(VERIFY, "1".to_owned())]);
    assert!(e.contains("corrupt=true") && e.contains(&name), "{e}");
}

#[test]
fn the_cache_off_streams_and_writes_nothing() {
    let hub = Hub::new(Options::default());
    for extra in [
        ("SAFELOAD_HUB_CACHE", "0".to_owned()),
        (BUILDER_CACHE, "0".to_owned()),
    ] {
        let report = hub.load("hf://org/model", &[extra]);
        assert_eq!(report.digest, hub.digest());
        assert!(report.every("none"), "{report:#?}");
        assert!(
            tree(hub.cache.path()).is_empty(),
            "{:?}",
            tree(hub.cache.path())
        );
    }
}

#[test]
fn a_load_of_part_of_a_file_leaves_nothing_partial() {
    let hub = Hub::new(Options::default());
    let report = hub.load("hf://org/model", &[(FILTER, "big.".to_owned())]);
    let partial: Vec<_> = report
        .files
        .values()
        .filter(|(code, _, _)| code == "not_cached")
        .collect();
    assert!(!partial.is_empty(), "{report:#?}");
    for (_, words, _) in partial {
        assert!(words.contains("the load read"), "{words}");
    }
    assert!(incomplete(hub.cache.path()).is_empty());
    // What was read whole is cached, and a later load of everything finds it.
    let all = hub.load("hf://org/model", &[]);
    assert_eq!(all.digest, hub.digest());
}

#[test]
fn a_file_read_whole_is_fetched_into_the_file_being_written() {
    // Tensors aligned in their files (F32 only): each file is fetched whole into a shared map
    // of the cache's temporary file, header included, and its tensors are views of it (the
    // killed and cancelled loads of `faults.rs` take this path too).
    let files = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..6)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[128, 1024]))
        .collect();
    write_sharded(files.path(), &specs, 2);
    let server = Server::start(files.path(), Options::default()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_HUB_CACHE", cache.path().display().to_string()),
    ];
    let cold = run_load("hf://org/aligned", &vars);
    assert_eq!(
        cold.digest,
        digest_of(&naive_load(&shards_of(files.path())))
    );
    for i in 0..2 {
        let name = shard_name(i, 2);
        assert_eq!(cold.code(&name), "written", "{cold:#?}");
        // The tensor data read (the header came with the open).
        let (read, size) = cold.read[&name];
        assert!(read > 0 && read < size, "{name}: {read} of {size}");
        // The published blob is the file, header and all (its map was the destination).
        let bytes = std::fs::read(files.path().join(&name)).unwrap();
        let blob = cache
            .path()
            .join("models--org--aligned/blobs")
            .join(sha256_hex(&bytes));
        assert!(std::fs::read(blob).unwrap() == bytes, "{name}");
    }
    // Filtered, a file is read in part: written as it is read, and not published.
    let cache = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_HUB_CACHE", cache.path().display().to_string()),
        (FILTER, "w0".to_owned()),
    ];
    let part = run_load("hf://org/aligned", &vars);
    let (name, &(read, size)) = part.read.iter().next().unwrap();
    assert!(read < size, "{part:#?}");
    assert_eq!(part.code(name), "not_cached");
    assert!(incomplete(cache.path()).is_empty());
}

#[test]
fn a_subfolder_at_a_revision_with_slashes_is_cached_as_the_hubs_client_caches_it() {
    let files = tempfile::tempdir().unwrap();
    let sub = files.path().join("unet");
    std::fs::create_dir(&sub).unwrap();
    write_sharded(&sub, &every_dtype(), 2);
    let expected = digest_of(&naive_load(&shards_of(&sub)));
    let server = Server::start(
        files.path(),
        Options {
            branches: vec!["main".to_owned(), "refs/pr/1".to_owned()],
            ..Options::default()
        },
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_HUB_CACHE", cache.path().display().to_string()),
    ];
    let url = "hf://org/pipe@refs%2Fpr%2F1/unet";
    let cold = run_load(url, &vars);
    assert_eq!(cold.digest, expected);
    let repo = cache.path().join("models--org--pipe");
    let refs = std::fs::read_to_string(repo.join("refs/refs/pr/1")).unwrap();
    assert_eq!(refs, DEFAULT_COMMIT);
    let snapshot = repo.join("snapshots").join(DEFAULT_COMMIT).join("unet");
    for i in 0..2 {
        let link = std::fs::read_link(snapshot.join(shard_name(i, 2))).unwrap();
        // One `../` more for the subfolder.
        assert!(link.starts_with("../../../blobs"), "{}", link.display());
    }
    let offline = run_load(
        url,
        &[
            vars[0].clone(),
            vars[1].clone(),
            ("HF_HUB_OFFLINE", "1".to_owned()),
        ],
    );
    assert_eq!(offline.digest, expected);
    assert!(offline.every("hit"), "{offline:#?}");
}

#[test]
fn a_repository_with_one_file_is_found_in_the_cache_by_its_name() {
    let files = tempfile::tempdir().unwrap();
    let specs = every_dtype();
    write_single(files.path(), &specs);
    let server = Server::start(files.path(), Options::default()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_HUB_CACHE", cache.path().display().to_string()),
    ];
    let cold = run_load("hf://org/single", &vars);
    assert_eq!(cold.code("model.safetensors"), "written", "{cold:#?}");
    server.reset_stats();
    let warm = run_load("hf://org/single", &vars);
    assert_eq!(warm.code("model.safetensors"), "hit", "{warm:#?}");
    assert_eq!(warm.digest, cold.digest);
    assert!(server.stats().requests <= 1);
    assert!(!cache.path().join("models--org--single/.no_exist").exists());
}
