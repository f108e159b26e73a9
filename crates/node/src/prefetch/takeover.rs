//! When a rank with nothing left to claim may take over a chunk another rank holds: the holder died, or made no progress for a few times a chunk's expected read time (at most 2 s).
//!
//! Each rank bumps its slot's heartbeat whenever one of its readers makes
//! progress (a claim, `WILLNEED` pages landing, each 2 MiB of a node copy's
//! chunk, a chunk done, every 2 ms poll of a waiting reader). A reader with
//! nothing free takes a chunk over, by one compare-and-swap, when its holder
//! is dead (`coord/owner.rs`), or when the holder's heartbeat has not moved
//! for `patience` and the claim was not itself taken over. That mark (bit
//! 62 of the word) means a chunk is taken over for lack of progress at most
//! once: a stopped rank's bytes are read at worst twice, and two slow ranks
//! cannot pass a chunk back and forth. A resumed holder's compare-and-swap to
//! done fails, which it ignores: the chunk is warm either way.
//!
//! Left to the 60 s stall guard (`worker.rs`): a holder without a slot (past
//! 256), a taker that stops too, and a live rank whose readers beat while one
//! waits on a read that never returns (taking that chunk would hang the
//! taker on the same storage).
//!
//! NOTE: a healthy holder must keep its chunks (its heartbeat is quiet for at
//! most one chunk read) and a stopped rank must cost seconds: the 500 ms floor
//! is a few times the longest gap measured between two chunks, 8 mean chunk
//! reads let the wait grow on slow storage, the 2 s cap bounds a stopped
//! rank's cost (BENCHMARKS.md, "prefetch/takeover.rs: the numbers"). A lone
//! busy reader needing over 2 s per chunk (under 4 MiB/s) may see it read
//! twice.

use std::time::{Duration, Instant};

use super::queue::Claim;
use crate::coord::Owner;

/// How many mean chunk reads a holder may stay quiet.
const PATIENCE: u32 = 8;
/// The shortest wait, whatever this rank measured.
const FLOOR: Duration = Duration::from_millis(500);
/// The longest wait, and the wait before this rank has timed a read.
const CAP: Duration = Duration::from_secs(2);

/// How long a holder's heartbeat may stay still before its chunk is taken
/// over, given the mean read time of a chunk this rank measured.
pub(super) fn patience(mean_read: Option<Duration>) -> Duration {
    match mean_read {
        Some(t) => t.saturating_mul(PATIENCE).clamp(FLOOR, CAP),
        None => CAP,
    }
}

/// What to do about a chunk another reader holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Leave it to its holder.
    Wait,
    /// Take it over with this claim.
    TakeOver(Claim),
}

/// The rule, for a chunk held by `claim`, looked at by `me`: `alive` is
/// whether the holder runs, `quiet` how long its heartbeat has been still
/// (`None` when it has none to watch).
pub(super) fn verdict(
    claim: Claim,
    me: Owner,
    alive: bool,
    quiet: Option<Duration>,
    patience: Duration,
) -> Verdict {
    if claim.owner == me {
        return Verdict::Wait; // one of this process's readers is on it
    }
    if !alive {
        // A dead holder's chunk was maybe never read at all; a mark it
        // carried stays, so the once-only rule still holds.
        return Verdict::TakeOver(Claim { owner: me, ..claim });
    }
    match quiet {
        Some(quiet) if !claim.taken_over && quiet >= patience => Verdict::TakeOver(Claim {
            owner: me,
            taken_over: true,
        }),
        _ => Verdict::Wait,
    }
}

/// How long each holder's heartbeat has been still, as one reader sees it:
/// the value it last saw, and since when. Times come from this process's
/// monotonic clock, so the ranks need no common clock, only the counter.
#[derive(Debug, Default)]
pub(super) struct Watch {
    seen: Vec<(Owner, u64, Instant)>,
}

impl Watch {
    /// Records the `beat` of `owner` seen `now`; how long it has been the
    /// same (zero the first time: a holder is not judged before this reader
    /// has watched it for the whole wait).
    pub(super) fn quiet(&mut self, owner: Owner, beat: u64, now: Instant) -> Duration {
        match self.seen.iter_mut().find(|(o, _, _)| *o == owner) {
            Some((_, last, since)) if *last == beat => now.saturating_duration_since(*since),
            Some(entry) => {
                *entry = (owner, beat, now);
                Duration::ZERO
            }
            None => {
                self.seen.push((owner, beat, now));
                Duration::ZERO
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Owner = Owner { pid: 10, tag: 1 };
    const OTHER: Owner = Owner { pid: 20, tag: 2 };

    fn held(owner: Owner, taken_over: bool) -> Claim {
        Claim { owner, taken_over }
    }

    #[test]
    fn patience_is_a_few_reads_between_a_floor_and_a_cap() {
        let ms = Duration::from_millis;
        assert_eq!(patience(None), CAP, "nothing timed yet");
        assert_eq!(patience(Some(ms(1))), FLOOR);
        // A healthy FUSE read of 8 MiB at 0.3 GiB/s is never taken over.
        assert!(patience(Some(ms(26))) > 19 * ms(26));
        assert_eq!(patience(Some(ms(100))), ms(800));
        assert_eq!(
            patience(Some(ms(207))),
            ms(1656),
            "12 readers on this VM's disk"
        );
        assert_eq!(patience(Some(Duration::from_secs(30))), CAP);
        assert_eq!(patience(Some(Duration::MAX)), CAP, "no overflow");
    }

    #[test]
    fn the_rule() {
        let wait = Duration::from_millis(500);
        let long = Some(Duration::from_secs(1));
        let short = Some(Duration::from_millis(10));
        let taken = Verdict::TakeOver(held(ME, true));
        // Its own readers' chunks: never, even if this process looks stuck.
        assert_eq!(
            verdict(held(ME, false), ME, true, long, wait),
            Verdict::Wait
        );
        // A live holder that makes progress keeps its chunk.
        assert_eq!(
            verdict(held(OTHER, false), ME, true, short, wait),
            Verdict::Wait
        );
        assert_eq!(
            verdict(held(OTHER, false), ME, true, None, wait),
            Verdict::Wait
        );
        // A live holder quiet for the whole wait loses it, marked.
        assert_eq!(verdict(held(OTHER, false), ME, true, long, wait), taken);
        assert_eq!(
            verdict(held(OTHER, false), ME, true, Some(wait), wait),
            taken
        );
        // Once taken over for that reason, not again for it...
        assert_eq!(
            verdict(held(OTHER, true), ME, true, long, wait),
            Verdict::Wait
        );
        // ...but a dead holder's chunk is always taken, its mark kept.
        assert_eq!(
            verdict(held(OTHER, false), ME, false, None, wait),
            Verdict::TakeOver(held(ME, false))
        );
        assert_eq!(verdict(held(OTHER, true), ME, false, short, wait), taken);
    }

    #[test]
    fn quiet_counts_from_the_last_change_seen() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut watch = Watch::default();
        assert_eq!(watch.quiet(OTHER, 7, at(0)), Duration::ZERO, "first look");
        assert_eq!(watch.quiet(OTHER, 7, at(300)), Duration::from_millis(300));
        assert_eq!(watch.quiet(ME, 7, at(300)), Duration::ZERO, "per holder");
        assert_eq!(watch.quiet(OTHER, 8, at(400)), Duration::ZERO, "it moved");
        assert_eq!(watch.quiet(OTHER, 8, at(450)), Duration::from_millis(50));
        assert_eq!(
            watch.quiet(OTHER, 8, at(390)),
            Duration::ZERO,
            "a time before the change: never negative"
        );
    }
}
