//! Reading a range of a file through a scratch buffer in steps: the one loop of the readers that read bytes to look at, not to keep (hashing, warming the page cache, finding why a populate failed).
//!
//! Portable: the read itself is the caller's, so one loop serves every kind of file.

use std::ops::Range;

/// Reads `range` in order, in steps of at most `max_step` bytes through
/// `scratch` (grown where shorter, kept for the caller's next range):
/// `step(buf, offset)` fills `buf` with the bytes at `offset` and uses them.
/// Stops at the first error and returns it.
pub fn read_in_steps<E>(
    range: Range<u64>,
    scratch: &mut Vec<u8>,
    max_step: usize,
    mut step: impl FnMut(&mut [u8], u64) -> Result<(), E>,
) -> Result<(), E> {
    let max_step = max_step.max(1);
    let len = range.end.saturating_sub(range.start);
    let want = usize::try_from(len)
        .unwrap_or(usize::MAX)
        .clamp(1, max_step);
    if scratch.is_empty() {
        // Zeroed by the allocator (pages faulted in as the reads land).
        *scratch = vec![0u8; want];
    } else if scratch.len() < want {
        scratch.resize(want, 0);
    }
    let size = scratch.len().min(max_step);
    let mut at = range.start;
    while at < range.end {
        let n = usize::try_from(range.end - at)
            .unwrap_or(usize::MAX)
            .min(size);
        let Some(buf) = scratch.get_mut(..n) else {
            break;
        };
        step(buf, at)?;
        at += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bytes of a pretend file: each byte its offset's low bits mixed.
    fn byte_at(offset: u64) -> u8 {
        (offset.wrapping_mul(31) ^ (offset >> 8)) as u8
    }

    fn fill(buf: &mut [u8], at: u64) {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = byte_at(at + i as u64);
        }
    }

    /// The naive twin: the whole range read at once into a buffer of its own.
    fn naive(range: Range<u64>) -> Vec<u8> {
        let mut all = vec![0u8; (range.end - range.start) as usize];
        fill(&mut all, range.start);
        all
    }

    proptest! {
        /// Every byte of the range reaches the steps once, in order, in steps
        /// of at most `max_step` (all but the last exactly the step size),
        /// whatever scratch the caller hands in.
        #[test]
        fn steps_see_what_one_read_sees(
            start in 0u64..10_000,
            len in 0u64..5_000,
            max_step in 0usize..700,
            scratch_len in 0usize..1_000,
        ) {
            let range = start..start + len;
            let mut scratch = vec![7u8; scratch_len];
            let mut seen = Vec::new();
            let mut steps = Vec::new();
            read_in_steps(range.clone(), &mut scratch, max_step, |buf, at| {
                fill(buf, at);
                seen.extend_from_slice(buf);
                steps.push((at, buf.len()));
                Ok::<(), ()>(())
            }).unwrap();
            prop_assert_eq!(&seen, &naive(range.clone()));
            let size = scratch.len().min(max_step.max(1));
            prop_assert!(size >= 1);
            let mut next = range.start;
            for (i, &(at, n)) in steps.iter().enumerate() {
                prop_assert_eq!(at, next);
                prop_assert!(n >= 1 && n <= max_step.max(1));
                if i + 1 < steps.len() {
                    prop_assert_eq!(n, size);
                }
                next += n as u64;
            }
            prop_assert_eq!(next, range.end);
            prop_assert!(scratch.len() >= scratch_len, "scratch never shrinks");
        }
    }

    #[test]
    fn the_first_failing_step_ends_the_read() {
        let mut scratch = Vec::new();
        let mut offsets = Vec::new();
        let result = read_in_steps(100..1_100, &mut scratch, 300, |_, at| {
            offsets.push(at);
            if at >= 700 { Err(at) } else { Ok(()) }
        });
        assert_eq!(result, Err(700));
        assert_eq!(offsets, [100, 400, 700]);
        assert_eq!(scratch.len(), 300, "grown to one step, not to the range");
    }

    #[test]
    fn an_empty_range_reads_nothing() {
        let mut scratch = Vec::new();
        let result = read_in_steps(5..5, &mut scratch, 64, |_, _| Err(()));
        assert_eq!(result, Ok(()));
    }
}
