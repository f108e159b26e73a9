//! Streaming a checkpoint in bounded memory: tensors handed to a callback in file order while reader threads work ahead within a budget of bytes, each tensor's bytes given back to the budget when the last handle on them is dropped.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::read::read_whole;
use super::{Checkpoint, TensorInfo};
use crate::error::{Error, Result};
use crate::progress::{Meter, Phase};
use crate::tensor::Tensor;
use crate::workers;

/// The stream's reader threads' name.
const READER_NAME: &str = "safeload-stream";

impl<X> Checkpoint<X> {
    /// Hands every tensor to `f`, in the order of [`tensors`](Self::tensors),
    /// while reader threads read ahead, holding at most
    /// `max_bytes_in_flight` bytes at once: a checkpoint larger than memory
    /// can be converted or uploaded piece by piece. `f` runs on the calling
    /// thread, one tensor at a time, so it may use state that is not `Send`;
    /// dropping a tensor (and its clones) gives its bytes back.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let a: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # let b: Vec<u8> = [half::bf16::from_f32(0.5)].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// # safetensors::serialize_to_file([
    /// #     ("a", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3], &a)?),
    /// #     ("b", safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, vec![1], &b)?),
    /// # ], None, &path)?;
    /// use safeload::Checkpoint;
    ///
    /// let ck = Checkpoint::open(&path)?;
    /// let mut converted = Vec::new();
    /// ck.for_each(256 << 20, |tensor| -> safeload::Result<()> {
    ///     let values: Vec<f32> = tensor.to_f32()?;
    ///     converted.push((tensor.name().to_string(), values.len()));
    ///     Ok(()) // `tensor` is dropped here: its bytes go back to the budget
    /// })?;
    /// assert_eq!(converted, [("a".to_string(), 3), ("b".to_string(), 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Memory
    ///
    /// The bytes in flight are the tensors read ahead, the one `f` holds and
    /// any `f` kept. Readers start a tensor only where it fits beside them,
    /// except that a tensor larger than the cap is read alone; once tensors
    /// `f` keeps fill the budget, each next one is read on the calling
    /// thread when `f` asks for it, so the stream never blocks on bytes only
    /// `f` can give back. With an `f` that drops each tensor, memory stays
    /// under the larger of the cap and the largest tensor. Tensors are read
    /// into allocations of their own, also from a mapped file: touched
    /// pages of a map stay resident until the whole file is unmapped (for
    /// zero-copy views with no bound, use [`read`](Self::read)).
    ///
    /// # Threads
    ///
    /// `Loader::io_concurrency` readers (default 8, 12 on FUSE; at most one
    /// per tensor) named `safeload-stream`, never the caller's rayon pool;
    /// where the OS refuses them, the calling thread reads. Every reader has
    /// finished when `for_each` returns or `f` panics.
    ///
    /// # Errors
    ///
    /// The first error `f` returns, unchanged, once the readers stopped. An
    /// engine's error type need only convert from [`Error`](crate::Error):
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let data = vec![0u8; 64];
    /// # safetensors::serialize_to_file([
    /// #     ("a", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![8], &data[..8])?),
    /// #     ("b", safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![64], &data)?),
    /// # ], None, &path)?;
    /// #[derive(Debug)]
    /// enum UploadError {
    ///     Load(safeload::Error),
    ///     Device(String),
    /// }
    ///
    /// impl From<safeload::Error> for UploadError {
    ///     fn from(e: safeload::Error) -> Self {
    ///         UploadError::Load(e)
    ///     }
    /// }
    ///
    /// /// A device with room for `free` more bytes.
    /// struct Device {
    ///     free: u64,
    /// }
    ///
    /// impl Device {
    ///     fn upload(&mut self, tensor: &safeload::Tensor) -> Result<(), UploadError> {
    ///         self.free = self.free.checked_sub(tensor.nbytes()).ok_or_else(|| {
    ///             UploadError::Device(format!("no room for {}", tensor.name()))
    ///         })?;
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let ck = safeload::Checkpoint::open(&path)?;
    /// let mut device = Device { free: 32 };
    /// let err = ck.for_each(1 << 20, |tensor| device.upload(&tensor)).unwrap_err();
    /// assert!(matches!(err, UploadError::Device(ref m) if m == "no room for b"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A read error (a file that shrank is
    /// [`ErrorKind::SizeMismatch`](crate::ErrorKind::SizeMismatch)) is
    /// `E::from(error)`, after the tensors before it went to `f`.
    pub fn for_each<E: From<Error>>(
        &self,
        max_bytes_in_flight: u64,
        f: impl FnMut(Tensor) -> Result<(), E>,
    ) -> Result<(), E> {
        stream(self, max_bytes_in_flight, self.stream_readers(), f)
    }

