//! The daemon's `READ` workers: the queue of requests, the threads that serve it, and what
//! each answer costs (a fetch from the modelled remote, the per-request latency, its time on
//! the bandwidth-capped link) or carries (a short count, `EIO`).

use std::cmp::{Ordering as CmpOrdering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use fuser::{Errno, ReplyData};

use crate::fetch::{Acquire, Fetches};
use crate::link::Link;
use crate::{Options, Shared};

/// Read workers when neither `daemon_threads` nor `max_concurrent_reads` is set.
pub(crate) const DEFAULT_READ_WORKERS: usize = 64;
/// Read workers only copy between a file and a buffer.
const WORKER_STACK: usize = 256 * 1024;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One `READ` request on its way to a worker.
pub(crate) struct ReadJob {
    file: Arc<File>,
    path: Arc<Path>,
    /// The file's size when it was opened (the source does not change while mounted).
    len: u64,
    direct_io: bool,
    offset: u64,
    size: u32,
    reply: ReplyData,
    /// Whether it already went through a worker once and waited for a fetch, so that it is
    /// counted once.
    seen: bool,
}

impl ReadJob {
    pub(crate) fn new(
        file: Arc<File>,
        path: Arc<Path>,
        len: u64,
        direct_io: bool,
        offset: u64,
        size: u32,
        reply: ReplyData,
    ) -> Self {
        Self {
            file,
            path,
            len,
            direct_io,
            offset,
            size,
            reply,
            seen: false,
        }
    }
}

/// How many workers serve `READ`s, and when they start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Workers {
    /// All of them at mount, as a daemon starts its thread pool ([`Options::daemon_threads`]).
    Fixed(usize),
    /// As the queue needs them, up to this many ([`Options::max_concurrent_reads`]).
    OnDemand(usize),
}

impl Workers {
    pub(crate) fn from_options(options: &Options) -> Self {
        match (options.daemon_threads, options.max_concurrent_reads) {
            (Some(n), _) => Workers::Fixed(n.max(1)),
            (None, Some(n)) => Workers::OnDemand(n.max(1)),
            (None, None) => Workers::OnDemand(DEFAULT_READ_WORKERS),
        }
    }

    fn limit(self) -> usize {
        match self {
            Workers::Fixed(n) | Workers::OnDemand(n) => n,
        }
    }
}

/// Worker threads serving `READ`s, at most `workers.limit()` at once; requests beyond that
/// wait in the queue. Dropping a job (a worker panic, a closed pool) answers `EIO`, through
/// `ReplyData`'s drop.
///
/// NOTE: fuser's own `n_threads` (several session threads reading `/dev/fuse`) was rejected
/// as the daemon threads: requests beyond the threads would wait in the kernel, where
/// nothing counts them, and a `LOOKUP` or `OPEN` would wait behind sleeping reads. Here the
/// one session thread only dispatches, and the queue is the daemon's, counted in
/// [`Shared::max_queued`].
///
/// NOTE: keeping a `READ` that waits for a fetch on its worker was rejected: with one thread,
/// four cold blocks read at once would be fetched one after another (4 × 250 ms, where
/// `fetches_in_flight_hold_no_daemon_thread` sees them overlap, under 2 × 250 ms), so the
/// thread count of a mount with a first-byte delay would measure the delay, and a daemon
/// that answers network-bound reads from tasks does not behave so.
pub(crate) struct Pool {
    state: Mutex<PoolState>,
    wake: Condvar,
    workers: Workers,
    latency: Option<Duration>,
    link: Option<Mutex<Link>>,
    remote: Option<Remote>,
    shared: Arc<Shared>,
}

struct PoolState {
    queue: VecDeque<ReadJob>,
    /// Workers alive.
    workers: usize,
    /// Workers started that have not looked at the queue yet; each will take a job.
    starting: usize,
    /// Workers waiting for a job.
    idle: usize,
    closed: bool,
}

/// The modelled remote behind the daemon: fetch blocks, their first-byte delay, and the
/// timer that delivers them.
struct Remote {
    first_byte_delay: Duration,
    catalog: Mutex<Catalog>,
    timer: Mutex<TimerState>,
    timer_wake: Condvar,
}

/// The fetched blocks, and the [`Shared::forget_generation`] they reflect.
struct Catalog {
    fetches: Fetches<ReadJob>,
    generation: u64,
}

impl Catalog {
    /// Applies a `Mount::forget_fetched` made since the last look, before any decision.
    fn catch_up(&mut self, shared: &Shared) {
        let generation = shared.forget_generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.fetches.forget_fetched();
            self.generation = generation;
        }
    }
}

