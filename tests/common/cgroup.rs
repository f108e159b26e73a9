//! Child cgroups for tests that run a load under a memory or pids limit:
//! made under this process's own cgroup (v1 controller hierarchies, or the
//! v2 unified tree where the controller is enabled there), removed on drop.
//!
//! A test that needs one calls [`Cgroup::new`]; where there is no such
//! controller, or no right to make a cgroup, it gets `None` after a
//! `SKIPPED: <reason>` line on stderr, unless `SAFELOAD_REQUIRE_CGROUP=1`
//! (as `.ci/run` sets it), which turns the skip into a failure.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The limits a cgroup sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Controller {
    /// `memory.limit_in_bytes` (v1) or `memory.max` (v2).
    Memory,
    /// `pids.max`.
    Pids,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
        }
    }
}

/// A cgroup of this test's own.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    controller: Controller,
    v2: bool,
}

static COUNT: AtomicUsize = AtomicUsize::new(0);

impl Cgroup {
    /// A new child cgroup with `controller`, or `None` (skipped) where it
    /// cannot be made.
    pub fn new(controller: Controller) -> Option<Cgroup> {
        match Cgroup::make(controller) {
            Ok(cgroup) => Some(cgroup),
            Err(reason) => {
                if std::env::var_os("SAFELOAD_REQUIRE_CGROUP").is_some_and(|v| v == "1") {
                    panic!(
                        "a {} cgroup is required (SAFELOAD_REQUIRE_CGROUP=1) but none can be made: {reason}",
                        controller.name()
                    );
                }
                eprintln!("SKIPPED: no {} cgroup: {reason}", controller.name());
                None
            }
        }
    }

    fn make(controller: Controller) -> Result<Cgroup, String> {
        let name = controller.name();
        let text = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let unique = format!(
            "safeload-test-{}-{}",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        );
        // v1: a hierarchy of the controller's own.
        for line in text.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if controllers.split(',').any(|c| c == name) {
                let base = Path::new("/sys/fs/cgroup").join(name);
                let dir = base.join(path.trim_start_matches('/')).join(&unique);
                std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                return Ok(Cgroup {
                    dir,
                    controller,
                    v2: false,
                });
            }
        }
        // v2: the unified tree, where the parent delegates the controller.
        let path = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or("no cgroup v1 hierarchy for it and no cgroup v2")?;
        for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
            let parent = Path::new(root).join(path.trim_start_matches('/'));
            let subtree = std::fs::read_to_string(parent.join("cgroup.subtree_control"));
            if subtree.is_ok_and(|s| s.split_whitespace().any(|c| c == name)) {
                let dir = parent.join(&unique);
                std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                return Ok(Cgroup {
                    dir,
                    controller,
                    v2: true,
                });
            }
        }
        Err(format!(
            "the {name} controller is neither a v1 hierarchy nor delegated in cgroup v2"
        ))
    }

    /// Sets the limit: bytes of memory, or the number of tasks.
    pub fn limit(&self, value: u64) {
        let file = match (self.controller, self.v2) {
            (Controller::Memory, false) => "memory.limit_in_bytes",
            (Controller::Memory, true) => "memory.max",
            (Controller::Pids, _) => "pids.max",
        };
        std::fs::write(self.dir.join(file), value.to_string()).unwrap();
        if self.controller == Controller::Memory && !self.v2 {
            // No swap to page out to: the limit is a limit.
            let _ = std::fs::write(self.dir.join("memory.swappiness"), "0");
        }
    }

    /// Memory charged to the cgroup now, in bytes.
    pub fn usage(&self) -> u64 {
        let file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Moves the process `pid` (all its threads) into the cgroup.
    pub fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// Whether the kernel's OOM killer killed a process of the cgroup.
    pub fn oom_killed(&self) -> bool {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix(key))
            .any(|n| n.trim().parse::<u64>().is_ok_and(|n| n > 0))
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The child has exited; its cgroup is empty and can go.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}