    /// The reader threads of a stream: a load's reads in flight, at most
    /// one per tensor.
    fn stream_readers(&self) -> usize {
        let inner = self.inner();
        let sources = inner.files.iter().map(|f| f.source());
        let (concurrency, _) = inner.opts.io_defaults(sources);
        concurrency.start.min(inner.tensors.len())
    }
}

/// Streams `ck` to `f` with `readers` reader threads asked for (0: the
/// calling thread reads everything).
fn stream<X, E: From<Error>>(
    ck: &Checkpoint<X>,
    cap: u64,
    readers: usize,
    mut f: impl FnMut(Tensor) -> Result<(), E>,
) -> Result<(), E> {
    let (inner, tensors) = (ck.inner(), &ck.inner().tensors);
    let budget = Arc::new(Budget::new(cap, tensors.len()));
    let total: u64 = tensors.iter().map(|t| t.nbytes).sum();
    let progress = inner.opts.progress.as_ref();
    let meter = Meter::new(progress, Phase::Stream, total, inner.files.len());
    // Borrowed by the readers: what is left in it when the stream stops
    // early is dropped on return, giving its bytes back.
    let arrivals = Arrivals::default();
    let reader = |_| {
        while let Some((index, info, lease)) = budget.claim(tensors) {
            let result = read_owned(ck, info, lease);
            if result.is_err() {
                budget.end_after(index);
            }
            arrivals.put(index, result);
        }
    };
    let consume = || -> Result<(), E> {
        // Stops the readers however this returns (a panic in `f` too).
        let _stop = StopOnDrop(&budget);
        for (index, info) in tensors.iter().enumerate() {
            // Read ahead; else, claimed by no reader (there may be none, or
            // they wait for bytes only `f` can give back), read here; else
            // being read.
            let next = match arrivals.take(index) {
                Some(result) => result,
                None => match budget.claim_now(index, info.nbytes) {
                    Some(lease) => read_owned(ck, info, lease),
                    None => arrivals.wait_for(index),
                },
            };
            let tensor = next?;
            let last_of_file = tensors.get(index + 1).is_none_or(|n| n.file != info.file);
            meter.add(info.nbytes);
            f(tensor)?;
            if last_of_file {
                meter.file_done();
            }
        }
        meter.finish();
        Ok(())
    };
    workers::beside(readers, READER_NAME, reader, consume).0
}

/// `info`'s bytes read into an allocation of their own, `lease` dropped
/// with it.
///
/// NOTE: one positional read by one reader per tensor: the readers work on
/// different tensors instead (BENCHMARKS.md, "checkpoint/stream.rs:
/// read_owned"). Not a view of a map: touched pages of a map stay resident
/// (`RssFile`, proc(5)) until the whole file is unmapped.
fn read_owned<X>(ck: &Checkpoint<X>, info: &TensorInfo, lease: Lease) -> Result<Tensor> {
    read_whole(ck.file_of(info)?, info, Some(Box::new(lease)))
}

/// The bytes lent out and the next tensor to lend, shared with every
/// tensor handed out (which may outlive the stream).
struct Budget {
    cap: u64,
    ledger: Mutex<Ledger>,
    /// Signalled when bytes come back or the stream stops.
    freed: Condvar,
}

struct Ledger {
    /// Bytes of the tensors claimed and not yet given back.
    in_flight: u64,
    /// The next tensor to claim, in file order.
    next: usize,
    /// One past the last tensor to claim.
    end: usize,
    /// The consumer is done (finished, failed, or unwinding).
    stopped: bool,
}

impl Ledger {
    /// Whether a tensor of `bytes` fits beside what is in flight, or nothing
    /// is in flight.
    fn admits(&self, bytes: u64, cap: u64) -> bool {
        self.in_flight == 0 || self.in_flight.saturating_add(bytes) <= cap
    }

