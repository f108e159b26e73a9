//! The contract of every public way to get bytes, over every source and mode: a tensor
//! is exactly its `nbytes`, and those bytes are the `safetensors` crate's own (or the
//! naive slice or conversion of them), whatever buffer, map, cache or server they came
//! through.
//!
//! Written once and run against each source, as one suite runs against every backend:
//! [`SOURCES`] is the table, a line per source (how it serves a checkpoint, the mode's
//! loader, what a load's report must say so that the line tests what it names), and each
//! line is a test of its own (`contract::buffered`, `contract::hf_cache_hit`). The APIs
//! are `apis.rs`'s list; the checkpoints and the naive twins `case.rs`'s. A new source or
//! mode is one line here; a new way to get bytes one entry there.
//!
//! Each source runs a fixed case (every size of `case::SIZES`, a BERT-like F32 weight,
//! a 3 MiB F16 one) and `SAFELOAD_CONTRACT_CASES` random ones (default 2) drawn by
//! proptest: 1 to 5 tensors of any dtype, sized around 4 KiB and 2 MiB, odd element
//! counts, 1 to 4 files, tensors asked for out of file order. Sources that need the
//! process's environment (`HF_ENDPOINT`, `AWS_*`) or several local ranks run the APIs in
//! children of this test binary. A source whose server or mount is missing skips itself
//! loudly (a failure under `SAFELOAD_REQUIRE_FUSE=1` / `SAFELOAD_REQUIRE_MOTO=1`).

mod apis;
pub mod case;
mod sources;

use std::path::Path;
use std::process::Stdio;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, TestRunner};
use safeload::Loader;
use safeload::report::LoadReport;

use crate::common::child::{PATH, child_command, run_role};
use apis::{Ctx, check_all};
use case::{Case, Reference, arb_case, corner_case};
use sources::Served;

const MODULE: &str = module_path!();

/// One line of the table.
pub struct Source {
    pub name: &'static str,
    /// Makes a checkpoint's directory reachable; `None` where this machine cannot (skipped,
    /// loudly).
    pub serve: fn(&Path) -> Option<Served>,
    /// The loader of the mode.
    pub loader: fn() -> Loader,
    /// What the first whole load's report must say.
    pub expect: fn(&LoadReport) -> Result<(), String>,
}

