//! Each arm in a process of its own, so that no arm inherits another's page
//! tables, heap or peak RSS: the parent starts this benchmark's own binary
//! again as `--child ARM PATH [EXTRA..]`, and the child runs the arm and
//! prints its figures as one line of JSON, the last of its stdout.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
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
