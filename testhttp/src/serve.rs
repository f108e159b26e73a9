//! One connection's life: requests read, routed to an object, answered with its range,
//! paced by the latency and the shared link, or broken by the fault the options ask for, or
//! held unanswered.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use crate::body::send_body;
use crate::http::{self, HeadError, RangeAsk, Request, Route};
use crate::{Fault, Shared, api};

/// How long a blocked read waits before looking at the stop flag again.
pub(crate) const POLL: Duration = Duration::from_millis(50);
/// A connection answers at most this many requests, then closes (a bounded loop).
const MAX_REQUESTS_PER_CONNECTION: u64 = 100_000;
/// A request body (never expected) is read and dropped up to this size; more closes.
const MAX_DISCARDED_BODY: u64 = 1 << 20;
/// A client that stops reading is given up after this long.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How an answer ends the connection.
enum After {
    KeepAlive,
    Close,
    /// A fault already closed it, or a request held unanswered left it with no place for
    /// another answer.
    Broken,
}

/// Serves `stream` until the client closes, idles past the timeout, asks to close, or the
/// server stops.
pub(crate) fn connection(shared: &Shared, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut buf = Vec::with_capacity(4096);
    for _ in 0..MAX_REQUESTS_PER_CONNECTION {
        let head = match read_head(shared, &mut stream, &mut buf) {
            Ok(Some(head)) => head,
            Ok(None) | Err(_) => return,
        };
        let request = match http::parse_head(&head) {
            Ok(request) => request,
            Err(e) => {
                let status = if e == HeadError::TooLarge { 431 } else { 400 };
                let _ = stream.write_all(&http::response_head(status, &[], 0, false));
                return;
            }
        };
        if !discard_body(&request, &mut stream, &mut buf) {
            return;
        }
        match answer(shared, &request, &mut stream) {
            Ok(After::KeepAlive) => {}
            Ok(After::Close) => {
                let _ = stream.shutdown(Shutdown::Write);
                return;
            }
            Ok(After::Broken) | Err(_) => return,
        }
    }
}

