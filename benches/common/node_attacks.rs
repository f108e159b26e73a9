//! `cargo bench --bench node_copy -- --attacks`: each attack of another
//! local user on a job's node copy (issue 32), timed against runs with no
//! attacker.
//!
//! The scene of the attack tests (`tests/it/node_copy/attacks.rs`), whose
//! attacker this benchmark shares (`tests/it/node_copy/attacker.rs`, by
//! `#[path]`): three local ranks, each its own process (this binary as
//! `--child attack-rank`), load a 16 MiB checkpoint of 3 shards (8 F32
//! tensors of 2 MiB) from a local directory with `disable_mmap(true)` (the
//! node copy's case), their queue directory a private one open to every
//! user (as `/dev/shm`). The victims: ranks of root, and ranks that become
//! uid 65533 before they load. The attacker (this binary as `--child
//! attacker`) becomes uid 65534 and plants its names before the ranks are
//! let go, with the key it learned from the lock file's name in a first run
//! (every user can read it); the late listener instead looks for the lock
//! file first and binds once the first rank has made it, the other two
//! ranks let go after.
//!
//! Arms: per victim, no attacker and each attack, all shuffled in every
//! round; before each run the checkpoint's files are evicted from the page
//! cache (`posix_fadvise(DONTNEED)`). The ranks are started, wait at a start
//! line and are let go together; each times its own `load` call and keeps
//! its tensors until every rank has loaded. A run's figure is its slowest
//! rank. Each run is checked: every rank's sampled digest is the naive
//! load's, every rank that met the attack names it in each file's note (a
//! quiet run's ranks: each file from the node copy), the attacker ended
//! cleanly. Per arm: the median (min-max) of the slowest rank, and of its
//! ratio to the run with no attacker in the same round.
//!
//! Needs root (it plays two other users). Only `--rounds`, `--timeout` (30 s
//! here) and `--json` (`bench-data/node_copy_attacks.json` here) apply.

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use safeload::{Loader, PrefetchOptions};
use safetensors::Dtype;

use crate::Options;
use crate::attacker::{self, Attack, Attacker, Target};
use crate::common::child::{self, Child, Held, Job};
use crate::common::data::{self, TensorSpec};
use crate::common::stats::Spread;
use crate::common::{self, proc};

/// The child that plays a victim's rank: `--child attack-rank INDEX DIR UID`.
pub const RANK: &str = "attack-rank";
/// The child that plays the attacker: `--child attacker DIR`.
pub const ATTACKER: &str = "attacker";
/// The local ranks of the job.
const RANKS: usize = 3;
/// The ordinary user whose ranks are the second victim.
const ORDINARY: u32 = 65533;
/// The handoff's patience (`PATIENCE` of `src/node/handoff.rs`): the most
/// an attack may delay a load.
const PATIENCE: f64 = 2.0;
/// Seconds before a run's processes are killed, unless `--timeout` says.
const TIMEOUT: u64 = 30;
/// Where the samples go, unless `--json` says.
pub const JSON: &str = "bench-data/node_copy_attacks.json";

/// A victim: ranks of `uid` (0: root), their queue directory, their job id
/// (the same in every run, as the key the attacker learned is the job's)
/// and the key of their copy.
struct Victim {
    uid: u32,
    dir: tempfile::TempDir,
    job: String,
    key: u64,
}

impl Victim {
    fn name(&self) -> String {
        match self.uid {
            0 => "root".into(),
            uid => format!("uid {uid}"),
        }
    }
}

// ---------------------------------------------------------------- a rank

/// What a rank prints once it has loaded.
#[derive(serde::Serialize, serde::Deserialize)]
struct Figures {
    /// Its `load` call, seconds.
    seconds: f64,
    digest: u64,
    /// Each file's node-copy note.
    notes: Vec<String>,
    error: Option<String>,
}

/// A victim's rank: becomes its user, waits at the start line, loads
/// buffered with its queue directory, reports, and keeps its tensors until
/// every rank has loaded.
pub fn run_rank(job: &Job) {
    let dir: PathBuf = job.extra(0);
    let uid: u32 = job.extra(1);
    if uid != 0 {
        attacker::become_user(uid);
    }
    child::hold("ready");
    let start = Instant::now();
    let loaded = Loader::new()
        .disable_mmap(true)
        .prefetch_with(PrefetchOptions::new().queue_dir(dir))
        .load(&job.path);
    let mut figures = Figures {
        seconds: start.elapsed().as_secs_f64(),
        digest: 0,
        notes: Vec::new(),
        error: None,
    };
    match &loaded {
        Ok(sd) => {
            figures.digest = crate::sampled_digest(sd.iter().map(|(n, t)| (n, t.as_bytes())));
            let files = &sd.report().files;
            figures.notes = files
                .iter()
                .filter_map(|f| f.node_copy.as_ref().map(ToString::to_string))
                .collect();
        }
        Err(e) => figures.error = Some(e.to_string()),
    }
    child::report(&figures);
    child::hold("loaded");
    drop(loaded);
}

