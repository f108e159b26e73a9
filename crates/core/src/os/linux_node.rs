//! The Linux calls of the node copy (`src/node/`): a sealed memory file (`memfd_create(2)`), a shared map written by positional reads straight into it, and the Unix socket that hands it to the other ranks (`SCM_RIGHTS`, `SO_PEERCRED`).

use std::fs::File;
use std::io;
use std::path::Path;

/// A new node copy of `len` bytes: a memory file (`memfd_create(2)`), which
/// no filesystem's size limit applies to (a container's 64 MiB `/dev/shm`),
/// sealed against shrinking and growing (`F_SEAL_SHRINK`, `F_SEAL_GROW`,
/// `F_SEAL_SEAL`): no holder can truncate it under another's map.
pub fn memfd_copy(name: &str, len: u64) -> io::Result<File> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let file = File::from(fd);
    file.set_len(len)?;
    rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(file)
}

/// Whether `file` is a sealed node copy of `len` bytes, as [`memfd_copy`]
/// makes them: a file received from another process is mapped only then.
pub fn is_sealed_copy(file: &File, len: u64) -> bool {
    use rustix::fs::SealFlags;
    let sealed = rustix::fs::fcntl_get_seals(file)
        .is_ok_and(|s| s.contains(SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL));
    sealed && file.metadata().is_ok_and(|m| m.is_file() && m.len() == len)
}

/// A node copy being filled: mapped shared and writable, written by
/// positional reads straight into it, never read through this map.
pub(crate) struct SharedBytes {
    map: memmap2::MmapRaw,
    /// The ranges being written now, kept apart.
    busy: std::sync::Mutex<Vec<std::ops::Range<usize>>>,
}

