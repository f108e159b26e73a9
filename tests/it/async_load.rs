//! `Loader::load_async` and `open_async`: the caller's executor keeps running
//! while a load goes on (a current-thread runtime's 10 ms heartbeat keeps
//! ticking, no gap over 50 ms), progress is reported from the crate's threads,
//! errors are those of the blocking calls, and a load stops within a request
//! when its future is dropped or its flag (`Loader::cancel_on`) is set, its
//! memory freed and no thread of the crate left. The cancellation tests run
//! on the FUSE test filesystem with a bandwidth cap, so that a load lasts
//! long enough to be stopped midway; they need root and /dev/fuse: skipped
//! (loudly) where missing, a failure under `SAFELOAD_REQUIRE_FUSE=1`.

use std::cell::Cell;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::common::child::{run_alone, run_role};
use crate::common::*;
use safeload::report::Progress;
use safeload::{Dtype, ErrorKind, Loader, StateDict};
use safeload_testfs::{Mount, Options, skip_without_fuse};
use tempfile::tempdir;

const MIB: usize = 1 << 20;

/// The longest a heartbeat of 10 ms may go without ticking during an async
/// load (the bound).
const MAX_GAP: Duration = Duration::from_millis(50);

/// A current-thread runtime: the executor an async load must never block.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Awaits `load` on `rt` beside a task ticking every 10 ms; its output and
/// the longest the ticks stopped (up to the load's end) and how many there
/// were.
fn with_heartbeat<T>(
    rt: &tokio::runtime::Runtime,
    load: impl Future<Output = T>,
) -> (T, Duration, u32) {
    rt.block_on(async {
        let start = Instant::now();
        let last = Cell::new(start);
        let longest = Cell::new(Duration::ZERO);
        let ticks = Cell::new(0u32);
        let beat = async {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let now = Instant::now();
                longest.set(longest.get().max(now - last.get()));
                last.set(now);
                ticks.set(ticks.get() + 1);
            }
        };
        let out = tokio::select! {
            out = load => out,
            () = beat => unreachable!("the heartbeat never ends"),
        };
        // The stretch from the last tick to the load's end counts too.
        let gap = longest.get().max(last.get().elapsed());
        (out, gap, ticks.get())
    })
}

/// 512 MiB in eight tensors, every page of each filled with its own byte,
/// on the build's disk (not a `/tmp` that may be memory).
fn write_large(dir: &Path) -> PathBuf {
    let specs: Vec<Spec> = (0..8)
        .map(|i| {
            let mut data = vec![0u8; 64 * MIB];
            for (page, bytes) in data.chunks_mut(4096).enumerate() {
                bytes.fill((i * 37 + page * 11) as u8);
            }
            Spec {
                name: format!("layers.{i}.w"),
                dtype: Dtype::F32,
                shape: vec![16 * MIB],
                data,
            }
        })
        .collect();
    write_single(dir, &specs)
}

/// The same tensors, bytes and order, compared without copying them out.
fn assert_same_tensors(a: &StateDict, b: &StateDict) {
    let names: Vec<&str> = a.names().collect();
    assert_eq!(names, b.names().collect::<Vec<_>>());
    for name in names {
        let (x, y) = (a.get(name).unwrap(), b.get(name).unwrap());
        assert_eq!((x.dtype(), x.shape()), (y.dtype(), y.shape()), "{name}");
        assert!(x.as_bytes() == y.as_bytes(), "{name}: bytes differ");
    }
}

/// `future`, timing each of its polls: the longest is left in `longest`.
struct Timed<'a, F> {
    future: Pin<Box<F>>,
    longest: &'a Cell<Duration>,
}

impl<F: Future> Future for Timed<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let start = Instant::now();
        let out = self.future.as_mut().poll(cx);
        self.longest.set(self.longest.get().max(start.elapsed()));
        out
    }
}