struct TimerState {
    due: BinaryHeap<Reverse<Due>>,
    /// Breaks ties between fetches due at the same instant, first started first.
    next_seq: u64,
    closed: bool,
}

/// A block fetch that arrives at `at`.
struct Due {
    at: Instant,
    seq: u64,
    file: Arc<Path>,
    block: u64,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl Pool {
    /// Starts the pool: every worker of a fixed pool, and the fetch timer when there is a
    /// remote to model.
    ///
    /// # Errors
    ///
    /// When a thread cannot be started; those already started end.
    pub(crate) fn start(options: &Options, shared: Arc<Shared>) -> io::Result<Arc<Self>> {
        let workers = Workers::from_options(options);
        let remote = options.first_byte_delay.map(|first_byte_delay| Remote {
            first_byte_delay,
            catalog: Mutex::new(Catalog {
                fetches: Fetches::new(options.fetch_block),
                generation: shared.forget_generation.load(Ordering::Acquire),
            }),
            timer: Mutex::new(TimerState {
                due: BinaryHeap::new(),
                next_seq: 0,
                closed: false,
            }),
            timer_wake: Condvar::new(),
        });
        let pool = Arc::new(Self {
            state: Mutex::new(PoolState {
                queue: VecDeque::new(),
                workers: 0,
                starting: 0,
                idle: 0,
                closed: false,
            }),
            wake: Condvar::new(),
            workers,
            latency: options.latency,
            link: options
                .bandwidth_bytes_per_sec
                .map(|rate| Mutex::new(Link::new(rate))),
            remote,
            shared,
        });
        let started = pool.start_threads();
        if started.is_err() {
            pool.close();
        }
        started.map(|()| pool)
    }

    fn start_threads(self: &Arc<Self>) -> io::Result<()> {
        if self.remote.is_some() {
            let pool = Arc::clone(self);
            thread::Builder::new()
                .name("safeload-testfs-fetch".to_owned())
                .stack_size(WORKER_STACK)
                .spawn(move || pool.deliver_fetches())?;
        }
        if let Workers::Fixed(n) = self.workers {
            let mut state = lock(&self.state);
            for _ in 0..n {
                self.spawn_worker(&mut state)?;
            }
        }
        Ok(())
    }

    fn spawn_worker(self: &Arc<Self>, state: &mut PoolState) -> io::Result<()> {
        let pool = Arc::clone(self);
        thread::Builder::new()
            .name("safeload-testfs-read".to_owned())
            .stack_size(WORKER_STACK)
            .spawn(move || pool.work())?;
        state.workers += 1;
        state.starting += 1;
        Ok(())
    }

    /// Queues a request from the kernel.
    pub(crate) fn submit(self: &Arc<Self>, job: ReadJob) {
        let mut state = lock(&self.state);
        state.queue.push_back(job);
        self.dispatch(&mut state);
    }

    /// Puts requests whose fetch arrived back at the head of the queue: they came before
    /// anything queued since.
    fn requeue(self: &Arc<Self>, jobs: Vec<ReadJob>) {
        if jobs.is_empty() {
            return;
        }
        let mut state = lock(&self.state);
        for job in jobs.into_iter().rev() {
            state.queue.push_front(job);
        }
        self.dispatch(&mut state);
    }

    /// Wakes idle workers for the queued requests, and starts more (on demand, up to the
    /// limit) while requests outnumber the workers that will take them.
    fn dispatch(self: &Arc<Self>, state: &mut PoolState) {
        let queued = state.queue.len();
        let s = &*self.shared;
        s.queued.store(queued as u64, Ordering::Relaxed);
        s.max_queued.fetch_max(queued as u64, Ordering::Relaxed);
        match queued.min(state.idle) {
            0 => {}
            1 => self.wake.notify_one(),
            _ => self.wake.notify_all(),
        }
        let mut unserved = queued.saturating_sub(state.idle + state.starting);
        while unserved > 0 && state.workers < self.workers.limit() {
            if let Err(e) = self.spawn_worker(state) {
                eprintln!("safeload-testfs: cannot start a read worker: {e}");
                if state.workers == 0 {
                    // Nobody would ever serve them: answer EIO.
                    state.queue.clear();
                }
                return;
            }
            unserved -= 1;
        }
    }

    /// Ends the workers and the fetch timer; requests still queued or waiting for a fetch
    /// answer `EIO` when the pool goes.
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
        self.wake.notify_all();
        if let Some(remote) = &self.remote {
            lock(&remote.timer).closed = true;
            remote.timer_wake.notify_all();
        }
    }

