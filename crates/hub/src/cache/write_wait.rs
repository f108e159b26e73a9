//! A write that finds another process writing the same file (its lock held): waiting for that writer, taking what it publishes, or giving up and fetching the file itself once waiting would take longer.
//!
//! The writer's lock says it lives, its file changing every second (its
//! heartbeat) that it runs; waiting is bounded by what fetching would take.

use std::fs::File;
use std::time::{Duration, Instant};

use super::partial::{Activity, PIECE};
use super::{TempFile, Write};
use crate::remote::watch::{Pace, STALL_VAR, best_rate};
use crate::source::NotCached;

/// How often a write waiting for another process's lock looks again.
const LOCK_POLL: Duration = Duration::from_millis(50);

/// The rate a waiter takes its own fetch to run at before one was measured, in bytes a second.
///
/// NOTE: an assumption, not a measurement: a hub or store link slower than
/// this makes a waiter wait longer than fetching would take, never shorter.
const ASSUMED_RATE: u64 = 50 << 20;

/// How many times its own fetch a waiter waits for a writer.
///
/// NOTE: two processes fetching one file share one link: a waiter that gives up fetches
/// at half the rate it measured alone; four times leaves room for that and the check.
const PATIENCE: u32 = 4;

/// The least time a writer's pieces are watched before its pace is judged.
const MIN_SPAN: Duration = Duration::from_secs(1);

impl Write {
    /// The target's file to write, once no other process writes it: waits while another
    /// holds the lock at a pace that ends before fetching here would ([`Watch`]); takes
    /// what it published (`Err(Ok(file))`); gives up where it stalls, crawls, or at a cancel.
    pub(super) fn open_target(&self) -> Result<TempFile, Result<File, NotCached>> {
        let window = Pace::from_var(std::env::var(STALL_VAR).ok().as_deref()).window;
        let rate = best_rate().unwrap_or(ASSUMED_RATE);
        let seen = self.target.activity();
        let mut watch = Watch::new(seen, Instant::now(), self.len, window, rate);
        loop {
            match self.target.begin(self.len) {
                Err(NotCached::Locked) => {}
                Err(NotCached::PublishedElsewhere) => {
                    let published = self.target.published(self.len);
                    return Err(published.ok_or(NotCached::PublishedElsewhere));
                }
                other => return other.map_err(Err),
            }
            if self.cancel.is_set() {
                return Err(Err(NotCached::Cancelled));
            }
            if let Some(file) = self.target.published(self.len) {
                return Err(Ok(file));
            }
            if watch.see(self.target.activity(), Instant::now()) == Verdict::GiveUp {
                return Err(Err(NotCached::Locked));
            }
            std::thread::sleep(LOCK_POLL);
        }
    }
}

/// Whether to go on waiting for a writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Wait,
    GiveUp,
}

/// A writer in another process, as a waiter sees it: a pure judge of its activity.
#[derive(Debug)]
pub(super) struct Watch {
    len: u64,
    window: Duration,
    /// The wait ends here whatever the writer does: [`PATIENCE`] times the own fetch, and a window.
    deadline: Instant,
    seen: Activity,
    /// When the writer was last seen to change.
    changed: Instant,
    /// When its record was first seen to grow, and the pieces it listed then.
    growing: Option<(Instant, u64)>,
}

impl Watch {
    pub(super) fn new(
        seen: Activity,
        now: Instant,
        len: u64,
        window: Duration,
        rate: u64,
    ) -> Watch {
        let own = Duration::from_secs_f64(len as f64 / rate.max(1) as f64);
        Watch {
            len,
            window,
            deadline: now + window + own * PATIENCE,
            seen,
            changed: now,
            growing: None,
        }
    }

