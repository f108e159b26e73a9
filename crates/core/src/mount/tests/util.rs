//! What the mount tests share: the mount table captures under `tests/data/`, and helpers that make assertions read as specs.

use std::path::{Path, PathBuf};

use super::{MountEntry, MountTable};

/// Every mount table fixture under `tests/data/`, by file name. Each file starts with one
/// comment line saying where it came from, which [`fixture`] strips; the fuzz target's seed
/// corpus (`fuzz/corpus/seed-mount_table/`) holds the same texts.
pub(super) const MOUNT_TABLES: &[(&str, &str)] = &[
    (
        "fstab-by-hand.txt",
        include_str!("../../../tests/data/fstab-by-hand.txt"),
    ),
    (
        "mountinfo-bind-mount.txt",
        include_str!("../../../tests/data/mountinfo-bind-mount.txt"),
    ),
    (
        "mountinfo-btrfs-subvolumes.txt",
        include_str!("../../../tests/data/mountinfo-btrfs-subvolumes.txt"),
    ),
    (
        "mountinfo-docker-overlay.txt",
        include_str!("../../../tests/data/mountinfo-docker-overlay.txt"),
    ),
    (
        "mountinfo-fuse-clients.txt",
        include_str!("../../../tests/data/mountinfo-fuse-clients.txt"),
    ),
    (
        "mountinfo-hf-mount-fuse.txt",
        include_str!("../../../tests/data/mountinfo-hf-mount-fuse.txt"),
    ),
    (
        "mountinfo-hf-mount-nfs4.txt",
        include_str!("../../../tests/data/mountinfo-hf-mount-nfs4.txt"),
    ),
    (
        "mountinfo-network-clients.txt",
        include_str!("../../../tests/data/mountinfo-network-clients.txt"),
    ),
    (
        "mountinfo-nfs-inside-xfs.txt",
        include_str!("../../../tests/data/mountinfo-nfs-inside-xfs.txt"),
    ),
    (
        "mountinfo-this-machine.txt",
        include_str!("../../../tests/data/mountinfo-this-machine.txt"),
    ),
    (
        "mounts-nvme-nfs-hf-mount.txt",
        include_str!("../../../tests/data/mounts-nvme-nfs-hf-mount.txt"),
    ),
    (
        "mounts-this-machine.txt",
        include_str!("../../../tests/data/mounts-this-machine.txt"),
    ),
];

/// The text of the fixture `name`, without the comment line it starts with.
pub(super) fn fixture(name: &str) -> &'static str {
    let (_, file) = MOUNT_TABLES
        .iter()
        .find(|(file_name, _)| *file_name == name)
        .unwrap_or_else(|| panic!("no fixture {name} in MOUNT_TABLES"));
    strip_provenance(name, file)
}

fn strip_provenance<'a>(name: &str, file: &'a str) -> &'a str {
    match file.split_once('\n') {
        Some((comment, text)) if comment.starts_with("# ") => text,
        _ => panic!("{name} must start with a `# ` line saying where it came from"),
    }
}

/// The one entry `text` parses into.
pub(super) fn only_entry(text: &str) -> MountEntry {
    let table = MountTable::parse(text);
    assert_eq!(table.entries().len(), 1, "expected one entry from {text:?}");
    table.entries()[0].clone()
}

/// The mount point `find` picks for `path`, as a string, for assertions that read well.
pub(super) fn mount_point_for(
    table: &MountTable,
    path: &str,
    device: Option<(u32, u32)>,
) -> Option<String> {
    table
        .find(Path::new(path), device)
        .map(|entry| entry.mount_point().to_string_lossy().into_owned())
}

/// The kernel's escaping of a mount table field (`mangle()` in fs/proc_namespace.c), and
/// bytes that are not ASCII escaped too: the naive twin of `escape::decode`.
pub(super) fn escape_field(field: &[u8]) -> String {
    let mut escaped = String::new();
    for &byte in field {
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\\') || !byte.is_ascii() {
            escaped.push_str(&format!("\\{byte:03o}"));
        } else {
            escaped.push(char::from(byte));
        }
    }
    escaped
}

/// Writes a small file at `name` under `dir`, making its parent directories.
pub(super) fn write_file(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, b"not really a checkpoint").unwrap();
    path
}

#[test]
fn every_fixture_is_listed_and_says_where_it_came_from() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| {
            ["mountinfo-", "mounts-", "fstab-"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
        })
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = MOUNT_TABLES.iter().map(|(name, _)| *name).collect();
    assert_eq!(on_disk, listed);
    for (name, file) in MOUNT_TABLES {
        let text = strip_provenance(name, file);
        assert!(
            !text.starts_with('#') || name.starts_with("fstab-"),
            "{name}"
        );
        assert!(!MountTable::parse(text).entries().is_empty(), "{name}");
    }
}

/// The seed corpus of the `mount_table` fuzz target: every fixture, comment stripped.
/// `SAFELOAD_WRITE_FUZZ_SEEDS=1` rewrites it.
#[test]
fn fuzz_seeds_are_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/seed-mount_table");
    let write = std::env::var_os("SAFELOAD_WRITE_FUZZ_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, file) in MOUNT_TABLES {
        let seed = dir.join(name.trim_end_matches(".txt"));
        let text = strip_provenance(name, file);
        if write {
            std::fs::write(&seed, text).unwrap();
        }
        let on_disk = std::fs::read_to_string(&seed).unwrap_or_default();
        assert!(
            on_disk == text,
            "{} is out of date: run with SAFELOAD_WRITE_FUZZ_SEEDS=1",
            seed.display()
        );
    }
}
