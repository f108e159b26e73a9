//! A node copy handed from rank to rank: the offer (which files, their lengths, whether the copy is complete) sent with the memory files attached over a Unix socket (`SCM_RIGHTS`), both ends checked to be this user's processes (`SO_PEERCRED`).
//!
//! Every holder hands its copy out from a [`Server`] thread (asleep in
//! `poll(2)`) until its last tensor goes, so a late rank finds it after its
//! maker is gone. Every wait on a peer (connect, receive, send) is bounded by
//! [`PATIENCE`].

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::os::{self, FdListener, FdStream, StopListening};

/// The most memory files one offer carries: the kernel's `SCM_MAX_FD` is
/// 253 per message, and one message is one offer.
pub(crate) const MAX_FILES: usize = 250;

// Version 2 adds the maker: ranks of another version refuse each other's offers (and each
// then makes its own copy), never misread them.
const MAGIC: u64 = u64::from_le_bytes(*b"SLNODE02");

/// How long a rank waits on another for an offer: a stopped rank must not
/// hold up the others for long (it is then taken as not answering).
pub(crate) const PATIENCE: Duration = Duration::from_secs(2);

/// A serving thread's rest after an error that may last (out of
/// descriptors, say), so that it does not spin.
const BACK_OFF: Duration = Duration::from_millis(100);

/// What a copy holds: per file of the copy, its index among the load's
/// files and its length; and who made it, for the reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    pub key: u64,
    pub complete: bool,
    pub maker: Maker,
    pub files: Vec<(u64, u64)>,
}

/// The process that made a copy, for the reports: its pid and local rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Maker {
    pub pid: u32,
    pub rank: u32,
}

