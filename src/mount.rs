//! The mount table: reading it, finding the mount a path lives on, and classifying its filesystem.
//!
//! The loader picks mmap or buffered reads per file from the filesystem under it
//! (see the crate docs). This module answers "what is this file on?" in three layers:
//!
//! 1. **Pure parsing and classification**, tested on every platform:
//!    [`MountTable::parse`] reads the text of `/proc/<pid>/mountinfo` or `/proc/mounts`,
//!    [`classify`] turns a filesystem type, source and options into a [`MountKind`], and
//!    [`MountTable::find`] picks the mount of a canonical path, given its device number.
//! 2. **Lookups against a table** ([`lookup_in`], [`lookup_file_in`]): resolve a path (or
//!    `fstat` an open file) and find its mount in a table read once per load, falling back
//!    to the filesystem magic of `statfs(2)` when the table has no answer.
//! 3. **Convenience lookups** ([`lookup`], [`lookup_file`], [`is_on_hf_mount`]) that read the
//!    current process's table first.
//!
//! Off Linux there is no mount table to read: [`MountTable::current`] is empty and every
//! lookup answers [`MountKind::Unknown`] with [`Detection::Unsupported`], never an error.
//!
//! # Examples
//!
//! Classify a mount from its fields:
//!
//! ```
//! use safeload::mount::{classify, MountKind};
//!
//! assert_eq!(classify("fuse", "hf-mount", "rw,user_id=0,group_id=0"), MountKind::HfMount);
//! assert_eq!(classify("nfs4", "fileserver:/export", "rw,addr=10.0.0.5"), MountKind::Network);
//! assert_eq!(classify("ext4", "/dev/nvme0n1p1", "rw,relatime"), MountKind::Local);
//! ```
//!
//! Reason about a table captured on another machine:
//!
//! ```
//! use std::path::Path;
//! use safeload::mount::{MountKind, MountTable};
//!
//! let table = MountTable::parse(
//!     "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n\
//!      612 27 0:58 / /mnt/hub rw,nosuid,nodev,relatime - fuse hf-mount rw,user_id=0,group_id=0\n",
//! );
//! let shard = Path::new("/mnt/hub/org/model/model-00001-of-00002.safetensors");
//! let entry = table.find(shard, None).unwrap();
//! assert_eq!(entry.mount_point(), Path::new("/mnt/hub"));
//! assert_eq!(entry.kind(), MountKind::HfMount);
//! ```
//!
//! Look up the files of a load against one reading of the table:
//!
//! ```
//! use safeload::mount::{lookup_in, MountTable};
//!
//! let table = MountTable::current()?;
//! let mount = lookup_in(&table, &std::env::temp_dir())?;
//! let _ = (mount.kind, mount.detected_by);
//! # Ok::<(), std::io::Error>(())
//! ```
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
//! and superblock merged), and two zeros. The kernel writes space, tab, newline and backslash
//! inside a field as `\040`, `\011`, `\012` and `\134` (`fs/proc_namespace.c`); this module
//! decodes every `\ooo` escape in the root, mount point, type and source. Options are kept as
//! the kernel writes them, so that splitting them on `,` stays unambiguous (a comma inside an
//! option value is `\054`); [`MountEntry::option`] decodes one value.

use std::borrow::Cow;
use std::fmt;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Classification
// ---------------------------------------------------------------------------------------------

/// What kind of filesystem a mount is, as far as reading a checkpoint from it is concerned.
///
/// The split follows how the kinds fail under memory maps: page faults on a FUSE mount are
/// served one request at a time by a userspace process (and can stall or deadlock the loader),
/// page faults on a network filesystem each wait for a round trip, and page faults on a local
/// filesystem are cheap.
///
/// ```
/// use safeload::mount::{classify, MountKind};
///
/// let kind = classify("fuse.ceph-fuse", "ceph-fuse", "rw,user_id=0,group_id=0");
/// assert_eq!(kind, MountKind::Fuse);
/// assert!(kind.is_fuse_like());
/// assert_eq!(kind.to_string(), "fuse");
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MountKind {
    /// A Hugging Face Hub repository mounted by `hf-mount`: its FUSE mount (source `hf-mount`,
    /// or type `fuse.hf-mount`), or its NFS mode (an `nfs`/`nfs4` mount served from loopback,
    /// which is a userspace server just as risky as FUSE).
    HfMount,
    /// Any other FUSE filesystem (`fuse`, `fuse.*`, `fuseblk`) or `virtiofs`: s3fs, gcsfuse,
    /// juicefs, rclone, sshfs, ceph-fuse, glusterfs, ...
    Fuse,
    /// A kernel network or cluster filesystem: NFS, SMB/CIFS, Lustre, GPFS, `WekaFS`, `BeeGFS`,
    /// `CephFS`, 9p, AFS, GFS2, OCFS2, ...
    Network,
    /// A filesystem the kernel serves from a local disk or from memory: ext4, xfs, btrfs, zfs,
    /// tmpfs, overlay, squashfs, and the kernel's own pseudo filesystems (proc, sysfs, ...).
    Local,
    /// Anything else, and everything on platforms without a mount table.
    Unknown,
}

impl MountKind {
    /// A short lowercase name: `"hf-mount"`, `"fuse"`, `"network"`, `"local"` or `"unknown"`.
    ///
    /// ```
    /// assert_eq!(safeload::mount::MountKind::Network.as_str(), "network");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            MountKind::HfMount => "hf-mount",
            MountKind::Fuse => "fuse",
            MountKind::Network => "network",
            MountKind::Local => "local",
            MountKind::Unknown => "unknown",
        }
    }

    /// Whether reads are served by a userspace process: [`HfMount`](MountKind::HfMount) or
    /// [`Fuse`](MountKind::Fuse).
    ///
    /// ```
    /// use safeload::mount::MountKind;
    ///
    /// assert!(MountKind::HfMount.is_fuse_like());
    /// assert!(!MountKind::Network.is_fuse_like());
    /// ```
    pub fn is_fuse_like(&self) -> bool {
        matches!(self, MountKind::HfMount | MountKind::Fuse)
    }
}

impl fmt::Display for MountKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classifies a mount from its filesystem type, source and options.
///
/// `options` is a comma-separated option list as the kernel writes it; pass the per-mount
/// and superblock options joined with `,` when you have both (the NFS server address, `addr=`,
/// is a superblock option in `mountinfo`). Pure: it looks at its arguments only.
///
/// The rules, in order:
///
/// 1. a FUSE type (`fuse`, `fuseblk`, `fuse.*`, `fuseblk.*`) whose source is `hf-mount` or
///    whose subtype is `hf-mount` is [`MountKind::HfMount`];
/// 2. `nfs` or `nfs4` whose source host (`127.0.0.1:/`, `localhost:/`, `[::1]:/`, `::1:/`) or
///    `addr=` option is a loopback address is [`MountKind::HfMount`] (hf-mount's NFS mode);
/// 3. any other FUSE type, or `virtiofs`, is [`MountKind::Fuse`];
/// 4. known kernel network and cluster filesystems are [`MountKind::Network`];
/// 5. known disk, memory and kernel pseudo filesystems are [`MountKind::Local`];
/// 6. everything else is [`MountKind::Unknown`].
///
/// ```
/// use safeload::mount::{classify, MountKind};
///
/// assert_eq!(classify("fuse.hf-mount", "hf-mount", "rw"), MountKind::HfMount);
/// assert_eq!(classify("nfs4", "127.0.0.1:/", "rw,vers=4.1,addr=127.0.0.1"), MountKind::HfMount);
/// assert_eq!(classify("fuse.s3fs", "s3fs", "rw"), MountKind::Fuse);
/// assert_eq!(classify("lustre", "10.0.0.1@tcp:/fs", "rw,flock"), MountKind::Network);
/// assert_eq!(classify("overlay", "overlay", "rw,lowerdir=/l,upperdir=/u,workdir=/w"), MountKind::Local);
/// assert_eq!(classify("autofs", "systemd-1", "rw"), MountKind::Unknown);
/// ```
#[must_use]
pub fn classify(fs_type: &str, source: &str, options: &str) -> MountKind {
    classify_parts(fs_type, source, &[options])
}

/// [`classify`] with the option lists given separately, so that parsed entries need not join
/// their per-mount and superblock options into a new string.
fn classify_parts(fs_type: &str, source: &str, option_lists: &[&str]) -> MountKind {
    let fs_type = fs_type.trim().to_ascii_lowercase();
    let fs_type = fs_type.as_str();
    let source = source.trim();

    if is_fuse_type(fs_type) {
        let hf_mount =
            source.eq_ignore_ascii_case("hf-mount") || fuse_subtype(fs_type) == Some("hf-mount");
        return if hf_mount {
            MountKind::HfMount
        } else {
            MountKind::Fuse
        };
    }
    if matches!(fs_type, "nfs" | "nfs4") && nfs_served_from_loopback(source, option_lists) {
        return MountKind::HfMount;
    }
    match fs_type {
        "virtiofs" => MountKind::Fuse,
        // Kernel clients of network filesystems, and cluster filesystems on shared storage:
        // every cold page fault waits on the network or the SAN.
        "nfs" | "nfs4" | "cifs" | "smb3" | "smb2" | "smbfs" | "ncpfs" | "lustre" | "gpfs"
        | "wekafs" | "beegfs" | "fhgfs" | "ceph" | "9p" | "afs" | "kafs" | "coda" | "gfs2"
        | "ocfs2" | "panfs" | "glusterfs" | "orangefs" | "pvfs2" | "quobyte" | "cvfs"
        | "vboxsf" => MountKind::Network,
        // Disk and flash filesystems, read-only images, and memory-backed filesystems.
        "ext2" | "ext3" | "ext4" | "xfs" | "btrfs" | "zfs" | "f2fs" | "bcachefs" | "jfs"
        | "reiserfs" | "nilfs2" | "vfat" | "msdos" | "exfat" | "ntfs" | "ntfs3" | "hfs"
        | "hfsplus" | "udf" | "iso9660" | "squashfs" | "erofs" | "cramfs" | "romfs" | "minix"
        | "tmpfs" | "ramfs" | "rootfs" | "devtmpfs" | "hugetlbfs" | "overlay" | "aufs"
        // Pseudo filesystems the kernel serves from memory: no server to stall on.
        | "proc" | "sysfs" | "devpts" | "mqueue" | "cgroup" | "cgroup2" | "debugfs"
        | "tracefs" | "securityfs" | "pstore" | "bpf" | "configfs" | "fusectl"
        | "binfmt_misc" | "efivarfs" | "selinuxfs" | "nsfs" | "rpc_pipefs" | "nfsd" => {
            MountKind::Local
        }
        _ => MountKind::Unknown,
    }
}

