//! The command line: subcommands, flags and their help text, as clap derives; nothing here runs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// What `safeload --help` ends with: the contract a script relies on.
const EXIT_STATUS: &str = "\
Exit status:
  0  done
  1  the checkpoint could not be loaded, inspected or prefetched, or a path
     could not be looked up (the message on stderr names the file)
  2  usage error (unknown flag, bad value, missing argument)

Environment: SAFELOAD_DISABLE_MMAP, SAFELOAD_PREFETCH (or HF_SHARD_PREFETCH),
SAFELOAD_VERIFY, SAFELOAD_HUB_CACHE, SAFELOAD_CACHE_DIR and the hub's HF_ENDPOINT,
HF_TOKEN, HF_HUB_CACHE, HF_HOME and HF_HUB_OFFLINE are honoured as by the
library; flags override them.";

/// Load safetensors checkpoints as fast as the storage under them allows,
/// and say how each file was read and why.
#[derive(Debug, Parser)]
#[command(
    name = "safeload",
    version,
    long_about = "Load safetensors checkpoints as fast as the storage under them allows, and say \
                  how each file was read and why: mapped where mapping is cheap, read with large \
                  positional reads on FUSE mounts, the page cache warmed first on network \
                  filesystems.\n\n\
                  Try it without a download: safeload load --demo",
    after_help = EXIT_STATUS,
    arg_required_else_help = true
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load a checkpoint and report how each file was read, why, and how fast
    #[command(after_help = "\
A progress bar (bytes, GiB/s, phase) is drawn on stderr when it is a terminal.
The report goes to stdout; with --json, one JSON object and nothing else.

Examples:
  safeload load --demo
  safeload load /mnt/hub/org/model --disable-mmap
  safeload load model.safetensors.index.json --prefetch 8 --json | jq '.files[].reason'")]
    Load(LoadArgs),

    /// List tensors, dtypes, shapes, sizes and metadata, from the headers alone
    #[command(after_help = "\
Only the headers are read, so a checkpoint of hundreds of GiB is inspected in
milliseconds. Each file also says how a load would read it, and why.

Examples:
  safeload inspect model.safetensors
  safeload inspect /path/to/checkpoint --json | jq '.tensors[] | select(.dtype == \"BF16\") | .name'")]
    Inspect(InspectArgs),

    /// Show the filesystem a path is on, and what the auto policy does there and why
    #[command(after_help = "\
Examples:
  safeload mounts
  safeload mounts /mnt/hub --all")]
    Mounts(MountsArgs),

    /// Warm the page cache with a checkpoint, the work shared by a job's local ranks
    #[command(after_help = "\
Run it in every process of a job on a node: they split the bytes through one
shared queue, so no chunk is read twice. The local rank comes from the
launcher: LOCAL_RANK/LOCAL_WORLD_SIZE (torchrun), SLURM_LOCALID/
SLURM_NTASKS_PER_NODE (Slurm), OMPI_COMM_WORLD_LOCAL_RANK/_SIZE (Open MPI),
MPI_LOCALRANKID/MPI_LOCALNRANKS (MPICH). Chunks already in the page cache
are not read; at most 90 % of the memory available is warmed.

Example, in a job script: warm, wait at a barrier, then load:
  srun safeload prefetch /shared/checkpoints/run-42 --streams 8")]
    Prefetch(PrefetchArgs),

    /// List what the Hugging Face cache holds for a repository (or every one), or say where it is
    #[command(after_help = "\
The cache is the one the hub's own clients share (huggingface_hub, hf-hub):
HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. `load` and
`inspect` of hf://org/repo read the files it holds and write the others to it
(SAFELOAD_HUB_CACHE=0 turns that off; HF_HUB_OFFLINE=1 asks the hub nothing).

`safeload cache rm` removes a revision or a repository, `safeload cache prune`
what dead downloads left and blobs no snapshot links to; --dry-run says what
would go and how many bytes, removing nothing. Neither follows a link, removes
what another user owns, or touches a file whose lock a live writer holds: each
is listed as kept, with why.

