//! What the server's test files share: a small served tree, and a server on it.
#![allow(dead_code)]

use std::path::Path;

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
