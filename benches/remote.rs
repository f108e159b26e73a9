//! `cargo bench --features remote --bench remote`: a checkpoint loaded from a remote server
//! against the server's limit and against downloading it first (issue 26's targets).
//!
//! The parent serves the load benchmark's checkpoint (`bench-data/ckpt-{MiB}mib-{shards}-v2`,
//! written once and kept) with the crate's test HTTP server (`safeload-testhttp`): 20 ms per
//! request, one 1,500 MiB/s link shared by every connection, by default. Each arm runs in a
//! child process of its own (this binary again) that is given the server's URL; arms are
//! interleaved in an order shuffled each round (`common::shuffled`: rotated, the arm after
//! `fresh-memory` was the slowest in every round, whichever it was: `safeload` 4.19 s against
//! `safeload-http` 2.50 s, and 2.10 s against 2.80 s with the two swapped), and the server's
//! counters are zeroed before each. `--settle-secs N` rests N seconds before each arm: on
//! the development VM, memory freed long enough is handed back to the host, and every arm
//! that faults in fresh memory then pays more (5 s: the loads 3.8-5.1 s, `fresh-memory`
//! 1.08 s, the limit unchanged).
//!
//! - `limit`: the server's limit, a raw client of the benchmark's own
//!   (`common/http_client.rs`, driven by `common/remote_fetch.rs`): 32 ranged GETs of
//!   16 MiB in flight, one kept-alive connection each, every byte of every file read into
//!   reused buffers and dropped; `limit-fresh`: the same reads, each body copied to its place
//!   in one map of the checkpoint's size that the process never touched (plain pages), as a
//!   load into memory of its own must land them: the bound a load is held to (`x fresh`).
//! - `safeload`: `Loader::new().load("hf://org/repo")` with `HF_ENDPOINT` at the server, no
//!   option set; `safeload-http`: the same from `http://.../org/repo/resolve/main/`.
//! - `download-then-load`: every file downloaded to local disk by the raw client with the
//!   same 32 ranged GETs in flight (`pwrite` into files in a temporary directory under
//!   `--download-dir`), then `Loader::new().load(dir)`; `hub-download-then-load`: one GET
//!   per file, 8 files at once, each body written in order, as the hub's clients download.
//!   The load runs first on the pages as the download left them in the page cache (the
//!   total the targets quote), then once more cold: the files synced and dropped from the
//!   page cache (`posix_fadvise(DONTNEED)`), as when the download was made earlier.
//! - `open`: `Checkpoint::open(url)`, headers only: the bytes the server sent, requests
//!   per file, and the time against one request per file one after another.
//! - `shard`: `Checkpoint::open(url)`, then `Checkpoint::shard(name, 0, rank 0, 8)` of
//!   every tensor on 8 threads: the bytes the server sent over the checkpoint's.
//!
//! - `cache-cold`: `hf://org/repo` through an empty hub cache (a new `HF_HUB_CACHE` under
//!   `--dir` each run): the load writes every file through to the cache, and returns once
//!   they are published; against `safeload` (the same load, the cache off). The cache is
//!   synced after the arm (the time it took is quoted: the kernel's writeback, which the
//!   load does not wait for) and removed.
//! - `cache-resume`: a `cache-cold` load killed (SIGKILL) once the server has sent half the
//!   checkpoint, then the same load again through the cache it left: the bytes the second
//!   load fetched (`sent`) say what was resumed.
//! - `cache-ranks`: three local ranks of one job (`LOCAL_RANK`, `LOCAL_WORLD_SIZE=3`, one
//!   `TORCHELASTIC_RUN_ID`) loading `hf://org/repo` at once through one empty hub cache: the
//!   bytes the server sent for the three over the checkpoint (`sent`), the slowest rank's
//!   time.
//! - `cache-warm`: the same address through a cache that holds the checkpoint (filled once,
//!   `bench-data/hub-cache-<checkpoint>`, kept): one request, then the snapshot's files as
//!   local files; `local`: `Loader::new().load(<that snapshot>)`. Both cold: every blob
//!   dropped from the page cache first.
//!
//! Every safeload arm's time includes touching one byte of every 4 KiB of what it loaded
//! (so that a load whose tensors map a file pays for the reads), and its tensors are then
//! checksummed, untimed, against a naive read of the local files with the `safetensors`
//! crate. With `--moto-size-mib N` the same arms run again against `moto_server` (an
//! S3-compatible store in Python; its speed is Python's, so its figures are quoted, not
//! judged) on a checkpoint of about N MiB, through a counting proxy (`common/proxy.rs`).
//! The tables (`common/remote_table.rs`) give every arm's medians (min-max), ratios taken
//! per round and then their median, and each target against its median.
//!
//! ```text
//! cargo bench --features remote --bench remote -- [--size-gib 2] [--shards 8] [--rounds 5]
//!     [--arms limit,safeload,..] [--latency-ms 20] [--link-mib-s 1500] [--max-connections 64]
//!     [--in-flight 32] [--request-mib 16] [--hub-streams 8] [--world 8] [--shard-threads 8]
//!     [--touch-threads 2]
//!     [--moto-size-mib 256] [--skip-testhttp] [--dir bench-data] [--download-dir DIR]
//!     [--json bench-data/remote.json] [--timeout 600] [--settle-secs 0]
//! ```

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use safetensors::SafeTensors;

