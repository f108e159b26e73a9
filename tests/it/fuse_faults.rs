//! Failing filesystems, on the FUSE test filesystem's fault injection: short
//! reads are retried until done, `EIO` is an error naming the file and the
//! offset, a file truncated while it is being read is detected, and populating
//! a map that lost its pages is an error, not `SIGBUS`. Needs root and
//! /dev/fuse: skipped (loudly) where missing, a failure under
//! `SAFELOAD_REQUIRE_FUSE=1`.

use safeload::error::Operation;
use std::time::Duration;

use crate::common::*;
use safeload::{Dtype, ErrorKind, Loader, report::Strategy};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

fn specs() -> Vec<Spec> {
    vec![
        spec("big", Dtype::F32, &[64, 1024]),
        spec("mid", Dtype::BF16, &[3, 1000]),
        spec("small", Dtype::U8, &[17]),
    ]
}

#[test]
fn short_reads_are_retried_until_done() {
    if skip_without_fuse() {
        return;
    }
    let dir = tempdir().unwrap();
    let specs = specs();
    write_single(dir.path(), &specs);
    let fs = Mount::new(
        dir.path(),
        Options {
            short_reads: true,
            ..Options::default()
        },
    )
    .unwrap();
    for direct in [false, true] {
        for chunk in [4096, 1 << 20] {
            fs.reset_stats();
            let sd = Loader::new()
                .disable_mmap(true)
                .direct_io(direct)
                .read_size(chunk)
                .load(fs.path())
                .unwrap();
            assert_eq!(
                loaded(&sd),
                sorted(&specs),
                "direct {direct}, chunk {chunk}"
            );
            // Every answer was short, so the engine asked again and again.
            let stats = fs.stats();
            assert!(
                stats.read_requests > 2 * (sd.total_bytes() / chunk as u64),
                "{stats:?}"
            );
        }
    }
}

/// Short answers and `EINTR` together, every read mode with direct I/O on
/// and off: the bytes of a plain read. Mapped loads are left out: on a mount
/// that answers short, the kernel takes a short answer to a page fault for
/// the end of the file (`Options::short_reads`), which no reader can undo;
/// a map asked for here is refused by the file's `FOPEN_DIRECT_IO` or read
/// through it, so the mapped mode is covered by `short_reads::` on a local
/// disk instead.
#[test]
fn short_and_interrupted_reads_are_retried_in_every_mode() {
    if skip_without_fuse() {
        return;
    }
    let dir = tempdir().unwrap();
    let specs = specs();
    write_sharded(dir.path(), &specs, 2);
    let fs = Mount::new(
        dir.path(),
        Options {
            short_reads: true,
            interrupt_every: Some(3),
            ..Options::default()
        },
    )
    .unwrap();
    let mut modes: Vec<(&str, Loader)> = read_modes()
        .into_iter()
        .filter(|(name, _)| *name != "mmap")
        .collect();
    modes.push(("auto", Loader::new()));
    for (name, loader) in modes {
        fs.reset_stats();
        let sd = loader
            .load(fs.path())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(loaded(&sd), sorted(&specs), "{name}");
        // Every answer was short or interrupted, so the engine asked again.
        let stats = fs.stats();
        assert!(
            stats.interrupted > 0 && stats.read_requests > 2 * stats.interrupted,
            "{name}: {stats:?}"
        );
    }
}

#[test]
fn eio_names_the_file_and_the_offset() {
    if skip_without_fuse() {
        return;
    }
    let dir = tempdir().unwrap();
    write_single(dir.path(), &specs());
    let size = std::fs::metadata(dir.path().join("model.safetensors"))
        .unwrap()
        .len();
    let bad = size / 2;
    let fs = Mount::new(
        dir.path(),
        Options {
            direct_io: true, // byte-exact faults: no page cache in between
            eio_at: Some(("model.safetensors".into(), bad)),
            ..Options::default()
        },
    )
    .unwrap();
    let file = fs.path().join("model.safetensors");
    for chunk in [4096, 1 << 20] {
        let err = Loader::new()
            .disable_mmap(true)
            .read_size(chunk)
            .load(fs.path())
            .unwrap_err();
        match err.kind() {
            ErrorKind::Io {
                operation: Operation::Read,
                offset: Some(offset),
            } => {
                // The read that failed covers the bad byte.
                assert!(
                    *offset <= bad && bad < offset + chunk as u64,
                    "{offset} vs {bad}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.path(), Some(file.as_path()));
        assert_eq!(err.io_error().unwrap().raw_os_error(), Some(libc::EIO));
        let text = err.to_string();
        assert!(
            text.contains("model.safetensors") && text.contains("at offset"),
            "{text}"
        );
    }
    // A fault in the header is reported the same way.
    fs.set_eio_at(Some(("model.safetensors".into(), 3)));
    let err = Loader::new()
        .disable_mmap(true)
        .load(fs.path())
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Io {
                offset: Some(0),
                ..
            }
        ),
        "{err:?}"
    );
}

/// Truncates the source file after `delay`, while a slow load reads it.
fn truncate_later(path: std::path::PathBuf, delay: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        std::thread::sleep(delay);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(4096).unwrap();
    })
}

