//! How much memory a load may take: `MemAvailable`, what the process's cgroup (v2 or v1) still allows, and the address space its `RLIMIT_AS` leaves.

use std::path::{Path, PathBuf};

use procfs_core::{FromBufRead, ProcessCGroups};

use crate::os::{self, ProcFile};

/// Memory a buffered read or a prefetch may use, in bytes: the smaller of
/// the kernel's `MemAvailable` estimate and, for each cgroup from the
/// process's own up to the root, its limit minus its usage. `None` where
/// neither can be read (the OS layer has no `/proc`: non-Linux targets).
pub fn available() -> Option<u64> {
    let proc_text = |file| {
        os::read_proc(file)
            .ok()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    };
    let mem_available = proc_text(ProcFile::Meminfo)
        .as_deref()
        .and_then(parse_meminfo_available);
    let cgroup_room = proc_text(ProcFile::SelfCgroup)
        .and_then(|text| cgroup_room(&text, Path::new("/sys/fs/cgroup")));
    smaller(mem_available, cgroup_room)
}

/// Memory one allocation may still take, in bytes: `available`, and no
/// more than the address space the process's `RLIMIT_AS` leaves (its limit
/// minus `VmSize`), where it has one: past it an allocation would fail, and
/// Rust's allocation failure aborts the process. `None` where nothing is
/// known.
pub fn headroom() -> Option<u64> {
    let mapped = os::read_proc(ProcFile::SelfStatus)
        .ok()
        .and_then(|bytes| parse_status_vm_size(&String::from_utf8_lossy(&bytes)));
    smaller(available(), address_room(os::address_space_limit(), mapped))
}

/// The smaller of two figures, or the one known.
fn smaller(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The address space `limit` leaves once `mapped` bytes are mapped: none
/// known without a limit; all of it where what is mapped is unknown.
fn address_room(limit: Option<u64>, mapped: Option<u64>) -> Option<u64> {
    let limit = limit?;
    Some(limit.saturating_sub(mapped.unwrap_or(0)))
}

/// `VmSize` from `/proc/self/status`, in bytes (see proc(5)): the address
/// space mapped, which `RLIMIT_AS` bounds.
pub(crate) fn parse_status_vm_size(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("VmSize:")?;
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            _ => None,
        }
    })
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (see proc(5)).
///
/// NOTE: by hand, because `procfs_core::Meminfo` fails the whole file unless all of seventeen
/// fields are there, and gVisor's kernel leaves some out (`tests/data/meminfo-gvisor.txt`).
pub(crate) fn parse_meminfo_available(text: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix("MemAvailable:")?;
        let mut words = rest.split_whitespace();
        let value: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// The cgroup paths of this process: the v2 path (`0::/path`) and the v1
/// memory controller's path (`N:memory:/path`), from `/proc/self/cgroup`.
pub(crate) fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v2 = None;
    let mut v1_memory = None;
    // NOTE: one line at a time: procfs fails the whole file on one line it cannot read.
    let groups = text
        .lines()
        .filter_map(|line| ProcessCGroups::from_buf_read(line.as_bytes()).ok())
        .flat_map(|ProcessCGroups(groups)| groups);
    for group in groups {
        if group.hierarchy == 0 && group.controllers.is_empty() {
            v2 = Some(group.pathname);
        } else if group.controllers.iter().any(|c| c == "memory") {
            v1_memory = Some(group.pathname);
        }
    }
    (v2, v1_memory)
}

/// A limit file's value; `max` (v2) and the page-rounded `i64::MAX` that v1
/// writes for "no limit" are no limit.
pub(crate) fn parse_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    text.parse::<u64>().ok().filter(|&v| v < 1 << 60)
}

/// The smallest `limit - usage` over the cgroup and its ancestors, under
/// `root` (normally `/sys/fs/cgroup`).
fn cgroup_room(proc_cgroup: &str, root: &Path) -> Option<u64> {
    let (v2, v1) = parse_proc_cgroup(proc_cgroup);
    let mut candidates: Vec<(PathBuf, &str, &str)> = Vec::new();
    if let Some(path) = &v1 {
        candidates.push((
            join(&root.join("memory"), path),
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
        ));
    }
    if let Some(path) = &v2 {
        // cgroup2 is mounted at the root, or at `unified` next to v1 controllers.
        for base in [root.to_path_buf(), root.join("unified")] {
            candidates.push((join(&base, path), "memory.max", "memory.current"));
        }
    }
    let mut room: Option<u64> = None;
    for (dir, limit_file, usage_file) in candidates {
        // In a container the path may name a cgroup outside the namespace's
        // view; walking up reaches the directories that do exist.
        let mut dir = Some(dir.as_path());
        while let Some(d) = dir {
            let limit = std::fs::read_to_string(d.join(limit_file))
                .ok()
                .as_deref()
                .and_then(parse_limit);
            let usage = std::fs::read_to_string(d.join(usage_file))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok());
            if let (Some(limit), Some(usage)) = (limit, usage) {
                let here = limit.saturating_sub(usage);
                room = Some(room.map_or(here, |r| r.min(here)));
            }
            if d == root || !d.starts_with(root) {
                break;
            }
            dir = d.parent();
        }
    }
    room
}

