//! Reads that come back short or interrupted, as network filesystem clients
//! and signal-heavy processes give them, on a local disk: an `LD_PRELOAD`
//! shim of the test's own (C, built here with the system's `cc`) over
//! `pread`/`pread64` answers at most half of every request and fails every
//! third call with `EINTR`. Loads under it, in every read mode with direct
//! I/O on and off, must give the bytes of a plain read, and a direct load
//! that cannot go on in whole blocks must say it dropped direct I/O.
//!
//! The shim changes every `pread` of the process it is preloaded in, so the
//! loads run in a child process (this binary again, `child` below) and the
//! parent compares what the child printed with its own plain read.

use safeload::report::DirectIo;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use crate::common::child::{PATH, child_command, run_role};
use crate::common::*;
use safeload::{Dtype, Loader, report::Strategy};
use tempfile::tempdir;

/// The shim. `SAFELOAD_SHIM_MODE=halve` (the default) passes half of each
/// request's length to the real call (under `O_DIRECT` a half below the
/// device's block is refused with `EINVAL`, as a client whose reads split
/// unevenly would be); `pieces` reads at most 4 KiB of the request and
/// reports at most half of it, never more than 1000 bytes (never a whole
/// block, not even of a 512-byte device). Every third
/// call fails with `EINTR` before reading. At exit it writes its counts
/// (calls, shortened, interrupted) to `SAFELOAD_SHIM_LOG`.
const SHIM_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*pread_fn)(int, void *, size_t, off_t);
static atomic_ulong calls, shortened, interrupted;

static ssize_t shim(const char *name, int fd, void *buf, size_t count, off_t offset) {
    pread_fn real = (pread_fn)dlsym(RTLD_NEXT, name);
    if (!real) { errno = ENOSYS; return -1; }
    unsigned long n = atomic_fetch_add(&calls, 1) + 1;
    if (n % 3 == 0) {
        atomic_fetch_add(&interrupted, 1);
        errno = EINTR;
        return -1;
    }
    if (count < 2) return real(fd, buf, count, offset);
    const char *mode = getenv("SAFELOAD_SHIM_MODE");
    atomic_fetch_add(&shortened, 1);
    if (mode && strcmp(mode, "pieces") == 0) {
        ssize_t got = real(fd, buf, count < 4096 ? count : 4096, offset);
        size_t most = count / 2 < 1000 ? count / 2 : 1000;
        return got > (ssize_t)most ? (ssize_t)most : got;
    }
    return real(fd, buf, count / 2, offset);
}

ssize_t pread(int fd, void *buf, size_t count, off_t offset) {
    return shim("pread", fd, buf, count, offset);
}

ssize_t pread64(int fd, void *buf, size_t count, off_t offset) {
    return shim("pread64", fd, buf, count, offset);
}

__attribute__((destructor)) static void report(void) {
    const char *path = getenv("SAFELOAD_SHIM_LOG");
    if (!path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "%lu %lu %lu\n", (unsigned long)calls, (unsigned long)shortened,
            (unsigned long)interrupted);
    fclose(f);
}
"#;

/// Builds the shim into `dir` with the C compiler that links Rust programs
/// here (always present where this binary was built).
fn build_shim(dir: &Path) -> PathBuf {
    let source = dir.join("shim.c");
    let library = dir.join("libshim.so");
    std::fs::write(&source, SHIM_C).unwrap();
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .arg("-ldl")
        .output()
        .expect("the C compiler `cc`");
    assert!(
        out.status.success(),
        "building the shim failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    library
}

/// The modes a load is tried in under the shim: direct I/O on and off,
/// mapped, and auto.
fn modes() -> Vec<(&'static str, Loader)> {
    let mut modes = read_modes();
    modes.push(("auto", Loader::new()));
    modes
}

/// A digest of tensors (name, dtype, shape, bytes), sorted by name.
fn digest(specs: &[Spec]) -> String {
    let mut sha = Sha256::new();
    for s in specs {
        sha.update(s.name.as_bytes());
        sha.update(format!("{:?}{:?}", s.dtype, s.shape).as_bytes());
        sha.update((s.data.len() as u64).to_le_bytes());
        sha.update(&s.data);
    }
    sha.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// The child's side: loads `PATH` in every mode and prints, per mode, a
/// line `MODE <name> <digest> <seconds> <files read with direct I/O
/// throughout> <files with direct I/O dropped>`.
fn load_every_mode() {
    let path = PathBuf::from(std::env::var(PATH).unwrap());
    for (name, loader) in modes() {
        let started = std::time::Instant::now();
        let sd = match loader.load(&path) {
            Ok(sd) => sd,
            Err(e) => panic!("{name}: {e}"),
        };
        let seconds = started.elapsed().as_secs_f64();
        let direct = sd
            .report()
            .files
            .iter()
            .filter(|f| f.direct_io == DirectIo::On)
            .count();
        let dropped = sd
            .report()
            .files
            .iter()
            .filter(|f| matches!(f.direct_io, DirectIo::Dropped { .. }))
            .count();
        if name == "mmap" {
            assert!(
                sd.report()
                    .files
                    .iter()
                    .all(|f| f.strategy == Strategy::Mmap),
                "{}",
                sd.report()
            );
        }
        println!(
            "MODE {name} {} {seconds:.3} {direct} {dropped}",
            digest(&loaded(&sd))
        );
    }
}

#[test]
fn child() {
    run_role(&[("load", load_every_mode)]);
}

/// What the child printed for one mode.
#[derive(Debug)]
struct Outcome {
    digest: String,
    seconds: f64,
    direct: usize,
    dropped: usize,
}

/// Loads `checkpoint` in every mode in a child under the shim in `mode`;
/// the outcome per read mode, and the shim's counts.
fn load_under_shim(
    shim: &Path,
    mode: &str,
    checkpoint: &Path,
) -> (Vec<(String, Outcome)>, [u64; 3]) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let out = child_command(module_path!(), "load", checkpoint)
        .env("LD_PRELOAD", shim)
        .env("SAFELOAD_SHIM_MODE", mode)
        .env("SAFELOAD_SHIM_LOG", log.path())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE load\n"),
        "the child under the {mode} shim: {} (its stderr is above)\n{stdout}",
        out.status
    );
    let outcomes = stdout
        .lines()
        .filter_map(|line| line.split_once("MODE ").map(|(_, rest)| rest))
        .map(|rest| {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            let outcome = Outcome {
                digest: fields[1].to_string(),
                seconds: fields[2].parse().unwrap(),
                direct: fields[3].parse().unwrap(),
                dropped: fields[4].parse().unwrap(),
            };
            (fields[0].to_string(), outcome)
        })
        .collect();
    let counts: Vec<u64> = std::fs::read_to_string(log.path())
        .unwrap()
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    (outcomes, [counts[0], counts[1], counts[2]])
}

