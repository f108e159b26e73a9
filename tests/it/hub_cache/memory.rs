//! Memory bounded by what a load asked for, not by what a server sends: a hub that answers
//! the open's ranged GET of a `?with=` file or of a shard with `200` and a 1 GiB body, and a
//! server that ignores `Range` and claims a terabyte, each met by a load in a child under
//! `RLIMIT_AS` = 2 GiB, and one under a 1 GiB cgroup memory limit: a clear error, no abort,
//! and the child's peak resident memory (`VmHWM`) under 300 MiB.

use std::io::Read as _;
use std::process::Stdio;

use safeload_testhttp::{Options, Server};

use crate::common::cgroup::{Cgroup, Controller};
use crate::common::child::{ROLE, spawn_held, wait_for_go};

use super::*;

/// Set in a child: its soft `RLIMIT_AS`, in bytes, set before it loads.
const ADDRESS_LIMIT: &str = "SAFELOAD_TEST_MEM_RLIMIT_AS";
/// Set in a child: wait for the parent's word before loading (to be moved into a cgroup).
const HELD: &str = "SAFELOAD_TEST_MEM_HELD";

const GIB: u64 = 1 << 30;
/// The bound of the child's peak resident memory, whatever the server sent.
const MAX_PEAK: u64 = 300 << 20;

