//! The mount table as data: [`MountEntry`], [`MountTable`] and how [`MountTable::find`] picks the mount of a path.

use std::io;
use std::path::{Path, PathBuf};

use super::{Detection, MountKind, escape, parse};

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
    pub(super) mount_id: Option<u64>,
    pub(super) parent_id: Option<u64>,
    pub(super) device: Option<(u32, u32)>,
    pub(super) root: PathBuf,
    pub(super) mount_point: PathBuf,
    pub(super) fs_type: String,
    pub(super) source: String,
    pub(super) options: String,
    pub(super) super_options: String,
    pub(super) kind: MountKind,
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
                Some((key, value)) if key == name => Some(escape::decode_str(value).into_owned()),
                None if option == name => Some(String::new()),
                _ => None,
            })
    }

    /// The mount's kind, as [`classify`](fn@super::classify) gives it for this entry's type,
    /// source and options.
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
        MountTable::parse_lines(text.as_bytes(), parse::mountinfo_line)
    }

    /// Parses `/proc/mounts` text (also `/etc/mtab` and `/etc/fstab`, whose columns are the
    /// same). Lines that do not parse, comments, and entries without an absolute mount point
    /// (`swap`, `none`) are skipped.
    #[must_use]
    pub fn parse_mounts(text: &str) -> MountTable {
        MountTable::parse_lines(text.as_bytes(), parse::mounts_line)
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
        let mountinfo = MountTable::parse_lines(bytes, parse::mountinfo_line);
        let mounts = MountTable::parse_lines(bytes, parse::mounts_line);
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
        super::os::read_mount_table()
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
    pub(super) fn locate(
        &self,
        path: &Path,
        device: Option<(u32, u32)>,
    ) -> Option<(&MountEntry, Detection)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::test_util::{fixture, mount_point_for};

    // A data disk with an NFS share mounted inside it, and a host's /proc/mounts.
    const NESTED: &str = "mountinfo-nfs-inside-xfs.txt";
    const PROC_MOUNTS: &str = "mounts-nvme-nfs-hf-mount.txt";

    #[test]
    fn nested_mounts_pick_the_innermost() {
        let table = MountTable::parse(fixture(NESTED));
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
        let table = MountTable::parse(fixture(NESTED));
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
        let table = MountTable::parse(fixture("mountinfo-bind-mount.txt"));
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
        let table = MountTable::parse(fixture("mountinfo-docker-overlay.txt"));
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
        let table = MountTable::parse(fixture("mountinfo-btrfs-subvolumes.txt"));
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

    #[test]
    fn parse_detects_the_format() {
        let mountinfo = MountTable::parse(fixture(NESTED));
        assert_eq!(mountinfo, MountTable::parse_mountinfo(fixture(NESTED)));
        assert!(
            mountinfo
                .entries()
                .iter()
                .all(|entry| entry.mount_id().is_some())
        );
        // Each format read as the other finds nothing.
        assert!(
            MountTable::parse_mounts(fixture(NESTED))
                .entries()
                .is_empty()
        );
        assert!(
            MountTable::parse_mountinfo(fixture(PROC_MOUNTS))
                .entries()
                .is_empty()
        );
        assert_eq!(MountTable::parse(""), MountTable::default());
        assert_eq!(MountTable::parse("\n\n"), MountTable::default());
    }

    #[test]
    fn split_device_number_matches_glibc() {
        assert_eq!(split_device_number(0xfe00), (254, 0));
        assert_eq!(split_device_number(0), (0, 0));
        #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
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
}
