//! A counting TCP proxy on `127.0.0.1`, in front of a server that keeps no counters of its
//! own (`moto_server`): requests by method and path, and the bytes the server sent back
//! (bodies and heads), as the test HTTP server's `stats()` and `path_stats()` count them.
//!
//! Each connection is two threads copying bytes, one each way. The client's side is read as
//! a stream of request heads (`Content-Length` bodies skipped), so that every request is
//! counted once, keep-alive or not.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};

/// What went through the proxy since it started or was last reset.
#[derive(Debug, Clone, Default)]
pub struct Traffic {
    pub requests: u64,
    /// Bytes the server sent back: answers' heads and bodies.
    pub bytes_down: u64,
    /// Requests by path (the target without its query).
    pub paths: HashMap<String, u64>,
    /// Requests by method.
    pub methods: HashMap<String, u64>,
    /// The most connections open at once.
    pub max_open: u64,
}

#[derive(Default)]
struct Counters {
    traffic: Mutex<Traffic>,
    bytes_down: AtomicU64,
    open: AtomicU64,
    max_open: AtomicU64,
}

pub struct Proxy {
    addr: SocketAddr,
    counters: Arc<Counters>,
    stopping: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on a port the OS picks and forwards every connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let (c, s) = (Arc::clone(&counters), Arc::clone(&stopping));
        let accept = thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    let c = Arc::clone(&c);
                    // A connection the upstream refuses is dropped: the client sees it closed.
                    let _ = thread::Builder::new()
                        .name("proxy-conn".into())
                        .spawn(move || connection(&c, client, upstream));
                }
            })?;
        Ok(Proxy {
            addr,
            counters,
            stopping,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn traffic(&self) -> Traffic {
        let mut t = lock(&self.counters.traffic).clone();
        t.bytes_down = self.counters.bytes_down.load(Ordering::Relaxed);
        t.max_open = self.counters.max_open.load(Ordering::Relaxed);
        t
    }

    /// Counters to zero (the most open connections to those open now).
    pub fn reset(&self) {
        *lock(&self.counters.traffic) = Traffic::default();
        self.counters.bytes_down.store(0, Ordering::Relaxed);
        let open = self.counters.open.load(Ordering::Relaxed);
        self.counters.max_open.store(open, Ordering::Relaxed);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        // Wakes `accept(2)`; open connections end when their client closes.
        let _ = TcpStream::connect(self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Copies one connection both ways until both sides have closed.
fn connection(counters: &Counters, client: TcpStream, upstream: SocketAddr) {
    let Ok(server) = TcpStream::connect(upstream) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let open = counters.open.fetch_add(1, Ordering::Relaxed) + 1;
    counters.max_open.fetch_max(open, Ordering::Relaxed);
    let (Ok(client_w), Ok(server_r)) = (client.try_clone(), server.try_clone()) else {
        counters.open.fetch_sub(1, Ordering::Relaxed);
        return;
    };
    thread::scope(|scope| {
        scope.spawn(|| {
            let mut from = server_r;
            let mut to = client_w;
            let mut buf = vec![0u8; 256 << 10];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        counters.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
        let mut from = client;
        let mut to = server;
        let mut requests = Requests::default();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    requests.feed(&buf[..n], counters);
                }
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    counters.open.fetch_sub(1, Ordering::Relaxed);
}

/// The client's side of a connection read as requests: heads, each followed by its
/// `Content-Length` bytes of body.
#[derive(Default)]
struct Requests {
    head: Vec<u8>,
    body_left: u64,
}

impl Requests {
    fn feed(&mut self, mut bytes: &[u8], counters: &Counters) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = (self.body_left.min(bytes.len() as u64)) as usize;
                self.body_left -= n as u64;
                bytes = &bytes[n..];
                continue;
            }
            // Only what may complete the head is taken, so that a body after it is skipped.
            let before = self.head.len();
            self.head.extend_from_slice(bytes);
            let from = before.saturating_sub(3);
            match self.head[from..].windows(4).position(|w| w == b"\r\n\r\n") {
                Some(i) => {
                    let end = from + i + 4;
                    bytes = &bytes[end - before..];
                    self.head.truncate(end);
                    self.body_left = count(&self.head, counters);
                    self.head.clear();
                }
                None => {
                    if self.head.len() > 1 << 20 {
                        // Not HTTP: stop parsing, keep forwarding.
                        self.head.clear();
                    }
                    return;
                }
            }
        }
    }
}

/// Counts one request head; returns its body's length.
fn count(head: &[u8], counters: &Counters) -> u64 {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let mut words = lines.next().unwrap_or_default().split(' ');
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_string();
    let body = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| name.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    let mut t = lock(&counters.traffic);
    t.requests += 1;
    *t.paths.entry(path).or_default() += 1;
    *t.methods.entry(method).or_default() += 1;
    body
}