/// A blocked executor misses every tick of every run; a busy machine can
/// also keep a timer thread (or a poll) waiting now and then on its own (the
/// other tests of this binary run beside this one), so up to five runs are
/// made and one must keep to the bounds.
#[test]
fn a_current_thread_runtime_keeps_its_heartbeat_during_an_async_load() {
    let dir = tempfile::Builder::new()
        .prefix("async-heartbeat-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let path = write_large(dir.path());
    let loader = Loader::new().disable_mmap(true);
    let rt = runtime();

    // The naive twin: the blocking load awaited in the same place stops the
    // heartbeat for as long as it takes, which shows that this checkpoint
    // takes long enough for a blocked executor to break the bound.
    let (blocking, blocked_for, _) = with_heartbeat(&rt, async { loader.load(&path) });
    let blocking = blocking.unwrap();
    assert!(
        blocked_for > MAX_GAP,
        "the blocking load took only {blocked_for:?}: too short to tell"
    );

    // (longest gap, ticks, time, longest poll) of each run.
    let mut runs = Vec::new();
    let kept = |&(gap, ticks, _, poll): &(Duration, u32, Duration, Duration)| {
        // What the executor spends in the load's polls: starting a thread,
        // taking the answer; never the load. And it ticked during the load.
        gap <= MAX_GAP && ticks >= 3 && poll < Duration::from_millis(10)
    };
    while runs.len() < 5 && !runs.iter().any(kept) {
        let started = Instant::now();
        let longest_poll = Cell::new(Duration::ZERO);
        let load = Timed {
            future: Box::pin(loader.load_async(&path)),
            longest: &longest_poll,
        };
        let (loaded, gap, ticks) = with_heartbeat(&rt, load);
        let took = started.elapsed();
        assert_same_tensors(&loaded.unwrap(), &blocking);
        runs.push((gap, ticks, took, longest_poll.get()));
    }
    eprintln!(
        "512 MiB: the blocking load stopped the heartbeat for {blocked_for:?}; \
         async runs (longest gap, ticks, time, longest poll): {runs:?}"
    );
    assert!(
        runs.iter().any(kept),
        "no run kept the heartbeat within {MAX_GAP:?}: {runs:?}"
    );
}

/// Polls `future` to its end on this thread, sleeping until woken: an
/// executor of a dozen lines, none of tokio.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            Poll::Pending => std::thread::park(),
        }
    }
}

#[test]
fn any_executor_drives_it_to_the_bytes_of_a_blocking_load_and_open() {
    let dir = tempdir().unwrap();
    let specs = vec![
        spec("a", Dtype::F32, &[64, 1024]),
        spec("b", Dtype::BF16, &[3, 1000]),
        spec("c", Dtype::U8, &[17]),
    ];
    let index = write_sharded(dir.path(), &specs, 2);
    for (mode, loader) in read_modes() {
        let sd = block_on(loader.load_async(&index)).unwrap();
        assert_eq!(loaded(&sd), sorted(&specs), "{mode}");
        assert_same_tensors(&sd, &loader.load(&index).unwrap());

        let ck = block_on(loader.open_async(&index)).unwrap();
        assert_eq!(ck.len(), specs.len(), "{mode}");
        for s in &specs {
            assert_eq!(ck.read(&s.name).unwrap().as_bytes(), &s.data[..], "{mode}");
        }
    }
}

/// Each progress report, and the name of the thread it came from.
type Reports = Mutex<Vec<(Progress, Option<String>)>>;

#[test]
fn progress_is_reported_from_the_crates_threads_during_an_async_load() {
    let dir = tempdir().unwrap();
    let specs: Vec<Spec> = (0..4)
        .map(|i| spec(&format!("t{i}"), Dtype::U8, &[4 * MIB]))
        .collect();
    let path = write_single(dir.path(), &specs);
    let seen: Arc<Reports> = Arc::default();
    let sink = Arc::clone(&seen);
    let loader = Loader::new()
        .disable_mmap(true)
        .read_size(256 << 10)
        .io_concurrency(2)
        .on_progress(move |p| {
            let thread = std::thread::current().name().map(str::to_string);
            sink.lock().unwrap().push((*p, thread));
        });
    // Spawned as a task: the future is `Send + 'static`.
    let sd = runtime()
        .block_on(async { tokio::spawn(loader.load_async(&path)).await })
        .unwrap()
        .unwrap();
    assert_eq!(loaded(&sd), sorted(&specs));
    let seen = seen.lock().unwrap();
    let (last, _) = seen.last().expect("at least the final report");
    assert_eq!(last.bytes_done, last.bytes_total);
    assert!(last.bytes_total >= 16 * MIB as u64);
    assert_eq!((last.files_done, last.files_total), (1, 1));
    for (p, thread) in seen.iter() {
        let thread = thread.as_deref().unwrap_or("<unnamed>");
        assert!(
            thread.starts_with("safeload-"),
            "{p:?} reported on {thread}, not a thread of the crate's"
        );
    }
}

