//! `safeload load` and `safeload prefetch` under `mpirun` with `SAFELOAD_EXCHANGE=mpi`, as a
//! job script runs them: three processes stand in for three nodes (`SAFELOAD_NODE_ID`), each
//! printing its JSON report to a file of its own.
//!
//! Built with the feature `mpi` only (`cargo test -p safeload-cli --features mpi --test
//! mpirun`, in `.ci/run`). Needs `mpirun`: skipped (loudly) where it cannot be run, a failure
//! under `SAFELOAD_REQUIRE_MPI=1`.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use safetensors::tensor::TensorView;
use serde_json::Value;
use tempfile::tempdir;

/// The variables that would change what the children do, cleared for every run.
const CLEARED: [&str; 14] = [
    "SAFELOAD_DISABLE_MMAP",
    "SAFELOAD_PREFETCH",
    "HF_SHARD_PREFETCH",
    "SAFELOAD_VERIFY",
    "SAFELOAD_NODE_ID",
    "SLURM_NODEID",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
];

/// Whether `mpirun` can be run; `false` (with a loud line) where it cannot and is not required.
fn have_mpirun() -> bool {
    match Command::new("mpirun").arg("--version").output() {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var_os("SAFELOAD_REQUIRE_MPI").is_none_or(|v| v != "1"),
                "mpirun is required (SAFELOAD_REQUIRE_MPI=1) but cannot be run: {e}"
            );
            eprintln!("SKIPPED: mpirun cannot be run: {e}");
            false
        }
    }
}

/// Runs `safeload <args(node)>` as node 0, 1 and 2 of one `mpirun` job with
/// `SAFELOAD_EXCHANGE=mpi`, each node's stdout in a file of `out`: the reports, in node order.
fn run_job(out: &Path, args: impl Fn(usize) -> Vec<String>) -> Vec<Value> {
    let mut mpirun = Command::new("mpirun");
    mpirun.args(["--allow-run-as-root", "--oversubscribe"]);
    for node in 0..3 {
        if node > 0 {
            mpirun.arg(":");
        }
        // `sh -c 'exec "$0" "$@" > file'`: each node's report whole in its own file.
        let file = out.join(format!("node{node}.json"));
        mpirun
            .args([
                "-np",
                "1",
                "env",
                &format!("SAFELOAD_NODE_ID={node}"),
                "sh",
                "-c",
            ])
            .arg(format!("exec \"$0\" \"$@\" > '{}'", file.display()))
            .arg(env!("CARGO_BIN_EXE_safeload"))
            .args(args(node));
    }
    for name in CLEARED {
        mpirun.env_remove(name);
    }
    mpirun
        .env("SAFELOAD_EXCHANGE", "mpi")
        .env("SAFELOAD_EXCHANGE_TIMEOUT_SECS", "60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut mpirun, 0);
    let mut child = mpirun.spawn().expect("mpirun starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(180) {
            // The whole job: mpirun and what it started.
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            panic!("the mpirun job did not end within 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = child.wait_with_output().unwrap();
    let shown = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(status.success(), "{status}\n{shown}");
    (0..3)
        .map(|node| {
            let text = std::fs::read_to_string(out.join(format!("node{node}.json"))).unwrap();
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("node {node}: {e}: {text}"))
        })
        .collect()
}

/// A checkpoint of three 4 MiB shards and its index in `dir`: its tensor bytes.
fn write_checkpoint(dir: &Path) -> u64 {
    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    for shard in 0..3 {
        let file = format!("model-{:05}-of-00003.safetensors", shard + 1);
        let tensors: Vec<(String, Vec<u8>)> = (0..4)
            .map(|i| {
                let bytes = (0..1 << 20)
                    .map(|b: usize| (b.wrapping_mul(31) ^ (shard * 4 + i)) as u8)
                    .collect();
                (format!("layers.{shard}.w{i}"), bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(name, bytes)| {
                total += bytes.len() as u64;
                weight_map.insert(name.clone(), file.clone().into());
                let view =
                    TensorView::new(safetensors::Dtype::F32, vec![256, 1024], bytes).unwrap();
                (name.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    total
}

fn as_u64(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not a count: {value}"))
}

/// The sum of `key` over the files of a load's report.
fn per_file(report: &Value, key: &str) -> u64 {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| as_u64(&f[key]))
        .sum()
}

#[test]
fn load_under_mpirun_reads_each_byte_once_per_cluster() {
    if !have_mpirun() {
        return;
    }
    let dir = tempdir().unwrap();
    let total = write_checkpoint(dir.path());
    let out = tempdir().unwrap();
    let path = dir.path().to_str().unwrap().to_owned();
    let reports = run_job(out.path(), |_| {
        vec![
            "load".into(),
            path.clone(),
            "--disable-mmap".into(),
            "--json".into(),
        ]
    });
    let mut read = 0;
    for (node, report) in reports.iter().enumerate() {
        let notes = report["notes"].as_array().unwrap();
        let expected = format!("this node (node {node} of 3)");
        assert!(
            notes.iter().any(|n| n["code"] == "read_once_per_cluster"
                && n["node"] == node
                && n["text"].as_str().unwrap().contains(&expected)),
            "{report}"
        );
        assert_eq!(per_file(report, "tensor_bytes"), total, "{report}");
        let mine = per_file(report, "bytes_read");
        assert!(mine > 0, "node {node} read its share: {report}");
        read += mine;
    }
    // Each byte read once between the nodes (headers aside), not three times.
    let ratio = read as f64 / total as f64;
    assert!(
        ratio <= 1.05,
        "{ratio:.3}x the checkpoint read: {reports:?}"
    );
}

#[test]
fn prefetch_under_mpirun_warms_each_nodes_page_cache_whole() {
    if !have_mpirun() {
        return;
    }
    // A copy per node, as each node has its own page cache: cold, written back and dropped.
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempdir().unwrap()).collect();
    let paths: Vec<PathBuf> = dirs.iter().map(|d| d.path().to_path_buf()).collect();
    for dir in &paths {
        write_checkpoint(dir);
        for entry in std::fs::read_dir(dir).unwrap() {
            std::fs::File::open(entry.unwrap().path())
                .unwrap()
                .sync_all()
                .unwrap();
        }
        safeload::evict(dir).unwrap();
    }
    let out = tempdir().unwrap();
    let reports = run_job(out.path(), |node| {
        vec![
            "prefetch".into(),
            paths[node].to_string_lossy().into_owned(),
            "--json".into(),
        ]
    });
    for report in &reports {
        // Each node is one local rank of its own (the exchange's split), not one of the three
        // processes Open MPI counts on this machine: it warms every chunk of its files.
        assert_eq!(
            (as_u64(&report["rank"]), as_u64(&report["local_size"])),
            (0, 1),
            "{report}"
        );
        assert_eq!(report["ran"], true, "{report}");
        if as_u64(&report["resident_before"]) == 0 {
            assert_eq!(
                as_u64(&report["chunks_handled"]),
                as_u64(&report["chunks"]),
                "{report}"
            );
        }
    }
}