/// Reads until a whole request head is in `buf`, and takes it out (what follows stays for
/// the next request). `None` when the client closed, idled out, or the server stops.
fn read_head(
    shared: &Shared,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> io::Result<Option<Vec<u8>>> {
    let idle_since = Instant::now();
    let mut chunk = [0; 4096];
    loop {
        if let Some(end) = http::head_end(buf) {
            let rest = buf.split_off(end);
            return Ok(Some(std::mem::replace(buf, rest)));
        }
        if buf.len() > http::MAX_HEAD {
            // Answered 431 by the parser.
            return Ok(Some(std::mem::take(buf)));
        }
        if shared.stopping.load(Ordering::Relaxed)
            || idle_since.elapsed() > shared.options.idle_timeout
        {
            return Ok(None);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Ok(None),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Drops a request's body (GET and HEAD have none; a client may still send one). False when
/// it is too large or the client went away.
fn discard_body(request: &Request, stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let Ok(mut left) = request.content_length() else {
        return false;
    };
    if left > MAX_DISCARDED_BODY {
        return false;
    }
    let buffered = (buf.len() as u64).min(left) as usize;
    buf.drain(..buffered);
    left -= buffered as u64;
    let deadline = Instant::now() + WRITE_TIMEOUT;
    let mut chunk = [0; 4096];
    while left > 0 && Instant::now() < deadline {
        match stream.read(&mut chunk[..(left as usize).min(4096)]) {
            Ok(0) => return false,
            Ok(n) => left -= n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return false,
        }
    }
    left == 0
}

/// Holds a request unanswered ([`Options::silent_heads`](crate::Options::silent_heads),
/// [`Options::silent_gets`](crate::Options::silent_gets)): sends nothing, reads and drops
/// whatever the client still sends, until it hangs up or the server stops. Each read waits
/// at most [`POLL`] (the socket's read timeout), so the loop never spins and sees a stop
/// within one poll.
fn hold_unanswered(shared: &Shared, stream: &mut TcpStream) -> After {
    shared.stats.unanswered.fetch_add(1, Ordering::Relaxed);
    let mut chunk = [0; 4096];
    while !shared.stopping.load(Ordering::Relaxed) {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    // Nothing was answered: the connection cannot serve another request.
    After::Broken
}

fn answer(shared: &Shared, request: &Request, stream: &mut TcpStream) -> io::Result<After> {
    let n = shared.stats.requests.fetch_add(1, Ordering::Relaxed) + 1;
    let options = &shared.options;
    let keep_alive = request.keep_alive();
    let after = if keep_alive {
        After::KeepAlive
    } else {
        After::Close
    };
    let head_only = match request.method.as_str() {
        "GET" => false,
        "HEAD" => true,
        _ => {
            stream.write_all(&http::response_head(405, &[], 0, keep_alive))?;
            return Ok(after);
        }
    };
    if head_only {
        shared.stats.head_requests.fetch_add(1, Ordering::Relaxed);
    }
    let route = http::route(&request.target);
    // Held before anything else (latency, faults, token, routing): a server that says
    // nothing at all.
    let silent = if head_only {
        options.silent_heads
    } else {
        options.silent_gets && !matches!(route, Some(Route::Api { .. }))
    };
    if silent {
        return Ok(hold_unanswered(shared, stream));
    }
    if let Some(latency) = options.latency {
        thread::sleep(latency);
    }
    let fault = options
        .fault
        .filter(|f| f.every > 0 && n.is_multiple_of(f.every))
        .map(|f| f.fault);
    if fault == Some(Fault::ServiceUnavailable) {
        shared.stats.faults.fetch_add(1, Ordering::Relaxed);
        stream.write_all(&http::response_head(503, &[], 0, keep_alive))?;
        return Ok(after);
    }

    // The host the hub route redirects to (loopback by its other name, `http::cdn_host`)
    // stands for the hub's CDN, whose signed URLs need no token (and a client drops its
    // `Authorization` on a redirect to another host).
    let cdn = options.hub_redirect
        && request
            .header("host")
            .is_some_and(|h| h.starts_with("localhost"));
    if let Some(token) = options.token.as_ref().filter(|_| !cdn) {
        // As the hub for a private or gated repository: 401 without a token, 403 with
        // another one.
        let status = match request.header("authorization") {
            None => Some(401),
            Some(v) if v.strip_prefix("Bearer ") == Some(token.as_str()) => None,
            Some(_) => Some(403),
        };
        if let Some(status) = status {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            let mut headers = Vec::new();
            if options.gated {
                headers.push(("X-Error-Code", "GatedRepo".to_owned()));
            }
            stream.write_all(&http::response_head(status, &headers, 0, keep_alive))?;
            return Ok(after);
        }
    }
    if unknown_repository(options, route.as_ref()) {
        // As the hub for a repository it does not have.
        let headers = [("X-Error-Code", "RepoNotFound".to_owned())];
        stream.write_all(&http::response_head(404, &headers, 0, keep_alive))?;
        return Ok(after);
    }
    if let Some(Route::Api {
        repo,
        revision,
        tree,
    }) = &route
    {
        // The hub API: JSON, whole, never faulted past the 503 above.
        let Some(body) = api::body(shared, repo, revision, *tree) else {
            let headers = [("X-Error-Code", "RevisionNotFound".to_owned())];
            stream.write_all(&http::response_head(404, &headers, 0, keep_alive))?;
            return Ok(after);
        };
        let headers = [("Content-Type", "application/json".to_owned())];
        let len = body.len() as u64;
        stream.write_all(&http::response_head(200, &headers, len, keep_alive))?;
        if !head_only {
            shared.stats.bytes_sent.fetch_add(len, Ordering::Relaxed);
            stream.write_all(&body)?;
        }
        return Ok(after);
    }
    let Located {
        path,
        mut headers,
        hub,
    } = match locate(shared, route) {
        Ok(located) => located,
        Err(headers) => {
            stream.write_all(&http::response_head(404, &headers, 0, keep_alive))?;
            return Ok(after);
        }
    };
    let Some(object) = shared.objects.get(&path, Instant::now()) else {
        shared.count_path(&path);
        if hub {
            // As the hub: the commit asked about, and that the file is not in it; or, as
            // some mirrors and proxies, only the latter.
            if options.no_commit_on_404 {
                headers.retain(|(name, _)| *name != "X-Repo-Commit");
            }
            headers.push(("X-Error-Code", "EntryNotFound".to_owned()));
        }
        stream.write_all(&http::response_head(404, &headers, 0, keep_alive))?;
        return Ok(after);
    };
    // The hub names a small file kept in git by its git blob id, an LFS file by its
    // SHA-256 (and links the LFS object's digest and size).
    let small = hub && api::is_small(&path);
    let etag = if small {
        format!("\"{}\"", object.git_oid)
    } else {
        object.etag.clone()
    };
    // A `Range` ignored for this object (every object's, or this path's), and the claim
    // of a hostile server for its whole-object answers.
    let whole = options.ignore_range || options.whole_paths.contains(&path);
    let claimed = options.claimed_len.filter(|_| whole);
    if hub && !small {
        let linked = claimed
            .filter(|_| options.claim_linked_size)
            .unwrap_or(object.len);
        headers.push(("X-Linked-Etag", format!("\"{}\"", object.sha256)));
        headers.push(("X-Linked-Size", linked.to_string()));
    }
    headers.push(("ETag", etag.clone()));
    if hub && !small && options.hub_redirect {
        // As the hub for an LFS file: its metadata on a 302 to where the bytes are, on
        // another host (the hub's client follows a redirect on the same host itself, as one
        // to a renamed repository): loopback by its other name.
        shared.count_path(&path);
        let location = match request.header("host") {
            Some(host) => format!(
                "http://{}{}",
                http::cdn_host(host),
                http::encode_path(&path)
            ),
            None => http::encode_path(&path),
        };
        headers.push(("Location", location));
        stream.write_all(&http::response_head(302, &headers, 0, keep_alive))?;
        return Ok(after);
    }
    headers.push(("Accept-Ranges", "bytes".to_owned()));
    if !http::if_match_passes(request.header("if-match"), &etag) {
        shared.count_path(&path);
        stream.write_all(&http::response_head(412, &headers, 0, keep_alive))?;
        return Ok(after);
    }
    let range_header = request.header("range");
    if range_header.is_some() {
        shared.stats.ranged_requests.fetch_add(1, Ordering::Relaxed);
    }
    let ask = if whole {
        RangeAsk::Whole
    } else {
        http::parse_range(range_header, object.len)
    };
    // The claim is met by filler past the object's end (`send_body`), or cut short of it.
    let (status, range) = match ask {
        RangeAsk::Whole => (200, 0..claimed.unwrap_or(object.len)),
        RangeAsk::Part(range) => {
            let value = format!("bytes {}-{}/{}", range.start, range.end - 1, object.len);
            headers.push(("Content-Range", value));
            (206, range)
        }
        RangeAsk::Unsatisfiable => {
            shared.count_path(&path);
            headers.push(("Content-Range", format!("bytes */{}", object.len)));
            stream.write_all(&http::response_head(416, &headers, 0, keep_alive))?;
            return Ok(after);
        }
    };
    let len = range.end - range.start;
    stream.write_all(&http::response_head(status, &headers, len, keep_alive))?;
    if head_only {
        shared.count_path(&path);
        return Ok(after);
    }
    let body_fault = fault.filter(|_| len > 0);
    if body_fault.is_some() {
        shared.stats.faults.fetch_add(1, Ordering::Relaxed);
    }
    // A broken body stops half way, so that the client has something to resume from.
    let send = if body_fault.is_some() { len / 2 } else { len };
    // Counted before sending, so that a client that has its answer sees it counted.
    shared.count_path(&path);
    send_body(shared, stream, (&path, &object), range.start, send)?;
    match body_fault {
        Some(Fault::ResetMidBody) => {
            // SO_LINGER 0: close(2) then sends RST, not FIN (socket(7)).
            let _ = socket2::SockRef::from(&*stream).set_linger(Some(Duration::ZERO));
            Ok(After::Broken)
        }
        Some(Fault::ShortBody) => {
            let _ = stream.shutdown(Shutdown::Both);
            Ok(After::Broken)
        }
        Some(Fault::ServiceUnavailable) | None => Ok(after),
    }
}

/// Whether `route` is the hub's (route or API) for a repository not among
/// [`Options::repositories`](crate::Options::repositories).
fn unknown_repository(options: &crate::Options, route: Option<&Route>) -> bool {
    let repo = match route {
        Some(Route::Api { repo, .. } | Route::Hub { repo, .. }) => repo,
        _ => return false,
    };
    let known = options.repositories.as_ref();
    known.is_some_and(|known| !known.iter().any(|r| r == repo))
}

/// Where a request target leads.
struct Located {
    /// The object's path under the served directory.
    path: String,
    /// The headers the route adds (the hub's).
    headers: Vec<(&'static str, String)>,
    /// Whether it came by the hub's route.
    hub: bool,
}

/// Where a target leads; `Err` with the headers of a 404 for a target outside the tree or
/// a revision the hub does not have.
fn locate(shared: &Shared, route: Option<Route>) -> Result<Located, Vec<(&'static str, String)>> {
    let options = &shared.options;
    match route.ok_or_else(Vec::new)? {
        Route::Static { path } => Ok(Located {
            path,
            headers: Vec::new(),
            hub: false,
        }),
        Route::Api { .. } => Err(Vec::new()),
        Route::Hub {
            repo: _,
            revision,
            path,
        } => {
            *shared
                .revisions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(revision.clone())
                .or_default() += 1;
            // The foreign commit is answered as if it were this one: with this one's files,
            // and named so.
            let known = revision == options.commit
                || options.branches.contains(&revision)
                || options.foreign_commit.as_ref() == Some(&revision);
            if !known {
                return Err(vec![("X-Error-Code", "RevisionNotFound".to_owned())]);
            }
            let headers = vec![("X-Repo-Commit", options.commit.clone())];
            Ok(Located {
                path,
                headers,
                hub: true,
            })
        }
    }
}

/// The counters a server keeps, shared by its connections.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub requests: std::sync::atomic::AtomicU64,
    pub head_requests: std::sync::atomic::AtomicU64,
    pub ranged_requests: std::sync::atomic::AtomicU64,
    pub bytes_sent: std::sync::atomic::AtomicU64,
    pub faults: std::sync::atomic::AtomicU64,
    pub refused: std::sync::atomic::AtomicU64,
    pub unanswered: std::sync::atomic::AtomicU64,
    pub connections: std::sync::atomic::AtomicU64,
    pub open_connections: std::sync::atomic::AtomicU64,
    pub max_open_connections: std::sync::atomic::AtomicU64,
}

impl Counters {
    pub(crate) fn reset(&self) {
        for c in [
            &self.requests,
            &self.head_requests,
            &self.ranged_requests,
            &self.bytes_sent,
            &self.faults,
            &self.refused,
            &self.unanswered,
            &self.connections,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        self.max_open_connections.store(
            self.open_connections.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
}
