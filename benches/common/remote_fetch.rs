//! The remote benchmark's raw transfers: every file of a checkpoint fetched over HTTP by
//! threads of their own, each with one kept-alive connection (`http_client.rs`) and one
//! buffer reused from request to request; the bytes dropped (the server's limit) or written
//! to local files (a download).

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Instant;

use crate::http_client::{Connection, Endpoint};

/// How the files are fetched.
#[derive(Debug, Clone, Copy)]
pub enum Fetch {
    /// `in_flight` ranged GETs of `piece` bytes (and buffers), pulled from one queue.
    Ranged { in_flight: usize, piece: u64 },
    /// One GET per file, `streams` files at once, each body read through a buffer of
    /// `buffer` bytes.
    PerFile { streams: usize, buffer: u64 },
}

/// What a fetch moved, and how long it took from its threads' start.
pub struct Fetched {
    pub bytes: u64,
    pub seconds: f64,
}

/// Reads every byte of `files` (names under `base`, an `http://host:port/prefix/`) and drops
/// them.
pub fn read_all(base: &str, files: &[(String, u64)], how: Fetch) -> Result<Fetched, String> {
    fetch(base, files, how, |_, _, _| Ok(()))
}

/// Reads every byte of `files` as [`read_all`] does, into fresh memory: one anonymous map
/// the size of the checkpoint (each file at its offset, plain pages, none touched before the
/// clock starts), every body copied to its place as it arrives, as a load into memory of its
/// own must land it. Only ranged GETs (`Fetch::Ranged`): each piece is one part of the map.
pub fn read_into_fresh(
    base: &str,
    files: &[(String, u64)],
    how: Fetch,
) -> Result<(Fetched, memmap2::MmapMut), String> {
    let Fetch::Ranged { piece, .. } = how else {
        return Err("fresh memory is read into by ranged GETs".into());
    };
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    let mut map = memmap2::MmapMut::map_anon(total as usize).map_err(|e| e.to_string())?;
    // One part of the map per GET (per file, its pieces in order): a body's bytes land in
    // their own, which no other thread writes.
    let mut parts: Vec<Vec<Mutex<&mut [u8]>>> = Vec::with_capacity(files.len());
    let mut rest: &mut [u8] = &mut map;
    for (_, len) in files {
        let (file, tail) = rest.split_at_mut(*len as usize);
        rest = tail;
        parts.push(file.chunks_mut(piece as usize).map(Mutex::new).collect());
    }
    let fetched = fetch(base, files, how, |i, bytes, at| {
        let (k, within) = ((at / piece) as usize, (at % piece) as usize);
        let mut part = parts[i][k].lock().unwrap_or_else(PoisonError::into_inner);
        part[within..within + bytes.len()].copy_from_slice(bytes);
        Ok(())
    })?;
    drop(parts);
    Ok((fetched, map))
}

/// Downloads `files` into `dir`: with ranged GETs, each piece written where it belongs
/// (`pwrite` into a file made at its length); one GET per file, its body written in order.
/// The files are made inside the timed part. Returns them, open, for the caller to sync.
pub fn download(
    base: &str,
    files: &[(String, u64)],
    how: Fetch,
    dir: &Path,
) -> Result<(Fetched, Vec<File>), String> {
    let made: Vec<OnceLock<Result<File, String>>> = files.iter().map(|_| OnceLock::new()).collect();
    let sized = matches!(how, Fetch::Ranged { .. });
    let fetched = fetch(base, files, how, |i, bytes, at| {
        let file = made[i]
            .get_or_init(|| {
                let path = dir.join(&files[i].0);
                let file = File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                if sized {
                    file.set_len(files[i].1)
                        .map_err(|e| format!("{}: {e}", path.display()))?;
                }
                Ok(file)
            })
            .as_ref()
            .map_err(|e| std::io::Error::other(e.clone()))?;
        file.write_all_at(bytes, at)
    })?;
    let files = made
        .into_iter()
        .filter_map(|m| m.into_inner().and_then(Result::ok))
        .collect();
    Ok((fetched, files))
}

