//! `cargo bench --bench node_copy`: one copy per node (issue 25), the local
//! ranks of one job loading one checkpoint from an hf-mount-like FUSE mount.
//!
//! Each rank is its own process (this binary again, as a child), with the
//! launchers' variables (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`) and a job id
//! (`TORCHELASTIC_RUN_ID`) of its arm's run; `Loader::new()`, no option set.
//! The ranks of an arm are started, wait at a start line, and are let go
//! together; each times its own load, checks a sample of its tensors' bytes
//! (`sampled_digest`, against the same sample of a naive load of the source
//! files with the `safetensors` crate), reports, and keeps its tensors until
//! every rank has loaded, as the ranks of a job keep their model.
//!
//! Arms: `N-rank(s)` (the node copy, as shipped), `N-ranks-today` (the same
//! with the node copy switched off by its test seam, `SAFELOAD_NODE_COPY=0`:
//! every rank reads the whole checkpoint alone, as before the node copy),
//! and `N-rank(s)-before` (a build of this benchmark at the commit before
//! the node copy, given with `--before-exe`). Before every run the
//! checkpoint is made cold under the mount and in its source directory
//! (`posix_fadvise(DONTNEED)`), and the mount's counters are zeroed; arms
//! are interleaved and rotated in each round.
//!
//! Per arm: the slowest rank's load (median and range), that over one rank
//! alone in the same round, the bytes the mount served over the
//! checkpoint's, and the node's memory at the peak: `/proc/meminfo` sampled
//! from the parent every `--sample-ms` from just before the ranks are let go
//! until all have loaded, `MemAvailable`'s drop from that baseline (and
//! `Shmem`'s growth) over the checkpoint's size. Beside it, what the ranks
//! hold once all have loaded, counted once (their `RssAnon` summed, and
//! `Shmem`'s growth), which other work on the machine cannot move. The
//! ranks' summed peak RSS is printed too, but it counts a page that several
//! ranks map once per rank.
//!
//! ```text
//! cargo bench --bench node_copy -- [--size-gib 2] [--shards 8] [--rounds 5]
//!     [--scenarios fuse-2ms-8t,fuse-8ms-32t] [--arms 1-rank,3-ranks,4-ranks,3-ranks-today,4-ranks-today]
//!     [--sample-ms 20] [--before-exe PATH] [--dir bench-data] [--json bench-data/node_copy.json]
//!     [--timeout 600]
//! ```
//!
//! With `--attacks` (as root), the node copy against another local user
//! instead (issue 32): each attack of the attack tests, timed against runs
//! with no attacker, for ranks of root and of an ordinary user
//! (`common/node_attacks.rs` says how):
//!
//! ```text
//! cargo bench --bench node_copy -- --attacks [--rounds 5] [--timeout 30]
//!     [--json bench-data/node_copy_attacks.json]
//! ```

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use safeload::report::NodeCopy;
use safetensors::SafeTensors;

mod common;

/// Another local user's process (shared with the attack tests).
#[path = "../tests/it/node_copy/attacker.rs"]
mod attacker;
/// `--attacks`: the node copy against another local user.
#[path = "common/node_attacks.rs"]
mod attacks;

use common::child::{self, Child, Held, Job};
use common::node_memory::{Peak, Sampler};
use common::stats::Spread;
use common::{args, data, fuse, proc, random};

/// The mounts measured by default: the issue's two.
const DEFAULT_SCENARIOS: [&str; 2] = ["fuse-2ms-8t", "fuse-8ms-32t"];
/// The arms run by default.
const DEFAULT_ARMS: [&str; 5] = [
    "1-rank",
    "3-ranks",
    "4-ranks",
    "3-ranks-today",
    "4-ranks-today",
];
/// What the targets allow the node memory beyond 1.1x the checkpoint.
const MEMORY_SLACK: u64 = 128 << 20;

/// How an arm's ranks load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Variant {
    /// As shipped: with more than one rank, one node copy.
    NodeCopy,
    /// The node copy switched off (`SAFELOAD_NODE_COPY=0`).
    Today,
    /// A build from before the node copy (`--before-exe`).
    Before,
}

