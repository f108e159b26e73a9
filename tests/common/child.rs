//! Child processes: the running test binary started again to run its test
//! named `child` alone, told what to do by environment variables, with the
//! job launchers' variables cleared so that only what a test sets is seen.
//!
//! A test binary that uses this has a `#[test] fn child()` that calls
//! `run_role` with the roles it knows.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

/// Set in a child process: what it is to do.
pub const ROLE: &str = "SAFELOAD_TEST_PREFETCH_ROLE";
/// Set in a child process: the checkpoint it works on.
pub const PATH: &str = "SAFELOAD_TEST_PREFETCH_PATH";

/// The variables of torchrun, Slurm, Open MPI and MPICH (Hydra) that tell a process
/// its local rank, and safeload's own prefetch switch: removed from every
/// child's environment.
pub const LAUNCHER_VARS: [&str; 16] = [
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
    "SLURM_STEP_ID",
    "SLURM_STEPID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
    "SAFELOAD_PREFETCH",
];

/// This test binary, to run `child` with `ROLE` = `role` and `PATH` = `path`,
/// its stdout piped.
pub fn child_command(role: &str, path: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env_remove("HF_SHARD_PREFETCH")
        .stdout(Stdio::piped());
    for var in LAUNCHER_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// The body of a binary's `child` test: nothing unless `ROLE` is set (an
/// ordinary test run), else the function of that role from `roles`.
pub fn run_role(roles: &[(&str, fn())]) {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match roles.iter().find(|(name, _)| *name == role) {
        Some((_, act)) => act(),
        None => panic!("unknown role {role}"),
    }
}

/// A child held at its start until the parent lets it go, so that the parent
/// can first move it into a cgroup or set a limit on it.
pub struct Held {
    pub child: Child,
    /// The child's stdout, past its `READY` line.
    pub out: BufReader<ChildStdout>,
}

/// Starts `command` (from [`child_command`]) with stdin piped and returns
/// once the child has said `READY` (see [`wait_for_go`]).
pub fn spawn_held(mut command: Command) -> Held {
    let mut child = command.stdin(Stdio::piped()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    // The test harness may print the test's name before it on the line.
    while !line.contains("READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
    }
    Held { child, out }
}

impl Held {
    /// Lets the child go on.
    pub fn go(&mut self) {
        writeln!(self.child.stdin.take().unwrap(), "go").unwrap();
    }
}

/// The child's side of [`spawn_held`]: says `READY` and waits for the
/// parent's word.
pub fn wait_for_go() {
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
}
