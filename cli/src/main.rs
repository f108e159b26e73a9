//! `safeload`, the command: load, inspect and prefetch safetensors checkpoints, and say what the filesystem policy decides and why.
//!
//! Each subcommand is a thin layer over the library (`command/`): the
//! library computes and reports, this tool draws the progress bar
//! (`progress.rs`), prints the reports as text or JSON (`json.rs`,
//! `output.rs`), and turns failures into messages and exit codes
//! (`failure.rs`): 0 done, 1 failed, 2 usage error (clap's).

mod args;
mod command;
mod failure;
mod json;
mod output;
mod progress;
mod source;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};

fn main() -> ExitCode {
    // Usage errors exit with 2, `--help` and `--version` with 0, from clap.
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Load(args) => command::load::run(args),
        Command::Inspect(args) => command::inspect::run(args),
        Command::Mounts(args) => command::mounts::run(args),
        Command::Prefetch(args) => command::prefetch::run(args),
        Command::Cache(args) => command::cache::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprint!("{}", failure.render());
            ExitCode::FAILURE
        }
    }
}