// ---------------------------------------------------------------- the parent

/// One run: a victim's ranks, with or without an attacker.
#[derive(serde::Serialize, serde::Deserialize)]
struct Sample {
    victim: String,
    /// The attack's name, or "none".
    arm: String,
    round: usize,
    /// The slowest rank's load, seconds; the ranks' loads.
    slowest: f64,
    seconds: Vec<f64>,
    /// The last rank's first note.
    note: Option<String>,
    error: Option<String>,
}

/// The checkpoint every user may read: its index, files and bytes.
struct Checkpoint {
    _place: tempfile::TempDir,
    root: PathBuf,
    index: PathBuf,
    files: Vec<PathBuf>,
    bytes: u64,
}

fn checkpoint() -> Result<Checkpoint, String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let place = tempfile::Builder::new()
        .prefix("safeload-bench-attacks-")
        .tempdir()
        .map_err(|e| io("a temporary directory", e))?;
    let tensors = (0..8).map(|i| TensorSpec::new(format!("x.w{i:03}"), Dtype::F32, &[512, 1024]));
    let mut shards: Vec<Vec<TensorSpec>> = (0..3).map(|_| Vec::new()).collect();
    for (i, t) in tensors.enumerate() {
        shards[i % 3].push(t);
    }
    let root = data::checkpoint(place.path(), "attacks", &shards).map_err(|e| io("writing", e))?;
    let index = root.join("model.safetensors.index.json");
    let files = data::shard_files(&root);
    let open = |path: &Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io(&path.display().to_string(), e))
    };
    open(place.path(), 0o755)?;
    open(&root, 0o755)?;
    for file in files.iter().chain([&index]) {
        open(file, 0o644)?;
    }
    let bytes = files
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    Ok(Checkpoint {
        _place: place,
        root,
        index,
        files,
        bytes,
    })
}

