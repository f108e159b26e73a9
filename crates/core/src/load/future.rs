//! The async forms of `Loader`'s entry points: a blocking load or open run on a thread of the crate's own, its answer handed to a future through a oneshot; dropping the future unfinished cancels the work.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::thread;

use futures_channel::oneshot;

use crate::checkpoint::Checkpoint;
use crate::error::{Error, Operation, Result};
use crate::state_dict::StateDict;

use super::Loader;

impl<X: 'static> Loader<X> {
    /// [`load`](Self::load) as a future that never blocks the executor
    /// polling it: the load runs on a thread of the crate's own
    /// (`safeload-async`, started at the first poll), with no particular
    /// runtime and no `spawn_blocking` needed.
    ///
    /// Dropping the future before it completes cancels the load as
    /// [`cancel_on`](Self::cancel_on) does, without waiting for its threads.
    /// A load cancelled by the loader's flag resolves to
    /// [`ErrorKind::Cancelled`](crate::ErrorKind::Cancelled); where the OS
    /// refuses the thread, to an [`ErrorKind::Io`](crate::ErrorKind::Io)
    /// error (operation [`Open`](crate::Operation::Open)).
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("model.safetensors");
    /// # let view = safetensors::tensor::TensorView::new(safetensors::Dtype::U8, vec![4], &[1, 2, 3, 4])?;
    /// # safetensors::serialize_to_file([("w", view)], None, &path)?;
    /// # fn block_on<F: std::future::Future>(future: F) -> F::Output {
    /// #     struct Unpark(std::thread::Thread);
    /// #     impl std::task::Wake for Unpark {
    /// #         fn wake(self: std::sync::Arc<Self>) {
    /// #             self.0.unpark();
    /// #         }
    /// #     }
    /// #     let waker = std::sync::Arc::new(Unpark(std::thread::current())).into();
    /// #     let mut cx = std::task::Context::from_waker(&waker);
    /// #     let mut future = std::pin::pin!(future);
    /// #     loop {
    /// #         if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
    /// #             return out;
    /// #         }
    /// #         std::thread::park();
    /// #     }
    /// # }
    /// // Any executor polls them (tokio's `Runtime::block_on` alike): here a
    /// // minimal `block_on` that parks the thread until the load wakes it.
    /// let loader = safeload::Loader::new().disable_mmap(true);
    /// let sd = block_on(async { loader.load_async(&path).await })?;
    /// assert_eq!(sd.get("w").unwrap().as_bytes(), [1, 2, 3, 4]);
    /// let ck = block_on(loader.open_async(&path))?;
    /// assert_eq!(ck.get("w").unwrap().shape(), [4]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load_async(
        &self,
        path: impl AsRef<Path>,
    ) -> impl Future<Output = Result<StateDict>> + Send + 'static {
        let path = path.as_ref().to_path_buf();
        let (loader, stop) = self.stopped_by_drop();
        InBackground::new(path.clone(), stop, move || loader.load(&path))
    }

    /// [`open`](Self::open) as a future that never blocks the executor
    /// polling it, as [`load_async`](Self::load_async) (whose example opens
    /// too). It checks the loader's flag only when it starts: an open whose
    /// future was dropped runs to its end on its thread, which then drops
    /// the checkpoint.
    pub fn open_async(
        &self,
        path: impl AsRef<Path>,
    ) -> impl Future<Output = Result<Checkpoint<X>>> + Send + 'static {
        let path = path.as_ref().to_path_buf();
        let (loader, stop) = self.stopped_by_drop();
        InBackground::new(path.clone(), stop, move || loader.open(&path))
    }

    /// This loader, also cancelled by a flag of its own (for the future to
    /// set when dropped), and that flag.
    fn stopped_by_drop(&self) -> (Loader<X>, Arc<AtomicBool>) {
        let stop = Arc::new(AtomicBool::new(false));
        let mut loader = self.clone();
        loader.opts.cancel = std::mem::take(&mut loader.opts.cancel).with_drop(Arc::clone(&stop));
        (loader, stop)
    }
}

/// The name of the thread each async load runs on.
const THREAD_NAME: &str = "safeload-async";

/// The blocking call a future stands for.
type Work<T> = Box<dyn FnOnce() -> Result<T> + Send>;

/// What the thread hands back: the call's result, or the panic that ended it.
type Answer<T> = thread::Result<Result<T>>;

/// A blocking call (`work`) run on a thread of its own from the first poll;
/// where the future was dropped by the time it ends, its result is dropped
/// on that thread. Dropping the future unfinished sets `stop`, the flag the
/// work checks ([`Cancel`](crate::cancel::Cancel)). Polled again after it
/// completed, it stays pending (as `futures::future::Fuse` does).
///
/// NOTE: one thread per async load rather than a pool: a load is rare and
/// long beside a thread's start, and a pool would keep threads between
/// loads (BENCHMARKS.md, "load/future.rs: InBackground").
pub(crate) struct InBackground<T> {
    /// The checkpoint's path, for the error where no thread could start.
    path: PathBuf,
    /// The call, until the first poll starts its thread.
    work: Option<Work<T>>,
    /// The answer to come, while the thread runs.
    answer: Option<oneshot::Receiver<Answer<T>>>,
    stop: Arc<AtomicBool>,
}

