//! A library, not a program: an HTTP/1.1 server that safeload's remote tests and benchmarks start in their own process.
//!
//! (To run one by hand: `cargo run -p safeload-testhttp --example serve -- DIR`.)
//!
//! [`Server::start`] serves a directory on `127.0.0.1`, on a port the OS picks, from a fixed
//! pool of threads, until the [`Server`] is dropped. It answers two kinds of target:
//!
//! - **the Hugging Face hub's resolve endpoint**, `/{org}/{repo}/resolve/{revision}/{path}`:
//!   `path` under the directory, for any `org/repo` (or those of
//!   [`Options::repositories`]), at [`Options::commit`] or any of
//!   [`Options::branches`] (or [`Options::foreign_commit`]; another revision is 404), with
//!   the headers the hub gives for an LFS file: `X-Repo-Commit` (the commit),
//!   `X-Linked-Etag` (the file's SHA-256, quoted) and `X-Linked-Size`. The hub answers an
//!   LFS file with a redirect to its CDN, and a small file in place: this server answers in
//!   place, or with [`Options::hub_redirect`] with a `302` carrying those headers and a
//!   `Location` on the static route.
//! - **a static tree**, `/{path}`, as any file server or a presigned object-store URL.
//!
//! Both answer `GET` and `HEAD` with a strong `ETag` (the contents' SHA-256, quoted),
//! single `Range`s (`bytes=a-b`, `bytes=a-`, `bytes=-n`: 206 with `Content-Range`; 416 with
//! `Content-Range: bytes */len` for a range past the end; several ranges get the whole
//! object, which RFC 9110 allows), and `If-Match` (412 when no tag matches).
//!
//! ```no_run
//! use std::time::Duration;
//! use safeload_testhttp::{Fault, FaultEvery, Options, Server};
//!
//! let dir = tempfile::tempdir().unwrap();
//! std::fs::write(dir.path().join("model.safetensors"), b"...").unwrap();
//! let server = Server::start(
//!     dir.path(),
//!     Options {
//!         latency: Some(Duration::from_millis(20)),
//!         bandwidth_bytes_per_sec: Some(1500 << 20),
//!         fault: Some(FaultEvery { every: 5, fault: Fault::ResetMidBody }),
//!         ..Options::default()
//!     },
//! )
//! .unwrap();
//! let url = format!("{}/org/repo/resolve/main/model.safetensors", server.url());
//! // ... read `url` ...
//! assert!(server.stats().requests > 0);
//! ```
//!
//! [`moto::Moto`] starts the other server the remote tests use, an S3-compatible store.
//!
//! # Knobs
//!
//! - [`Options::latency`]: slept before each answer, on its connection's thread.
//! - [`Options::bandwidth_bytes_per_sec`]: one link shared by every connection; bodies cross
//!   it in 64 KiB chunks one after another (the same model as `safeload-testfs`'s cap).
//! - [`Options::max_connections`]: connections served at once (the pool's threads); more
//!   wait, accepted, until a thread is free, as behind a server's worker limit.
//! - [`Options::fault`]: every Nth request (counted over the whole server from 1, `HEAD`s
//!   included) answers 503, or sends half its body and resets the connection (TCP RST), or
//!   sends half its body and closes it cleanly (a short body: fewer bytes than its
//!   `Content-Length`). A body fault on an answer without body answers normally.
//! - [`Options::ignore_range`]: every `Range` is ignored (200 with the whole object).
//! - [`Options::replace_after`], [`Server::replace`]: an object is replaced, from a moment
//!   on, by other contents (and so another ETag).
//! - [`Options::token`]: every request needs `Authorization: Bearer <token>` (401 without
//!   one, 403 with another), as the hub for a private or gated repository; but not those
//!   on the host [`Options::hub_redirect`] sends a client to, which stands for the hub's
//!   CDN and its signed URLs. With [`Options::gated`], the refusals carry
//!   `X-Error-Code: GatedRepo`, as the hub's for a gated repository.
//! - [`Options::repositories`]: the repositories that exist; the hub route and API answer
//!   any other with `404` and `X-Error-Code: RepoNotFound`.
//!
//! Hostile servers, each knob on its own:
//!
//! - [`Options::drip`]: object bodies trickle out one byte per pause.
//! - [`Options::silent_heads`], [`Options::silent_gets`]: `HEAD`s, or `GET`s (but of the
//!   hub API), are read and never answered; the connection is held open, silent, until the
//!   client hangs up or the server stops ([`Stats::unanswered`] counts them).
//! - [`Options::claimed_len`] (with [`Options::ignore_range`]): whole-object answers claim
//!   another `Content-Length` (a terabyte, say) and a `GET` pads the object with zeros to
//!   meet it, for as long as the client reads.
//! - [`Options::foreign_commit`]: the hub route answers a request pinned to that commit with
//!   [`Options::commit`]'s files, and names that one in `X-Repo-Commit`.
//! - [`Options::no_commit_on_404`]: the hub route's `EntryNotFound` carries no
//!   `X-Repo-Commit`, as some mirrors and proxies answer.
//! - [`Options::lie`]: one object's body is damaged from a byte on, under its true `ETag`
//!   and `X-Linked-Etag` (a hub serving a corrupt copy under the right digest).
//! - [`Options::whole_paths`]: the objects at these paths only are answered as
//!   [`Options::ignore_range`] (and [`Options::claimed_len`]) answer every one.
//! - [`Options::claim_linked_size`]: where a claim applies, the hub route's
//!   `X-Linked-Size` says it too.
//!
//! # Counters and bounds
//!
//! [`Server::stats`] and [`Server::path_stats`] count requests, bytes of bodies sent, and
//! per object path. Every loop is bounded: a connection answers at most 100,000 requests and
//! closes after [`Options::idle_timeout`] without one; a client that stops reading is given
//! up after 10 s; a request held unanswered ends at the client's hang-up; a dropped server
//! stops accepting, ends every connection within 50 ms of its current chunk, byte or hold
//! (also a body's write its client is not taking), and joins its threads.
#![deny(missing_docs)]

