//! Each arm in a process of its own, so that no arm inherits another's page
//! tables, heap or peak RSS: the parent starts this benchmark's own binary
//! again as `--child ARM PATH [EXTRA..]`, and the child runs the arm and
//! prints its figures as one line of JSON, the last of its stdout.
//!
//! Children that must start together (the local ranks of one job) are
//! [`Held`]: each says it has reached a stage ([`hold`]) and waits for the
//! parent's word on its stdin, so that the parent can start them all at
//! once, and have them keep what they loaded until every one has loaded.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;

const FLAG: &str = "--child";

/// What a child was started to do.
pub struct Job {
    pub arm: String,
    pub path: PathBuf,
    /// The arguments after the path, as the parent gave them.
    pub extra: Vec<String>,
}

impl Job {
    /// The job, where this process was started as a child; `None` in the
    /// parent.
    pub fn from_env() -> Option<Job> {
        let mut args = std::env::args().skip(1);
        if args.next().as_deref() != Some(FLAG) {
            return None;
        }
        let (Some(arm), Some(path)) = (args.next(), args.next()) else {
            eprintln!("usage: {FLAG} ARM PATH [EXTRA..]");
            std::process::exit(2);
        };
        Some(Job {
            arm,
            path: path.into(),
            extra: args.collect(),
        })
    }

    /// The `i`th extra argument, parsed; exits with a message if it is
    /// missing or unparsable (the parent always passes it).
    pub fn extra<T: std::str::FromStr>(&self, i: usize) -> T {
        self.extra
            .get(i)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                eprintln!("{FLAG} {}: extra argument {i} missing or invalid", self.arm);
                std::process::exit(2);
            })
    }
}

/// The child's side: prints `figures` for the parent.
pub fn report(figures: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string(figures).expect("figures serialize")
    );
}

/// The child's side of a [`Held`] child: says it has reached `stage` (a line
/// `@stage` on stdout) and waits for the parent's word (a line on stdin).
/// Exits if the parent is gone (stdin closed), so that no child outlives a
/// parent that failed.
pub fn hold(stage: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "@{stage}");
    let _ = out.flush();
    drop(out);
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(n) if n > 0 => {}
        _ => std::process::exit(4),
    }
}

/// The parent's side: a child to run one arm.
pub struct Child {
    command: Command,
    timeout: Option<Duration>,
}

/// What a child that ran to the end printed.
pub struct Output<T> {
    pub figures: T,
    /// Its stderr, for what an arm says beside its figures.
    pub stderr: String,
}

impl Child {
    /// This benchmark's binary as `--child arm path`.
    pub fn new(arm: &str, path: &Path) -> Child {
        let exe = std::env::current_exe().expect("the benchmark's own path");
        Child::with_exe(&exe, arm, path)
    }

    /// Another build of this benchmark (an earlier commit's) as `--child
    /// arm path`.
    pub fn with_exe(exe: &Path, arm: &str, path: &Path) -> Child {
        let mut command = Command::new(exe);
        command.arg(FLAG).arg(arm).arg(path);
        Child {
            command,
            timeout: None,
        }
    }

    /// One more argument, after the path.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Child {
        self.command.arg(arg);
        self
    }

    /// An environment variable set for the child.
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Child {
        self.command.env(key, value);
        self
    }

    /// Environment variables of the parent's that the child must not see.
    pub fn env_remove(mut self, keys: &[&str]) -> Child {
        for key in keys {
            self.command.env_remove(key);
        }
        self
    }

    /// Kills the child after `timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Child {
        self.timeout = Some(timeout);
        self
    }

    /// Runs the child to the end and reads its figures. An error says what
    /// went wrong: the child could not start, timed out, failed, or printed
    /// no figures (then with its stderr).
    pub fn run<T: DeserializeOwned>(mut self) -> Result<Output<T>, String> {
        let mut child = self
            .command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the child: {e}"))?;
        // Drained while the child runs, so that it never blocks on a full pipe.
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut text = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut text);
                }
                String::from_utf8_lossy(&text).into_owned()
            })
        };
        let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
        let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
        let status = wait(&mut child, self.timeout)?;
        let stdout = stdout.join().unwrap_or_default();
        let stderr = stderr.join().unwrap_or_default();
        let figures = stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok());
        match figures {
            Some(figures) if status.success() => Ok(Output { figures, stderr }),
            _ => Err(format!("no result (status {status}): {}", stderr.trim())),
        }
    }
}

/// A child started with [`Child::start_held`]: it runs until it reaches a
/// stage ([`hold`] in the child), then waits for [`Held::resume`]. Killed
/// if dropped before [`Held::finish`].
pub struct Held {
    child: std::process::Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr: Option<JoinHandle<String>>,
    deadline: Instant,
}

impl Child {
    /// Starts the child, its stdin and stdout piped, to be driven stage by
    /// stage; the timeout (10 minutes if none was set) counts from now.
    pub fn start_held(mut self) -> Result<Held, String> {
        let mut child = self
            .command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the child: {e}"))?;
        let stdout = child.stdout.take().expect("piped");
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = stderr.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        });
        Ok(Held {
            stdin: child.stdin.take(),
            child,
            lines,
            stderr: Some(stderr),
            deadline: Instant::now() + self.timeout.unwrap_or(Duration::from_secs(600)),
        })
    }
}

impl Held {
    /// Its process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the child reaches `stage`; returns the lines it printed
    /// before. An error if it ends first (with its stderr) or times out.
    pub fn until(&mut self, stage: &str) -> Result<Vec<String>, String> {
        let marker = format!("@{stage}");
        let mut before = Vec::new();
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line == marker => return Ok(before),
                Ok(line) => before.push(line),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return Err(format!("timed out before {stage}"));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map_err(|e| e.to_string())?;
                    let stderr = self.stderr_text();
                    return Err(format!(
                        "ended before {stage} (status {status}): {}",
                        stderr.trim()
                    ));
                }
            }
        }
    }

    /// Lets a child waiting at a stage go on.
    pub fn resume(&mut self) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin closed")?;
        writeln!(stdin, "go")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("resuming the child: {e}"))
    }

    /// Lets it go on and waits for its end; returns its stderr. An error if
    /// it fails or times out.
    pub fn finish(mut self) -> Result<String, String> {
        let _ = self.resume();
        self.stdin = None;
        let left = self.deadline.saturating_duration_since(Instant::now());
        let status = wait(&mut self.child, Some(left))?;
        let stderr = self.stderr_text();
        if status.success() {
            Ok(stderr)
        } else {
            Err(format!("status {status}: {}", stderr.trim()))
        }
    }

    fn stderr_text(&mut self) -> String {
        self.stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits for `child`, killing it after `timeout`.
fn wait(child: &mut std::process::Child, timeout: Option<Duration>) -> Result<ExitStatus, String> {
    let Some(timeout) = timeout else {
        return child.wait().map_err(|e| e.to_string());
    };
    let start = Instant::now();
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => return Ok(status),
            None if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {} s", timeout.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
