//! One mount: [`MountEntry`], a line of a mount table, its fields as the kernel wrote them and its options looked up by name.

use std::path::{Path, PathBuf};

use super::{MountKind, escape};

/// One line of a mount table (from `/proc/mounts`: no ids nor device number, root `/`).
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
#[doc(hidden)]
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

    /// The filesystem's device number as `(major, minor)`, the files' `st_dev` (`mountinfo`
    /// field 3); `None` for `/proc/mounts` lines.
    pub fn device(&self) -> Option<(u32, u32)> {
        self.device
    }

    /// The directory of the filesystem mounted here (`mountinfo` field 4): `/` for a whole
    /// filesystem, a subdirectory for a bind mount.
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
    /// (`hf-mount`, `overlay`); may be empty.
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

    /// The value of the option `name`, escapes decoded (`Some("")` for a flag), per-mount
    /// options first.
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
