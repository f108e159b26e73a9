//! Child processes: the running test binary started again to run one
//! module's test named `child` alone, told what to do by environment
//! variables, with the job launchers' variables cleared so that only what a
//! test sets is seen.
//!
//! A module that uses this has a `#[test] fn child()` that calls `run_role`
//! with the roles it knows, and passes its `module_path!()` to
//! `child_command`: the child runs that module's `child` and no other, so
//! two modules may use the same role names.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

/// Set in a child process: what it is to do.
pub const ROLE: &str = "SAFELOAD_TEST_PREFETCH_ROLE";
/// Set in a child process: the checkpoint it works on.
pub const PATH: &str = "SAFELOAD_TEST_PREFETCH_PATH";

/// The variables of torchrun, Slurm, Open MPI and MPICH (Hydra) that tell a process
/// its local rank and its job, and safeload's own prefetch switch and job id: removed
/// from every child's environment.
pub const LAUNCHER_VARS: [&str; 17] = [
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
    "SAFELOAD_JOB_ID",
];

/// This test binary, to run the `child` test of `module` (the caller's
/// `module_path!()`) with `ROLE` = `role` and `PATH` = `path`, its stdout
/// piped.
pub fn child_command(module: &str, role: &str, path: &Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    let test = child_test(module);
    cmd.args(["--exact", &test, "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .env(PATH, path)
        .env_remove("HF_SHARD_PREFETCH")
        .stdout(Stdio::piped());
    for var in LAUNCHER_VARS {
        cmd.env_remove(var);
    }
    cmd
}

/// The name the test harness gives the `child` test of `module`, a
/// `module_path!()`: the path without the crate's name (`it::limits` has
/// `limits::child`).
fn child_test(module: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::child"),
        None => "child".to_string(),
    }
}

/// The body of a module's `child` test: nothing unless `ROLE` is set (an
/// ordinary test run), else the function of that role from `roles`, then a
/// `CHILD-DONE <role>` line (see [`run_alone`]).
pub fn run_role(roles: &[(&str, fn())]) {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match roles.iter().find(|(name, _)| *name == role) {
        Some((_, act)) => act(),
        None => panic!("unknown role {role}"),
    }
    println!("CHILD-DONE {role}");
}

/// Runs `role` of `module`'s `child` in a child process of its own, for a
/// test that changes or measures what the whole process shares (its
/// environment, its allocations) and so cannot run beside other tests; fails
/// unless the role ran to its end. Its stderr is the test's.
pub fn run_alone(module: &str, role: &str) {
    let out = child_command(module, role, Path::new(""))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("CHILD-DONE {role}\n")),
        "{} in a child: {} (its stderr is above)\n{stdout}",
        child_test(module),
        out.status
    );
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
