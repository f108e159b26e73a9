//! The filesystem: a read-only passthrough of a source directory whose `READ`s go to the
//! worker pool ([`crate::pool`]); everything else is answered here, on the session thread.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::pool::{Pool, ReadJob};
use crate::{Options, Shared};

/// How long the kernel may cache names and attributes.
const TTL: Duration = Duration::from_secs(1);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The passthrough filesystem handed to fuser.
pub(crate) struct TestFs {
    /// The canonical source directory.
    root: PathBuf,
    direct_io: bool,
    shared: Arc<Shared>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, OpenFile>>,
    dirs: Mutex<HashMap<u64, Arc<Vec<DirEntry>>>>,
    next_fh: AtomicU64,
    pool: Arc<Pool>,
    /// Asked for in `INIT`; see [`Options::max_background`].
    max_background: u16,
}

/// Node ids (the inode numbers the mount shows) and the source paths behind them.
struct Inodes {
    /// Path relative to the root of node id `i + 1`; the root (id 1) is the empty path.
    paths: Vec<Arc<Path>>,
    /// Source (device, inode) to node id, so a file keeps its number.
    ids: HashMap<(u64, u64), u64>,
}

impl Inodes {
    fn path(&self, ino: INodeNo) -> Option<Arc<Path>> {
        let index = usize::try_from(ino.0.checked_sub(1)?).ok()?;
        self.paths.get(index).cloned()
    }

    fn id(&mut self, md: &Metadata, path: &Path) -> u64 {
        *self.ids.entry((md.dev(), md.ino())).or_insert_with(|| {
            self.paths.push(Arc::from(path));
            self.paths.len() as u64
        })
    }
}

struct OpenFile {
    file: Arc<File>,
    path: Arc<Path>,
    /// Its size at open, for the fetch blocks past the end (none).
    len: u64,
    direct_io: bool,
}

struct DirEntry {
    ino: u64,
    kind: FileType,
    name: OsString,
}

impl TestFs {
    pub(crate) fn new(root: &Path, options: &Options, shared: Arc<Shared>) -> io::Result<Self> {
        let md = std::fs::symlink_metadata(root)?;
        let mut inodes = Inodes {
            paths: Vec::new(),
            ids: HashMap::new(),
        };
        inodes.id(&md, Path::new(""));
        Ok(Self {
            root: root.to_owned(),
            direct_io: options.direct_io,
            pool: Pool::start(options, Arc::clone(&shared))?,
            max_background: options.effective_max_background(),
            shared,
            inodes: Mutex::new(inodes),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        })
    }

    fn path(&self, ino: INodeNo) -> Result<Arc<Path>, Errno> {
        lock(&self.inodes).path(ino).ok_or(Errno::ENOENT)
    }

    /// The source path of a node.
    fn source(&self, path: &Path) -> PathBuf {
        if path.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(path)
        }
    }

    /// `lstat` of a relative path, and its node id.
    fn stat(&self, path: &Path) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(self.source(path))?;
        let ino = lock(&self.inodes).id(&md, path);
        Ok(attr(ino, &md))
    }

    fn list(&self, ino: INodeNo) -> Result<Vec<DirEntry>, Errno> {
        let path = self.path(ino)?;
        let parent = match path.parent() {
            Some(parent) => self.stat(parent)?.ino.0,
            None => INodeNo::ROOT.0,
        };
        let mut entries = vec![
            DirEntry {
                ino: ino.0,
                kind: FileType::Directory,
                name: ".".into(),
            },
            DirEntry {
                ino: parent,
                kind: FileType::Directory,
                name: "..".into(),
            },
        ];
        let mut children = Vec::new();
        for entry in std::fs::read_dir(self.source(&path))? {
            let entry = entry?;
            let name = entry.file_name();
            let md = entry.metadata()?;
            let child = path.join(&name);
            let ino = lock(&self.inodes).id(&md, &child);
            children.push(DirEntry {
                ino,
                kind: kind(&md),
                name,
            });
        }
        children.sort_by(|a, b| a.name.cmp(&b.name));
        entries.extend(children);
        Ok(entries)
    }

    fn new_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for TestFs {
    fn drop(&mut self) {
        self.pool.close();
    }
}

