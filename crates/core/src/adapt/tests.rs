//! The controller's tests: windows of reads at given rates, and where the count settles.

use super::*;

/// Feeds the controller reads whose throughput is `rate(readers)`.
fn drive(concurrency: Concurrency, rate: impl Fn(usize) -> f64) -> Settled {
    let control = Control::new(concurrency, 10_000);
    control.state.lock().unwrap().warmed = true;
    for _ in 0..40 {
        let n = control.allowed.load(Ordering::Acquire);
        window(&control, rate(n));
    }
    control.settled()
}

/// One window's worth of reads at `rate` GiB/s, the window's time passed.
fn window(control: &Control, rate: f64) {
    let n = control.allowed.load(Ordering::Acquire);
    {
        let mut state = control.state.lock().unwrap();
        state.start = Instant::now() - WINDOW;
        state.bytes = (rate * (1u64 << 30) as f64 * WINDOW.as_secs_f64()) as u64 - n as u64;
        state.reads = n - 1;
    }
    control.completed(n as u64);
}

#[test]
fn the_first_window_is_not_measured() {
    let control = Control::new(Concurrency::adaptive(8), 10_000);
    // The readers' start: slow, and not taken as the rate of 8 readers.
    window(&control, 0.01);
    assert!(control.settled().steps.is_empty());
    assert_eq!(control.allowed.load(Ordering::Acquire), 8);
    // The next window is the first measured one, and it doubles.
    window(&control, 1.0);
    let steps = control.settled().steps;
    assert_eq!(steps.len(), 1, "{steps:?}");
    assert_eq!(steps[0].0, 8);
    assert!((steps[0].1 - 1.0).abs() < 0.01, "{steps:?}");
    assert_eq!(control.allowed.load(Ordering::Acquire), 16);
}

#[test]
fn grows_while_throughput_rises_and_settles_where_it_stops() {
    // A mount serving 32 requests at once: throughput grows to 32 readers.
    let s = drive(Concurrency::adaptive(8), |n| n.min(32) as f64 * 0.05);
    assert_eq!(s.readers, 32, "{s:?}");
    assert_eq!(s.why, SettleReason::NoGain);
    assert_eq!(
        s.steps.iter().map(|&(n, _)| n).collect::<Vec<_>>(),
        [8, 16, 32, 64]
    );
    // A serialized mount: no doubling pays; back to the start.
    let s = drive(Concurrency::adaptive(12), |_| 0.3);
    assert_eq!((s.readers, s.why), (12, SettleReason::NoGain), "{s:?}");
    // Always more: up to the most allowed, then stop measuring.
    let s = drive(Concurrency::adaptive(8), |n| n as f64);
    assert_eq!(
        (s.readers, s.why),
        (MAX_READERS, SettleReason::Max),
        "{s:?}"
    );
    // Converting loads stop at 16.
    let s = drive(Concurrency::adaptive(8).converting(), |n| n as f64);
    assert_eq!(
        (s.readers, s.why),
        (MAX_CONVERTING_READERS, SettleReason::Max)
    );
    // Pinned: never moves.
    let s = drive(Concurrency::pinned(5), |n| n as f64);
    assert_eq!(
        (s.readers, s.why, s.steps.len()),
        (5, SettleReason::Pinned, 0)
    );
}

#[test]
fn a_short_run_says_so_and_waiting_readers_leave() {
    let control = Control::new(Concurrency::adaptive(2), 100);
    assert!(control.wait_turn(0));
    assert!(control.wait_turn(1));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| control.wait_turn(5));
        std::thread::sleep(Duration::from_millis(20));
        control.finish();
        assert!(
            !waiter.join().unwrap(),
            "a finished run lets waiting readers go"
        );
    });
    let settled = control.settled();
    assert_eq!((settled.readers, settled.why), (2, SettleReason::Ended));
    // Nothing measured (the report's words of it: report::ConcurrencyReason::of).
    assert!(settled.steps.is_empty(), "{settled:?}");
    // Never more readers than jobs.
    assert_eq!(Control::new(Concurrency::adaptive(8), 3).max(), 3);
}
