//! Loads split between nodes (issue 27) under `mpirun`: three processes stand in for three
//! nodes (`SAFELOAD_NODE_ID`), each with its own FUSE test mount of the same checkpoint, whose
//! counters say how many bytes each node read from storage. Every process loads through the
//! core's `Loader` with this crate's extras and the node copy's (what the facade's features build
//! in) and
//! `SAFELOAD_EXCHANGE=mpi`, as a job script would, and prints the digest of its tensors and the
//! load's notes.
//!
//! Needs FUSE and `mpirun`: skipped (loudly) where either is missing, a failure under
//! `SAFELOAD_REQUIRE_FUSE=1` / `SAFELOAD_REQUIRE_MPI=1`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use safeload_testfs::{Mount, Options, skip_without_fuse};

use crate::exchange::tests::{ROLE, Run, mpirun_child, pattern};
use crate::exchange::{CORRUPT_ENV, NODE_ID_ENV};
use safeload_core::cluster::TIMEOUT_ENV;
use safeload_node::NodeExtras;

/// What the facade builds in for these loads: this crate's exchange, and the node copy the local
/// ranks of a node share.
#[derive(Debug, Clone, Copy, Default)]
struct WithNodeCopy;

impl safeload_core::extras::Extras for WithNodeCopy {
    fn join_exchange(&self, name: &str) -> Option<std::io::Result<safeload_core::cluster::Joined>> {
        crate::MpiExtras.join_exchange(name)
    }

    fn share(
        &self,
        files: &[safeload_core::extras::ShareFile<'_>],
        ask: &safeload_core::extras::ShareAsk<'_>,
    ) -> safeload_core::extras::Shared {
        NodeExtras.share(files, ask)
    }
}

/// This module's child test, every process's body under `mpirun`.
const CHILD: &str = "load_tests::child";

/// `mpirun` of `nodes` processes loading as [`act`] says (the exchange's own harness).
fn mpirun(role: &str, nodes: &[Option<u32>], env: &[(&str, &str)], limit: Duration) -> Option<Run> {
    mpirun_child(CHILD, role, nodes, env, limit)
}

/// The body of every process under `mpirun`: nothing in an ordinary test run.
#[test]
fn child() {
    if std::env::var(ROLE).is_ok_and(|role| role == "load") {
        // A load through the public API, which joins the exchange itself.
        act();
    }
}

/// Set in a child: the checkpoint of each node, one path per line, in node order.
const PATHS: &str = "SAFELOAD_TEST_CLUSTER_PATHS";
/// Set in a child: what the node whose id this is does mid-load (`abort`, `stop`).
const FAULT: &str = "SAFELOAD_TEST_CLUSTER_FAULT";
/// Set in a child: the node that plays [`FAULT`].
const FAULT_NODE: &str = "SAFELOAD_TEST_CLUSTER_FAULT_NODE";

/// The child's side: loads this node's path, prints `NODE <id> DIGEST <hex>`, a `NODE <id>
/// NOTE <note>` line per note of the load, or `NODE <id> ERROR <kind> <message>`.
fn act() {
    let node: usize = std::env::var(NODE_ID_ENV).unwrap().parse().unwrap();
    let paths = std::env::var(PATHS).unwrap();
    let path = paths.lines().nth(node).unwrap().to_owned();
    let faulty = std::env::var(FAULT_NODE).ok().and_then(|n| n.parse().ok()) == Some(node);
    if let (true, Ok(fault)) = (faulty, std::env::var(FAULT)) {
        // Mid-load: after the others have begun to read (the mounts are slow).
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            println!("NODE {node} FAULT {fault}");
            match fault.as_str() {
                "abort" => std::process::abort(),
                // A stalled node: stopped until `mpirun` ends the job.
                _ => {
                    let _ = std::process::Command::new("kill")
                        .args(["-STOP", &std::process::id().to_string()])
                        .status();
                }
            }
        });
    }
    match safeload_core::Loader::<WithNodeCopy>::new().load(&path) {
        Ok(sd) => {
            println!("NODE {node} DIGEST {:016x}", digest(&sd));
            for note in &sd.report().notes {
                println!("NODE {node} NOTE {note}");
            }
            for file in &sd.report().files {
                if let Some(copy) = &file.node_copy {
                    println!("NODE {node} COPY {copy}");
                }
            }
        }
        Err(e) => println!("NODE {node} ERROR {:?} {e}", e.io_error().map(|e| e.kind())),
    }
}