    /// Claims the next tensor, of `bytes`.
    fn take(&mut self, bytes: u64) -> usize {
        self.in_flight = self.in_flight.saturating_add(bytes);
        self.next += 1;
        self.next - 1
    }
}

impl Budget {
    fn new(cap: u64, tensors: usize) -> Budget {
        Budget {
            cap,
            ledger: Mutex::new(Ledger {
                in_flight: 0,
                next: 0,
                end: tensors,
                stopped: false,
            }),
            freed: Condvar::new(),
        }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // Were it poisoned, the counts are whole (each update is one statement).
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// For a reader: the next tensor to read and its lease, once it fits;
    /// `None` when there is nothing left to claim or the stream stopped.
    fn claim<'t>(
        self: &Arc<Self>,
        tensors: &'t [TensorInfo],
    ) -> Option<(usize, &'t TensorInfo, Lease)> {
        let mut ledger = self.ledger();
        loop {
            if ledger.stopped || ledger.next >= ledger.end {
                return None;
            }
            let info = tensors.get(ledger.next)?;
            if ledger.admits(info.nbytes, self.cap) {
                let index = ledger.take(info.nbytes);
                return Some((index, info, self.lease(info.nbytes)));
            }
            ledger = self
                .freed
                .wait(ledger)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// For the consumer, which needs tensor `index` (of `bytes`) now: its
    /// lease past the cap, if no reader has claimed it (what is in flight is
    /// then all `f`'s, so waiting for room could wait forever).
    fn claim_now(self: &Arc<Self>, index: usize, bytes: u64) -> Option<Lease> {
        let mut ledger = self.ledger();
        if ledger.next != index || index >= ledger.end {
            return None;
        }
        ledger.take(bytes);
        Some(self.lease(bytes))
    }

    fn lease(self: &Arc<Self>, bytes: u64) -> Lease {
        Lease {
            budget: Arc::clone(self),
            bytes,
        }
    }

    /// No tensor after `index` is claimed.
    fn end_after(&self, index: usize) {
        let mut ledger = self.ledger();
        ledger.end = ledger.end.min(index + 1);
    }

    /// Stops the readers, waking those that wait for room.
    fn stop(&self) {
        self.ledger().stopped = true;
        self.freed.notify_all();
    }
}

/// The bytes of one claimed tensor, given back when the tensor's storage
/// (or a failed read) drops it.
struct Lease {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        {
            let mut ledger = self.budget.ledger();
            ledger.in_flight = ledger.in_flight.saturating_sub(self.bytes);
        }
        self.budget.freed.notify_all();
    }
}

/// Stops the budget's readers when dropped.
struct StopOnDrop<'a>(&'a Budget);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Tensors read ahead, by index, until the consumer takes them.
#[derive(Default)]
struct Arrivals {
    ready: Mutex<BTreeMap<usize, Result<Tensor>>>,
    /// Signalled when a tensor arrives, for the consumer.
    arrived: Condvar,
}

