//! The auto policy from injected mount tables (no FUSE needed), and the memory
//! guard. The environment override runs in a child process of its own
//! (`tests/it/environment.rs`), since every load reads the environment; the
//! policy on a real FUSE mount is in `tests/it/fuse_policy.rs`.

use crate::common::*;
use safeload::mount::{MountKind, MountTable};
use safeload::{Loader, report::Strategy};
use tempfile::tempdir;

/// A table that puts every path on one filesystem, mounted at `/`.
fn table(line: &str) -> MountTable {
    MountTable::parse(line)
}

#[test]
fn every_kind_gets_its_strategy() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    write_single(dir.path(), &specs);
    let cases = [
        // as a fuser mount with fsname hf-mount shows in mountinfo
        (
            "36 25 0:50 / / ro,nosuid,nodev - fuse hf-mount ro,user_id=0,group_id=0",
            MountKind::HfMount,
            Strategy::Buffered,
            "a userspace daemon serves it, where mmap page faults stall",
        ),
        // hf-mount's NFS mode: a userspace NFS server on loopback
        (
            "36 25 0:50 / / rw - nfs4 127.0.0.1:/ rw,vers=4.1,addr=127.0.0.1",
            MountKind::HfMount,
            Strategy::Buffered,
            "on hf-mount (nfs4) at / — a userspace daemon serves it",
        ),
        (
            "36 25 0:50 / / rw - fuse.sshfs me@host:/data rw,user_id=0",
            MountKind::Fuse,
            Strategy::Buffered,
            "on FUSE (fuse.sshfs) at /",
        ),
        (
            "36 25 0:50 / / rw - nfs4 10.0.0.2:/export rw,vers=4.2,addr=10.0.0.2",
            MountKind::Network,
            Strategy::Mmap,
            "network filesystem (nfs4)",
        ),
        (
            "36 25 0:50 / / rw - lustre 10.0.0.1@tcp:/fs rw",
            MountKind::Network,
            Strategy::Mmap,
            "network filesystem (lustre)",
        ),
        (
            "36 25 254:0 / / rw,relatime - ext4 /dev/vda rw",
            MountKind::Local,
            Strategy::Mmap,
            "local filesystem (ext4) at /",
        ),
    ];
    for (line, kind, strategy, words) in cases {
        let sd = Loader::new()
            .mount_table(table(line))
            .load(dir.path())
            .unwrap();
        assert_eq!(loaded(&sd), sorted(&specs));
        let file = &sd.report().files[0];
        assert_eq!(file.mount.as_ref().unwrap().kind, kind, "{line}");
        assert_eq!(file.strategy, strategy, "{line}");
        assert!(file.explain().contains(words), "{line}: {}", file.reason);
    }
}

#[test]
fn memory_guard_maps_auto_files_and_refuses_explicit_buffered() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    let fuse = table("36 25 0:50 / / ro - fuse hf-mount ro,user_id=0,group_id=0");

    // Auto chose buffered (FUSE); with 100 bytes available it maps instead, and says so.
    let sd = Loader::new()
        .mount_table(fuse.clone())
        .memory_available(100)
        .load(&index)
        .unwrap();
    assert_eq!(loaded(&sd), sorted(&specs));
    for file in &sd.report().files {
        assert_eq!(file.strategy, Strategy::Mmap);
        assert!(
            file.explain()
                .contains("of memory is available, mapped instead"),
            "{}",
            file.reason
        );
    }

    // Asked for buffered: an error with the numbers, before anything is allocated.
    let err = Loader::new()
        .disable_mmap(true)
        .memory_available(100)
        .load(&index)
        .unwrap_err();
    match err.kind() {
        safeload::ErrorKind::InsufficientMemory { needed, available } => {
            assert_eq!(*available, 100);
            assert!(*needed >= sd.total_bytes(), "{needed}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("only 100 are available"), "{err}");

    // Enough memory: buffered as chosen.
    let sd = Loader::new()
        .mount_table(fuse)
        .memory_available(1 << 30)
        .load(&index)
        .unwrap();
    assert!(
        sd.report()
            .files
            .iter()
            .all(|f| f.strategy == Strategy::Buffered)
    );
}
