//! Loads under a memory limit and under a limit on threads, each in a child
//! process moved into a cgroup of its own: the outcome is always a fallback
//! or a typed error, never the OOM killer and never a panic.
//!
//! Needs root and the memory and pids cgroup controllers; where they are
//! missing each test prints `SKIPPED: <reason>` and passes, unless
//! `SAFELOAD_REQUIRE_CGROUP=1` (as `.ci/run` sets it).

use crate::common;

use std::io::BufRead;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};

use crate::common::cgroup::{Cgroup, Controller};
use crate::common::child::{Held, PATH, child_command, run_role, spawn_held, wait_for_go};
use safeload::mount::MountTable;
use safeload::{ErrorKind, Loader, report::Strategy};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

const MIB: u64 = 1 << 20;
/// Files, and bytes per file, of the checkpoint the children load.
const FILES: usize = 4;
const FILE_BYTES: u64 = 16 * MIB;
/// How the child loads: set by the parent.
const MODE: &str = "SAFELOAD_TEST_LIMITS_MODE";

/// Every file of the checkpoint on a FUSE mount of hf-mount, as far as the
/// auto policy knows: it reads them buffered.
const HF_MOUNT: &str = "36 25 0:50 / / ro - fuse hf-mount ro,user_id=0,group_id=0";

#[test]
fn child() {
    run_role(&[("load", load_in_child)]);
}

/// A child: says `READY`, waits for the parent's line (it is moved into its
/// cgroup meanwhile), loads as `MODE` says, prints one `RESULT` line.
fn load_in_child() {
    wait_for_go();
    let path = std::env::var(PATH).unwrap();
    let mode = std::env::var(MODE).unwrap();
    let loader = match mode.as_str() {
        "buffered" => Loader::new().disable_mmap(true),
        "auto-hf-mount" => Loader::new().mount_table(MountTable::parse(HF_MOUNT)),
        "threads" => Loader::new()
            .disable_mmap(true)
            .threads(8)
            .io_concurrency(8)
            .read_size(1 << 20),
        "threads-prefetch" => Loader::new().disable_mmap(false).prefetch(4).populate(true),
        other => panic!("unknown mode {other}"),
    };
    match loader.load(&path) {
        Ok(sd) => {
            let strategies: Vec<String> = sd
                .report()
                .files
                .iter()
                .map(|f| f.strategy.to_string())
                .collect();
            // Touch every byte, so that a load that lied about its memory
            // would meet the limit here.
            let sum: u64 = sd
                .tensors()
                .iter()
                .map(|t| t.as_bytes().iter().map(|&b| u64::from(b)).sum::<u64>())
                .sum();
            // Each note's code, then its words.
            let notes: Vec<String> = sd
                .report()
                .notes
                .iter()
                .map(|n| format!("{}: {n}", n.as_str()))
                .collect();
            println!(
                "RESULT ok {} sum={sum} notes={notes:?}",
                strategies.join(","),
            );
        }
        Err(e) => println!("RESULT err {:?} {e}", e.kind()),
    }
}

