//! `safeload prefetch`: warm the page cache for a job script, this process's share of the job's local ranks, then the prefetch report.

use safeload::{Loader, PrefetchOptions};

use crate::args::PrefetchArgs;
use crate::failure::Failure;
use crate::output;
use crate::progress::Bars;

/// Runs `safeload prefetch`.
pub fn run(args: &PrefetchArgs) -> Result<(), Failure> {
    let mut options = PrefetchOptions::new();
    if let Some(streams) = args.streams {
        options = options.streams(streams);
    }
    // The local rank is left to the library, which reads the launchers'
    // variables (LOCAL_RANK, SLURM_LOCALID, ...) as a load does.
    let mut loader = Loader::new().prefetch_with(options);
    let bars = Bars::on_stderr(!args.no_progress);
    if let Some(callback) = bars.callback() {
        loader = loader.on_progress(callback);
    }
    let report = bars.close(loader.warm(&args.path))?;
    if args.json {
        output::json(&report)
    } else {
        output::text(&format!("{report}\n"))
    }
}