mod common;
// The remote benchmark's own helpers, beside the shared harness.
#[path = "common/http_client.rs"]
mod http_client;
#[path = "common/proxy.rs"]
mod proxy;
#[path = "common/remote_cache.rs"]
mod remote_cache;
#[path = "common/remote_fetch.rs"]
mod remote_fetch;
#[path = "common/remote_table.rs"]
mod remote_table;

use common::child::{self, Child, Job};
use common::{args, data, proc};
use http_client::{Connection, Endpoint};
use remote_fetch::Fetch;

/// Every arm, in the order the tables print them.
const ARMS: [&str; 14] = [
    "limit",
    "limit-fresh",
    "fresh-memory",
    "safeload",
    "safeload-http",
    "download-then-load",
    "hub-download-then-load",
    "open",
    "shard",
    "cache-cold",
    "cache-warm",
    "local",
    "cache-resume",
    "cache-ranks",
];
/// The arms of the hub cache (issue 34), on the test server only (the hub).
const CACHE_ARMS: [&str; 5] = [
    "cache-cold",
    "cache-warm",
    "local",
    "cache-resume",
    "cache-ranks",
];
/// The local ranks of `cache-ranks`.
const RANKS: usize = 3;
/// The hub's names for the test server's repository.
const REPO: &str = "org/repo";
/// The bucket the checkpoint is put in on moto.
const BUCKET: &str = "bench";
/// The target on a rank's part: this many times 1/world of the checkpoint.
const SHARD_SLACK: f64 = 1.15;
/// The target on a remote load: this much of the limit's speed.
const LIMIT_TARGET: f64 = 0.85;
/// The target on a cold load writing through to the hub cache: this much of the same
/// load's speed with the cache off.
const CACHE_COLD_TARGET: f64 = 0.9;
/// The target on a hit of the hub cache: this much of a local load's speed.
const CACHE_WARM_TARGET: f64 = 0.95;

/// A remote load against the server's limit and a download first (the module docs of
/// benches/remote.rs say how).
#[derive(Parser)]
#[command(name = "remote")]
struct Options {
    /// The checkpoint's size, GiB (the load benchmark's checkpoint of that size).
    #[arg(long, default_value_t = 2.0)]
    size_gib: f64,
    #[arg(long, default_value_t = 8)]
    shards: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    #[arg(long, value_delimiter = ',', default_values = ARMS, value_parser = ARMS)]
    arms: Vec<String>,
    /// The test server's latency per request, ms.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// The test server's link, shared by every connection, MiB/s.
    #[arg(long, default_value_t = 1500)]
    link_mib_s: u64,
    /// Connections the test server serves at once.
    #[arg(long, default_value_t = 64)]
    max_connections: usize,
    /// Requests in flight of the limit and of `download-then-load`.
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// The size of their ranged GETs, MiB.
    #[arg(long, default_value_t = 16)]
    request_mib: u64,
    /// Files downloaded at once by `hub-download-then-load`.
    #[arg(long, default_value_t = 8)]
    hub_streams: usize,
    /// The `shard` arm reads rank 0's part of every tensor split this many ways on dim 0.
    #[arg(long, default_value_t = 8)]
    world: usize,
    /// Threads that call `Checkpoint::shard` in the `shard` arm.
    #[arg(long, default_value_t = 8)]
    shard_threads: usize,
    /// Threads that touch and checksum the loaded tensors in each child.
    #[arg(long, default_value_t = 2)]
    touch_threads: usize,
    /// Also run the arms against moto_server, on a checkpoint of about this many MiB (0: no).
    #[arg(long, default_value_t = 0)]
    moto_size_mib: u64,
    /// Run only the moto part.
    #[arg(long)]
    skip_testhttp: bool,
    /// Where the checkpoints are written and kept.
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
    /// Where the download arms write (a temporary directory each; default: --dir).
    #[arg(long)]
    download_dir: Option<PathBuf>,
    /// Where every sample is written.
    #[arg(long, default_value = "bench-data/remote.json")]
    json: PathBuf,
    /// Seconds before an arm's process is killed.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Seconds of rest before each arm (see the module's docs).
    #[arg(long, default_value_t = 0.0)]
    settle_secs: f64,
}