// NOTE: HTTP/1.1 is hand-written here (`http.rs`, `serve.rs`: about 500 lines) rather than
// served by `tiny_http` or `hyper`. The faults are the point of this server, and they live
// below those crates' interfaces: a body cut after exactly half its bytes under a full
// `Content-Length`, then either a clean FIN or a TCP RST (SO_LINGER 0) on that one
// connection; `tiny_http` owns the socket and completes or chunks bodies itself, and
// `hyper` would need a tokio runtime in the test process and still not expose the reset.
// Pacing each 64 KiB chunk on the shared link also needs the write loop in hand. The
// protocol subset is small (GET/HEAD, one range, `If-Match`, keep-alive, no request
// bodies) and parsed by pure functions tested on their own.

mod api;
mod body;
mod http;
#[path = "../../testfs/src/link.rs"]
mod link;
pub mod moto;
mod objects;
mod serve;

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

pub use objects::hex_sha256;

use link::Link;
use objects::Objects;
use serve::Counters;

/// A fault injected into every Nth request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `503 Service Unavailable`, no body.
    ServiceUnavailable,
    /// Half the body, then a TCP reset.
    ResetMidBody,
    /// Half the body, then a clean close: fewer bytes than `Content-Length` said.
    ShortBody,
}

/// Which requests fail, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultEvery {
    /// Every `every`th request (1 = all of them; 0 = none).
    pub every: u64,
    /// What they get.
    pub fault: Fault,
}

/// An object replaced by other contents some time after the server started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// The object's path under the served directory (`model.safetensors`, `sub/a.bin`).
    pub path: String,
    /// From when on, counted from [`Server::start`].
    pub after: Duration,
    /// The new contents.
    pub contents: Vec<u8>,
}

