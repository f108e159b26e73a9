//! Running the built `safeload` binary as a script would, with its stderr on a pipe or on a pseudo-terminal, and writing checkpoints for it in temporary directories.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// The variables that change what a load does; cleared for every run so
/// that the caller's environment cannot change a test's outcome.
const LOAD_VARIABLES: [&str; 12] = [
    "SAFELOAD_DISABLE_MMAP",
    "SAFELOAD_PREFETCH",
    "HF_SHARD_PREFETCH",
    "SAFELOAD_VERIFY",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
];

/// The binary, with a clean environment for a load and a terminal type
/// that draws bars, so that only whether stderr is a terminal decides.
pub fn safeload(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_safeload"));
    command.args(args).stdin(Stdio::null()).env("TERM", "xterm");
    for name in LOAD_VARIABLES {
        command.env_remove(name);
    }
    command
}

/// What a run printed and how it ended.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Runs `command` to the end with stdout and stderr on pipes.
    pub fn piped(mut command: Command) -> Run {
        let Output {
            status,
            stdout,
            stderr,
        } = command.output().expect("run safeload");
        Run {
            code: status.code(),
            stdout: String::from_utf8(stdout).expect("UTF-8 stdout"),
            stderr: String::from_utf8(stderr).expect("UTF-8 stderr"),
        }
    }

    /// The one JSON value stdout holds; fails where it holds anything
    /// else (a second value, text before or after).
    pub fn json(&self) -> serde_json::Value {
        let mut values =
            serde_json::Deserializer::from_str(&self.stdout).into_iter::<serde_json::Value>();
        let first = values
            .next()
            .expect("a JSON value on stdout")
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout));
        assert!(
            values.next().is_none(),
            "more than one value: {}",
            self.stdout
        );
        assert!(first.is_object(), "not an object: {first}");
        first
    }

    /// Panics with the run's output unless it exited with `code`.
    pub fn expect_code(self, code: i32) -> Run {
        assert_eq!(
            self.code,
            Some(code),
            "stdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs `safeload args` to the end as [`Run::piped`].
pub fn run(args: &[&str]) -> Run {
    Run::piped(safeload(args))
}

/// Text that only a drawn progress bar puts on stderr: the rate and the
/// bar's frame.
pub fn has_bar(stderr: &str) -> bool {
    stderr.contains("GiB/s") || (stderr.contains("] ") && stderr.contains("MiB/"))
}

/// A sharded checkpoint written with the `safetensors` crate: `shards`
/// files of `per_shard` tensors each (several dtypes and shapes, a
/// scalar), file metadata on the first, and an index with metadata.
/// Returns the index's path.
pub fn write_sharded(dir: &Path, shards: usize, per_shard: usize) -> PathBuf {
    let kinds: [(Dtype, &[usize]); 4] = [
        (Dtype::BF16, &[64, 32]),
        (Dtype::F32, &[128]),
        (Dtype::I64, &[]),
        (Dtype::U8, &[3, 5, 7]),
    ];
    let mut weight_map = serde_json::Map::new();
    let mut total = 0;
    for shard in 0..shards {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", shard + 1);
        let tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = (0..per_shard)
            .map(|i| {
                let (dtype, shape) = kinds[(shard + i) % kinds.len()];
                let n: usize = shape.iter().product();
                let bytes = vec![(shard * 16 + i) as u8; n * dtype.bitsize() / 8];
                (format!("layers.{shard}.t{i}"), dtype, shape.to_vec(), bytes)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                total += bytes.len();
                weight_map.insert(name.clone(), file.clone().into());
                (
                    name.clone(),
                    TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
                )
            })
            .collect();
        let metadata = (shard == 0).then(|| {
            HashMap::from([
                ("format".to_string(), "pt".to_string()),
                ("written_by".to_string(), "cli tests".to_string()),
            ])
        });
        safetensors::serialize_to_file(views, metadata, &dir.join(&file)).unwrap();
    }
    let index = dir.join("model.safetensors.index.json");
    let body = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    std::fs::write(&index, serde_json::to_vec_pretty(&body).unwrap()).unwrap();
    index
}

/// Running the binary with its stderr on a pseudo-terminal, as a person
/// at a terminal would (stdout stays a pipe, as in `safeload ... | less`).
#[cfg(unix)]
pub mod pty {
    use std::fs::File;
    use std::io::Read;
    use std::process::{Command, Stdio};

    use rustix::fs::{Mode, OFlags};
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    use rustix::termios::{Winsize, tcsetwinsize};

    use super::Run;

    /// Runs `command` to the end with stderr on the terminal side of a new
    /// pseudo-terminal of 24 rows and 80 columns; `Run::stderr` is what the
    /// terminal received (newlines as `\r\n`, escape codes kept).
    pub fn run_on_terminal(mut command: Command) -> Run {
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .expect("posix_openpt");
        grantpt(&master).expect("grantpt");
        unlockpt(&master).expect("unlockpt");
        // A real terminal's size; a pty starts at 0x0, which a bar would
        // have to guess around.
        tcsetwinsize(
            &master,
            Winsize {
                ws_row: 24,
                ws_col: 80,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .expect("TIOCSWINSZ");
        let name = ptsname(&master, Vec::new()).expect("ptsname");
        // NOCTTY: the test process must not take the terminal as its own.
        let terminal = rustix::fs::open(
            name.as_c_str(),
            OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open the terminal side");

        // Read as the child writes, so that it never blocks on a full
        // terminal buffer; the read ends (EIO) when the last holder of the
        // terminal side, the child, exits.
        let mut master = File::from(master);
        let reader = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let _ = master.read_to_end(&mut seen);
            String::from_utf8_lossy(&seen).into_owned()
        });
        command.stderr(Stdio::from(File::from(terminal)));
        let child = command.stdout(Stdio::piped()).spawn().expect("spawn");
        // The command holds our copy of the terminal side: drop it, or the
        // reader would never see the end.
        drop(command);
        let output = child.wait_with_output().expect("wait");
        Run {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
            stderr: reader.join().expect("reader"),
        }
    }
}
