//! The mount table: reading it, finding the mount a path lives on, and classifying its filesystem.
//!
//! [`lookup`] finds the mount a path lives on in this process's mount table, falling back to
//! the filesystem magic of `statfs(2)`, and says how it found it ([`Detection`]); the loader's
//! policy decides mmap or buffered reads from its [`MountKind`]. Off Linux every lookup
//! answers [`MountKind::Unknown`] with [`Detection::Unsupported`], never an error.
//!
//! # Examples
//!
//! ```
//! use safeload::mount::{self, Detection, MountKind};
//!
//! let here = mount::lookup(std::env::temp_dir())?;
//! println!("{} ({}) at {}, found by {}", here.kind, here.fs_type, here.mount_point.display(),
//!     here.detected_by);
//! if here.kind.is_fuse_like() {
//!     // mmap page faults can stall here: load with `disable_mmap(true)`.
//! }
//! let on_hf_mount = here.kind == MountKind::HfMount;
//! # let _ = on_hf_mount;
//! # let _ = Detection::Device;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! `safeload mounts [PATH]` (the command line) prints the same, and what the auto policy
//! does there.
//!
//! # Formats
//!
//! `/proc/<pid>/mountinfo` (proc(5); kernel `Documentation/filesystems/proc.rst`, 3.5):
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2)(3)   (4)   (5)      (6)       (7)   (8) (9)     (10)        (11)
//! ```
//!
//! mount id, parent id, `major:minor`, root of the mount in its filesystem, mount point,
//! per-mount options, optional fields ended by `-`, filesystem type, source, superblock
//! options. `/proc/mounts` (fstab(5) layout) has source, mount point, type, options (per-mount
//! and superblock merged), and two zeros. Escapes (`\040`) are decoded in the root, mount
//! point, type and source; options are kept as written, so that splitting them on `,` stays
//! unambiguous (a comma inside a value is `\054`), and decoded one value at a time.

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

// This file holds the lookups, the only code here that touches the filesystem.
mod classify;
mod entry;
mod escape;
mod find;
mod parse;
mod table;
#[cfg(test)]
#[path = "tests/util.rs"]
mod test_util;

pub use classify::MountKind;
#[doc(hidden)]
pub use classify::classify;
#[doc(hidden)]
pub use entry::MountEntry;
#[doc(hidden)]
pub use find::split_device_number;
#[doc(hidden)]
pub use table::MountTable;

/// How a lookup found the mount of a path, for reports.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum Detection {
    /// A mount table entry with the file's device number and a mount point containing its path.
    Device,
    /// The mount table entry with the longest mount point containing the path, no entry having
    /// the file's device number.
    #[cfg_attr(feature = "serde", serde(rename = "path prefix"))]
    PathPrefix,
    /// No mount table entry matched (or none could be read): the filesystem magic number that
    /// `statfs(2)` reports for the file.
    Statfs,
    /// This platform has no mount table; the kind is [`MountKind::Unknown`].
    Unsupported,
}

impl fmt::Display for Detection {
    /// As JSON says it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Detection::Device => "device",
            Detection::PathPrefix => "path prefix",
            Detection::Statfs => "statfs",
            Detection::Unsupported => "unsupported",
        })
    }
}

/// What a path lives on: the answer of a lookup. Found by `statfs(2)`, `source` and
/// `mount_point` are empty; off Linux, `fs_type` too, and the kind is [`MountKind::Unknown`].
///
/// ```
/// use safeload::mount::{lookup, Detection, MountKind};
///
/// let mount = lookup(std::env::temp_dir())?;
/// if cfg!(target_os = "linux") {
///     assert_ne!(mount.detected_by, Detection::Unsupported);
/// } else {
///     assert_eq!(mount.kind, MountKind::Unknown);
/// }
/// // For example `local: ext4 "/dev/vda" at / (found by device)`.
/// let report_line = mount.to_string();
/// assert!(report_line.starts_with(&mount.kind.to_string()));
/// # Ok::<(), std::io::Error>(())
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Mount {
    /// The mount source (`hf-mount`, `server:/export`, `/dev/nvme0n1p1`); empty when not found
    /// in the mount table, and possibly empty in it.
    pub source: String,
    /// The mount point; empty when not found in the mount table.
    #[cfg_attr(feature = "serde", serde(serialize_with = "crate::worded::path_text"))]
    pub mount_point: PathBuf,
    /// The filesystem type: the table's (`fuse.hf-mount`, `nfs4`), or the name of the `statfs`
    /// magic number (`ext2/ext3/ext4`; the number in hex when unknown); empty off Linux.
    pub fs_type: String,
    /// The kind of filesystem.
    pub kind: MountKind,
    /// How the mount was found.
    pub detected_by: Detection,
}