/// Whether `fs_type` is a FUSE mount: `fuse`, `fuseblk`, or either with a subtype.
/// `fusectl` is the FUSE control filesystem, not a FUSE mount.
fn is_fuse_type(fs_type: &str) -> bool {
    matches!(fs_type, "fuse" | "fuseblk") || fuse_subtype(fs_type).is_some()
}

/// The subtype of a FUSE type (`sshfs` in `fuse.sshfs`), which the mounter chooses.
fn fuse_subtype(fs_type: &str) -> Option<&str> {
    fs_type
        .strip_prefix("fuse.")
        .or_else(|| fs_type.strip_prefix("fuseblk."))
}

/// Whether an NFS mount's server is this machine: its source host, or its `addr=` option
/// (the server address the kernel connected to, see nfs(5)), is a loopback address.
/// `clientaddr=` and `mountaddr=` are other options and do not count.
fn nfs_served_from_loopback(source: &str, option_lists: &[&str]) -> bool {
    if nfs_source_host(source).is_some_and(is_loopback_host) {
        return true;
    }
    option_lists
        .iter()
        .flat_map(|list| list.split(','))
        .filter_map(|option| option.trim().strip_prefix("addr="))
        .any(|value| is_loopback_host(&decode_escapes_str(value)))
}

/// The host part of an NFS source: `host:/export`, `[v6]:/export`, or `v6:/export`.
fn nfs_source_host(source: &str) -> Option<&str> {
    if let Some(bracketed) = source.strip_prefix('[') {
        return bracketed.split_once(']').map(|(host, _)| host);
    }
    if let Some((host, _)) = source.split_once(":/") {
        return Some(host);
    }
    source.rsplit_once(':').map(|(host, _)| host)
}

fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    // An IPv6 zone (`::1%lo`) does not change which address it is.
    let host = host
        .split_once('%')
        .map_or(host, |(address, _zone)| address);
    if host.eq_ignore_ascii_case("localhost") || host.eq_ignore_ascii_case("localhost.") {
        return true;
    }
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_loopback(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => false,
    }
}

/// The filesystem name and kind for a `statfs(2)` `f_type` magic number (`linux/magic.h`),
/// used when the mount table has no answer. The magic cannot tell hf-mount from other FUSE
/// filesystems, nor a loopback NFS server from a remote one.
fn filesystem_by_magic(magic: u64) -> Option<(&'static str, MountKind)> {
    use MountKind::{Fuse, Local, Network};
    let found = match magic {
        0x6573_5546 => ("fuse", Fuse),
        0x0000_6969 => ("nfs", Network),
        0x0000_517B => ("smbfs", Network),
        0xFE53_4D42 => ("smb2", Network),
        0xFF53_4D42 => ("cifs", Network),
        0x0BD0_0BD0 => ("lustre", Network),
        0x4750_4653 => ("gpfs", Network),
        0x00C3_6400 => ("ceph", Network),
        0x0102_1997 => ("9p", Network),
        0x5346_414F => ("afs", Network),
        0x6B41_4653 => ("kafs", Network),
        0x7375_7245 => ("coda", Network),
        0x0116_1970 => ("gfs2", Network),
        0x7461_636F => ("ocfs2", Network),
        0x1983_0326 => ("beegfs", Network),
        0x0000_564C => ("ncpfs", Network),
        0x794C_7630 => ("overlay", Local),
        0x0102_1994 => ("tmpfs", Local),
        0x8584_58F6 => ("ramfs", Local),
        0x9584_58F6 => ("hugetlbfs", Local),
        0x0000_EF53 => ("ext2/ext3/ext4", Local),
        0x5846_5342 => ("xfs", Local),
        0x9123_683E => ("btrfs", Local),
        0x2FC1_2FC1 => ("zfs", Local),
        0xF2F5_2010 => ("f2fs", Local),
        0xCA45_1A4E => ("bcachefs", Local),
        0x3153_464A => ("jfs", Local),
        0x5265_4973 => ("reiserfs", Local),
        0x0000_3434 => ("nilfs2", Local),
        0x7371_7368 => ("squashfs", Local),
        0xE0F5_E1E2 => ("erofs", Local),
        0x28CD_3D45 => ("cramfs", Local),
        0x0000_4D44 => ("vfat", Local),
        0x2011_BAB0 => ("exfat", Local),
        0x5346_544E => ("ntfs", Local),
        0x0000_482B => ("hfsplus", Local),
        0x0000_9660 => ("iso9660", Local),
        0x1501_3346 => ("udf", Local),
        0x0000_9FA0 => ("proc", Local),
        0x6265_6572 => ("sysfs", Local),
        0x0000_1CD1 => ("devpts", Local),
        0x0027_E0EB => ("cgroup", Local),
        0x6367_7270 => ("cgroup2", Local),
        _ => return None,
    };
    Some(found)
}

// ---------------------------------------------------------------------------------------------
// Entries and tables
// ---------------------------------------------------------------------------------------------

/// One line of a mount table.
///
/// Entries parsed from `/proc/mounts` lack the ids and the device number, have root `/`, and
/// carry all their options in [`options`](MountEntry::options).
///
/// ```
/// use std::path::Path;
/// use safeload::mount::{MountKind, MountTable};
///
/// let table = MountTable::parse_mountinfo(
///     "700 27 0:61 / /mnt/hub rw,relatime shared:310 - nfs4 127.0.0.1:/ rw,vers=4.1,addr=127.0.0.1\n",
/// );
/// let entry = &table.entries()[0];
/// assert_eq!(entry.mount_id(), Some(700));
/// assert_eq!(entry.device(), Some((0, 61)));
/// assert_eq!(entry.mount_point(), Path::new("/mnt/hub"));
/// assert_eq!(entry.fs_type(), "nfs4");
/// assert_eq!(entry.source(), "127.0.0.1:/");
/// assert_eq!(entry.option("vers").as_deref(), Some("4.1"));
/// assert_eq!(entry.kind(), MountKind::HfMount);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    mount_id: Option<u64>,
    parent_id: Option<u64>,
    device: Option<(u32, u32)>,
    root: PathBuf,
    mount_point: PathBuf,
    fs_type: String,
    source: String,
    options: String,
    super_options: String,
    kind: MountKind,
}

impl MountEntry {
    /// The mount's unique id (`mountinfo` field 1); `None` for `/proc/mounts` lines.
    pub fn mount_id(&self) -> Option<u64> {
        self.mount_id
    }

    /// The id of the mount this one is mounted on (`mountinfo` field 2); `None` for
    /// `/proc/mounts` lines.
    pub fn parent_id(&self) -> Option<u64> {
        self.parent_id
    }

    /// The filesystem's device number as `(major, minor)`, which `stat(2)` reports as
    /// `st_dev` for the files on it (`mountinfo` field 3); `None` for `/proc/mounts` lines.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.device
    }

    /// The directory of the filesystem that is mounted here (`mountinfo` field 4): `/` for a
    /// whole filesystem, a subdirectory for a bind mount of it. Always `/` for `/proc/mounts`
    /// lines.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the filesystem is mounted, escapes decoded.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// The filesystem type, with its subtype if any (`ext4`, `fuse.hf-mount`, `nfs4`).
    pub fn fs_type(&self) -> &str {
        &self.fs_type
    }

    /// The mount source: a device, `server:/export`, or a name chosen by the mounter
    /// (`hf-mount`, `overlay`). May be empty: `mount(2)` accepts an empty source string.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The per-mount options (`rw,nosuid,relatime`), escapes kept. For `/proc/mounts`
    /// lines, the per-mount and superblock options merged, as that file shows them.
    pub fn options(&self) -> &str {
        &self.options
    }

    /// The superblock options (`rw,vers=4.1,addr=10.0.0.5`), escapes kept; empty for
    /// `/proc/mounts` lines.
    pub fn super_options(&self) -> &str {
        &self.super_options
    }

    /// The value of the option `name`, escapes decoded: `Some("")` for a flag such as
    /// `ro`, `None` when absent. Per-mount options are searched before superblock options.
    ///
    /// ```
    /// use safeload::mount::MountTable;
    ///
    /// let table = MountTable::parse_mounts("server:/export /mnt/nfs nfs4 rw,hard,rsize=1048576 0 0\n");
    /// let entry = &table.entries()[0];
    /// assert_eq!(entry.option("rsize").as_deref(), Some("1048576"));
    /// assert_eq!(entry.option("hard").as_deref(), Some(""));
    /// assert_eq!(entry.option("soft"), None);
    /// ```
    pub fn option(&self, name: &str) -> Option<String> {
        [self.options.as_str(), self.super_options.as_str()]
            .into_iter()
            .flat_map(|list| list.split(','))
            .find_map(|option| match option.split_once('=') {
                Some((key, value)) if key == name => Some(decode_escapes_str(value).into_owned()),
                None if option == name => Some(String::new()),
                _ => None,
            })
    }

    /// The mount's kind, as [`classify`] gives it for this entry's type, source and options.
    pub fn kind(&self) -> MountKind {
        self.kind
    }
}