/// How the server behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// Slept before every answer.
    pub latency: Option<Duration>,
    /// One link of this many bytes per second for every body sent.
    pub bandwidth_bytes_per_sec: Option<u64>,
    /// Connections served at once (at least 1; default 64).
    pub max_connections: usize,
    /// A fault every Nth request.
    pub fault: Option<FaultEvery>,
    /// Answer every `Range` with the whole object (200).
    pub ignore_range: bool,
    /// An object replaced after a delay.
    pub replace_after: Option<Replacement>,
    /// The commit the hub route serves and names in `X-Repo-Commit` (40 hex digits).
    pub commit: String,
    /// The branch names the hub route also takes for that commit (default `main`).
    pub branches: Vec<String>,
    /// How long a kept-alive connection waits for its next request (default 2 s).
    pub idle_timeout: Duration,
    /// The bearer token every request must carry.
    pub token: Option<String>,
    /// The hub route answers `302` to the static route (with its metadata headers), as the
    /// hub for an LFS file.
    pub hub_redirect: bool,
    /// Every `GET` body of an object (hub or static route; not the hub API's JSON) is sent
    /// one byte at a time, this pause between bytes, after a head sent at once: a server
    /// that answers at once and then trickles. Each byte is counted and booked on the link
    /// as a chunk is; the body ends early when the client hangs up or the server stops.
    pub drip: Option<Duration>,
    /// A `HEAD` request (any target) is read and never answered: the connection is held
    /// open, silent, until the client hangs up or the server stops. Counted in
    /// [`Stats::head_requests`] and [`Stats::unanswered`]; it holds one of the
    /// [`max_connections`](Self::max_connections) threads meanwhile.
    pub silent_heads: bool,
    /// The same for a `GET` request of any target but the hub API's (which still answers):
    /// held silent until the client hangs up or the server stops; counted in
    /// [`Stats::unanswered`].
    pub silent_gets: bool,
    /// With [`ignore_range`](Self::ignore_range) or for [`whole_paths`](Self::whole_paths)
    /// only (ignored without them): the whole-object
    /// `200` answers, `HEAD` and `GET`, state `Content-Length: <claimed_len>` instead of the
    /// object's length, and a `GET` sends the object's bytes then zeros until the claim is
    /// met (or only the claim's first bytes of a longer object), the client hangs up, or
    /// the server stops: a hostile server claiming a terabyte. The hub's `X-Linked-Size`
    /// still says the real length. Nothing is allocated for the claim: bodies go out a
    /// 64 KiB chunk at a time, counted as any other.
    pub claimed_len: Option<u64>,
    /// A commit (normally 40 hex digits) the hub route takes as a revision as if it were
    /// [`commit`](Self::commit): it answers with the served files, named by
    /// `X-Repo-Commit: <commit>`, so that a client pinned to this commit gets another
    /// commit's files and is told so. The hub API does not know it (404).
    pub foreign_commit: Option<String>,
    /// The hub route's `404` for a file the revision lacks (`X-Error-Code: EntryNotFound`)
    /// carries no `X-Repo-Commit`, as some mirrors and proxies answer.
    pub no_commit_on_404: bool,
    /// A server that lies about one object's bytes: its body is sent with every byte at or
    /// past [`Lie::from`] flipped (XOR `0x5A`), while its `ETag`, `X-Linked-Etag` and
    /// lengths still name the true contents, as a hub whose storage or CDN serves a damaged
    /// copy under the right digest. `HEAD` answers are unchanged.
    pub lie: Option<Lie>,
    /// Object paths (as [`Server::path_stats`] names them: `config.json`, `sub/a.bin`)
    /// answered as [`ignore_range`](Self::ignore_range) answers every path: a `Range` is
    /// ignored (`200` with the whole object), [`claimed_len`](Self::claimed_len) applying
    /// to them as to its answers; the other paths honour ranges.
    pub whole_paths: Vec<String>,
    /// Where [`claimed_len`](Self::claimed_len) applies to an answer of the hub route, its
    /// `X-Linked-Size` says the claim too (not the object's length): a hub whose listing
    /// lies as its bodies do.
    pub claim_linked_size: bool,
    /// The repositories (`org/repo`) the hub route and the hub API serve; any other answers
    /// `404` with `X-Error-Code: RepoNotFound`, as the hub. `None` (the default): every
    /// repository is served.
    pub repositories: Option<Vec<String>>,
    /// With [`token`](Self::token): its refusals (401 without a token, 403 with another)
    /// carry `X-Error-Code: GatedRepo`, as the hub's for a gated repository whose terms
    /// the token's account has not accepted.
    pub gated: bool,
}