impl Offer {
    fn encode(&self) -> Vec<u8> {
        let mut words = vec![
            MAGIC,
            self.key,
            u64::from(self.complete),
            u64::from(self.maker.pid),
            u64::from(self.maker.rank),
            self.files.len() as u64,
        ];
        for &(index, len) in &self.files {
            words.extend([index, len]);
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The offer in `bytes`, if it is one, of at most [`MAX_FILES`] files.
    fn decode(bytes: &[u8]) -> Option<Offer> {
        let mut words = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
        if bytes.len() % 8 != 0 || words.next()? != MAGIC {
            return None;
        }
        let key = words.next()?;
        let complete = match words.next()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        let maker = Maker {
            pid: u32::try_from(words.next()?).ok()?,
            rank: u32::try_from(words.next()?).ok()?,
        };
        let n = usize::try_from(words.next()?).ok()?;
        if n > MAX_FILES {
            return None;
        }
        let files = (0..n)
            .map(|_| Some((words.next()?, words.next()?)))
            .collect::<Option<Vec<_>>>()?;
        words.next().is_none().then_some(Offer {
            key,
            complete,
            maker,
            files,
        })
    }
}

/// Why an offer was not taken.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The socket's process is another user's.
    OtherUser { uid: u32, pid: u32 },
    /// It did not answer, or answered something else than an offer of
    /// this copy.
    Failed(String),
}

/// Takes the offer at `path` from this user's process `pid`, its files sealed
/// memfds of the lengths offered, within [`PATIENCE`] in all.
pub(crate) fn take(path: &Path, pid: u32, key: u64) -> Result<(Offer, Vec<File>), Refused> {
    let failed = |what: &str, e: io::Error| Refused::Failed(format!("{what}: {e}"));
    let deadline = Instant::now() + PATIENCE;
    let stream = FdStream::connect(path, PATIENCE).map_err(|e| failed("connecting", e))?;
    let (peer_pid, peer_uid) = stream.peer().map_err(|e| failed("credentials", e))?;
    if Some(peer_uid) != os::effective_uid() {
        return Err(Refused::OtherUser {
            uid: peer_uid,
            pid: peer_pid,
        });
    }
    if peer_pid != pid {
        return Err(Refused::Failed(format!(
            "pid {peer_pid} answered for pid {pid}"
        )));
    }
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_timeout(left)
        .map_err(|e| failed("receiving", e))?;
    let mut buf = vec![0u8; 48 + 16 * MAX_FILES + 8];
    let (n, files) = stream
        .recv(&mut buf, MAX_FILES)
        .map_err(|e| failed("receiving", e))?;
    let offer = buf
        .get(..n)
        .and_then(Offer::decode)
        .filter(|o| o.key == key && o.files.len() == files.len())
        .ok_or_else(|| Refused::Failed("not an offer of this copy".into()))?;
    for (file, &(_, len)) in files.iter().zip(&offer.files) {
        if !os::is_sealed_copy(file, len) {
            return Err(Refused::Failed(
                "a file offered is not a sealed copy of its length".into(),
            ));
        }
    }
    Ok((offer, files))
}

/// A rank's copy handed out from a thread of its own until dropped.
pub(crate) struct Server {
    path: PathBuf,
    complete: Arc<AtomicBool>,
    stop: StopListening,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `path` and hands out `files` as `offer` (its `complete` as
    /// [`Server::complete`] says) to every process of this user that asks.
    pub(crate) fn start(path: &Path, offer: Offer, files: Vec<File>) -> io::Result<Server> {
        let listener = FdListener::bind(path)?;
        let stop = listener.stopper();
        let complete = Arc::new(AtomicBool::new(offer.complete));
        let theirs = Arc::clone(&complete);
        let thread = std::thread::Builder::new()
            .name("safeload-node-copy".into())
            .spawn(move || serve(&listener, offer, &files, &theirs));
        let thread = match thread {
            Ok(thread) => thread,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        Ok(Server {
            path: path.to_path_buf(),
            complete,
            stop,
            thread: Some(thread),
        })
    }

    /// From now on the copy is offered as complete: a rank that joins maps
    /// it at once.
    pub(crate) fn complete(&self) {
        self.complete.store(true, Ordering::Release);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.stop();
        let _ = std::fs::remove_file(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Hands out the copy to each peer of this user that connects, until
/// stopped; asleep in between.
fn serve(listener: &FdListener, mut offer: Offer, files: &[File], complete: &AtomicBool) {
    let files: Vec<&File> = files.iter().collect();
    loop {
        let stream = match listener.next() {
            Ok(Some(stream)) => stream,
            Ok(None) => return,
            Err(_) => {
                std::thread::sleep(BACK_OFF);
                continue;
            }
        };
        // Another user's process gets nothing: this job's bytes are not
        // theirs to read.
        let ours = stream
            .peer()
            .is_ok_and(|(_, uid)| Some(uid) == os::effective_uid());
        if !ours || stream.set_timeout(PATIENCE).is_err() {
            continue;
        }
        offer.complete = complete.load(Ordering::Acquire);
        let _ = stream.send(&offer.encode(), &files);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_round_trip_and_garbage_is_refused() {
        let offer = Offer {
            key: 7,
            complete: true,
            maker: Maker { pid: 1234, rank: 2 },
            files: vec![(0, 100), (3, 4096)],
        };
        let bytes = offer.encode();
        assert_eq!(Offer::decode(&bytes), Some(offer));
        assert_eq!(Offer::decode(&bytes[..bytes.len() - 8]), None, "cut");
        assert_eq!(Offer::decode(&bytes[1..]), None);
        let mut bad = bytes.clone();
        bad[16] = 2;
        assert_eq!(Offer::decode(&bad), None, "complete is 0 or 1");
        let mut many = bytes.clone();
        many[40..48].copy_from_slice(&(MAX_FILES as u64 + 1).to_le_bytes());
        assert_eq!(Offer::decode(&many), None, "too many files");
        let mut pid = bytes;
        pid[24..32].copy_from_slice(&(u64::from(u32::MAX) + 1).to_le_bytes());
        assert_eq!(Offer::decode(&pid), None, "a pid is 32 bits");
    }

    // Sockets and memory files need the Linux OS layer.
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn a_copy_is_handed_over_sealed_and_served_until_dropped() {
        use std::io::{Read, Seek, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let mut copy = os::memfd_copy("t", 5).unwrap();
        copy.write_all(b"hello").unwrap();
        assert!(copy.set_len(3).is_err(), "sealed against shrinking");
        let offer = Offer {
            key: 9,
            complete: false,
            maker: Maker {
                pid: std::process::id(),
                rank: 0,
            },
            files: vec![(2, 5)],
        };
        let server = Server::start(&path, offer.clone(), vec![copy]).unwrap();
        let me = std::process::id();
        let (got, files) = take(&path, me, 9).ok().unwrap();
        assert_eq!(got, offer);
        let mut text = String::new();
        let mut file = &files[0];
        file.rewind().unwrap();
        file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello", "the same memory");
        server.complete();
        assert!(take(&path, me, 9).ok().unwrap().0.complete);
        assert!(matches!(take(&path, me, 8), Err(Refused::Failed(_))), "key");
        assert!(
            matches!(take(&path, me + 1, 9), Err(Refused::Failed(_))),
            "pid"
        );
        drop(server);
        assert!(!path.exists(), "the socket goes with the server");
        assert!(matches!(take(&path, me, 9), Err(Refused::Failed(_))));
    }

    // Sockets need the Linux OS layer.
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn a_listener_that_never_answers_costs_at_most_the_patience() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
        let dir = tempfile::tempdir().unwrap();
        let socket = || rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
        let me = std::process::id();
        // A backlog of 0 holds one connection: with it taken, a blocking
        // connect(2) would wait for as long as the listener lives.
        let full = dir.path().join("full.sock");
        let listener = socket();
        rustix::net::bind(&listener, &SocketAddrUnix::new(&full).unwrap()).unwrap();
        rustix::net::listen(&listener, 0).unwrap();
        let queued = socket();
        rustix::net::connect(&queued, &SocketAddrUnix::new(&full).unwrap()).unwrap();
        // Room in its backlog, never an answer.
        let silent = dir.path().join("silent.sock");
        let _silent = std::os::unix::net::UnixListener::bind(&silent).unwrap();
        for (path, what) in [(&full, "connecting"), (&silent, "receiving")] {
            let started = std::time::Instant::now();
            let refused = take(path, me, 1);
            let took = started.elapsed();
            assert!(
                matches!(&refused, Err(Refused::Failed(why)) if why.starts_with(what)),
                "{path:?}: {refused:?}"
            );
            // The bound is the patience; the slack is for a machine busy with
            // the binary's other tests (1 s was exceeded once under CI-like load).
            // What the test guards against is a wait as long as the listener lives.
            assert!(
                took >= PATIENCE && took < PATIENCE + Duration::from_secs(3),
                "{path:?}: {took:?}"
            );
        }
    }
}
