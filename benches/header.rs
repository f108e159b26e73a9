//! `cargo bench --bench header`: a very large header (1.35 M tensors, about
//! 95 MB of JSON, the size of a big mixture-of-experts checkpoint's), parsed
//! by the `safetensors` crate and opened and loaded by safeload.
//!
//! Arms, each its own process, interleaved and rotated each round, the file
//! in the page cache (the cost measured is the parse, not the disk):
//!
//! - `safetensors`: `std::fs::read` of the file and `SafeTensors::deserialize`,
//!   the reference parser and the bound of the target (within 1.2x);
//! - `safeload-open`: `Checkpoint::open`, the header alone;
//! - `safeload-load`: `load_state_dict(path, None)`, header and tensors.
//!
//! Each child prints its time and its peak resident memory (`VmHWM`).
//!
//! ```text
//! cargo bench --bench header -- [--runs 5] [--dir bench-data] [--tensors 1350000]
//! ```

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;

mod common;

use common::child::{self, Child, Job};
use common::stats::{Spread, median};
use common::{args, proc};

const ARMS: [&str; 3] = ["safetensors", "safeload-open", "safeload-load"];

/// A very large header parsed by the `safetensors` crate and by safeload
/// (the module docs of benches/header.rs say how).
#[derive(Parser)]
#[command(name = "header")]
struct Options {
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Where the file is written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
    /// Tensors in the header.
    #[arg(long, default_value_t = 1_350_000)]
    tensors: usize,
}

/// What a child prints: its time and its peak RSS (`VmHWM`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    seconds: f64,
    peak_mib: f64,
}

fn main() {
    if let Some(job) = Job::from_env() {
        return run_arm(&job.arm, &job.path);
    }
    let Options { runs, dir, tensors } = args::parse();
    let path = write_file(&dir.join(format!("header-{tensors}")), tensors);
    let header_mb = header_len(&path) as f64 / 1e6;
    println!(
        "{tensors} tensors, header {header_mb:.1} MB; {runs} runs, arms interleaved, each its own process, warm"
    );
    // Read the file once so every arm finds it in the page cache.
    std::fs::read(&path).unwrap();
    let mut samples: Vec<Vec<Figures>> = ARMS.iter().map(|_| Vec::new()).collect();
    for round in 0..runs {
        for i in common::rotated(ARMS.len(), round) {
            let arm = ARMS[i];
            let f: Figures = Child::new(arm, &path)
                .run()
                .unwrap_or_else(|e| panic!("{arm}: {e}"))
                .figures;
            eprintln!(
                "  round {round} {arm:<14} {:.3} s  {:.0} MiB peak RSS",
                f.seconds, f.peak_mib
            );
            samples[i].push(f);
        }
    }
    let seconds = |s: &[Figures]| s.iter().map(|f| f.seconds).collect::<Vec<_>>();
    let reference = median(&seconds(&samples[0]));
    let mut table = String::from(
        "| arm | time, median (min-max) | peak RSS, median | time / safetensors |\n|---|---|---|---|\n",
    );
    for (arm, arm_samples) in ARMS.iter().zip(&samples) {
        let time = Spread::of(&seconds(arm_samples)).unit(" s");
        let rss = median(&arm_samples.iter().map(|f| f.peak_mib).collect::<Vec<_>>());
        writeln!(
            table,
            "| {arm} | {time:.2} | {rss:.0} MiB | {:.2}x |",
            time.median / reference
        )
        .unwrap();
    }
    print!("{table}");
}

/// One arm, timed, in this process (a child).
fn run_arm(arm: &str, path: &Path) {
    let t = Instant::now();
    let count = match arm {
        "safetensors" => {
            let bytes = std::fs::read(path).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            st.len()
        }
        "safeload-open" => safeload::Checkpoint::open(path).unwrap().len(),
        "safeload-load" => safeload::load_state_dict(path, None).unwrap().len(),
        other => panic!("unknown arm {other}"),
    };
    let seconds = t.elapsed().as_secs_f64();
    assert!(count > 0);
    child::report(&Figures {
        seconds,
        peak_mib: proc::status_mib("VmHWM:"),
    });
}

/// A file of `tensors` scalar F32 tensors; written once and reused.
fn write_file(dir: &Path, tensors: usize) -> PathBuf {
    let path = dir.join("model.safetensors");
    if path.exists() {
        return path;
    }
    std::fs::create_dir_all(dir).unwrap();
    let mut json = String::with_capacity(tensors * 100);
    json.push_str(r#"{"__metadata__":{"format":"pt"}"#);
    for i in 0..tensors {
        // Short names keep 1.35 M entries under the 100 MB header limit.
        let start = i * 4;
        write!(
            json,
            r#","w{i}":{{"dtype":"F32","shape":[],"data_offsets":[{start},{}]}}"#,
            start + 4
        )
        .unwrap();
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    assert!(
        json.len() as u64 <= safeload::MAX_HEADER_LEN,
        "{} bytes of header: fewer tensors",
        json.len()
    );
    let tmp = dir.join("model.safetensors.tmp");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
    file.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
    file.write_all(json.as_bytes()).unwrap();
    let data: Vec<u8> = (0..tensors)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    file.write_all(&data).unwrap();
    file.into_inner().unwrap().sync_all().unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

fn header_len(path: &Path) -> u64 {
    use std::io::Read;
    let mut prefix = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact(&mut prefix)
        .unwrap();
    u64::from_le_bytes(prefix)
}