Examples:
  safeload cache
  safeload cache org/model --json | jq '.repos[].revisions[].files[].path'
  safeload cache rm org/model@v1.0 --dry-run
  safeload cache rm org/model
  safeload cache prune")]
    Cache(CacheArgs),
}

/// The checkpoint a command works on: a path, or the built-in demo.
#[derive(Debug, Args)]
pub struct CheckpointArg {
    /// A .safetensors file, a *.safetensors.index.json, or a directory holding one
    #[arg(value_name = "PATH", required_unless_present = "demo")]
    pub path: Option<PathBuf>,

    /// Use the built-in demo checkpoint (3 shards, 30 MiB), written to a temporary directory
    #[arg(long, conflicts_with = "path")]
    pub demo: bool,
}

/// `safeload load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// The checkpoint.
    #[command(flatten)]
    pub checkpoint: CheckpointArg,

    /// Read every file into memory ("buffered"), whatever its filesystem
    #[arg(long, conflicts_with = "mmap")]
    pub disable_mmap: bool,

    /// Map every file, whatever its filesystem
    #[arg(long)]
    pub mmap: bool,

    /// Warm the page cache with N readers before loading; 0 never does, even where the auto policy would
    #[arg(long, value_name = "N")]
    pub prefetch: Option<usize>,

    /// Convert floating tensors to this dtype while loading
    #[arg(long, value_name = "T", ignore_case = true)]
    pub dtype: Option<TargetDtype>,

    /// Compute each file's SHA-256 and check it where it is known (a Hugging Face cache blob's name)
    #[arg(long)]
    pub verify: bool,

    /// Files opened and parsed at once [default: the machine's parallelism]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub threads: Option<usize>,

    /// Reads in flight for buffered files [default: chosen by filesystem]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub io_concurrency: Option<usize>,

    /// Print one JSON object on stdout instead of the report
    #[arg(long)]
    pub json: bool,

    /// Draw no progress bar, even on a terminal
    #[arg(long)]
    pub no_progress: bool,
}

/// `safeload inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The checkpoint.
    #[command(flatten)]
    pub checkpoint: CheckpointArg,

    /// Print one JSON object on stdout: every tensor, per-file totals and metadata
    #[arg(long)]
    pub json: bool,
}

/// `safeload mounts`.
#[derive(Debug, Args)]
pub struct MountsArgs {
    /// Any file or directory [default: the current directory]
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,

    /// Also list every mount of this process's mount table, with its kind
    #[arg(long)]
    pub all: bool,

    /// Print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

/// `safeload prefetch`.
#[derive(Debug, Args)]
pub struct PrefetchArgs {
    /// A .safetensors file, a *.safetensors.index.json, or a directory holding one
    #[arg(value_name = "PATH")]
    pub path: PathBuf,

    /// Readers in this process [default: 4]
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    pub streams: Option<usize>,

    /// Print one JSON object on stdout instead of the report
    #[arg(long)]
    pub json: bool,

    /// Draw no progress bar, even on a terminal
    #[arg(long)]
    pub no_progress: bool,
}

/// `safeload cache`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CacheArgs {
    /// Remove from the cache instead of listing it
    #[command(subcommand)]
    pub action: Option<CacheAction>,

    /// A repository of the hub, org/name [default: every one the cache holds]
    #[arg(value_name = "REPO")]
    pub repo: Option<String>,

    /// Print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

/// `safeload cache rm` and `safeload cache prune`.
#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// Remove a revision of a repository (its snapshot, the refs naming it, the blobs no other revision links to), or the whole repository
    #[command(after_help = "\
REVISION is a commit (40 hex digits), a branch or a tag the cache has a ref
of (main, v1.0, refs/pr/1 or refs%2Fpr%2F1); without it, the whole repository
goes. Exit status 0 also where something was kept (another user's, locked):
the output lists it, with why.

Examples:
  safeload cache rm org/model@v1.0 --dry-run
  safeload cache rm org/model --json")]
    Rm(CacheRmArgs),

    /// Remove the temporary files dead downloads left (not written to for an hour, their lock free) and the blobs no snapshot links to
    #[command(after_help = "\
Examples:
  safeload cache prune --dry-run
  safeload cache prune org/model")]
    Prune(CachePruneArgs),
}

/// `safeload cache rm`.
#[derive(Debug, Args)]
pub struct CacheRmArgs {
    /// org/name, or org/name@REVISION for one revision of it
    #[arg(value_name = "REPO[@REVISION]")]
    pub target: String,

