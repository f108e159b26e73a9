//! `cargo bench --features remote --bench cache_write`: where a fetched file's bytes land when
//! the load also writes them to the hub cache (issue 34), two designs against the load that
//! writes nothing, with the network taken away: each arm copies the same bytes (a 16 MiB
//! buffer standing for the socket's) piece by piece into its destination on `--threads`
//! threads, as the read engine's readers do, and ends when the file would be published.
//!
//! - `buffer`: an anonymous map (huge pages advised), as a buffered load's destination; no
//!   cache. The baseline.
//! - `buffer-tee` (what ships, `src/cache/write.rs`): the same, and each piece written with
//!   `pwrite` to a temporary file (space reserved with `fallocate`) by the thread that
//!   landed it, hashed (SHA-256) in file order by whichever thread closes a gap (a piece
//!   from memory where it is the one just landed, else read back from the file), the file
//!   renamed once hashed.
//! - `shared-map`: the temporary file itself, reserved with `fallocate` and mapped shared, is
//!   the destination: each piece lands once, in the page cache; hashed in order from the map
//!   as gaps close, renamed once hashed (tensors would be views of the published file).
//! - `shared-map-populated`: the same, each piece's pages faulted in first with
//!   `MADV_POPULATE_WRITE` (one call per piece, not a fault per 4 KiB page).
//!
//! Each arm runs in a process of its own, the arms in a shuffled order each round; the
//! parent syncs the directory after each arm (the writeback's seconds are quoted: the
//! kernel's, after the arm) and removes the file. Figures: seconds, the process's CPU
//! seconds, `Dirty:` of `/proc/meminfo` when the arm ended, peak RSS.
//!
//! ```text
//! cargo bench --features remote --bench cache_write -- [--size-gib 2] [--threads 16]
//!     [--piece-mib 16] [--rounds 5] [--dir bench-data]
//! ```

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use sha2::{Digest, Sha256};

mod common;

use common::child::{self, Child, Job};
use common::stats::{Spread, median};
use common::{args, proc};

const ARMS: [&str; 4] = ["buffer", "buffer-tee", "shared-map", "shared-map-populated"];

#[derive(Parser)]
#[command(name = "cache_write")]
struct Options {
    /// The file's size, GiB.
    #[arg(long, default_value_t = 2.0)]
    size_gib: f64,
    /// Threads landing pieces (the read engine's readers).
    #[arg(long, default_value_t = 16)]
    threads: usize,
    /// The size of one piece (one read), MiB.
    #[arg(long, default_value_t = 16)]
    piece_mib: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Where the files are written (the disk a hub cache would be on).
    #[arg(long, default_value = "bench-data")]
    dir: PathBuf,
}

/// One run: its arm, round, figures, and the seconds the sync after it took.
type Run = (String, usize, Figures, f64);

/// What a child prints.
#[derive(Clone, Default, serde::Serialize, serde::Deserialize)]
struct Figures {
    seconds: f64,
    cpu_seconds: f64,
    dirty_mib: f64,
    maxrss_kib: u64,
    digest: String,
    error: Option<String>,
}

