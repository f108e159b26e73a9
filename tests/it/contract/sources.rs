//! Where a checkpoint's files are served from, for the contract: the local disk, the FUSE
//! test filesystem, the test HTTP server as a plain server and as the hub, `moto_server`
//! as S3; and what a load's report must say for each, so that an entry tests what it is
//! named after.

use std::any::Any;
use std::path::{Path, PathBuf};

use safeload::report::{DirectIo, LoadReport, NodeCopy, Strategy};
use safeload::{HugePages, Loader};

/// A checkpoint made reachable for one source: where it is, what the loads need of the
/// process, and what must live while they run.
pub struct Served {
    pub address: String,
    /// The process environment of the loads (a child's, where not empty).
    pub env: Vec<(&'static str, String)>,
    /// Local ranks of one job loading at once, each a child (1: no node copy).
    pub ranks: usize,
    /// A cache emptied before each API (each a miss).
    pub fresh_cache: Option<PathBuf>,
    /// Load once before the APIs (a cache then hit by each).
    pub warm: bool,
    /// After the cache is emptied, put the files in it as partial files an interrupted
    /// load left (each then resumed), every `n`th 1 MiB piece of them kept and recorded.
    pub plant: Option<usize>,
    pub keep: Vec<Box<dyn Any>>,
}

impl Served {
    fn at(address: impl Into<String>) -> Served {
        Served {
            address: address.into(),
            env: Vec::new(),
            ranks: 1,
            fresh_cache: None,
            warm: false,
            plant: None,
            keep: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------
// Serving.

pub fn local(dir: &Path) -> Option<Served> {
    Some(Served::at(dir.display().to_string()))
}

/// The hf-mount-like FUSE mount of the test filesystem (every read reaches the daemon).
pub fn fuse(dir: &Path) -> Option<Served> {
    if safeload_testfs::skip_without_fuse() {
        return None;
    }
    let options = safeload_testfs::Options {
        fsname: "hf-mount".into(),
        direct_io: true,
        ..safeload_testfs::Options::default()
    };
    let mount = safeload_testfs::Mount::new(dir, options).unwrap();
    let mut served = Served::at(mount.path().display().to_string());
    served.keep.push(Box::new(mount));
    Some(served)
}

/// Two local ranks of one job, each a child process, sharing node copies of the files.
pub fn node_copy(dir: &Path) -> Option<Served> {
    static JOBS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let job = format!(
        "safeload-contract-{}-{}",
        std::process::id(),
        JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut served = Served::at(dir.display().to_string());
    served.ranks = 2;
    served.env.push(("SAFELOAD_JOB_ID", job));
    Some(served)
}

#[cfg(feature = "remote")]
mod remote {
    use safeload_testhttp::moto::Moto;
    use safeload_testhttp::{Options, Server};

    use super::*;

    pub fn http(dir: &Path) -> Option<Served> {
        let server = Server::start(dir, Options::default()).unwrap();
        let mut served = Served::at(format!("{}/", server.url()));
        served.keep.push(Box::new(server));
        Some(served)
    }

    /// The test server as the hub, and an empty hub cache (`HF_HUB_CACHE`).
    fn hub(dir: &Path) -> Served {
        let server = Server::start(dir, Options::default()).unwrap();
        let cache = tempfile::tempdir().unwrap();
        let mut served = Served::at("hf://org/model");
        served.env = vec![
            ("HF_ENDPOINT", server.url()),
            ("HF_HUB_CACHE", cache.path().display().to_string()),
            // No token file of a real user is read.
            ("HF_HOME", cache.path().join("home").display().to_string()),
        ];
        served.keep.push(Box::new(server));
        served.keep.push(Box::new(cache));
        served
    }

    pub fn hf(dir: &Path) -> Option<Served> {
        Some(hub(dir))
    }

    pub fn hf_cache_miss(dir: &Path) -> Option<Served> {
        let mut served = hub(dir);
        served.fresh_cache = Some(PathBuf::from(&served.env[1].1));
        Some(served)
    }

    /// The hub cache emptied before each API, then holding every file as an interrupted
    /// load leaves it: a partial file with every other 1 MiB piece kept and recorded.
    pub fn hf_cache_resumed(dir: &Path) -> Option<Served> {
        let mut served = hf_cache_miss(dir)?;
        served.plant = Some(2);
        Some(served)
    }

    /// The same with every piece kept and recorded: files a load wrote whole and was
    /// killed while checking, each read from the cache's file, none fetched.
    pub fn hf_cache_complete(dir: &Path) -> Option<Served> {
        let mut served = hf_cache_miss(dir)?;
        served.plant = Some(1);
        Some(served)
    }

    /// Puts each `.safetensors` file of `dir` in the hub cache at `cache` as an
    /// interrupted load leaves it (`src/cache/partial.rs`'s format, written here on its
    /// own): `blobs/<sha256>.safeload-partial` holding every `every`th piece (the others
    /// zero), and its record listing them.
    pub fn plant_partials(cache: &Path, dir: &Path, every: usize) {
        use sha2::{Digest, Sha256};
        const PIECE: usize = 1 << 20;
        let blobs = cache.join("models--org--model").join("blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "safetensors") {
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let blob: String = Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let mut partial = bytes.clone();
            let mut record = b"SLPARTv1".to_vec();
            record.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            record.extend_from_slice(&(PIECE as u64).to_le_bytes());
            for (i, piece) in partial.chunks_mut(PIECE).enumerate() {
                if i % every == 0 {
                    record.extend_from_slice(&(i as u64).to_le_bytes());
                    record.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(piece).to_le_bytes());
                } else {
                    piece.fill(0);
                }
            }
            std::fs::write(blobs.join(format!("{blob}.safeload-partial")), &partial).unwrap();
            std::fs::write(blobs.join(format!("{blob}.safeload-pieces")), &record).unwrap();
        }
    }

    pub fn hf_cache_hit(dir: &Path) -> Option<Served> {
        let mut served = hub(dir);
        served.warm = true;
        Some(served)
    }

    /// `moto_server` holding the files under `s3://models/case/`, and an empty cache
    /// directory (`SAFELOAD_CACHE_DIR`).
    fn s3(dir: &Path) -> Option<Served> {
        let moto = Moto::start()?;
        moto.create_bucket("models").unwrap();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            moto.put(
                "models",
                &format!("case/{name}"),
                &std::fs::read(&path).unwrap(),
            )
            .unwrap();
        }
        let cache = tempfile::tempdir().unwrap();
        let mut served = Served::at("s3://models/case");
        served.env = moto.s3_vars();
        served
            .env
            .push(("SAFELOAD_CACHE_DIR", cache.path().display().to_string()));
        served.keep.push(Box::new(moto));
        served.keep.push(Box::new(cache));
        Some(served)
    }

    pub fn s3_cache_miss(dir: &Path) -> Option<Served> {
        let mut served = s3(dir)?;
        let cache = served.env.last().unwrap().1.clone();
        served.fresh_cache = Some(PathBuf::from(cache));
        Some(served)
    }

    pub fn s3_cache_hit(dir: &Path) -> Option<Served> {
        let mut served = s3(dir)?;
        served.warm = true;
        Some(served)
    }
}

#[cfg(feature = "remote")]
pub use remote::*;

// ---------------------------------------------------------------------------
// Loaders.

pub fn auto() -> Loader {
    Loader::new()
}

pub fn mapped() -> Loader {
    Loader::new().disable_mmap(false)
}

pub fn buffered() -> Loader {
    Loader::new().disable_mmap(true).direct_io(false)
}

pub fn buffered_direct() -> Loader {
    Loader::new().disable_mmap(true).direct_io(true)
}

pub fn huge_pages_on() -> Loader {
    buffered().huge_pages(HugePages::On)
}

pub fn huge_pages_off() -> Loader {
    buffered().huge_pages(HugePages::Off)
}

#[cfg(feature = "remote")]
pub fn hub_cache_off() -> Loader {
    Loader::new().hub_cache(false)
}

// ---------------------------------------------------------------------------
// What a whole load's report says of each source.

fn every(
    report: &LoadReport,
    what: &str,
    ok: impl Fn(&safeload::report::FileReport) -> bool,
) -> Result<(), String> {
    match report.files.iter().find(|f| !ok(f)) {
        Some(f) => Err(format!("{}: not {what}: {f:?}", f.path.display())),
        None => Ok(()),
    }
}

pub fn is_mapped(report: &LoadReport) -> Result<(), String> {
    every(report, "mapped", |f| f.strategy == Strategy::Mmap)
}

pub fn is_buffered(report: &LoadReport) -> Result<(), String> {
    every(report, "buffered", |f| f.strategy == Strategy::Buffered)
}

/// Buffered, and direct I/O used wherever the file is laid out for it.
pub fn is_direct(report: &LoadReport) -> Result<(), String> {
    is_buffered(report)?;
    if report.files.iter().any(|f| f.direct_io == DirectIo::On) {
        Ok(())
    } else {
        Err(format!("no file read with direct I/O: {report:?}"))
    }
}

fn pages(report: &LoadReport, mode: HugePages) -> Result<(), String> {
    is_buffered(report)?;
    match &report.fresh_memory {
        Some(fresh) if fresh.mode == mode && (mode != HugePages::Off || fresh.huge_bytes == 0) => {
            Ok(())
        }
        None if report.tensor_bytes() == 0 => Ok(()),
        other => Err(format!(
            "fresh memory {other:?} where huge pages are {mode:?}"
        )),
    }
}

pub fn is_huge_on(report: &LoadReport) -> Result<(), String> {
    pages(report, HugePages::On)
}

pub fn is_huge_off(report: &LoadReport) -> Result<(), String> {
    pages(report, HugePages::Off)
}

/// Buffered from a FUSE mount.
pub fn is_fuse(report: &LoadReport) -> Result<(), String> {
    is_buffered(report)?;
    every(report, "on FUSE", |f| {
        f.mount.as_ref().is_some_and(|m| m.kind.is_fuse_like())
    })
}

/// Every file with tensors in a node copy shared by the ranks.
pub fn is_node_copy(report: &LoadReport) -> Result<(), String> {
    every(report, "in a shared node copy", |f| {
        f.tensors == 0 || matches!(f.node_copy, Some(NodeCopy::Shared { .. }))
    })
}

#[cfg(feature = "remote")]
pub fn is_remote(report: &LoadReport) -> Result<(), String> {
    every(report, "read remotely", |f| {
        f.strategy == Strategy::Buffered && f.reason == safeload::report::Reason::Remote
    })
}

#[cfg(feature = "remote")]
fn cache(report: &LoadReport, code: &str) -> Result<(), String> {
    every(report, code, |f| {
        f.cache.as_ref().is_some_and(|c| c.as_str() == code)
    })
}

#[cfg(feature = "remote")]
pub fn is_cache_written(report: &LoadReport) -> Result<(), String> {
    // `checking`: every byte written, its digest checked after the load returned.
    every(report, "written", |f| {
        f.cache
            .as_ref()
            .is_some_and(|c| matches!(c.as_str(), "written" | "checking"))
    })
}

/// Every file written to the cache, some of it resumed from what an interrupted load left.
#[cfg(feature = "remote")]
pub fn is_cache_resumed(report: &LoadReport) -> Result<(), String> {
    every(report, "written, resumed", |f| {
        matches!(
            f.cache,
            Some(
                safeload::report::CacheUse::Written { resumed, .. }
                    | safeload::report::CacheUse::Checking { resumed, .. }
            ) if resumed > 0
        )
    })
}

#[cfg(feature = "remote")]
pub fn is_cache_hit(report: &LoadReport) -> Result<(), String> {
    cache(report, "hit")
}
