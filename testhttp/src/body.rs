//! Writing a body: chunk by chunk on the shared link, or byte by byte under
//! [`Options::drip`](crate::Options::drip), and past an object's end with filler under
//! [`Options::claimed_len`](crate::Options::claimed_len).

use std::io::{self, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::Shared;
use crate::link::Link;
use crate::objects::Object;
use crate::serve::{POLL, WRITE_TIMEOUT};

/// Bodies are sent in chunks of this size, each booked on the link.
const CHUNK: usize = 64 * 1024;

/// Sends `len` bytes from `start` of `object` followed by zeros without end (the filler a
/// claimed length past the object's end is met with), chunk by chunk, each after its time
/// on the shared link; one byte at a time, a pause between bytes, under `Options::drip`.
///
/// Never holds more than a chunk: a claim of a terabyte costs 64 KiB of memory and ends at
/// the client's hang-up, the write timeout, or the server's stop. Writes wait [`POLL`] at a
/// time (the socket's timeout, put back after), so that a stop is seen within a poll even
/// while a client that stops reading holds a write up.
pub(crate) fn send_body(
    shared: &Shared,
    stream: &mut TcpStream,
    object: (&str, &Object),
    start: u64,
    len: u64,
) -> io::Result<()> {
    stream.set_write_timeout(Some(POLL))?;
    let sent = send(shared, stream, object, start, len);
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    sent
}

/// [`send_body`]'s work, under the short write timeout.
fn send(
    shared: &Shared,
    stream: &mut TcpStream,
    (path, object): (&str, &Object),
    start: u64,
    len: u64,
) -> io::Result<()> {
    let mut buf = vec![0; len.min(CHUNK as u64) as usize];
    let mut sent = 0;
    while sent < len {
        let n = (len - sent).min(CHUNK as u64) as usize;
        fill(object, &mut buf[..n], start + sent)?;
        lie(shared, path, &mut buf[..n], start + sent);
        match shared.options.drip {
            Some(pause) => drip(shared, stream, path, &buf[..n], sent == 0, pause)?,
            None => {
                book(shared, n as u64);
                // Counted before the write, so that a client that has the bytes sees them
                // counted; a client that hangs up leaves this chunk counted in both
                // counters, the rest in neither.
                shared.count_bytes(path, n as u64);
                write_all(shared, stream, &buf[..n])?;
            }
        }
        sent += n as u64;
        if shared.stopping.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::Interrupted.into());
        }
    }
    Ok(())
}

/// Reads the bytes of `object` at `offset` into `buf`, zeros where it has none.
fn fill(object: &Object, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let real = object.len.saturating_sub(offset).min(buf.len() as u64) as usize;
    if real > 0 {
        object.body.read_exact_at(&mut buf[..real], offset)?;
    }
    // The buffer still holds the previous chunk: the filler is written, not assumed.
    buf[real..].fill(0);
    Ok(())
}

/// Damages the bytes of `path` at `offset` that [`Options::lie`](crate::Options::lie) says
/// to.
fn lie(shared: &Shared, path: &str, buf: &mut [u8], offset: u64) {
    let Some(lie) = shared.options.lie.as_ref().filter(|l| l.path == path) else {
        return;
    };
    if shared.honest.load(Ordering::Relaxed) {
        return;
    }
    let skip = usize::try_from(lie.from.saturating_sub(offset)).unwrap_or(usize::MAX);
    for byte in buf.iter_mut().skip(skip) {
        *byte ^= 0x5A;
    }
}

/// Writes `bytes` one at a time, `pause` before each but the body's first, each byte booked
/// on the link and counted before its write, as a chunk is.
fn drip(
    shared: &Shared,
    stream: &mut TcpStream,
    path: &str,
    bytes: &[u8],
    body_start: bool,
    pause: Duration,
) -> io::Result<()> {
    for (i, byte) in bytes.iter().enumerate() {
        if (i > 0 || !body_start) && !sleep_unless_stopping(shared, pause) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        book(shared, 1);
        shared.count_bytes(path, 1);
        write_all(shared, stream, std::slice::from_ref(byte))?;
    }
    Ok(())
}

/// Writes all of `bytes` through a socket whose writes time out after [`POLL`]: gives up
/// when the server stops, or after [`WRITE_TIMEOUT`] without a byte taken (a client that
/// stopped reading), as `write_all` under that timeout would.
fn write_all(shared: &Shared, stream: &mut TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    let mut progress = Instant::now();
    while !bytes.is_empty() {
        if shared.stopping.load(Ordering::Relaxed) {
            return Err(io::ErrorKind::Interrupted.into());
        }
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                progress = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) && progress.elapsed() < WRITE_TIMEOUT => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits until `bytes` have crossed the shared link, if there is one.
fn book(shared: &Shared, bytes: u64) {
    if let Some(link) = &shared.link {
        let leaves_at = lock(link).reserve(Instant::now(), bytes);
        sleep_until(leaves_at);
    }
}

/// Sleeps `pause` in slices of at most [`POLL`], so that a long drip still ends promptly
/// when the server stops; false when it does.
fn sleep_unless_stopping(shared: &Shared, pause: Duration) -> bool {
    let until = Instant::now() + pause;
    loop {
        if shared.stopping.load(Ordering::Relaxed) {
            return false;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        thread::sleep(left.min(POLL));
    }
}

fn lock(link: &Mutex<Link>) -> std::sync::MutexGuard<'_, Link> {
    link.lock().unwrap_or_else(PoisonError::into_inner)
}

fn sleep_until(at: Instant) {
    let now = Instant::now();
    if at > now {
        thread::sleep(at - now);
    }
}