/// The benchmark (the module docs say how).
pub fn parent(o: &Options) -> Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("--attacks plays other users (uids 65533 and 65534): run it as root".into());
    }
    let ck = checkpoint()?;
    let expected = crate::naive_digest(&ck.files)?;
    let timeout = Duration::from_secs(o.timeout.unwrap_or(TIMEOUT));
    eprintln!(
        "checkpoint: {} ({} files, {:.1} MiB, sampled digest {expected:016x}); {RANKS} ranks; {} round(s), arms shuffled; {}; load average {}",
        ck.root.display(),
        ck.files.len(),
        ck.bytes as f64 / (1 << 20) as f64,
        o.rounds,
        proc::machine(),
        load_average(),
    );
    // Each victim's first run, not counted, shows the attacker the key.
    let mut victims = Vec::new();
    for uid in [0, ORDINARY] {
        let dir = tempfile::Builder::new()
            .prefix("safeload-bench-queue-")
            .tempdir()
            .map_err(|e| format!("a queue directory: {e}"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .map_err(|e| format!("{}: {e}", dir.path().display()))?;
        let job = format!("safeload-bench-attacks-{}-u{uid}", std::process::id());
        let mut victim = Victim {
            uid,
            dir,
            job,
            key: 0,
        };
        let _ = data::evict(&[&ck.index]);
        let first = run(&victim, None, &ck.index, timeout)
            .map_err(|e| format!("{}, the first run: {e}", victim.name()))?;
        victim.key = first
            .key
            .ok_or_else(|| format!("{}: no lock file while the ranks held", victim.name()))?;
        victims.push(victim);
    }
    let arms: Vec<(usize, Option<Attack>)> = (0..victims.len())
        .flat_map(|v| {
            std::iter::once(None)
                .chain(Attack::ALL.map(Some))
                .map(move |a| (v, a))
        })
        .collect();
    let mut samples = Vec::new();
    for round in 0..o.rounds {
        // Round 0 too: `shuffled` keeps the given order in its round 0.
        for a in common::shuffled(arms.len(), round + 1) {
            let (v, attack) = arms[a];
            let victim = &victims[v];
            let sample = sample(victim, attack, round, &ck, expected, timeout);
            eprintln!(
                "  round {round} {:<9} {:<24} slowest {:.3} s {:?}{}",
                sample.victim,
                sample.arm,
                sample.slowest,
                sample.seconds,
                sample
                    .error
                    .as_deref()
                    .map(|e| format!("  ERROR {e}"))
                    .unwrap_or_default(),
            );
            samples.push(sample);
        }
    }
    eprintln!("load average {}", load_average());
    println!("{}", markdown(&samples, &victims, o.rounds));
    let json = o.json.clone().unwrap_or_else(|| JSON.into());
    common::write_samples(&json, &ck.root, ck.files.len(), ck.bytes, &samples)?;
    let failed = samples.iter().filter(|s| s.error.is_some()).count();
    if failed > 0 {
        return Err(format!(
            "{failed} run(s) failed or were not what they claim"
        ));
    }
    Ok(())
}

/// One run of an arm, evicted first and checked after.
fn sample(
    victim: &Victim,
    attack: Option<Attack>,
    round: usize,
    ck: &Checkpoint,
    expected: u64,
    timeout: Duration,
) -> Sample {
    let mut sample = Sample {
        victim: victim.name(),
        arm: attack.map_or("none", Attack::name).into(),
        round,
        slowest: f64::NAN,
        seconds: Vec::new(),
        note: None,
        error: None,
    };
    let outcome = data::evict(&[&ck.index]).and_then(|()| run(victim, attack, &ck.index, timeout));
    match outcome {
        Ok(outcome) => {
            let figures = outcome.figures;
            sample.seconds = figures.iter().map(|f| f.seconds).collect();
            sample.slowest = sample.seconds.iter().copied().fold(f64::NAN, f64::max);
            sample.note = figures.last().and_then(|f| f.notes.first().cloned());
            sample.error = check(&figures, attack, ck.files.len(), expected);
        }
        Err(e) => sample.error = Some(e),
    }
    sample
}

/// What is wrong with a run's figures, if anything: an error, bytes other
/// than the naive load's, or notes that do not say what the ranks met.
fn check(
    figures: &[Figures],
    attack: Option<Attack>,
    files: usize,
    expected: u64,
) -> Option<String> {
    for (r, f) in figures.iter().enumerate() {
        if let Some(e) = &f.error {
            return Some(format!("rank {r}: {e}"));
        }
        if f.digest != expected {
            return Some(format!(
                "rank {r}: sampled digest {:016x}, the naive load's {expected:016x}",
                f.digest
            ));
        }
        let fine = match attack {
            None => f.notes.iter().all(|n| n.starts_with("filled here")),
            // The late listener comes after rank 0 has looked.
            Some(Attack::Late) if r == 0 => true,
            Some(a) => f.notes.iter().all(|n| n.contains(&a.reason())),
        };
        if f.notes.len() != files || !fine {
            return Some(format!("rank {r}'s notes: {:?}", f.notes));
        }
    }
    None
}

/// What a run gives: each rank's figures, and (with no attacker) the key of
/// the copy, from the lock file's name while the ranks held it.
struct Outcome {
    figures: Vec<Figures>,
    key: Option<u64>,
}

/// Runs the victim's ranks once, with the attacker of `attack` if any.
fn run(
    victim: &Victim,
    attack: Option<Attack>,
    index: &Path,
    timeout: Duration,
) -> Result<Outcome, String> {
    let dir = victim.dir.path();
    let mut ranks = Vec::with_capacity(RANKS);
    for rank in 0..RANKS {
        let child = Child::new(RANK, index)
            .arg(dir)
            .arg(victim.uid.to_string())
            // Nothing of the caller's that would change what safeload does.
            .env_remove(safeload::ENV_VARIABLES)
            .env("LOCAL_RANK", rank.to_string())
            .env("LOCAL_WORLD_SIZE", RANKS.to_string())
            .env("TORCHELASTIC_RUN_ID", &victim.job)
            .timeout(timeout);
        ranks.push(child.start_held()?);
    }
    for rank in &mut ranks {
        rank.until("ready")?;
    }
    let attacker = match attack {
        Some(attack) => {
            let target = Target {
                attack,
                dir: dir.to_path_buf(),
                key: victim.key,
                victim: victim.uid,
            };
            Some(start_attacker(&target, &mut ranks)?)
        }
        None => {
            go(&mut ranks)?;
            None
        }
    };
    let mut figures = Vec::with_capacity(RANKS);
    for (r, rank) in ranks.iter_mut().enumerate() {
        let lines = rank.until("loaded").map_err(|e| format!("rank {r}: {e}"))?;
        let f: Figures = lines
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| format!("rank {r} printed no figures: {lines:?}"))?;
        figures.push(f);
    }
    let key = attacker::lock_key(dir, victim.uid);
    for (r, rank) in ranks.into_iter().enumerate() {
        rank.finish().map_err(|e| format!("rank {r}: {e}"))?;
    }
    if let Some(attacker) = attacker {
        let status = attacker
            .release()
            .map_err(|e| format!("the attacker: {e}"))?;
        if !status.success() {
            return Err(format!("the attacker: {status}"));
        }
    }
    Ok(Outcome { figures, key })
}

