//! Each byte of a checkpoint crosses the link once, whoever loads it: two engines started at
//! once on an empty cache, and three local ranks of one job, serve at most 1.02x the shards.

use std::time::Duration;

use safeload_testhttp::{Options, Server};

use super::*;

/// A repository of 5 aligned shards of `mib` MiB each, served at `rate` bytes a second.
fn five_shards(mib: usize, rate: u64) -> Hub {
    let files = tempfile::tempdir().unwrap();
    let per_tensor = 1 << 20;
    let specs: Vec<Spec> = (0..5 * mib)
        .map(|i| spec(&format!("w{i:03}"), Dtype::F32, &[per_tensor / 4]))
        .collect();
    write_sharded(files.path(), &specs, 5);
    let server = Server::start(
        files.path(),
        Options {
            bandwidth_bytes_per_sec: Some(rate),
            latency: Some(Duration::from_millis(5)),
            ..Options::default()
        },
    )
    .unwrap();
    Hub {
        expected: naive_load(&shards_of(files.path())),
        files,
        server,
        cache: tempfile::tempdir().unwrap(),
    }
}

/// The shards' bytes sent for their bytes, as a ratio.
fn served(hub: &Hub, shards: usize) -> (u64, u64) {
    let names: Vec<String> = (0..shards).map(|i| shard_name(i, shards)).collect();
    let sent = names
        .iter()
        .map(|n| hub.server.path_stats(n).bytes_sent)
        .sum();
    let total = names.iter().map(|n| hub.bytes(n).len() as u64).sum();
    (sent, total)
}

/// Starts a load of `hf://org/model` per set of `vars` at once, waits for each, and checks
/// they loaded the checkpoint.
fn at_once(hub: &Hub, each: &[Vec<(&'static str, String)>]) -> Vec<Report> {
    let children: Vec<_> = each
        .iter()
        .map(|vars| {
            let mut all = hub.vars();
            all.extend(vars.iter().cloned());
            load_command("hf://org/model", &all)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{stdout}");
            let report = parse(&stdout);
            assert_eq!(report.digest, hub.digest(), "{report:#?}");
            report
        })
        .collect()
}

#[test]
fn two_engines_started_at_once_on_an_empty_cache_fetch_each_byte_once() {
    let mut worst = 0.0f64;
    for run in 0..10 {
        let hub = five_shards(16, 80 << 20);
        let started = std::time::Instant::now();
        let reports = at_once(&hub, &[Vec::new(), Vec::new()]);
        eprintln!("run {run}: {:?}", started.elapsed());
        let (sent, total) = served(&hub, 5);
        let ratio = sent as f64 / total as f64;
        worst = worst.max(ratio);
        assert!(
            ratio <= 1.02,
            "run {run}: {sent} bytes served for {total} ({ratio:.3}x): {reports:#?}"
        );
        for i in 0..5 {
            assert_cached(&hub, &shard_name(i, 5));
        }
    }
    eprintln!("TWO ENGINES: at most {worst:.3}x served in 10 runs");
}

#[test]
fn three_local_ranks_of_a_small_checkpoint_fetch_each_byte_once() {
    let mut worst = 0.0f64;
    for run in 0..10 {
        // 4 shards of ~20 MiB.
        let files = tempfile::tempdir().unwrap();
        let specs: Vec<Spec> = (0..80)
            .map(|i| spec(&format!("w{i:03}"), Dtype::F32, &[1 << 18]))
            .collect();
        write_sharded(files.path(), &specs, 4);
        let server = Server::start(
            files.path(),
            Options {
                bandwidth_bytes_per_sec: Some(80 << 20),
                ..Options::default()
            },
        )
        .unwrap();
        let hub = Hub {
            expected: naive_load(&shards_of(files.path())),
            files,
            server,
            cache: tempfile::tempdir().unwrap(),
        };
        let job = format!("safeload-once-{}-{run}", std::process::id());
        let ranks: Vec<Vec<(&'static str, String)>> = (0..3)
            .map(|rank| {
                vec![
                    ("LOCAL_RANK", rank.to_string()),
                    ("LOCAL_WORLD_SIZE", "3".to_owned()),
                    ("TORCHELASTIC_RUN_ID", job.clone()),
                ]
            })
            .collect();
        let reports = at_once(&hub, &ranks);
        let (sent, total) = served(&hub, 4);
        let ratio = sent as f64 / total as f64;
        worst = worst.max(ratio);
        assert!(
            ratio <= 1.02,
            "run {run}: {sent} bytes served for {total} ({ratio:.3}x): {reports:#?}"
        );
    }
    eprintln!("THREE RANKS: at most {worst:.3}x served in 10 runs");
}
