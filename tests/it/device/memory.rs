//! A 2 GiB load to a device in a child process, mapped and read: its anonymous memory
//! (`RssAnon`, proc(5)) stays within the staging ring and 64 MiB, and a mapped file's
//! pages are let go of as they are copied (`RssFile` within the same).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use safeload::Loader;
use safeload::device::{StandIn, ToDevice};

use crate::common::child::{PATH, child_command, run_role};

const MIB: u64 = 1 << 20;
const SHARDS: usize = 8;
const TENSORS_PER_SHARD: usize = 4;
const TENSOR: u64 = 64 * MIB;
const TOTAL: u64 = SHARDS as u64 * TENSORS_PER_SHARD as u64 * TENSOR;
/// The ring of the loads measured: the default, 4 buffers of 32 MiB.
const RING: u64 = 4 * 32 * MIB;
const MODE: &str = "SAFELOAD_TEST_DEVICE_MODE";

#[test]
fn child() {
    run_role(&[("device-memory", load_in_child)]);
}

/// Writes the checkpoint: 8 shards of four 64 MiB U8 tensors, a few MiB of
/// the test's memory at a time. Returns the index.
fn write_checkpoint(dir: &Path) -> PathBuf {
    let mut weight_map = serde_json::Map::new();
    for s in 0..SHARDS {
        let name = crate::common::shard_name(s, SHARDS);
        let mut header = serde_json::Map::new();
        for t in 0..TENSORS_PER_SHARD {
            let i = t as u64;
            let tensor = format!("s{s}.t{t}");
            header.insert(
                tensor.clone(),
                serde_json::json!({
                    "dtype": "U8",
                    "shape": [TENSOR],
                    "data_offsets": [i * TENSOR, (i + 1) * TENSOR],
                }),
            );
            weight_map.insert(tensor, name.clone().into());
        }
        let mut json = serde_json::Value::Object(header).to_string();
        while json.len() % 8 != 0 {
            json.push(' ');
        }
        let mut file = std::io::BufWriter::new(std::fs::File::create(dir.join(&name)).unwrap());
        file.write_all(&(json.len() as u64).to_le_bytes()).unwrap();
        file.write_all(json.as_bytes()).unwrap();
        let block: Vec<u8> = (0..8 * MIB).map(|b| (b * 7 + s as u64) as u8).collect();
        for _ in 0..(TENSORS_PER_SHARD as u64 * TENSOR / block.len() as u64) {
            file.write_all(&block).unwrap();
        }
        file.flush().unwrap();
    }
    crate::common::write_index(dir, serde_json::json!({ "weight_map": weight_map }))
}

/// A field of `/proc/self/status` in bytes.
fn status(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kib << 10
}

#[test]
fn a_2_gib_load_takes_the_ring_and_64_mib_of_anonymous_memory() {
    // On the build's disk, not in a `/tmp` that may be memory.
    let dir = tempfile::Builder::new()
        .prefix("device-memory-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let index = write_checkpoint(dir.path());
    for mode in ["mapped", "read"] {
        let out = child_command(module_path!(), "device-memory", &index)
            .env(MODE, mode)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("CHILD-DONE device-memory"),
            "{mode}: the child failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        let field = |key: &str| -> u64 {
            let (_, rest) = stdout.split_once(&format!("{key}=")).unwrap();
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        let (anon, file, file_before) = (field("anon"), field("file"), field("file_before"));
        eprintln!(
            "{mode}: peak RssAnon {} MiB, peak RssFile {} MiB ({} MiB before), 2 GiB loaded",
            anon / MIB,
            file / MIB,
            file_before / MIB
        );
        assert_eq!(field("copied"), TOTAL, "{mode}: every byte copied");
        assert!(
            anon <= RING + 64 * MIB,
            "{mode}: peak RssAnon {anon} over the ring {RING} + 64 MiB"
        );
        if mode == "mapped" {
            assert!(
                file <= file_before + RING + 64 * MIB,
                "{mode}: peak RssFile {file} from {file_before}: the map's pages were kept"
            );
        }
    }
}

/// A child: loads the checkpoint to a stand-in that keeps no bytes, sampling its
/// `RssAnon` and `RssFile` every 2 ms, and prints their peaks.
fn load_in_child() {
    let path = std::env::var(PATH).unwrap();
    let mapped = std::env::var(MODE).unwrap() == "mapped";
    let device = StandIn::new().discard_bytes();
    let loader = Loader::new().disable_mmap(!mapped).direct_io(false);
    let ck = loader.open(&path).unwrap();
    let file_before = status("RssFile:");
    let done = std::sync::atomic::AtomicBool::new(false);
    let (anon, file) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let (mut anon, mut file) = (0, 0);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                anon = status("RssAnon:").max(anon);
                file = status("RssFile:").max(file);
                std::thread::sleep(Duration::from_millis(2));
            }
            (anon, file)
        });
        let loaded = ck.to_device(&device).unwrap();
        assert_eq!(loaded.len(), SHARDS * TENSORS_PER_SHARD);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    });
    println!(
        "RESULT anon={anon} file={file} file_before={file_before} copied={}",
        device.bytes_copied()
    );
}