fn kind(md: &Metadata) -> FileType {
    FileType::from_std(md.file_type()).unwrap_or(FileType::RegularFile)
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let nsecs = u32::try_from(nsecs).unwrap_or(0);
    match u64::try_from(secs) {
        Ok(secs) => UNIX_EPOCH + Duration::new(secs, nsecs),
        Err(_) => UNIX_EPOCH - Duration::new(secs.unsigned_abs(), 0) + Duration::new(0, nsecs),
    }
}

fn attr(ino: u64, md: &Metadata) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: time(md.atime(), md.atime_nsec()),
        mtime: time(md.mtime(), md.mtime_nsec()),
        ctime: time(md.ctime(), md.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind: kind(md),
        perm: (md.mode() & 0o7777) as u16,
        nlink: u32::try_from(md.nlink()).unwrap_or(u32::MAX),
        uid: md.uid(),
        gid: md.gid(),
        rdev: u32::try_from(md.rdev()).unwrap_or(0),
        blksize: u32::try_from(md.blksize()).unwrap_or(4096),
        flags: 0,
    }
}

impl Filesystem for TestFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Errors here only say the value is 0 (rejected before mounting); the defaults then
        // stay. The kernel takes any u16 from a daemon with CAP_SYS_ADMIN, and caps others at
        // /sys/module/fuse/parameters/max_user_bgreq and max_user_congthresh
        // (fs/fuse/inode.c, process_init_limits).
        let _ = config.set_max_background(self.max_background);
        let _ = config.set_congestion_threshold((self.max_background / 4 * 3).max(1));
        // Without it, mmap(MAP_SHARED) of a file opened with FOPEN_DIRECT_IO fails (ENODEV).
        if config
            .capabilities()
            .contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP)
        {
            let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let result = self.path(parent).and_then(|p| self.stat(&p.join(name)));
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.path(ino).and_then(|p| self.stat(&p)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let result = self
            .path(ino)
            .and_then(|p| Ok(std::fs::read_link(self.source(&p))?));
        match result {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let result = self.path(ino).and_then(|path| {
            let file = File::open(self.source(&path))?;
            let len = file.metadata()?.len();
            Ok((path, file, len))
        });
        let (path, file, len) = match result {
            Ok(opened) => opened,
            Err(e) => return reply.error(e),
        };
        let direct_io = self.direct_io || self.shared.faults_need_direct_io();
        let fh = self.new_fh();
        lock(&self.files).insert(
            fh,
            OpenFile {
                file: Arc::new(file),
                path,
                len,
                direct_io,
            },
        );
        let fopen = if direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        };
        reply.opened(FileHandle(fh), fopen);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let job = match lock(&self.files).get(&fh.0) {
            Some(open) => ReadJob::new(
                Arc::clone(&open.file),
                Arc::clone(&open.path),
                open.len,
                open.direct_io,
                offset,
                size,
                reply,
            ),
            None => return reply.error(Errno::EBADF),
        };
        self.pool.submit(job);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        lock(&self.files).remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.list(ino) {
            Ok(entries) => {
                let fh = self.new_fh();
                lock(&self.dirs).insert(fh, Arc::new(entries));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match lock(&self.dirs).get(&fh.0) {
            Some(entries) => Arc::clone(entries),
            None => match self.list(ino) {
                Ok(entries) => Arc::new(entries),
                Err(e) => return reply.error(e),
            },
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, entry) in entries.iter().enumerate().skip(skip) {
            // The offset of an entry is where the next readdir resumes.
            if reply.add(INodeNo(entry.ino), i as u64 + 1, entry.kind, &entry.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.dirs).remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match statvfs(&self.root) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                u32::try_from(s.f_bsize).unwrap_or(4096),
                u32::try_from(s.f_namemax).unwrap_or(255),
                u32::try_from(s.f_frsize).unwrap_or(4096),
            ),
            Err(e) => reply.error(e.into()),
        }
    }

    // Everything that would write. The mount is read-only, so the kernel mostly answers
    // EROFS itself; these are for the requests that still arrive.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }

    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }
}

fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    let mut st = MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is NUL-terminated and outlives the call; `st` is writable memory of
    // the type statvfs fills.
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded and filled `st`; it was all zeroes before, a valid value of
    // this plain C struct, in any field it might have left alone.
    Ok(unsafe { st.assume_init() })
}