/// Loads `PATH` under the limits the variables set; prints `MEM-ERR remote=<bool> ::
/// <error>` or `MEM-OK`, then `MEM-HWM <bytes>`, its peak resident memory.
pub(super) fn act() {
    if let Ok(limit) = std::env::var(ADDRESS_LIMIT) {
        let limit: u64 = limit.parse().unwrap();
        let old = rustix::process::getrlimit(rustix::process::Resource::As);
        let new = rustix::process::Rlimit {
            current: Some(limit),
            maximum: old.maximum,
        };
        rustix::process::setrlimit(rustix::process::Resource::As, new).unwrap();
    }
    if std::env::var_os(HELD).is_some() {
        wait_for_go();
    }
    let url = std::env::var(PATH).unwrap();
    match Loader::new().load(&url) {
        Ok(_) => println!("MEM-OK"),
        Err(e) => {
            let remote = matches!(e.kind(), safeload::ErrorKind::Remote { .. });
            println!("MEM-ERR remote={remote} :: {e}");
        }
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap();
    println!("MEM-HWM {}", hwm * 1024);
}

/// What a bounded child printed: its error (`None` where it loaded) and peak memory.
#[derive(Debug)]
struct Bounded {
    error: Option<String>,
    peak: u64,
}

impl Bounded {
    fn of(stdout: &str, status: std::process::ExitStatus) -> Bounded {
        // Exited, not killed: an allocation failure aborts (SIGABRT), the OOM killer kills.
        assert!(
            status.success() && stdout.contains("CHILD-DONE bounded"),
            "{status}\n{stdout}"
        );
        let line = |key: &str| {
            stdout
                .lines()
                .find_map(|l| l.split_once(key).map(|(_, rest)| rest.trim().to_owned()))
        };
        Bounded {
            error: line("MEM-ERR "),
            peak: line("MEM-HWM ").unwrap().parse().unwrap(),
        }
    }

    /// The error, which is to be the crate's `Remote` kind; the peak is to be bounded.
    fn remote_error(&self) -> &str {
        eprintln!(
            "MEASURED peak resident memory {} MiB: {:?}",
            self.peak >> 20,
            self.error
        );
        assert!(
            self.peak < MAX_PEAK,
            "{} bytes at peak: {self:?}",
            self.peak
        );
        let error = self.error.as_deref().expect("an error");
        let text = error
            .strip_prefix("remote=true :: ")
            .unwrap_or_else(|| panic!("not a remote error: {error}"));
        assert!(text.contains("bytes"), "{text}");
        text
    }
}

/// The child's command: the `bounded` role on `url` with `vars`.
fn bounded_command(url: &str, vars: &[(&'static str, String)]) -> std::process::Command {
    let mut cmd = load_command(url, vars);
    cmd.env(ROLE, "bounded");
    cmd
}

/// Runs a bounded child under `RLIMIT_AS` = 2 GiB.
fn under_two_gib(url: &str, vars: &[(&'static str, String)]) -> Bounded {
    let out = bounded_command(url, vars)
        .env(ADDRESS_LIMIT, (2 * GIB).to_string())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    Bounded::of(&String::from_utf8_lossy(&out.stdout), out.status)
}

/// A hub whose answers to `path` ignore `Range` and claim 1 GiB, met with zeros (and the
/// listing too, with `lying_listing`).
fn hub_claiming(path: &str, lying_listing: bool) -> Hub {
    Hub::new(Options {
        whole_paths: vec![path.to_owned()],
        claimed_len: Some(GIB),
        claim_linked_size: lying_listing,
        ..Options::default()
    })
}

#[test]
fn a_with_file_answered_with_a_gigabyte_is_an_error_within_bounded_memory() {
    // A small file has no `X-Linked-Size`: the HEAD's claimed length is all the hub says.
    let hub = hub_claiming("config.json", false);
    let out = under_two_gib("hf://org/model?with=config.json", &hub.vars());
    let text = out.remote_error();
    assert!(text.contains("config.json"), "{text}");
    assert!(text.contains("1073741824 bytes"), "{text}");
    // Nothing of it was published.
    assert!(!hub.snapshot().join("config.json").exists());
}

#[test]
fn a_shard_answered_with_a_gigabyte_is_an_error_within_bounded_memory() {
    let name = shard_name(0, 3);
    // The hub's listing says the true length: the answer contradicts it.
    let hub = hub_claiming(&name, false);
    let out = under_two_gib("hf://org/model", &hub.vars());
    let text = out.remote_error();
    assert!(
        text.contains(&name) && text.contains("1073741824"),
        "{text}"
    );
    // The listing lies with the body: refused for the memory it would take.
    let hub = hub_claiming(&name, true);
    let out = under_two_gib("hf://org/model", &hub.vars());
    let text = out.remote_error();
    assert!(text.contains(&name), "{text}");
    assert!(
        text.contains("ignores Range") && text.contains("may take in memory"),
        "{text}"
    );
}

#[test]
fn a_terabyte_claim_without_ranges_is_an_error_within_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..5)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[1024, 1024]))
        .collect();
    write_single(dir.path(), &specs);
    // A terabyte, and a claim this machine's memory would hold but the process's limit
    // would not (once kept whole while it fit half of `MemAvailable`).
    for claim in [1u64 << 40, 4 * GIB] {
        let server = Server::start(
            dir.path(),
            Options {
                ignore_range: true,
                claimed_len: Some(claim),
                ..Options::default()
            },
        )
        .unwrap();
        let url = format!("{}/model.safetensors", server.url());
        let out = under_two_gib(&url, &[]);
        let text = out.remote_error();
        assert!(text.contains(&format!("{claim} bytes")), "{text}");
        assert!(text.contains("ignores Range"), "{text}");
    }
}

#[test]
fn a_shard_answered_with_a_gigabyte_under_a_one_gib_cgroup_is_an_error() {
    let Some(cgroup) = Cgroup::new(Controller::Memory) else {
        return;
    };
    cgroup.limit(GIB);
    let name = shard_name(0, 3);
    let hub = hub_claiming(&name, true);
    let mut command = bounded_command("hf://org/model", &hub.vars());
    command.env(HELD, "1").stderr(Stdio::inherit());
    let mut held = spawn_held(command);
    cgroup.enter(held.child.id());
    held.go();
    let mut stdout = String::new();
    held.out.read_to_string(&mut stdout).unwrap();
    let status = held.child.wait().unwrap();
    assert!(!cgroup.oom_killed(), "{stdout}");
    let out = Bounded::of(&stdout, status);
    let text = out.remote_error();
    assert!(text.contains(&name), "{text}");
    assert!(text.contains("may take in memory"), "{text}");
}