    /// What the writer's `activity` at `now` says.
    pub(super) fn see(&mut self, activity: Activity, now: Instant) -> Verdict {
        if activity != self.seen {
            if activity.pieces() > self.seen.pieces() && self.growing.is_none() {
                self.growing = Some((now, activity.pieces()));
            }
            (self.seen, self.changed) = (activity, now);
        }
        if now.duration_since(self.changed) > self.window || now > self.deadline {
            return Verdict::GiveUp;
        }
        if activity.complete(self.len) {
            // Every piece in: its check, then its publishing.
            return Verdict::Wait;
        }
        let Some((since, first)) = self.growing else {
            return Verdict::Wait;
        };
        let span = now.duration_since(since);
        if span < MIN_SPAN {
            return Verdict::Wait;
        }
        let rate = (activity.pieces() - first) as f64 * PIECE as f64 / span.as_secs_f64();
        let left = self.len.saturating_sub(activity.pieces() * PIECE) as f64;
        // A rate of 0 makes infinity (or NaN): no end in sight.
        let ends = Duration::try_from_secs_f64(left / rate).unwrap_or(Duration::MAX);
        match now.checked_add(ends) {
            Some(end) if end <= self.deadline => Verdict::Wait,
            _ => Verdict::GiveUp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A writer's activity with `pieces` recorded, its file changed at `beat` seconds.
    fn activity(pieces: u64, beat: u64) -> Activity {
        Activity::of(
            24 + pieces * 24,
            std::time::UNIX_EPOCH + Duration::from_secs(beat),
        )
    }

    #[test]
    fn a_writer_that_beats_but_has_not_begun_is_waited_for_until_the_deadline() {
        let t0 = Instant::now();
        // 64 MiB at 64 MiB/s: one second's fetch, four times, and a window of 10 s.
        let mut watch = Watch::new(
            activity(0, 0),
            t0,
            64 * MIB,
            Duration::from_secs(10),
            64 * MIB,
        );
        for s in 1..14 {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(watch.see(activity(0, s), at), Verdict::Wait, "{s} s");
        }
        let late = t0 + Duration::from_secs(15);
        assert_eq!(watch.see(activity(0, 15), late), Verdict::GiveUp);
    }

    #[test]
    fn a_writer_that_stops_changing_is_given_up_after_a_window() {
        let t0 = Instant::now();
        let mut watch = Watch::new(activity(0, 0), t0, 1 << 40, Duration::from_secs(10), MIB);
        assert_eq!(
            watch.see(activity(3, 0), t0 + Duration::from_secs(5)),
            Verdict::Wait
        );
        let stopped = t0 + Duration::from_secs(16);
        assert_eq!(watch.see(activity(3, 0), stopped), Verdict::GiveUp);
    }

    #[test]
    fn a_crawling_writer_is_given_up_once_its_pace_is_seen_and_a_fast_one_is_not() {
        let t0 = Instant::now();
        let window = Duration::from_secs(10);
        // 256 MiB, fetched here at 256 MiB/s: the deadline is 14 s away.
        let mut crawl = Watch::new(activity(0, 0), t0, 256 * MIB, window, 256 * MIB);
        let mut fast = Watch::new(activity(0, 0), t0, 256 * MIB, window, 256 * MIB);
        let mut gave_up = None;
        for tenth in 1..=100u64 {
            let at = t0 + Duration::from_millis(tenth * 100);
            // One piece every 3 s (0.3 MiB/s), and 40 MiB/s.
            let slow = crawl.see(activity(tenth / 30, tenth / 10), at);
            if slow == Verdict::GiveUp && gave_up.is_none() {
                gave_up = Some(tenth);
            }
            let quick = fast.see(activity((tenth * 4).min(256), tenth / 10), at);
            assert_eq!(quick, Verdict::Wait, "at {tenth}");
        }
        let gave_up = gave_up.expect("the crawler is given up");
        assert!(gave_up <= 70, "after {gave_up} tenths of a second");
    }

    #[test]
    fn a_complete_file_being_checked_is_waited_for() {
        let t0 = Instant::now();
        let mut watch = Watch::new(activity(0, 0), t0, 8 * MIB, Duration::from_secs(10), MIB);
        assert_eq!(
            watch.see(activity(2, 1), t0 + Duration::from_secs(1)),
            Verdict::Wait
        );
        for s in 2..30 {
            let at = t0 + Duration::from_secs(s);
            assert_eq!(watch.see(activity(8, s), at), Verdict::Wait, "{s} s");
        }
    }
}
