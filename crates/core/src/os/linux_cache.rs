//! The Linux calls of the write-through cache (`src/cache/`): names looked at and directories walked or made without following a symlink, files created only where no name was, published by a rename that never replaces, space reserved with `fallocate(2)`.
//!
//! Any name in a cache directory may have been made by another user, so
//! nothing here follows a symlink it was not asked to read, blocks on a FIFO,
//! or creates a file where a name already is.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::SystemTime;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};

use super::Dir;
use crate::os::{EntryKind, regular};

/// Directories the cache makes: every permission the process's umask
/// allows, as `mkdir -p` and the hub's own client make them.
const DIR_MODE: Mode = Mode::from_raw_mode(0o777);
/// Files the cache makes, before the umask: `0644` under the usual `022`.
const FILE_MODE: Mode = Mode::from_raw_mode(0o666);

impl Dir {
    /// What `name` is here, without following it.
    pub fn entry(&self, name: &str) -> io::Result<EntryKind> {
        let stat = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(rustix::io::Errno::NOENT) => return Ok(EntryKind::Missing),
            Err(e) => return Err(e.into()),
        };
        Ok(match FileType::from_raw_mode(stat.st_mode) {
            FileType::RegularFile => EntryKind::File {
                len: u64::try_from(stat.st_size).unwrap_or(0),
                modified: u64::try_from(stat.st_mtime)
                    .ok()
                    .map(|secs| SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs)),
            },
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Link,
            _ => EntryKind::Other,
        })
    }

    /// The directory `name` here, made first where `create` asks and it is
    /// missing; never through a symlink (`O_NOFOLLOW`: a link at `name` is
    /// an error, not a way elsewhere).
    pub fn sub(&self, name: &str, create: bool) -> io::Result<Dir> {
        if create {
            match rustix::fs::mkdirat(&self.fd, name, DIR_MODE) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Dir { fd })
    }

    /// The target of the symlink `name` here, as written (not resolved).
    pub fn read_link(&self, name: &str) -> io::Result<PathBuf> {
        let target = rustix::fs::readlinkat(&self.fd, name, Vec::new())?;
        Ok(super::path_from_bytes(target.into_bytes()))
    }

    /// Opens the regular file `name` here for reading, never through a
    /// symlink, without blocking on a FIFO.
    pub fn open_nofollow(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        regular(File::from(fd))
    }

    /// Creates the file `name` here for writing and reading, where no name
    /// is (`O_EXCL`: not even a dangling symlink is followed).
    pub fn create_new(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            FILE_MODE,
        )?;
        Ok(File::from(fd))
    }

    /// Opens the lock file `name` here, making it where missing: a regular
    /// file, never through a symlink, without blocking on a FIFO.
    pub fn open_lock(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            FILE_MODE,
        )?;
        regular(File::from(fd))
    }

    /// Renames `from` to `to` here unless `to` exists: `false` where it
    /// does, and nothing moved. `renameat2(RENAME_NOREPLACE)`; where the
    /// filesystem lacks it (`EINVAL`), a hard link (which never replaces
    /// either) and the removal of `from`.
    pub fn rename_noreplace(&self, from: &str, to: &str) -> io::Result<bool> {
        match rustix::fs::renameat_with(&self.fd, from, &self.fd, to, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(true),
            Err(rustix::io::Errno::EXIST) => return Ok(false),
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS) => {}
            Err(e) => return Err(e.into()),
        }
        match rustix::fs::linkat(&self.fd, from, &self.fd, to, AtFlags::empty()) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        rustix::fs::unlinkat(&self.fd, from, AtFlags::empty())?;
        Ok(true)
    }

    /// Renames `from` to `to` here, replacing what `to` names (atomically:
    /// `to` names the old entry or the new one, never nothing).
    pub fn replace(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(rustix::fs::renameat(&self.fd, from, &self.fd, to)?)
    }

    /// Makes `name` here a symlink to `target` (relative to this directory).
    pub fn symlink(&self, target: &str, name: &str) -> io::Result<()> {
        Ok(rustix::fs::symlinkat(target, &self.fd, name)?)
    }

    /// Removes the file or symlink `name` here (never what a link points at).
    pub fn remove(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())?)
    }

    /// Removes the empty directory `name` here (`unlinkat(AT_REMOVEDIR)`:
    /// a symlink at `name` is refused with `ENOTDIR`, never followed).
    pub fn remove_dir(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?)
    }

    /// The owner (uid) of `name` here, from `lstat`: a symlink's own, not
    /// its target's.
    pub fn owner(&self, name: &str) -> io::Result<Option<u32>> {
        let stat = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(Some(stat.st_uid))
    }
}

/// How many names a file has, from its metadata.
pub fn link_count(meta: &std::fs::Metadata) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    Some(meta.nlink())
}

/// Reserves `len` bytes for `file` (`fallocate(2)`, mode 0), so that writes
/// within them cannot fail for want of space: `false` where the filesystem
/// cannot reserve (`EOPNOTSUPP`), and the writes may.
pub fn reserve(file: &File, len: u64) -> io::Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::OPNOTSUPP) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Writes all of `buf` at `offset` (`pwrite(2)`, short writes and `EINTR`
/// taken up again).
pub fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    file.write_all_at(buf, offset)
}
