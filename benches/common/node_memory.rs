//! The node's memory while children run, sampled from the parent: the drop
//! of `MemAvailable` (proc(5), `/proc/meminfo`) and the growth of `Shmem`
//! from a baseline, at their worst.
//!
//! Not the sum of the children's RSS: pages that several processes map (a
//! shared memory file, the page cache) count in each one's RSS, and the sum
//! would count a copy shared by four ranks four times.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Two fields of `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Meminfo {
    /// `MemAvailable`: what the kernel estimates can be allocated without
    /// swapping (free memory plus reclaimable page cache and slab).
    pub available: u64,
    /// `Shmem`: shared memory (tmpfs, `memfd`s, shared anonymous maps),
    /// counted once however many processes map it.
    pub shmem: u64,
}

impl Meminfo {
    /// The node's figures now; `None` where `/proc/meminfo` lacks them.
    pub fn now() -> Option<Meminfo> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        Meminfo::parse(&text)
    }

    /// The figures of a `/proc/meminfo` text (its values are in kB, that is
    /// KiB).
    pub fn parse(text: &str) -> Option<Meminfo> {
        let field = |name: &str| -> Option<u64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map(|kib| kib << 10)
        };
        Some(Meminfo {
            available: field("MemAvailable:")?,
            shmem: field("Shmem:")?,
        })
    }
}

/// The worst the node's memory came to during a run, against its baseline.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Peak {
    /// `MemAvailable` at the baseline, bytes.
    pub baseline_available: u64,
    /// The lowest `MemAvailable` sampled, bytes.
    pub min_available: u64,
    /// `Shmem` at the baseline, bytes.
    pub baseline_shmem: u64,
    /// The highest `Shmem` sampled, bytes.
    pub max_shmem: u64,
    /// Samples taken.
    pub samples: u64,
}

impl Peak {
    /// The node memory the run took at its peak: baseline minus the lowest
    /// `MemAvailable`, bytes (0 if it never fell).
    pub fn used(&self) -> u64 {
        self.baseline_available.saturating_sub(self.min_available)
    }

    /// The shared memory the run added at its peak, bytes.
    pub fn shmem(&self) -> u64 {
        self.max_shmem.saturating_sub(self.baseline_shmem)
    }
}

/// A thread that samples [`Meminfo`] every `interval` from the moment it
/// is started (the baseline) until [`Sampler::stop`].
pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Peak>,
}

impl Sampler {
    /// Takes the baseline now and starts sampling; `None` where
    /// `/proc/meminfo` cannot be read.
    pub fn start(interval: Duration) -> Option<Sampler> {
        let base = Meminfo::now()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = Peak {
                baseline_available: base.available,
                min_available: base.available,
                baseline_shmem: base.shmem,
                max_shmem: base.shmem,
                samples: 0,
            };
            loop {
                // One last sample after the stop, so that the state the
                // parent stopped at is counted.
                let last = stopping.load(Ordering::Acquire);
                if let Some(m) = Meminfo::now() {
                    peak.min_available = peak.min_available.min(m.available);
                    peak.max_shmem = peak.max_shmem.max(m.shmem);
                    peak.samples += 1;
                }
                if last {
                    return peak;
                }
                std::thread::sleep(interval);
            }
        });
        Some(Sampler { stop, thread })
    }

    /// Takes a last sample, stops, and returns the worst seen.
    pub fn stop(self) -> Peak {
        self.stop.store(true, Ordering::Release);
        self.thread.join().expect("the sampler does not panic")
    }
}
