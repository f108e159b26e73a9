//! An interrupted download resumed: a cold load killed (SIGKILL) or cancelled half way
//! leaves its partial files and their records; the next load, in any process, checks the
//! finished pieces, fetches only the rest and publishes what hashes to the blob's name. Two
//! loads started at once on a half-done file fetch the rest once; a damaged piece is fetched
//! again; another user's partial file is never adopted; the hub's clients (`huggingface_hub`,
//! the `hf-hub` crate) read what was published; an `http://` load through a cache directory,
//! whose store gives no digest to prove a partial file by, fetches it again.

use std::time::{Duration, Instant};

use safeload_testhttp::Options;

use super::*;

/// A partial file's piece (`src/cache/partial.rs`).
pub(super) const PIECE: u64 = 1 << 20;
/// The reads a remote load keeps in flight at most (`policy/reads.rs`, `REMOTE_READERS`).
const READS: u64 = 16;
/// A record's header and entry sizes.
const RECORD_HEADER: u64 = 24;
const RECORD_ENTRY: u64 = 24;

/// 96 MiB of F32 in 3 shards of 8 pieces each, on a 24 MiB/s link with 20 ms per answer.
pub(super) fn big_hub() -> Hub {
    let specs: Vec<Spec> = (0..24)
        .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[1024, 1024]))
        .collect();
    Hub::of(
        &specs,
        Options {
            bandwidth_bytes_per_sec: Some(24 << 20),
            latency: Some(Duration::from_millis(20)),
            ..Options::default()
        },
    )
}

/// The shards' names and their total bytes.
pub(super) fn shards(hub: &Hub) -> (Vec<String>, u64) {
    let names: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
    let total = names.iter().map(|n| hub.bytes(n).len() as u64).sum();
    (names, total)
}

/// Bytes of the shards the server sent since its counters were reset.
pub(super) fn shard_bytes_sent(hub: &Hub) -> u64 {
    let (names, _) = shards(hub);
    names
        .iter()
        .map(|n| hub.server.path_stats(n).bytes_sent)
        .sum()
}

/// How a load is stopped half way.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// SIGKILL.
    Kill,
    /// Its cancel flag (a line on its stdin); it returns `Cancelled`.
    Cancel,
}

