//! Hub errors as data: each way an `hf://` load fails is matched by its kind
//! (`Error::remote_failure`, `ErrorKind::BadAddress`), never by its text. The loads run in a
//! child (the variables are the process's), which prints the kind it matched as a code, the
//! error's path and `is_not_found()`; the parent asserts on those.

use std::path::Path;
use std::process::Stdio;

use safeload::hub::RemoveMode;
use safeload::{Checkpoint, Error, ErrorKind, Loader, RemoteFailure};
use safeload_testhttp::{DEFAULT_COMMIT, Options};

use super::{Hub, shard_name};
use crate::common::child::{PATH, child_command, run_role};

const MODULE: &str = module_path!();
/// Set in a child: open the checkpoint (`Checkpoint::open`) rather than load it.
const OPEN: &str = "SAFELOAD_TEST_ERRORS_OPEN";

#[test]
fn child() {
    run_role(&[("fail", act)]);
}

/// The kind of `e`, matched, as a code for the parent.
fn matched(e: &Error) -> &'static str {
    if let ErrorKind::BadAddress { .. } = e.kind() {
        return "bad_address";
    }
    match e.remote_failure() {
        Some(RemoteFailure::RepositoryNotFound) => "repository_not_found",
        Some(RemoteFailure::RevisionNotFound) => "revision_not_found",
        Some(RemoteFailure::FileNotFound) => "file_not_found",
        Some(RemoteFailure::Unauthorized) => "unauthorized",
        Some(RemoteFailure::Gated) => "gated",
        Some(RemoteFailure::OfflineNotCached) => "offline_not_cached",
        Some(RemoteFailure::Unreachable) => "unreachable",
        Some(_) => "another_remote_failure",
        None => "not_remote",
    }
}

/// Loads (or opens) `PATH`; prints `ERRORS-OK` with the load's commit and how many
/// `?with=` names the repository lacks, or the matched kind, path and `is_not_found()`.
fn act() {
    let url = std::env::var(PATH).unwrap();
    let outcome = if std::env::var_os(OPEN).is_some() {
        Checkpoint::open(&url).map(|_| "-".to_owned())
    } else {
        Loader::new().load(&url).map(|sd| {
            let report = sd.report();
            let lacking = report.extra_files.values().filter(|p| p.is_none()).count();
            format!("{} {lacking}", report.commit().unwrap_or("-"))
        })
    };
    match outcome {
        Ok(said) => println!("ERRORS-OK {said}"),
        Err(e) => {
            let path = e.path().map_or("-".into(), |p| p.display().to_string());
            println!("ERRORS-KIND {}", matched(&e));
            println!("ERRORS-PATH {path}");
            println!("ERRORS-NOT-FOUND {}", e.is_not_found());
            eprintln!("the child's error: {e}");
        }
    }
}

/// What a child's load came to.
#[derive(Debug, Default)]
struct Outcome {
    /// `ERRORS-OK`'s words, where it loaded.
    ok: Option<String>,
    kind: String,
    path: String,
    not_found: bool,
}

