//! The filesystem: a read-only passthrough of a source directory, with reads served by a
//! bounded pool of worker threads where latency, short reads and `EIO` are injected.

use std::collections::{HashMap, VecDeque};
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::{Options, Shared};

/// How long the kernel may cache names and attributes.
const TTL: Duration = Duration::from_secs(1);
/// Read workers when `max_concurrent_reads` is `None`.
const DEFAULT_READ_WORKERS: usize = 64;
/// Asynchronous requests (readahead) the kernel keeps in flight; fuser's default is 16.
const MAX_BACKGROUND: u16 = 64;
/// Read workers only copy between a file and a buffer.
const WORKER_STACK: usize = 256 * 1024;

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
        let workers = options
            .max_concurrent_reads
            .unwrap_or(DEFAULT_READ_WORKERS)
            .max(1);
        Ok(Self {
            root: root.to_owned(),
            direct_io: options.direct_io,
            pool: Arc::new(Pool::new(workers, options.latency, Arc::clone(&shared))),
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
        // Errors here only say the kernel wants a different value; the defaults then stay.
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND / 4 * 3);
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
            Ok((path, file))
        });
        let (path, file) = match result {
            Ok(opened) => opened,
            Err(e) => return reply.error(e),
        };
        let direct_io = self.direct_io || self.shared.short_reads.load(Ordering::Relaxed);
        let fh = self.new_fh();
        lock(&self.files).insert(
            fh,
            OpenFile {
                file: Arc::new(file),
                path,
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
            Some(open) => ReadJob {
                file: Arc::clone(&open.file),
                path: Arc::clone(&open.path),
                direct_io: open.direct_io,
                offset,
                size,
                reply,
            },
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

/// One `READ` request on its way to a worker.
struct ReadJob {
    file: Arc<File>,
    path: Arc<Path>,
    direct_io: bool,
    offset: u64,
    size: u32,
    reply: ReplyData,
}

/// Worker threads serving `READ`s, at most `limit` at once, spawned as the load needs them.
/// Dropping a job (a worker panic, a closed pool) answers `EIO`, through `ReplyData`'s drop.
struct Pool {
    state: Mutex<PoolState>,
    wake: Condvar,
    limit: usize,
    latency: Option<Duration>,
    shared: Arc<Shared>,
}

struct PoolState {
    queue: VecDeque<ReadJob>,
    /// Workers alive.
    workers: usize,
    /// Workers waiting for a job.
    idle: usize,
    closed: bool,
}

impl Pool {
    fn new(limit: usize, latency: Option<Duration>, shared: Arc<Shared>) -> Self {
        Self {
            state: Mutex::new(PoolState {
                queue: VecDeque::new(),
                workers: 0,
                idle: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            limit,
            latency,
            shared,
        }
    }

    fn submit(self: &Arc<Self>, job: ReadJob) {
        let mut state = lock(&self.state);
        state.queue.push_back(job);
        if state.queue.len() > state.idle && state.workers < self.limit {
            let pool = Arc::clone(self);
            let spawned = thread::Builder::new()
                .name("safeload-testfs-read".to_owned())
                .stack_size(WORKER_STACK)
                .spawn(move || pool.work());
            match spawned {
                Ok(_) => state.workers += 1,
                Err(e) => {
                    eprintln!("safeload-testfs: cannot start a read worker: {e}");
                    if state.workers == 0 {
                        // Nobody would ever serve them: answer EIO.
                        state.queue.clear();
                    }
                }
            }
        } else {
            self.wake.notify_one();
        }
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.wake.notify_all();
    }

    fn work(&self) {
        let mut buf = Vec::new();
        loop {
            let job = {
                let mut state = lock(&self.state);
                loop {
                    if let Some(job) = state.queue.pop_front() {
                        break job;
                    }
                    if state.closed {
                        state.workers -= 1;
                        return;
                    }
                    state.idle += 1;
                    state = self
                        .wake
                        .wait(state)
                        .unwrap_or_else(PoisonError::into_inner);
                    state.idle -= 1;
                }
            };
            self.serve(job, &mut buf);
        }
    }

    fn serve(&self, job: ReadJob, buf: &mut Vec<u8>) {
        let s = &*self.shared;
        s.read_requests.fetch_add(1, Ordering::Relaxed);
        s.max_request_bytes
            .fetch_max(u64::from(job.size), Ordering::Relaxed);
        let in_flight = s.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        s.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);

        if let Some(latency) = self.latency {
            thread::sleep(latency);
        }
        let result = if s.fails(&job.path, job.offset, u64::from(job.size)) {
            Err(Errno::EIO)
        } else {
            let mut want = job.size as usize;
            if job.direct_io && s.short_reads.load(Ordering::Relaxed) {
                want = (want / 2).max(1);
            }
            if buf.len() < want {
                buf.resize(want, 0);
            }
            read_full(&job.file, &mut buf[..want], job.offset).map_err(Errno::from)
        };

        // Served: out of flight before the answer lets the kernel send the next request.
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
        match result {
            Ok(n) => {
                s.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                job.reply.data(&buf[..n]);
            }
            Err(e) => job.reply.error(e),
        }
    }
}

/// Positional read until `buf` is full or the file ends; the number of bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}
