//! The FUSE test filesystem (`testfs/`) as the benchmarks mount it: the
//! hf-mount-like scenarios of the adaptive-concurrency work, each a name a
//! table can print.

use std::path::Path;
use std::time::Duration;

use safeload_testfs::{Mount, Options};

/// The hf-mount-like scenarios: the test filesystem mounted with fsname
/// `hf-mount` (so the auto policy treats it as hf-mount), a daemon of N
/// threads, each request answered after its latency; and one modelling a
/// remote chunk store behind read-ahead (a first-byte delay per 32 MiB
/// block, a bandwidth cap).
pub const HF_MOUNT_SCENARIOS: [&str; 4] = [
    "fuse-2ms-8t",
    "fuse-8ms-32t",
    "fuse-serial-2ms",
    "fuse-remote",
];

/// Mounts `root` as the hf-mount-like `scenario` (one of
/// [`HF_MOUNT_SCENARIOS`]).
pub fn hf_mount(scenario: &str, root: &Path) -> Result<Mount, String> {
    let base = Options {
        fsname: "hf-mount".into(),
        ..Default::default()
    };
    let options = match scenario {
        "fuse-2ms-8t" => Options {
            latency: Some(Duration::from_millis(2)),
            daemon_threads: Some(8),
            ..base
        },
        "fuse-8ms-32t" => Options {
            latency: Some(Duration::from_millis(8)),
            daemon_threads: Some(32),
            ..base
        },
        "fuse-serial-2ms" => Options {
            latency: Some(Duration::from_millis(2)),
            daemon_threads: Some(1),
            ..base
        },
        "fuse-remote" => Options {
            latency: Some(Duration::from_millis(1)),
            daemon_threads: Some(16),
            first_byte_delay: Some(Duration::from_millis(60)),
            fetch_block: 32 << 20,
            bandwidth_bytes_per_sec: Some(900_000_000),
            ..base
        },
        other => return Err(format!("no hf-mount-like scenario {other}")),
    };
    Mount::new(root, options)
        .map_err(|e| format!("mounting the FUSE test filesystem for {scenario}: {e}"))
}

/// Makes the mount cold for the next arm: every file of the checkpoint
/// dropped from the page cache under the mount and in its source directory
/// (`data::evict`), the remote model's fetched blocks forgotten, and its
/// counters set to zero.
pub fn make_cold(mount: &Mount, source: &Path, checkpoint: &Path) -> Result<(), String> {
    let evicted = super::data::evict(&[source, checkpoint]);
    mount.forget_fetched();
    mount.reset_stats();
    evicted
}