fn main() {
    if let Some(job) = Job::from_env() {
        run_child(&job);
        return;
    }
    if let Err(e) = parent(&args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------- what a child is given

/// Where a child finds the checkpoint, and how its arm reads: one line of JSON after the
/// child's path.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Target {
    /// The raw client's base, `http://host:port/prefix/`: each file at base + its name.
    raw: String,
    /// What safeload is given (`hf://org/repo`, `s3://bucket/prefix`).
    url: String,
    /// The same checkpoint as an `http://` directory, where the server has one.
    http_url: Option<String>,
    /// The checkpoint's files, the index included: name and length.
    files: Vec<(String, u64)>,
    in_flight: usize,
    request_bytes: u64,
    hub_streams: usize,
    world: usize,
    shard_threads: usize,
    touch_threads: usize,
    download_dir: PathBuf,
    /// The filled hub cache's snapshot of the checkpoint (the `local` arm), where the
    /// cache arms run.
    snapshot: Option<PathBuf>,
}

/// What a child prints.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
struct Figures {
    /// The arm's time: the limit's reads; a load and its touch; a download and the load
    /// after it; an open; an open and a rank's reads.
    seconds: f64,
    /// The download arms' parts: the download, the load on the pages it left, the load
    /// again after the files were synced and evicted.
    download_seconds: Option<f64>,
    load_seconds: Option<f64>,
    cold_load_seconds: Option<f64>,
    /// Bytes the raw client received, or the tensors' bytes.
    bytes: u64,
    tensors: usize,
    checksum: Option<u64>,
    cold_checksum: Option<u64>,
    maxrss_kib: u64,
    /// CPU seconds of the child in the kernel (`getrusage(2)`): for a load, mostly faulting
    /// its fresh memory in and the sockets' copies.
    #[serde(default)]
    sys_seconds: f64,
    error: Option<String>,
    /// A load's own account: its elapsed time, the readers it settled at and why.
    load_report: Option<String>,
    /// `cache-cold`: seconds the cache took to sync after the load (the parent's).
    writeback_seconds: Option<f64>,
    /// A cache arm: the blobs its cache held once the arm's processes ended.
    published: Option<usize>,
    /// What the cache did for each file, where the load went through one.
    cache_uses: Vec<String>,
}

// ---------------------------------------------------------------- the parent

/// A server the arms run against, and how its traffic is counted.
enum Server {
    Http(safeload_testhttp::Server),
    Moto {
        proxy: proxy::Proxy,
        // Dropped after the proxy: stopped last.
        _moto: safeload_testhttp::moto::Moto,
    },
}

/// What the server saw during one arm.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
struct Traffic {
    requests: u64,
    /// Body bytes (the test server), or every byte answered (moto, through the proxy).
    bytes: u64,
    /// Requests per shard file, in order; and of the index.
    file_requests: Vec<u64>,
    index_requests: u64,
    /// The most connections open at once.
    connections: u64,
    /// CPU time of the parent's threads during the arm (user + system), seconds: the test
    /// server's (or the proxy's, in front of moto), to tell a server short of CPU.
    server_cpu: f64,
}

impl Server {
    fn name(&self) -> &'static str {
        match self {
            Server::Http(_) => "testhttp",
            Server::Moto { .. } => "moto",
        }
    }

    fn reset(&self) {
        match self {
            Server::Http(s) => s.reset_stats(),
            Server::Moto { proxy, .. } => proxy.reset(),
        }
    }

    fn traffic(&self, files: &[(String, u64)]) -> Traffic {
        let (shards, index): (Vec<_>, Vec<_>) = files.iter().partition(|(n, _)| is_shard(n));
        let index_name = index.first().map(|(n, _)| n.as_str()).unwrap_or_default();
        match self {
            Server::Http(s) => {
                let stats = s.stats();
                Traffic {
                    requests: stats.requests,
                    bytes: stats.bytes_sent,
                    file_requests: shards
                        .iter()
                        .map(|(n, _)| s.path_stats(n).requests)
                        .collect(),
                    index_requests: s.path_stats(index_name).requests,
                    connections: stats.max_open_connections,
                    server_cpu: 0.0,
                }
            }
            Server::Moto { proxy, .. } => {
                let t = proxy.traffic();
                let of = |name: &str| {
                    let suffix = format!("/{name}");
                    t.paths
                        .iter()
                        .filter(|(p, _)| p.ends_with(&suffix))
                        .map(|(_, n)| n)
                        .sum()
                };
                Traffic {
                    requests: t.requests,
                    bytes: t.bytes_down,
                    file_requests: shards.iter().map(|(n, _)| of(n)).collect(),
                    index_requests: of(index_name),
                    connections: t.max_open,
                    server_cpu: 0.0,
                }
            }
        }
    }
}

fn is_shard(name: &str) -> bool {
    name.ends_with(".safetensors")
}

/// One run of an arm.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
struct Sample {
    server: String,
    arm: String,
    round: usize,
    figures: Figures,
    traffic: Traffic,
    error: Option<String>,
}