/// An arm: this many local ranks, loading so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Arm {
    ranks: usize,
    variant: Variant,
}

impl Arm {
    fn parse(name: &str) -> Option<Arm> {
        let (rest, variant) = if let Some(rest) = name.strip_suffix("-today") {
            (rest, Variant::Today)
        } else if let Some(rest) = name.strip_suffix("-before") {
            (rest, Variant::Before)
        } else {
            (name, Variant::NodeCopy)
        };
        let n = rest
            .strip_suffix("-ranks")
            .or_else(|| rest.strip_suffix("-rank"))?;
        let ranks = n.parse().ok().filter(|&r| r >= 1)?;
        Some(Arm { ranks, variant })
    }

    fn name(&self) -> String {
        let s = if self.ranks == 1 { "" } else { "s" };
        let suffix = match self.variant {
            Variant::NodeCopy => "",
            Variant::Today => "-today",
            Variant::Before => "-before",
        };
        format!("{}-rank{s}{suffix}", self.ranks)
    }

    /// One rank alone, as shipped: the yardstick of every round.
    const ALONE: Arm = Arm {
        ranks: 1,
        variant: Variant::NodeCopy,
    };
}

fn arm_name(name: &str) -> Result<String, String> {
    Arm::parse(name)
        .map(|a| a.name())
        .ok_or_else(|| format!("an arm is N-rank(s)[-today|-before], not {name}"))
}

/// One copy per node against every rank alone (the module docs of
/// benches/node_copy.rs say how).
#[derive(Parser)]
#[command(name = "node_copy")]
struct Options {
    /// Instead: each attack of another local user on the node copy, timed
    /// against runs with no attacker (as root; only --rounds, --timeout and
    /// --json apply).
    #[arg(long, conflicts_with_all = ["size_gib", "shards", "scenarios", "arms", "sample_ms", "before_exe", "dir"])]
    attacks: bool,
    /// The checkpoint's size, GiB.
    #[arg(long, default_value_t = 2.0)]
    size_gib: f64,
    #[arg(long, default_value_t = 8)]
    shards: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, value_delimiter = ',', default_values = DEFAULT_SCENARIOS,
          value_parser = fuse::HF_MOUNT_SCENARIOS)]
    scenarios: Vec<String>,
    /// N-rank(s) (the node copy), N-ranks-today (switched off),
    /// N-rank(s)-before (the `--before-exe` build).
    #[arg(long, value_delimiter = ',', default_values = DEFAULT_ARMS, value_parser = arm_name)]
    arms: Vec<String>,
    /// Milliseconds between samples of /proc/meminfo.
    #[arg(long, default_value_t = 20)]
    sample_ms: u64,
    /// This benchmark built at the commit before the node copy, for the
    /// `-before` arms.
    #[arg(long)]
    before_exe: Option<PathBuf>,
    /// Where the checkpoint is written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
    /// Where every sample is written [default: bench-data/node_copy.json;
    /// with --attacks, bench-data/node_copy_attacks.json].
    #[arg(long)]
    json: Option<PathBuf>,
    /// Seconds before an arm's processes are killed [default: 600; with
    /// --attacks, 30].
    #[arg(long)]
    timeout: Option<u64>,
}

/// Where the samples go, unless `--json` says.
const JSON: &str = "bench-data/node_copy.json";
/// Seconds before an arm's processes are killed, unless `--timeout` says.
const TIMEOUT: u64 = 600;