/// Set to a checkpoint's path: the test loads it instead of its own.
const CHECKPOINT: &str = "SAFELOAD_SHORT_READS_CHECKPOINT";
/// Set to a comma-separated list of the shim's modes (`halve`, `pieces`):
/// only those are tried.
const SHIM_MODES: &str = "SAFELOAD_SHORT_READS_SHIM_MODES";

fn specs() -> Vec<Spec> {
    vec![
        // Several MiB, so that reads are split into chunks and a direct
        // read's halves stay whole blocks for a while before they are not.
        spec("big", Dtype::F32, &[1024, 1536]),
        spec("mid", Dtype::BF16, &[3, 1000]),
        spec("odd", Dtype::U8, &[4097]),
        spec("small", Dtype::I16, &[17]),
    ]
}

#[test]
fn loads_under_halved_and_interrupted_reads_give_the_plain_bytes() {
    let dir = tempdir().unwrap();
    let shim = build_shim(dir.path());
    // A checkpoint of the caller's instead of the small one written here
    // (the figures of a large load under the shim, run in release).
    let data = match std::env::var_os(CHECKPOINT) {
        Some(path) => PathBuf::from(path),
        None => {
            let data = dir.path().join("ckpt");
            std::fs::create_dir(&data).unwrap();
            write_sharded(&data, &specs(), 3);
            data
        }
    };
    let files = shards_of(&data).len();
    let plain = digest(&naive_load(&shards_of(&data)));
    eprintln!("plain read: {plain}");
    let shim_modes = match std::env::var(SHIM_MODES) {
        Ok(modes) => modes.split(',').map(str::to_string).collect(),
        Err(_) => vec!["halve".to_string(), "pieces".to_string()],
    };
    for shim_mode in shim_modes.iter().map(String::as_str) {
        let (outcomes, [calls, shortened, interrupted]) = load_under_shim(&shim, shim_mode, &data);
        // The shim was in the way of the child's reads.
        assert!(
            calls > 0 && shortened > 0 && interrupted > 0,
            "{shim_mode}: {calls} {shortened} {interrupted}"
        );
        let names: Vec<&str> = outcomes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["mmap", "buffered", "buffered-direct", "auto"]);
        for (name, outcome) in &outcomes {
            eprintln!(
                "{shim_mode} shim, {name}: {:.3} s, {}, direct {} dropped {}",
                outcome.seconds, outcome.digest, outcome.direct, outcome.dropped
            );
            assert_eq!(outcome.digest, plain, "{shim_mode}, {name}");
            match (name.as_str(), shim_mode) {
                // Halves of whole blocks are whole blocks until they are
                // below one: a file's reads go on direct, each short one
                // taken up again from its last whole block, or, where a
                // one-block read keeps coming back in halves, give direct
                // I/O up and say so. Either way every file says which.
                ("buffered-direct", "halve") => {
                    assert_eq!(outcome.direct + outcome.dropped, files, "{name}");
                }
                // Never a whole block: direct I/O is given up, and said.
                ("buffered-direct", _) => {
                    assert_eq!((outcome.direct, outcome.dropped), (0, files), "{name}");
                }
                _ => assert_eq!((outcome.direct, outcome.dropped), (0, 0), "{name}"),
            }
        }
    }
}