/// Starts a cold load and stops it once the server has sent half the shards' bytes;
/// returns the bytes sent by then.
pub(super) fn stop_half_way(hub: &Hub, stop: Stop) -> u64 {
    let (_, total) = shards(hub);
    hub.server.reset_stats();
    let mut command = load_command("hf://org/model", &hub.vars());
    if stop == Stop::Cancel {
        command
            .env(CANCEL_ON_LINE, "1")
            .env("SAFELOAD_TEST_HUB_EXPECT_ERROR", "1");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while shard_bytes_sent(hub) < total / 2 {
        assert!(Instant::now() < deadline, "the load did not get half way");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the load ended before it was stopped"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    match stop {
        Stop::Kill => child.kill().unwrap(),
        Stop::Cancel => {
            use std::io::Write as _;
            writeln!(child.stdin.as_mut().unwrap(), "cancel").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    if stop == Stop::Cancel {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("cancelled=true"), "{stdout}");
    }
    let sent = shard_bytes_sent(hub);
    hub.server.reset_stats();
    sent
}

/// [`stop_half_way`] by SIGKILL.
pub(super) fn kill_half_way(hub: &Hub) -> u64 {
    stop_half_way(hub, Stop::Kill)
}

/// The pieces each shard's record lists, by shard name.
pub(super) fn recorded(hub: &Hub) -> BTreeMap<String, u64> {
    let (names, _) = shards(hub);
    names
        .iter()
        .map(|name| {
            let record = hub.blob(name).with_extension("safeload-pieces");
            let len = std::fs::metadata(&record).map_or(0, |m| m.len());
            (
                name.clone(),
                len.saturating_sub(RECORD_HEADER) / RECORD_ENTRY,
            )
        })
        .collect()
}

/// The bytes a report says each file resumed (its words' "resuming N bytes").
pub(super) fn resumed(report: &Report, name: &str) -> u64 {
    let words = report.words(name);
    words
        .split_once("resuming ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Asserts a restart after a kill at `killed_at` of `total` fetched at most the rest, 5 %
/// of the whole and a piece per read in flight (and the open's header reads, `headers` of
/// them).
fn assert_fetched_the_rest(sent: u64, killed_at: u64, total: u64, headers: u64) {
    // What the kill cost: the bytes sent but not yet landed (in the sockets' buffers), and
    // the unfinished piece at the frontier of each read in flight (a remote load keeps up to
    // 16 in flight, `policy::reads`): 5 % of the checkpoint, and a piece per read.
    let bound = (total - killed_at.min(total)) + total / 20 + READS * PIECE + headers * (64 << 10);
    assert!(
        sent <= bound,
        "the restart fetched {sent} bytes of {total} after a kill at {killed_at} (bound {bound})"
    );
    eprintln!(
        "RESUMED: killed at {killed_at} of {total} bytes ({:.1} %); the restart fetched {sent} \
         ({:.1} %)",
        killed_at as f64 * 100.0 / total as f64,
        sent as f64 * 100.0 / total as f64
    );
}

#[test]
fn a_load_killed_half_way_is_resumed_fetching_only_the_rest() {
    let hub = big_hub();
    let (names, total) = shards(&hub);
    let killed_at = kill_half_way(&hub);
    assert!(
        !partials(hub.cache.path()).is_empty(),
        "{:?}",
        tree(hub.cache.path())
    );
    let next = hub.load("hf://org/model", &[]);
    assert_eq!(next.digest, hub.digest());
    let sent = shard_bytes_sent(&hub);
    assert_fetched_the_rest(sent, killed_at, total, 3);
    let resumed_total: u64 = names.iter().map(|n| resumed(&next, n)).sum();
    assert!(resumed_total > 0, "{next:#?}");
    for name in &names {
        assert_eq!(next.code(name), "written", "{next:#?}");
        assert!(resumed(&next, name) <= hub.bytes(name).len() as u64);
        assert_cached(&hub, name);
    }
    // The kept bytes and the fetched ones make the file: nothing fetched twice but the
    // unfinished pieces.
    assert!(
        sent + resumed_total >= total,
        "{sent} + {resumed_total} < {total}"
    );
    assert!(partials(hub.cache.path()).is_empty());
    assert!(incomplete(hub.cache.path()).is_empty());
    // The hub's clients read what was published.
    let hf_hub = hf_hub::Cache::new(hub.cache.path().to_path_buf()).model("org/model".into());
    for name in &names {
        let path = hf_hub
            .get(name)
            .unwrap_or_else(|| panic!("hf-hub finds no {name}"));
        assert!(std::fs::read(&path).unwrap() == hub.bytes(name), "{name}");
    }
    if super::python::has_hub_client() {
        let (names, out) = super::python::find_offline(&hub);
        for name in &names {
            let (line, fields) = super::python::found(&out, name);
            assert_eq!(fields[3], sha256_hex(&hub.bytes(name)), "{line}");
        }
        assert!(!out.contains("WARNING"), "{out}");
    }
}

#[test]
fn a_cancelled_load_is_resumed_the_same_way() {
    let hub = big_hub();
    let (names, total) = shards(&hub);
    let cancelled_at = stop_half_way(&hub, Stop::Cancel);
    let next = hub.load("hf://org/model", &[]);
    assert_eq!(next.digest, hub.digest());
    assert_fetched_the_rest(shard_bytes_sent(&hub), cancelled_at, total, 3);
    assert!(names.iter().map(|n| resumed(&next, n)).sum::<u64>() > 0);
    for name in &names {
        assert_cached(&hub, name);
    }
    assert!(partials(hub.cache.path()).is_empty());
}

#[test]
fn two_loads_started_at_once_on_a_half_done_file_fetch_the_rest_once() {
    let hub = big_hub();
    let (names, total) = shards(&hub);
    let killed_at = kill_half_way(&hub);
    let children: Vec<_> = (0..2)
        .map(|_| {
            load_command("hf://org/model", &hub.vars())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let reports: Vec<Report> = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{stdout}");
            parse(&stdout)
        })
        .collect();
    for report in &reports {
        assert_eq!(report.digest, hub.digest(), "{report:#?}");
    }
    for name in &names {
        let written = reports.iter().filter(|r| r.code(name) == "written").count();
        assert!(written <= 1, "{name} written twice: {reports:#?}");
        assert_cached(&hub, name);
    }
    // The rest once, and each process's header reads.
    assert_fetched_the_rest(shard_bytes_sent(&hub), killed_at, total, 6);
    assert!(partials(hub.cache.path()).is_empty());
}

#[test]
fn a_damaged_piece_is_fetched_again_and_never_published() {
    let hub = big_hub();
    let (names, _) = shards(&hub);
    kill_half_way(&hub);
    let before = recorded(&hub);
    let mut damaged = Vec::new();
    for name in &names {
        if before[name] == 0 {
            continue;
        }
        // A byte of the first finished piece flipped (recorded pieces are checked, so the
        // first piece of a file with one is a finished piece).
        let partial = hub.blob(name).with_extension("safeload-partial");
        let mut bytes = std::fs::read(&partial).unwrap();
        bytes[1000] ^= 0x5a;
        std::fs::write(&partial, &bytes).unwrap();
        damaged.push(name.clone());
    }
    assert!(!damaged.is_empty(), "no finished piece: {before:?}");
    let next = hub.load("hf://org/model", &[]);
    assert_eq!(next.digest, hub.digest());
    for name in &names {
        assert_eq!(next.code(name), "written", "{next:#?}");
        assert_cached(&hub, name);
        if damaged.contains(name) {
            assert!(
                resumed(&next, name) <= (before[name] - 1) * PIECE,
                "{name}: the damaged piece was kept: {}",
                next.words(name)
            );
        }
    }
}

#[test]
fn another_users_partial_file_is_never_adopted() {
    if !super::clean::is_root() {
        return;
    }
    let hub = big_hub();
    let (names, total) = shards(&hub);
    kill_half_way(&hub);
    let theirs: Vec<PathBuf> = partials(hub.cache.path())
        .iter()
        .map(|n| hub.cache.path().join(n))
        .collect();
    assert!(!theirs.is_empty());
    let nobody = 65534;
    let mut before = Vec::new();
    for path in &theirs {
        std::os::unix::fs::chown(path, Some(nobody), Some(nobody)).unwrap();
        before.push(sha256_hex(&std::fs::read(path).unwrap()));
    }
    let next = hub.load("hf://org/model", &[]);
    assert_eq!(next.digest, hub.digest());
    for name in &names {
        assert_eq!(resumed(&next, name), 0, "{}", next.words(name));
        assert_eq!(next.code(name), "written", "{next:#?}");
        assert_cached(&hub, name);
    }
    assert!(shard_bytes_sent(&hub) >= total, "every byte fetched again");
    for (path, digest) in theirs.iter().zip(&before) {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).unwrap();
        assert_eq!(meta.uid(), nobody, "{}", path.display());
        assert_eq!(&sha256_hex(&std::fs::read(path).unwrap()), digest);
    }
}

#[test]
fn an_http_load_through_a_cache_directory_fetches_again_what_it_cannot_prove() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let files = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..24)
        .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[1024, 1024]))
        .collect();
    write_sharded(files.path(), &specs, 3);
    let expected = digest_of(&naive_load(&shards_of(files.path())));
    let total: u64 = (0..3)
        .map(|i| {
            std::fs::metadata(files.path().join(shard_name(i, 3)))
                .unwrap()
                .len()
        })
        .sum();
    let server = safeload_testhttp::Server::start(
        files.path(),
        Options {
            bandwidth_bytes_per_sec: Some(24 << 20),
            ..Options::default()
        },
    )
    .unwrap();
    let url = format!("{}/", server.url());
    let cache = tempfile::tempdir().unwrap();
    // Cancelled once half the checkpoint is sent.
    let flag = Arc::new(AtomicBool::new(false));
    let e = std::thread::scope(|s| {
        let setter = Arc::clone(&flag);
        let server = &server;
        s.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while server.stats().bytes_sent < total / 2 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            setter.store(true, Ordering::Relaxed);
        });
        Loader::new()
            .cache_dir(cache.path())
            .cancel_on(Arc::clone(&flag))
            .load(&url)
            .unwrap_err()
    });
    assert_eq!(e.kind(), &safeload::ErrorKind::Cancelled, "{e}");
    server.reset_stats();
    let sd = Loader::new().cache_dir(cache.path()).load(&url).unwrap();
    assert_eq!(digest_of(&loaded(&sd)), expected);
    // A store gives no digest to prove what the cancelled load left by: those bytes are
    // fetched again, never read as data, and the files are published whole.
    let sent = server.stats().bytes_sent;
    assert!(sent >= total, "{sent} of {total}");
    let mut refetched = 0;
    for f in &sd.report().files {
        match &f.cache {
            Some(
                CacheUse::Written {
                    resumed,
                    refetched: r,
                    ..
                }
                | CacheUse::Checking {
                    resumed,
                    refetched: r,
                    ..
                },
            ) => {
                assert_eq!(*resumed, 0, "{}", f.path.display());
                refetched += r;
            }
            other => panic!("{}: {other:?}", f.path.display()),
        }
    }
    assert!(refetched > 0, "{:#?}", sd.report().files);
    // Dropping the tensors waits for the checks still under way.
    drop(sd);
    let published = tree(cache.path())
        .into_iter()
        .filter(|n| n.ends_with(".safetensors"))
        .count();
    assert_eq!(published, 3, "{:?}", tree(cache.path()));
    assert!(
        partials(cache.path()).is_empty(),
        "{:?}",
        tree(cache.path())
    );
}
