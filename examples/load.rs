//! Loads a checkpoint and prints how each file was read.
//!
//! ```text
//! cargo run --release --example load                       # a demo checkpoint, written first
//! cargo run --release --example load -- PATH [--disable-mmap | --mmap] [--threads N] [--io N] [--chunk-mib N]
//! ```
//!
//! The report as JSON is the CLI's: `safeload load PATH --json`.
//!
//! With no PATH it writes a small sharded demo checkpoint (several dtypes,
//! three shards; `examples/common/demo.rs`, with the `safetensors` crate) to a
//! temporary directory and loads that.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use safeload::Loader;

/// The demo checkpoint, written with the `safetensors` crate.
#[path = "common/demo.rs"]
mod demo;

struct Args {
    path: Option<PathBuf>,
    disable_mmap: Option<bool>,
    threads: Option<usize>,
    io: Option<usize>,
    chunk_mib: Option<usize>,
}

const USAGE: &str =
    "usage: load [PATH] [--disable-mmap | --mmap] [--threads N] [--io N] [--chunk-mib N]";

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        path: None,
        disable_mmap: None,
        threads: None,
        io: None,
        chunk_mib: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = |flag: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{flag} needs a number\n{USAGE}"))
        };
        match arg.as_str() {
            "--disable-mmap" => args.disable_mmap = Some(true),
            "--mmap" => args.disable_mmap = Some(false),
            "--threads" => args.threads = Some(number("--threads")?),
            "--io" => args.io = Some(number("--io")?),
            "--chunk-mib" => args.chunk_mib = Some(number("--chunk-mib")?),
            "-h" | "--help" => return Err(USAGE.to_string()),
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}\n{USAGE}")),
            path if args.path.is_none() => args.path = Some(PathBuf::from(path)),
            extra => return Err(format!("unexpected argument {extra}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let demo = tempfile::tempdir()?;
    let path = match &args.path {
        Some(path) => path.clone(),
        None => {
            let index = demo::write(demo.path())?;
            println!(
                "no path given: wrote a demo checkpoint to {}",
                demo.path().display()
            );
            index
        }
    };
    let mut loader = Loader::new();
    if let Some(disable) = args.disable_mmap {
        loader = loader.disable_mmap(disable);
    }
    if let Some(threads) = args.threads {
        loader = loader.threads(threads);
    }
    if let Some(io) = args.io {
        loader = loader.io_concurrency(io);
    }
    if let Some(mib) = args.chunk_mib {
        loader = loader.read_size(mib << 20);
    }
    let start = Instant::now();
    let sd = loader.load(&path)?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes = sd.total_bytes();
    // Throughput of bytes actually read: none for files mapped lazily.
    let gib_s = sd.report().gib_per_s();

    {
        let rate = gib_s.map_or_else(
            || "mapped: pages are read when first touched".to_string(),
            |r| format!("{r:.2} GiB/s read"),
        );
        println!(
            "{} tensors, {} bytes in {seconds:.3} s ({rate})",
            sd.len(),
            bytes
        );
        print!("{}", sd.report());
        for (name, tensor) in sd.iter().take(8) {
            println!("  {name}: {} {:?}", tensor.dtype(), tensor.shape());
        }
        if sd.len() > 8 {
            println!("  ... and {} more", sd.len() - 8);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = e.source();
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
