//! The MPI exchange under `mpirun`: each test starts `mpirun` on this test binary, whose `child`
//! test runs a role (`SAFELOAD_TEST_MPI_ROLE`) in every process, each process given its node by
//! `SAFELOAD_NODE_ID` (through `env`, one app context per process), so that processes on this
//! machine stand in for nodes. The children print `NODE <index> <WORD> ...` lines; the tests
//! assert on them, on `mpirun`'s status and on how long it took.
//!
//! Where `mpirun` is missing a test prints `SKIPPED: <reason>` on stderr and passes, unless
//! `SAFELOAD_REQUIRE_MPI=1` (CI), where it fails.

use std::io::Read;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{
    CHUNK, CORRUPT_ENV, MpiExchange, MpiMembership, MpiSettings, NODE_ID_ENV, SLURM_NODE_ID_ENV,
};
use safeload_core::cluster::{
    Exchange, ExchangeError, ExchangeErrorKind, TIMEOUT_ENV, broadcast_checked,
};

/// Set in a child: the role it plays.
pub(crate) const ROLE: &str = "SAFELOAD_TEST_MPI_ROLE";
/// `1` where a test that needs `mpirun` must fail rather than skip.
const REQUIRE: &str = "SAFELOAD_REQUIRE_MPI";
/// The name the harness gives the child test.
const CHILD: &str = "exchange::tests::child";
/// The timeout of the children's collectives, unless a test sets another: far above what a
/// loaded test machine needs, so that only a stall reaches it.
const CHILD_TIMEOUT_SECS: &str = "30";

/// One `mpirun` at a time: each runs several busy processes on a machine of two cores.
static ONE_JOB: Mutex<()> = Mutex::new(());

/// What an `mpirun` did.
pub(crate) struct Run {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// When it ended, as the time since the epoch (to compare with the children's clocks).
    pub(crate) ended: Duration,
    pub(crate) elapsed: Duration,
}

impl Run {
    /// The children's `NODE <index> <word> ...` lines, sorted, so that tests compare sets.
    pub(crate) fn lines(&self, word: &str) -> Vec<String> {
        // A child's line may follow another child's partial line (the harness's `test ...`
        // before its result): each line is taken from its `NODE`.
        let mut lines: Vec<String> = self
            .stdout
            .lines()
            .filter_map(|l| l.find("NODE ").map(|at| &l[at..]))
            .filter(|l| l.split_whitespace().nth(2) == Some(word))
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    }

