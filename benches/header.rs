//! `cargo bench --bench header`: a very large header (1.35 M tensors, about
//! 95 MB of JSON, the size of a big mixture-of-experts checkpoint's), parsed
//! by the `safetensors` crate and opened and loaded by safeload.
//!
//! Arms, each its own process, interleaved, the file in the page cache (the
//! cost measured is the parse, not the disk):
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

#[path = "common/child.rs"]
mod child;

const ARMS: [&str; 3] = ["safetensors", "safeload-open", "safeload-load"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if child::as_child(&args, run_arm) {
        return;
    }
    let (runs, dir) = child::runs_and_dir(&args, 5);
    let tensors: usize = child::value(&args, "--tensors").unwrap_or(1_350_000);
    let path = write_file(&dir.join(format!("header-{tensors}")), tensors);
    let header_mb = header_len(&path) as f64 / 1e6;
    println!(
        "{} tensors, header {header_mb:.1} MB; {runs} runs, arms interleaved, each its own process, warm",
        tensors
    );
    // Read the file once so every arm finds it in the page cache.
    std::fs::read(&path).unwrap();
    let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ARMS.len()];
    for round in 0..runs {
        for (i, arm) in ARMS.iter().enumerate() {
            let v = child::run_child("--child", Some(arm), &path);
            let (secs, rss_mib) = (v[0], v[1]);
            eprintln!("  round {round} {arm:<14} {secs:.3} s  {rss_mib:.0} MiB peak RSS");
            samples[i].push((secs, rss_mib));
        }
    }
    let reference = child::median(samples[0].iter().map(|s| s.0).collect()).0;
    let mut table = String::from(
        "| arm | time, median (min-max) | peak RSS, median | time / safetensors |\n|---|---|---|---|\n",
    );
    for (arm, arm_samples) in ARMS.iter().zip(&samples) {
        let (m, lo, hi) = child::median(arm_samples.iter().map(|s| s.0).collect());
        let (rss, _, _) = child::median(arm_samples.iter().map(|s| s.1).collect());
        writeln!(
            table,
            "| {arm} | {m:.2} s ({lo:.2}-{hi:.2}) | {rss:.0} MiB | {:.2}x |",
            m / reference
        )
        .unwrap();
    }
    print!("{table}");
}

/// One arm, timed, in this process.
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
    let secs = t.elapsed().as_secs_f64();
    assert!(count > 0);
    println!("{secs} {}", child::status_mib("VmHWM:"));
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
