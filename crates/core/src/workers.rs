//! The one bounded worker pool: threads of the crate's own for work that blocks on storage (opening files, reads, prefetch streams), each a drain of a shared queue.
//!
//! Blocking reads do not run in the caller's rayon pool, where a slow mount
//! would starve the process's CPU work. Each worker drains a shared queue,
//! so when the OS refuses a thread (`RLIMIT_NPROC`, a cgroup's `pids.max`)
//! the threads that did start, at least the calling one, do all the work.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::error::Result;

/// How many workers ran a `run` call, and why fewer than asked.
#[derive(Debug)]
pub struct Started {
    /// Workers asked for.
    pub requested: usize,
    /// Workers that ran, the calling thread included (at least 1).
    pub started: usize,
    /// Why the OS refused the first thread it refused, if any.
    pub refused: Option<io::Error>,
}

/// Runs `work(i)` on `workers` threads, `i` in `0..workers`, the calling
/// thread being worker 0, and returns when all are done. A thread the OS
/// refuses is not retried and no later one is asked for.
pub(crate) fn run(workers: usize, name: &str, work: impl Fn(usize) + Sync) -> Started {
    beside(workers.max(1) - 1, name, &work, || work(0)).1
}

/// Runs `main` on the calling thread (it needs neither `Send` nor `Sync`)
/// while `helpers` threads run `work(i)`, `i` in `1..=helpers`, and returns
/// `main`'s result when all are done. `main` must not wait on work only a
/// helper would do: the OS may have refused every one of them.
pub(crate) fn beside<R>(
    helpers: usize,
    name: &str,
    work: impl Fn(usize) + Sync,
    main: impl FnOnce() -> R,
) -> (R, Started) {
    let mut started = Started {
        requested: helpers.saturating_add(1),
        started: 1,
        refused: None,
    };
    if helpers == 0 {
        return (main(), started);
    }
    let work = &work;
    let result = std::thread::scope(|scope| {
        for i in 1..=helpers {
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn_scoped(scope, move || work(i));
            match spawned {
                Ok(_) => started.started += 1,
                Err(e) => {
                    started.refused = Some(e);
                    break;
                }
            }
        }
        main()
    });
    (result, started)
}

/// Runs `f` over `items` with at most `width` at once, on the pool's
/// threads, pulling from one cursor so that uneven items keep every worker
/// busy. Results keep the items' order; on failure, the error of the
/// earliest failed item, and no item is started after a failure.
pub fn map<T: Sync, R: Send>(
    items: &[T],
    width: usize,
    name: &str,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<(Vec<R>, Started)> {
    let slots: Vec<Mutex<Option<Result<R>>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let cursor = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let width = width.clamp(1, items.len().max(1));
    let started = run(width, name, |_| {
        while !failed.load(Ordering::Relaxed) {
            let i = cursor.fetch_add(1, Ordering::Relaxed);
            let (Some(item), Some(slot)) = (items.get(i), slots.get(i)) else {
                break;
            };
            let result = f(item);
            if result.is_err() {
                failed.store(true, Ordering::Relaxed);
            }
            if let Ok(mut slot) = slot.lock() {
                *slot = Some(result);
            }
        }
    });
    let mut out = Vec::with_capacity(items.len());
    for slot in slots {
        match slot.into_inner().ok().flatten() {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => return Err(e),
            None => {} // skipped after a failure, which is returned above
        }
    }
    Ok((out, started))
}

/// The number of workers to use by default: the machine's parallelism, or
/// the current rayon pool's size when called from inside one (so that
/// `pool.install(..)` bounds it).
///
/// NOTE: `rayon::current_num_threads` outside a pool would create rayon's
/// global pool, which panics when the OS refuses its threads.
pub fn default_width() -> usize {
    if rayon::current_thread_index().is_some() {
        rayon::current_num_threads()
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, ErrorKind};

    #[test]
    fn every_worker_runs_once() {
        let seen = Mutex::new(Vec::new());
        let started = run(4, "test", |i| seen.lock().unwrap().push(i));
        assert_eq!(started.started, 4);
        assert!(started.refused.is_none());
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, [0, 1, 2, 3]);
    }

    #[test]
    fn beside_runs_main_on_the_calling_thread_with_the_helpers() {
        let caller = std::thread::current().id();
        let helpers = Mutex::new(Vec::new());
        // Not `Send`: only the calling thread may touch it.
        let local = std::rc::Rc::new(std::cell::Cell::new(0));
        let (out, started) = beside(
            3,
            "test",
            |i| {
                assert_ne!(std::thread::current().id(), caller);
                helpers.lock().unwrap().push(i);
            },
            || {
                local.set(local.get() + 1);
                std::thread::current().id()
            },
        );
        assert_eq!(out, caller);
        assert_eq!((started.requested, started.started, local.get()), (4, 4, 1));
        let mut helpers = helpers.into_inner().unwrap();
        helpers.sort();
        assert_eq!(helpers, [1, 2, 3]);
    }

    #[test]
    fn map_keeps_order_and_returns_the_earliest_error() {
        let items: Vec<usize> = (0..100).collect();
        let (out, started) = map(&items, 7, "test", |&i| Ok(i * 2)).unwrap();
        assert_eq!(started.started, 7);
        assert_eq!(out, items.iter().map(|i| i * 2).collect::<Vec<_>>());

        let err = map(&items, 1, "test", |&i| {
            if i >= 10 {
                Err(Error::without_path(ErrorKind::Io {
                    operation: crate::Operation::Read,
                    offset: Some(i as u64),
                }))
            } else {
                Ok(i)
            }
        })
        .unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::Io {
                operation: crate::Operation::Read,
                offset: Some(10)
            }
        );
        assert!(
            map(&[] as &[usize], 4, "test", |&i| Ok(i))
                .unwrap()
                .0
                .is_empty()
        );
    }
}
