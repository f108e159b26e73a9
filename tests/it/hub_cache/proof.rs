//! Bytes a load hands out are the store's: a partial file a lying server's bytes were
//! written to (the load killed before its check) is proven by the file's digest before a
//! later load hands it out, and fetched again where it fails; a mismatch found by a check
//! after the load is said by `StateDict::settle_cache`; a cancel flag set after the load
//! returned does not unpublish what it wrote; the fetched bytes reach `on_progress`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use safeload_testhttp::{Lie, Options, Server};

use super::resume::{PIECE, kill_half_way, recorded, resumed, shards};
use super::*;

/// 96 MiB of F32 in 3 shards on a 24 MiB/s link, 20 ms an answer, written to `files`.
fn big_files() -> (TempDir, Vec<Spec>) {
    let files = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..24)
        .map(|i| spec(&format!("w{i:02}"), Dtype::F32, &[1024, 1024]))
        .collect();
    write_sharded(files.path(), &specs, 3);
    (files, specs)
}

/// The options of a server on a 24 MiB/s link, lying about `name`'s tensor bytes where
/// given (its header kept whole).
fn options(files: &Path, lie: Option<&str>) -> Options {
    let lie = lie.map(|name| {
        let bytes = std::fs::read(files.join(name)).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        Lie {
            path: name.to_owned(),
            from: 8 + header,
        }
    });
    Options {
        bandwidth_bytes_per_sec: Some(24 << 20),
        latency: Some(Duration::from_millis(20)),
        lie,
        ..Options::default()
    }
}

#[test]
fn a_partial_file_a_lying_hub_left_is_fetched_again_never_handed_out() {
    let (files, specs) = big_files();
    let lied = shard_name(0, 3);
    let liar = Server::start(files.path(), options(files.path(), Some(&lied))).unwrap();
    let hub = Hub {
        expected: naive_load(&shards_of(files.path())),
        files,
        server: liar,
        cache: tempfile::tempdir().unwrap(),
    };
    assert_eq!(hub.expected.len(), specs.len());
    kill_half_way(&hub);
    // The liar's bytes are in the partial file, their pieces recorded.
    let kept = recorded(&hub)[&lied];
    assert!(kept > 0, "{:?}", tree(hub.cache.path()));
    // The same repository, its hub mended.
    hub.server.stop_lying();
    let next = hub.load("hf://org/model", &[(SETTLE, "1".to_owned())]);
    assert_eq!(
        next.digest,
        hub.digest(),
        "the liar's bytes were handed out"
    );
    assert_eq!(next.settle.as_deref(), Some("ok"), "{next:#?}");
    // The file was proven wrong before the load returned, the bytes the liar left fetched
    // again: none of them kept.
    assert_eq!(next.code(&lied), "written", "{next:#?}");
    assert_eq!(resumed(&next, &lied), 0, "{next:#?}");
    assert!(
        next.words(&lied).contains("fetching again"),
        "{}",
        next.words(&lied)
    );
    let again: u64 = next
        .words(&lied)
        .split_once("fetching again ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .map_or(0, |n| n.parse().unwrap());
    assert!(again >= (kept - 1) * PIECE, "{again} < {kept} pieces");
    assert_cached(&hub, &lied);
    // The other shards' bytes, the hub's, were kept and proven.
    let (names, _) = shards(&hub);
    for name in names.iter().filter(|n| **n != lied) {
        assert_cached(&hub, name);
    }
    assert!(partials(hub.cache.path()).is_empty());
}

#[test]
fn through_a_cache_directory_bytes_a_lying_server_left_are_fetched_again() {
    let (files, _) = big_files();
    let expected = digest_of(&naive_load(&shards_of(files.path())));
    let lied = shard_name(1, 3);
    let total: u64 = (0..3)
        .map(|i| {
            std::fs::metadata(files.path().join(shard_name(i, 3)))
                .unwrap()
                .len()
        })
        .sum();
    let liar = Server::start(files.path(), options(files.path(), Some(&lied))).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let url = format!("{}/", liar.url());
    // Cancelled once half the checkpoint is sent: the partial files stay.
    let flag = Arc::new(AtomicBool::new(false));
    let e = std::thread::scope(|s| {
        let setter = Arc::clone(&flag);
        let liar = &liar;
        s.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while liar.stats().bytes_sent < total / 2 && Instant::now() < deadline {
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
    assert!(
        !partials(cache.path()).is_empty(),
        "{:?}",
        tree(cache.path())
    );
    // The same objects, mended: the same address (the cache directory keys them by it).
    liar.stop_lying();
    liar.reset_stats();
    let sd = Loader::new().cache_dir(cache.path()).load(&url).unwrap();
    assert_eq!(
        digest_of(&loaded(&sd)),
        expected,
        "the liar's bytes were handed out"
    );
    sd.settle_cache().unwrap();
    // A store gives no digest to prove a partial file by: what the liar left is fetched
    // again, never read as data.
    let mut refetched = 0;
    for file in &sd.report().files {
        match &file.cache {
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
                assert_eq!(*resumed, 0, "{}", file.path.display());
                refetched += r;
            }
            other => panic!("{}: {other:?}", file.path.display()),
        }
    }
    assert!(refetched > 0, "{:#?}", sd.report().files);
    drop(sd);
    assert!(
        partials(cache.path()).is_empty(),
        "{:?}",
        tree(cache.path())
    );
}

#[test]
fn a_mismatch_found_after_the_load_is_returned_by_settle_cache() {
    // Aligned shards: each fetched into the file being written, its digest checked on a
    // thread of its own after the load returned.
    let files = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..6)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[128, 1024]))
        .collect();
    write_sharded(files.path(), &specs, 2);
    let lied = shard_name(1, 2);
    let mut options = options(files.path(), Some(&lied));
    options.bandwidth_bytes_per_sec = None;
    options.latency = None;
    let server = Server::start(files.path(), options).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_ENDPOINT", server.url()),
        ("HF_HUB_CACHE", cache.path().display().to_string()),
        (SETTLE, "1".to_owned()),
    ];
    let report = run_load("hf://org/lied", &vars);
    let settle = report.settle.clone().unwrap_or_default();
    assert!(settle.starts_with("mismatch=true"), "{settle}");
    assert!(settle.contains(&lied), "{settle}");
    // The other shard is published; the damaged one is not, nor kept.
    let repo = cache.path().join("models--org--lied");
    let snapshot = repo.join("snapshots").join(DEFAULT_COMMIT);
    assert!(snapshot.join(shard_name(0, 2)).exists());
    assert!(std::fs::symlink_metadata(snapshot.join(&lied)).is_err());
    assert!(
        partials(cache.path()).is_empty(),
        "{:?}",
        tree(cache.path())
    );
    // The report named where each file is published.
    let (_, _, path) = &report.files[&shard_name(0, 2)];
    assert_eq!(*path, snapshot.join(shard_name(0, 2)).display().to_string());
}

