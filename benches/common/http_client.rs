//! A minimal HTTP/1.1 client for the remote benchmark's raw arms: `GET` (whole, or one
//! `Range`), `HEAD` and `PUT` on one kept-alive TCP connection, bodies read straight into a
//! buffer of the caller's, reused from request to request.
//!
//! Enough for the two servers the benchmark runs (the crate's test HTTP server and
//! `moto_server`): plain `http://`, `Content-Length` bodies or bodies up to the close, keep-alive
//! where the answer allows it (HTTP/1.1 without `Connection: close`), a new connection
//! otherwise. Chunked bodies are refused (neither server sends them for objects).
//!
//! NOTE: a client of the benchmark's own rather than tokio + reqwest: the "limit" it
//! measures is the server's and the link's, so the client should add nothing but the kernel's
//! copy into a buffer that is already there (reqwest hands out `Bytes` it allocates per
//! chunk); and threads blocking on sockets need no runtime of the bench's own on the 2 cores
//! the server shares.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::Duration;

/// A request's answer, once its head is read.
#[derive(Debug, Clone, Copy)]
pub struct Answer {
    pub status: u16,
    /// The body's length, where the head gives it.
    pub content_length: Option<u64>,
}

/// The parts of an `http://host:port/path` URL the client needs.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `host:port`, for the socket and the `Host` header.
    pub host: String,
    /// The path, from its first `/` (a `/` if there is none).
    pub path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url}: only http:// URLs"))?;
        let (host, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        Ok(Endpoint {
            host: host.to_string(),
            path: path.to_string(),
        })
    }
}

/// How long a socket waits for the other side before the request fails.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes of a response head.
const MAX_HEAD: usize = 64 << 10;

/// One connection to `host`, opened on the first request and again whenever the server
/// closed it.
pub struct Connection {
    host: String,
    stream: Option<TcpStream>,
    /// Bytes read past the last head: the start of its body.
    pending: Vec<u8>,
    /// Whether the server keeps the connection after the current answer.
    keep: bool,
}

impl Connection {
    pub fn new(host: &str) -> Connection {
        Connection {
            host: host.to_string(),
            stream: None,
            pending: Vec::new(),
            keep: false,
        }
    }

    /// `HEAD target`: the answer's head.
    pub fn head(&mut self, target: &str) -> io::Result<Answer> {
        let answer = self.request("HEAD", target, &[], None)?;
        self.end_answer();
        Ok(answer)
    }

    /// `GET target`, the bytes of `range` only if given: the body is read into `buf`, and
    /// each time `buf` is full (and at the end) `each(filled, offset_in_body)` is called.
    /// Returns the body's length. A status other than 200 (206 for a range) is an error,
    /// after the body is read and dropped.
    pub fn get(
        &mut self,
        target: &str,
        range: Option<Range<u64>>,
        buf: &mut [u8],
        mut each: impl FnMut(&[u8], u64) -> io::Result<()>,
    ) -> io::Result<u64> {
        let header = range.map(|r| format!("Range: bytes={}-{}\r\n", r.start, r.end - 1));
        let answer = self.request(
            "GET",
            target,
            header.as_deref().unwrap_or("").as_bytes(),
            None,
        )?;
        let expected = if header.is_some() { 206 } else { 200 };
        if answer.status != expected {
            self.read_body(answer.content_length, buf, |_, _| Ok(()))?;
            return Err(io::Error::other(format!(
                "GET {target}: status {} (expected {expected})",
                answer.status
            )));
        }
        self.read_body(answer.content_length, buf, &mut each)
    }

    /// `PUT target` with `headers` (lines ending in CRLF) and the `len` bytes `body` reads
    /// as the request body; the status.
    pub fn put(
        &mut self,
        target: &str,
        headers: &str,
        body: &mut dyn Read,
        len: u64,
    ) -> io::Result<u16> {
        let answer = self.request("PUT", target, headers.as_bytes(), Some((body, len)))?;
        let mut scratch = [0u8; 4096];
        self.read_body(answer.content_length, &mut scratch, |_, _| Ok(()))?;
        Ok(answer.status)
    }

