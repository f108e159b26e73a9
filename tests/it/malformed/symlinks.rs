//! Symlinks: loops fail fast; links at shard names are followed.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use safeload::{Dtype, Error, ErrorKind, load_state_dict};
use tempfile::tempdir;

use super::sharded_index::{VALID_INDEX, index_path, two_shards};
use super::{loads_as, refused};
use crate::common::{Spec, every_dtype, shard_name, spec, write_sharded, write_single};

/// `ELOOP`, "too many levels of symbolic links" (symlink(7)); Rust has no
/// stable `io::ErrorKind` for it.
const ELOOP: i32 = 40;

fn assert_loop(err: &Error) {
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    assert_eq!(
        err.io_error().unwrap().raw_os_error(),
        Some(ELOOP),
        "{err:?}"
    );
}

#[test]
fn checkpoint_path_is_a_symlink_to_itself() {
    let dir = tempdir().unwrap();
    let link = dir.path().join("loop");
    symlink(&link, &link).unwrap();
    assert_loop(&refused(&link, &link));
}

#[test]
fn checkpoint_path_runs_through_a_loop() {
    let dir = tempdir().unwrap();
    symlink("b", dir.path().join("a")).unwrap();
    symlink("a", dir.path().join("b")).unwrap();
    let path = dir.path().join("a").join("model.safetensors");
    assert_loop(&refused(&path, &path));
}

#[test]
fn index_names_a_shard_that_is_a_loop() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let shard = dir.path().join("loop.safetensors");
    symlink("loop.safetensors", &shard).unwrap();
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","w":"loop.safetensors"}}"#,
    )
    .unwrap();
    assert_loop(&refused(dir.path(), &shard));
}

/// `model.safetensors` that links to itself is not a file, so the
/// directory holds no checkpoint — the same answer the Hugging Face
/// loaders give (`os.path.isfile` is false), and no hang.
#[test]
fn directory_whose_model_file_is_a_loop() {
    let dir = tempdir().unwrap();
    symlink("model.safetensors", dir.path().join("model.safetensors")).unwrap();
    let err = refused(dir.path(), dir.path());
    assert_eq!(err.kind(), &ErrorKind::NoCheckpoint { found: vec![] });
}

/// A directory that contains a link to itself is not walked: the loader
/// only looks at the names directly inside it.
#[test]
fn directory_containing_a_loop_still_loads() {
    let dir = tempdir().unwrap();
    let specs = vec![spec("t", Dtype::F16, &[2, 2])];
    write_single(dir.path(), &specs);
    symlink(".", dir.path().join("self")).unwrap();
    symlink("self", dir.path().join("self2")).unwrap();
    loads_as(dir.path(), &specs);
    loads_as(
        &dir.path().join("self/self2/self/model.safetensors"),
        &specs,
    );
}

/// The layout of a Hugging Face cache: every file of a snapshot is a
/// relative link into `blobs/`, outside the snapshot directory. Only the
/// names written in the index are confined; links at those names are
/// followed, or no cached checkpoint could load.
fn hf_cache(root: &Path) -> (PathBuf, Vec<Spec>) {
    let blobs = root.join("blobs");
    let snapshot = root.join("snapshots").join("0123abcd");
    fs::create_dir_all(&blobs).unwrap();
    fs::create_dir_all(&snapshot).unwrap();
    let specs = vec![
        spec("x", Dtype::F32, &[2]),
        spec("y", Dtype::BF16, &[3]),
        spec("z", Dtype::I64, &[]),
    ];
    write_sharded(&blobs, &specs, 2);
    for (i, name) in [shard_name(0, 2), shard_name(1, 2)].iter().enumerate() {
        fs::rename(blobs.join(name), blobs.join(format!("shard{i}"))).unwrap();
        symlink(format!("../../blobs/shard{i}"), snapshot.join(name)).unwrap();
    }
    fs::rename(index_path(&blobs), blobs.join("index")).unwrap();
    symlink("../../blobs/index", index_path(&snapshot)).unwrap();
    (snapshot, specs)
}

#[test]
fn symlinked_shards_are_followed() {
    let root = tempdir().unwrap();
    let (snapshot, specs) = hf_cache(root.path());
    loads_as(&snapshot, &specs);
    loads_as(&index_path(&snapshot), &specs);
    // Errors name the link, not its target: that is the name the user
    // knows.
    let sd = load_state_dict(&snapshot, Some(true)).unwrap();
    assert!(
        sd.report()
            .files
            .iter()
            .all(|f| f.path.starts_with(&snapshot)),
        "{:?}",
        sd.report().files
    );
}

#[test]
fn a_dangling_shard_link_is_an_io_error_naming_the_link() {
    let root = tempdir().unwrap();
    let (snapshot, _) = hf_cache(root.path());
    fs::remove_file(root.path().join("blobs").join("shard1")).unwrap();
    let link = snapshot.join(shard_name(1, 2));
    let err = refused(&snapshot, &link);
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
}

/// A shard whose *name* is plain but which links to an absolute path
/// elsewhere (a cache on another disk, a snapshot whose blobs were moved)
/// is allowed: the index's author chose the name, the filesystem's owner
/// chose the link.
#[test]
fn a_shard_linking_outside_the_directory_is_allowed() {
    let elsewhere = tempdir().unwrap();
    let dir = tempdir().unwrap();
    let specs = two_shards(elsewhere.path());
    for name in ["a.safetensors", "b.safetensors"] {
        symlink(elsewhere.path().join(name), dir.path().join(name)).unwrap();
    }
    fs::write(index_path(dir.path()), VALID_INDEX).unwrap();
    loads_as(dir.path(), &specs);
}

/// A single-file checkpoint given as a link is followed too.
#[test]
fn a_symlinked_single_file_loads() {
    let elsewhere = tempdir().unwrap();
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let target = write_single(elsewhere.path(), &specs);
    symlink(&target, dir.path().join("model.safetensors")).unwrap();
    loads_as(dir.path(), &specs);
}