#[test]
fn errors_are_those_of_the_blocking_calls() {
    let dir = tempdir().unwrap();
    let missing = dir.path().join("no-such-checkpoint");
    let corrupt = dir.path().join("corrupt.safetensors");
    std::fs::write(&corrupt, b"not a checkpoint").unwrap();
    let empty_dir = tempdir().unwrap();
    let loader = Loader::new();
    let rt = runtime();
    for path in [&missing, &corrupt, &empty_dir.path().to_path_buf()] {
        let blocking = loader.load(path).unwrap_err();
        let async_load = rt.block_on(loader.load_async(path)).unwrap_err();
        let async_open = rt.block_on(loader.open_async(path)).unwrap_err();
        for err in [&async_load, &async_open] {
            assert_eq!(err.kind(), blocking.kind(), "{}", path.display());
            assert_eq!(err.path(), blocking.path());
            assert_eq!(err.to_string(), blocking.to_string());
            assert_eq!(err.is_not_found(), blocking.is_not_found());
        }
    }
    assert!(loader.load(&missing).unwrap_err().is_not_found());
}

#[test]
fn a_loader_cancelled_before_it_starts_fails_at_once_blocking_and_async() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &[spec("w", Dtype::U8, &[4096])]);
    let flag = Arc::new(AtomicBool::new(true));
    let loader = Loader::new().cancel_on(Arc::clone(&flag));
    let rt = runtime();
    let errors = [
        loader.load(&path).unwrap_err(),
        loader.open(&path).unwrap_err(),
        rt.block_on(loader.load_async(&path)).unwrap_err(),
        rt.block_on(loader.open_async(&path)).unwrap_err(),
    ];
    for err in errors {
        assert_eq!(err.kind(), &ErrorKind::Cancelled);
        assert_eq!(err.path(), Some(path.as_path()));
        assert!(!err.is_not_found() && !err.is_corrupt());
        assert_eq!(
            err.to_string(),
            format!("{}: the load was cancelled", path.display())
        );
    }
    // The crate only reads the flag: cleared, the same loader loads.
    flag.store(false, Ordering::Relaxed);
    assert_eq!(loader.load(&path).unwrap().len(), 1);
    assert_eq!(rt.block_on(loader.load_async(&path)).unwrap().len(), 1);
}

/// The FUSE mount of the cancellation tests: every read crosses the daemon
/// (no page cache) and a link of `bandwidth` bytes per second.
fn slow_mount(source: &Path, bandwidth: u64) -> Mount {
    Mount::new(
        source,
        Options {
            bandwidth_bytes_per_sec: Some(bandwidth),
            direct_io: true,
            ..Options::default()
        },
    )
    .unwrap()
}

/// `bytes` in 1 MiB tensors, pages of their own bytes.
fn write_slow_checkpoint(dir: &Path, bytes: usize) -> PathBuf {
    let specs: Vec<Spec> = (0..bytes / MIB)
        .map(|i| {
            let mut data = vec![0u8; MIB];
            for (page, chunk) in data.chunks_mut(4096).enumerate() {
                chunk.fill((i + page) as u8);
            }
            Spec {
                name: format!("t{i:04}"),
                dtype: Dtype::U8,
                shape: vec![MIB],
                data,
            }
        })
        .collect();
    write_single(dir, &specs)
}

/// A loader of the slow mount: 1 MiB reads, 4 in flight, so that a read in
/// flight ends within 4 MiB of the link; and the bytes done so far.
fn slow_loader() -> (Loader, Arc<AtomicU64>) {
    let done = Arc::new(AtomicU64::new(0));
    let sink = Arc::clone(&done);
    let loader = Loader::new()
        .disable_mmap(true)
        .read_size(MIB)
        .io_concurrency(4)
        .on_progress(move |p| sink.store(p.bytes_done, Ordering::Relaxed));
    (loader, done)
}