/// A checkpoint served, with what its arms are checked against.
struct Served {
    server: Server,
    root: PathBuf,
    target: Target,
    /// The child's environment: where safeload finds the server.
    env: Vec<(&'static str, String)>,
    /// The files' bytes, and the checksums of all tensors and of rank 0's parts.
    total: u64,
    checksum: u64,
    shard_checksum: u64,
    arms: Vec<String>,
}

fn parent(o: &Options) -> Result<(), String> {
    if o.rounds == 0 || o.in_flight == 0 || o.hub_streams == 0 || o.world == 0 {
        return Err("--rounds, --in-flight, --hub-streams and --world must be at least 1".into());
    }
    eprintln!(
        "{} round(s), arms interleaved; {}",
        o.rounds,
        proc::machine()
    );
    let mut samples = Vec::new();
    let mut served_list = Vec::new();
    if !o.skip_testhttp {
        let size = (o.size_gib * (1u64 << 30) as f64) as u64;
        let served = serve_testhttp(o, size)?;
        run_rounds(o, &served, &mut samples);
        served_list.push(summary(&served));
    }
    // A moto that cannot start or be filled fails the run, after the other tables.
    let mut moto_error = None;
    if o.moto_size_mib > 0 {
        match serve_moto(o, o.moto_size_mib << 20) {
            Ok(served) => {
                run_rounds(o, &served, &mut samples);
                served_list.push(summary(&served));
            }
            Err(e) => {
                eprintln!("moto: {e}");
                moto_error = Some(e);
            }
        }
    }
    println!("{}", remote_table::markdown(o, &samples, &served_list));
    let (root, files, total) = served_list
        .first()
        .map(|s| (s.root.clone(), s.files, s.total))
        .unwrap_or_default();
    common::write_samples(&o.json, &root, files, total, &samples)?;
    let failed = samples.iter().filter(|s| s.error.is_some()).count();
    if failed > 0 {
        return Err(format!("{failed} run(s) failed or loaded wrong bytes"));
    }
    moto_error.map_or(Ok(()), |e| Err(format!("moto: {e}")))
}

/// A checkpoint on local disk, as the server is given it.
struct Local {
    root: PathBuf,
    /// Its files, the index included: name and length, by name.
    files: Vec<(String, u64)>,
    /// The checksums of all its tensors and of rank 0's parts (`naive_checksums`).
    checksum: u64,
    shard_checksum: u64,
}

/// The checkpoint of about `size` bytes (written once), its files and expected checksums.
fn checkpoint(o: &Options, size: u64) -> Result<Local, String> {
    let root = data::checkpoint(
        &o.dir,
        &data::stem(size, o.shards),
        &data::sharded(size, o.shards),
    )
    .map_err(|e| format!("generating: {e}"))?;
    let mut files: Vec<(String, u64)> = std::fs::read_dir(&root)
        .map_err(|e| format!("{}: {e}", root.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            let len = e.metadata().map(|m| m.len()).unwrap_or(0);
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    files.sort();
    let (checksum, shard_checksum) = naive_checksums(&root, o.world)?;
    Ok(Local {
        root,
        files,
        checksum,
        shard_checksum,
    })
}

/// The checksums of every tensor's bytes and of every tensor's rank-0 part of `world` along
/// dim 0 (split as `torch.tensor_split`: the first `len % world` parts one row longer), from
/// the local files by the `safetensors` crate.
fn naive_checksums(root: &Path, world: usize) -> Result<(u64, u64), String> {
    let (mut all, mut part) = (0u64, 0u64);
    for path in data::shard_files(root) {
        let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: the benchmark's files are not modified while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?;
        let st = SafeTensors::deserialize(&map).map_err(|e| e.to_string())?;
        for (_, view) in st.tensors() {
            let bytes = view.data();
            all = all.wrapping_add(data::checksum(bytes));
            let Some(&rows) = view.shape().first() else {
                part = part.wrapping_add(data::checksum(bytes));
                continue;
            };
            let first = rows / world + usize::from(rows % world > 0);
            let row_bytes = bytes.len().checked_div(rows).unwrap_or(0);
            part = part.wrapping_add(data::checksum(&bytes[..first * row_bytes]));
        }
    }
    Ok((all, part))
}

fn target(o: &Options, raw: String, url: String, local: &Local) -> Target {
    Target {
        raw,
        url,
        http_url: None,
        files: local.files.clone(),
        in_flight: o.in_flight,
        request_bytes: o.request_mib << 20,
        hub_streams: o.hub_streams,
        world: o.world,
        shard_threads: o.shard_threads,
        touch_threads: o.touch_threads,
        download_dir: o.download_dir.clone().unwrap_or_else(|| o.dir.clone()),
        snapshot: None,
    }
}

fn serve_testhttp(o: &Options, size: u64) -> Result<Served, String> {
    let local = checkpoint(o, size)?;
    let server = safeload_testhttp::Server::start(
        &local.root,
        safeload_testhttp::Options {
            latency: Some(Duration::from_millis(o.latency_ms)),
            bandwidth_bytes_per_sec: Some(o.link_mib_s << 20),
            max_connections: o.max_connections,
            ..Default::default()
        },
    )
    .map_err(|e| format!("starting the test HTTP server: {e}"))?;
    let base = format!("{}/{REPO}/resolve/main/", server.url());
    // The server hashes each file on its first request (its ETag): done here, not in an arm.
    let endpoint = Endpoint::parse(&base)?;
    let mut conn = Connection::new(&endpoint.host);
    for (name, _) in &local.files {
        conn.head(&format!("{}{name}", endpoint.path))
            .map_err(|e| format!("HEAD {name}: {e}"))?;
    }
    let mut target = target(o, base.clone(), format!("hf://{REPO}"), &local);
    target.http_url = Some(base);
    // The arms stream: no hub cache is read or written (the cache's own arms set theirs).
    let env = vec![
        ("HF_ENDPOINT", server.url()),
        ("SAFELOAD_HUB_CACHE", "0".to_owned()),
    ];
    if o.arms.iter().any(|a| a == "cache-warm" || a == "local") {
        let filled = remote_cache::filled(o, &local.root, &target, &env)?;
        target.snapshot = Some(filled);
    }
    Ok(served(o, Server::Http(server), local, target, env))
}

fn serve_moto(o: &Options, size: u64) -> Result<Served, String> {
    let local = checkpoint(o, size)?;
    let moto = safeload_testhttp::moto::Moto::start().ok_or("moto_server is not installed")?;
    let prefix = local
        .root
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("ckpt")
        .to_string();
    let start = Instant::now();
    upload(&moto, &prefix, &local)?;
    eprintln!(
        "moto_server at {}: {} uploaded in {:.1} s",
        moto.endpoint(),
        local.root.display(),
        start.elapsed().as_secs_f64()
    );
    let upstream = Endpoint::parse(moto.endpoint())?
        .host
        .parse()
        .map_err(|e| format!("moto's address: {e}"))?;
    let proxy = proxy::Proxy::start(upstream).map_err(|e| format!("starting the proxy: {e}"))?;
    // moto's variables, its endpoint replaced by the proxy's.
    let env = moto
        .s3_vars()
        .into_iter()
        .map(|(k, v)| match k {
            "AWS_ENDPOINT_URL" => (k, proxy.url()),
            _ => (k, v),
        })
        .collect();
    let target = target(
        o,
        format!("{}/{BUCKET}/{prefix}/", proxy.url()),
        format!("s3://{BUCKET}/{prefix}"),
        &local,
    );
    let server = Server::Moto { proxy, _moto: moto };
    Ok(served(o, server, local, target, env))
}

/// Creates the bucket and puts every file of `local` under `prefix/` (unsigned, path-style),
/// each with the canned ACL `public-read`, so that the raw client's unsigned GETs are
/// answered: moto refuses an unsigned GET of a private object, and an unsigned change of
/// its ACL (403). The files are streamed from disk by the raw client.
fn upload(moto: &safeload_testhttp::moto::Moto, prefix: &str, local: &Local) -> Result<(), String> {
    moto.create_bucket(BUCKET)
        .map_err(|e| format!("CreateBucket {BUCKET}: {e}"))?;
    let mut conn = Connection::new(&Endpoint::parse(moto.endpoint())?.host);
    for (name, len) in &local.files {
        let path = local.root.join(name);
        let mut file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let target = format!("/{BUCKET}/{prefix}/{name}");
        let status = conn
            .put(&target, "x-amz-acl: public-read\r\n", &mut file, *len)
            .map_err(|e| format!("PUT {target}: {e}"))?;
        if status != 200 {
            return Err(format!("PUT {target}: status {status}"));
        }
    }
    Ok(())
}

fn served(
    o: &Options,
    server: Server,
    local: Local,
    target: Target,
    env: Vec<(&'static str, String)>,
) -> Served {
    let total = target.files.iter().map(|(_, len)| len).sum();
    let arms = o
        .arms
        .iter()
        .filter(|a| target.http_url.is_some() || a.as_str() != "safeload-http")
        .filter(|a| matches!(server, Server::Http(_)) || !CACHE_ARMS.contains(&a.as_str()))
        .cloned()
        .collect();
    eprintln!(
        "{}: {} ({} files, {:.2} GiB) at {}",
        server.name(),
        local.root.display(),
        target.files.len(),
        total as f64 / (1u64 << 30) as f64,
        target.raw
    );
    Served {
        server,
        root: local.root,
        target,
        env,
        total,
        checksum: local.checksum,
        shard_checksum: local.shard_checksum,
        arms,
    }
}

fn run_rounds(o: &Options, served: &Served, samples: &mut Vec<Sample>) {
    let name = served.server.name();
    for round in 0..o.rounds {
        for a in common::shuffled(served.arms.len(), round) {
            let arm = &served.arms[a];
            if let Server::Http(_) = served.server {
                // The served files in the page cache: the server's disk is not measured.
                let _ = data::warm(&served.root);
            }
            std::thread::sleep(Duration::from_secs_f64(o.settle_secs.max(0.0)));
            let prepared = remote_cache::prepare(o, served, arm);
            served.server.reset();
            let cpu = cpu_seconds();
            let mut sample = match &prepared {
                Ok(env) => run_arm(o, served, arm, round, env),
                Err(e) => failed_sample(served, arm, round, e.clone()),
            };
            if let Ok(env) = &prepared {
                sample.figures.published = remote_cache::published(env);
                sample.figures.writeback_seconds = remote_cache::finish(env);
            }
            sample.traffic = served.server.traffic(&served.target.files);
            sample.traffic.server_cpu = cpu_seconds() - cpu;
            if sample.error.is_none() {
                sample.error = check(served, &sample);
            }
            let f = &sample.figures;
            let parts = match (f.download_seconds, f.load_seconds, f.cold_load_seconds) {
                (Some(d), Some(l), Some(c)) => {
                    format!(" (download {d:.3} + load {l:.3}; cold load {c:.3})")
                }
                _ => match (
                    prepared.as_ref().ok().and_then(|p| p.killed_at),
                    f.writeback_seconds,
                ) {
                    (Some(k), _) => format!(
                        " (the first load killed at {:.3}x sent)",
                        k as f64 / served.total as f64
                    ),
                    (None, Some(w)) => format!(" (then synced in {w:.3} s)"),
                    (None, None) => String::new(),
                },
            };
            eprintln!(
                "  {name:<8} round {round} {arm:<22} {:>8.3} s{parts} {:>6.3}x sent {:>5} requests {:>3} connections {:>6} MiB RSS{}",
                f.seconds,
                sample.traffic.bytes as f64 / served.total as f64,
                sample.traffic.requests,
                sample.traffic.connections,
                f.maxrss_kib >> 10,
                sample
                    .error
                    .as_deref()
                    .map(|e| format!("  ERROR {e}"))
                    .unwrap_or_default(),
            );
            samples.push(sample);
        }
    }
}

/// A run that failed before its child started.
fn failed_sample(served: &Served, arm: &str, round: usize, error: String) -> Sample {
    Sample {
        server: served.server.name().into(),
        arm: arm.into(),
        round,
        figures: Figures {
            seconds: f64::NAN,
            ..Figures::default()
        },
        traffic: Traffic::default(),
        error: Some(error),
    }
}

fn run_arm(
    o: &Options,
    served: &Served,
    arm: &str,
    round: usize,
    prepared: &remote_cache::Prepared,
) -> Sample {
    let target = serde_json::to_string(&served.target).expect("the target serializes");
    let child = |rank: Option<usize>| {
        let mut child = Child::new(arm, &served.root)
            .arg(&target)
            .env_remove(safeload::ENV_VARIABLES)
            .env_remove(&safeload_testhttp::STORE_VARIABLES)
            .timeout(Duration::from_secs(o.timeout));
        // The served checkpoint's variables, then the arm's own (the cache's) over them.
        for (key, value) in served.env.iter().chain(&prepared.env) {
            child = child.env(key, value);
        }
        if let Some(rank) = rank {
            child = child.env("LOCAL_RANK", rank.to_string());
        }
        child
    };
    let mut sample = failed_sample(served, arm, round, String::new());
    sample.error = None;
    let outs: Vec<Result<Figures, String>> = match arm {
        // Three local ranks at once, one job: rank 0's figures, the slowest rank's time.
        "cache-ranks" => std::thread::scope(|s| {
            let ranks: Vec<_> = (0..RANKS)
                .map(|rank| {
                    let child = child(Some(rank));
                    s.spawn(move || child.run::<Figures>().map(|out| out.figures))
                })
                .collect();
            ranks
                .into_iter()
                .map(|r| r.join().unwrap_or_else(|_| Err("a rank panicked".into())))
                .collect()
        }),
        _ => vec![child(None).run::<Figures>().map(|out| out.figures)],
    };
    let slowest = outs
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|f| f.seconds)
        .fold(0.0, f64::max);
    for (i, out) in outs.into_iter().enumerate() {
        match out {
            Ok(figures) if i == 0 => {
                sample.error = figures.error.clone();
                sample.figures = figures;
                sample.figures.seconds = slowest;
            }
            Ok(figures) => sample.error = sample.error.take().or(figures.error),
            Err(e) => sample.error = Some(e),
        }
    }
    sample
}

/// What is wrong with a run's bytes, if anything.
fn check(served: &Served, s: &Sample) -> Option<String> {
    let f = &s.figures;
    // The cache did what the arm is about for every file.
    // A write may still be checked when the load returns (`checking`), and is published
    // by the time its process ends.
    let cache_use: Option<&[&str]> = match s.arm.as_str() {
        "cache-cold" | "cache-resume" => Some(&["written", "checking"]),
        "cache-warm" => Some(&["hit"]),
        _ => None,
    };
    if let Some(want) = cache_use {
        if f.cache_uses.is_empty() || f.cache_uses.iter().any(|u| !want.contains(&u.as_str())) {
            return Some(format!(
                "the cache: {:?}, not every file {want:?}",
                f.cache_uses
            ));
        }
        let files = f.cache_uses.len();
        if want[0] == "written" && f.published.is_some_and(|n| n < files) {
            return Some(format!(
                "{:?} of {files} files published once the load's process ended",
                f.published
            ));
        }
    }
    let expect = match s.arm.as_str() {
        "limit" | "limit-fresh" => {
            return (f.bytes != served.total)
                .then(|| format!("read {} bytes of {}", f.bytes, served.total));
        }
        "open" | "fresh-memory" => return None,
        "shard" => served.shard_checksum,
        _ => served.checksum,
    };
    [f.checksum, f.cold_checksum]
        .into_iter()
        .flatten()
        .find(|&c| c != expect)
        .map(|c| format!("checksum {c:016x}, the naive read's {expect:016x}"))
}

/// This process's CPU time so far, user and system, all threads (getrusage(2)), seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes only into the `rusage` we pass, which is zeroed (a valid
    // value of this plain C struct) and lives across the call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return f64::NAN;
        }
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

// ---------------------------------------------------------------- the tables

/// What the tables need of a served checkpoint once it is stopped.
struct Summary {
    server: &'static str,
    root: PathBuf,
    files: usize,
    total: u64,
    arms: Vec<String>,
}

fn summary(served: &Served) -> Summary {
    Summary {
        server: served.server.name(),
        root: served.root.clone(),
        files: served.target.files.len(),
        total: served.total,
        arms: served.arms.clone(),
    }
}

// ---------------------------------------------------------------- a child

/// A child: `--child ARM ROOT TARGET_JSON`.
fn run_child(job: &Job) {
    let figures = match job.extra.first().map(|t| serde_json::from_str::<Target>(t)) {
        Some(Ok(target)) => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(target.touch_threads.max(1))
                .build()
                .expect("a pool");
            // No NaN in a failure's figures: JSON has none (serde_json writes `null`).
            let mut f = run_arm_here(&job.arm, &target, &pool).unwrap_or_else(|e| Figures {
                error: Some(e),
                ..Figures::default()
            });
            f.maxrss_kib = proc::max_rss_kib();
            f.sys_seconds = proc::cpu_seconds().1;
            f
        }
        _ => Figures {
            error: Some("no target given".into()),
            ..Figures::default()
        },
    };
    child::report(&figures);
}

fn run_arm_here(arm: &str, target: &Target, pool: &rayon::ThreadPool) -> Result<Figures, String> {
    match arm {
        "limit" => limit(target),
        "limit-fresh" => limit_fresh(target),
        "fresh-memory" => fresh_memory(target, pool),
        "safeload" => remote_load(&target.url, pool),
        "safeload-http" => remote_load(target.http_url.as_deref().ok_or("no http URL")?, pool),
        "download-then-load" => download_then_load(target, ranged(target), pool),
        "hub-download-then-load" => {
            let per_file = Fetch::PerFile {
                streams: target.hub_streams,
                buffer: target.request_bytes,
            };
            download_then_load(target, per_file, pool)
        }
        "open" => open(&target.url),
        "shard" => shard(target, pool),
        "cache-cold" | "cache-warm" | "cache-resume" | "cache-ranks" => {
            remote_load(&target.url, pool)
        }
        "local" => {
            let snapshot = target.snapshot.as_deref().ok_or("no filled cache")?;
            remote_load(
                snapshot.to_str().ok_or("a snapshot path not in UTF-8")?,
                pool,
            )
        }
        other => Err(format!("no arm {other}")),
    }
}

/// Reads one byte of every 4 KiB of `tensors` on `pool`, as 4 MiB pieces in parallel: a
/// tensor that maps a file pays for its reads here, one in memory costs next to nothing.
fn touch(tensors: &[&[u8]], pool: &rayon::ThreadPool) -> u64 {
    use rayon::prelude::*;
    let pieces: Vec<&[u8]> = tensors.iter().flat_map(|t| t.chunks(4 << 20)).collect();
    pool.install(|| {
        pieces
            .par_iter()
            .map(|p| p.iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>())
            .sum()
    })
}

/// The checksum of `tensors` on `pool` (`data::checksum`, summed).
fn checksum(tensors: &[&[u8]], pool: &rayon::ThreadPool) -> u64 {
    use rayon::prelude::*;
    let pieces: Vec<&[u8]> = tensors.iter().flat_map(|t| t.chunks(4 << 20)).collect();
    pool.install(|| {
        pieces
            .par_iter()
            .map(|p| data::checksum(p))
            .reduce(|| 0, u64::wrapping_add)
    })
}

/// Loads `path` with `Loader::new()` and touches it: the seconds, the tensors' bytes and
/// checksum.
fn load_and_touch(
    path: &str,
    pool: &rayon::ThreadPool,
) -> Result<(f64, u64, usize, u64, String), String> {
    let start = Instant::now();
    let sd = safeload::Loader::new()
        .load(path)
        .map_err(|e| e.to_string())?;
    let tensors: Vec<&[u8]> = sd.tensors().iter().map(|t| t.as_bytes()).collect();
    std::hint::black_box(touch(&tensors, pool));
    let seconds = start.elapsed().as_secs_f64();
    let bytes = tensors.iter().map(|t| t.len() as u64).sum();
    let report = sd.report();
    let uses: Vec<String> = report
        .files
        .iter()
        .filter_map(|f| f.cache.as_ref().map(|c| c.as_str().to_owned()))
        .collect();
    CACHE_USES.with(|c| *c.borrow_mut() = uses);
    let elapsed = report.files.iter().map(|f| f.elapsed.as_secs_f64());
    let account = format!(
        "load {:.3} s, files {:.3}-{:.3} s; {}{}",
        report.elapsed.as_secs_f64(),
        elapsed.clone().fold(f64::INFINITY, f64::min),
        elapsed.fold(0.0, f64::max),
        report
            .io_concurrency_reason
            .as_ref()
            .map_or("-".to_string(), ToString::to_string),
        report
            .fresh_memory
            .as_ref()
            .map(|f| format!("; {f}"))
            .unwrap_or_default()
    );
    Ok((
        seconds,
        bytes,
        tensors.len(),
        checksum(&tensors, pool),
        account,
    ))
}

thread_local! {
    /// What the cache did for each file of the last load on this thread.
    static CACHE_USES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn remote_load(url: &str, pool: &rayon::ThreadPool) -> Result<Figures, String> {
    let (seconds, bytes, tensors, sum, account) = load_and_touch(url, pool)?;
    Ok(Figures {
        seconds,
        bytes,
        tensors,
        checksum: Some(sum),
        load_report: Some(account),
        cache_uses: CACHE_USES.with(|c| c.take()),
        ..Figures::default()
    })
}

fn open(url: &str) -> Result<Figures, String> {
    let start = Instant::now();
    let ck = safeload::Checkpoint::open(url).map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Figures {
        seconds,
        bytes: ck.total_bytes(),
        tensors: ck.len(),
        ..Figures::default()
    })
}

/// Rank 0's part along dim 0 of every tensor, `world` ways, read by `shard_threads`
/// threads from one opened checkpoint; a tensor without a dim 0 (a scalar) whole.
fn shard(target: &Target, pool: &rayon::ThreadPool) -> Result<Figures, String> {
    let start = Instant::now();
    let ck = safeload::Checkpoint::open(&target.url).map_err(|e| e.to_string())?;
    let names: Vec<&str> = ck.tensors().map(|t| t.name()).collect();
    let next = AtomicUsize::new(0);
    let parts = Mutex::new(Vec::with_capacity(names.len()));
    std::thread::scope(|scope| {
        for _ in 0..target.shard_threads.max(1) {
            scope.spawn(|| {
                while let Some(name) = names.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let part = match ck.get(name).map(|t| t.shape().is_empty()) {
                        Some(true) => ck.read(name),
                        _ => ck.shard(name, 0, 0, target.world),
                    };
                    parts.lock().unwrap_or_else(|e| e.into_inner()).push(part);
                }
            });
        }
    });
    let parts = parts
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let bytes: Vec<&[u8]> = parts.iter().map(|t| t.as_bytes()).collect();
    std::hint::black_box(touch(&bytes, pool));
    let seconds = start.elapsed().as_secs_f64();
    Ok(Figures {
        seconds,
        bytes: bytes.iter().map(|b| b.len() as u64).sum(),
        tensors: bytes.len(),
        checksum: Some(checksum(&bytes, pool)),
        ..Figures::default()
    })
}