/// Runs a child that loads `url` against `hub` (its server and cache) with `vars` on top.
fn outcome_of(hub: &Hub, url: &str, vars: &[(&'static str, String)]) -> Outcome {
    let mut all = hub.vars();
    all.extend(vars.iter().cloned());
    run(url, &all)
}

/// Runs a child that loads `url` with `vars` and nothing of the caller's store or cache
/// variables; returns what it printed.
fn run(url: &str, vars: &[(&'static str, String)]) -> Outcome {
    let mut cmd = child_command(MODULE, "fail", Path::new(url));
    for var in safeload_testhttp::STORE_VARIABLES {
        cmd.env_remove(var);
    }
    // No token file of a real user is read.
    cmd.env("HF_HOME", std::env::temp_dir().join("safeload-no-hf-home"));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.stderr(Stdio::piped()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE fail"),
        "{url}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut outcome = Outcome::default();
    for line in stdout.lines() {
        let field = |tag: &str| line.split_once(tag).map(|(_, v)| v.to_owned());
        if let Some(v) = field("ERRORS-OK ") {
            outcome.ok = Some(v);
        } else if let Some(v) = field("ERRORS-KIND ") {
            outcome.kind = v;
        } else if let Some(v) = field("ERRORS-PATH ") {
            outcome.path = v;
        } else if let Some(v) = field("ERRORS-NOT-FOUND ") {
            outcome.not_found = v == "true";
        }
    }
    outcome
}

/// The kind a failed load matched, and whether it was "not found".
fn failed(outcome: &Outcome) -> (&str, bool) {
    assert!(outcome.ok.is_none(), "loaded: {outcome:?}");
    (outcome.kind.as_str(), outcome.not_found)
}

fn cache_off() -> (&'static str, String) {
    ("SAFELOAD_HUB_CACHE", "0".to_owned())
}

#[test]
fn a_repository_the_hub_does_not_have_is_repository_not_found() {
    let hub = Hub::new(Options {
        repositories: Some(vec!["org/model".to_owned()]),
        ..Options::default()
    });
    for vars in [vec![], vec![cache_off()]] {
        let out = outcome_of(&hub, "hf://org/nothing", &vars);
        assert_eq!(failed(&out), ("repository_not_found", true), "{vars:?}");
        assert!(out.path.starts_with("hf://org/nothing"), "{out:?}");
    }
    let loaded = outcome_of(&hub, "hf://org/model", &[]);
    assert_eq!(loaded.ok, Some(format!("{DEFAULT_COMMIT} 0")));
}

#[test]
fn a_revision_the_repository_does_not_have_is_revision_not_found() {
    let hub = Hub::new(Options::default());
    for vars in [vec![], vec![cache_off()]] {
        let out = outcome_of(&hub, "hf://org/model@no-such-branch", &vars);
        assert_eq!(failed(&out), ("revision_not_found", true), "{vars:?}");
        assert!(out.path.starts_with("hf://org/model@no-such-branch"));
    }
}

#[test]
fn a_shard_the_index_names_that_is_missing_is_file_not_found_and_a_missing_extra_is_none() {
    let hub = Hub::new(Options::default());
    // A name `?with=` asks for that the repository lacks: no error, `None`.
    let loaded = outcome_of(&hub, "hf://org/model?with=config.json,no-such.json", &[]);
    assert_eq!(loaded.ok, Some(format!("{DEFAULT_COMMIT} 1")));
    // A shard the index names is not in the repository.
    let broken = Hub::new(Options::default());
    let gone = shard_name(1, 3);
    std::fs::remove_file(broken.files.path().join(&gone)).unwrap();
    for vars in [vec![], vec![cache_off()]] {
        let out = outcome_of(&broken, "hf://org/model", &vars);
        assert_eq!(failed(&out), ("file_not_found", true), "{vars:?}");
        assert!(out.path.ends_with(&gone), "{out:?}");
    }
}

#[test]
fn a_refused_token_is_unauthorized_and_a_gated_repository_is_gated() {
    for gated in [false, true] {
        let hub = Hub::new(Options {
            token: Some("hf_right".to_owned()),
            gated,
            ..Options::default()
        });
        let want = if gated { "gated" } else { "unauthorized" };
        // 401 without a token, 403 with another one.
        for token in [None, Some("hf_wrong")] {
            let vars: Vec<_> = token
                .map(|t| ("HF_TOKEN", t.to_owned()))
                .into_iter()
                .collect();
            let out = outcome_of(&hub, "hf://org/model", &vars);
            assert_eq!(failed(&out), (want, false), "{token:?}");
        }
        let right = [("HF_TOKEN", "hf_right".to_owned())];
        let loaded = outcome_of(&hub, "hf://org/model", &right);
        assert_eq!(
            loaded.ok,
            Some(format!("{DEFAULT_COMMIT} 0")),
            "gated {gated}"
        );
    }
}

#[test]
fn offline_with_an_empty_cache_is_offline_not_cached() {
    let hub = Hub::new(Options::default());
    let offline = [("HF_HUB_OFFLINE", "1".to_owned())];
    // A branch (no ref cached) and a commit (no snapshot cached).
    for url in [
        "hf://org/model",
        &format!("hf://org/model@{DEFAULT_COMMIT}"),
    ] {
        let out = outcome_of(&hub, url, &offline);
        assert_eq!(failed(&out), ("offline_not_cached", true), "{url}");
    }
    assert_eq!(hub.server.stats().requests, 0, "offline asks nothing");
}

#[test]
fn a_hub_that_cannot_be_reached_is_unreachable() {
    // Nothing listens on the port: the connection is refused.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let cache = tempfile::tempdir().unwrap();
    let vars = [
        ("HF_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("HF_HUB_CACHE", cache.path().display().to_string()),
    ];
    let out = run("hf://org/model", &vars);
    assert_eq!(failed(&out), ("unreachable", false));
    // A hub that takes the connection and never answers: past the deadline, twice.
    let hub = Hub::new(Options {
        silent_heads: true,
        ..Options::default()
    });
    let start = std::time::Instant::now();
    let stall = [("SAFELOAD_REMOTE_STALL_SECS", "1".to_owned())];
    let out = outcome_of(&hub, "hf://org/model", &stall);
    assert_eq!(failed(&out), ("unreachable", false));
    assert!(start.elapsed().as_secs() < 30, "{:?}", start.elapsed());
    assert!(hub.server.stats().unanswered >= 2);
    // Where the cache has the revision's ref, either hub is taken as offline: it loads.
    let warm = Hub::new(Options::default());
    let loaded = outcome_of(&warm, "hf://org/model", &[]);
    assert_eq!(loaded.ok, Some(format!("{DEFAULT_COMMIT} 0")));
    for endpoint in [format!("http://127.0.0.1:{port}"), hub.server.url()] {
        let vars = [("HF_ENDPOINT", endpoint), stall[0].clone()];
        let loaded = outcome_of(&warm, "hf://org/model", &vars);
        assert_eq!(loaded.ok, Some(format!("{DEFAULT_COMMIT} 0")), "{vars:?}");
    }
}

#[test]
fn a_bad_address_is_one_kind_naming_it_wherever_it_is_met() {
    let hub = Hub::new(Options::default());
    for url in [
        "hf://acme/bad--name",
        "hf://a/b/../c",
        "hf://org/model@refs%2F..%2F..%2Fx",
        "hf://org/model?with=../../etc/passwd",
    ] {
        for open in [false, true] {
            let mut vars = Vec::new();
            if open {
                vars.push((OPEN, "1".to_owned()));
            }
            let out = outcome_of(&hub, url, &vars);
            assert_eq!(failed(&out), ("bad_address", false), "{url} open {open}");
            assert_eq!(out.path, url, "{url} open {open}");
        }
    }
    assert_eq!(hub.server.stats().requests, 0, "refused before any request");
    // The hub cache's housekeeping, in this process: the same kind, the address it names.
    for (repo, revision, address) in [
        ("acme/bad--name", None, "hf://acme/bad--name"),
        (
            "org/model",
            Some("refs/../../x"),
            "hf://org/model@refs/../../x",
        ),
    ] {
        let e = safeload::hub::hub_cache_remove(repo, revision, RemoveMode::DryRun).unwrap_err();
        assert_eq!(matched(&e), "bad_address", "{e}");
        assert_eq!(e.path(), Some(Path::new(address)));
    }
    let e = safeload::hub::hub_cache_prune(Some("acme/bad--name"), RemoveMode::DryRun).unwrap_err();
    assert_eq!(matched(&e), "bad_address", "{e}");
    assert_eq!(e.path(), Some(Path::new("hf://acme/bad--name")));
}