/// Fetches every byte of `files` as `how` says; `sink(file, bytes, offset)` is given each
/// buffer's worth where it belongs in its file.
fn fetch(
    base: &str,
    files: &[(String, u64)],
    how: Fetch,
    sink: impl Fn(usize, &[u8], u64) -> std::io::Result<()> + Sync,
) -> Result<Fetched, String> {
    let endpoint = Endpoint::parse(base)?;
    let url = |i: usize| format!("{}{}", endpoint.path, files[i].0);
    // Each job a file and the range of it to GET (`None`: the whole file).
    let (threads, buffer, jobs): (usize, u64, Vec<Job>) = match how {
        Fetch::Ranged { in_flight, piece } => (
            in_flight,
            piece,
            pieces(files, piece)
                .into_iter()
                .map(|(i, r)| (i, Some(r)))
                .collect(),
        ),
        Fetch::PerFile { streams, buffer } => (
            streams,
            buffer,
            (0..files.len()).map(|i| (i, None)).collect(),
        ),
    };
    in_parallel(
        &endpoint,
        threads,
        buffer as usize,
        jobs.len(),
        |conn, buf, job| {
            let (i, range) = &jobs[job];
            let start = range.as_ref().map_or(0, |r| r.start);
            conn.get(&url(*i), range.clone(), buf, |b, at| {
                sink(*i, b, start + at)
            })
            .map_err(|e| format!("{}: {e}", url(*i)))
        },
    )
}

/// One GET: a file, and the range of it (`None`: the whole file).
type Job = (usize, Option<Range<u64>>);

/// Every file cut in pieces of `piece` bytes: (file, range).
fn pieces(files: &[(String, u64)], piece: u64) -> Vec<(usize, Range<u64>)> {
    let mut out = Vec::new();
    for (i, (_, len)) in files.iter().enumerate() {
        let mut at = 0;
        while at < *len {
            let end = (at + piece).min(*len);
            out.push((i, at..end));
            at = end;
        }
    }
    out
}

/// A buffer of `len` bytes with every page written once, so that its first use is not
/// counted as the page faults of fresh memory.
fn buffer(len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    for page in buf.chunks_mut(4096) {
        page[0] = 1;
    }
    buf
}

/// `n` threads, each with a connection to `endpoint` and a buffer of `buf_len` bytes
/// (made before the clock starts), taking jobs `0..jobs` from one queue:
/// `work(conn, buf, job)` returns the bytes it moved.
fn in_parallel(
    endpoint: &Endpoint,
    n: usize,
    buf_len: usize,
    jobs: usize,
    work: impl Fn(&mut Connection, &mut [u8], usize) -> Result<u64, String> + Sync,
) -> Result<Fetched, String> {
    let mut buffers: Vec<Vec<u8>> = (0..n.clamp(1, jobs.max(1)))
        .map(|_| buffer(buf_len))
        .collect();
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let moved = AtomicU64::new(0);
    let first_error = Mutex::new(None);
    std::thread::scope(|scope| {
        for buf in &mut buffers {
            let (next, moved, work, first_error) = (&next, &moved, &work, &first_error);
            scope.spawn(move || {
                let mut conn = Connection::new(&endpoint.host);
                loop {
                    let job = next.fetch_add(1, Ordering::Relaxed);
                    if job >= jobs {
                        return;
                    }
                    match work(&mut conn, buf, job) {
                        Ok(n) => {
                            moved.fetch_add(n, Ordering::Relaxed);
                        }
                        Err(e) => {
                            // The others stop at their next job.
                            next.store(jobs, Ordering::Relaxed);
                            let mut first =
                                first_error.lock().unwrap_or_else(PoisonError::into_inner);
                            first.get_or_insert(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    if let Some(e) = first_error
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
    {
        return Err(e);
    }
    Ok(Fetched {
        bytes: moved.into_inner(),
        seconds,
    })
}