impl Mount {
    fn from_entry(entry: &MountEntry, detected_by: Detection) -> Mount {
        Mount {
            source: entry.source.clone(),
            mount_point: entry.mount_point.clone(),
            fs_type: entry.fs_type.clone(),
            kind: entry.kind,
            detected_by,
        }
    }

    fn from_magic(magic: u64) -> Mount {
        let (fs_type, kind) = match classify::filesystem_by_magic(magic) {
            Some((name, kind)) => (name.to_owned(), kind),
            None => (format!("{magic:#x}"), MountKind::Unknown),
        };
        Mount {
            source: String::new(),
            mount_point: PathBuf::new(),
            fs_type,
            kind,
            detected_by: Detection::Statfs,
        }
    }

    fn unsupported() -> Mount {
        Mount {
            source: String::new(),
            mount_point: PathBuf::new(),
            fs_type: String::new(),
            kind: MountKind::Unknown,
            detected_by: Detection::Unsupported,
        }
    }
}

impl fmt::Display for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Mount {
            source,
            mount_point,
            fs_type,
            kind,
            detected_by,
        } = self;
        match detected_by {
            Detection::Unsupported => {
                write!(
                    f,
                    "{kind}: mount detection is not supported on this platform"
                )
            }
            Detection::Statfs => write!(f, "{kind}: {fs_type} (found by {detected_by})"),
            _ => write!(
                f,
                "{kind}: {fs_type} {source:?} at {} (found by {detected_by})",
                mount_point.display()
            ),
        }
    }
}

#[doc(hidden)]
/// What `path` lives on, found in `table`: [`lookup`] with a table read once
/// ([`MountTable::current`]) for every file of a load.
///
/// # Errors
///
/// As [`lookup`].
///
/// ```
/// use safeload::mount::{lookup_in, MountKind, MountTable};
///
/// // A table from text: every path is under its `/`, here claimed by hf-mount.
/// let table = MountTable::parse("hf-mount / fuse rw,user_id=0,group_id=0 0 0\n");
/// let mount = lookup_in(&table, &std::env::temp_dir())?;
/// if cfg!(target_os = "linux") {
///     assert_eq!(mount.kind, MountKind::HfMount);
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn lookup_in(table: &MountTable, path: &Path) -> io::Result<Mount> {
    if !crate::os::MOUNT_DETECTION {
        return Ok(Mount::unsupported());
    }
    let canonical = std::fs::canonicalize(path)?;
    let metadata = std::fs::metadata(&canonical)?;
    match table.locate(&canonical, device_of(&metadata)) {
        Some((entry, detected_by)) => Ok(Mount::from_entry(entry, detected_by)),
        None => crate::os::filesystem_magic(&canonical).map(Mount::from_magic),
    }
}

/// What `path` lives on, found in this process's mount table.
///
/// The path is canonicalized (a Hugging Face cache snapshot links its files into
/// `../../blobs/`, which may be on another mount) and found by its device number
/// ([`Detection::Device`]), else by the longest mount point holding it
/// ([`Detection::PathPrefix`]), else by the `statfs(2)` magic number ([`Detection::Statfs`]).
/// Off Linux, answers [`MountKind::Unknown`] without touching the path.
///
/// # Errors
///
/// The error of canonicalizing, `stat`ing or `statfs`ing the path; the caller names the path.
///
/// ```
/// let mount = safeload::mount::lookup(std::env::temp_dir())?;
/// assert_ne!(mount.kind, safeload::mount::MountKind::HfMount);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn lookup(path: impl AsRef<Path>) -> io::Result<Mount> {
    lookup_in(&current_or_empty(), path.as_ref())
}

