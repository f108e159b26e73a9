//! Malformed checkpoints, built in code: each refused with its exact `ErrorKind`, naming the file at fault, in every read mode.
//!
//! Never a panic, a hang, or an allocation of the size a file claims.
//!
//! Every case runs through `load_state_dict(path, Some(true))` (buffered),
//! `Some(false)` (mapped) and `None` (decided per file), which must agree
//! ([`refused`], [`loads_as`], below). Single-file cases are built as bytes
//! by small helpers and listed once, in `header_cases!` (`single_files`),
//! which makes one test per case and also feeds the fuzz targets' seed
//! corpus (`fuzz_seeds`). One file per kind of damage:
//!
//! - `single_files`: one file, as bytes (the length field, the header's
//!   text, tensor entries, offsets, names and metadata);
//! - `huge_lengths`: lengths refused without allocating anything of their
//!   size, measured by `allocation_watch`;
//! - `sharded_index`: the index of a sharded checkpoint;
//! - `missing_path`, `directories`: a path that names nothing, a directory
//!   with no checkpoint to pick;
//! - `symlinks`, `special_files`: links, FIFOs and devices;
//! - `fuzz_seeds`: the fuzz targets' seed corpus, generated from the cases.

use std::path::Path;

use crate::common::{Spec, loaded, sorted};
use safeload::{Error, load_state_dict};

mod allocation_watch;
#[cfg(feature = "remote")]
pub(crate) use allocation_watch::largest_allocation_during;
mod directories;
mod fuzz_seeds;
mod huge_lengths;
mod missing_path;
mod sharded_index;
mod single_files;
#[cfg(unix)]
mod special_files;
#[cfg(unix)]
mod symlinks;

/// Every `disable_mmap` value: buffered, mapped, decided per file.
const EVERY_MODE: [Option<bool>; 3] = [Some(true), Some(false), None];

/// Loads `path` in every mode and asserts that each fails, with the same kind,
/// blaming `at` (in `path()` and in the message). Returns the first error.
fn refused(path: &Path, at: &Path) -> Error {
    let mut errors: Vec<Error> = Vec::new();
    for mode in EVERY_MODE {
        let err = match load_state_dict(path, mode) {
            Ok(sd) => panic!(
                "{}: disable_mmap={mode:?} loaded {} tensors, expected an error",
                path.display(),
                sd.len()
            ),
            Err(err) => err,
        };
        assert_eq!(err.path(), Some(at), "disable_mmap={mode:?}: {err}");
        assert!(
            err.to_string().contains(&at.display().to_string()),
            "the message names the file: {err}"
        );
        if let Some(first) = errors.first() {
            assert_eq!(
                err.kind(),
                first.kind(),
                "disable_mmap={mode:?} fails differently from Some(true)"
            );
        }
        errors.push(err);
    }
    errors.swap_remove(0)
}

/// Loads `path` in every mode and asserts that each load succeeds with these
/// tensors.
fn loads_as(path: &Path, expected: &[Spec]) {
    for mode in EVERY_MODE {
        let sd = load_state_dict(path, mode)
            .unwrap_or_else(|e| panic!("disable_mmap={mode:?}: {e} ({e:?})"));
        assert_eq!(loaded(&sd), sorted(expected), "disable_mmap={mode:?}");
    }
}