#[test]
fn truncated_while_read_buffered_is_detected() {
    if skip_without_fuse() {
        return;
    }
    let dir = tempdir().unwrap();
    write_single(dir.path(), &specs());
    let source = dir.path().join("model.safetensors");
    let fs = Mount::new(
        dir.path(),
        Options {
            direct_io: true,
            latency: Some(Duration::from_millis(10)),
            max_concurrent_reads: Some(1),
            ..Options::default()
        },
    )
    .unwrap();
    let truncation = truncate_later(source, Duration::from_millis(60));
    let err = Loader::new()
        .disable_mmap(true)
        .read_size(4096)
        .io_concurrency(1)
        .load(fs.path())
        .unwrap_err();
    truncation.join().unwrap();
    assert_eq!(
        err.path(),
        Some(fs.path().join("model.safetensors").as_path())
    );
    match err.kind() {
        ErrorKind::SizeMismatch { expected, actual } => assert!(actual < expected),
        // The mount may still report the old size: then the read that found
        // the end of the file is the error.
        ErrorKind::Io { .. } => {
            assert_eq!(
                err.io_error().unwrap().kind(),
                std::io::ErrorKind::UnexpectedEof
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn populating_a_map_that_lost_its_pages_is_an_error_not_sigbus() {
    if skip_without_fuse() {
        return;
    }
    let dir = tempdir().unwrap();
    // 4 MiB: read-ahead brings 128 KiB per request, 10 ms each, so the load
    // outlasts the truncation.
    write_single(dir.path(), &[spec("big", Dtype::F32, &[1024, 1024])]);
    let source = dir.path().join("model.safetensors");
    let fs = Mount::new(
        dir.path(),
        Options {
            latency: Some(Duration::from_millis(10)),
            max_concurrent_reads: Some(1),
            ..Options::default()
        },
    )
    .unwrap();
    let truncation = truncate_later(source, Duration::from_millis(60));
    // Populate faults the map in page by page through the slow mount; the
    // pages past the new end cannot be had. MADV_POPULATE_READ says so.
    let result = Loader::new()
        .disable_mmap(false)
        .populate(true)
        .read_size(4096)
        .io_concurrency(1)
        .load(fs.path());
    truncation.join().unwrap();
    let err = result.expect_err("the file lost its tail during the load");
    match err.kind() {
        // MADV_POPULATE_READ answers EFAULT where a fault would raise SIGBUS.
        ErrorKind::Io {
            operation: Operation::Populate,
            offset: Some(_),
        } => {
            let code = err.io_error().unwrap().raw_os_error();
            assert!(
                code == Some(libc::EFAULT) || code == Some(libc::EIO),
                "{err:?}"
            );
        }
        ErrorKind::SizeMismatch { expected, actual } => assert!(actual < expected),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.path(),
        Some(fs.path().join("model.safetensors").as_path())
    );
}

#[test]
fn an_ordinary_load_through_faulty_mounts_still_chooses_buffered() {
    if skip_without_fuse() {
        return;
    }
    // The policy does not care about faults, only the filesystem kind: this
    // guards the fault tests above against testing mapped loads by accident.
    let dir = tempdir().unwrap();
    write_single(dir.path(), &specs());
    let fs = Mount::new(dir.path(), Options::default()).unwrap();
    let sd = Loader::new().load(fs.path()).unwrap();
    assert_eq!(sd.report().files[0].strategy, Strategy::Buffered);
}
