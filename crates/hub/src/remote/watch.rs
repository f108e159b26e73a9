//! What bounds a remote request: a pace it must keep (a request that moves less than 64 KiB in 10 s has stalled) and the load's cancel flags; either ends it by dropping it (its connection closed), never by waiting for it.
//!
//! [`IoRuntime::request`](super::store::IoRuntime::request) polls each request and, every
//! 20 ms, the flags and the bytes its body moved ([`Moved`]).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use crate::cancel::Cancel;

/// How often a request's flags and progress are looked at.
const TICK: Duration = Duration::from_millis(20);

/// The variable that sets the stall window, in seconds.
pub(crate) const STALL_VAR: &str = "SAFELOAD_REMOTE_STALL_SECS";

/// The pace every request must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pace {
    /// A request that moves less than [`floor`](Self::floor) bytes within this has stalled.
    pub window: Duration,
    pub floor: u64,
    /// Stalls of one read retried (from the byte it reached) before it fails.
    pub retries: usize,
}

impl Default for Pace {
    /// NOTE: 64 KiB in 10 s is far below any link a checkpoint is loaded over, and above
    /// a server that drips bytes to hold a connection; one retry lets a request stuck
    /// behind a dead connection go again on a fresh one.
    fn default() -> Pace {
        Pace {
            window: Duration::from_secs(10),
            floor: 64 << 10,
            retries: 1,
        }
    }
}

impl Pace {
    /// The default, the window from `SAFELOAD_REMOTE_STALL_SECS` where it is positive.
    pub(crate) fn from_var(value: Option<&str>) -> Pace {
        let window = value
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64);
        Pace {
            window: window.unwrap_or(Pace::default().window),
            ..Pace::default()
        }
    }

    /// The words of a stall, for an error: what was not met.
    pub(crate) fn stall_words(&self, at: u64) -> String {
        let (kib, secs) = (self.floor >> 10, self.window.as_secs_f64());
        format!("stalled at byte {at}: less than {kib} KiB in {secs:.0} s ({STALL_VAR})")
    }
}

/// Why a request was dropped before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interrupt {
    /// The load's flags were set.
    Cancelled,
    /// It moved less than the pace asks; `moved` bytes of its body had arrived.
    Stalled { moved: u64 },
}

/// The bytes a request's body moved so far.
pub(crate) type Moved = Arc<AtomicU64>;

/// The fastest body this process received, in bytes a second (of those past
/// [`RATE_SAMPLE`]): what a waiter weighs another writer's pace against.
static BEST_RATE: AtomicU64 = AtomicU64::new(0);

/// The least body a rate is taken from: shorter ones measure the latency.
const RATE_SAMPLE: u64 = 1 << 20;

/// [`BEST_RATE`], where a request measured one.
pub(crate) fn best_rate() -> Option<u64> {
    Some(BEST_RATE.load(Ordering::Relaxed)).filter(|r| *r > 0)
}

/// Polls `request` until it ends, the flags are set or it stalls.
pub(crate) async fn watched<F: Future>(
    request: F,
    moved: &AtomicU64,
    pace: Pace,
    cancel: &Cancel,
) -> Result<F::Output, Interrupt> {
    let mut request = pin!(request);
    let mut tick = pin!(tokio::time::sleep(TICK));
    let start = Instant::now();
    let mut since = start;
    let mut mark = moved.load(Ordering::Relaxed);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = request.as_mut().poll(cx) {
            let body = moved.load(Ordering::Relaxed);
            let secs = start.elapsed().as_secs_f64();
            if body >= RATE_SAMPLE && secs > 0.0 {
                BEST_RATE.fetch_max((body as f64 / secs) as u64, Ordering::Relaxed);
            }
            return Poll::Ready(Ok(out));
        }
        while tick.as_mut().poll(cx).is_ready() {
            if cancel.is_set() {
                return Poll::Ready(Err(Interrupt::Cancelled));
            }
            let now = Instant::now();
            let seen = moved.load(Ordering::Relaxed);
            if seen.saturating_sub(mark) >= pace.floor {
                (since, mark) = (now, seen);
            } else if now.duration_since(since) >= pace.window {
                return Poll::Ready(Err(Interrupt::Stalled { moved: seen }));
            }
            tick.as_mut().reset(now + TICK);
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    fn pace(ms: u64) -> Pace {
        Pace {
            window: Duration::from_millis(ms),
            floor: 100,
            retries: 1,
        }
    }

    #[test]
    fn a_request_that_keeps_the_pace_ends_as_it_ends() {
        let moved = AtomicU64::new(0);
        let out = runtime().block_on(watched(
            async {
                for _ in 0..10 {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    moved.fetch_add(100, Ordering::Relaxed);
                }
                7
            },
            &moved,
            pace(100),
            &Cancel::default(),
        ));
        assert_eq!(out, Ok(7));
    }

    #[test]
    fn a_drip_below_the_floor_stalls_within_the_window() {
        let moved = AtomicU64::new(0);
        let start = std::time::Instant::now();
        let out = runtime().block_on(watched(
            async {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    moved.fetch_add(1, Ordering::Relaxed);
                }
            },
            &moved,
            pace(200),
            &Cancel::default(),
        ));
        let took = start.elapsed();
        assert!(
            matches!(out, Err(Interrupt::Stalled { moved }) if moved > 5),
            "{out:?}"
        );
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    #[test]
    fn a_set_flag_drops_the_request_within_a_tick() {
        let flag = Arc::new(AtomicBool::new(false));
        let cancel = Cancel::default().with_caller(Arc::clone(&flag));
        let moved = AtomicU64::new(0);
        let start = std::time::Instant::now();
        let setter = Arc::clone(&flag);
        let out = runtime().block_on(async {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                setter.store(true, Ordering::Relaxed);
            });
            watched(std::future::pending::<()>(), &moved, pace(60_000), &cancel).await
        });
        assert_eq!(out, Err(Interrupt::Cancelled));
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn the_window_is_the_variables() {
        assert_eq!(
            Pace::from_var(Some("2.5")).window,
            Duration::from_millis(2500)
        );
        for bad in [
            None,
            Some(""),
            Some("0"),
            Some("-3"),
            Some("x"),
            Some("inf"),
        ] {
            assert_eq!(Pace::from_var(bad), Pace::default(), "{bad:?}");
        }
    }
}
