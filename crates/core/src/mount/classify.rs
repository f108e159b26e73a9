//! What kind of filesystem a mount is: [`MountKind`], [`classify`] from a mount's type, source and options, and the `statfs(2)` magic numbers for when the table has no answer.

use std::fmt;
use std::net::IpAddr;

use super::escape;

/// What kind of filesystem a mount is, split by how page faults of a memory map fare on it:
/// served one at a time by a userspace process (FUSE, which can stall), each a network round
/// trip, or cheap (local).
///
/// ```
/// use safeload::mount::{self, MountKind};
///
/// let kind = mount::lookup(std::env::temp_dir())?.kind;
/// match kind {
///     MountKind::HfMount | MountKind::Fuse => assert!(kind.is_fuse_like()),
///     _ => assert!(!kind.is_fuse_like()),
/// }
/// assert_eq!(MountKind::Fuse.to_string(), "fuse");
/// # Ok::<(), std::io::Error>(())
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum MountKind {
    /// A Hugging Face Hub repository mounted by `hf-mount`: its FUSE mount (source `hf-mount`,
    /// or type `fuse.hf-mount`), or its NFS mode (an `nfs`/`nfs4` mount served from loopback,
    /// which is a userspace server just as risky as FUSE).
    #[cfg_attr(feature = "serde", serde(rename = "hf-mount"))]
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
    /// A short lowercase name, as `Display` and JSON say it: `"hf-mount"`, `"fuse"`,
    /// `"network"`, `"local"` or `"unknown"`.
    pub(crate) fn as_str(&self) -> &'static str {
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
/// is a superblock option in `mountinfo`). The kinds' docs say which types each takes; an
/// `nfs`/`nfs4` mount whose source host or `addr=` is a loopback address is hf-mount's NFS mode.
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
#[doc(hidden)]
pub fn classify(fs_type: &str, source: &str, options: &str) -> MountKind {
    classify_parts(fs_type, source, &[options])
}

/// [`classify`] with the option lists given separately (no joined string per entry).
pub(super) fn classify_parts(fs_type: &str, source: &str, option_lists: &[&str]) -> MountKind {
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
/// (the server address, nfs(5); not `clientaddr=` nor `mountaddr=`), is a loopback address.
fn nfs_served_from_loopback(source: &str, option_lists: &[&str]) -> bool {
    if nfs_source_host(source).is_some_and(is_loopback_host) {
        return true;
    }
    option_lists
        .iter()
        .flat_map(|list| list.split(','))
        .filter_map(|option| option.trim().strip_prefix("addr="))
        .any(|value| is_loopback_host(&escape::decode_str(value)))
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

/// The filesystem name and kind for a `statfs(2)` `f_type` magic number (`linux/magic.h`);
/// it cannot tell hf-mount from other FUSE filesystems, nor a loopback NFS server.
pub(super) fn filesystem_by_magic(magic: u64) -> Option<(&'static str, MountKind)> {
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

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::mount::test_util::{fixture, only_entry};
    use crate::mount::{Detection, Mount, MountEntry, MountTable};

    #[test]
    fn hf_mount_as_plain_fuse_is_hf_mount() {
        let table = MountTable::parse(fixture("mountinfo-hf-mount-fuse.txt"));
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

    #[test]
    fn hf_mount_nfs_mode_on_ipv4_loopback_is_hf_mount() {
        let entry = only_entry(fixture("mountinfo-hf-mount-nfs4.txt"));
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

    /// The kinds of the entries of a fixture, in table order.
    fn kinds(fixture_name: &str) -> Vec<MountKind> {
        let table = MountTable::parse(fixture(fixture_name));
        table.entries().iter().map(MountEntry::kind).collect()
    }

    #[test]
    fn network_filesystems_are_network() {
        // Shapes as mountinfo shows each client's mounts.
        assert_eq!(
            kinds("mountinfo-network-clients.txt"),
            [MountKind::Network; 6]
        );
        // Lustre's source, `<nid>:/<fsname>`, is kept as written.
        let clients = MountTable::parse(fixture("mountinfo-network-clients.txt"));
        assert_eq!(clients.entries()[0].source(), "10.0.0.1@tcp:/fs");
    }

    #[test]
    fn fuse_filesystems_are_fuse() {
        // Shapes as mountinfo shows ceph-fuse, s3fs, gcsfuse, JuiceFS and a virtiofs share.
        assert_eq!(kinds("mountinfo-fuse-clients.txt"), [MountKind::Fuse; 5]);
        assert!(MountKind::Fuse.is_fuse_like());
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
    fn statfs_magic_numbers_classify() {
        let known = [
            (0x6573_5546, "fuse", MountKind::Fuse),
            (0x6969, "nfs", MountKind::Network),
            (0xFF53_4D42, "cifs", MountKind::Network),
            (0x0BD0_0BD0, "lustre", MountKind::Network),
            (0xEF53, "ext2/ext3/ext4", MountKind::Local),
            (0x794C_7630, "overlay", MountKind::Local),
        ];
        for (magic, name, kind) in known {
            assert_eq!(filesystem_by_magic(magic), Some((name, kind)), "{magic:#x}");
        }
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
}
