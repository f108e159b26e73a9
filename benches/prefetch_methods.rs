//! Which prefetch method warms the page cache fastest: large `pread`s into a
//! scratch buffer, or `posix_fadvise(WILLNEED)` per chunk (waiting with
//! `mincore` until the pages land). Measured on a local disk and on the FUSE
//! test filesystem with 2 ms per read, a file evicted before every run, the
//! arms interleaved (their order rotated each round), medians of the rounds.
//!
//! ```text
//! cargo bench --bench prefetch_methods -- [--size-mib 1024] [--rounds 3]
//!     [--streams 4] [--dir /var/tmp] [--latency-ms 2]
//! ```
//!
//! `--dir` defaults to the temporary directory, which is a tmpfs on many
//! systems, where nothing can be evicted: give a directory on the disk.
//!
//! It ends with the cost of prefetch on a warm file (everything already in
//! the page cache) against a warm mapped load that faults every page in.
//!
//! The FUSE arm needs root and /dev/fuse; without them it is skipped. The
//! results go in BENCHMARKS.md ("policy/prefetch.rs: PrefetchMethod" and
//! "prefetch/residency.rs: SAMPLES").

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use safeload::{PrefetchOptions, report::PrefetchMethod};
use safeload_testfs::{Mount, Options, fuse_available};

mod common;

use common::stats::median;
use common::{args, data, random};

/// Which prefetch method warms the page cache fastest (the module docs of
/// benches/prefetch_methods.rs say how).
#[derive(Parser)]
#[command(name = "prefetch_methods")]
struct Args {
    /// The file's size, MiB.
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Prefetch streams, one arm per count.
    #[arg(long, value_delimiter = ',', default_value = "4")]
    streams: Vec<usize>,
    /// Where the file is written (a temporary directory, removed at the end);
    /// a tmpfs cannot evict, so give one on the disk.
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    dir: PathBuf,
    /// The FUSE arm's latency per read, ms.
    #[arg(long, default_value_t = 2)]
    latency_ms: u64,
}

/// A safetensors file of one U8 tensor, `size` bytes in all, written and
/// synced so that eviction can drop it.
fn write_checkpoint(dir: &Path, size: u64) -> PathBuf {
    use std::io::Write;
    let path = dir.join("model.safetensors");
    let mut data_len = size.saturating_sub(128);
    let header = loop {
        let mut header = format!(
            r#"{{"w":{{"dtype":"U8","shape":[{data_len}],"data_offsets":[0,{data_len}]}}}}"#
        );
        while (8 + header.len()) % 8 != 0 {
            header.push(' ');
        }
        let total = 8 + header.len() as u64 + data_len;
        if total == size {
            break header;
        }
        data_len = data_len + size - total;
    };
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&(header.len() as u64).to_le_bytes())
        .unwrap();
    file.write_all(header.as_bytes()).unwrap();
    // 8 MiB of the tensor's bytes, repeated to the file's size: the page
    // cache does not care what they are, and a byte per generator step for
    // the whole file would add seconds to every run.
    let block = random::bytes_for("w", 8 << 20);
    let mut left = data_len;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    file.sync_all().unwrap();
    path
}

fn main() {
    let args: Args = args::parse();
    let source = tempfile::tempdir_in(&args.dir).unwrap();
    let size = args.size_mib << 20;
    let local = write_checkpoint(source.path(), size);
    let fuse = match fuse_available() {
        Ok(()) => Some(
            Mount::new(
                source.path(),
                Options {
                    latency: Some(Duration::from_millis(args.latency_ms)),
                    ..Options::default()
                },
            )
            .unwrap(),
        ),
        Err(why) => {
            eprintln!("FUSE arm skipped: {why}");
            None
        }
    };
    let mut places: Vec<(String, PathBuf)> = vec![("local".into(), local.clone())];
    if let Some(m) = &fuse {
        places.push((
            format!("fuse {} ms", args.latency_ms),
            m.path().join("model.safetensors"),
        ));
    }
    let methods = [PrefetchMethod::Pread, PrefetchMethod::WillNeed];
    let mut arms: Vec<(String, PathBuf, PrefetchMethod, usize)> = Vec::new();
    for (place, path) in &places {
        for &streams in &args.streams {
            for method in methods {
                arms.push((place.clone(), path.clone(), method, streams));
            }
        }
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); arms.len()];
    for round in 0..args.rounds {
        for i in common::rotated(arms.len(), round) {
            let (place, path, method, streams) = &arms[i];
            // Cold: the file on the mount, and the source under it.
            data::evict(&[path, &local]).unwrap();
            let options = PrefetchOptions::new().streams(*streams).method(*method);
            let start = Instant::now();
            let report = one_rank().prefetch_with(options).warm(path).unwrap();
            let secs = start.elapsed().as_secs_f64();
            assert_eq!(report.method, *method);
            assert_eq!(report.resident_before, 0, "cold: {report}");
            let missing = size - report.resident_after.unwrap_or(0);
            println!(
                "round {round}: {place:>10} {method:>8} x{streams}: {secs:.3} s ({:.2} GiB/s), re-read {} B, not resident at the end {missing} B",
                size as f64 / secs / (1u64 << 30) as f64,
                report.reread
            );
            times[i].push(secs);
        }
    }
    // Warm: what prefetch costs when everything is already in the page
    // cache, against a warm mapped load that faults every page in.
    data::evict(&[&local]).unwrap();
    one_rank().warm(&local).unwrap();
    let (mut warm_prefetch, mut warm_load) = (Vec::new(), Vec::new());
    for _ in 0..9 {
        let start = Instant::now();
        let report = one_rank().warm(&local).unwrap();
        warm_prefetch.push(start.elapsed().as_secs_f64());
        assert_eq!(report.warmed, 0, "{report}");
        let start = Instant::now();
        let sd = safeload::Loader::new()
            .disable_mmap(false)
            .populate(true)
            .load(&local)
            .unwrap();
        warm_load.push(start.elapsed().as_secs_f64());
        drop(sd);
    }
    let (p, l) = (median(&warm_prefetch), median(&warm_load));
    println!(
        "warm: prefetch {:.2} ms, mapped load with populate {:.2} ms: prefetch adds {:.1}%",
        p * 1e3,
        l * 1e3,
        100.0 * p / l
    );
    println!(
        "\n| filesystem | method | streams | median s | GiB/s | runs (s) |\n|---|---|---|---|---|---|"
    );
    for (i, (place, _, method, streams)) in arms.iter().enumerate() {
        let m = median(&times[i]);
        let runs: Vec<String> = times[i].iter().map(|t| format!("{t:.2}")).collect();
        println!(
            "| {place} | {method} | {streams} | {m:.3} | {:.2} | {} |",
            size as f64 / m / (1u64 << 30) as f64,
            runs.join(", ")
        );
    }
}

/// A loader that is one process alone, whatever launcher variables are set.
fn one_rank() -> safeload::Loader {
    safeload::Loader::new().local_rank(0, 1)
}