#[doc(hidden)]
/// What an open file lives on, found in `table`: [`lookup_in`] with `fstat` and `fstatfs` on
/// `file`; `canonical_path` (the path it was opened from, canonicalized) only matches mount
/// points.
///
/// # Errors
///
/// The error of `fstat` or `fstatfs` on the file.
///
/// ```
/// use std::fs::File;
/// use safeload::mount::{lookup_file_in, MountTable};
///
/// let table = MountTable::current()?;
/// let exe = std::env::current_exe()?.canonicalize()?;
/// let file = File::open(&exe)?;
/// let mount = lookup_file_in(&table, &file, &exe)?;
/// let _ = mount.kind;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn lookup_file_in(table: &MountTable, file: &File, canonical_path: &Path) -> io::Result<Mount> {
    if !crate::os::MOUNT_DETECTION {
        return Ok(Mount::unsupported());
    }
    let metadata = file.metadata()?;
    match table.locate(canonical_path, device_of(&metadata)) {
        Some((entry, detected_by)) => Ok(Mount::from_entry(entry, detected_by)),
        None => crate::os::filesystem_magic_of(file).map(Mount::from_magic),
    }
}

#[doc(hidden)]
/// [`lookup_file_in`] with this process's mount table.
///
/// # Errors
///
/// As [`lookup_file_in`].
pub fn lookup_file(file: &File, canonical_path: &Path) -> io::Result<Mount> {
    lookup_file_in(&current_or_empty(), file, canonical_path)
}

fn current_or_empty() -> MountTable {
    MountTable::current().unwrap_or_default()
}

fn device_of(metadata: &std::fs::Metadata) -> Option<(u32, u32)> {
    crate::os::device_number(metadata).map(split_device_number)
}

// Lookups are shared across the loader's threads.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MountKind>();
    assert_send_sync::<MountEntry>();
    assert_send_sync::<MountTable>();
    assert_send_sync::<Detection>();
    assert_send_sync::<Mount>();
};

#[cfg(test)]
mod tests {
    use super::test_util::write_file;
    use super::*;

    #[test]
    fn kind_and_detection_names() {
        let kinds = [
            (MountKind::HfMount, "hf-mount", true),
            (MountKind::Fuse, "fuse", true),
            (MountKind::Network, "network", false),
            (MountKind::Local, "local", false),
            (MountKind::Unknown, "unknown", false),
        ];
        for (kind, name, fuse_like) in kinds {
            assert_eq!(kind.as_str(), name);
            assert_eq!(kind.to_string(), name);
            assert_eq!(kind.is_fuse_like(), fuse_like);
        }
        assert_eq!(Detection::Device.to_string(), "device");
        assert_eq!(Detection::PathPrefix.to_string(), "path prefix");
        assert_eq!(Detection::Statfs.to_string(), "statfs");
        assert_eq!(Detection::Unsupported.to_string(), "unsupported");
    }

    /// Whether `path` lives on an hf-mount mount, as the crate docs teach it.
    fn is_on_hf_mount(path: impl AsRef<Path>) -> bool {
        lookup(path).is_ok_and(|mount| mount.kind == MountKind::HfMount)
    }

    #[test]
    fn the_current_table_reads_and_knows_the_root() {
        let table = MountTable::current().unwrap();
        if crate::os::MOUNT_DETECTION {
            assert!(!table.entries().is_empty());
            assert!(table.find(Path::new("/"), None).is_some());
            let bytes = crate::os::read_proc(crate::os::ProcFile::SelfMountinfo).unwrap();
            let text = String::from_utf8(bytes).unwrap();
            assert_eq!(MountTable::parse(&text), MountTable::parse_mountinfo(&text));
        } else {
            assert!(table.entries().is_empty());
        }
    }

