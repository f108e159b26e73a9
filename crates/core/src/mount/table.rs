//! A mount table built from text: [`MountTable`], parsed line by line in either format (detected from the text), or read for this process.

use std::io;

use super::{MountEntry, parse};
use crate::os::ProcFile;

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
#[doc(hidden)]
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

    /// Parses mount table text in either format: the reading that recognises more lines is
    /// kept (`mountinfo` on a tie); neither format's lines read as the other's.
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
    /// cannot be read or holds no entry. Empty (not an error) off Linux. Read it once per load:
    /// the kernel builds the file as it is read.
    ///
    /// # Errors
    ///
    /// The error of reading `/proc/self/mountinfo`, when neither file can be read.
    pub fn current() -> io::Result<MountTable> {
        if !crate::os::MOUNT_DETECTION {
            return Ok(MountTable::default());
        }
        // NOTE: read as bytes and parsed here, not with the full `procfs` crate's
        // `Process::mountinfo()`, which reads the file as UTF-8 lines and fails it whole on
        // one line it cannot parse; see `parse.rs` for the fixes on top of its line parser.
        let mountinfo = crate::os::read_proc(ProcFile::SelfMountinfo);
        if let Ok(bytes) = &mountinfo {
            let table = MountTable::parse_bytes(bytes);
            if !table.entries().is_empty() {
                return Ok(table);
            }
        }
        match (crate::os::read_proc(ProcFile::Mounts), mountinfo) {
            (Ok(bytes), _) => Ok(MountTable::parse_bytes(&bytes)),
            (Err(e), Ok(_)) | (_, Err(e)) => Err(e),
        }
    }

    /// The entries, in table order.
    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mount::test_util::fixture;

    // A data disk with an NFS share mounted inside it, and a host's /proc/mounts.
    const NESTED: &str = "mountinfo-nfs-inside-xfs.txt";
    const PROC_MOUNTS: &str = "mounts-nvme-nfs-hf-mount.txt";

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
}
