//! The bandwidth cap: a test server's link as a schedule of transmissions, one after another at
//! a fixed rate; pure arithmetic on instants the caller passes in. Shared by the FUSE test
//! filesystem (a mount's `READ` answers) and the HTTP test server (`testhttp/`, which includes
//! this file by path: one model of a link, no crate of its own for one file).
//!
//! Each answer books the link for its bytes, from when the link is free (or from now, if it
//! idles), and may leave only when its last byte has crossed. Transmissions never overlap, so
//! the bytes answered in any window of `w` seconds are at most `rate * w` plus the one answer
//! whose transmission began before the window (at most one answer: a `READ` of 1 MiB, or an
//! HTTP body chunk of 64 KiB). An idle link
//! saves no credit: a burst after a pause is paced like any other, as on a real link where
//! each byte takes its time to cross.

use std::time::{Duration, Instant};

/// A link carrying `bytes_per_sec`, shared by every worker of a server (a mount's read
/// workers, an HTTP server's connections).
#[derive(Debug)]
pub(crate) struct Link {
    bytes_per_sec: u64,
    /// When the last transmission booked so far ends.
    free_at: Option<Instant>,
}

impl Link {
    /// A link of `bytes_per_sec` (at least 1).
    pub(crate) fn new(bytes_per_sec: u64) -> Self {
        Self {
            bytes_per_sec: bytes_per_sec.max(1),
            free_at: None,
        }
    }

    /// How long `bytes` take to cross, rounded up to the nanosecond so that rounding never
    /// lets the link carry more than its rate.
    pub(crate) fn transfer_time(&self, bytes: u64) -> Duration {
        let nanos = (u128::from(bytes) * 1_000_000_000).div_ceil(u128::from(self.bytes_per_sec));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// Books the link for `bytes` asked at `now`; returns when the last of them has crossed,
    /// the moment the answer may leave.
    pub(crate) fn reserve(&mut self, now: Instant, bytes: u64) -> Instant {
        let start = match self.free_at {
            Some(free_at) if free_at > now => free_at,
            _ => now,
        };
        let end = start + self.transfer_time(bytes);
        self.free_at = Some(end);
        end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn transfer_time_is_bytes_over_rate() {
        let link = Link::new(128 * MIB);
        assert_eq!(link.transfer_time(128 * MIB), Duration::from_secs(1));
        assert_eq!(link.transfer_time(MIB), Duration::from_nanos(7_812_500));
        assert_eq!(link.transfer_time(0), Duration::ZERO);
        // Rounded up: 1 byte at 3 B/s is 333,333,333.3 ns.
        assert_eq!(
            Link::new(3).transfer_time(1),
            Duration::from_nanos(333_333_334)
        );
    }

    #[test]
    fn a_busy_link_carries_exactly_its_rate() {
        let t0 = Instant::now();
        let mut link = Link::new(64 * MIB);
        let ends: Vec<_> = (0..64).map(|_| link.reserve(t0, MIB)).collect();
        assert_eq!(ends[0], t0 + Duration::from_micros(15_625));
        assert_eq!(ends[63], t0 + Duration::from_secs(1));
    }

    #[test]
    fn an_idle_link_starts_now_a_busy_one_queues() {
        let t0 = Instant::now();
        let mut link = Link::new(MIB);
        let ms = Duration::from_millis;
        assert_eq!(link.reserve(t0, MIB / 2), t0 + ms(500));
        // Asked while the first is crossing: after it.
        assert_eq!(link.reserve(t0 + ms(100), MIB / 2), t0 + ms(1000));
        // Asked after a pause: no saved credit, it takes its full time from now.
        assert_eq!(link.reserve(t0 + ms(5000), MIB), t0 + ms(6000));
    }

    /// Many workers asking at scattered moments: over every window between two answers, the
    /// bytes answered stay within the rate plus one request.
    #[test]
    fn answers_never_exceed_the_rate_over_any_window() {
        let rate = 100 * MIB;
        let t0 = Instant::now();
        let mut link = Link::new(rate);
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut asked = t0;
        let mut answers = Vec::new();
        let mut total = 0;
        for _ in 0..2000 {
            // Up to 2 ms between requests, 4 KiB to 1 MiB each.
            asked += Duration::from_micros(next() % 2000);
            let bytes = 4096 + next() % (MIB - 4096 + 1);
            answers.push((link.reserve(asked, bytes), bytes));
            total += bytes;
        }
        assert!(answers.windows(2).all(|w| w[0].0 <= w[1].0));
        for i in 0..answers.len() {
            let mut bytes = 0;
            for answer in &answers[i..] {
                bytes += answer.1;
                let window = answer.0 - answers[i].0;
                let allowed = rate as f64 * window.as_secs_f64() + MIB as f64 + 1.0;
                assert!(bytes as f64 <= allowed, "{bytes} bytes in {window:?}");
            }
        }
        // Overall too: everything took at least its time at the rate.
        let first_asked = answers[0].0 - link.transfer_time(answers[0].1);
        assert!(answers.last().unwrap().0 - first_asked >= link.transfer_time(total));
    }
}
