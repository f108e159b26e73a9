//! `safeload load`: a load with the options given, a progress bar on a terminal, then the library's report (or its JSON).

use safeload::Loader;

use crate::args::LoadArgs;
use crate::failure::Failure;
use crate::output;
use crate::progress::Bars;
use crate::source::Source;

/// Runs `safeload load`.
pub fn run(args: &LoadArgs) -> Result<(), Failure> {
    let source = Source::from_arg(&args.checkpoint)?;
    if !args.json {
        source.announce();
    }
    let bars = Bars::on_stderr(!args.no_progress);
    let loader = loader(args, &bars);
    let sd = bars.close(loader.load(source.path()))?;
    if args.json {
        // The library's document as it is: one schema for the command and
        // for engines that serialize the report themselves.
        output::json(sd.report())?;
    } else {
        // The library's report says it all but which checkpoint and how
        // many tensors; its rates already leave out files that were mapped
        // lazily.
        output::text(&format!(
            "{} tensors from {}\n{}",
            sd.len(),
            source.path().display(),
            sd.report()
        ))?;
    }
    // A file written to a cache whose digest was still being checked when
    // the load returned: a mismatch found after is an error of the command
    // (the bytes loaded are not the store's), on stderr, exit code 1.
    sd.settle_cache()?;
    Ok(())
}

/// The loader the flags ask for. A flag left out leaves the library's
/// default, and so its environment variables, in force.
fn loader(args: &LoadArgs, bars: &Bars) -> Loader {
    let mut loader = Loader::new();
    if args.disable_mmap || args.mmap {
        loader = loader.disable_mmap(args.disable_mmap);
    }
    if let Some(streams) = args.prefetch {
        loader = loader.prefetch(streams);
    }
    if let Some(dtype) = args.dtype {
        loader = loader.dtype(dtype.dtype());
    }
    if args.verify {
        loader = loader.verify(true);
    }
    if let Some(threads) = args.threads {
        loader = loader.threads(threads);
    }
    if let Some(readers) = args.io_concurrency {
        loader = loader.io_concurrency(readers);
    }
    if let Some(callback) = bars.callback() {
        loader = loader.on_progress(callback);
    }
    loader
}