impl<T: Send + 'static> InBackground<T> {
    /// A future of `work` (the load of `path`), which checks `stop`.
    pub(crate) fn new(
        path: PathBuf,
        stop: Arc<AtomicBool>,
        work: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> InBackground<T> {
        InBackground {
            path,
            work: Some(Box::new(work)),
            answer: None,
            stop,
        }
    }

    /// Starts `work` on its thread.
    fn start(&mut self, work: Work<T>) -> Result<()> {
        let (tell, answer) = oneshot::channel();
        thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                // A panic is resumed in the task that awaits it.
                let result = panic::catch_unwind(AssertUnwindSafe(work));
                // Refused where the future is gone: the result is dropped here.
                drop(tell.send(result));
            })
            .map_err(|e| Error::io(Operation::Open, &self.path, None, e))?;
        self.answer = Some(answer);
        Ok(())
    }
}

impl<T: Send + 'static> Future for InBackground<T> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        // Every field is `Unpin`: nothing here is pinned in place.
        let this = self.get_mut();
        if let Some(work) = this.work.take() {
            if let Err(refused) = this.start(work) {
                return Poll::Ready(Err(refused));
            }
        }
        let Some(answer) = this.answer.as_mut() else {
            return Poll::Pending;
        };
        let answer = match Pin::new(answer).poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(answer) => answer,
        };
        this.answer = None;
        match answer {
            Ok(Ok(result)) => Poll::Ready(result),
            Ok(Err(panicked)) => panic::resume_unwind(panicked),
            // Not reached: the thread always answers (a panic caught).
            Err(oneshot::Canceled) => Poll::Pending,
        }
    }
}

impl<T> Drop for InBackground<T> {
    fn drop(&mut self) {
        if self.answer.is_some() {
            self.stop.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, mpsc};
    use std::task::{Wake, Waker};
    use std::time::Duration;

    use super::*;
    use crate::error::ErrorKind;

    /// Wakes by sending on a channel, so a test can wait for a wake-up.
    struct Signal(Mutex<mpsc::Sender<()>>);

    impl Wake for Signal {
        fn wake(self: Arc<Self>) {
            if let Ok(tell) = self.0.lock() {
                let _ = tell.send(());
            }
        }
    }

    /// Polls `future` to its end, waiting for wake-ups between polls; the
    /// number of polls that returned `Pending`.
    fn block_on<F: Future + Unpin>(mut future: F) -> (F::Output, usize) {
        let (tell, woken) = mpsc::channel();
        let waker = Arc::new(Signal(Mutex::new(tell))).into();
        let mut cx = Context::from_waker(&waker);
        let mut pending = 0;
        loop {
            if let Poll::Ready(out) = Pin::new(&mut future).poll(&mut cx) {
                return (out, pending);
            }
            pending += 1;
            woken.recv_timeout(Duration::from_secs(10)).unwrap();
        }
    }

    #[test]
    fn the_work_runs_on_a_named_thread_of_its_own_and_the_first_poll_does_not_wait() {
        let (go, wait) = mpsc::channel::<()>();
        let stop = Arc::new(AtomicBool::new(false));
        let mut future = InBackground::new("/m".into(), stop, move || {
            wait.recv().unwrap();
            Ok(thread::current().name().map(str::to_string))
        });
        // The work waits for `go`, sent only after the first poll returned.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        go.send(()).unwrap();
        let (name, _) = block_on(future);
        assert_eq!(name.unwrap().as_deref(), Some(THREAD_NAME));
    }

    #[test]
    fn nothing_runs_until_polled() {
        let ran = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&ran);
        let future = InBackground::new("/m".into(), Arc::new(AtomicBool::new(false)), move || {
            seen.store(true, Ordering::Relaxed);
            Ok(())
        });
        drop(future);
        thread::sleep(Duration::from_millis(20));
        assert!(!ran.load(Ordering::Relaxed));
    }

    #[test]
    fn errors_come_back_as_they_are() {
        let future = InBackground::<()>::new("/m".into(), Arc::new(AtomicBool::new(false)), || {
            Err(Error::new(
                ErrorKind::TensorNotFound { tensor: "w".into() },
                "/m",
            ))
        });
        let (result, _) = block_on(future);
        let err = result.unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::TensorNotFound { tensor: "w".into() }
        );
    }

    #[test]
    fn dropping_it_unfinished_sets_the_flag_and_the_thread_drops_the_result() {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&stop);
        let (ended, end) = mpsc::channel();
        let mut future = InBackground::new("/m".into(), Arc::clone(&stop), move || {
            while !seen.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(1));
            }
            // Dropped on this thread once the future is gone.
            Ok(OnDrop(ended))
        });
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        drop(future);
        assert!(stop.load(Ordering::Relaxed));
        let dropped_on = end.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(dropped_on.as_deref(), Some(THREAD_NAME));
    }

    /// Says on which thread it was dropped.
    struct OnDrop(mpsc::Sender<Option<String>>);

    impl Drop for OnDrop {
        fn drop(&mut self) {
            let _ = self.0.send(thread::current().name().map(str::to_string));
        }
    }

    #[test]
    fn dropping_it_finished_sets_no_flag() {
        let stop = Arc::new(AtomicBool::new(false));
        let mut future = InBackground::new("/m".into(), Arc::clone(&stop), || Ok(7));
        let (out, _) = block_on(&mut future);
        assert_eq!(out.unwrap(), 7);
        // Polled again: pending, as a fused future.
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut future).poll(&mut cx).is_pending());
        drop(future);
        assert!(!stop.load(Ordering::Relaxed));
    }

    #[test]
    fn a_panic_of_the_work_is_resumed_where_it_is_awaited() {
        let future = InBackground::<()>::new("/m".into(), Arc::new(AtomicBool::new(false)), || {
            panic!("the load's own bug")
        });
        let caught = panic::catch_unwind(AssertUnwindSafe(|| block_on(future)));
        let payload = caught.unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"the load's own bug"));
    }
}