fn main() {
    if let Some(job) = Job::from_env() {
        let figures = run_child(&job).unwrap_or_else(|e| Figures {
            error: Some(e),
            ..Figures::default()
        });
        child::report(&figures);
        return;
    }
    let o: Options = args::parse();
    if let Err(e) = parent(&o) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn parent(o: &Options) -> Result<(), String> {
    std::fs::create_dir_all(&o.dir).map_err(|e| e.to_string())?;
    let len = (o.size_gib * (1u64 << 30) as f64) as u64;
    eprintln!(
        "{} round(s), {:.2} GiB in {} MiB pieces on {} threads; {}",
        o.rounds,
        len as f64 / (1u64 << 30) as f64,
        o.piece_mib,
        o.threads,
        proc::machine()
    );
    let mut runs: Vec<Run> = Vec::new();
    for round in 0..o.rounds {
        for a in common::shuffled(ARMS.len(), round) {
            let arm = ARMS[a];
            let dir = tempfile::Builder::new()
                .prefix("cache-write-")
                .tempdir_in(&o.dir)
                .map_err(|e| e.to_string())?;
            let out = Child::new(arm, dir.path())
                .arg(len.to_string())
                .arg(o.threads.to_string())
                .arg(o.piece_mib.to_string())
                .timeout(Duration::from_secs(600))
                .run::<Figures>()?;
            let f = out.figures;
            let start = Instant::now();
            sync(dir.path());
            let synced = start.elapsed().as_secs_f64();
            drop(dir);
            eprintln!(
                "  round {round} {arm:<22} {:>7.3} s  cpu {:>6.2} s  dirty {:>6.0} MiB  then synced in {synced:.2} s  rss {} MiB{}",
                f.seconds,
                f.cpu_seconds,
                f.dirty_mib,
                f.maxrss_kib >> 10,
                f.error
                    .as_deref()
                    .map(|e| format!("  ERROR {e}"))
                    .unwrap_or_default()
            );
            runs.push((arm.to_owned(), round, f, synced));
        }
    }
    let digests: Vec<&str> = runs
        .iter()
        .map(|r| r.2.digest.as_str())
        .filter(|d| !d.is_empty())
        .collect();
    if digests.windows(2).any(|w| w[0] != w[1]) {
        return Err("the arms hashed different bytes".into());
    }
    println!(
        "{} rounds, arms interleaved, each its own process; medians (min-max); {}\n",
        o.rounds,
        proc::machine()
    );
    println!(
        "| arm | seconds | x buffer's speed | CPU s | Dirty MiB at the end | sync after s | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|");
    for arm in ARMS {
        let mine: Vec<&Run> = runs
            .iter()
            .filter(|r| r.0 == arm && r.2.error.is_none())
            .collect();
        let of =
            |f: &dyn Fn(&Run) -> f64| Spread::of(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
        let ratio: Vec<f64> = mine
            .iter()
            .filter_map(|r| {
                let base = runs.iter().find(|b| b.0 == "buffer" && b.1 == r.1)?;
                Some(base.2.seconds / r.2.seconds)
            })
            .collect();
        println!(
            "| {arm} | {:.3} | {:.3} | {:.2} | {:.0} | {:.2} | {:.0} |",
            of(&|r| r.2.seconds),
            Spread::of(&ratio),
            of(&|r| r.2.cpu_seconds),
            of(&|r| r.2.dirty_mib),
            of(&|r| r.3),
            median(
                &mine
                    .iter()
                    .map(|r| (r.2.maxrss_kib >> 10) as f64)
                    .collect::<Vec<_>>()
            ),
        );
    }
    Ok(())
}

/// Syncs the filesystem of `dir` (`syncfs(2)`).
fn sync(dir: &Path) {
    if let Ok(file) = File::open(dir) {
        // SAFETY: `syncfs` takes a descriptor, which `file` keeps open across the call.
        unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&file)) };
    }
}

/// The bytes of piece `i` (a 16 MiB pattern, shifted per piece so that no two are equal).
fn source(piece: usize) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..piece)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The hash of a file landing out of order: pieces hashed as the gaps before them close.
struct InOrder {
    state: Mutex<(usize, Option<Sha256>, Vec<bool>)>,
}

impl InOrder {
    fn new(pieces: usize) -> InOrder {
        InOrder {
            state: Mutex::new((0, Some(Sha256::new()), vec![false; pieces])),
        }
    }

    /// Piece `i` landed; `read(j, sha)` hashes piece `j` (from wherever it is).
    fn land(&self, i: usize, read: &dyn Fn(usize, &mut Sha256)) {
        let mut s = self.state.lock().unwrap();
        s.2[i] = true;
        loop {
            let next = s.0;
            if next >= s.2.len() || !s.2[next] {
                return;
            }
            let Some(mut sha) = s.1.take() else {
                return; // another thread hashes, and sees this piece
            };
            s.0 += 1;
            drop(s);
            read(next, &mut sha);
            s = self.state.lock().unwrap();
            s.1 = Some(sha);
        }
    }

