//! The CPU stand-in for a device: slabs in host memory (or none, when it discards what it copies), plain reused staging buffers, and one copy thread that moves each submitted chunk after a set latency at a set bandwidth, in the order copies were submitted, failing the N-th where told to; counters that show what was given back.

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::device::Device;

/// A device in host memory: the crate's stand-in for a GPU, which its tests
/// and benchmarks load to, and a way to run the device path on a machine
/// without one.
///
/// Slabs are host memory (or, with [`discard_bytes`](Self::discard_bytes),
/// nothing: the copies are timed and counted only); staging buffers are
/// plain page-aligned buffers, reused. One thread of its own copies each
/// submitted chunk, in the order they were submitted (as a GPU's copy engine
/// does), after [`latency`](Self::latency), at [`bandwidth`](Self::bandwidth)
/// (both unlimited unless set); [`fail_on_copy`](Self::fail_on_copy) makes a
/// copy fail. Its counters say what a load left behind: slabs and staging
/// buffers still alive, copies made.
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// # let path = dir.path().join("model.safetensors");
/// # let data: Vec<u8> = (0..24u8).collect();
/// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4, 6], &data)?;
/// # safetensors::serialize_to_file([("w", view)], None, &path)?;
/// use safeload::device::{LoadToDevice, StandIn};
///
/// let device = StandIn::new().bandwidth(2e9); // 2 GB/s, like a slow PCIe link
/// let on_device = safeload::Loader::new().load_to_device(&path, &device)?;
/// let w = on_device.get("w").unwrap();
/// assert_eq!(w.shape(), [4, 6]);
/// assert_eq!(w.to_host().unwrap(), data);
/// assert_eq!(device.live_staging(), 0); // every staging buffer given back
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct StandIn {
    config: Config,
    engine: Arc<Engine>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Config {
    bytes_per_second: Option<f64>,
    latency: Duration,
    fail_on: Option<u64>,
    discard: bool,
}

impl std::fmt::Debug for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandIn")
            .field("config", &self.config)
            .field("copies", &self.copies())
            .finish_non_exhaustive()
    }
}

impl Default for StandIn {
    fn default() -> StandIn {
        StandIn::new()
    }
}

impl StandIn {
    /// A stand-in that copies at once, keeping the bytes.
    pub fn new() -> StandIn {
        StandIn {
            config: Config::default(),
            engine: Arc::new(Engine::default()),
        }
    }

    /// Copies move `bytes_per_second` (a copy of `n` bytes takes `n /
    /// bytes_per_second` after its latency). Not positive: unlimited.
    pub fn bandwidth(mut self, bytes_per_second: f64) -> StandIn {
        self.config.bytes_per_second = (bytes_per_second > 0.0).then_some(bytes_per_second);
        self
    }

    /// Each copy starts `latency` after the copy engine reaches it.
    pub fn latency(mut self, latency: Duration) -> StandIn {
        self.config.latency = latency;
        self
    }

    /// The `n`th copy submitted (counting from 1, over the stand-in's life)
    /// fails when waited for; its bytes do not arrive.
    pub fn fail_on_copy(mut self, n: u64) -> StandIn {
        self.config.fail_on = Some(n);
        self
    }

    /// Keeps none of the bytes copied: slabs take no memory, copies are
    /// timed and counted only (for a load larger than this machine's
    /// memory, or a benchmark where the copy must not take a core).
    pub fn discard_bytes(mut self) -> StandIn {
        self.config.discard = true;
        self
    }

    /// Copies completed.
    pub fn copies(&self) -> u64 {
        self.engine.counters.copies.load(Ordering::Relaxed)
    }

    /// Bytes the completed copies moved.
    pub fn bytes_copied(&self) -> u64 {
        self.engine.counters.bytes.load(Ordering::Relaxed)
    }

    /// Slabs alive (allocated, not yet dropped).
    pub fn live_slabs(&self) -> usize {
        self.engine.counters.slabs.load(Ordering::Relaxed)
    }

    /// Staging buffers alive: made and not yet dropped, whether free in a
    /// ring, filling or copying.
    pub fn live_staging(&self) -> usize {
        self.engine.counters.staging.load(Ordering::Relaxed)
    }

    /// Staging buffers made over the stand-in's life.
    pub fn staging_made(&self) -> u64 {
        self.engine.counters.staging_made.load(Ordering::Relaxed)
    }
}

