//! Files that are not regular files: FIFOs and devices, refused at the
//! open, promptly.

use std::fs;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use safeload::{Error, ErrorKind, load_state_dict};
use tempfile::tempdir;

use super::sharded_index::{index_path, two_shards};
use super::{EVERY_MODE, refused};

/// Loads `path` in every mode on another thread; `None` if that does not
/// finish in 5 seconds (the thread is left blocked; the test process
/// ends it).
fn load_with_deadline(path: &Path) -> Option<Vec<Result<usize, Error>>> {
    let (send, receive) = mpsc::channel();
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let results: Vec<_> = EVERY_MODE
            .iter()
            .map(|mode| load_state_dict(&path, *mode).map(|sd| sd.len()))
            .collect();
        let _ = send.send(results);
    });
    receive.recv_timeout(Duration::from_secs(5)).ok()
}

fn mkfifo(path: &Path) {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

/// A FIFO at a shard's name: opening it for reading blocks until a writer
/// appears, which for a hostile checkpoint is never. Expected: refused as
/// not a regular file, promptly, naming the FIFO.
#[test]
fn index_names_a_fifo() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let fifo = dir.path().join("c.safetensors");
    mkfifo(&fifo);
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","w":"c.safetensors"}}"#,
    )
    .unwrap();
    let results = load_with_deadline(dir.path()).expect("loading a FIFO shard hung");
    for result in results {
        let err = result.expect_err("a FIFO is not a checkpoint");
        assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
        assert_eq!(err.path(), Some(fifo.as_path()));
    }
}

/// The same for a FIFO given as the checkpoint path itself.
#[test]
fn checkpoint_path_is_a_fifo() {
    let dir = tempdir().unwrap();
    let fifo = dir.path().join("model.safetensors");
    mkfifo(&fifo);
    let results = load_with_deadline(&fifo).expect("loading a FIFO hung");
    for result in results {
        let err = result.expect_err("a FIFO is not a checkpoint");
        assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
        assert_eq!(err.path(), Some(fifo.as_path()));
    }
}

/// A character device is not a checkpoint either: refused at the open,
/// not read (`/dev/zero` would read as endless data).
#[test]
fn checkpoint_path_is_a_device() {
    for device in ["/dev/null", "/dev/zero"] {
        let path = Path::new(device);
        if path.exists() {
            let err = refused(path, path);
            assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
        }
    }
}
