//! The remote benchmark's hub cache arms (issue 34): the cache each arm is given, made or
//! emptied of the page cache before it, synced and removed after it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::child::Child;
use crate::common::data;
use crate::{Figures, Options, REPO, Served, Target};

/// What an arm is given beyond the served checkpoint's variables.
#[derive(Default)]
pub struct Prepared {
    pub env: Vec<(&'static str, String)>,
    /// `cache-resume`: the bytes the server had sent when the first load was killed.
    pub killed_at: Option<u64>,
    /// A cache made for this run: synced and removed after it.
    fresh: Option<tempfile::TempDir>,
}

/// The snapshot of the checkpoint in the hub cache `cache`.
fn snapshot_of(cache: &Path) -> PathBuf {
    cache
        .join(format!("models--{}", REPO.replace('/', "--")))
        .join("snapshots")
        .join(safeload_testhttp::DEFAULT_COMMIT)
}

/// The hub cache `filled` holds the snapshot of, from the snapshot.
fn cache_of(snapshot: &Path) -> Option<&Path> {
    snapshot.parent()?.parent()?.parent()
}

/// A hub cache holding the checkpoint (filled once, by a cold load in a child, and kept
/// under `--dir`): its snapshot.
pub fn filled(
    o: &Options,
    root: &Path,
    target: &Target,
    env: &[(&'static str, String)],
) -> Result<PathBuf, String> {
    let name = root.file_name().and_then(|n| n.to_str()).unwrap_or("ckpt");
    let cache = o.dir.join(format!("hub-cache-{name}"));
    let snapshot = snapshot_of(&cache);
    let whole = |snapshot: &Path| {
        target.files.iter().all(|(file, len)| {
            std::fs::metadata(snapshot.join(file)).is_ok_and(|m| m.len() == *len)
        })
    };
    if whole(&snapshot) {
        return Ok(snapshot);
    }
    let json = serde_json::to_string(target).map_err(|e| e.to_string())?;
    let mut child = Child::new("cache-cold", root)
        .arg(json)
        .env_remove(safeload::ENV_VARIABLES)
        .env_remove(&safeload_testhttp::STORE_VARIABLES)
        .timeout(Duration::from_secs(o.timeout));
    for (key, value) in env.iter().chain(&cache_env(&cache)) {
        child = child.env(key, value);
    }
    let out = child.run::<Figures>()?;
    if let Some(e) = out.figures.error {
        return Err(format!("filling the hub cache: {e}"));
    }
    if !whole(&snapshot) {
        return Err(format!("{} is not whole after a load", snapshot.display()));
    }
    eprintln!("hub cache filled at {}", cache.display());
    Ok(snapshot)
}

/// The variables of a load through the hub cache `cache`.
fn cache_env(cache: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("SAFELOAD_HUB_CACHE", "1".to_owned()),
        ("HF_HUB_CACHE", cache.display().to_string()),
    ]
}

/// What `arm` is given: a new, empty hub cache (`cache-cold`), the filled one with its
/// blobs dropped from the page cache (`cache-warm`), or those blobs alone dropped
/// (`local`).
pub fn prepare(o: &Options, served: &Served, arm: &str) -> Result<Prepared, String> {
    let snapshot = served.target.snapshot.as_deref();
    match arm {
        "cache-cold" | "cache-resume" | "cache-ranks" => {
            let fresh = tempfile::Builder::new()
                .prefix("hub-cache-cold-")
                .tempdir_in(&o.dir)
                .map_err(|e| format!("a cache under {}: {e}", o.dir.display()))?;
            let mut env = cache_env(fresh.path());
            if arm == "cache-ranks" {
                env.push(("LOCAL_WORLD_SIZE", crate::RANKS.to_string()));
                let job = fresh
                    .path()
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("job");
                env.push(("TORCHELASTIC_RUN_ID", format!("safeload-bench-{job}")));
            }
            let killed_at = match arm {
                "cache-resume" => Some(kill_half_way(o, served, &env)?),
                _ => None,
            };
            Ok(Prepared {
                env,
                killed_at,
                fresh: Some(fresh),
            })
        }
        "cache-warm" | "local" => {
            let snapshot = snapshot.ok_or("no filled hub cache")?;
            data::evict(&[snapshot])?;
            let env = match arm {
                "cache-warm" => cache_env(cache_of(snapshot).ok_or("no cache")?),
                _ => Vec::new(),
            };
            Ok(Prepared {
                env,
                killed_at: None,
                fresh: None,
            })
        }
        _ => Ok(Prepared::default()),
    }
}

/// `cache-resume`'s first load: a cold load through the cache `env` names, killed
/// (SIGKILL) once the server has sent half the checkpoint; the bytes sent by then.
fn kill_half_way(
    o: &Options,
    served: &Served,
    env: &[(&'static str, String)],
) -> Result<u64, String> {
    let json = serde_json::to_string(&served.target).map_err(|e| e.to_string())?;
    let mut child = Child::new("cache-cold", &served.root)
        .arg(json)
        .env_remove(safeload::ENV_VARIABLES)
        .env_remove(&safeload_testhttp::STORE_VARIABLES)
        .timeout(Duration::from_secs(o.timeout));
    for (key, value) in served.env.iter().chain(env) {
        child = child.env(key, value);
    }
    served.server.reset();
    let held = child.start_held()?;
    let deadline = Instant::now() + Duration::from_secs(o.timeout);
    let sent = || served.server.traffic(&served.target.files).bytes;
    while sent() < served.total / 2 {
        if Instant::now() > deadline {
            return Err("the first load did not get half way".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Dropped: killed, and waited for.
    drop(held);
    Ok(sent())
}

/// The blobs published in the hub cache an arm was given (none for a kept cache): what
/// the arm's loads left checked and published once their processes ended.
pub fn published(prepared: &Prepared) -> Option<usize> {
    let fresh = prepared.fresh.as_ref()?;
    let blobs = fresh
        .path()
        .join(format!("models--{}", REPO.replace('/', "--")))
        .join("blobs");
    let names = std::fs::read_dir(blobs).ok()?;
    Some(
        names
            .filter_map(Result::ok)
            .filter(|e| !e.file_name().to_string_lossy().contains('.'))
            .count(),
    )
}

/// After an arm: a cache made for it synced (the seconds it took: the writeback the load
/// left to the kernel, so that the next arm does not pay for it) and removed.
pub fn finish(prepared: &Prepared) -> Option<f64> {
    let fresh = prepared.fresh.as_ref()?;
    let start = Instant::now();
    let dir = std::fs::File::open(fresh.path()).ok()?;
    // SAFETY: `syncfs` takes a descriptor, which `dir` keeps open across the call.
    let synced = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } == 0;
    let seconds = start.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(fresh.path());
    synced.then_some(seconds)
}