/// One object whose body [`Options::lie`] damages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lie {
    /// The object's path under the served directory (`model-00001-of-00003.safetensors`).
    pub path: String,
    /// The first byte damaged (a safetensors file's header length plus 8 keeps its header
    /// whole, so that only tensor bytes are wrong).
    pub from: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            latency: None,
            bandwidth_bytes_per_sec: None,
            max_connections: 64,
            fault: None,
            ignore_range: false,
            replace_after: None,
            commit: DEFAULT_COMMIT.to_owned(),
            branches: vec!["main".to_owned()],
            idle_timeout: Duration::from_secs(2),
            token: None,
            hub_redirect: false,
            drip: None,
            silent_heads: false,
            silent_gets: false,
            claimed_len: None,
            foreign_commit: None,
            no_commit_on_404: false,
            lie: None,
            whole_paths: Vec::new(),
            claim_linked_size: false,
            repositories: None,
            gated: false,
        }
    }
}

/// The commit of [`Options::default`].
pub const DEFAULT_COMMIT: &str = "5afe10ad5afe10ad5afe10ad5afe10ad5afe10ad";

/// The environment variables that say where and how a process reaches a remote store (the
/// hub's, S3's, proxies) and where it caches what it fetched: a test or benchmark removes
/// them from a child it points at a server of its own, so that the caller's environment can
/// send it nowhere else and give it no cache of the caller's.
pub const STORE_VARIABLES: [&str; 28] = [
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "XDG_CACHE_HOME",
    "SAFELOAD_HUB_CACHE",
    "SAFELOAD_CACHE_DIR",
    "HF_HUB_DISABLE_SHARED_BLOBS",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_PROFILE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "NO_PROXY",
];

/// A snapshot of the server's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests answered (or being answered), whatever the answer.
    pub requests: u64,
    /// Of which `HEAD`.
    pub head_requests: u64,
    /// Of which with a `Range` header.
    pub ranged_requests: u64,
    /// Body bytes sent.
    pub bytes_sent: u64,
    /// Faults injected.
    pub faults: u64,
    /// Requests refused for their token (401, 403).
    pub refused: u64,
    /// Requests held without an answer ([`Options::silent_heads`],
    /// [`Options::silent_gets`]), counted when the hold begins (and so also once it ended).
    pub unanswered: u64,
    /// Connections accepted.
    pub connections: u64,
    /// The most connections served at once.
    pub max_open_connections: u64,
}

/// The counters of one object path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStats {
    /// Requests that reached the object (found or not).
    pub requests: u64,
    /// Body bytes of it sent.
    pub bytes_sent: u64,
}

/// What the server's threads share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) options: Options,
    pub(crate) objects: Objects,
    pub(crate) link: Option<Mutex<Link>>,
    pub(crate) stats: Counters,
    pub(crate) paths: Mutex<HashMap<String, PathStats>>,
    /// Requests of the hub route by the revision in their URL.
    pub(crate) revisions: Mutex<HashMap<String, u64>>,
    pub(crate) stopping: AtomicBool,
    /// [`Server::stop_lying`] was called: [`Options::lie`] no longer applies.
    pub(crate) honest: AtomicBool,
}

impl Shared {
    /// A request that reached the object at `path`.
    pub(crate) fn count_path(&self, path: &str) {
        let mut paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        paths.entry(path.to_owned()).or_default().requests += 1;
    }

    /// `bytes` of the object at `path` about to be written, counted with the server's total
    /// at the same moment: the two agree for every answer, also one the client hung up on.
    pub(crate) fn count_bytes(&self, path: &str, bytes: u64) {
        self.stats.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
        let mut paths = self.paths.lock().unwrap_or_else(PoisonError::into_inner);
        paths.entry(path.to_owned()).or_default().bytes_sent += bytes;
    }
}