    pub(crate) fn show(&self) -> String {
        format!(
            "status {:?} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// `mpirun` with one process per entry of `nodes` (its `SAFELOAD_NODE_ID`, or none), each
/// running `role` with `env` set, killed (and the test failed) if it is not done within
/// `limit`. `None` where `mpirun` is missing and not required.
fn mpirun(role: &str, nodes: &[Option<u32>], env: &[(&str, &str)], limit: Duration) -> Option<Run> {
    mpirun_child(CHILD, role, nodes, env, limit)
}

/// [`mpirun`] with `child` (the test's full name in this binary) as every process's body.
pub(crate) fn mpirun_child(
    child: &str,
    role: &str,
    nodes: &[Option<u32>],
    env: &[(&str, &str)],
    limit: Duration,
) -> Option<Run> {
    if let Err(e) = Command::new("mpirun").arg("--version").output() {
        assert!(
            std::env::var_os(REQUIRE).is_none_or(|v| v != "1"),
            "mpirun is required ({REQUIRE}=1) but cannot be run: {e}"
        );
        eprintln!("SKIPPED: mpirun cannot be run: {e}");
        return None;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(|p| p.into_inner());
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("mpirun");
    // Root in containers and CI; more processes than cores.
    cmd.args(["--allow-run-as-root", "--oversubscribe"]);
    for (i, node) in nodes.iter().enumerate() {
        if i > 0 {
            cmd.arg(":");
        }
        cmd.args(["-np", "1", "env"]);
        if let Some(node) = node {
            cmd.arg(format!("{NODE_ID_ENV}={node}"));
        }
        cmd.arg(&exe)
            .args(["--exact", child, "--nocapture", "--test-threads=1"]);
    }
    cmd.env(ROLE, role)
        .env(TIMEOUT_ENV, CHILD_TIMEOUT_SECS)
        .env_remove(NODE_ID_ENV)
        .env_remove(SLURM_NODE_ID_ENV)
        .env_remove(CORRUPT_ENV);
    for (name, value) in env {
        cmd.env(name, value);
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            pipe.read_to_string(&mut text).unwrap();
            text
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > limit {
            // The whole group: mpirun and what it started.
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            std::thread::sleep(Duration::from_secs(2));
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let status = child.wait().unwrap();
            let run = Run {
                status,
                stdout: stdout.join().unwrap(),
                stderr: stderr.join().unwrap(),
                ended: epoch(),
                elapsed: start.elapsed(),
            };
            panic!("mpirun did not end within {limit:?}: {}", run.show());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let ended = epoch();
    let elapsed = start.elapsed();
    Some(Run {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
        ended,
        elapsed,
    })
}

fn epoch() -> Duration {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap()
}

/// `len` bytes that differ with `seed`, and from one position to the next.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
        .collect()
}

// --- The tests, in the parent ---

#[test]
fn all_gather_returns_every_nodes_bytes_in_node_order() {
    let Some(job) = mpirun(
        "gather",
        &[Some(0), Some(1), Some(2)],
        &[],
        Duration::from_secs(60),
    ) else {
        return;
    };
    assert!(job.status.success(), "{}", job.show());
    assert_eq!(
        job.lines("OK"),
        ["NODE 0 OK gather", "NODE 1 OK gather", "NODE 2 OK gather"],
        "{}",
        job.show()
    );
}

#[test]
fn checked_ranges_of_every_size_move_from_every_owner_to_every_node() {
    let Some(job) = mpirun(
        "ranges",
        &[Some(0), Some(1), Some(2)],
        &[],
        Duration::from_secs(120),
    ) else {
        return;
    };
    assert!(job.status.success(), "{}", job.show());
    assert_eq!(
        job.lines("OK"),
        ["NODE 0 OK ranges", "NODE 1 OK ranges", "NODE 2 OK ranges"],
        "{}",
        job.show()
    );
}

#[test]
fn a_range_corrupted_on_the_wire_is_an_error_on_its_receiver() {
    let Some(job) = mpirun(
        "corrupt",
        &[Some(0), Some(1), Some(2)],
        &[(CORRUPT_ENV, "1")],
        Duration::from_secs(60),
    ) else {
        return;
    };
    assert!(job.status.success(), "{}", job.show());
    let corrupt = job.lines("CORRUPT");
    assert_eq!(corrupt.len(), 1, "{}", job.show());
    assert!(
        corrupt[0].starts_with(
            "NODE 1 CORRUPT a range of 4096 bytes from node 0 arrived corrupted on node 1: \
             its SHA-256 is "
        ),
        "{}",
        job.show()
    );
    // The others got the range whole, and every node goes on.
    assert_eq!(
        job.lines("OK"),
        ["NODE 0 OK after", "NODE 1 OK after", "NODE 2 OK after"],
        "{}",
        job.show()
    );
    assert_eq!(job.lines("WHOLE"), ["NODE 2 WHOLE"], "{}", job.show());
}

#[test]
fn a_process_that_aborts_mid_exchange_ends_the_job_within_seconds() {
    dead_process_ends_the_job("abort", "exited on signal 6");
}

#[test]
fn a_process_killed_mid_exchange_ends_the_job_within_seconds() {
    dead_process_ends_the_job("sigkill", "exited on signal 9");
}

/// Node 1 dies (`role`) while nodes 0 and 2 wait in a broadcast from it: `mpirun` must end
/// within 10 s of the death, non-zero, saying `says`, and no survivor may report success.
fn dead_process_ends_the_job(role: &str, says: &str) {
    let Some(job) = mpirun(
        role,
        &[Some(0), Some(1), Some(2)],
        &[],
        Duration::from_secs(60),
    ) else {
        return;
    };
    assert!(!job.status.success(), "{}", job.show());
    let dying = job.lines("DYING");
    assert_eq!(dying.len(), 1, "{}", job.show());
    let died_ms: u64 = dying[0].split_whitespace().nth(3).unwrap().parse().unwrap();
    let after = job.ended.saturating_sub(Duration::from_millis(died_ms));
    eprintln!(
        "{role}: mpirun ended {after:?} after node 1 died ({:?} in all)",
        job.elapsed
    );
    assert!(after < Duration::from_secs(10), "{after:?}: {}", job.show());
    assert!(job.stderr.contains(says), "{}", job.show());
    assert!(job.lines("RETURNED").is_empty(), "{}", job.show());
}

#[test]
fn a_stalled_process_is_a_timeout_on_the_others_then_the_job_ends() {
    let Some(job) = mpirun(
        "stall",
        &[Some(0), Some(1), Some(2)],
        &[(TIMEOUT_ENV, "2")],
        Duration::from_secs(60),
    ) else {
        return;
    };
    let timed_out = job.lines("TIMEDOUT");
    assert_eq!(timed_out.len(), 2, "{}", job.show());
    for (line, node) in timed_out.iter().zip([0, 2]) {
        let mut words = line.split_whitespace().skip(3);
        let waited = Duration::from_millis(words.next().unwrap().parse().unwrap());
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(5),
            "{line}"
        );
        let message: Vec<&str> = words.collect();
        assert_eq!(
            message.join(" "),
            format!(
                "broadcast of 4096 bytes from node 1 did not complete within 2s on node {node} \
                 (at bytes 0..4096; a node stalled or died)"
            )
        );
    }
    assert_eq!(
        job.lines("BROKEN"),
        ["NODE 0 BROKEN", "NODE 2 BROKEN"],
        "{}",
        job.show()
    );
    // The survivors exit without finalizing (their collective is pending): mpirun ends the job,
    // the stalled process included, instead of waiting for it.
    assert!(!job.status.success(), "{}", job.show());
    assert!(job.stderr.contains("exiting improperly"), "{}", job.show());
    eprintln!("stall: mpirun ended after {:?}", job.elapsed);
    assert!(job.elapsed < Duration::from_secs(20), "{}", job.show());
}

#[test]
fn a_process_that_never_joins_is_a_timeout_on_the_others() {
    let Some(job) = mpirun(
        "late",
        &[Some(0), Some(1), Some(2)],
        &[(TIMEOUT_ENV, "2")],
        Duration::from_secs(60),
    ) else {
        return;
    };
    assert_eq!(
        job.lines("JOIN"),
        [
            "NODE ? JOIN joining the MPI exchange (identified by SAFELOAD_NODE_ID=0) did not \
             complete within 2s: not every process of the job joined",
            "NODE ? JOIN joining the MPI exchange (identified by SAFELOAD_NODE_ID=2) did not \
             complete within 2s: not every process of the job joined",
        ],
        "{}",
        job.show()
    );
    assert!(!job.status.success(), "{}", job.show());
    assert!(job.elapsed < Duration::from_secs(20), "{}", job.show());
}

#[test]
fn the_first_process_of_each_node_takes_part_and_nodes_follow_their_numbers() {
    // World ranks 0 and 1 on node number 5, rank 2 on 9, rank 3 on 7: indices 0, 0, 2, 1.
    let Some(job) = mpirun(
        "placement",
        &[Some(5), Some(5), Some(9), Some(7)],
        &[],
        Duration::from_secs(60),
    ) else {
        return;
    };
    assert!(job.status.success(), "{}", job.show());
    assert_eq!(
        job.lines("PLACED"),
        [
            "NODE 0 PLACED of 3, local rank 0 of 2, participant, gathered [0, 1, 2]",
            "NODE 0 PLACED of 3, local rank 1 of 2, not participant",
            "NODE 1 PLACED of 3, local rank 0 of 1, participant, gathered [0, 1, 2]",
            "NODE 2 PLACED of 3, local rank 0 of 1, participant, gathered [0, 1, 2]",
        ],
        "{}",
        job.show()
    );
}

#[test]
fn without_node_numbers_the_processes_of_one_machine_are_one_node() {
    let Some(job) = mpirun(
        "placement",
        &[None, None, None],
        &[],
        Duration::from_secs(60),
    ) else {
        return;
    };
    assert!(job.status.success(), "{}", job.show());
    assert_eq!(
        job.lines("PLACED"),
        [
            "NODE 0 PLACED of 1, local rank 0 of 3, participant, gathered [0]",
            "NODE 0 PLACED of 1, local rank 1 of 3, not participant",
            "NODE 0 PLACED of 1, local rank 2 of 3, not participant",
        ],
        "{}",
        job.show()
    );
}

#[test]
fn processes_identified_differently_are_refused_on_every_process() {
    let Some(job) = mpirun(
        "placement",
        &[Some(0), None, None],
        &[],
        Duration::from_secs(60),
    ) else {
        return;
    };
    // An error, not a crash: MPI is finalized and the job ends normally.
    assert!(job.status.success(), "{}", job.show());
    let refused = job.lines("SETUP");
    assert_eq!(refused.len(), 3, "{}", job.show());
    assert!(
        refused.iter().all(|l| l
            .contains("the processes are not identified the same way: world rank")
            && l.contains("set SAFELOAD_NODE_ID in every process or in none")),
        "{}",
        job.show()
    );
}

// --- The children ---

/// The body of every process under `mpirun`: nothing in an ordinary test run.
#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let settings = MpiSettings::from_env().unwrap();
    if role == "late" && settings.identity.encode()[1] == 1 {
        println!("NODE ? LATE");
        std::thread::sleep(Duration::from_secs(600));
    }
    let membership = match MpiExchange::join(&settings) {
        Ok(membership) => membership,
        Err(err) if err.kind() == ExchangeErrorKind::Setup => {
            println!("NODE ? SETUP {err}");
            return;
        }
        Err(err) if err.kind() == ExchangeErrorKind::TimedOut => {
            println!("NODE ? JOIN {err}");
            return;
        }
        Err(err) => panic!("{err}"),
    };
    match role.as_str() {
        "placement" => placement(membership),
        role => {
            let ex = membership
                .exchange
                .expect("one process per node: each takes part");
            match role {
                "gather" => gather(&ex),
                "ranges" => ranges(&ex),
                "corrupt" => corrupt(&ex),
                "abort" | "sigkill" => die_mid_exchange(&ex, role),
                "stall" => stall(&ex),
                _ => panic!("unknown role {role}"),
            }
        }
    }
}

fn say(ex: &dyn Exchange, what: impl std::fmt::Display) {
    println!("NODE {} {what}", ex.node());
}

fn gather(ex: &MpiExchange) {
    let node = ex.node();
    let mine = |node: usize| format!("node {node};").repeat(node + 1).into_bytes();
    let all = ex.all_gather(&mine(node)).unwrap();
    let expected: Vec<Vec<u8>> = (0..ex.nodes()).map(mine).collect();
    assert_eq!(all, expected);
    // An empty contribution among others, and a second call in order after the first.
    let one = if node == 1 { vec![7; 5] } else { Vec::new() };
    let all = ex.all_gather(&one).unwrap();
    assert_eq!(all, [vec![], vec![7; 5], vec![]]);
    say(ex, "OK gather");
}

fn ranges(ex: &MpiExchange) {
    let sizes = [0, 1, 3 << 20, CHUNK + 3];
    for owner in 0..ex.nodes() {
        for (i, &len) in sizes.iter().enumerate() {
            let seed = (owner * 16 + i) as u8;
            let mut buf = if ex.node() == owner {
                pattern(len, seed)
            } else {
                vec![0; len]
            };
            broadcast_checked(ex, owner, &mut buf).unwrap();
            assert!(
                buf == pattern(len, seed),
                "{len} bytes from node {owner} differ"
            );
        }
    }
    say(ex, "OK ranges");
}

fn corrupt(ex: &MpiExchange) {
    let mut buf = if ex.node() == 0 {
        pattern(4096, 3)
    } else {
        vec![0; 4096]
    };
    match broadcast_checked(ex, 0, &mut buf) {
        Ok(()) if ex.node() == 2 => {
            assert_eq!(buf, pattern(4096, 3));
            say(ex, "WHOLE");
        }
        Ok(()) => {}
        Err(err) => {
            assert_eq!(err.kind(), ExchangeErrorKind::Corrupt);
            say(ex, format_args!("CORRUPT {err}"));
        }
    }
    // The exchange goes on: the nodes' order of collectives is intact.
    let all = ex.all_gather(&[ex.node() as u8]).unwrap();
    assert_eq!(all, [[0], [1], [2]]);
    say(ex, "OK after");
}

fn die_mid_exchange(ex: &MpiExchange, how: &str) {
    ex.all_gather(b"ready").unwrap();
    if ex.node() == 1 {
        say(ex, format_args!("DYING {}", epoch().as_millis()));
        if how == "abort" {
            std::process::abort();
        }
        let pid = std::process::id().to_string();
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        std::thread::sleep(Duration::from_secs(600));
    }
    let mut buf = vec![0; 4096];
    let result = broadcast_checked(ex, 1, &mut buf);
    say(ex, format_args!("RETURNED {result:?}"));
}

fn stall(ex: &MpiExchange) {
    ex.all_gather(b"ready").unwrap();
    if ex.node() == 1 {
        say(ex, "STALLING");
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let start = Instant::now();
    let mut buf = vec![0; 4096];
    let err: ExchangeError = broadcast_checked(ex, 1, &mut buf).unwrap_err();
    assert_eq!(err.kind(), ExchangeErrorKind::TimedOut);
    say(
        ex,
        format_args!("TIMEDOUT {} {err}", start.elapsed().as_millis()),
    );
    let again = ex.all_gather(b"again").unwrap_err();
    assert_eq!(again.kind(), ExchangeErrorKind::Broken, "{again}");
    say(ex, "BROKEN");
}

fn placement(membership: MpiMembership) {
    let MpiMembership {
        node,
        nodes,
        local_rank,
        local_ranks,
        exchange,
    } = membership;
    let role = match &exchange {
        Some(ex) => {
            assert_eq!((ex.node(), ex.nodes()), (node, nodes));
            let all = ex.all_gather(&[node as u8]).unwrap();
            let all: Vec<u8> = all.into_iter().flatten().collect();
            format!("participant, gathered {all:?}")
        }
        None => "not participant".to_string(),
    };
    println!("NODE {node} PLACED of {nodes}, local rank {local_rank} of {local_ranks}, {role}");
}