    fn work(&self) {
        let mut buf = Vec::new();
        let mut starting = true;
        loop {
            let job = {
                let mut state = lock(&self.state);
                if starting {
                    state.starting -= 1;
                    starting = false;
                }
                loop {
                    if let Some(job) = state.queue.pop_front() {
                        self.shared
                            .queued
                            .store(state.queue.len() as u64, Ordering::Relaxed);
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

    fn serve(&self, mut job: ReadJob, buf: &mut Vec<u8>) {
        let s = &*self.shared;
        if !job.seen {
            s.read_requests.fetch_add(1, Ordering::Relaxed);
            s.max_request_bytes
                .fetch_max(u64::from(job.size), Ordering::Relaxed);
        }
        let in_flight = s.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        s.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);

        if let Some(remote) = &self.remote {
            match self.fetch(remote, job) {
                Some(ready) => job = ready,
                None => {
                    // Parked until its block arrives: the worker is free meanwhile.
                    s.in_flight.fetch_sub(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        if let Some(latency) = self.latency {
            thread::sleep(latency);
        }
        let result = if s.fails(&job.path, job.offset, u64::from(job.size)) {
            Err(Errno::EIO)
        } else if job.direct_io && s.interrupts() {
            Err(Errno::EINTR)
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
        if let (Ok(n), Some(link)) = (&result, &self.link) {
            // Booked under the lock, slept outside it: other workers book behind this one.
            let leaves_at = lock(link).reserve(Instant::now(), *n as u64);
            sleep_until(leaves_at);
        }

        // Served: out of flight before the answer lets the kernel send the next request.
        s.in_flight.fetch_sub(1, Ordering::Relaxed);
        match result {
            Ok(n) => {
                s.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                s.count_file(&job.path, |f| {
                    f.read_requests += 1;
                    f.bytes_read += n as u64;
                });
                job.reply.data(&buf[..n]);
            }
            Err(e) => {
                s.count_file(&job.path, |f| f.read_requests += 1);
                job.reply.error(e);
            }
        }
    }

    /// Gives the request back when every fetch block it reads has arrived; otherwise keeps it
    /// until one does, starting the fetches nobody started yet.
    fn fetch(&self, remote: &Remote, mut job: ReadJob) -> Option<ReadJob> {
        let s = &*self.shared;
        let first_look = !job.seen;
        job.seen = true;
        let file = Arc::clone(&job.path);
        let range = job.offset..job.offset.saturating_add(u64::from(job.size));
        let len = job.len;
        let (started, joined) = {
            let mut catalog = lock(&remote.catalog);
            catalog.catch_up(s);
            match catalog.fetches.acquire(&file, range, len, job) {
                Acquire::Ready(job) => return Some(job),
                Acquire::Wait { started, joined } => (started, joined),
            }
        };
        if first_look && joined {
            s.joined_fetches.fetch_add(1, Ordering::Relaxed);
        }
        if !started.is_empty() {
            let n = started.len() as u64;
            s.fetches.fetch_add(n, Ordering::Relaxed);
            s.count_file(&file, |f| f.fetches += n);
            let at = Instant::now() + remote.first_byte_delay;
            let mut timer = lock(&remote.timer);
            for block in started {
                let seq = timer.next_seq;
                timer.next_seq += 1;
                timer.due.push(Reverse(Due {
                    at,
                    seq,
                    file: Arc::clone(&file),
                    block,
                }));
            }
            remote.timer_wake.notify_one();
        }
        None
    }

    /// The fetch timer: marks each block fetched when its first-byte delay is over and hands
    /// the requests that waited for it back to the workers.
    fn deliver_fetches(self: &Arc<Self>) {
        let Some(remote) = &self.remote else {
            return;
        };
        let mut timer = lock(&remote.timer);
        loop {
            if timer.closed {
                return;
            }
            let now = Instant::now();
            let next_at = timer.due.peek().map(|Reverse(due)| due.at);
            match next_at {
                None => {
                    timer = remote
                        .timer_wake
                        .wait(timer)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Some(at) if at > now => {
                    timer = remote
                        .timer_wake
                        .wait_timeout(timer, at - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                Some(_) => {
                    let Some(Reverse(due)) = timer.due.pop() else {
                        continue;
                    };
                    drop(timer);
                    let waiters = {
                        let mut catalog = lock(&remote.catalog);
                        catalog.catch_up(&self.shared);
                        catalog.fetches.complete(&due.file, due.block)
                    };
                    self.requeue(waiters);
                    timer = lock(&remote.timer);
                }
            }
        }
    }
}

fn sleep_until(at: Instant) {
    let now = Instant::now();
    if at > now {
        thread::sleep(at - now);
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
