//! Which mount of a table a path lives on: [`MountTable::find`] by device number, then by path, and [`split_device_number`] for the device number it takes.

use std::path::Path;

use super::{Detection, MountEntry, MountTable};

impl MountTable {
    /// The mount that `canonical_path` lives on, given the file's device number (`st_dev`
    /// split with [`split_device_number`]) when known. Pure: it does not touch the path.
    ///
    /// `canonical_path` must be absolute with symlinks resolved; a mount point matches when it
    /// is a prefix of it on component boundaries. The longest matching mount point wins, first
    /// among the entries with the file's `device` (which filesystem holds the file beats a
    /// longer mount point stacked since), else among all (btrfs subvolumes and some overlay
    /// files report a device the table does not list; `/proc/mounts` has none). Among entries
    /// at the same mount point, the top-most wins: the last that no other of them is mounted on.
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
            .entries()
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
        // when the table has them (a stacked mount's parent is the mount it covers).
        // NOTE: not a walk of the mount tree from `/` by parent ids: that needs a complete
        // table (a chroot's and hand-written ones lack parents), and the device rule settles
        // hidden mounts whenever the caller knows `st_dev`.
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
/// The encoding has 12+20 bits of major and 8+24 bits of minor.
///
/// ```
/// use safeload::mount::split_device_number;
///
/// assert_eq!(split_device_number(0xfe00), (254, 0));   // /dev/vda
/// assert_eq!(split_device_number(0x0803), (8, 3));     // /dev/sda3
/// assert_eq!(split_device_number(0x0010_0031), (0, 256 + 49));
/// ```
#[must_use]
#[doc(hidden)]
pub fn split_device_number(st_dev: u64) -> (u32, u32) {
    let major = ((st_dev >> 32) & 0xffff_f000) | ((st_dev >> 8) & 0x0000_0fff);
    let minor = ((st_dev >> 12) & 0xffff_ff00) | (st_dev & 0x0000_00ff);
    // Both are masked to 32 bits above.
    (major as u32, minor as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::MountKind;
    use crate::mount::test_util::{fixture, mount_point_for};

    // A data disk with an NFS share mounted inside it.
    const NESTED: &str = "mountinfo-nfs-inside-xfs.txt";

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