/// A mount table: the mounts of one mount namespace, in the order the kernel lists them
/// (a mount stacked on another comes after it).
///
/// Build one from text with [`parse`](MountTable::parse), or read this process's with
/// [`current`](MountTable::current); then [`find`](MountTable::find) the mount of each path.
///
/// ```
/// use std::path::Path;
/// use safeload::mount::{MountKind, MountTable};
///
/// // As `/proc/mounts` shows a host with a local root and an NFS share.
/// let table = MountTable::parse(
///     "/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n\
///      fileserver:/export/models /mnt/models nfs4 rw,vers=4.2,addr=10.0.0.5 0 0\n",
/// );
/// assert_eq!(table.entries().len(), 2);
/// let found = table.find(Path::new("/mnt/models/llama/model.safetensors"), None).unwrap();
/// assert_eq!(found.kind(), MountKind::Network);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

impl MountTable {
    /// Parses `/proc/<pid>/mountinfo` text. Lines that do not parse are skipped.
    #[must_use]
    pub fn parse_mountinfo(text: &str) -> MountTable {
        MountTable::parse_lines(text.as_bytes(), parse_mountinfo_line)
    }

    /// Parses `/proc/mounts` text (also `/etc/mtab` and `/etc/fstab`, whose columns are the
    /// same). Lines that do not parse, comments, and entries without an absolute mount point
    /// (`swap`, `none`) are skipped.
    #[must_use]
    pub fn parse_mounts(text: &str) -> MountTable {
        MountTable::parse_lines(text.as_bytes(), parse_mounts_line)
    }

    /// Parses mount table text in either format, detected from the text.
    ///
    /// The text is parsed both ways and the reading that recognises more lines is kept
    /// (`mountinfo` on a tie). The formats cannot be confused: a `mountinfo` line read as
    /// `/proc/mounts` has a number where the mount point should be, and a `/proc/mounts` line
    /// does not start with two numbers and a `major:minor`.
    ///
    /// ```
    /// use safeload::mount::MountTable;
    ///
    /// let from_mountinfo = MountTable::parse("22 27 0:21 / /proc rw,relatime - proc proc rw\n");
    /// let from_mounts = MountTable::parse("proc /proc proc rw,relatime 0 0\n");
    /// assert_eq!(from_mountinfo.entries()[0].mount_id(), Some(22));
    /// assert_eq!(from_mounts.entries()[0].mount_id(), None);
    /// assert_eq!(from_mountinfo.entries()[0].mount_point(), from_mounts.entries()[0].mount_point());
    /// ```
    #[must_use]
    pub fn parse(text: &str) -> MountTable {
        MountTable::parse_bytes(text.as_bytes())
    }

    /// [`parse`](MountTable::parse) for raw bytes, as read from `/proc`: mount points that
    /// are not UTF-8 are kept exactly (on Unix), other fields are converted lossily.
    #[must_use]
    pub fn parse_bytes(bytes: &[u8]) -> MountTable {
        let mountinfo = MountTable::parse_lines(bytes, parse_mountinfo_line);
        let mounts = MountTable::parse_lines(bytes, parse_mounts_line);
        if mounts.entries.len() > mountinfo.entries.len() {
            mounts
        } else {
            mountinfo
        }
    }

    fn parse_lines(bytes: &[u8], parse_line: fn(&[u8]) -> Option<MountEntry>) -> MountTable {
        let entries = bytes
            .split(|&b| b == b'\n')
            .filter_map(parse_line)
            .collect();
        MountTable { entries }
    }

    /// The mount table of this process: `/proc/self/mountinfo`, or `/proc/mounts` when that
    /// cannot be read or holds no entry. Empty (not an error) off Linux.
    ///
    /// The kernel builds the file while it is read, so a table read while mounts change may
    /// miss or repeat a line; read it once per load, not once per file.
    ///
    /// # Errors
    ///
    /// The error of reading `/proc/self/mountinfo`, when neither file can be read.
    pub fn current() -> io::Result<MountTable> {
        os::read_mount_table()
    }

    /// The entries, in table order.
    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }

    /// The mount that `canonical_path` lives on, given the file's device number (`st_dev`
    /// split with [`split_device_number`]) when known. Pure: it does not touch the path.
    ///
    /// `canonical_path` must be absolute with symlinks resolved ([`std::fs::canonicalize`]);
    /// a relative path matches nothing. A mount point matches when it is a prefix of the path
    /// on component boundaries (`/mnt/a` does not contain `/mnt/ab/x`; `/` contains
    /// everything). Then:
    ///
    /// 1. **By device.** Among matching entries whose device equals `device`, the longest
    ///    mount point wins. The device says which filesystem holds the file, so it beats a
    ///    longer mount point on another device (a mount stacked after the file was opened, a
    ///    table read before a mount changed).
    /// 2. **By path.** When no entry has the device (btrfs subvolumes and some overlay files
    ///    report a device the table does not list; `/proc/mounts` has no devices), the
    ///    longest matching mount point wins.
    ///
    /// Among entries at the same mount point (stacked mounts, or `rootfs` under `/`), the
    /// top-most wins: the last in table order that no other of them is mounted on (by parent
    /// id, when the table has ids).
    ///
    /// A mount hidden by a later mount over one of its parent directories is still listed in
    /// the table, and the path rule can still pick it; the device rule does not.
    ///
    /// ```
    /// use std::path::Path;
    /// use safeload::mount::MountTable;
    ///
    /// let table = MountTable::parse(
    ///     "27 1 254:0 / / rw - ext4 /dev/vda rw\n\
    ///      90 27 0:50 / /mnt/data rw - xfs /dev/sdb1 rw\n\
    ///      91 90 0:51 / /mnt/data/models rw - nfs4 server:/models rw,addr=10.0.0.5\n",
    /// );
    /// let path = Path::new("/mnt/data/models/model.safetensors");
    /// assert_eq!(table.find(path, None).unwrap().fs_type(), "nfs4");
    /// // The file's device says it is on the xfs filesystem (the NFS share was mounted over it later).
    /// assert_eq!(table.find(path, Some((0, 50))).unwrap().fs_type(), "xfs");
    /// ```
    #[must_use]
    pub fn find(&self, canonical_path: &Path, device: Option<(u32, u32)>) -> Option<&MountEntry> {
        self.locate(canonical_path, device).map(|(entry, _)| entry)
    }

    /// [`find`](MountTable::find), also saying which rule found the entry.
    fn locate(&self, path: &Path, device: Option<(u32, u32)>) -> Option<(&MountEntry, Detection)> {
        if let Some(device) = device {
            let by_device = self.top_most_longest(path, |entry| entry.device == Some(device));
            if let Some(entry) = by_device {
                return Some((entry, Detection::Device));
            }
        }
        self.top_most_longest(path, |_| true)
            .map(|entry| (entry, Detection::PathPrefix))
    }

    /// Among the entries accepted by `keep` whose mount point contains `path`, the one with
    /// the longest mount point; among those at that mount point, the top-most.
    fn top_most_longest(
        &self,
        path: &Path,
        keep: impl Fn(&MountEntry) -> bool,
    ) -> Option<&MountEntry> {
        let candidates: Vec<(usize, &MountEntry)> = self
            .entries
            .iter()
            .filter(|entry| keep(entry) && path.starts_with(&entry.mount_point))
            .map(|entry| (entry.mount_point.components().count(), entry))
            .collect();
        let deepest = candidates.iter().map(|&(depth, _)| depth).max()?;
        let stacked: Vec<&MountEntry> = candidates
            .into_iter()
            .filter(|&(depth, _)| depth == deepest)
            .map(|(_, entry)| entry)
            .collect();
        // Later lines are usually mounted later, on top; the parent ids say so for certain
        // when the table has them (a mount stacked at a mount point has the mount it covers
        // as its parent).
        //
        // NOTE: walking the mount tree from `/` by parent ids would also see through a mount
        // hidden by a later mount over one of its parent directories. Rejected: it needs a
        // complete table (a chroot's table and hand-written ones lack parents), and the device
        // rule already settles that case whenever the caller knows `st_dev`.
        stacked
            .iter()
            .rev()
            .find(|lower| !stacked.iter().any(|upper| is_mounted_on(upper, lower)))
            .or_else(|| stacked.last())
            .copied()
    }
}

fn is_mounted_on(upper: &MountEntry, lower: &MountEntry) -> bool {
    match (upper.parent_id, lower.mount_id) {
        (Some(parent), Some(id)) => parent == id && upper.mount_id != Some(id),
        _ => false,
    }
}

/// Splits a Linux `st_dev` into `(major, minor)`, as glibc's `major(3)` and `minor(3)` do.
///
/// The encoding has 12+20 bits of major and 8+24 bits of minor. Pure, so that device numbers
/// from another machine can be split anywhere.
///
/// ```
/// use safeload::mount::split_device_number;
///
/// assert_eq!(split_device_number(0xfe00), (254, 0));   // /dev/vda
/// assert_eq!(split_device_number(0x0803), (8, 3));     // /dev/sda3
/// assert_eq!(split_device_number(0x0010_0031), (0, 256 + 49));
/// ```
#[must_use]
pub fn split_device_number(st_dev: u64) -> (u32, u32) {
    let major = ((st_dev >> 32) & 0xffff_f000) | ((st_dev >> 8) & 0x0000_0fff);
    let minor = ((st_dev >> 12) & 0xffff_ff00) | (st_dev & 0x0000_00ff);
    // Both are masked to 32 bits above.
    (major as u32, minor as u32)
}