/// A checkpoint of `FILES` shards of `FILE_BYTES` each, on the build's disk.
fn checkpoint(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("limits-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut weight_map = serde_json::Map::new();
    for shard in 0..FILES {
        let file = format!("model-{:05}-of-{FILES:05}.safetensors", shard + 1);
        let data = common::bytes_for(&file, FILE_BYTES as usize);
        let tensor = format!("layer{shard}.weight");
        weight_map.insert(tensor.clone(), file.clone().into());
        let view = TensorView::new(Dtype::U8, vec![data.len()], &data).unwrap();
        safetensors::serialize_to_file([(tensor, view)], None, &dir.join(file)).unwrap();
    }
    let index = serde_json::json!({ "weight_map": weight_map });
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    dir
}

/// What the child printed, and how it ended.
struct Outcome {
    result: String,
    status: std::process::ExitStatus,
}

/// Starts a child loading `dir` as `mode`, moves it into `cgroup`, lets
/// `limit` set the limit (given the cgroup's memory usage then), and waits.
fn run_child(dir: &Path, mode: &str, cgroup: &Cgroup, limit: impl FnOnce(&Cgroup)) -> Outcome {
    let mut command = child_command(module_path!(), "load", dir);
    command.env(MODE, mode);
    let mut held = spawn_held(command);
    cgroup.enter(held.child.id());
    limit(cgroup);
    held.go();
    let Held { mut child, out } = held;
    let mut result = String::new();
    for line in out.lines() {
        let line = line.unwrap();
        if let Some((_, rest)) = line.split_once("RESULT ") {
            result = rest.to_string();
        }
    }
    let status = child.wait().unwrap();
    Outcome { result, status }
}

fn assert_not_killed(outcome: &Outcome, cgroup: &Cgroup, what: &str) {
    assert_eq!(
        outcome.status.signal(),
        None,
        "{what}: the child was killed (OOM killer: {})",
        cgroup.oom_killed()
    );
    assert!(outcome.status.success(), "{what}: {:?}", outcome.status);
    assert!(!cgroup.oom_killed(), "{what}: the OOM killer ran");
}

#[test]
fn a_limit_just_above_the_tensor_bytes_falls_back_or_refuses_never_oom() {
    let dir = checkpoint("tight");
    let tensors = FILES as u64 * FILE_BYTES;
    for extra in [1, 2, 4] {
        // Explicit buffered: refused with the numbers. Auto: what fits with
        // the margin is read (one file of 16 MiB), the rest mapped.
        for (mode, expect) in [
            ("buffered", "err InsufficientMemory"),
            ("auto-hf-mount", "ok buffered,mmap,mmap,mmap"),
        ] {
            let Some(cgroup) = Cgroup::new(Controller::Memory) else {
                return;
            };
            let what = format!("{mode} with the limit {extra} MiB above the tensor bytes");
            let outcome = run_child(&dir, mode, &cgroup, |cg| {
                cg.limit(cg.usage() + tensors + extra * MIB);
            });
            assert_not_killed(&outcome, &cgroup, &what);
            assert!(
                outcome.result.starts_with(expect),
                "{what}: {}",
                outcome.result
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn under_a_limit_what_fits_is_read_and_the_rest_mapped() {
    let dir = checkpoint("partial");
    let Some(cgroup) = Cgroup::new(Controller::Memory) else {
        return;
    };
    // Room for two of the four files and the margin, not three: halfway
    // between what two and three need.
    let need = |files: u64| files * FILE_BYTES + 32 * MIB + 2 * MIB * files;
    let room = (need(2) + need(3)) / 2;
    let outcome = run_child(&dir, "auto-hf-mount", &cgroup, |cg| {
        cg.limit(cg.usage() + room);
    });
    assert_not_killed(&outcome, &cgroup, "two of four fit");
    assert!(
        outcome.result.starts_with("ok buffered,buffered,mmap,mmap"),
        "{}",
        outcome.result
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn with_no_thread_to_spawn_loads_run_on_the_calling_thread() {
    let dir = checkpoint("threads");
    let expected_sum: u64 = (0..FILES)
        .map(|shard| {
            let file = format!("model-{:05}-of-{FILES:05}.safetensors", shard + 1);
            common::bytes_for(&file, FILE_BYTES as usize)
                .iter()
                .map(|&b| u64::from(b))
                .sum::<u64>()
        })
        .sum();
    for mode in ["threads", "threads-prefetch"] {
        let Some(cgroup) = Cgroup::new(Controller::Pids) else {
            return;
        };
        // No task more than the child has now: every thread spawn fails.
        let outcome = run_child(&dir, mode, &cgroup, |cg| cg.limit(1));
        assert!(outcome.status.success(), "{mode}: {:?}", outcome.status);
        assert!(
            outcome.result.starts_with("ok ")
                && outcome.result.contains(&format!("sum={expected_sum}")),
            "{mode}: {}",
            outcome.result
        );
        if mode == "threads" {
            assert!(
                outcome.result.contains("threads_refused: reading: ")
                    && outcome.result.contains("the OS refused more"),
                "the report says fewer threads ran: {}",
                outcome.result
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The kinds the children print are the crate's own names.
#[test]
fn outcome_words_are_the_error_kind_names() {
    let kind = ErrorKind::InsufficientMemory {
        needed: 1,
        available: 0,
    };
    assert!(format!("{kind:?}").starts_with("InsufficientMemory"));
    assert_eq!(Strategy::Mmap.to_string(), "mmap");
    assert_eq!(Strategy::Buffered.to_string(), "buffered");
}