/// The table, and a test per line.
macro_rules! sources {
    ($($(#[$attr:meta])* $name:ident: $serve:ident, $loader:ident, $expect:ident;)*) => {
        /// Every source and mode, in the table's order.
        pub const SOURCES: &[Source] = &[$(
            $(#[$attr])*
            Source {
                name: stringify!($name),
                serve: sources::$serve,
                loader: sources::$loader,
                expect: sources::$expect,
            },
        )*];

        $(
            $(#[$attr])*
            #[test]
            fn $name() {
                run(stringify!($name));
            }
        )*
    };
}

sources! {
    mapped: local, mapped, is_mapped;
    buffered: local, buffered, is_buffered;
    buffered_direct: local, buffered_direct, is_direct;
    huge_pages_on: local, huge_pages_on, is_huge_on;
    huge_pages_off: local, huge_pages_off, is_huge_off;
    fuse: fuse, auto, is_fuse;
    node_copy: node_copy, buffered, is_node_copy;
    #[cfg(feature = "remote")]
    http: http, auto, is_remote;
    #[cfg(feature = "remote")]
    hf: hf, hub_cache_off, is_remote;
    #[cfg(feature = "remote")]
    hf_cache_miss: hf_cache_miss, auto, is_cache_written;
    #[cfg(feature = "remote")]
    hf_cache_resumed: hf_cache_resumed, auto, is_cache_resumed;
    #[cfg(feature = "remote")]
    hf_cache_complete: hf_cache_complete, auto, is_cache_resumed;
    #[cfg(feature = "remote")]
    hf_cache_hit: hf_cache_hit, auto, is_cache_hit;
    #[cfg(feature = "remote")]
    s3_cache_miss: s3_cache_miss, auto, is_cache_written;
    #[cfg(feature = "remote")]
    s3_cache_hit: s3_cache_hit, auto, is_cache_hit;
}

/// The fixed case, then the random ones.
fn cases() -> Vec<Case> {
    let random = std::env::var("SAFELOAD_CONTRACT_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let mut runner = TestRunner::new(Config {
        failure_persistence: None,
        ..Config::default()
    });
    let strategy = arb_case();
    let mut cases = vec![corner_case()];
    for _ in 0..random {
        cases.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    cases
}

fn run(name: &str) {
    let source = SOURCES.iter().find(|s| s.name == name).unwrap();
    let mut failures = Vec::new();
    for (i, case) in cases().iter().enumerate() {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        case.write(dir.path());
        let Some(served) = (source.serve)(dir.path()) else {
            eprintln!("contract::{name}: SKIPPED (its server or mount is missing here)");
            return;
        };
        let lines = if served.env.is_empty() && served.ranks == 1 {
            in_process(source, &served, dir.path(), case.seed)
        } else {
            in_children(source, &served, dir.path(), case.seed)
        };
        if !lines.is_empty() {
            failures.push(format!("case {i}: {case:?}"));
            failures.extend(lines.into_iter().map(|l| format!("  {l}")));
        }
    }
    assert!(
        failures.is_empty(),
        "contract::{name}: {} line(s)\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn in_process(source: &Source, served: &Served, dir: &Path, seed: u64) -> Vec<String> {
    let reference = Reference::of_dir(dir);
    if served.warm {
        (source.loader)().load(&served.address).unwrap();
    }
    check_all(&Ctx {
        address: &served.address,
        loader: source.loader,
        reference: &reference,
        seed,
        expect: source.expect,
        fresh_cache: served.fresh_cache.as_deref(),
        plant_from: served.plant.map(|every| (dir, every)),
    })
}

// ---------------------------------------------------------------------------
// In children: the source's environment, or one child per local rank.

const SOURCE: &str = "SAFELOAD_TEST_CONTRACT_SOURCE";
const DIR: &str = "SAFELOAD_TEST_CONTRACT_DIR";
const SEED: &str = "SAFELOAD_TEST_CONTRACT_SEED";
const FRESH: &str = "SAFELOAD_TEST_CONTRACT_FRESH";
const WARM: &str = "SAFELOAD_TEST_CONTRACT_WARM";
const PLANT: &str = "SAFELOAD_TEST_CONTRACT_PLANT";

/// Not a test of its own: the entry point of child processes (see `common::child`).
#[test]
fn child() {
    run_role(&[("contract", act_contract)]);
}

/// Runs every API on the source named by `SOURCE`; prints a `CONTRACT-FAIL` line per
/// failure.
fn act_contract() {
    let var = |name: &str| std::env::var(name).ok();
    let name = var(SOURCE).unwrap();
    let source = SOURCES.iter().find(|s| s.name == name).unwrap();
    let address = var(PATH).unwrap();
    let reference = Reference::of_dir(Path::new(&var(DIR).unwrap()));
    if var(WARM).is_some() {
        (source.loader)().load(&address).unwrap();
    }
    let fresh = var(FRESH).map(std::path::PathBuf::from);
    let dir = std::path::PathBuf::from(var(DIR).unwrap());
    let failures = check_all(&Ctx {
        address: &address,
        loader: source.loader,
        reference: &reference,
        seed: var(SEED).unwrap().parse().unwrap(),
        expect: source.expect,
        fresh_cache: fresh.as_deref(),
        plant_from: var(PLANT)
            .and_then(|every| every.parse().ok())
            .map(|every| (dir.as_path(), every)),
    });
    for line in failures {
        println!("CONTRACT-FAIL {line}");
    }
}

fn in_children(source: &Source, served: &Served, dir: &Path, seed: u64) -> Vec<String> {
    let children: Vec<_> = (0..served.ranks)
        .map(|rank| {
            let mut cmd = child_command(MODULE, "contract", Path::new(&served.address));
            for var in safeload_testhttp::STORE_VARIABLES {
                cmd.env_remove(var);
            }
            cmd.env(SOURCE, source.name)
                .env(DIR, dir)
                .env(SEED, seed.to_string())
                .stderr(Stdio::piped());
            if let Some(fresh) = &served.fresh_cache {
                cmd.env(FRESH, fresh);
            }
            if served.warm {
                cmd.env(WARM, "1");
            }
            if let Some(every) = served.plant {
                cmd.env(PLANT, every.to_string());
            }
            if served.ranks > 1 {
                cmd.env("LOCAL_RANK", rank.to_string())
                    .env("LOCAL_WORLD_SIZE", served.ranks.to_string());
            }
            for (k, v) in &served.env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let mut lines = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let who = if served.ranks > 1 {
            format!("rank {rank}: ")
        } else {
            String::new()
        };
        lines.extend(stdout.lines().filter_map(|l| {
            l.split_once("CONTRACT-FAIL ")
                .map(|(_, f)| format!("{who}{f}"))
        }));
        if !(out.status.success() && stdout.contains("CHILD-DONE contract")) {
            lines.push(format!(
                "{who}the child ended {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    lines
}