// ---------------------------------------------------------------------------------------------
// Line parsers
// ---------------------------------------------------------------------------------------------

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
fn parse_mountinfo_line(line: &[u8]) -> Option<MountEntry> {
    let line = line.trim_ascii();
    let mut tokens = line.split(|&b| b == b' ');
    // Before the separator no field is ever empty, so runs of spaces are tolerated there.
    let mut next_field = || tokens.by_ref().find(|token| !token.is_empty());
    let mount_id = parse_number::<u64>(next_field()?)?;
    let parent_id = parse_number::<u64>(next_field()?)?;
    let device = parse_device(next_field()?)?;
    let root = next_field()?;
    let mount_point = next_field()?;
    let options = next_field()?;
    // Optional fields (`shared:1 master:2`), as many as there are, end with `-`.
    while next_field()? != b"-" {}
    // After the separator, fields are exactly one space apart: the source may be empty,
    // which shows as two spaces (`- tmpfs  rw`).
    let fs_type = tokens.next()?;
    let source = tokens.next()?;
    let super_options = tokens.next()?;
    if fs_type.is_empty() || !mount_point.starts_with(b"/") {
        return None;
    }
    Some(new_entry(RawEntry {
        mount_id: Some(mount_id),
        parent_id: Some(parent_id),
        device: Some(device),
        root,
        mount_point,
        fs_type,
        source,
        options,
        super_options,
    }))
}

/// `/dev/sda1 / ext4 rw,relatime 0 0`
fn parse_mounts_line(line: &[u8]) -> Option<MountEntry> {
    let line = line.trim_ascii_end();
    // The kernel's own layout: six fields one space apart, of which the source may be empty.
    let exact: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let fields = match exact.as_slice() {
        [source, mount_point, fs_type, options, _, _]
            if mount_point.starts_with(b"/") && !fs_type.is_empty() && !options.is_empty() =>
        {
            (*source, *mount_point, *fs_type, *options)
        }
        // Otherwise fstab layout: whitespace-separated, the last three columns optional.
        _ => {
            let line = line.trim_ascii_start();
            if line.starts_with(b"#") {
                return None;
            }
            let loose: Vec<&[u8]> = line
                .split(u8::is_ascii_whitespace)
                .filter(|field| !field.is_empty())
                .collect();
            match loose.as_slice() {
                [source, mount_point, fs_type, rest @ ..] => (
                    *source,
                    *mount_point,
                    *fs_type,
                    rest.first().copied().unwrap_or(b""),
                ),
                _ => return None,
            }
        }
    };
    let (source, mount_point, fs_type, options) = fields;
    if !mount_point.starts_with(b"/") {
        return None;
    }
    Some(new_entry(RawEntry {
        mount_id: None,
        parent_id: None,
        device: None,
        root: b"/",
        mount_point,
        fs_type,
        source,
        options,
        super_options: b"",
    }))
}

/// The fields of one line, still escaped.
struct RawEntry<'a> {
    mount_id: Option<u64>,
    parent_id: Option<u64>,
    device: Option<(u32, u32)>,
    root: &'a [u8],
    mount_point: &'a [u8],
    fs_type: &'a [u8],
    source: &'a [u8],
    options: &'a [u8],
    super_options: &'a [u8],
}

fn new_entry(raw: RawEntry<'_>) -> MountEntry {
    let fs_type = decoded_string(raw.fs_type);
    let source = decoded_string(raw.source);
    let options = String::from_utf8_lossy(raw.options).into_owned();
    let super_options = String::from_utf8_lossy(raw.super_options).into_owned();
    // Classified on the escaped options, so that a `\054` inside a value cannot split it.
    let kind = classify_parts(&fs_type, &source, &[&options, &super_options]);
    MountEntry {
        mount_id: raw.mount_id,
        parent_id: raw.parent_id,
        device: raw.device,
        root: decoded_path(raw.root),
        mount_point: decoded_path(raw.mount_point),
        fs_type,
        source,
        options,
        super_options,
        kind,
    }
}

fn parse_number<T: std::str::FromStr>(field: &[u8]) -> Option<T> {
    // `FromStr` for integers accepts a leading `+`, which the kernel never writes.
    if !field.first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn parse_device(field: &[u8]) -> Option<(u32, u32)> {
    let colon = field.iter().position(|&b| b == b':')?;
    let major = parse_number(field.get(..colon)?)?;
    let minor = parse_number(field.get(colon.checked_add(1)?..)?)?;
    Some((major, minor))
}

/// Decodes the kernel's `\ooo` octal escapes (`\040` space, `\011` tab, `\012` newline,
/// `\134` backslash). A backslash not followed by three octal digits of a byte value is kept
/// as it is.
fn decode_escapes(field: &[u8]) -> Cow<'_, [u8]> {
    if !field.contains(&b'\\') {
        return Cow::Borrowed(field);
    }
    let mut decoded = Vec::with_capacity(field.len());
    let mut rest = field;
    while let Some((&byte, tail)) = rest.split_first() {
        if byte == b'\\' {
            if let Some(value) = tail.get(..3).and_then(octal_byte) {
                decoded.push(value);
                rest = tail.get(3..).unwrap_or_default();
                continue;
            }
        }
        decoded.push(byte);
        rest = tail;
    }
    Cow::Owned(decoded)
}

fn octal_byte(digits: &[u8]) -> Option<u8> {
    let value = digits.iter().try_fold(0u32, |value, &digit| {
        (b'0'..=b'7')
            .contains(&digit)
            .then(|| value * 8 + u32::from(digit - b'0'))
    })?;
    u8::try_from(value).ok()
}

fn decode_escapes_str(field: &str) -> Cow<'_, str> {
    match decode_escapes(field.as_bytes()) {
        Cow::Borrowed(_) => Cow::Borrowed(field),
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    }
}

fn decoded_string(field: &[u8]) -> String {
    String::from_utf8_lossy(&decode_escapes(field)).into_owned()
}

fn decoded_path(field: &[u8]) -> PathBuf {
    crate::os::path_from_bytes(decode_escapes(field).into_owned())
}

// ---------------------------------------------------------------------------------------------
// Lookups
// ---------------------------------------------------------------------------------------------

/// How a lookup found the mount of a path, for reports.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Detection {
    /// A mount table entry with the file's device number and a mount point containing its path.
    Device,
    /// The mount table entry with the longest mount point containing the path, no entry having
    /// the file's device number.
    PathPrefix,
    /// No mount table entry matched (or none could be read): the filesystem magic number that
    /// `statfs(2)` reports for the file.
    Statfs,
    /// This platform has no mount table; the kind is [`MountKind::Unknown`].
    Unsupported,
}

impl Detection {
    /// A short lowercase name: `"device"`, `"path prefix"`, `"statfs"` or `"unsupported"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Detection::Device => "device",
            Detection::PathPrefix => "path prefix",
            Detection::Statfs => "statfs",
            Detection::Unsupported => "unsupported",
        }
    }
}

impl fmt::Display for Detection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a path lives on: the answer of a lookup.
///
/// Found in the mount table ([`Detection::Device`], [`Detection::PathPrefix`]), every field is
/// the entry's. Found by `statfs(2)` ([`Detection::Statfs`]), `fs_type` names the magic number
/// and `source` and `mount_point` are empty. Off Linux ([`Detection::Unsupported`]), all three
/// are empty and the kind is [`MountKind::Unknown`].
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
/// assert!(report_line.starts_with(mount.kind.as_str()));
/// # Ok::<(), std::io::Error>(())
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mount source (`hf-mount`, `server:/export`, `/dev/nvme0n1p1`); empty when not found
    /// in the mount table, and possibly empty in it.
    pub source: String,
    /// The mount point; empty when not found in the mount table.
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
        let (fs_type, kind) = match filesystem_by_magic(magic) {
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

/// What `path` lives on, found in `table`.
///
/// The path is canonicalized (symlinks resolved: a Hugging Face cache snapshot links its files
/// into `../../blobs/`, which may be on another mount) and stat'ed for its device number, then
/// looked up with [`MountTable::find`]. When no entry matches, the `statfs(2)` magic number of
/// the file decides ([`Detection::Statfs`]). Off Linux, answers [`MountKind::Unknown`] without
/// touching the path.
///
/// Read the table once ([`MountTable::current`]) and look up every file of a load against it.
///
/// # Errors
///
/// The error of canonicalizing, `stat`ing or `statfs`ing the path; the caller names the path.
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
    if !os::SUPPORTED {
        return Ok(Mount::unsupported());
    }
    let canonical = std::fs::canonicalize(path)?;
    let metadata = std::fs::metadata(&canonical)?;
    match table.locate(&canonical, os::device_of(&metadata)) {
        Some((entry, detected_by)) => Ok(Mount::from_entry(entry, detected_by)),
        None => os::filesystem_magic(&canonical).map(Mount::from_magic),
    }
}

/// What `path` lives on, found in this process's mount table ([`lookup_in`] with
/// [`MountTable::current`]; a table that cannot be read leaves the answer to `statfs(2)`).
///
/// # Errors
///
/// As [`lookup_in`].
///
/// ```
/// let mount = safeload::mount::lookup(std::env::temp_dir())?;
/// assert_ne!(mount.kind, safeload::mount::MountKind::HfMount);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn lookup(path: impl AsRef<Path>) -> io::Result<Mount> {
    lookup_in(&current_or_empty(), path.as_ref())
}

/// What an open file lives on, found in `table`: [`lookup_in`] without resolving the path again.
///
/// The device number comes from `fstat` on `file`, the `statfs` fallback from `fstatfs`;
/// `canonical_path` (the path `file` was opened from, canonicalized) is only used to match
/// mount points.
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
    if !os::SUPPORTED {
        return Ok(Mount::unsupported());
    }
    let metadata = file.metadata()?;
    match table.locate(canonical_path, os::device_of(&metadata)) {
        Some((entry, detected_by)) => Ok(Mount::from_entry(entry, detected_by)),
        None => os::filesystem_magic_of(file).map(Mount::from_magic),
    }
}

/// [`lookup_file_in`] with this process's mount table.
///
/// # Errors
///
/// As [`lookup_file_in`].
pub fn lookup_file(file: &File, canonical_path: &Path) -> io::Result<Mount> {
    lookup_file_in(&current_or_empty(), file, canonical_path)
}

