//! What the benchmarks that time each arm in a child process of their own
//! share: their two options, running a child, medians, and a process's own
//! memory figures.

// Each benchmark uses part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// `--runs N` and `--dir D` from the arguments (others are left to the
/// caller), with the defaults given.
pub fn runs_and_dir(args: &[String], runs: usize) -> (usize, PathBuf) {
    let runs = value(args, "--runs").unwrap_or(runs);
    let dir = value(args, "--dir").unwrap_or_else(|| PathBuf::from("bench-data"));
    (runs, dir)
}

/// The value after `name`, parsed; `None` if absent or unparsable.
pub fn value<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

/// Runs this benchmark's own binary as `exe <flag> [arm] <path>` and returns
/// the numbers it printed on stdout; panics, with its stderr, if it failed.
pub fn run_child(flag: &str, arm: Option<&str>, path: &Path) -> Vec<f64> {
    let exe = std::env::current_exe().unwrap();
    let mut command = Command::new(exe);
    command.arg(flag).args(arm).arg(path);
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{flag} {arm:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect()
}

/// (median, min, max).
pub fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// A memory figure of this process from `/proc/self/status` (`"VmHWM:"`,
/// `"RssAnon:"`, ...), in MiB.
pub fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

/// Where this process is a child started by [`run_child`] with `--child`,
/// runs `arm(name, path)` and returns true; otherwise returns false.
pub fn as_child(args: &[String], arm: impl FnOnce(&str, &Path)) -> bool {
    match (args.get(1).map(String::as_str), args.get(2), args.get(3)) {
        (Some("--child"), Some(name), Some(path)) => {
            arm(name, Path::new(path));
            true
        }
        _ => false,
    }
}
