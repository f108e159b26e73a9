//! What a cold load asks of a server: each shard's bytes sent once (the open's first bytes
//! used, never fetched again), through the hub cache, without it, and from a plain HTTP
//! server; and the repository's missing `?with=` files asked several at a time, each still
//! marked in `.no_exist`, the first failing name in the caller's order the error.

use std::time::{Duration, Instant};

use safeload_testhttp::{DEFAULT_COMMIT, Options, Server};

use super::*;

/// Loads `PATH`; prints `TIMED <seconds the load took>`, then each `?with=` file as the
/// `load` role does (`HUB-EXTRA`).
pub(super) fn act() {
    let url = std::env::var(PATH).unwrap();
    let start = Instant::now();
    let sd = Loader::new().load(&url).unwrap();
    println!("TIMED {:.4}", start.elapsed().as_secs_f64());
    for (name, path) in &sd.report().extra_files {
        let path = path
            .as_ref()
            .map_or("-".to_owned(), |p| p.display().to_string());
        println!("HUB-EXTRA {name}\t{path}");
    }
}

/// Loads `url` from `hub` in a `timed` child: the load's own seconds, and what it printed.
fn timed(hub: &Hub, url: &str) -> (f64, Report) {
    let out = load_command(url, &hub.vars())
        .env(crate::common::child::ROLE, "timed")
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE timed"),
        "{url}: {}\n{stdout}",
        out.status
    );
    let seconds = stdout
        .lines()
        .find_map(|l| {
            l.split_once("TIMED ")
                .map(|(_, s)| s.trim().parse().unwrap())
        })
        .unwrap();
    (seconds, parse(&stdout))
}

/// Asserts that each of `shards` (served from `dir` by `server`) crossed the link no more
/// than once.
fn assert_sent_once(server: &Server, dir: &Path, shards: &[String], what: &str) {
    for name in shards {
        let sent = server.path_stats(name).bytes_sent;
        let len = std::fs::metadata(dir.join(name)).unwrap().len();
        assert!(sent > 0, "{what}: {name} was not fetched");
        assert!(sent <= len, "{what}: {name}: {sent} bytes sent for {len}");
    }
}

#[test]
fn a_cold_hub_load_sends_each_shards_bytes_once() {
    let shards: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
    // Tensors read in parts (every dtype), and files read whole into the file being
    // written (aligned): through the hub cache, and with it off.
    for (what, hub) in [
        ("every dtype", Hub::new(Options::default())),
        ("aligned", Hub::aligned(Options::default())),
    ] {
        let cold = hub.load("hf://org/model", &[]);
        assert_eq!(cold.digest, hub.digest(), "{what}");
        assert!(cold.every("written"), "{what}: {cold:#?}");
        assert_sent_once(&hub.server, hub.files.path(), &shards, what);
        hub.server.reset_stats();
        let off = [("SAFELOAD_HUB_CACHE", "0".to_owned())];
        let uncached = hub.load("hf://org/model", &off);
        assert_eq!(uncached.digest, hub.digest(), "{what}");
        assert_sent_once(&hub.server, hub.files.path(), &shards, what);
    }
}

#[test]
fn a_plain_http_load_sends_each_shards_bytes_once() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..6)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[256, 1024 + i]))
        .chain(every_dtype())
        .collect();
    write_sharded(dir.path(), &specs, 3);
    let server = Server::start(dir.path(), Options::default()).unwrap();
    let sd = Loader::new().load(format!("{}/", server.url())).unwrap();
    assert_eq!(loaded(&sd), naive_load(&shards_of(dir.path())));
    let shards: Vec<String> = (0..3).map(|i| shard_name(i, 3)).collect();
    assert_sent_once(&server, dir.path(), &shards, "http");
}

/// Missing names, each one round trip of a hub with this latency.
const MISSING: usize = 64;
const LATENCY: Duration = Duration::from_millis(20);

#[test]
fn missing_with_names_are_asked_several_at_a_time_and_all_marked() {
    let hub = Hub::aligned(Options {
        latency: Some(LATENCY),
        ..Options::default()
    });
    // The weights in the cache first: the loads timed below differ by the names alone.
    hub.load("hf://org/model", &[]);
    let (base, _) = timed(&hub, "hf://org/model");
    let names: Vec<String> = (0..MISSING)
        .map(|i| format!("missing-{i:02}.json"))
        .collect();
    let url = format!("hf://org/model?with={}", names.join(","));
    hub.server.reset_stats();
    let (with, report) = timed(&hub, &url);
    let serial = LATENCY.as_secs_f64() * MISSING as f64;
    let asking = with - base;
    eprintln!(
        "MEASURED {MISSING} missing ?with= names at {LATENCY:?}: {asking:.3} s more than a \
         load without them ({serial:.2} s in series)"
    );
    assert!(
        asking < serial / 2.0,
        "{asking:.3} s for {MISSING} names, {serial:.2} s in series"
    );
    // Each asked once, each answered in the result, each marked as the hub's client marks.
    assert_eq!(report.extra.len(), MISSING, "{report:?}");
    let no_exist = hub.repo_dir().join(".no_exist").join(DEFAULT_COMMIT);
    for name in &names {
        assert_eq!(report.extra[name], None, "{name}");
        assert!(no_exist.join(name).is_file(), "{name}");
        assert_eq!(hub.server.path_stats(name).requests, 1, "{name}");
    }
    // Again: all found marked, none asked.
    hub.server.reset_stats();
    let (_, again) = timed(&hub, &url);
    assert_eq!(again.extra, report.extra);
    assert!(names.iter().all(|n| hub.server.path_stats(n).requests == 0));
}

#[test]
fn the_first_failing_with_name_in_order_is_the_error() {
    // Two files whose answers claim a gigabyte (past what a `?with=` file may have), among
    // missing names: both asked at once, the first named is the error.
    let hub = Hub::aligned(Options {
        whole_paths: vec!["first.json".to_owned(), "second.json".to_owned()],
        claimed_len: Some(1 << 30),
        latency: Some(LATENCY),
        ..Options::default()
    });
    for name in ["first.json", "second.json"] {
        std::fs::write(hub.files.path().join(name), b"{}").unwrap();
    }
    let url = "hf://org/model?with=a.json,b.json,first.json,c.json,second.json";
    for _ in 0..3 {
        let error = hub.fail(url, &[]);
        assert!(error.contains("first.json"), "{error}");
        assert!(!error.contains("second.json"), "{error}");
    }
    // The missing ones asked before the failure are marked all the same.
    let no_exist = hub.repo_dir().join(".no_exist").join(DEFAULT_COMMIT);
    assert!(no_exist.join("a.json").is_file());
}