/// Whether `path` lives on an hf-mount mount (FUSE or its loopback NFS mode). `false` when
/// the lookup fails, and off Linux.
///
/// ```
/// assert!(!safeload::mount::is_on_hf_mount(std::env::temp_dir()));
/// ```
pub fn is_on_hf_mount(path: impl AsRef<Path>) -> bool {
    lookup(path).is_ok_and(|mount| mount.kind == MountKind::HfMount)
}

fn current_or_empty() -> MountTable {
    MountTable::current().unwrap_or_default()
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

/// The filesystem parts of the OS layer this module uses.
mod os {
    use std::fs::{File, Metadata};
    use std::io;
    use std::path::Path;

    use super::{MountTable, split_device_number};

    pub(super) const SUPPORTED: bool = crate::os::MOUNT_DETECTION;

    pub(super) fn read_mount_table() -> io::Result<MountTable> {
        if !SUPPORTED {
            return Ok(MountTable::default());
        }
        // mountinfo has device numbers and ids; /proc/mounts is the fallback for kernels
        // before 2.6.26 and for sandboxes that hide mountinfo.
        let mountinfo = std::fs::read("/proc/self/mountinfo");
        if let Ok(bytes) = &mountinfo {
            let table = MountTable::parse_bytes(bytes);
            if !table.entries.is_empty() {
                return Ok(table);
            }
        }
        match std::fs::read("/proc/mounts") {
            Ok(bytes) => Ok(MountTable::parse_bytes(&bytes)),
            Err(mounts_error) => match mountinfo {
                Ok(_) => Err(mounts_error),
                Err(mountinfo_error) => Err(mountinfo_error),
            },
        }
    }

    pub(super) fn device_of(metadata: &Metadata) -> Option<(u32, u32)> {
        crate::os::device_number(metadata).map(split_device_number)
    }

    pub(super) fn filesystem_magic(path: &Path) -> io::Result<u64> {
        crate::os::filesystem_magic(path)
    }

    pub(super) fn filesystem_magic_of(file: &File) -> io::Result<u64> {
        crate::os::filesystem_magic_of(file)
    }
}

#[cfg(test)]
#[cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]
mod tests {
    use super::*;

    // -----------------------------------------------------------------------------------------
    // Helpers
    // -----------------------------------------------------------------------------------------

    /// The mount point `find` picks for `path`, as a string, for assertions that read well.
    fn mount_point_for(
        table: &MountTable,
        path: &str,
        device: Option<(u32, u32)>,
    ) -> Option<String> {
        table
            .find(Path::new(path), device)
            .map(|entry| entry.mount_point().to_string_lossy().into_owned())
    }

    fn only_entry(text: &str) -> MountEntry {
        let table = MountTable::parse(text);
        assert_eq!(table.entries().len(), 1, "expected one entry from {text:?}");
        table.entries()[0].clone()
    }

    /// The kernel's escaping of a mount table field (`mangle()` in fs/proc_namespace.c): the
    /// naive twin of `decode_escapes`.
    fn escape_field(field: &[u8]) -> String {
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

    /// A directory under the system temp dir, removed on drop (no `tempfile` in this crate).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicUsize, Ordering};
            static COUNTER: AtomicUsize = AtomicUsize::new(0);
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir()
                .join(format!("safeload-mount-{tag}-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn file(&self, name: &str) -> PathBuf {
            let path = self.0.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap();
            }
            std::fs::write(&path, b"not really a checkpoint").unwrap();
            path
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    // -----------------------------------------------------------------------------------------
    // hf-mount
    // -----------------------------------------------------------------------------------------

    // As /proc/self/mountinfo shows a fuser mount with `MountOption::FSName("hf-mount")` and
    // no subtype: type `fuse`, source `hf-mount`, the options the kernel's FUSE adds.
    const HF_MOUNT_FUSE: &str = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
612 27 0:58 / /mnt/hub rw,nosuid,nodev,relatime shared:301 - fuse hf-mount rw,user_id=0,group_id=0,allow_other
";

    #[test]
    fn hf_mount_as_plain_fuse_is_hf_mount() {
        let table = MountTable::parse(HF_MOUNT_FUSE);
        let shard = Path::new("/mnt/hub/meta-llama/Llama-3-8B/model-00001-of-00004.safetensors");
        let (entry, detected_by) = table.locate(shard, Some((0, 58))).unwrap();
        assert_eq!(entry.kind(), MountKind::HfMount);
        assert_eq!(entry.fs_type(), "fuse");
        assert_eq!(entry.source(), "hf-mount");
        assert_eq!(entry.mount_point(), Path::new("/mnt/hub"));
        assert_eq!(entry.super_options(), "rw,user_id=0,group_id=0,allow_other");
        assert_eq!(detected_by, Detection::Device);
        // Outside the mount, the root's ext4.
        assert_eq!(
            table
                .find(Path::new("/mnt/other"), Some((254, 0)))
                .unwrap()
                .kind(),
            MountKind::Local
        );
    }

    #[test]
    fn hf_mount_with_subtype_is_hf_mount() {
        // As mountinfo shows a FUSE mount made with `MountOption::Subtype("hf-mount")`: the
        // kernel appends the subtype to the type.
        let entry = only_entry(
            "612 27 0:58 / /mnt/hub rw,nosuid,nodev,relatime - fuse.hf-mount hf-mount rw,user_id=0,group_id=0\n",
        );
        assert_eq!(entry.fs_type(), "fuse.hf-mount");
        assert_eq!(entry.kind(), MountKind::HfMount);
        // The subtype alone is enough, whatever the mounter put as the source.
        assert_eq!(
            classify("fuse.hf-mount", "openai/gpt-oss-20b", "rw"),
            MountKind::HfMount
        );
        // And the source alone, on any FUSE type.
        assert_eq!(classify("fuseblk", "hf-mount", "rw"), MountKind::HfMount);
    }

    // As mountinfo shows hf-mount's NFS mode mounted with `mount -t nfs4 127.0.0.1:/ /mnt/hub`:
    // the kernel NFS client adds `clientaddr=` and `addr=` to the superblock options.
    const HF_MOUNT_NFS_V4: &str = "700 27 0:61 / /mnt/hub rw,relatime shared:310 - nfs4 127.0.0.1:/ rw,vers=4.1,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=null,clientaddr=127.0.0.1,local_lock=none,addr=127.0.0.1\n";

    #[test]
    fn hf_mount_nfs_mode_on_ipv4_loopback_is_hf_mount() {
        let entry = only_entry(HF_MOUNT_NFS_V4);
        assert_eq!(entry.kind(), MountKind::HfMount);
        assert_eq!(entry.source(), "127.0.0.1:/");
        assert_eq!(entry.option("addr").as_deref(), Some("127.0.0.1"));
    }

    #[test]
    fn hf_mount_nfs_mode_on_ipv6_loopback_is_hf_mount() {
        // As mountinfo shows `mount -t nfs4 [::1]:/ /mnt/hub` (proto=tcp6, addr=::1).
        let bracketed = only_entry(
            "701 27 0:62 / /mnt/hub rw,relatime - nfs4 [::1]:/ rw,vers=4.2,hard,proto=tcp6,sec=null,clientaddr=::1,addr=::1\n",
        );
        assert_eq!(bracketed.kind(), MountKind::HfMount);
        // A server named by a host name: only `addr=` (the address the kernel connected to)
        // shows it is loopback.
        assert_eq!(
            classify("nfs4", "hub-nfs:/", "rw,vers=4.2,proto=tcp6,addr=::1"),
            MountKind::HfMount
        );
        // NFSv3 with `localhost`, as /proc/mounts merges the options.
        let v3 = only_entry(
            "localhost:/ /mnt/hub nfs rw,relatime,vers=3,mountaddr=127.0.0.1,mountvers=3,mountproto=tcp,addr=127.0.0.1 0 0\n",
        );
        assert_eq!(v3.kind(), MountKind::HfMount);
        assert_eq!(classify("nfs", "::1:/", "rw"), MountKind::HfMount);
        assert_eq!(classify("nfs4", "127.0.0.2:/", "rw"), MountKind::HfMount);
    }

    #[test]
    fn remote_nfs_is_network_whatever_its_client_address() {
        // As mountinfo shows an NFSv4.2 export of a file server.
        let remote = only_entry(
            "85 27 0:52 / /mnt/models rw,relatime shared:60 - nfs4 fileserver:/export/models rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.9,local_lock=none,addr=10.0.0.5\n",
        );
        assert_eq!(remote.kind(), MountKind::Network);
        assert_eq!(remote.source(), "fileserver:/export/models");
        // `clientaddr=` is this machine's address, `mountaddr=` the mount daemon's: neither is
        // the server.
        assert_eq!(
            classify(
                "nfs4",
                "fileserver:/x",
                "rw,clientaddr=127.0.0.1,mountaddr=127.0.0.1,addr=10.0.0.5"
            ),
            MountKind::Network,
        );
        // A `\054` (comma) inside another option's value cannot smuggle in an `addr=`.
        let smuggled = only_entry(
            "86 27 0:53 / /mnt/x rw - nfs4 fileserver:/x rw,fsc=a\\054addr=127.0.0.1,addr=10.0.0.5\n",
        );
        assert_eq!(smuggled.kind(), MountKind::Network);
    }

    // -----------------------------------------------------------------------------------------
    // Other kinds
    // -----------------------------------------------------------------------------------------

    #[test]
    fn network_filesystems_are_network() {
        // Shapes as mountinfo shows each client's mounts.
        let table = MountTable::parse(
            "\
90 27 0:45 / /lustre rw,relatime shared:50 - lustre 10.0.0.1@tcp:/fs rw,flock,lazystatfs
91 27 0:46 / /gpfs/fs1 rw,relatime shared:51 - gpfs fs1 rw
92 27 0:47 / /mnt/weka rw,relatime shared:52 - wekafs default rw,relatime,writecache,inode_bits=auto,dentry_max_age_positive=1000
93 27 0:48 / /mnt/share rw,relatime shared:53 - cifs //nas/share rw,vers=3.1.1,cache=strict,username=u,addr=10.0.0.7
94 27 0:49 / /mnt/beegfs rw,relatime shared:54 - beegfs beegfs_nodev rw,cfgFile=/etc/beegfs/beegfs-client.conf
95 27 0:50 / /mnt/cephfs rw,relatime shared:55 - ceph 10.0.0.2:6789:/ rw,name=admin,acl
",
        );
        assert_eq!(table.entries().len(), 6);
        for entry in table.entries() {
            assert_eq!(entry.kind(), MountKind::Network, "{entry:?}");
        }
        assert_eq!(table.entries()[0].source(), "10.0.0.1@tcp:/fs");
    }

    #[test]
    fn fuse_filesystems_are_fuse() {
        // Shapes as mountinfo shows ceph-fuse, s3fs, gcsfuse, JuiceFS and a virtiofs share.
        let table = MountTable::parse(
            "\
95 27 0:47 / /mnt/ceph rw,nosuid,nodev,relatime shared:52 - fuse.ceph-fuse ceph-fuse rw,user_id=0,group_id=0,allow_other
96 27 0:48 / /mnt/s3 rw,nosuid,nodev,relatime shared:53 - fuse.s3fs s3fs rw,user_id=0,group_id=0
97 27 0:49 / /mnt/gcs rw,nosuid,nodev,relatime shared:54 - fuse.gcsfuse my-bucket rw,user_id=0,group_id=0
98 27 0:50 / /jfs rw,relatime shared:55 - fuse.juicefs JuiceFS:myjfs rw,user_id=0,group_id=0,default_permissions,allow_other
99 27 0:51 / /mnt/host rw,relatime - virtiofs hostshare rw
",
        );
        assert_eq!(table.entries().len(), 5);
        for entry in table.entries() {
            assert_eq!(entry.kind(), MountKind::Fuse, "{entry:?}");
            assert!(entry.kind().is_fuse_like());
        }
    }

    #[test]
    fn classify_covers_the_documented_types() {
        let cases: &[(&str, &str, &str, MountKind)] = &[
            ("fuse", "hf-mount", "rw", MountKind::HfMount),
            ("FUSE.HF-MOUNT", "x", "rw", MountKind::HfMount),
            ("fuse", "sshfs#user@host:", "rw", MountKind::Fuse),
            ("fuse.sshfs", "user@host:/", "rw", MountKind::Fuse),
            ("fuse.rclone", "remote:", "rw", MountKind::Fuse),
            ("fuseblk", "/dev/sdb1", "rw", MountKind::Fuse),
            ("fuseblk.ntfs-3g", "/dev/sdb1", "rw", MountKind::Fuse),
            ("fusectl", "fusectl", "rw", MountKind::Local),
            ("nfs", "server:/x", "rw,addr=10.1.2.3", MountKind::Network),
            (
                "nfs4",
                "[fd00::5]:/x",
                "rw,addr=fd00::5",
                MountKind::Network,
            ),
            ("nfs4", "127.0.0.1:/", "rw", MountKind::HfMount),
            (
                "nfs4",
                "server:/",
                "rw,addr=[::ffff:127.0.0.1]",
                MountKind::HfMount,
            ),
            ("nfsd", "nfsd", "rw", MountKind::Local),
            ("smb3", "//nas/share", "rw", MountKind::Network),
            ("9p", "hostshare", "rw,trans=virtio", MountKind::Network),
            ("afs", "#cell:root.cell.", "rw", MountKind::Network),
            ("gfs2", "/dev/mapper/shared", "rw", MountKind::Network),
            ("ocfs2", "/dev/sdc", "rw", MountKind::Network),
            ("panfs", "panfs://10.0.0.3:global", "rw", MountKind::Network),
            ("ext4", "/dev/nvme0n1p1", "rw", MountKind::Local),
            ("xfs", "/dev/md0", "rw", MountKind::Local),
            ("btrfs", "/dev/sda2", "rw", MountKind::Local),
            ("zfs", "tank/models", "rw,xattr,noacl", MountKind::Local),
            ("tmpfs", "", "rw", MountKind::Local),
            ("overlay", "overlay", "rw,lowerdir=/a:/b", MountKind::Local),
            ("squashfs", "/dev/loop3", "ro", MountKind::Local),
            ("erofs", "/dev/loop4", "ro", MountKind::Local),
            ("proc", "proc", "rw", MountKind::Local),
            ("autofs", "systemd-1", "rw", MountKind::Unknown),
            ("", "", "", MountKind::Unknown),
            ("definitely-not-a-fs", "x", "rw", MountKind::Unknown),
        ];
        for &(fs_type, source, options, expected) in cases {
            assert_eq!(
                classify(fs_type, source, options),
                expected,
                "{fs_type} {source} {options}"
            );
        }
    }

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

    #[test]
    fn statfs_magic_numbers_classify() {
        assert_eq!(
            filesystem_by_magic(0x6573_5546),
            Some(("fuse", MountKind::Fuse))
        );
        assert_eq!(
            filesystem_by_magic(0x6969),
            Some(("nfs", MountKind::Network))
        );
        assert_eq!(
            filesystem_by_magic(0xFF53_4D42),
            Some(("cifs", MountKind::Network))
        );
        assert_eq!(
            filesystem_by_magic(0x0BD0_0BD0),
            Some(("lustre", MountKind::Network))
        );
        assert_eq!(
            filesystem_by_magic(0xEF53),
            Some(("ext2/ext3/ext4", MountKind::Local))
        );
        assert_eq!(
            filesystem_by_magic(0x794C_7630),
            Some(("overlay", MountKind::Local))
        );
        assert_eq!(filesystem_by_magic(0x1234_5678), None);
        let unknown = Mount::from_magic(0x1234_5678);
        assert_eq!(unknown.kind, MountKind::Unknown);
        assert_eq!(unknown.fs_type, "0x12345678");
        assert_eq!(unknown.detected_by, Detection::Statfs);
        assert_eq!(unknown.mount_point, PathBuf::new());
        assert_eq!(unknown.source, "");
        assert_eq!(
            Mount::from_magic(0x6573_5546).to_string(),
            "fuse: fuse (found by statfs)"
        );
    }

    // -----------------------------------------------------------------------------------------
    // Lookup rules
    // -----------------------------------------------------------------------------------------

    // As mountinfo shows a data disk with an NFS share mounted inside it.
    const NESTED: &str = "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 27 0:50 / /mnt/data rw,relatime shared:40 - xfs /dev/sdb1 rw,attr2,inode64
91 90 0:51 / /mnt/data/models rw,relatime shared:41 - nfs4 server:/models rw,vers=4.2,addr=10.0.0.5
";

    #[test]
    fn nested_mounts_pick_the_innermost() {
        let table = MountTable::parse(NESTED);
        let models = "/mnt/data/models/llama/model.safetensors";
        assert_eq!(
            mount_point_for(&table, models, Some((0, 51))).as_deref(),
            Some("/mnt/data/models")
        );
        assert_eq!(
            mount_point_for(&table, models, None).as_deref(),
            Some("/mnt/data/models")
        );
        let other = "/mnt/data/cache/x";
        assert_eq!(
            mount_point_for(&table, other, Some((0, 50))).as_deref(),
            Some("/mnt/data")
        );
        assert_eq!(
            mount_point_for(&table, other, None).as_deref(),
            Some("/mnt/data")
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/data", None).as_deref(),
            Some("/mnt/data")
        );
        assert_eq!(
            mount_point_for(&table, "/etc/hosts", Some((254, 0))).as_deref(),
            Some("/")
        );
    }

    #[test]
    fn device_match_beats_a_longer_mount_point_on_another_device() {
        // The file's device is the xfs disk: the file was opened (or the table read) before
        // the NFS share was mounted over its directory. The device is what holds the file.
        let table = MountTable::parse(NESTED);
        let path = Path::new("/mnt/data/models/llama/model.safetensors");
        let (entry, detected_by) = table.locate(path, Some((0, 50))).unwrap();
        assert_eq!(entry.mount_point(), Path::new("/mnt/data"));
        assert_eq!(entry.kind(), MountKind::Local);
        assert_eq!(detected_by, Detection::Device);
        // But the device only counts on a mount point that contains the path.
        let table = MountTable::parse(
            "\
27 1 254:0 / / rw - ext4 /dev/vda rw
80 27 0:60 / /mnt/elsewhere rw - nfs4 server:/x rw,addr=10.0.0.5
",
        );
        let (entry, detected_by) = table.locate(Path::new("/srv/x"), Some((0, 60))).unwrap();
        assert_eq!(entry.mount_point(), Path::new("/"));
        assert_eq!(detected_by, Detection::PathPrefix);
    }

    #[test]
    fn bind_mounts_of_one_device_pick_the_longest_mount_point() {
        // As mountinfo shows a disk mounted at /data and its `models` directory bind-mounted
        // into a home directory (`mount --bind /data/models /home/user/models`): same device,
        // root `/models` on the bind mount.
        let table = MountTable::parse(
            "\
27 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
70 27 259:2 / /data rw,relatime shared:30 - ext4 /dev/nvme1n1 rw
71 27 259:2 /models /home/user/models rw,relatime shared:30 - ext4 /dev/nvme1n1 rw
",
        );
        let via_bind = table
            .find(Path::new("/home/user/models/m.safetensors"), Some((259, 2)))
            .unwrap();
        assert_eq!(via_bind.mount_point(), Path::new("/home/user/models"));
        assert_eq!(via_bind.root(), Path::new("/models"));
        let direct = table
            .find(Path::new("/data/models/m.safetensors"), Some((259, 2)))
            .unwrap();
        assert_eq!(direct.mount_point(), Path::new("/data"));
        assert_eq!(direct.root(), Path::new("/"));
    }

    #[test]
    fn a_mount_point_that_only_looks_like_a_prefix_does_not_match() {
        // As mountinfo shows two sibling mounts whose names share a prefix.
        let table = MountTable::parse(
            "\
27 1 254:0 / / rw - ext4 /dev/vda rw
60 27 0:60 / /mnt/a rw - fuse hf-mount rw,user_id=0,group_id=0
61 27 0:61 / /mnt/ab rw - ext4 /dev/vdb rw
",
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/ab/x", None).as_deref(),
            Some("/mnt/ab")
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/a/x", None).as_deref(),
            Some("/mnt/a")
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/a", None).as_deref(),
            Some("/mnt/a")
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/abc/x", None).as_deref(),
            Some("/")
        );
        // /mnt/a's device does not pull in a path under /mnt/ab.
        assert_eq!(
            mount_point_for(&table, "/mnt/ab/x", Some((0, 60))).as_deref(),
            Some("/mnt/ab")
        );
        // Relative paths are not canonical: nothing contains them.
        assert_eq!(mount_point_for(&table, "mnt/a/x", None), None);
        // `/` contains everything absolute, itself included.
        assert_eq!(mount_point_for(&table, "/", None).as_deref(), Some("/"));
    }

    #[test]
    fn stacked_mounts_at_one_point_pick_the_top_most() {
        // As mountinfo shows hf-mount mounted over a directory that was already a mount point
        // (the FUSE mount's parent is the ext4 mount it covers).
        let in_mount_order = "\
27 1 254:0 / / rw - ext4 /dev/vda rw
100 27 259:1 / /mnt/hub rw - ext4 /dev/nvme1n1 rw
101 100 0:58 / /mnt/hub rw,nosuid,nodev - fuse hf-mount rw,user_id=0,group_id=0
";
        let table = MountTable::parse(in_mount_order);
        let path = "/mnt/hub/org/model/model.safetensors";
        assert_eq!(
            table.find(Path::new(path), None).unwrap().kind(),
            MountKind::HfMount
        );
        assert_eq!(
            table.find(Path::new(path), Some((0, 58))).unwrap().kind(),
            MountKind::HfMount
        );
        // A file on the covered filesystem (opened before the stack) is on the covered one.
        assert_eq!(
            table.find(Path::new(path), Some((259, 1))).unwrap().kind(),
            MountKind::Local
        );

        // When the lines come in another order, the parent ids still say which is on top.
        let reordered = "\
27 1 254:0 / / rw - ext4 /dev/vda rw
101 100 0:58 / /mnt/hub rw,nosuid,nodev - fuse hf-mount rw,user_id=0,group_id=0
100 27 259:1 / /mnt/hub rw - ext4 /dev/nvme1n1 rw
";
        let table = MountTable::parse(reordered);
        assert_eq!(
            table.find(Path::new(path), None).unwrap().kind(),
            MountKind::HfMount
        );

        // Without ids (/proc/mounts), the later line is on top: as old kernels list the
        // initramfs `rootfs` under the real root.
        let table = MountTable::parse("rootfs / rootfs rw 0 0\n/dev/sda1 / ext4 rw,relatime 0 0\n");
        assert_eq!(
            table.find(Path::new("/usr/lib"), None).unwrap().fs_type(),
            "ext4"
        );
    }

    #[test]
    fn a_container_overlay_root_is_local() {
        // As /proc/self/mountinfo shows inside a Docker container: an overlay root, /proc, a
        // bind-mounted /etc/hosts and a read-only bind of the host's model directory.
        let table = MountTable::parse(
            "\
1012 950 0:120 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/QWERTY:/var/lib/docker/overlay2/l/ASDFGH,upperdir=/var/lib/docker/overlay2/abc/diff,workdir=/var/lib/docker/overlay2/abc/work
1013 1012 0:123 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1030 1012 254:1 /var/lib/docker/containers/abc/hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
1040 1012 254:1 /srv/models /models ro,relatime - ext4 /dev/vda1 rw
",
        );
        let root = table
            .find(Path::new("/usr/lib/x.so"), Some((0, 120)))
            .unwrap();
        assert_eq!(root.fs_type(), "overlay");
        assert_eq!(root.kind(), MountKind::Local);
        assert!(
            root.super_options()
                .contains("lowerdir=/var/lib/docker/overlay2/l/QWERTY")
        );
        // Overlay files on layers from several filesystems report the layer's device, which
        // only matches /etc/hosts and /models here: neither contains the path, so the path
        // decides.
        let (entry, detected_by) = table
            .locate(Path::new("/usr/lib/x.so"), Some((254, 1)))
            .unwrap();
        assert_eq!(entry.fs_type(), "overlay");
        assert_eq!(detected_by, Detection::PathPrefix);
        let (entry, detected_by) = table
            .locate(Path::new("/models/m.safetensors"), Some((254, 1)))
            .unwrap();
        assert_eq!(entry.mount_point(), Path::new("/models"));
        assert_eq!(entry.root(), Path::new("/srv/models"));
        assert_eq!(detected_by, Detection::Device);
    }

    #[test]
    fn a_btrfs_subvolume_device_falls_back_to_the_path() {
        // As mountinfo shows a btrfs filesystem with subvolumes @ and @home mounted (the
        // Ubuntu and Fedora layout). stat(2) of a file reports the subvolume's anonymous
        // device, here 0:45, which the table does not list.
        let table = MountTable::parse(
            "\
30 1 0:27 /@ / rw,relatime shared:1 - btrfs /dev/nvme0n1p2 rw,ssd,space_cache=v2,subvolid=256,subvol=/@
31 30 0:27 /@home /home rw,relatime shared:2 - btrfs /dev/nvme0n1p2 rw,ssd,space_cache=v2,subvolid=257,subvol=/@home
",
        );
        let path = Path::new("/home/user/models/m.safetensors");
        let (entry, detected_by) = table.locate(path, Some((0, 45))).unwrap();
        assert_eq!(entry.mount_point(), Path::new("/home"));
        assert_eq!(entry.root(), Path::new("/@home"));
        assert_eq!(entry.kind(), MountKind::Local);
        assert_eq!(detected_by, Detection::PathPrefix);
        // Where the device does match, it is found by device.
        assert_eq!(
            table.locate(path, Some((0, 27))).unwrap().1,
            Detection::Device
        );
    }

    // -----------------------------------------------------------------------------------------
    // Parsing
    // -----------------------------------------------------------------------------------------

    #[test]
    fn escaped_mount_points_are_decoded() {
        // As mountinfo shows `mkdir "/mnt/my models"; mount ... "/mnt/my models"`: the kernel
        // writes the space as \040.
        let entry = only_entry(
            "120 27 0:70 / /mnt/my\\040models rw,relatime - fuse hf-mount rw,user_id=0,group_id=0\n",
        );
        assert_eq!(entry.mount_point(), Path::new("/mnt/my models"));
        let table = MountTable::parse(&format!("27 1 254:0 / / rw - ext4 /dev/vda rw\n{}", {
            "120 27 0:70 / /mnt/my\\040models rw,relatime - fuse hf-mount rw\n"
        }));
        assert_eq!(
            mount_point_for(&table, "/mnt/my models/m.safetensors", None).as_deref(),
            Some("/mnt/my models"),
        );
        assert_eq!(
            mount_point_for(&table, "/mnt/my/models", None).as_deref(),
            Some("/")
        );
        // And the same in /proc/mounts, with a tab, a newline and a backslash.
        let entry = only_entry("/dev/sdb1 /mnt/a\\011b\\012c\\134d ext4 rw 0 0\n");
        assert_eq!(entry.mount_point(), Path::new("/mnt/a\tb\nc\\d"));
    }

    #[test]
    fn escapes_decode_and_malformed_ones_stay_literal() {
        let decode = |s: &str| decode_escapes(s.as_bytes()).into_owned();
        assert_eq!(decode("plain"), b"plain");
        assert_eq!(decode("a\\040b"), b"a b");
        assert_eq!(decode("\\134040"), b"\\040"); // one level of decoding only
        assert_eq!(decode("\\303\\251"), "é".as_bytes());
        assert_eq!(decode("\\377"), [0xFF]);
        assert_eq!(decode("a\\9b"), b"a\\9b");
        assert_eq!(decode("a\\04"), b"a\\04");
        assert_eq!(decode("a\\400"), b"a\\400"); // 256 is not a byte
        assert_eq!(decode("a\\"), b"a\\");
        assert_eq!(decode("\\\\040"), b"\\ ");
        assert!(matches!(decode_escapes(b"no escapes"), Cow::Borrowed(_)));
    }

    #[test]
    fn escaping_then_decoding_returns_every_byte() {
        // The naive twin: every byte, escaped the kernel's way, decodes back to itself.
        let all: Vec<u8> = (1..=255u8).collect();
        assert_eq!(
            decode_escapes(escape_field(&all).as_bytes()).into_owned(),
            all
        );
        for byte in 0..=255u8 {
            let field = [b'/', byte, b'x'];
            assert_eq!(
                decode_escapes(escape_field(&field).as_bytes()).into_owned(),
                field
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn mount_points_that_are_not_utf8_are_kept_exactly() {
        use std::os::unix::ffi::OsStrExt;
        let table = MountTable::parse_bytes(b"60 27 0:60 / /mnt/\xff\xfe rw - ext4 /dev/vdb rw\n");
        assert_eq!(
            table.entries()[0].mount_point().as_os_str().as_bytes(),
            b"/mnt/\xff\xfe"
        );
        let table = MountTable::parse("60 27 0:60 / /mnt/\\377 rw - ext4 /dev/vdb rw\n");
        assert_eq!(
            table.entries()[0].mount_point().as_os_str().as_bytes(),
            b"/mnt/\xff"
        );
    }

    #[test]
    fn a_tmpfs_with_an_empty_source_keeps_its_fields_apart() {
        // As mountinfo shows a tmpfs mounted with an empty source string
        // (`mount("", "/dev/shm", "tmpfs", ...)`, as some container runtimes do): two spaces
        // between the type and the superblock options.
        let entry =
            only_entry("45 25 0:40 / /dev/shm rw,nosuid,nodev,relatime - tmpfs  rw,size=65536k\n");
        assert_eq!(entry.fs_type(), "tmpfs");
        assert_eq!(entry.source(), "");
        assert_eq!(entry.super_options(), "rw,size=65536k");
        assert_eq!(entry.kind(), MountKind::Local);
        // The same mount in /proc/mounts: the line starts with the empty source.
        let entry = only_entry(" /dev/shm tmpfs rw,nosuid,nodev,relatime,size=65536k 0 0\n");
        assert_eq!(entry.source(), "");
        assert_eq!(entry.mount_point(), Path::new("/dev/shm"));
        assert_eq!(entry.fs_type(), "tmpfs");
    }

    #[test]
    fn mountinfo_fields_are_all_read() {
        // A line from this kind of machine's /proc/self/mountinfo, with two optional fields.
        let entry = only_entry(
            "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 shared:7 - ext3 /dev/root rw,errors=continue\n",
        );
        assert_eq!(entry.mount_id(), Some(36));
        assert_eq!(entry.parent_id(), Some(35));
        assert_eq!(entry.device(), Some((98, 0)));
        assert_eq!(entry.root(), Path::new("/mnt1"));
        assert_eq!(entry.mount_point(), Path::new("/mnt2"));
        assert_eq!(entry.options(), "rw,noatime");
        assert_eq!(entry.fs_type(), "ext3");
        assert_eq!(entry.source(), "/dev/root");
        assert_eq!(entry.super_options(), "rw,errors=continue");
        assert_eq!(entry.option("noatime").as_deref(), Some(""));
        assert_eq!(entry.option("errors").as_deref(), Some("continue"));
        assert_eq!(entry.option("error"), None);
        // nsfs bind mounts have a root that is not a path.
        let entry = only_entry("600 30 0:4 net:[4026532008] /run/netns/ns1 rw - nsfs nsfs rw\n");
        assert_eq!(entry.root(), Path::new("net:[4026532008]"));
        // CRLF line ends and indentation are tolerated.
        assert_eq!(
            MountTable::parse("  22 27 0:21 / /proc rw - proc proc rw\r\n")
                .entries()
                .len(),
            1
        );
    }

    // As /proc/mounts shows a host with an NVMe root, /proc and an NFS share.
    const PROC_MOUNTS: &str = "\
/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
fileserver:/export/models /mnt/models nfs4 rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp,clientaddr=10.0.0.9,addr=10.0.0.5 0 0
hf-mount /mnt/hub fuse rw,nosuid,nodev,relatime,user_id=0,group_id=0,allow_other 0 0
";

    #[test]
    fn proc_mounts_lines_parse() {
        let table = MountTable::parse_mounts(PROC_MOUNTS);
        assert_eq!(table, MountTable::parse(PROC_MOUNTS));
        let kinds: Vec<MountKind> = table.entries().iter().map(MountEntry::kind).collect();
        assert_eq!(
            kinds,
            [
                MountKind::Local,
                MountKind::Local,
                MountKind::Network,
                MountKind::HfMount
            ]
        );
        let nfs = &table.entries()[2];
        assert_eq!(nfs.mount_id(), None);
        assert_eq!(nfs.parent_id(), None);
        assert_eq!(nfs.device(), None);
        assert_eq!(nfs.root(), Path::new("/"));
        assert_eq!(nfs.source(), "fileserver:/export/models");
        assert_eq!(nfs.super_options(), "");
        assert_eq!(nfs.option("addr").as_deref(), Some("10.0.0.5"));
        // Without devices, every match is by path.
        let (entry, detected_by) = table
            .locate(Path::new("/mnt/hub/m.safetensors"), Some((0, 58)))
            .unwrap();
        assert_eq!(entry.kind(), MountKind::HfMount);
        assert_eq!(detected_by, Detection::PathPrefix);
    }

    #[test]
    fn fstab_layout_parses_too() {
        // As /etc/fstab is written: tabs, comments, omitted columns, swap.
        let table = MountTable::parse_mounts(
            "\
# <file system> <mount point> <type> <options> <dump> <pass>
UUID=1234-abcd\t/\text4\terrors=remount-ro\t0\t1
/swapfile  none  swap  sw  0  0
fileserver:/export   /mnt/nfs   nfs4
",
        );
        let points: Vec<&Path> = table
            .entries()
            .iter()
            .map(MountEntry::mount_point)
            .collect();
        assert_eq!(points, [Path::new("/"), Path::new("/mnt/nfs")]);
        assert_eq!(table.entries()[1].options(), "");
        assert_eq!(table.entries()[1].kind(), MountKind::Network);
    }

    #[test]
    fn parse_detects_the_format() {
        let mountinfo = MountTable::parse(NESTED);
        assert_eq!(mountinfo, MountTable::parse_mountinfo(NESTED));
        assert!(
            mountinfo
                .entries()
                .iter()
                .all(|entry| entry.mount_id().is_some())
        );
        // Each format read as the other finds nothing.
        assert!(MountTable::parse_mounts(NESTED).entries().is_empty());
        assert!(
            MountTable::parse_mountinfo(PROC_MOUNTS)
                .entries()
                .is_empty()
        );
        assert_eq!(MountTable::parse(""), MountTable::default());
        assert_eq!(MountTable::parse("\n\n"), MountTable::default());
    }

    #[test]
    fn malformed_lines_are_skipped() {
        let table = MountTable::parse_mountinfo(
            "\
27 1 254:0 / / rw - ext4 /dev/vda rw
this is not a mount table line
x 1 254:0 / /a rw - ext4 /dev/vda rw
28 y 254:0 / /b rw - ext4 /dev/vda rw
29 1 254 / /c rw - ext4 /dev/vda rw
30 1 254:z / /d rw - ext4 /dev/vda rw
31 1 254:0 / /e rw ext4 /dev/vda rw
32 1 254:0 / /f rw -
33 1 254:0 / /g rw - ext4
34 1 254:0 / /h rw - ext4 /dev/vda
35 1 254:0 / relative rw - ext4 /dev/vda rw
36 1 +254:0 / /i rw - ext4 /dev/vda rw
37 1 99999999999:0 / /j rw - ext4 /dev/vda rw
38 1 0:1
-
 - - - -
38 27 0:58 / /mnt/hub rw - fuse hf-mount rw
",
        );
        let ids: Vec<Option<u64>> = table.entries().iter().map(MountEntry::mount_id).collect();
        assert_eq!(ids, [Some(27), Some(38)]);
        let table = MountTable::parse_mounts(
            "onlyone\ntwo fields\nsrc relative ext4 rw 0 0\n/dev/a /ok ext4 rw 0 0\n",
        );
        assert_eq!(table.entries().len(), 1);
    }

    #[test]
    fn no_input_makes_the_parsers_panic() {
        // Every truncation of real lines, and pseudo-random bytes from a small generator.
        let text = format!("{HF_MOUNT_FUSE}{HF_MOUNT_NFS_V4}{NESTED}{PROC_MOUNTS}");
        for end in 0..=text.len() {
            let bytes = &text.as_bytes()[..end];
            let _ = MountTable::parse_bytes(bytes);
            let _ = MountTable::parse_bytes(&text.as_bytes()[end..]);
        }
        let alphabet = b" \t\n\\-:/0123456789abcfuse.";
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let mut line = Vec::new();
            for _ in 0..(state % 80) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                line.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let table = MountTable::parse_bytes(&line);
            for entry in table.entries() {
                let _ = table.find(entry.mount_point(), entry.device());
            }
        }
    }

    #[test]
    fn split_device_number_matches_glibc() {
        assert_eq!(split_device_number(0xfe00), (254, 0));
        assert_eq!(split_device_number(0), (0, 0));
        #[cfg(target_os = "linux")]
        for (major, minor) in [
            (0u32, 0u32),
            (8, 1),
            (254, 0),
            (259, 2),
            (0, 300),
            (4095, 255),
            (0xFFFF_FFFF, 0xFFFF_FFFF),
            (0x1234_5678, 0x9ABC_DEF0),
        ] {
            let dev = libc::makedev(major, minor);
            assert_eq!(split_device_number(dev), (major, minor));
            assert_eq!(
                split_device_number(dev),
                (libc::major(dev), libc::minor(dev))
            );
        }
    }

    // -----------------------------------------------------------------------------------------
    // On this machine
    // -----------------------------------------------------------------------------------------

    #[test]
    fn the_current_table_reads_and_knows_the_root() {
        let table = MountTable::current().unwrap();
        if cfg!(target_os = "linux") {
            assert!(!table.entries().is_empty());
            assert!(table.find(Path::new("/"), None).is_some());
            let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert_eq!(MountTable::parse(&text), MountTable::parse_mountinfo(&text));
        } else {
            assert!(table.entries().is_empty());
        }
    }

    #[test]
    fn a_temp_file_is_found_and_is_not_on_hf_mount() {
        let dir = TempDir::new("lookup");
        let file = dir.file("model.safetensors");
        let mount = lookup(&file).unwrap();
        assert!(!is_on_hf_mount(&file));
        if cfg!(target_os = "linux") {
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
        let mount = lookup("/proc/self/exe");
        if cfg!(target_os = "linux") {
            let mount = mount.unwrap();
            assert_ne!(mount.kind, MountKind::Unknown, "{mount}");
            assert!(mount.to_string().contains("found by"));
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn lookups_on_linux_use_the_table_then_statfs() {
        let dir = TempDir::new("inject");
        let file = dir.file("model.safetensors");
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
        let missing = lookup_in(&hf_root, &dir.0.join("missing.safetensors")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        assert!(!is_on_hf_mount(dir.0.join("missing.safetensors")));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn lookups_follow_symlinks_like_a_hub_cache_snapshot() {
        // A Hugging Face cache: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>.
        // Pretend (with an injected table) that blobs/ is an hf-mount mount: only the
        // resolved path is under it.
        let dir = TempDir::new("cache");
        let blob = dir.file("blobs/0123abcd");
        let snapshot = dir.0.join("snapshots/rev/model.safetensors");
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