    #[test]
    fn a_temp_file_is_found_and_is_not_on_hf_mount() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_file(dir.path(), "model.safetensors");
        let mount = lookup(&file).unwrap();
        assert!(!is_on_hf_mount(&file));
        if crate::os::MOUNT_DETECTION {
            assert_ne!(mount.kind, MountKind::Unknown, "{mount}");
            assert!(
                matches!(mount.detected_by, Detection::Device | Detection::PathPrefix),
                "{mount}"
            );
            assert!(!mount.mount_point.as_os_str().is_empty());
            // The open file finds the same mount.
            let canonical = file.canonicalize().unwrap();
            let open = File::open(&file).unwrap();
            assert_eq!(lookup_file(&open, &canonical).unwrap(), mount);
        } else {
            assert_eq!(mount.kind, MountKind::Unknown);
            assert_eq!(mount.detected_by, Detection::Unsupported);
        }
    }

    #[test]
    fn the_running_test_binary_is_found() {
        let mount = lookup(std::env::current_exe().unwrap()).unwrap();
        if crate::os::MOUNT_DETECTION {
            assert_ne!(mount.kind, MountKind::Unknown, "{mount}");
            assert!(mount.to_string().contains("found by"));
        } else {
            assert_eq!(mount, Mount::unsupported());
            assert_eq!(
                mount.to_string(),
                "unknown: mount detection is not supported on this platform"
            );
        }
    }

    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn lookups_on_linux_use_the_table_then_statfs() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_file(dir.path(), "model.safetensors");
        let canonical = file.canonicalize().unwrap();
        let open = File::open(&file).unwrap();

        // An empty table leaves the answer to statfs.
        let by_statfs = lookup_in(&MountTable::default(), &file).unwrap();
        assert_eq!(by_statfs.detected_by, Detection::Statfs);
        assert!(!by_statfs.fs_type.is_empty());
        assert_eq!(by_statfs.mount_point, PathBuf::new());
        assert_eq!(
            lookup_file_in(&MountTable::default(), &open, &canonical).unwrap(),
            by_statfs
        );

        // An injected table is believed: here it claims `/` is hf-mount.
        let hf_root = MountTable::parse("hf-mount / fuse rw,user_id=0,group_id=0 0 0\n");
        let mount = lookup_in(&hf_root, &file).unwrap();
        assert_eq!(mount.kind, MountKind::HfMount);
        assert_eq!(mount.detected_by, Detection::PathPrefix);
        assert_eq!(mount.source, "hf-mount");
        assert_eq!(mount.mount_point, Path::new("/"));
        assert_eq!(
            mount.to_string(),
            "hf-mount: fuse \"hf-mount\" at / (found by path prefix)"
        );

        // A missing path is an error, not a guess.
        let missing = lookup_in(&hf_root, &dir.path().join("missing.safetensors")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(!is_on_hf_mount(dir.path().join("missing.safetensors")));
    }

    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn lookups_follow_symlinks_like_a_hub_cache_snapshot() {
        // A Hugging Face cache: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>.
        // Pretend (with an injected table) that blobs/ is an hf-mount mount: only the
        // resolved path is under it.
        use super::test_util::escape_field;
        let dir = tempfile::tempdir().unwrap();
        let blob = write_file(dir.path(), "blobs/0123abcd");
        let snapshot = dir.path().join("snapshots/rev/model.safetensors");
        std::fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink("../../blobs/0123abcd", &snapshot).unwrap();

        use std::os::unix::ffi::OsStrExt;
        let blobs = blob.parent().unwrap().canonicalize().unwrap();
        let table = MountTable::parse(&format!(
            "/dev/vda / ext4 rw 0 0\nhf-mount {} fuse rw,user_id=0,group_id=0 0 0\n",
            escape_field(blobs.as_os_str().as_bytes()),
        ));
        let mount = lookup_in(&table, &snapshot).unwrap();
        assert_eq!(mount.kind, MountKind::HfMount, "{mount}");
        assert_eq!(mount.mount_point, blobs);
        assert!(!is_on_hf_mount(&snapshot)); // the real table knows better

        // With the device of the real file, an entry that carries it wins by device.
        let metadata = std::fs::metadata(&blob).unwrap();
        let (major, minor) = split_device_number(std::os::unix::fs::MetadataExt::dev(&metadata));
        let table = MountTable::parse(&format!(
            "27 1 {major}:{minor} / / rw - ext4 /dev/vda rw\n60 27 0:99999 / {} rw - fuse hf-mount rw\n",
            escape_field(blobs.as_os_str().as_bytes()),
        ));
        let mount = lookup_in(&table, &snapshot).unwrap();
        assert_eq!(mount.kind, MountKind::Local);
        assert_eq!(mount.detected_by, Detection::Device);
    }
}