fn main() {
    if let Some(job) = Job::from_env() {
        match job.arm.as_str() {
            attacks::RANK => attacks::run_rank(&job),
            attacks::ATTACKER => attacker::act_from_env(),
            _ => run_rank(&job),
        }
        return;
    }
    let o: Options = args::parse();
    let result = if o.attacks {
        attacks::parent(&o)
    } else {
        parent(&o)
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- the check

/// Bytes sampled from each tensor: this many at every [`STRIDE`], and its
/// last ones.
const SAMPLE: usize = 4096;
const STRIDE: usize = 1 << 20;

/// A digest of every tensor's name and length and of a sample of its bytes
/// (4 KiB per MiB and the last 4 KiB), in name order: cheap (8 MiB of a 2
/// GiB checkpoint) and position-sensitive, so that a rank handed another
/// file's bytes, or a copy filled wrong or not at all, differs.
fn sampled_digest<'a>(tensors: impl Iterator<Item = (&'a str, &'a [u8])>) -> u64 {
    let mut tensors: Vec<(&str, &[u8])> = tensors.collect();
    tensors.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |word: u64| h = (h ^ word).wrapping_mul(0x0000_0100_0000_01b3);
    for (name, bytes) in tensors {
        eat(random::seed_of(name));
        eat(bytes.len() as u64);
        for start in (0..bytes.len()).step_by(STRIDE) {
            eat(data::checksum(
                &bytes[start..(start + SAMPLE).min(bytes.len())],
            ));
        }
        eat(data::checksum(&bytes[bytes.len().saturating_sub(SAMPLE)..]));
    }
    h
}

/// [`sampled_digest`] of a naive load of the source files: each mapped and
/// parsed by the `safetensors` crate.
fn naive_digest(files: &[PathBuf]) -> Result<u64, String> {
    let maps = files
        .iter()
        .map(|f| {
            let file = std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
            // SAFETY: the benchmark's files are not modified while mapped.
            unsafe { memmap2::Mmap::map(&file) }.map_err(|e| format!("{}: {e}", f.display()))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let parsed = maps
        .iter()
        .map(|m| SafeTensors::deserialize(m).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, String>>()?;
    let names: Vec<(String, &[u8])> = parsed
        .iter()
        .flat_map(|st| st.tensors().into_iter().map(|(n, v)| (n, v.data())))
        .collect();
    Ok(sampled_digest(names.iter().map(|(n, b)| (n.as_str(), *b))))
}

// ---------------------------------------------------------------- a rank

/// What a rank prints once it has loaded.
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    /// Its load, from the parent's word to the state dict, seconds.
    seconds: f64,
    tensor_bytes: u64,
    digest: u64,
    /// `VmHWM`, `VmRSS`, `RssAnon` and `RssShmem` once loaded, KiB.
    hwm_kib: u64,
    rss_kib: u64,
    #[serde(default)]
    rss_anon_kib: u64,
    rss_shmem_kib: u64,
    /// Files, and those whose tensors are views of a node copy.
    files: usize,
    copies: usize,
    /// Chunks this rank filled, of the copies' chunks (from the notes).
    filled: (usize, usize),
    /// The first file's node-copy note, if any.
    note: Option<String>,
    error: Option<String>,
}

/// A rank: `--child ARM PATH`, the launchers' variables in its environment.
fn run_rank(job: &Job) {
    child::hold("ready");
    let start = Instant::now();
    let loaded = safeload::Loader::new().load(&job.path);
    let seconds = start.elapsed().as_secs_f64();
    let mut figures = Figures {
        seconds,
        tensor_bytes: 0,
        digest: 0,
        hwm_kib: 0,
        rss_kib: 0,
        rss_anon_kib: 0,
        rss_shmem_kib: 0,
        files: 0,
        copies: 0,
        filled: (0, 0),
        note: None,
        error: None,
    };
    match &loaded {
        Ok(sd) => {
            let report = sd.report();
            figures.tensor_bytes = report.tensor_bytes();
            figures.digest = sampled_digest(sd.iter().map(|(n, t)| (n, t.as_bytes())));
            figures.files = report.files.len();
            let copies: Vec<&NodeCopy> = report
                .files
                .iter()
                .filter_map(|f| f.node_copy.as_ref())
                .collect();
            for copy in &copies {
                if let NodeCopy::Shared {
                    filled_here,
                    chunks,
                    ..
                } = copy
                {
                    figures.copies += 1;
                    figures.filled.0 += filled_here;
                    figures.filled.1 += chunks;
                }
            }
            // With more than one rank and the copy on, a file without one is
            // worth saying too.
            let ranks: usize =
                std::env::var("LOCAL_WORLD_SIZE").map_or(1, |v| v.parse().unwrap_or(1));
            let on = std::env::var(safeload::NODE_COPY_ENV).map_or(true, |v| v != "0");
            figures.note = why_not_once(report, ranks > 1 && on)
                .or_else(|| copies.first().map(|c| c.to_string()));
        }
        Err(e) => figures.error = Some(e.to_string()),
    }
    let kib = |field| proc::status_kib(field).unwrap_or(0);
    figures.hwm_kib = kib("VmHWM:");
    figures.rss_kib = kib("VmRSS:");
    figures.rss_anon_kib = kib("RssAnon:");
    figures.rss_shmem_kib = kib("RssShmem:");
    child::report(&figures);
    // The tensors are kept until every rank of the job has loaded.
    child::hold("loaded");
    drop(loaded);
}

/// What a rank's report says where a file did not simply come from the
/// node copy: each file that a rank read alone (why not, or that it had no
/// copy at all: mapped, say), or whose copy came with remarks (chunks read
/// twice, a holder that did not answer, ...); the distinct notes, joined.
/// `None` where every file shared the copy and nothing was remarked.
fn why_not_once(report: &safeload::report::LoadReport, expect_copy: bool) -> Option<String> {
    let mut said: Vec<String> = Vec::new();
    for file in &report.files {
        let note = match &file.node_copy {
            Some(NodeCopy::Shared { remarks, .. }) if remarks.is_empty() => continue,
            Some(copy) => copy.to_string(),
            None if expect_copy => format!("no node copy ({}: {})", file.strategy, file.reason),
            None => continue,
        };
        if !said.contains(&note) {
            said.push(note);
        }
    }
    (!said.is_empty()).then(|| said.join(" | "))
}

// ---------------------------------------------------------------- the parent

/// One run of an arm: its ranks' figures merged.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Sample {
    scenario: String,
    arm: String,
    round: usize,
    ranks: usize,
    /// The slowest and the fastest rank's load, seconds.
    slowest: f64,
    fastest: f64,
    /// From the parent's word to the last rank's report, seconds.
    wall: f64,
    seconds: Vec<f64>,
    /// Bytes the mount served in answers to `READ` during the run.
    served: u64,
    memory: Option<Peak>,
    /// The ranks' `VmHWM` summed, KiB (a shared page counts in each).
    hwm_sum_kib: u64,
    /// What the ranks hold once all have loaded, counted once: their
    /// private memory (`RssAnon`, summed) and the shared memory they added
    /// (`Shmem` at its peak over the baseline), bytes. A check of the
    /// `MemAvailable` figure that other work on the machine cannot move.
    #[serde(default)]
    held: u64,
    /// Files with a node copy, per rank; chunks filled, per rank.
    copies: Vec<usize>,
    filled: Vec<(usize, usize)>,
    note: Option<String>,
    error: Option<String>,
}

fn parent(o: &Options) -> Result<(), String> {
    let arms: Vec<Arm> = o.arms.iter().filter_map(|a| Arm::parse(a)).collect();
    if arms.iter().any(|a| a.variant == Variant::Before) && o.before_exe.is_none() {
        return Err("a -before arm needs --before-exe".into());
    }
    let size = (o.size_gib * (1u64 << 30) as f64) as u64;
    let root = data::checkpoint(
        &o.dir,
        &data::stem(size, o.shards),
        &data::sharded(size, o.shards),
    )
    .map_err(|e| format!("generating: {e}"))?;
    let files = data::shard_files(&root);
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    let expected = naive_digest(&files)?;
    eprintln!(
        "checkpoint: {} ({} files, {:.2} GiB, sampled digest {expected:016x}); {} round(s), arms interleaved; {}",
        root.display(),
        files.len(),
        total as f64 / (1u64 << 30) as f64,
        o.rounds,
        proc::machine(),
    );
    let mut samples: Vec<Sample> = Vec::new();
    for scenario in &o.scenarios {
        let mount = fuse::hf_mount(scenario, &root)?;
        for round in 0..o.rounds {
            for a in common::rotated(arms.len(), round) {
                let arm = arms[a];
                fuse::make_cold(&mount, &root, mount.path())?;
                let mut sample = run_arm(o, scenario, arm, round, &mount);
                for (r, figures) in sample.1.iter().enumerate() {
                    if figures.error.is_none() && figures.digest != expected {
                        sample.0.error.get_or_insert(format!(
                            "rank {r}: sampled digest {:016x}, the naive load's {expected:016x}",
                            figures.digest
                        ));
                    }
                }
                let s = sample.0;
                eprintln!(
                    "  {scenario:<12} round {round} {:<15} slowest {:>7.3} s (fastest {:.3}, wall {:.3}) {:>5.2}x served {:>5.2}x memory {:>5.2}x shmem {:>5.2}x held {:>5.2}x summed RSS  copies {:?}{}{}",
                    s.arm,
                    s.slowest,
                    s.fastest,
                    s.wall,
                    s.served as f64 / total as f64,
                    s.memory
                        .map_or(f64::NAN, |m| m.used() as f64 / total as f64),
                    s.memory
                        .map_or(f64::NAN, |m| m.shmem() as f64 / total as f64),
                    s.held as f64 / total as f64,
                    (s.hwm_sum_kib << 10) as f64 / total as f64,
                    s.copies,
                    s.note
                        .as_deref()
                        .map(|n| format!("  ({n})"))
                        .unwrap_or_default(),
                    s.error
                        .as_deref()
                        .map(|e| format!("  ERROR {e}"))
                        .unwrap_or_default(),
                );
                samples.push(s);
            }
        }
    }
    println!("{}", markdown(&samples, o, &arms, total));
    let json = o.json.clone().unwrap_or_else(|| JSON.into());
    common::write_samples(&json, &root, files.len(), total, &samples)?;
    let failed = samples.iter().filter(|s| s.error.is_some()).count();
    if failed > 0 {
        return Err(format!("{failed} run(s) failed or loaded wrong bytes"));
    }
    Ok(())
}

/// Runs `arm` once: its ranks started, let go together, each kept holding
/// its tensors until all have loaded; the node's memory sampled meanwhile.
fn run_arm(
    o: &Options,
    scenario: &str,
    arm: Arm,
    round: usize,
    mount: &safeload_testfs::Mount,
) -> (Sample, Vec<Figures>) {
    let name = arm.name();
    let mut sample = Sample {
        scenario: scenario.into(),
        arm: name.clone(),
        round,
        ranks: arm.ranks,
        slowest: f64::NAN,
        fastest: f64::NAN,
        wall: f64::NAN,
        seconds: Vec::new(),
        served: 0,
        memory: None,
        hwm_sum_kib: 0,
        held: 0,
        copies: Vec::new(),
        filled: Vec::new(),
        note: None,
        error: None,
    };
    match run_ranks(o, scenario, arm, round, mount.path()) {
        Ok((figures, wall, memory)) => {
            sample.served = mount.stats().bytes_read;
            sample.wall = wall;
            sample.memory = memory;
            sample.seconds = figures.iter().map(|f| f.seconds).collect();
            sample.slowest = sample.seconds.iter().copied().fold(f64::NAN, f64::max);
            sample.fastest = sample.seconds.iter().copied().fold(f64::NAN, f64::min);
            sample.hwm_sum_kib = figures.iter().map(|f| f.hwm_kib).sum();
            let anon: u64 = figures.iter().map(|f| f.rss_anon_kib << 10).sum();
            sample.held = anon + memory.map_or(0, |m| m.shmem());
            sample.copies = figures.iter().map(|f| f.copies).collect();
            sample.filled = figures.iter().map(|f| f.filled).collect();
            // Each rank's, where one read alone or met something: the run
            // that serves more than the checkpoint says why.
            let odd: Vec<String> = figures
                .iter()
                .enumerate()
                .filter(|(_, f)| {
                    f.note.as_ref().is_some_and(|n| {
                        n.contains(" | ")
                            || n.contains("; ")
                            || n.starts_with("not used")
                            || n.starts_with("no node copy")
                    })
                })
                .filter_map(|(r, f)| f.note.as_ref().map(|n| format!("rank {r}: {n}")))
                .collect();
            sample.note = if odd.is_empty() {
                figures.iter().find_map(|f| f.note.clone())
            } else {
                Some(odd.join(" || "))
            };
            sample.error = figures.iter().find_map(|f| f.error.clone());
            (sample, figures)
        }
        Err(e) => {
            sample.error = Some(e);
            (sample, Vec::new())
        }
    }
}

/// The ranks' figures, the wall time from their start to the last report,
/// and the node memory's peak.
fn run_ranks(
    o: &Options,
    scenario: &str,
    arm: Arm,
    round: usize,
    path: &Path,
) -> Result<(Vec<Figures>, f64, Option<Peak>), String> {
    let job = format!(
        "safeload-bench-{}-{scenario}-{round}-{}",
        std::process::id(),
        arm.name()
    );
    let mut ranks: Vec<Held> = Vec::with_capacity(arm.ranks);
    for rank in 0..arm.ranks {
        let mut child = match (arm.variant, &o.before_exe) {
            (Variant::Before, Some(exe)) => Child::with_exe(exe, &arm.name(), path),
            _ => Child::new(&arm.name(), path),
        };
        child = child
            // Nothing of the caller's that would change what safeload does.
            .env_remove(safeload::ENV_VARIABLES)
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", arm.ranks.to_string())
            .env("TORCHELASTIC_RUN_ID", &job)
            .timeout(Duration::from_secs(o.timeout.unwrap_or(TIMEOUT)));
        if arm.variant == Variant::Today {
            child = child.env(safeload::NODE_COPY_ENV, "0");
        }
        ranks.push(child.start_held()?);
    }
    for rank in &mut ranks {
        rank.until("ready")?;
    }
    // The baseline just before the ranks are let go.
    let sampler = Sampler::start(Duration::from_millis(o.sample_ms));
    let start = Instant::now();
    for rank in &mut ranks {
        rank.resume()?;
    }
    let mut figures = Vec::with_capacity(ranks.len());
    for (r, rank) in ranks.iter_mut().enumerate() {
        let lines = rank.until("loaded")?;
        let f: Figures = lines
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| format!("rank {r} printed no figures: {lines:?}"))?;
        figures.push(f);
    }
    let wall = start.elapsed().as_secs_f64();
    let memory = sampler.map(Sampler::stop);
    for (r, rank) in ranks.into_iter().enumerate() {
        rank.finish().map_err(|e| format!("rank {r}: {e}"))?;
    }
    Ok((figures, wall, memory))
}

// ---------------------------------------------------------------- the table

/// What the table shows of one arm on one mount.
struct Row {
    slowest: Spread,
    vs_alone: Spread,
    served: Spread,
    memory: Spread,
    shmem: Spread,
    held: Spread,
    hwm_sum: Spread,
    failed: usize,
}

fn row(samples: &[Sample], scenario: &str, arm: &str, total: u64) -> Option<Row> {
    let ok: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.scenario == scenario && s.arm == arm && s.error.is_none())
        .collect();
    let failed = samples
        .iter()
        .filter(|s| s.scenario == scenario && s.arm == arm && s.error.is_some())
        .count();
    if ok.is_empty() && failed == 0 {
        return None;
    }
    let x = |bytes: u64| bytes as f64 / total as f64;
    let alone = Arm::ALONE.name();
    let vs_alone: Vec<f64> = ok
        .iter()
        .filter_map(|s| {
            let a = samples.iter().find(|a| {
                a.scenario == scenario && a.arm == alone && a.round == s.round && a.error.is_none()
            })?;
            Some(s.slowest / a.slowest)
        })
        .collect();
    let of = |f: &dyn Fn(&Sample) -> f64| Spread::of(&ok.iter().map(|s| f(s)).collect::<Vec<_>>());
    Some(Row {
        slowest: of(&|s| s.slowest),
        vs_alone: Spread::of(&vs_alone),
        served: of(&|s| x(s.served)),
        memory: of(&|s| s.memory.map_or(f64::NAN, |m| x(m.used()))),
        shmem: of(&|s| s.memory.map_or(f64::NAN, |m| x(m.shmem()))),
        held: of(&|s| x(s.held)),
        hwm_sum: of(&|s| x(s.hwm_sum_kib << 10)),
        failed,
    })
}