fn join(base: &Path, cgroup_path: &str) -> PathBuf {
    base.join(cgroup_path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture under `tests/data/` without its first line, which says where it came from.
    fn fixture(file: &'static str) -> &'static str {
        let (comment, text) = file.split_once('\n').unwrap();
        assert!(comment.starts_with("# "));
        text
    }

    #[test]
    fn meminfo() {
        let text = "MemTotal:       24683656 kB\nMemFree:        22000000 kB\nMemAvailable:   24000636 kB\n";
        assert_eq!(parse_meminfo_available(text), Some(24000636 * 1024));
        assert_eq!(parse_meminfo_available("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn meminfo_of_a_kernel_and_of_a_sandbox() {
        // This machine's: procfs and the line search agree.
        let this_machine = fixture(include_str!("../tests/data/meminfo-this-machine.txt"));
        let procfs = procfs_core::Meminfo::from_buf_read(this_machine.as_bytes()).unwrap();
        assert_eq!(procfs.mem_available, Some(23703860 * 1024));
        assert_eq!(parse_meminfo_available(this_machine), procfs.mem_available);
        // gVisor's, and the three lines above: procfs fails for want of fields.
        let gvisor = fixture(include_str!("../tests/data/meminfo-gvisor.txt"));
        assert!(procfs_core::Meminfo::from_buf_read(gvisor.as_bytes()).is_err());
        assert_eq!(parse_meminfo_available(gvisor), Some(7340032 * 1024));
        let three_lines = "MemTotal: 2 kB\nMemFree: 1 kB\nMemAvailable: 1 kB\n";
        assert!(procfs_core::Meminfo::from_buf_read(three_lines.as_bytes()).is_err());
    }

    #[test]
    fn proc_cgroup_v1_and_v2() {
        // As this machine's /proc/self/cgroup shows a hybrid hierarchy.
        let text = "9:name=systemd:/\n4:memory:/process_api/e156\n1:cpu:/\n0::/\n";
        assert_eq!(
            parse_proc_cgroup(text),
            (Some("/".into()), Some("/process_api/e156".into()))
        );
        // A pure cgroup2 system.
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/session-1.scope\n")
                .0
                .as_deref(),
            Some("/user.slice/session-1.scope")
        );
        // A line procfs cannot read fails its whole file, and only itself here.
        let with_a_bad_line = format!("{text}memory\n");
        assert!(ProcessCGroups::from_buf_read(with_a_bad_line.as_bytes()).is_err());
        assert_eq!(parse_proc_cgroup(&with_a_bad_line), parse_proc_cgroup(text));
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_limit("garbage"), None);
    }

    #[test]
    fn room_walks_up_to_the_tightest_limit() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("memory/job");
        let leaf = parent.join("rank0");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(parent.join("memory.limit_in_bytes"), "1000\n").unwrap();
        std::fs::write(parent.join("memory.usage_in_bytes"), "900\n").unwrap();
        std::fs::write(leaf.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(leaf.join("memory.usage_in_bytes"), "10\n").unwrap();
        assert_eq!(cgroup_room("4:memory:/job/rank0\n", root.path()), Some(100));

        let v2 = root.path().join("app");
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v2.join("memory.max"), "5000\n").unwrap();
        std::fs::write(v2.join("memory.current"), "2000\n").unwrap();
        assert_eq!(cgroup_room("0::/app\n", root.path()), Some(3000));
        assert_eq!(cgroup_room("0::/\n", root.path()), None);
    }

    #[test]
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    fn this_machine_has_some() {
        assert!(available().is_some_and(|b| b > 0));
    }

    #[test]
    #[cfg(all(target_os = "linux", not(safeload_os_stub)))]
    fn this_machine_has_some_headroom() {
        // No more than is available, and some of it.
        let headroom = headroom().unwrap();
        assert!(headroom > 0 && headroom <= available().unwrap());
    }

    #[test]
    fn vm_size_of_proc_status() {
        // As this machine's /proc/self/status writes it (a few of its lines).
        let text =
            "Name:\tit-test\nVmPeak:\t  912340 kB\nVmSize:\t  812340 kB\nVmHWM:\t   10240 kB\n";
        assert_eq!(parse_status_vm_size(text), Some(812_340 * 1024));
        assert_eq!(parse_status_vm_size("VmSize: 12\n"), None, "no unit");
        assert_eq!(parse_status_vm_size("VmPeak: 1 kB\n"), None);
    }

    #[test]
    fn an_address_space_limit_bounds_the_room() {
        let gib = 1u64 << 30;
        assert_eq!(address_room(None, Some(gib)), None, "no limit");
        assert_eq!(
            address_room(Some(2 * gib), Some(gib / 2)),
            Some(3 * gib / 2)
        );
        // Mapped past the limit (it was lowered after): no room, not a wrap.
        assert_eq!(address_room(Some(gib), Some(2 * gib)), Some(0));
        assert_eq!(address_room(Some(gib), None), Some(gib));
    }

    #[test]
    #[cfg(not(all(target_os = "linux", not(safeload_os_stub))))]
    fn without_proc_there_are_no_figures() {
        assert_eq!(available(), None);
        assert_eq!(headroom(), None);
    }
}
