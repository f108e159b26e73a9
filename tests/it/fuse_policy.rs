//! End to end on a real FUSE mount of the test filesystem: the auto policy reads
//! hf-mount and other FUSE mounts buffered, says why, and loads the same tensors
//! as from local disk. Needs root and /dev/fuse: skipped (loudly) where they are
//! missing, a failure under `SAFELOAD_REQUIRE_FUSE=1` (as in CI).
//!
//! The policy for every kind of filesystem, from injected mount tables:
//! `tests/it/policy.rs`.

use crate::common::*;
use safeload::mount::{self, MountKind};
use safeload::{Loader, load_state_dict, report::Strategy};

/// Whether `path` lives on an hf-mount mount, as the crate docs teach it.
fn is_on_hf_mount(path: impl AsRef<std::path::Path>) -> bool {
    mount::lookup(path).is_ok_and(|m| m.kind == mount::MountKind::HfMount)
}
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

fn mount_as(source: &std::path::Path, fsname: &str, subtype: Option<&str>) -> Mount {
    Mount::new(
        source,
        Options {
            fsname: fsname.to_string(),
            subtype: subtype.map(str::to_string),
            ..Options::default()
        },
    )
    .unwrap()
}

#[test]
fn hf_mount_is_read_buffered_and_says_why() {
    if skip_without_fuse() {
        return;
    }
    let local = tempdir().unwrap();
    let specs = every_dtype();
    write_sharded(local.path(), &specs, 3);
    let fs = mount_as(local.path(), "hf-mount", None);

    let from_fuse = load_state_dict(fs.path(), None).unwrap();
    let from_disk = load_state_dict(local.path(), None).unwrap();
    assert_eq!(loaded(&from_fuse), loaded(&from_disk));
    assert_eq!(loaded(&from_fuse), sorted(&specs));

    assert_eq!(from_fuse.report().files.len(), 3);
    for file in &from_fuse.report().files {
        assert_eq!(file.strategy, Strategy::Buffered, "{}", file.explain());
        let m = file.mount.as_ref().expect("the mount is found");
        assert_eq!(m.kind, MountKind::HfMount);
        assert_eq!(m.source, "hf-mount");
        assert_eq!(m.mount_point, fs.path());
        assert!(
            file.explain().contains("on hf-mount (fuse) at"),
            "{}",
            file.reason
        );
        assert!(
            file.explain().contains("where mmap page faults stall"),
            "{}",
            file.reason
        );
        assert!(file.bytes_read > 0);
    }
    for file in &from_disk.report().files {
        assert_eq!(file.strategy, Strategy::Mmap, "{}", file.explain());
        assert_ne!(
            file.mount.as_ref().map(|m| m.kind),
            Some(MountKind::HfMount)
        );
    }
    let text = from_fuse.report().to_string();
    assert!(text.contains("buffered: on hf-mount"), "{text}");
}

#[test]
fn is_on_hf_mount_only_there() {
    if skip_without_fuse() {
        return;
    }
    let local = tempdir().unwrap();
    let path = write_single(local.path(), &[spec("w", safeload::Dtype::F32, &[4])]);
    let fs = mount_as(local.path(), "hf-mount", Some("hf-mount"));
    assert!(is_on_hf_mount(fs.path().join("model.safetensors")));
    assert!(is_on_hf_mount(fs.path()));
    assert!(!is_on_hf_mount(&path));
    assert!(!is_on_hf_mount(local.path()));
    let m = mount::lookup(fs.path().join("model.safetensors")).unwrap();
    assert_eq!(m.fs_type, "fuse.hf-mount");
    assert_eq!(m.detected_by, mount::Detection::Device);
}

#[test]
fn another_fuse_filesystem_is_generic_fuse_and_buffered() {
    if skip_without_fuse() {
        return;
    }
    let local = tempdir().unwrap();
    let specs = every_dtype();
    write_single(local.path(), &specs);
    let fs = mount_as(local.path(), "s3fs-bucket", Some("s3fs"));
    assert!(!is_on_hf_mount(fs.path()));
    let sd = load_state_dict(fs.path(), None).unwrap();
    assert_eq!(loaded(&sd), sorted(&specs));
    let file = &sd.report().files[0];
    assert_eq!(file.mount.as_ref().unwrap().kind, MountKind::Fuse);
    assert_eq!(file.strategy, Strategy::Buffered);
    assert!(
        file.explain().contains("on FUSE (fuse.s3fs) at"),
        "{}",
        file.reason
    );
}

#[test]
fn explicit_choice_overrides_the_policy_on_fuse() {
    if skip_without_fuse() {
        return;
    }
    let local = tempdir().unwrap();
    let specs = every_dtype();
    write_single(local.path(), &specs);
    let fs = mount_as(local.path(), "hf-mount", None);
    // Mapping through FUSE works when asked for; it is the policy's choice not to.
    let sd = Loader::new().disable_mmap(false).load(fs.path()).unwrap();
    assert_eq!(loaded(&sd), sorted(&specs));
    let file = &sd.report().files[0];
    assert_eq!(file.strategy, Strategy::Mmap);
    assert!(
        file.explain().contains("disable_mmap(false) was requested"),
        "{}",
        file.reason
    );
    assert!(file.explain().contains("hf-mount"), "{}", file.explain());
}

#[test]
fn decided_for_every_shard() {
    if skip_without_fuse() {
        return;
    }
    // Shard 1 lives on the FUSE mount (the checkpoint links to it, as a hub cache
    // snapshot links into blobs/); shards 2 and 3 are local.
    let remote = tempdir().unwrap();
    let local = tempdir().unwrap();
    let specs = every_dtype();
    write_sharded(local.path(), &specs, 3);
    let first = shard_name(0, 3);
    std::fs::rename(local.path().join(&first), remote.path().join(&first)).unwrap();
    let fs = mount_as(remote.path(), "hf-mount", None);
    std::os::unix::fs::symlink(fs.path().join(&first), local.path().join(&first)).unwrap();

    let sd = load_state_dict(local.path(), None).unwrap();
    assert_eq!(loaded(&sd), sorted(&specs));
    let strategies: Vec<_> = sd.report().files.iter().map(|f| f.strategy).collect();
    assert_eq!(
        strategies,
        [Strategy::Buffered, Strategy::Mmap, Strategy::Mmap]
    );
}