/// Starts the attacker of `target` and lets the ranks go once its names
/// are there: all together, or (the late listener) the first rank once the
/// attacker looks for its lock file, the others once it has bound.
fn start_attacker(target: &Target, ranks: &mut [Held]) -> Result<Attacker, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the benchmark's own path: {e}"))?;
    let mut command = Command::new(exe);
    command.args(["--child", ATTACKER]).arg(&target.dir);
    let mut attacker =
        Attacker::spawn(command, target).map_err(|e| format!("starting the attacker: {e}"))?;
    if target.attack == Attack::Late {
        attacker.watching()?;
        ranks[0].resume()?;
        attacker.planted()?;
        go(&mut ranks[1..])?;
    } else {
        attacker.planted()?;
        go(ranks)?;
    }
    Ok(attacker)
}

/// Lets the ranks go.
fn go(ranks: &mut [Held]) -> Result<(), String> {
    ranks.iter_mut().try_for_each(Held::resume)
}

/// The first three fields of `/proc/loadavg`: how busy the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

// ---------------------------------------------------------------- the table

fn markdown(samples: &[Sample], victims: &[Victim], rounds: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{RANKS} ranks, 16 MiB in 3 shards, buffered, cold; {rounds} rounds, arms shuffled; medians (min-max); {}\n",
        proc::machine()
    );
    let mut head = String::from("| attack (uid 65534) |");
    let mut rule = String::from("|---|");
    for v in victims {
        let _ = write!(
            head,
            " {0} ranks: slowest rank, s | {0}: x no attacker (same round) |",
            v.name()
        );
        rule.push_str("---|---|");
    }
    let _ = writeln!(out, "{head}\n{rule}");
    let ok = |victim: &str, arm: &str| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| s.victim == victim && s.arm == arm && s.error.is_none())
            .collect()
    };
    // Each run over the run with no attacker of the same victim and round.
    let ratios = |victim: &str, arm: &str| -> Vec<f64> {
        ok(victim, arm)
            .iter()
            .filter_map(|s| {
                let quiet = ok(victim, "none")
                    .into_iter()
                    .find(|q| q.round == s.round)?;
                Some(s.slowest / quiet.slowest)
            })
            .collect()
    };
    let arms = std::iter::once("none").chain(Attack::ALL.map(Attack::name));
    let mut worst: Option<(f64, String)> = None;
    for arm in arms {
        let _ = write!(out, "| {arm} |");
        for v in victims {
            let name = v.name();
            let runs = ok(&name, arm);
            let failed = samples
                .iter()
                .filter(|s| s.victim == name && s.arm == arm && s.error.is_some())
                .count();
            let slowest: Vec<f64> = runs.iter().map(|s| s.slowest).collect();
            let failed = match failed {
                0 => String::new(),
                n => format!(" ({n} failed)"),
            };
            let _ = write!(
                out,
                " {:.3}{failed} | {:.2} |",
                Spread::of(&slowest).unit(" s"),
                Spread::of(&ratios(&name, arm))
            );
            // How far past the same round's quiet run each attacked run ended.
            for s in runs.iter().filter(|_| arm != "none") {
                let quiet = ok(&name, "none").into_iter().find(|q| q.round == s.round);
                if let Some(q) = quiet {
                    let excess = s.slowest - q.slowest;
                    if worst.as_ref().is_none_or(|(w, _)| excess > *w) {
                        worst = Some((excess, format!("{arm}, {name}, round {}", s.round)));
                    }
                }
            }
        }
        out.push('\n');
    }
    let failed = samples.iter().filter(|s| s.error.is_some()).count();
    let (verdict, detail) = match &worst {
        Some((excess, run)) if failed == 0 => (
            if *excess <= PATIENCE { "met" } else { "MISSED" },
            format!("the largest excess {excess:+.3} s ({run})"),
        ),
        None if failed == 0 => ("MISSED", "no attacked run".to_string()),
        _ => ("MISSED", format!("{failed} run(s) failed")),
    };
    let _ = writeln!(
        out,
        "\nTarget: every attacked run ends within the patience ({PATIENCE} s) of the same round's run with no attacker, with the right bytes: {verdict}; {detail}"
    );
    out
}