    /// Remove nothing: say what would go, and how many bytes
    #[arg(long)]
    pub dry_run: bool,

    /// Print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

/// `safeload cache prune`.
#[derive(Debug, Args)]
pub struct CachePruneArgs {
    /// A repository of the hub, org/name [default: every one the cache holds]
    #[arg(value_name = "REPO")]
    pub repo: Option<String>,

    /// Remove nothing: say what would go, and how many bytes
    #[arg(long)]
    pub dry_run: bool,

    /// Print one JSON object on stdout
    #[arg(long)]
    pub json: bool,
}

/// The dtypes a load converts floating tensors to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetDtype {
    /// bfloat16
    Bf16,
    /// IEEE half precision
    F16,
    /// IEEE single precision
    F32,
}

impl TargetDtype {
    /// The library's dtype.
    pub fn dtype(self) -> safeload::Dtype {
        match self {
            TargetDtype::Bf16 => safeload::Dtype::BF16,
            TargetDtype::F16 => safeload::Dtype::F16,
            TargetDtype::F32 => safeload::Dtype::F32,
        }
    }
}

/// A count of 1 or more: the library would take 0 as 1, and a script that
/// passes 0 has a bug worth hearing about.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn dtype_names_parse_in_any_case() {
        for (text, dtype) in [
            ("bf16", safeload::Dtype::BF16),
            ("BF16", safeload::Dtype::BF16),
            ("F16", safeload::Dtype::F16),
            ("f32", safeload::Dtype::F32),
        ] {
            let cli = Cli::try_parse_from(["safeload", "load", "--demo", "--dtype", text]).unwrap();
            let Command::Load(args) = cli.command else {
                panic!("not load")
            };
            assert_eq!(args.dtype.map(TargetDtype::dtype), Some(dtype));
        }
    }

    #[test]
    fn cache_lists_by_default_and_takes_rm_and_prune() {
        let cache = |args: &[&str]| {
            let cli = Cli::try_parse_from([&["safeload", "cache"][..], args].concat()).unwrap();
            let Command::Cache(args) = cli.command else {
                panic!("not cache")
            };
            args
        };
        let listed = cache(&["org/model", "--json"]);
        assert!(listed.action.is_none() && listed.json);
        assert_eq!(listed.repo.as_deref(), Some("org/model"));
        let Some(CacheAction::Rm(rm)) = cache(&["rm", "org/model@main", "--dry-run"]).action else {
            panic!("not rm")
        };
        assert_eq!(
            (rm.target.as_str(), rm.dry_run, rm.json),
            ("org/model@main", true, false)
        );
        let Some(CacheAction::Prune(prune)) = cache(&["prune", "--json"]).action else {
            panic!("not prune")
        };
        assert!(prune.repo.is_none() && prune.json && !prune.dry_run);
        assert!(Cli::try_parse_from(["safeload", "cache", "rm"]).is_err());
    }

    #[test]
    fn usage_errors_are_clap_errors() {
        for args in [
            &["safeload", "load"][..],
            &["safeload", "load", "--demo", "x.safetensors"],
            &["safeload", "load", "--demo", "--mmap", "--disable-mmap"],
            &["safeload", "load", "--demo", "--dtype", "f64"],
            &["safeload", "load", "--demo", "--threads", "0"],
            &["safeload", "prefetch"],
            &["safeload", "prefetch", "x", "--streams", "many"],
        ] {
            let error = Cli::try_parse_from(args).unwrap_err();
            assert_eq!(error.exit_code(), 2, "{args:?}: {error}");
        }
    }
}
