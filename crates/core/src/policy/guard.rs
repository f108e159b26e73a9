//! The memory guard: which buffered files of a load fit in the memory available with a margin, the others mapped instead, and whether what stays buffered fits.

/// Memory a load keeps free beyond its buffers' bytes (headers, threads, page tables), so that
/// the guard's answer is a fallback or an error, never the OOM killer.
///
/// NOTE: measured under a cgroup limit (BENCHMARKS.md, "policy/guard.rs: memory_margin"): a
/// huge page rounds each buffer up by 2 MiB, page tables take 1/512 of the bytes.
fn memory_margin(files: usize, bytes: u64) -> u64 {
    const FIXED: u64 = 32 << 20;
    const PER_FILE: u64 = 2 << 20;
    FIXED
        .saturating_add(PER_FILE.saturating_mul(files as u64))
        .saturating_add(bytes / 512)
}

/// What the memory guard does with the buffered files of a load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemoryVerdict {
    /// Per file: map it instead of reading it.
    pub map_instead: Vec<bool>,
    /// Bytes all the buffered files would need, margin included.
    pub needed: u64,
    /// Buffered files that stay buffered.
    pub kept: usize,
    /// Buffered files (of more than 0 bytes) the guard looked at.
    pub files: usize,
}

/// The memory guard, first half: files the caller asked to read stay buffered; the
/// `switchable` ones stay buffered in load order while they fit, the rest are mapped instead.
/// Files of 0 bytes do not count.
pub(crate) fn memory_guard(files: &[(u64, bool)], available: Option<u64>) -> MemoryVerdict {
    let buffered = files.iter().filter(|&&(n, _)| n > 0);
    let total: u64 = buffered.clone().map(|&(n, _)| n).sum();
    let count = buffered.count();
    let needed = total.saturating_add(memory_margin(count, total));
    let Some(available) = available.filter(|&a| needed > a) else {
        return MemoryVerdict {
            map_instead: vec![false; files.len()],
            needed,
            kept: count,
            files: count,
        };
    };
    let fits =
        |files: usize, bytes: u64| bytes.saturating_add(memory_margin(files, bytes)) <= available;
    // What cannot be mapped instead comes first.
    let (mut kept, mut bytes) = files
        .iter()
        .filter(|&&(n, switchable)| n > 0 && !switchable)
        .fold((0usize, 0u64), |(c, b), &(n, _)| (c + 1, b + n));
    let map_instead = files
        .iter()
        .map(|&(n, switchable)| {
            if n == 0 || !switchable {
                return false;
            }
            if fits(kept + 1, bytes + n) {
                kept += 1;
                bytes += n;
                false
            } else {
                true
            }
        })
        .collect();
    MemoryVerdict {
        map_instead,
        needed,
        kept,
        files: count,
    }
}

/// The memory guard, second half: the buffered files still to be read must fit with the
/// margin, else `Err((needed, available))`.
pub fn memory_fits(files: usize, bytes: u64, available: Option<u64>) -> Result<(), (u64, u64)> {
    if files == 0 {
        return Ok(());
    }
    let needed = bytes.saturating_add(memory_margin(files, bytes));
    match available {
        Some(a) if needed > a => Err((needed, a)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_guard_keeps_a_margin_and_fills_what_fits() {
        const MIB: u64 = 1 << 20;
        let margin = |files, bytes| memory_margin(files, bytes);
        assert_eq!(margin(1, 512 * MIB), 32 * MIB + 2 * MIB + MIB);
        // Enough room: everything stays buffered.
        let files = [(100 * MIB, true), (50 * MIB, false), (0, true)];
        let v = memory_guard(&files, Some(1 << 30));
        assert_eq!(v.map_instead, [false, false, false]);
        assert_eq!(v.kept, 2);
        assert_eq!(v.needed, 150 * MIB + margin(2, 150 * MIB));
        assert_eq!(memory_guard(&files, None).map_instead, [false; 3]);
        // The bytes fit but not with the margin: the switchable file maps.
        let v = memory_guard(&files, Some(150 * MIB + MIB));
        assert_eq!(v.map_instead, [true, false, false]);
        assert_eq!(v.kept, 1);
        // Eight files of 256 MiB under 1 GiB: the first three are read, the
        // rest mapped (not all or nothing).
        let eight = [(256 * MIB, true); 8];
        let v = memory_guard(&eight, Some(1 << 30));
        assert_eq!(
            v.map_instead,
            [false, false, false, true, true, true, true, true]
        );
        assert_eq!(v.kept, 3);
        assert!(3 * 256 * MIB + margin(3, 3 * 256 * MIB) <= 1 << 30);
        assert!(4 * 256 * MIB + margin(4, 4 * 256 * MIB) > 1 << 30);
        // Files the caller asked to read are counted first.
        let v = memory_guard(&[(512 * MIB, true), (512 * MIB, false)], Some(600 * MIB));
        assert_eq!(v.map_instead, [true, false]);

        // Then what is still buffered must fit with the margin.
        assert_eq!(memory_fits(1, 50 * MIB, Some(120 * MIB)), Ok(()));
        let needed = 100 * MIB + margin(1, 100 * MIB);
        assert_eq!(
            memory_fits(1, 100 * MIB, Some(101 * MIB)),
            Err((needed, 101 * MIB)),
            "1 MiB above the bytes is not enough"
        );
        assert_eq!(memory_fits(0, 0, Some(0)), Ok(()), "nothing buffered");
        assert_eq!(memory_fits(3, u64::MAX, None), Ok(()));
    }
}