/// One slab of the stand-in: host memory (none where the stand-in discards
/// what it copies) at a made-up device address.
#[derive(Debug)]
pub struct StandInSlab {
    memory: Arc<SlabMemory>,
}

#[derive(Debug)]
struct SlabMemory {
    /// `None` where the stand-in discards the bytes.
    bytes: Option<Mutex<Vec<u8>>>,
    len: usize,
    address: u64,
    counters: Arc<Counters>,
}

impl Drop for SlabMemory {
    fn drop(&mut self) {
        self.counters.slabs.fetch_sub(1, Ordering::Relaxed);
    }
}

impl StandInSlab {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.memory.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.memory.len == 0
    }

    /// A copy of its bytes at `range`: what a device-to-host copy would
    /// give. `None` where the range lies outside it or the stand-in
    /// discards the bytes.
    pub fn read(&self, range: Range<usize>) -> Option<Vec<u8>> {
        let bytes = lock(self.memory.bytes.as_ref()?);
        bytes.get(range).map(<[u8]>::to_vec)
    }
}

/// A staging buffer of the stand-in: a page-aligned buffer, faulted in when
/// made (it is filled again and again), counted while alive.
pub struct StandInStaging {
    buffer: MmapMut,
    counters: Arc<Counters>,
}

impl Drop for StandInStaging {
    fn drop(&mut self) {
        self.counters.staging.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A copy submitted to the stand-in.
pub struct StandInCopy {
    done: Arc<Done>,
}

#[derive(Debug, Default)]
struct Counters {
    copies: AtomicU64,
    bytes: AtomicU64,
    submitted: AtomicU64,
    slabs: AtomicUsize,
    staging: AtomicUsize,
    staging_made: AtomicU64,
    /// The next made-up device address.
    next_address: AtomicU64,
}

/// A copy's outcome, once the copy thread has made it.
#[derive(Default)]
struct Done {
    outcome: Mutex<Option<io::Result<StandInStaging>>>,
    ready: Condvar,
}

/// A copy for the copy thread.
struct Job {
    staging: StandInStaging,
    len: usize,
    slab: Arc<SlabMemory>,
    offset: usize,
    config: Config,
    /// Its place among the stand-in's copies, from 1.
    number: u64,
    /// When it was submitted.
    at: Instant,
    done: Arc<Done>,
}

/// The copy thread's queue, and the thread.
#[derive(Default)]
struct Engine {
    queue: Arc<Queue>,
    thread: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    arrived: Condvar,
}

impl Drop for Engine {
    fn drop(&mut self) {
        lock(&self.queue.jobs).1 = true;
        self.queue.arrived.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Engine {
    /// Hands `job` to the copy thread, started on the first copy.
    fn push(&self, job: Job) -> io::Result<()> {
        let mut thread = lock(&self.thread);
        if thread.is_none() {
            let queue = Arc::clone(&self.queue);
            let counters = Arc::clone(&self.counters);
            let handle = std::thread::Builder::new()
                .name("safeload-standin".into())
                .spawn(move || copy_thread(&queue, &counters))?;
            *thread = Some(handle);
        }
        drop(thread);
        lock(&self.queue.jobs).0.push_back(job);
        self.queue.arrived.notify_one();
        Ok(())
    }
}

/// The copy thread: each job in turn, after its latency, at its bandwidth,
/// one after another on the engine's own clock: a copy starts when it was
/// submitted or when the one before it ended, whichever is later, and ends
/// its latency and length later, however late this thread wakes to say so
/// (the host's scheduler delays when a copy is seen complete, never the
/// copies after it, as with a GPU's copy engine).
fn copy_thread(queue: &Queue, counters: &Counters) {
    // When the engine is free again.
    let mut free_at = Instant::now();
    loop {
        let job = {
            let mut jobs = lock(&queue.jobs);
            loop {
                if let Some(job) = jobs.0.pop_front() {
                    break job;
                }
                if jobs.1 {
                    return;
                }
                jobs = queue
                    .arrived
                    .wait(jobs)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        };
        let (len, config) = (job.len, job.config);
        let mut end = free_at.max(job.at) + config.latency;
        if let Some(rate) = config.bytes_per_second {
            end += Duration::from_secs_f64(len as f64 / rate);
        }
        let outcome = run(job.staging, len, &job.slab, job.offset, &config, job.number);
        // The slab's memory goes with its last holder: not this thread, once
        // the copy is seen complete.
        drop(job.slab);
        // A copy that kept the bytes took its own time at least.
        free_at = end.max(Instant::now());
        if let Some(left) = free_at.checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        if outcome.is_ok() {
            counters.copies.fetch_add(1, Ordering::Relaxed);
            counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
        }
        *lock(&job.done.outcome) = Some(outcome);
        job.done.ready.notify_all();
    }
}

/// One copy: its bytes into the slab, unless it is the one to fail (its
/// buffer then dropped, as a failed device drops it).
fn run(
    staging: StandInStaging,
    len: usize,
    slab: &SlabMemory,
    offset: usize,
    config: &Config,
    number: u64,
) -> io::Result<StandInStaging> {
    if config.fail_on == Some(number) {
        return Err(io::Error::other(format!(
            "the stand-in device failed copy {number}, as it was told to"
        )));
    }
    let src = staging
        .buffer
        .get(..len)
        .ok_or_else(|| io::Error::other("a copy longer than its staging buffer"))?;
    if let Some(bytes) = &slab.bytes {
        let mut bytes = lock(bytes);
        let dst = offset
            .checked_add(len)
            .and_then(|end| bytes.get_mut(offset..end))
            .ok_or_else(|| io::Error::other("a copy past the end of its slab"))?;
        dst.copy_from_slice(src);
    } else if offset.checked_add(len).is_none_or(|end| end > slab.len) {
        return Err(io::Error::other("a copy past the end of its slab"));
    }
    Ok(staging)
}

impl Device for StandIn {
    type Slab = StandInSlab;
    type Staging = StandInStaging;
    type Copy = StandInCopy;

    fn name(&self) -> String {
        "the CPU stand-in".to_owned()
    }

    fn allocate(&self, len: usize) -> io::Result<StandInSlab> {
        const SPACING: u64 = 2 << 20;
        let counters = &self.engine.counters;
        let room = (len as u64).next_multiple_of(SPACING).max(SPACING);
        // Made-up addresses, as a device's would be: distinct, aligned, the
        // first away from zero.
        let address = counters.next_address.fetch_add(room, Ordering::Relaxed) + SPACING;
        let bytes = match self.config.discard {
            true => None,
            false => {
                let mut bytes = Vec::new();
                bytes.try_reserve_exact(len).map_err(io::Error::other)?;
                bytes.resize(len, 0);
                Some(Mutex::new(bytes))
            }
        };
        counters.slabs.fetch_add(1, Ordering::Relaxed);
        Ok(StandInSlab {
            memory: Arc::new(SlabMemory {
                bytes,
                len,
                address,
                counters: Arc::clone(counters),
            }),
        })
    }

    fn address(&self, slab: &StandInSlab) -> u64 {
        slab.memory.address
    }

    fn staging(&self, len: usize) -> io::Result<StandInStaging> {
        let mut buffer = MmapMut::map_anon(len)?;
        // Filled again and again: faulted in once, now.
        buffer.fill(0);
        let counters = &self.engine.counters;
        counters.staging.fetch_add(1, Ordering::Relaxed);
        counters.staging_made.fetch_add(1, Ordering::Relaxed);
        Ok(StandInStaging {
            buffer,
            counters: Arc::clone(counters),
        })
    }

    fn staging_bytes<'s>(&self, staging: &'s mut StandInStaging) -> &'s mut [u8] {
        &mut staging.buffer
    }

    fn submit(
        &self,
        staging: StandInStaging,
        len: usize,
        slab: &StandInSlab,
        offset: usize,
    ) -> io::Result<StandInCopy> {
        let done = Arc::new(Done::default());
        let number = self
            .engine
            .counters
            .submitted
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        self.engine.push(Job {
            staging,
            len,
            slab: Arc::clone(&slab.memory),
            offset,
            config: self.config,
            number,
            at: Instant::now(),
            done: Arc::clone(&done),
        })?;
        Ok(StandInCopy { done })
    }

    fn complete(&self, copy: StandInCopy) -> io::Result<StandInStaging> {
        let mut outcome = lock(&copy.done.outcome);
        loop {
            if let Some(outcome) = outcome.take() {
                return outcome;
            }
            outcome = copy
                .done
                .ready
                .wait(outcome)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}