    fn finish(&self) -> String {
        let mut s = self.state.lock().unwrap();
        let sha = s.1.take().unwrap_or_default();
        sha.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn run_child(job: &Job) -> Result<Figures, String> {
    let len: u64 = job.extra(0);
    let threads: usize = job.extra(1);
    let piece = job.extra::<usize>(2) << 20;
    let src = source(piece);
    let pieces = (len as usize).div_ceil(piece);
    let bytes_of = |i: usize| (len as usize - i * piece).min(piece);
    let dir = &job.path;
    let cpu = cpu_seconds();
    let start = Instant::now();
    let next = AtomicUsize::new(0);
    let hash = InOrder::new(pieces);
    let temp = dir.join("blob.incomplete");
    let digest = match job.arm.as_str() {
        "buffer" | "buffer-tee" => {
            let tee = job.arm == "buffer-tee";
            let file = if tee {
                let file = create(&temp, len)?;
                Some(file)
            } else {
                None
            };
            let mut map = memmap2::MmapMut::map_anon(len as usize).map_err(|e| e.to_string())?;
            let _ = map.advise(memmap2::Advice::HugePage);
            let base = map.as_mut_ptr() as usize;
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        while let Some(i) = claim(&next, pieces) {
                            let n = bytes_of(i);
                            // SAFETY: each piece index is claimed once, so no two threads
                            // touch the same bytes; the map outlives the scope.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut((base + i * piece) as *mut u8, n)
                            };
                            dst.copy_from_slice(&src[..n]);
                            if let Some(file) = &file {
                                file.write_all_at(dst, (i * piece) as u64).expect("pwrite");
                                // As `src/cache/write.rs` does: the piece just landed
                                // hashed from memory, the others read back from the file.
                                hash.land(i, &|j, sha| {
                                    if j == i {
                                        sha.update(&*dst);
                                        return;
                                    }
                                    let mut back = vec![0u8; bytes_of(j)];
                                    file.read_exact_at(&mut back, (j * piece) as u64)
                                        .expect("pread");
                                    sha.update(&back);
                                });
                            }
                        }
                    });
                }
            });
            if tee {
                std::fs::rename(&temp, dir.join("blob")).map_err(|e| e.to_string())?;
                hash.finish()
            } else {
                // No cache: nothing to hash (the digest the others agree on, computed after
                // the clock stopped, to check the bytes).
                let seconds = start.elapsed().as_secs_f64();
                let cpu = cpu_seconds() - cpu;
                let digest: String = Sha256::digest(&map[..])
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                return Ok(figures(seconds, cpu, digest));
            }
        }
        "shared-map" | "shared-map-populated" => {
            let populate = job.arm == "shared-map-populated";
            let file = create(&temp, len)?;
            // SAFETY: the file is this process's own, made above, and no one truncates it
            // while it is mapped.
            let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| e.to_string())?;
            let base = map.as_mut_ptr() as usize;
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        while let Some(i) = claim(&next, pieces) {
                            let n = bytes_of(i);
                            // SAFETY: as above, each piece is one thread's.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut((base + i * piece) as *mut u8, n)
                            };
                            if populate {
                                populate_write(dst);
                            }
                            dst.copy_from_slice(&src[..n]);
                            hash.land(i, &|j, sha| {
                                // SAFETY: piece `j` landed (its writer is done with it).
                                let bytes = unsafe {
                                    std::slice::from_raw_parts(
                                        (base + j * piece) as *const u8,
                                        bytes_of(j),
                                    )
                                };
                                sha.update(bytes);
                            });
                        }
                    });
                }
            });
            std::fs::rename(&temp, dir.join("blob")).map_err(|e| e.to_string())?;
            std::hint::black_box(&mut map);
            hash.finish()
        }
        other => return Err(format!("no arm {other}")),
    };
    Ok(figures(
        start.elapsed().as_secs_f64(),
        cpu_seconds() - cpu,
        digest,
    ))
}

fn figures(seconds: f64, cpu_seconds: f64, digest: String) -> Figures {
    Figures {
        seconds,
        cpu_seconds,
        dirty_mib: proc_meminfo_mib("Dirty:"),
        maxrss_kib: proc::max_rss_kib(),
        digest,
        error: None,
    }
}

fn claim(next: &AtomicUsize, pieces: usize) -> Option<usize> {
    let i = next.fetch_add(1, Ordering::Relaxed);
    (i < pieces).then_some(i)
}

/// A new file of `len` bytes, reserved with `fallocate(2)`.
fn create(path: &Path, len: u64) -> Result<File, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    // SAFETY: `fallocate` takes the descriptor `file` keeps open across the call.
    let rc = unsafe { libc::fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, 0, len as i64) };
    if rc != 0 {
        return Err(format!("fallocate: {}", std::io::Error::last_os_error()));
    }
    Ok(file)
}

/// `MADV_POPULATE_WRITE` over `dst` (Linux 5.14+): its pages faulted in writable at once.
fn populate_write(dst: &mut [u8]) {
    const MADV_POPULATE_WRITE: i32 = 23;
    let page = 4096usize;
    let start = dst.as_mut_ptr() as usize;
    let aligned = start / page * page;
    // SAFETY: the range covers pages of a live map of this process; the advice only faults
    // them in, it changes no byte.
    unsafe {
        libc::madvise(
            aligned as *mut libc::c_void,
            dst.len() + (start - aligned),
            MADV_POPULATE_WRITE,
        );
    }
}

/// A `/proc/meminfo` field, MiB.
fn proc_meminfo_mib(field: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// This process's CPU time so far (user and system, every thread), seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes only into the zeroed `rusage` passed, which lives across
    // the call.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return f64::NAN;
        }
        usage
    };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    s(usage.ru_utime) + s(usage.ru_stime)
}