/// The server's limit: `in_flight` ranged GETs of `request_bytes` into reused buffers,
/// every byte of every file, dropped.
fn limit(target: &Target) -> Result<Figures, String> {
    let fetched = remote_fetch::read_all(&target.raw, &target.files, ranged(target))?;
    Ok(Figures {
        seconds: fetched.seconds,
        bytes: fetched.bytes,
        ..Figures::default()
    })
}

/// The limit's reads into fresh memory (`remote_fetch::read_into_fresh`): the same ranged
/// GETs, every body copied to its place in one map of the checkpoint's size that this
/// process never touched. The bound of a load into memory of its own on this link.
fn limit_fresh(target: &Target) -> Result<Figures, String> {
    let (fetched, map) = remote_fetch::read_into_fresh(&target.raw, &target.files, ranged(target))?;
    std::hint::black_box(&map);
    Ok(Figures {
        seconds: fetched.seconds,
        bytes: fetched.bytes,
        ..Figures::default()
    })
}

/// The checkpoint's bytes of memory this process never touched, written once per 4 KiB page
/// on the touching pool: what any load into memory of its own pays before its first byte
/// lands, beside the limit (whose buffers are reused). On this VM, fresh memory is slow and
/// variable to fault in (freed pages go back to the host).
fn fresh_memory(target: &Target, pool: &rayon::ThreadPool) -> Result<Figures, String> {
    use rayon::prelude::*;
    let total: u64 = target.files.iter().map(|(_, len)| len).sum();
    let len = usize::try_from(total).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut map = memmap2::MmapMut::map_anon(len).map_err(|e| e.to_string())?;
    pool.install(|| {
        map.par_chunks_mut(4 << 20).for_each(|piece| {
            for page in piece.chunks_mut(4096) {
                page[0] = 1;
            }
        })
    });
    let seconds = start.elapsed().as_secs_f64();
    std::hint::black_box(&map);
    Ok(Figures {
        seconds,
        bytes: total,
        ..Figures::default()
    })
}