fn markdown(samples: &[Sample], o: &Options, arms: &[Arm], total: u64) -> String {
    let mut out = String::new();
    let gib = total as f64 / (1u64 << 30) as f64;
    let _ = writeln!(
        out,
        "checkpoint {gib:.2} GiB in {} shards; {} rounds; medians (min-max); {}\n",
        o.shards,
        o.rounds,
        proc::machine()
    );
    let _ = writeln!(
        out,
        "| mount | arm | slowest rank, s | x one rank alone (same round) | served x checkpoint | node memory at the peak x checkpoint | `Shmem` x checkpoint | held: anon + `Shmem` x checkpoint | summed peak RSS x checkpoint |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for scenario in &o.scenarios {
        for arm in arms {
            let name = arm.name();
            let Some(r) = row(samples, scenario, &name, total) else {
                continue;
            };
            let failed = if r.failed > 0 {
                format!(" ({} failed)", r.failed)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {scenario} | {name}{failed} | {:.3} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.slowest, r.vs_alone, r.served, r.memory, r.shmem, r.held, r.hwm_sum
            );
        }
    }

    // Ranks x mounts, the node copy beside the same ranks without it.
    let counts: BTreeSet<usize> = arms.iter().map(|a| a.ranks).collect();
    let _ = writeln!(
        out,
        "\n| mount | ranks | slowest rank, s | x one rank alone | served | node memory | today: slowest rank, s | today: x one rank alone | today: served | today: node memory |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for scenario in &o.scenarios {
        for &n in &counts {
            let cells = |variant| {
                let arm = Arm { ranks: n, variant }.name();
                row(samples, scenario, &arm, total).map_or_else(
                    || " | | | ".to_string(),
                    |r| {
                        format!(
                            "{:.3} | {:.2} | {:.2}x | {:.2}x",
                            r.slowest, r.vs_alone, r.served.median, r.memory.median
                        )
                    },
                )
            };
            let _ = writeln!(
                out,
                "| {scenario} | {n} | {} | {} |",
                cells(Variant::NodeCopy),
                cells(Variant::Today)
            );
        }
    }

    // The issue's targets, each against its median.
    let memory_limit = (1.1 * total as f64 + MEMORY_SLACK as f64) / total as f64;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    let _ = writeln!(out, "\nTargets (medians):\n");
    for scenario in &o.scenarios {
        for arm in arms
            .iter()
            .filter(|a| a.variant == Variant::NodeCopy && a.ranks > 1)
        {
            let Some(r) = row(samples, scenario, &arm.name(), total) else {
                continue;
            };
            let (served, memory, ratio) = (r.served.median, r.memory.median, r.vs_alone.median);
            let _ = writeln!(
                out,
                "- {scenario}, {}: served {served:.3}x <= 1.05x {}; node memory {memory:.3}x <= {memory_limit:.3}x {}; slowest {ratio:.3}x one rank alone <= 1.25x {}",
                arm.name(),
                verdict(served <= 1.05),
                verdict(memory <= memory_limit),
                verdict(ratio <= 1.25),
            );
        }
        let alone = row(samples, scenario, &Arm::ALONE.name(), total);
        for variant in [Variant::Today, Variant::Before] {
            let other = row(samples, scenario, &Arm { ranks: 1, variant }.name(), total);
            if let (Some(a), Some(b)) = (&alone, other) {
                let _ = writeln!(
                    out,
                    "- {scenario}, one rank alone {:.3} s against {:.3} s {}: {:.2}x",
                    a.slowest,
                    b.slowest,
                    Arm { ranks: 1, variant }.name(),
                    a.slowest.median / b.slowest.median
                );
            }
        }
    }
    out
}
