//! The tag of a process's names and claims: its owner word (pid and start-time tag), and whether that process still runs, from the text of `/proc/<pid>/stat`.
//!
//! An owner is `tag << 32 | pid`, the tag being the low 30 bits of the
//! process's start time, so that a reused pid is not taken for the rank that
//! died. Liveness needs the ranks to share a pid namespace; where they do
//! not, a live rank may be taken for dead and its chunks read twice.

use procfs_core::FromRead;
use procfs_core::process::Stat;

use crate::os::{self, ProcFile};

/// 30 bits of start time: at 100 clock ticks a second, a pid reused within
/// 124 days of its last use still gets another tag.
const TAG_MASK: u32 = 0x3FFF_FFFF;

/// Bits 62 and 63, which the queue uses to mark words: never part of an
/// owner.
const MARK_BITS: u64 = 0b11 << 62;

/// A process that claims chunks: its pid and a tag from its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    pub pid: u32,
    /// The low 30 bits of the start time; 0 when unknown.
    pub tag: u32,
}

impl Owner {
    /// The word that stands for this owner in a slot or a chunk.
    pub fn word(self) -> u64 {
        (u64::from(self.tag & TAG_MASK) << 32) | u64::from(self.pid)
    }

    /// The owner a word stands for; `None` for a marked word or pid 0.
    pub fn from_word(word: u64) -> Option<Owner> {
        let pid = (word & 0xFFFF_FFFF) as u32;
        (word & MARK_BITS == 0 && pid != 0).then_some(Owner {
            pid,
            tag: (word >> 32) as u32,
        })
    }

    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        let tag = os::read_proc(ProcFile::SelfStat)
            .ok()
            .as_deref()
            .and_then(parse_stat)
            .map_or(0, |(_, start)| start_tag(start));
        Owner { pid, tag }
    }

    /// Whether the process still runs: it exists, is not a zombie, and has
    /// the start time it had when it claimed.
    pub fn alive(self) -> bool {
        if !os::pid_exists(self.pid) {
            return false;
        }
        let Ok(text) = os::read_proc(ProcFile::Stat(self.pid)) else {
            return true; // no /proc to ask: kill(2) said it exists
        };
        match parse_stat(&text) {
            Some(('Z' | 'X' | 'x', _)) => false,
            Some((_, start)) => self.tag == 0 || start_tag(start) == self.tag,
            None => true,
        }
    }

    /// Whether the process is alive and not stopped (by a signal or a
    /// tracer): one that may answer soon, however busy the machine.
    pub fn runs(self) -> bool {
        if !self.alive() {
            return false;
        }
        let Ok(text) = os::read_proc(ProcFile::Stat(self.pid)) else {
            return true; // no /proc to ask: alive is all that is known
        };
        !matches!(parse_stat(&text), Some(('T' | 't', _)))
    }

    /// The owner of a process that has exited and been reaped.
    #[cfg(all(test, target_os = "linux", not(safeload_os_stub)))]
    pub(crate) fn dead() -> Owner {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        Owner { pid, tag: 1 }
    }
}

fn start_tag(start: u64) -> u32 {
    (start as u32) & TAG_MASK
}

/// The state and start time (field 22, clock ticks since boot) from
/// `/proc/<pid>/stat` (proc_pid_stat(5)).
///
/// NOTE: `procfs_core`'s parser panics on a line that ends right after the
/// `)` or starts with the `(` (a truncated read), so such text is refused
/// here first (the test `proc_stat_fields`).
fn parse_stat(text: &[u8]) -> Option<(char, u64)> {
    let open = text.iter().position(|&b| b == b'(')?;
    let close = text.iter().rposition(|&b| b == b')')?;
    if open == 0 || close + 2 > text.len() {
        return None;
    }
    let stat = Stat::from_read(text).ok()?;
    Some((stat.state, stat.starttime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields() {
        // From this machine's /proc/self/stat, with a command name that has
        // spaces and parentheses.
        let text = "12345 (my (odd) name) S 1 12345 12345 0 -1 4194560 1066 0 0 0 1 0 0 0 20 0 1 0 98765 8761344 895 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(text.as_bytes()), Some(('S', 98765)));
        // A zombie's line from this machine (a child exited, not reaped).
        let zombie = "20561 (python3) Z 20520 20518 22911 0 -1 4227148 230 0 0 0 0 0 0 0 20 0 1 0 125505 0 0 18446744073709551615 0 0 0 0 0 0 0 16781312 2 1 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_stat(zombie.as_bytes()), Some(('Z', 125505)));
        assert_eq!(parse_stat(b"7 (x"), None);
        // Shapes `procfs_core` alone would panic on (see the `NOTE:`).
        assert_eq!(parse_stat(b"7 (x)"), None);
        assert_eq!(parse_stat(b"(x) S 1"), None);
        assert_eq!(parse_stat(b"7 (x) S 1 2"), None, "fields missing");
    }

    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn this_process_stat_parses() {
        let me = os::read_proc(ProcFile::SelfStat).unwrap();
        assert!(matches!(parse_stat(&me), Some((state, start)) if state != 'Z' && start > 0));
        assert_ne!(Owner::current().tag, 0);
    }

    /// What the guard in [`parse_stat`] is for: when this starts failing,
    /// `procfs_core` returns errors on such text and the guard can go.
    #[test]
    fn procfs_alone_panics_on_a_cut_line() {
        for text in [&b"7 (x)"[..], b"(x) S 1"] {
            let parsed = std::panic::catch_unwind(|| Stat::from_read(text).is_ok());
            assert!(parsed.is_err(), "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn owner_words_round_trip() {
        let owner = Owner {
            pid: 4_000_000,
            tag: 0x3FFF_FFFF,
        };
        assert_eq!(Owner::from_word(owner.word()), Some(owner));
        assert_eq!(Owner::from_word(owner.word() | 1 << 63), None);
        assert_eq!(Owner::from_word(owner.word() | 1 << 62), None);
        assert_eq!(Owner::from_word(5 << 32), None, "a tag without a pid");
        assert!(Owner::current().alive());
    }

    /// Without `/proc` or `kill(2)` (the stub OS layer, which has no shared
    /// queue to claim chunks from either), every owner is taken to be alive.
    #[cfg(not(all(target_os = "linux", not(safeload_os_stub))))]
    #[test]
    fn without_proc_every_owner_is_alive() {
        let me = Owner::current();
        assert_eq!(me.tag, 0);
        assert!(me.alive());
        assert!(
            Owner {
                pid: u32::MAX,
                tag: 1
            }
            .alive()
        );
    }

    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    #[test]
    fn dead_and_reused_pids_are_dead() {
        use std::time::{Duration, Instant};
        assert!(!Owner::dead().alive());
        let me = Owner::current();
        assert!(
            !Owner {
                tag: me.tag ^ 1,
                ..me
            }
            .alive(),
            "same pid, another start time: reused"
        );
        // A zombie: exited, not yet reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let zombie = Owner {
            pid: child.id(),
            tag: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while zombie.alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!zombie.alive());
        child.wait().unwrap();
    }
}