impl SharedBytes {
    /// Maps all of `file` shared and writable; with `huge`, advises huge
    /// pages (`MADV_HUGEPAGE`, granted where the host's `shmem_enabled`
    /// allows) or base pages only, a hint.
    pub(crate) fn map(file: &File, huge: Option<bool>) -> io::Result<SharedBytes> {
        if file.metadata()?.len() == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let map = memmap2::MmapRaw::map_raw(file)?;
        if let Some(huge) = huge {
            let advice = if huge {
                memmap2::Advice::HugePage
            } else {
                memmap2::Advice::NoHugePage
            };
            let _ = map.advise(advice);
        }
        Ok(SharedBytes {
            map,
            busy: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The addresses the map spans in this process.
    pub(crate) fn addresses(&self) -> std::ops::Range<usize> {
        let start = self.map.as_ptr() as usize;
        start..start + self.map.len()
    }

    /// [`write_with`](SharedBytes::write_with) for a read from offset
    /// `offset` of a file.
    pub(crate) fn read_from(
        &self,
        at: usize,
        len: usize,
        offset: u64,
        read: impl FnOnce(&mut [u8]) -> Result<(), (u64, io::Error)>,
    ) -> Result<(), (u64, io::Error)> {
        self.write_with(at, len, read)
            .map_err(|e| (offset, e))
            .and_then(|r| r)
    }

    /// Runs `write` on the `len` bytes of the map at `at`; fails without
    /// running it where the range is outside the map or overlaps a write of
    /// this process in progress.
    pub(crate) fn write_with<R>(
        &self,
        at: usize,
        len: usize,
        write: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        let range = at..at.saturating_add(len);
        let refused = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_string());
        if range.end > self.map.len() || at.checked_add(len).is_none() {
            return Err(refused("outside the node copy"));
        }
        {
            let mut busy = self.busy.lock().map_err(|_| refused("poisoned"))?;
            if busy
                .iter()
                .any(|r| r.start < range.end && range.start < r.end)
            {
                return Err(refused("the bytes are being written by another read"));
            }
            busy.push(range.clone());
        }
        // SAFETY: `[at, at + len)` lies within the live map (checked above),
        // and no other slice of this process covers it while the call runs
        // (`busy`; nothing reads through this map). Another process may
        // write the same bytes meanwhile, with the same content: shared
        // memory is outside this process's aliasing, as `SharedWords`.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(at), len) };
        let result = write(dst);
        if let Ok(mut busy) = self.busy.lock() {
            busy.retain(|r| *r != range);
        }
        Ok(result)
    }
}

/// What a name in a directory is, by `lstat(2)`: how the node copy's
/// registry tells a holder's socket from what another user put there.
pub(crate) fn name_kind(meta: &std::fs::Metadata) -> crate::os::NameKind {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_socket() {
        crate::os::NameKind::Socket
    } else if t.is_file() {
        crate::os::NameKind::File
    } else if t.is_fifo() {
        crate::os::NameKind::Fifo
    } else if t.is_symlink() {
        crate::os::NameKind::Symlink
    } else if t.is_dir() {
        crate::os::NameKind::Directory
    } else {
        crate::os::NameKind::Other
    }
}

/// A Unix socket listening for the other local ranks of a job, to hand them
/// a node copy; its thread sleeps in `poll(2)` until a peer connects or
/// [`StopListening::stop`] is called, with no periodic wake-ups.
pub struct FdListener {
    listener: std::os::unix::net::UnixListener,
    /// An `eventfd(2)` made readable by [`StopListening::stop`].
    stop: std::sync::Arc<std::os::fd::OwnedFd>,
}

/// Wakes an [`FdListener`]'s [`FdListener::next`] for good.
pub struct StopListening(std::sync::Arc<std::os::fd::OwnedFd>);

impl StopListening {
    /// From now on [`FdListener::next`] answers `None`, at once.
    pub fn stop(&self) {
        // An eventfd's counter only grows (to u64::MAX - 1): a write never
        // blocks before that (eventfd(2)).
        let _ = rustix::io::write(&*self.0, &1u64.to_ne_bytes());
    }
}

impl FdListener {
    /// Binds a socket at `path` (refused where something is there), mode
    /// `0600`. A peer that connects in the instant before the mode is set is
    /// still checked by its credentials ([`FdStream::peer`]).
    pub fn bind(path: &Path) -> io::Result<FdListener> {
        use rustix::event::EventfdFlags;
        use std::os::unix::fs::PermissionsExt;
        let stop = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        let listener = std::os::unix::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(FdListener {
            listener,
            stop: std::sync::Arc::new(stop),
        })
    }

    /// What stops [`FdListener::next`] from another thread.
    pub fn stopper(&self) -> StopListening {
        StopListening(std::sync::Arc::clone(&self.stop))
    }

    /// The next connection, once one arrives; `None` once stopped.
    pub fn next(&self) -> io::Result<Option<FdStream>> {
        use rustix::event::{PollFd, PollFlags};
        loop {
            let (stopped, _) = {
                let mut fds = [
                    PollFd::new(&*self.stop, PollFlags::IN),
                    PollFd::new(&self.listener, PollFlags::IN),
                ];
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(e.into()),
                }
                (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
            };
            if stopped {
                return Ok(None);
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false)?;
                    return Ok(Some(FdStream(stream)));
                }
                // Woken by a signal, or the peer left before the accept.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// One end of a connection of [`FdListener`]: messages with files attached
/// (`SCM_RIGHTS`, see unix(7)) and the peer's credentials.
pub struct FdStream(std::os::unix::net::UnixStream);

impl FdStream {
    /// Connects to the socket at `path`, waiting at most `timeout` for room
    /// in its backlog; every later send and receive fails after `timeout`
    /// too, so a stopped peer cannot hang this process.
    ///
    /// The timeout is set before `connect(2)`: a Unix stream connect to a
    /// full backlog sleeps for at most the send timeout (`SO_SNDTIMEO`,
    /// `unix_stream_connect`), then fails with `EAGAIN`; a non-blocking one
    /// answers `EAGAIN` at once, with nothing to poll for.
    pub fn connect(path: &Path, timeout: std::time::Duration) -> io::Result<FdStream> {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let stream = FdStream(std::os::unix::net::UnixStream::from(fd));
        stream.set_timeout(timeout)?;
        let addr = SocketAddrUnix::new(path)?;
        match rustix::net::connect(&stream.0, &addr) {
            Ok(()) => Ok(stream),
            Err(rustix::io::Errno::AGAIN) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no room in its backlog within {timeout:?}"),
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// Sends and receives fail after `timeout`.
    pub fn set_timeout(&self, timeout: std::time::Duration) -> io::Result<()> {
        let timeout = timeout.max(std::time::Duration::from_millis(1));
        self.0.set_read_timeout(Some(timeout))?;
        self.0.set_write_timeout(Some(timeout))
    }

    /// The pid and uid of the process at the other end, as the kernel
    /// recorded them when the connection was made (`SO_PEERCRED`).
    pub fn peer(&self) -> io::Result<(u32, u32)> {
        let cred = rustix::net::sockopt::socket_peercred(&self.0)?;
        let pid = u32::try_from(cred.pid.as_raw_nonzero().get()).unwrap_or(0);
        Ok((pid, cred.uid.as_raw()))
    }

    /// Sends `bytes` with `files` attached (at most 253, the kernel's
    /// `SCM_MAX_FD`).
    pub fn send(&self, bytes: &[u8], files: &[&File]) -> io::Result<()> {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        use std::os::fd::{AsFd, BorrowedFd};
        let fds: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let mut space =
            vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let sent = rustix::net::sendmsg(
            &self.0,
            &[io::IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        )?;
        if sent != bytes.len() {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        Ok(())
    }

    /// Receives one message into `buf`, and the files attached to it (at
    /// most `max_files`; more are closed). Returns the bytes received.
    pub fn recv(&self, buf: &mut [u8], max_files: usize) -> io::Result<(usize, Vec<File>)> {
        use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
        let mut space =
            vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_files.max(1)))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = rustix::net::recvmsg(
            &self.0,
            &mut [io::IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        let mut files = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = message {
                files.extend(fds.map(File::from));
            }
        }
        files.truncate(max_files);
        Ok((msg.bytes, files))
    }
}