/// A running server; dropping it stops it and joins its threads.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    shared: Arc<Shared>,
    started: Instant,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Serves `dir` on `127.0.0.1` at a port the OS picks; ready when this returns.
    ///
    /// # Errors
    ///
    /// When `dir` is not a directory, the options are invalid, or the socket or a thread
    /// cannot be made (the threads already started are stopped).
    pub fn start(dir: &Path, options: Options) -> io::Result<Server> {
        let root = dir.canonicalize()?;
        if !root.is_dir() {
            return Err(invalid("the served path is not a directory"));
        }
        if options.max_connections == 0 {
            return Err(invalid("max_connections must be at least 1"));
        }
        if options.bandwidth_bytes_per_sec == Some(0) {
            return Err(invalid("bandwidth_bytes_per_sec must be at least 1"));
        }
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let started = Instant::now();
        let objects = Objects::new(root);
        if let Some(r) = &options.replace_after {
            objects.replace(&r.path, r.contents.clone(), started + r.after);
        }
        let shared = Arc::new(Shared {
            link: options
                .bandwidth_bytes_per_sec
                .map(|rate| Mutex::new(Link::new(rate))),
            objects,
            stats: Counters::default(),
            paths: Mutex::new(HashMap::new()),
            revisions: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            honest: AtomicBool::new(false),
            options,
        });
        let mut server = Server {
            addr,
            shared: Arc::clone(&shared),
            started,
            threads: Vec::new(),
        };
        // Connections wait here, accepted, until a pool thread is free.
        let (tx, rx) = mpsc::channel::<TcpStream>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..shared.options.max_connections {
            let (shared, rx) = (Arc::clone(&shared), Arc::clone(&rx));
            let thread = thread::Builder::new()
                .name(format!("testhttp-conn-{i}"))
                .stack_size(256 * 1024)
                .spawn(move || serve_queue(&shared, &rx));
            // On an error, `server`'s drop stops the threads started so far.
            server.threads.push(thread?);
        }
        let accept_shared = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name("testhttp-accept".to_owned())
            .spawn(move || accept_loop(&accept_shared, &listener, &tx))?;
        server.threads.push(accept);
        Ok(server)
    }

    /// `http://127.0.0.1:<port>`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address listened on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The counters since the start or the last [`reset_stats`](Self::reset_stats).
    pub fn stats(&self) -> Stats {
        let c = &self.shared.stats;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            requests: get(&c.requests),
            head_requests: get(&c.head_requests),
            ranged_requests: get(&c.ranged_requests),
            bytes_sent: get(&c.bytes_sent),
            faults: get(&c.faults),
            refused: get(&c.refused),
            unanswered: get(&c.unanswered),
            connections: get(&c.connections),
            max_open_connections: get(&c.max_open_connections),
        }
    }

    /// The counters of one object path (`model.safetensors`, `sub/a.bin`), whichever route
    /// reached it; zero for a path never asked for.
    pub fn path_stats(&self, path: &str) -> PathStats {
        let paths = self
            .shared
            .paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        paths.get(path).copied().unwrap_or_default()
    }

    /// Requests of the hub route whose URL named `revision` (a branch or a commit), known
    /// or not.
    pub fn revision_requests(&self, revision: &str) -> u64 {
        let revisions = self
            .shared
            .revisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        revisions.get(revision).copied().unwrap_or_default()
    }

    /// Sets every counter to zero (the most open connections to those open now).
    pub fn reset_stats(&self) {
        self.shared.stats.reset();
        self.shared
            .paths
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.shared
            .revisions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Replaces the object at `path` by `contents` from now on (a new ETag, a new digest).
    pub fn replace(&self, path: &str, contents: Vec<u8>) {
        self.shared.objects.replace(path, contents, Instant::now());
    }

    /// From now on every body is sent as it is: [`Options::lie`] no longer applies (a hub
    /// whose damaged copy was mended).
    pub fn stop_lying(&self) {
        self.shared.honest.store(true, Ordering::Relaxed);
    }

    /// When the server started: [`Replacement::after`] counts from here.
    pub fn started(&self) -> Instant {
        self.started
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        // Wakes the accept loop from `accept(2)`; it sees the flag and ends, closing the queue.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Accepts connections into the queue until the server stops.
fn accept_loop(shared: &Shared, listener: &TcpListener, queue: &mpsc::Sender<TcpStream>) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        let Ok(stream) = stream else {
            // A connection reset before it was accepted, or out of descriptors: wait a little
            // rather than spin.
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        if queue.send(stream).is_err() {
            return;
        }
    }
}

/// A pool thread: serves queued connections one after another until the queue closes.
fn serve_queue(shared: &Shared, queue: &Mutex<mpsc::Receiver<TcpStream>>) {
    loop {
        let next = {
            let queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
            // A timeout so that a stop is seen even while the accept thread lives.
            queue.recv_timeout(Duration::from_millis(50))
        };
        let stream = match next {
            Ok(stream) => stream,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if shared.stopping.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        let c = &shared.stats;
        let open = c.open_connections.fetch_add(1, Ordering::Relaxed) + 1;
        c.max_open_connections.fetch_max(open, Ordering::Relaxed);
        serve::connection(shared, stream);
        c.open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}