impl Arrivals {
    fn ready(&self) -> MutexGuard<'_, BTreeMap<usize, Result<Tensor>>> {
        self.ready.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, index: usize, result: Result<Tensor>) {
        self.ready().insert(index, result);
        self.arrived.notify_all();
    }

    fn take(&self, index: usize) -> Option<Result<Tensor>> {
        self.ready().remove(&index)
    }

    /// Waits for tensor `index`, which a reader has claimed and so will put.
    fn wait_for(&self, index: usize) -> Result<Tensor> {
        let mut ready = self.ready();
        loop {
            if let Some(result) = ready.remove(&index) {
                return result;
            }
            ready = self
                .arrived
                .wait(ready)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::mpsc;
    use std::time::Duration;

    use safetensors::Dtype;

    fn info(nbytes: u64) -> TensorInfo {
        TensorInfo {
            name: format!("t{nbytes}").into(),
            dtype: Dtype::U8,
            shape: vec![nbytes as usize],
            file: 0,
            offset: 0,
            nbytes,
            path: Arc::from(Path::new("")),
        }
    }

    fn ledger(in_flight: u64) -> Ledger {
        Ledger {
            in_flight,
            next: 0,
            end: 1,
            stopped: false,
        }
    }

    #[test]
    fn a_tensor_is_admitted_where_it_fits_or_where_nothing_is_in_flight() {
        assert!(ledger(0).admits(10, 10));
        assert!(ledger(4).admits(6, 10));
        assert!(!ledger(4).admits(7, 10));
        // Larger than the cap: alone.
        assert!(ledger(0).admits(11, 10));
        assert!(!ledger(1).admits(11, 10));
        // Empty tensors always fit.
        assert!(ledger(10).admits(0, 10));
    }

    #[test]
    fn a_claim_waits_until_a_lease_is_dropped_and_a_stop_wakes_it() {
        let tensors = [info(6), info(6), info(6)];
        let budget = Arc::new(Budget::new(10, tensors.len()));
        let (index, _, first) = budget.claim(&tensors).unwrap();
        assert_eq!(index, 0);
        let (sent, got) = mpsc::channel();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let second = budget.claim(&tensors);
                sent.send(second.as_ref().map(|(i, _, l)| (*i, l.bytes)))
                    .unwrap();
                // The third does not fit beside the second: waits, until
                // the stop.
                let third = budget.claim(&tensors);
                sent.send(third.as_ref().map(|(i, _, l)| (*i, l.bytes)))
                    .unwrap();
            });
            let waited = got.recv_timeout(Duration::from_millis(100));
            assert!(waited.is_err(), "claimed beyond the cap: {waited:?}");
            drop(first);
            assert_eq!(got.recv().unwrap(), Some((1, 6)));
            assert_eq!(budget.ledger().in_flight, 6, "the first came back");
            let waited = got.recv_timeout(Duration::from_millis(100));
            assert!(waited.is_err(), "claimed beyond the cap: {waited:?}");
            budget.stop();
            assert_eq!(got.recv().unwrap(), None);
        });
    }

    #[test]
    fn the_consumer_claims_its_next_tensor_past_the_cap_unless_a_reader_has() {
        let tensors = [info(8), info(8), info(8)];
        let budget = Arc::new(Budget::new(10, tensors.len()));
        let (_, _, kept) = budget.claim(&tensors).unwrap();
        // Tensor 0 is kept by the callback; tensor 1 does not fit beside it.
        let second = budget.claim_now(1, 8).unwrap();
        assert_eq!(budget.ledger().in_flight, 16);
        // Not the next one, or already claimed: no.
        assert!(budget.claim_now(1, 8).is_none());
        assert!(budget.claim_now(0, 8).is_none());
        drop((kept, second));
        assert_eq!(budget.ledger().in_flight, 0);
        budget.end_after(1);
        assert!(budget.claim(&tensors).is_none(), "nothing past a failure");
    }

    /// A checkpoint of a few tensors of uneven sizes, one file.
    fn checkpoint(dir: &std::path::Path) -> (Checkpoint, Vec<Vec<u8>>) {
        let data: Vec<Vec<u8>> = [5usize, 0, 4096, 3, 70_000]
            .iter()
            .enumerate()
            .map(|(i, &len)| (0..len).map(|b| (b * 7 + i) as u8).collect())
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = data
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let view = safetensors::tensor::TensorView::new(Dtype::U8, vec![d.len()], d);
                (format!("t{i}"), view.unwrap())
            })
            .collect();
        let path = dir.join("model.safetensors");
        safetensors::serialize_to_file(views, None, &path).unwrap();
        (
            crate::Loader::<crate::extras::NoExtras>::new()
                .open(&path)
                .unwrap(),
            data,
        )
    }

    #[test]
    fn with_no_reader_the_calling_thread_reads_every_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let (ck, data) = checkpoint(dir.path());
        for cap in [0, 1, 4096, u64::MAX] {
            let ck = ck.clone();
            // On a thread of its own, so that a consumer waiting for a
            // reader that does not exist fails the test instead of hanging.
            let (sent, got) = mpsc::channel();
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut kept = Vec::new();
                let result = stream(&ck, cap, 0, |t| -> Result<()> {
                    seen.push(t.as_bytes().to_vec());
                    // Keeping every one: the stream must go on anyway.
                    kept.push(t);
                    Ok(())
                });
                sent.send(result.map(|()| seen)).unwrap();
            });
            let seen = got.recv_timeout(Duration::from_secs(30)).unwrap();
            assert_eq!(seen.unwrap(), data, "cap {cap}");
        }
    }
}
