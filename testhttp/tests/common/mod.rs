//! What the server's test files share: a small served tree, a server on it, and a
//! request written and its answer's head read off a plain `TcpStream`.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use safeload_testhttp::{Options, Server};

/// A directory with `model.safetensors` (`len` bytes of a pattern) and `sub/small.bin`.
pub fn tree(len: usize) -> (tempfile::TempDir, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("model.safetensors"), &data).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/small.bin"), b"hello").unwrap();
    (dir, data)
}

pub fn start(dir: &Path, options: Options) -> Server {
    Server::start(dir, options).unwrap()
}

/// A response head as read off the wire.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn content_length(&self) -> u64 {
        self.header("content-length").unwrap().parse().unwrap()
    }
}

/// Writes one request (no body) on `stream`, and gives its answer 10 s.
pub fn write_request(stream: &mut TcpStream, method: &str, target: &str, headers: &[&str]) {
    let mut request = format!("{method} {target} HTTP/1.1\r\nHost: test\r\n");
    for h in headers {
        request.push_str(h);
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
}

/// Reads a response head, byte by byte so that none of the body is taken.
pub fn read_head(stream: &mut TcpStream) -> Head {
    let mut raw = Vec::new();
    let mut byte = [0; 1];
    while !raw.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed inside the head");
        raw.push(byte[0]);
    }
    let text = String::from_utf8(raw).unwrap();
    let mut lines = text.split("\r\n");
    let status = lines.next().unwrap()[9..12].parse().unwrap();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_owned(), v.trim().to_owned())
        })
        .collect();
    Head { status, headers }
}