    /// Sends a request and reads its answer's head. A kept-alive connection the server
    /// closed meanwhile fails before any byte of the answer: the request is sent once more
    /// on a new connection (never a request with a body: it was consumed).
    fn request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[u8],
        body: Option<(&mut dyn Read, u64)>,
    ) -> io::Result<Answer> {
        let reused = self.stream.is_some();
        let has_body = body.is_some();
        match self.try_request(method, target, headers, body) {
            Err((e, answered)) if reused && !answered && !has_body => {
                self.close();
                self.try_request(method, target, headers, None)
                    .map_err(|(e2, _)| io::Error::new(e2.kind(), format!("{e2} (before: {e})")))
            }
            result => result.map_err(|(e, _)| e),
        }
    }

    /// The error says whether any byte of an answer came back.
    fn try_request(
        &mut self,
        method: &str,
        target: &str,
        headers: &[u8],
        body: Option<(&mut dyn Read, u64)>,
    ) -> Result<Answer, (io::Error, bool)> {
        let unanswered = |e: io::Error| (e, false);
        if self.stream.is_none() {
            let stream = TcpStream::connect(&self.host).map_err(unanswered)?;
            let _ = stream.set_nodelay(true);
            stream
                .set_read_timeout(Some(SOCKET_TIMEOUT))
                .map_err(unanswered)?;
            stream
                .set_write_timeout(Some(SOCKET_TIMEOUT))
                .map_err(unanswered)?;
            self.stream = Some(stream);
            self.pending.clear();
        }
        let stream = self.stream.as_mut().expect("connected above");
        let mut head =
            format!("{method} {target} HTTP/1.1\r\nHost: {}\r\n", self.host).into_bytes();
        head.extend_from_slice(headers);
        if let Some((_, len)) = &body {
            head.extend_from_slice(format!("Content-Length: {len}\r\n").as_bytes());
        }
        head.extend_from_slice(b"\r\n");
        stream.write_all(&head).map_err(unanswered)?;
        if let Some((body, len)) = body {
            let copied = io::copy(&mut body.take(len), stream).map_err(unanswered)?;
            if copied != len {
                return Err(unanswered(io::Error::other("the request body ended early")));
            }
        }
        // The answer's head, and what follows it.
        let end = loop {
            if let Some(i) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if self.pending.len() > MAX_HEAD {
                return Err((io::Error::other("an answer head over 64 KiB"), true));
            }
            let mut chunk = [0u8; 8192];
            let n = stream
                .read(&mut chunk)
                .map_err(|e| (e, !self.pending.is_empty()))?;
            if n == 0 {
                let answered = !self.pending.is_empty();
                return Err((io::ErrorKind::UnexpectedEof.into(), answered));
            }
            self.pending.extend_from_slice(&chunk[..n]);
        };
        let head: Vec<u8> = self.pending.drain(..end).collect();
        let answered = |e: String| (io::Error::other(e), true);
        let text =
            std::str::from_utf8(&head).map_err(|_| answered("a head not in UTF-8".into()))?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut words = status_line.split(' ');
        let version = words.next().unwrap_or_default();
        let status = words
            .next()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| answered(format!("a bad status line: {status_line:?}")))?;
        let mut content_length = None;
        let mut connection = None;
        for line in lines {
            let Some((name, value)) = line.split_once(':') else {
                continue;
            };
            let value = value.trim();
            match name.trim().to_ascii_lowercase().as_str() {
                "content-length" => content_length = value.parse().ok(),
                "connection" => connection = Some(value.to_ascii_lowercase()),
                "transfer-encoding" if !value.eq_ignore_ascii_case("identity") => {
                    return Err(answered(format!("{method} {target}: a {value} body")));
                }
                _ => {}
            }
        }
        self.keep = match (version, connection.as_deref()) {
            (_, Some("close")) => false,
            ("HTTP/1.1", _) => true,
            (_, Some("keep-alive")) => true,
            _ => false,
        };
        // A HEAD's answer and a 204/304 have no body, whatever their length says.
        let content_length = if method == "HEAD" || status == 204 || status == 304 {
            Some(0)
        } else {
            content_length
        };
        if content_length.is_none() {
            // The body runs to the close.
            self.keep = false;
        }
        Ok(Answer {
            status,
            content_length,
        })
    }

    /// Reads the current answer's body (`len` bytes, or up to the close) through `buf`.
    fn read_body(
        &mut self,
        len: Option<u64>,
        buf: &mut [u8],
        mut each: impl FnMut(&[u8], u64) -> io::Result<()>,
    ) -> io::Result<u64> {
        let mut done = 0u64;
        let mut filled = 0usize;
        let result = (|| {
            loop {
                let left = len.map_or(u64::MAX, |l| l - done - filled as u64);
                if left == 0 {
                    break;
                }
                let room = (buf.len() - filled).min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = if !self.pending.is_empty() {
                    let n = room.min(self.pending.len());
                    buf[filled..filled + n].copy_from_slice(&self.pending[..n]);
                    self.pending.drain(..n);
                    n
                } else {
                    let stream = self.stream.as_mut().ok_or(io::ErrorKind::NotConnected)?;
                    match stream.read(&mut buf[filled..filled + room]) {
                        Ok(0) if len.is_none() => break,
                        Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                        Err(e) => return Err(e),
                    }
                };
                filled += n;
                if filled == buf.len() {
                    each(&buf[..filled], done)?;
                    done += filled as u64;
                    filled = 0;
                }
            }
            if filled > 0 {
                each(&buf[..filled], done)?;
                done += filled as u64;
            }
            Ok(done)
        })();
        if result.is_err() {
            self.close();
        } else {
            self.end_answer();
        }
        result
    }

    /// After an answer: the connection is kept for the next request, or closed.
    fn end_answer(&mut self) {
        if !self.keep {
            self.close();
        }
    }

    fn close(&mut self) {
        self.stream = None;
        self.pending.clear();
    }
}