#[test]
fn a_cancel_flag_set_after_the_load_returned_unpublishes_nothing() {
    let hub = Hub::aligned(Options::default());
    let report = hub.load("hf://org/model", &[(CANCEL_AFTER, "1".to_owned())]);
    assert_eq!(report.digest, hub.digest());
    // The child set its flag once the load returned, then dropped its tensors, which
    // waited for the checks: every file published.
    for name in hub.names() {
        assert_cached(&hub, &name);
    }
    assert!(
        partials(hub.cache.path()).is_empty(),
        "{:?}",
        tree(hub.cache.path())
    );
}

#[test]
fn a_cold_load_through_the_cache_reports_its_progress_once_per_byte() {
    // Aligned shards, each fetched into the file being written (the copies' reads), on a
    // link slow enough for several calls (one every 50 ms at most).
    let hub = Hub::aligned(Options {
        bandwidth_bytes_per_sec: Some(8 << 20),
        ..Options::default()
    });
    // Reads of 256 KiB, each counted as it lands: about 24 over a second.
    let vars = [
        (PROGRESS, "1".to_owned()),
        ("SAFELOAD_TEST_HUB_READ_SIZE", (256 << 10).to_string()),
    ];
    let report = hub.load("hf://org/model", &vars);
    assert_eq!(report.digest, hub.digest());
    let seen = report.progress.clone().unwrap_or_default();
    let field = |name: &str| -> String {
        seen.split(' ')
            .find_map(|f| f.strip_prefix(&format!("{name}=")).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {name} in {seen:?}"))
    };
    let n = |name: &str| field(name).parse::<u64>().unwrap();
    assert!(n("calls") >= 3, "{seen}");
    assert_eq!(n("totals"), 1, "the total known from the start: {seen}");
    assert_eq!(field("monotonic"), "true", "{seen}");
    assert_eq!(n("done"), n("total"), "{seen}");
    // Every byte fetched, once: the shards' bytes past what the open read.
    let sizes: u64 = (0..3)
        .map(|i| hub.bytes(&shard_name(i, 3)).len() as u64)
        .sum();
    let total = n("total");
    assert!(
        total <= sizes && total + 3 * (64 << 10) >= sizes,
        "{total} of {sizes}"
    );
    assert_eq!(field("files"), "3/3", "{seen}");
}

#[test]
fn an_index_or_a_with_file_a_lying_hub_sends_is_an_error_never_used() {
    for (lied, url) in [
        ("model.safetensors.index.json", "hf://org/model"),
        ("config.json", "hf://org/model?with=config.json"),
    ] {
        let hub = Hub::new(Options {
            lie: Some(Lie {
                path: lied.to_owned(),
                from: 0,
            }),
            ..Options::default()
        });
        let e = hub.fail(url, &[]);
        assert!(
            e.contains("corrupt=true") && e.contains(lied),
            "{lied}: {e}"
        );
        assert!(e.contains("mismatch"), "{lied}: {e}");
        // Nothing of it published, nor kept.
        let snapshot = hub.snapshot().join(lied);
        assert!(std::fs::symlink_metadata(&snapshot).is_err(), "{lied}");
        assert!(
            partials(hub.cache.path()).is_empty(),
            "{:?}",
            tree(hub.cache.path())
        );
    }
}