/// Waits (in a runtime) until `done` passes `bytes`.
async fn until_read(done: &AtomicU64, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while done.load(Ordering::Relaxed) < bytes {
        assert!(Instant::now() < deadline, "the load did not get going");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn setting_the_flag_stops_a_load_within_a_request_blocking_and_async() {
    if skip_without_fuse() {
        return;
    }
    // 64 MiB at 32 MiB/s: two seconds of loading.
    let dir = tempdir().unwrap();
    let source = dir.path().join("src");
    std::fs::create_dir(&source).unwrap();
    write_slow_checkpoint(&source, 64 * MIB);
    let fs = slow_mount(&source, 32 << 20);
    let path = fs.path().join("model.safetensors");
    let size = std::fs::metadata(&path).unwrap().len();
    let rt = runtime();
    for how in ["async", "blocking"] {
        fs.reset_stats();
        let (loader, done) = slow_loader();
        let flag = Arc::new(AtomicBool::new(false));
        let loader = loader.cancel_on(Arc::clone(&flag));
        let set_at: Arc<Mutex<Option<Instant>>> = Arc::default();
        let setter = {
            let (flag, done, set_at) = (Arc::clone(&flag), Arc::clone(&done), Arc::clone(&set_at));
            async move {
                until_read(&done, 4 * MIB as u64).await;
                *set_at.lock().unwrap() = Some(Instant::now());
                flag.store(true, Ordering::Relaxed);
            }
        };
        let err = match how {
            "async" => rt.block_on(async {
                let (result, ()) = tokio::join!(loader.load_async(&path), setter);
                result.unwrap_err()
            }),
            _ => {
                let (tell, result) = mpsc::channel();
                let (loader, path) = (loader.clone(), path.clone());
                let load = std::thread::spawn(move || tell.send(loader.load(&path)).unwrap());
                rt.block_on(setter);
                let err = result.recv().unwrap().unwrap_err();
                load.join().unwrap();
                err
            }
        };
        let stopped_after = set_at.lock().unwrap().unwrap().elapsed();
        assert_eq!(err.kind(), &ErrorKind::Cancelled, "{how}: {err}");
        assert_eq!(err.path(), Some(path.as_path()), "{how}");
        // Each of the 4 readers finishes the 1 MiB it holds: 125 ms of link.
        assert!(
            stopped_after < Duration::from_secs(1),
            "{how}: stopped {stopped_after:?} after the flag was set"
        );
        let read = fs.stats().bytes_read;
        assert!(read < size / 2, "{how}: {read} of {size} bytes read");
    }
}

/// Not a test of its own: the entry point of child processes, which return
/// at once unless `ROLE` is set (see `common::child`).
#[test]
fn child() {
    run_role(&[("drop", drop_in_child)]);
}

#[test]
fn dropping_the_future_stops_the_load_frees_its_memory_and_leaves_no_thread() {
    if skip_without_fuse() {
        return;
    }
    // Threads and resident memory are the process's: measured in a child
    // that runs this alone.
    run_alone(module_path!(), "drop");
}

/// This process's resident memory (`VmRSS`), in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kib << 10
}

/// The threads of the crate alive now, by name (`safeload-async`,
/// `safeload-read`, ...); the test filesystem's daemon threads, whose names
/// start alike (`safeload-testfs-*`, cut to 15 bytes), left out.
fn crate_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_string())
        .filter(|comm| comm.starts_with("safeload-") && !comm.starts_with("safeload-testfs"))
        .collect()
}

/// A child: starts an async load of 256 MiB at 128 MiB/s, drops its future
/// once 64 MiB are read, and checks that within two seconds no thread of the
/// crate is left and the memory it read into is given back.
fn drop_in_child() {
    let dir = tempfile::Builder::new()
        .prefix("async-drop-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let source = dir.path().join("src");
    std::fs::create_dir(&source).unwrap();
    write_slow_checkpoint(&source, 256 * MIB);
    let fs = slow_mount(&source, 128 << 20);
    let path = fs.path().join("model.safetensors");
    let size = std::fs::metadata(&path).unwrap().len();
    let rt = runtime();
    let (loader, done) = slow_loader();
    assert_eq!(crate_threads(), Vec::<String>::new(), "before the load");
    let baseline = rss();

    let (during, dropped_at) = rt.block_on(async {
        let mut load = Box::pin(loader.load_async(&path));
        tokio::select! {
            result = &mut load => panic!("the load ended before it was dropped: {result:?}"),
            () = until_read(&done, 64 * MIB as u64) => {}
        }
        let during = rss();
        drop(load);
        (during, Instant::now())
    });
    assert!(
        during >= baseline + 48 * MIB as u64,
        "the load read into memory: {} MiB over a baseline of {} MiB",
        (during.saturating_sub(baseline)) >> 20,
        baseline >> 20
    );

    // The drop did not wait: the load's thread sees its flag at its next
    // read, the readers finish the one they hold, and all end.
    let deadline = dropped_at + Duration::from_secs(2);
    loop {
        let (threads, now) = (crate_threads(), rss());
        if threads.is_empty() && now <= baseline + 16 * MIB as u64 {
            eprintln!(
                "dropped after {} MiB read; {:?} later no thread left and {} MiB resident over \
                 the baseline (from {} MiB)",
                done.load(Ordering::Relaxed) >> 20,
                dropped_at.elapsed(),
                now.saturating_sub(baseline) >> 20,
                (during - baseline) >> 20
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "2 s after the drop: threads {threads:?}, {} MiB resident over the baseline",
            now.saturating_sub(baseline) >> 20
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // It stopped: far from the whole file crossed the link.
    let read = fs.stats().bytes_read;
    assert!(read < size * 3 / 4, "{read} of {size} bytes read");
    drop(rt);
    drop(fs);
}
