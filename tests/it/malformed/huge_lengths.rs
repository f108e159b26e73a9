//! Huge lengths: refused without allocating anything of their size. Each
//! test runs alone in a child process, where `allocation_watch` sees the
//! process's allocations as the load's.

use std::fs;

use safeload::{ErrorKind, MAX_HEADER_LEN};
use tempfile::tempdir;

use super::allocation_watch::{SMALL, largest_allocation_during};
use super::refused;
use super::single_files::{TERABYTE, file, with_length_field};
use crate::common::child::{run_alone, run_role};

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`); each role is a test
/// of this file that measures allocations, alone in its process.
#[test]
fn child() {
    run_role(&[
        (
            "huge-length-fields",
            huge_length_fields_allocate_nothing_of_their_size_in_child,
        ),
        (
            "just-over-the-cap",
            header_just_over_the_cap_with_the_bytes_present_in_child,
        ),
        (
            "exactly-at-the-cap",
            header_exactly_at_the_cap_is_read_once_and_parsed_in_child,
        ),
    ]);
}

#[test]
fn huge_length_fields_allocate_nothing_of_their_size() {
    run_alone(module_path!(), "huge-length-fields");
}

fn huge_length_fields_allocate_nothing_of_their_size_in_child() {
    let files = [
        with_length_field(u64::MAX, b"{}", 0),
        with_length_field(u64::MAX - 7, b"{}", 0),
        with_length_field(1 << 63, b"{}", 0),
        with_length_field(MAX_HEADER_LEN + 1, b"{}", 0),
        with_length_field(MAX_HEADER_LEN, b"{}", 0),
        file(TERABYTE, 8),
    ];
    let dir = tempdir().unwrap();
    for (i, bytes) in files.iter().enumerate() {
        let path = dir.path().join(format!("{i}.safetensors"));
        fs::write(&path, bytes).unwrap();
        let largest = largest_allocation_during(|| {
            refused(&path, &path);
        });
        assert!(
            largest < SMALL,
            "file {i}: an allocation of {largest} bytes was attempted"
        );
    }
}

/// A file whose length field says one byte past the cap, with that many bytes
/// really following: written sparse (`set_len`), so it costs no disk.
#[test]
fn header_just_over_the_cap_with_the_bytes_present() {
    run_alone(module_path!(), "just-over-the-cap");
}

fn header_just_over_the_cap_with_the_bytes_present_in_child() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    fs::write(&path, (MAX_HEADER_LEN + 1).to_le_bytes()).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(8 + MAX_HEADER_LEN + 1).unwrap();
    drop(file);

    let largest = largest_allocation_during(|| {
        let err = refused(&path, &path);
        assert_eq!(
            err.kind(),
            &ErrorKind::HeaderTooLarge {
                len: MAX_HEADER_LEN + 1,
                limit: MAX_HEADER_LEN
            }
        );
    });
    assert!(
        largest < SMALL,
        "an allocation of {largest} bytes was attempted"
    );
}

/// The cap itself is accepted as a length: a header of exactly 100 MB (sparse,
/// so all NUL bytes) is read, once, and refused as JSON.
#[test]
fn header_exactly_at_the_cap_is_read_once_and_parsed() {
    run_alone(module_path!(), "exactly-at-the-cap");
}

fn header_exactly_at_the_cap_is_read_once_and_parsed_in_child() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("cap.safetensors");
    fs::write(&path, MAX_HEADER_LEN.to_le_bytes()).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(8 + MAX_HEADER_LEN).unwrap();
    drop(file);

    let largest = largest_allocation_during(|| {
        let err = refused(&path, &path);
        assert!(
            matches!(err.kind(), ErrorKind::InvalidHeader { .. }),
            "{err:?}"
        );
    });
    assert!(
        largest <= MAX_HEADER_LEN as usize,
        "a header of {MAX_HEADER_LEN} bytes needed an allocation of {largest}"
    );
}