/// The limit's way of fetching: `in_flight` ranged GETs of `request_bytes`.
fn ranged(target: &Target) -> Fetch {
    Fetch::Ranged {
        in_flight: target.in_flight,
        piece: target.request_bytes,
    }
}

/// Every file downloaded into a temporary directory (`how`), then loaded twice: on the
/// pages as the download left them, then cold.
fn download_then_load(
    target: &Target,
    how: Fetch,
    pool: &rayon::ThreadPool,
) -> Result<Figures, String> {
    let dir = tempfile::Builder::new()
        .prefix("remote-download-")
        .tempdir_in(&target.download_dir)
        .map_err(|e| format!("a directory under {}: {e}", target.download_dir.display()))?;
    let (fetched, files) = remote_fetch::download(&target.raw, &target.files, how, dir.path())?;
    let expected: u64 = target.files.iter().map(|(_, len)| len).sum();
    if fetched.bytes != expected {
        return Err(format!("downloaded {} bytes of {expected}", fetched.bytes));
    }
    let path = dir.path().to_str().ok_or("a temporary path not in UTF-8")?;
    let (load, tensor_bytes, tensors, sum, _) = load_and_touch(path, pool)?;
    // Again cold: synced (`posix_fadvise(DONTNEED)` drops clean pages only), then evicted.
    for file in &files {
        file.sync_all().map_err(|e| format!("syncing: {e}"))?;
    }
    drop(files);
    safeload::evict(dir.path()).map_err(|e| format!("evicting: {e}"))?;
    let (cold, _, _, cold_sum, _) = load_and_touch(path, pool)?;
    Ok(Figures {
        seconds: fetched.seconds + load,
        download_seconds: Some(fetched.seconds),
        load_seconds: Some(load),
        cold_load_seconds: Some(cold),
        bytes: tensor_bytes,
        tensors,
        checksum: Some(sum),
        cold_checksum: Some(cold_sum),
        ..Figures::default()
    })
}