/// FNV-1a over every tensor's name and bytes, in name order.
fn digest(sd: &safeload_core::StateDict) -> u64 {
    let mut tensors: Vec<_> = sd.iter().collect();
    tensors.sort_by(|a, b| a.0.cmp(b.0));
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (name, t) in tensors {
        for &b in name.as_bytes().iter().chain(t.as_bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// A checkpoint of `shards` files of `mib` MiB each (F32 tensors of 1 MiB, bytes from
/// `seed`), with its index, in `dir`; its naive digest (the same FNV over a plain read).
fn write_checkpoint(dir: &Path, shards: usize, mib: usize, seed: u8) -> u64 {
    use safetensors::tensor::TensorView;
    let mut weight_map = serde_json::Map::new();
    let mut all: Vec<(String, Vec<u8>)> = Vec::new();
    for s in 0..shards {
        let name = format!("model-{:05}-of-{shards:05}.safetensors", s + 1);
        let tensors: Vec<(String, Vec<u8>)> = (0..mib)
            .map(|t| {
                let tensor = format!("layer{s}.w{t:03}");
                let bytes = pattern(1 << 20, seed.wrapping_add((s * 31 + t) as u8));
                (tensor, bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, b)| {
                let view = TensorView::new(safetensors::Dtype::F32, vec![256, 1024], b).unwrap();
                (n.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&name)).unwrap();
        for (n, _) in &tensors {
            weight_map.insert(n.clone(), name.clone().into());
        }
        all.extend(tensors);
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for (name, bytes) in &all {
        for &b in name.as_bytes().iter().chain(bytes) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Three mounts of `sources` (one source directory per node), slowed to `link` bytes/s each,
/// and the index on each.
fn mounts(sources: [&Path; 3], link: Option<u64>) -> (Vec<Mount>, Vec<PathBuf>) {
    let mounts: Vec<Mount> = sources
        .iter()
        .map(|s| {
            Mount::new(
                s,
                Options {
                    bandwidth_bytes_per_sec: link,
                    ..Options::default()
                },
            )
            .unwrap()
        })
        .collect();
    let paths = mounts
        .iter()
        .map(|m| m.path().join("model.safetensors.index.json"))
        .collect();
    (mounts, paths)
}

fn joined(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

const NODES: [Option<u32>; 3] = [Some(0), Some(1), Some(2)];

/// A job of `nodes` (a node id per process) loading `source` from fresh mounts of it, one per
/// node id, with `env`: the run and the bytes each mount served; `None` where `mpirun` is
/// missing (skipped).
fn load_on_mounts(
    source: &Path,
    nodes: &[Option<u32>],
    env: &[(&str, &str)],
) -> Option<(Run, Vec<u64>)> {
    let (mounts, paths) = mounts([source, source, source], None);
    let list = joined(&paths);
    let mut env = env.to_vec();
    env.push((PATHS, list.as_str()));
    let run = mpirun("load", nodes, &env, Duration::from_secs(120))?;
    assert!(run.status.success(), "{}", run.show());
    let served = mounts.iter().map(|m| m.stats().bytes_read).collect();
    Some((run, served))
}

/// Asserts that every one of `count` processes printed the digest `expected`.
fn assert_digests(run: &Run, count: usize, expected: u64) {
    let digests = run.lines("DIGEST");
    assert_eq!(digests.len(), count, "{}", run.show());
    for line in &digests {
        let ends = line.ends_with(&format!("{expected:016x}"));
        assert!(ends, "{line}\n{}", run.show());
    }
}

/// The bytes of the files in `dir`.
fn bytes_in(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

/// The runs of `lines` that contain `what`.
fn count(lines: &[String], what: &str) -> usize {
    lines.iter().filter(|l| l.contains(what)).count()
}

#[test]
fn three_nodes_read_each_byte_once_and_load_the_same_tensors() {
    if skip_without_fuse() {
        return;
    }
    let source = tempfile::tempdir().unwrap();
    let expected = write_checkpoint(source.path(), 3, 32, 7);
    let total = bytes_in(source.path());
    let exchange = [("SAFELOAD_EXCHANGE", "mpi")];
    let Some((run, served)) = load_on_mounts(source.path(), &NODES, &exchange) else {
        return;
    };
    assert_digests(&run, 3, expected);
    let notes = run.lines("NOTE");
    assert_eq!(count(&notes, "read once per cluster"), 3, "{}", run.show());
    // Every byte from storage once, all nodes together (headers read by each: a little more).
    let read: u64 = served.iter().sum();
    let ratio = read as f64 / total as f64;
    eprintln!("bytes read from the 3 mounts: {read} of {total} ({ratio:.3}x)");
    assert!(
        ratio <= 1.05,
        "{ratio:.3}x the checkpoint read\n{}",
        run.show()
    );
    assert!(served.iter().all(|&b| b > 0), "every node read its share");
    // Without the exchange, on fresh mounts: each node reads everything.
    let Some((_, served)) = load_on_mounts(source.path(), &NODES, &[]) else {
        return;
    };
    let read: u64 = served.iter().sum();
    let today = read as f64 / total as f64;
    eprintln!("without the exchange: {read} of {total} ({today:.3}x)");
    assert!(today >= 2.95, "{today:.3}x");
}

#[test]
fn nodes_of_two_local_ranks_read_each_byte_once_per_cluster() {
    if skip_without_fuse() {
        return;
    }
    let source = tempfile::tempdir().unwrap();
    let expected = write_checkpoint(source.path(), 3, 16, 5);
    let total = bytes_in(source.path());
    // Two nodes of two processes each; the third mount is not used.
    let nodes = [Some(0), Some(0), Some(1), Some(1)];
    let exchange = [("SAFELOAD_EXCHANGE", "mpi")];
    let Some((run, served)) = load_on_mounts(source.path(), &nodes, &exchange) else {
        return;
    };
    assert_digests(&run, 4, expected);
    // The participants split the reads; every process's tensors are views of its node's copy,
    // the members' received complete.
    let notes = run.lines("NOTE");
    assert_eq!(count(&notes, "read once per cluster"), 2, "{}", run.show());
    let copies = run.lines("COPY");
    assert_eq!(copies.len(), 4 * 3, "{}", run.show());
    let filled = count(&copies, "split between nodes");
    let received = count(&copies, "received from pid");
    assert_eq!((filled, received), (2 * 3, 2 * 3), "{}", run.show());
    let read: u64 = served.iter().sum();
    let ratio = read as f64 / total as f64;
    eprintln!("2 nodes x 2 local ranks: {read} of {total} read from the mounts ({ratio:.3}x)");
    assert!(
        ratio <= 1.05,
        "{ratio:.3}x the checkpoint read\n{}",
        run.show()
    );
    assert!(
        served[..2].iter().all(|&b| b > total / 4),
        "every node read its share"
    );
    // Without the exchange, on fresh mounts: each node's ranks share one copy, each node reads
    // everything (as when the copy took the files and left the exchange nothing to split).
    let Some((_, served)) = load_on_mounts(source.path(), &nodes, &[]) else {
        return;
    };
    let read: u64 = served.iter().sum();
    let today = read as f64 / total as f64;
    eprintln!("2 nodes x 2 local ranks without the exchange: {read} of {total} ({today:.3}x)");
    assert!((1.95..2.1).contains(&today), "{today:.3}x");
}

#[test]
fn a_corrupted_range_is_an_error_on_the_node_that_received_it() {
    if skip_without_fuse() {
        return;
    }
    let source = tempfile::tempdir().unwrap();
    write_checkpoint(source.path(), 3, 4, 9);
    let s = source.path();
    let (_mounts, paths) = mounts([s, s, s], None);
    let list = joined(&paths);
    let env = [
        ("SAFELOAD_EXCHANGE", "mpi"),
        (PATHS, list.as_str()),
        (CORRUPT_ENV, "1"),
        (TIMEOUT_ENV, "3"),
    ];
    let Some(run) = mpirun("load", &NODES, &env, Duration::from_secs(120)) else {
        return;
    };
    let errors = run.lines("ERROR");
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("NODE 1 ERROR Some(InvalidData)") && e.contains("corrupted")),
        "{}",
        run.show()
    );
    assert!(
        errors
            .iter()
            .all(|e| e.contains("exchanging between nodes")),
        "{}",
        run.show()
    );
}

#[test]
fn a_node_with_another_version_makes_every_node_read_alone() {
    if skip_without_fuse() {
        return;
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = write_checkpoint(a.path(), 3, 4, 1);
    let second = write_checkpoint(b.path(), 3, 4, 2);
    let (_mounts, paths) = mounts([a.path(), a.path(), b.path()], None);
    let list = joined(&paths);
    let env = [("SAFELOAD_EXCHANGE", "mpi"), (PATHS, list.as_str())];
    let Some(run) = mpirun("load", &NODES, &env, Duration::from_secs(120)) else {
        return;
    };
    assert!(run.status.success(), "{}", run.show());
    let digests = run.lines("DIGEST");
    assert_eq!(
        digests,
        [
            format!("NODE 0 DIGEST {first:016x}"),
            format!("NODE 1 DIGEST {first:016x}"),
            format!("NODE 2 DIGEST {second:016x}"),
        ],
        "{}",
        run.show()
    );
    let notes = run.lines("NOTE");
    assert_eq!(notes.len(), 3, "{}", run.show());
    for note in &notes {
        assert!(
            note.contains("each node read alone (node 2 sees another"),
            "{note}"
        );
    }
}

#[test]
fn a_node_that_dies_or_stalls_mid_load_ends_the_job_within_seconds() {
    if skip_without_fuse() {
        return;
    }
    let source = tempfile::tempdir().unwrap();
    write_checkpoint(source.path(), 3, 16, 3);
    let s = source.path();
    // 32 MiB/s per mount: each node's share takes about half a second to read.
    for fault in ["abort", "stop"] {
        let (_mounts, paths) = mounts([s, s, s], Some(32 << 20));
        let list = joined(&paths);
        let env = [
            ("SAFELOAD_EXCHANGE", "mpi"),
            (PATHS, list.as_str()),
            (FAULT, fault),
            (FAULT_NODE, "2"),
            (TIMEOUT_ENV, "3"),
        ];
        let Some(run) = mpirun("load", &NODES, &env, Duration::from_secs(60)) else {
            return;
        };
        assert!(!run.status.success(), "{fault}: {}", run.show());
        assert!(
            run.elapsed < Duration::from_secs(20),
            "{fault}: {}",
            run.show()
        );
        // No node reports a load as done.
        assert!(run.lines("DIGEST").len() < 3, "{fault}: {}", run.show());
        if fault == "stop" {
            // The others give up after the timeout, with an error naming the exchange.
            let errors = run.lines("ERROR");
            assert!(
                errors
                    .iter()
                    .any(|e| e.contains("exchanging between nodes")),
                "{}",
                run.show()
            );
        }
    }
}
