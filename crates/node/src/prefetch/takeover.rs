//! When a rank with nothing left to claim may take over a chunk another rank holds: the holder died, or made no progress for a few times a chunk's expected read time (at most 2 s).
//!
//! # The rule
//!
//! Each rank bumps its slot's heartbeat in the queue whenever one of its
//! readers makes progress: a claim, pages of a `WILLNEED` landing, each
//! piece of a node copy's chunk landing (2 MiB, `node/fill.rs`), a chunk
//! warm, a chunk done, and every poll (2 ms) of a reader that is waiting
//! for other ranks. A reader that finds no free chunk looks at each chunk
//! another process holds and takes it over with one compare-and-swap of the
//! chunk's word when
//!
//! - the holder is dead (gone, a zombie, or its pid reused: `coord/owner.rs`), or
//! - the holder's heartbeat has not moved, as this reader watches it, for
//!   `clamp(8 × t, 500 ms, 2 s)`, where `t` is the mean time this rank took
//!   to read a chunk that was not resident (2 s before it has read one),
//!   and the claim was not itself taken over.
//!
//! A claim taken for lack of progress carries a mark (bit 62 of the chunk
//! word), so that a chunk is taken over for that reason at most once: the
//! bytes of a stopped rank's chunks are read at worst twice, never three
//! times, and two slow ranks cannot pass a chunk back and forth. Of two
//! readers that race to take the same chunk, the compare-and-swap lets one
//! win. A holder that resumes finds the chunk's word changed: its
//! compare-and-swap to done fails, which it ignores, the chunk being warm
//! either way.
//!
//! What the rule leaves alone: a holder without a slot (past the queue's
//! 256), a chunk already taken over whose taker stops too, and a live rank
//! whose readers still beat while one of them waits on a read that never
//! returns (taking that chunk over would hang the taker on the same
//! storage). For those the 60 s stall guard in `worker.rs` remains: the
//! waiting reader gives up and reports the chunks as not warmed.
//!
//! NOTE: the numbers. A healthy holder must keep its chunks (its heartbeat
//! goes quiet for at most one chunk read), and a stopped rank must cost
//! seconds, not a minute: the 500 ms floor is a few times the longest gap
//! measured between two chunks, 8 times the mean chunk lets the wait grow on
//! slow storage, and the 2 s cap bounds what a stopped rank costs
//! (BENCHMARKS.md, "prefetch/takeover.rs: the numbers"). A live rank whose
//! only busy reader needs more than 2 s for one chunk (8 MiB at under
//! 4 MiB/s), with no waiting reader to beat for it, may see it read twice.

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
