//! `Checkpoint::for_each`: every tensor once, in file order, with the bytes
//! a load gives; the cap on bytes in flight held, seen from inside (bytes
//! read against bytes handed out) and as the peak resident memory of a child
//! process; an error from the callback, a panic in it, or a failed read
//! stops the readers with none left running; with no thread to spawn, the
//! calling thread reads.

use crate::common;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::cgroup::{Cgroup, Controller};
use crate::common::child::{PATH, child_command, run_role, spawn_held, wait_for_go};
use crate::common::{MODES, Spec, spec, write_sharded};
use safeload::{Checkpoint, ErrorKind, Loader, report::Strategy};
use safetensors::Dtype;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// The name of the stream's reader threads.
const READER: &str = "safeload-stream";
/// How a child opens its checkpoint: `buffered` or `mapped`.
const MODE: &str = "SAFELOAD_TEST_STREAM_MODE";

/// An engine's error: the loader's, or its own.
#[derive(Debug)]
enum Engine {
    Load(safeload::Error),
    Full { at: usize },
}

impl From<safeload::Error> for Engine {
    fn from(e: safeload::Error) -> Self {
        Engine::Load(e)
    }
}

/// Every dtype in its three shapes, and a few tensors of tens of KiB.
fn specs() -> Vec<Spec> {
    let mut specs = common::every_dtype();
    specs.extend([
        spec("big.u8", Dtype::U8, &[100_003]),
        spec("big.f32", Dtype::F32, &[3, 10_000]),
        spec("big.bf16", Dtype::BF16, &[64, 64]),
        spec("big.f64", Dtype::F64, &[5_000]),
    ]);
    specs
}

fn loader(disable_mmap: bool) -> Loader {
    Loader::new().disable_mmap(disable_mmap).io_concurrency(4)
}

fn mode_name(disable_mmap: bool) -> &'static str {
    if disable_mmap { "buffered" } else { "mapped" }
}

/// A tensor as a spec, to compare.
fn as_spec(t: &safeload::Tensor) -> Spec {
    Spec {
        name: t.name().to_string(),
        dtype: t.dtype(),
        shape: t.shape().to_vec(),
        data: t.as_bytes().to_vec(),
    }
}

/// The stream's reader threads alive now.
fn readers_alive() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == READER)
        .count()
}

/// No reader thread is left: `for_each` returns once every reader has
/// finished its work, and the thread itself is gone a moment later (once
/// its thread-locals are destroyed), so this gives it a second.
fn assert_no_reader_left(what: &str) {
    let deadline = Instant::now() + Duration::from_secs(1);
    while readers_alive() > 0 {
        assert!(
            Instant::now() < deadline,
            "{what}: {} reader threads still running",
            readers_alive()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `f` on a thread of its own, failing after 60 s instead of hanging: a
/// stream that deadlocks fails the test.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (sent, got) = mpsc::channel();
    std::thread::spawn(move || sent.send(f()));
    got.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what}: the stream did not end (deadlock?)"))
}

/// Reads the rest of `child`'s stdout from `out` and waits for it; kills
/// it and fails after 120 s instead of hanging on a stream that deadlocks.
fn finish(mut child: Child, mut out: impl BufRead + Send + 'static, what: &str) -> (bool, String) {
    let (sent, got) = mpsc::channel();
    std::thread::spawn(move || {
        // Every line read, to the end: a child whose pipe is closed early
        // fails writing the rest.
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut text);
        sent.send(text)
    });
    let Ok(text) = got.recv_timeout(Duration::from_secs(120)) else {
        let _ = child.kill();
        panic!("{what}: the child did not end (deadlock?)");
    };
    let status = child.wait().unwrap();
    (status.success(), text)
}

/// Runs the child `role` on `path`, opening it as `mode`; fails unless it
/// succeeds. Returns its stdout.
fn run_child(role: &str, path: &Path, mode: &str) -> String {
    let mut child = child_command(module_path!(), role, path)
        .env(MODE, mode)
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let (ok, stdout) = finish(child, out, &format!("{role}, {mode}"));
    assert!(
        ok,
        "{role}, {mode}: the child failed (its stderr is above)\n{stdout}"
    );
    stdout
}

#[test]
fn child() {
    run_role(&[
        ("cap", cap_in_child),
        ("rss", rss_in_child),
        ("no-threads", no_threads_in_child),
    ]);
}

#[test]
fn every_tensor_arrives_once_in_file_order_with_the_bytes_of_a_load() {
    let _streaming = common::streaming();
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    for disable_mmap in MODES {
        let mode = mode_name(disable_mmap);
        let ck = loader(disable_mmap).open(&index).unwrap();
        let strategy = if disable_mmap {
            Strategy::Buffered
        } else {
            Strategy::Mmap
        };
        assert!(ck.report().files.iter().all(|f| f.strategy == strategy));
        let sd = loader(disable_mmap).load(&index).unwrap();
        assert_eq!(common::loaded(&sd), common::sorted(&specs()));
        let expected: Vec<Spec> = ck
            .tensors()
            .map(|info| as_spec(sd.get(info.name()).unwrap()))
            .collect();
        for cap in [0, 1, 4 * KIB, 64 * KIB, u64::MAX] {
            // Not `Send`: the callback runs on the calling thread.
            let seen = Rc::new(RefCell::new(Vec::new()));
            ck.for_each(cap, |t| -> safeload::Result<()> {
                assert!(t.is_aligned(), "{mode}: {} not aligned", t.name());
                seen.borrow_mut().push(as_spec(&t));
                Ok(())
            })
            .unwrap();
            assert_eq!(*seen.borrow(), expected, "{mode}, cap {cap}");
        }
        assert_no_reader_left(mode);
    }
}

#[test]
fn tensors_the_callback_keeps_stay_valid_and_the_stream_still_ends() {
    let _streaming = common::streaming();
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    for disable_mmap in MODES {
        let ck = loader(disable_mmap).open(&index).unwrap();
        let expected: Vec<String> = ck.tensors().map(|t| t.name().to_string()).collect();
        // A cap of one byte, every tensor kept: the budget is full from the
        // first tensor on, and only the callback could free it.
        let stream = ck.clone();
        let kept = within("keeping every tensor", move || {
            let mut kept = Vec::new();
            stream
                .for_each(1, |t| -> safeload::Result<()> {
                    kept.push(t);
                    Ok(())
                })
                .map(|()| kept)
        })
        .unwrap();
        let names: Vec<&str> = kept.iter().map(|t| t.name()).collect();
        assert_eq!(names, expected);
        // They outlive the stream, with their bytes.
        let sd = loader(disable_mmap).load(&index).unwrap();
        for t in &kept {
            assert_eq!(t.as_bytes(), sd.get(t.name()).unwrap().as_bytes());
        }
        drop(kept);
        assert_no_reader_left(mode_name(disable_mmap));
    }
}

#[test]
fn an_error_from_the_callback_is_returned_and_no_reader_is_left() {
    let _streaming = common::streaming();
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    let mut seen_readers = 0;
    for disable_mmap in MODES {
        let ck = loader(disable_mmap).open(&index).unwrap();
        let last = ck.len() - 1;
        // Readers blocked on the budget (1 byte, 16 KiB), or done (no cap).
        for cap in [1, 16 * KIB, u64::MAX] {
            for stop_at in [0, 7, last] {
                let what = format!("{}, cap {cap}, stop at {stop_at}", mode_name(disable_mmap));
                let stream = ck.clone();
                let (result, calls, readers) = within(&what, move || {
                    let (mut calls, mut readers) = (0, 0);
                    let result = stream.for_each(cap, |_| {
                        readers = readers_alive().max(readers);
                        calls += 1;
                        if calls - 1 == stop_at {
                            return Err(Engine::Full { at: stop_at });
                        }
                        Ok(())
                    });
                    (result, calls, readers)
                });
                assert!(
                    matches!(result, Err(Engine::Full { at }) if at == stop_at),
                    "{what}: {result:?}"
                );
                assert_eq!(calls, stop_at + 1, "{what}: called after the error");
                assert_no_reader_left(&what);
                seen_readers = seen_readers.max(readers);
            }
        }
    }
    // The check above can see readers: while streaming, they are there.
    assert!(seen_readers > 0, "no reader thread was ever seen");
}

#[test]
fn a_panic_in_the_callback_stops_the_readers() {
    let _streaming = common::streaming();
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    let ck = loader(true).open(&index).unwrap();
    let panicked = within("a panic in the callback", move || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            ck.for_each(1, |t| -> safeload::Result<()> {
                assert!(!t.name().starts_with("big"), "the engine gave up");
                Ok(())
            })
        }))
        .is_err()
    });
    assert!(panicked);
    assert_no_reader_left("after a panic");
}

#[test]
fn a_file_truncated_after_open_is_a_typed_read_error() {
    let _streaming = common::streaming();
    for disable_mmap in MODES {
        let mode = mode_name(disable_mmap);
        let dir = tempfile::tempdir().unwrap();
        let index = write_sharded(dir.path(), &specs(), 3);
        let ck = loader(disable_mmap).open(&index).unwrap();
        let victim = ck.files().last().unwrap().to_path_buf();
        let len = std::fs::metadata(&victim).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&victim)
            .unwrap()
            .set_len(len / 2)
            .unwrap();
        let mut names = Vec::new();
        // Mapped too: the stream reads with positional reads, so a shrunk
        // file is an error, never SIGBUS.
        let err = ck
            .for_each(16 * KIB, |t| -> Result<(), Engine> {
                names.push(t.name().to_string());
                Ok(())
            })
            .unwrap_err();
        let Engine::Load(err) = err else {
            panic!("{mode}: {err:?}")
        };
        assert_eq!(
            err.kind(),
            &ErrorKind::SizeMismatch {
                expected: len,
                actual: len / 2
            },
            "{mode}"
        );
        assert_eq!(err.path(), Some(victim.as_path()), "{mode}");
        // What came before is every tensor of the other files, in order.
        let order: Vec<&str> = ck.tensors().map(|t| t.name()).collect();
        assert!(order.starts_with(&names.iter().map(String::as_str).collect::<Vec<_>>()));
        let before = ck.tensors().filter(|t| t.file() != victim).count();
        assert!(names.len() >= before && names.len() < order.len(), "{mode}");
        assert_no_reader_left(mode);
    }
}

// ------------------------------------------------------------ the cap, from inside

/// The child's cap, tensors kept by its callback, and their sizes.
const CAP: u64 = 192 * KIB;
const KEEP: usize = 2;
const CAP_SIZES: [u64; 4] = [4 * KIB, 16 * KIB, 64 * KIB, KIB + 3];

/// Bytes this process has read since `start`, by `rchar` of
/// `/proc/self/io` (proc(5): bytes returned by read(2), pread(2) and the
/// like, every thread counted), without what reading that file itself
/// returned.
struct BytesRead {
    start: u64,
    own: u64,
}

impl BytesRead {
    fn start() -> BytesRead {
        let mut reads = BytesRead { start: 0, own: 0 };
        reads.start = reads.since_start();
        reads
    }

    fn since_start(&mut self) -> u64 {
        let text = std::fs::read_to_string("/proc/self/io").unwrap();
        // The file is made at its first read, so what it shows does not yet
        // count this read of it.
        let rchar: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("rchar:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let read = rchar - self.start - self.own;
        self.own += text.len() as u64;
        read
    }
}

#[test]
fn the_cap_holds_seen_from_inside() {
    let _streaming = common::streaming();
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<Spec> = (0..48)
        .map(|i| {
            let len = CAP_SIZES[i % CAP_SIZES.len()] as usize;
            spec(&format!("t{i:02}"), Dtype::U8, &[len])
        })
        .collect();
    let index = write_sharded(dir.path(), &specs, 2);
    for disable_mmap in MODES {
        let stdout = run_child("cap", &index, mode_name(disable_mmap));
        assert!(stdout.contains("RESULT ok"), "{stdout}");
    }
}

fn open_in_child() -> Checkpoint {
    let path = std::env::var(PATH).unwrap();
    let disable_mmap = std::env::var(MODE).unwrap() == "buffered";
    loader(disable_mmap).open(path).unwrap()
}

/// A child: streams with a callback that keeps clones of the last `KEEP`
/// tensors and takes its time, and checks at each tensor that what is held plus what
/// the readers have read ahead stays within the cap.
fn cap_in_child() {
    let ck = open_in_child();
    let largest = ck.tensors().map(|t| t.nbytes()).max().unwrap();
    // So that the stream never needs to pass the cap to go on.
    assert!(KEEP as u64 * largest + largest <= CAP);
    let mut reads = BytesRead::start();
    let mut held = VecDeque::new();
    let (mut handed_out, mut fullest) = (0u64, 0u64);
    ck.for_each(CAP, |t| -> safeload::Result<()> {
        let name = t.name().to_string();
        handed_out += t.nbytes();
        // A clone kept, the tensor itself dropped: the bytes stay counted
        // until every clone is gone.
        held.push_back(t.clone());
        drop(t);
        if held.len() > KEEP {
            held.pop_front();
        }
        // Time for the readers to work ahead as far as the cap lets them.
        std::thread::sleep(Duration::from_millis(10));
        let read = reads.since_start();
        assert!(
            read >= handed_out,
            "{name}: {read} read, {handed_out} handed out"
        );
        let held_bytes: u64 = held.iter().map(|t| t.nbytes()).sum();
        let ahead = read - handed_out;
        assert!(
            held_bytes + ahead <= CAP,
            "{name}: {held_bytes} bytes held and {ahead} read ahead, past the cap of {CAP}"
        );
        fullest = fullest.max(held_bytes + ahead);
        Ok(())
    })
    .unwrap();
    // The bound held while the readers worked ahead, not for want of it.
    assert!(
        fullest > CAP - largest,
        "the readers never filled the budget: at most {fullest} of {CAP} bytes"
    );
    println!("RESULT ok fullest={fullest}");
}

// ------------------------------------------------------------ peak memory

/// The child's cap, and the tensors of its checkpoint: 56 of 8 MiB and one
/// of 80 MiB (larger than the cap, so read alone), 528 MiB in all.
const RSS_CAP: u64 = 64 * MIB;
const RSS_TENSORS: usize = 57;
const RSS_LARGE: usize = 30;

fn rss_tensor_len(i: usize) -> usize {
    (if i == RSS_LARGE { 80 * MIB } else { 8 * MIB }) as usize
}

/// A byte of tensor `i` at `offset`: cheap to make and to check, different
/// for every tensor and page.
fn rss_byte(i: usize, offset: usize) -> u8 {
    (i * 31 + offset / 4096) as u8
}

/// Writes the 528 MiB checkpoint in 4 shards, one shard in memory at a
/// time. Returns the index.
fn write_rss_checkpoint(dir: &Path) -> PathBuf {
    let shards = 4;
    let mut weight_map = serde_json::Map::new();
    for s in 0..shards {
        let name = common::shard_name(s, shards);
        let data: Vec<(String, Vec<u8>)> = (s..RSS_TENSORS)
            .step_by(shards)
            .map(|i| {
                let mut bytes = vec![0u8; rss_tensor_len(i)];
                for (page, chunk) in bytes.chunks_mut(4096).enumerate() {
                    chunk.fill(rss_byte(i, page * 4096));
                }
                (format!("t{i:02}"), bytes)
            })
            .collect();
        let views = data.iter().map(|(n, d)| {
            let view = safetensors::tensor::TensorView::new(Dtype::U8, vec![d.len()], d);
            (n.clone(), view.unwrap())
        });
        safetensors::serialize_to_file(views, None, &dir.join(&name)).unwrap();
        for (n, _) in &data {
            weight_map.insert(n.clone(), name.clone().into());
        }
    }
    common::write_index(dir, serde_json::json!({ "weight_map": weight_map }))
}

/// The process's peak resident memory so far (`VmHWM`), in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kib * KIB
}

#[test]
fn peak_memory_stays_under_the_cap_plus_the_largest_tensor() {
    let _streaming = common::streaming();
    // On the build's disk, not in a `/tmp` that may be memory; removed on
    // drop, also when the test fails.
    let dir = tempfile::Builder::new()
        .prefix("stream-rss-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let index = write_rss_checkpoint(dir.path());
    let total: u64 = (0..RSS_TENSORS).map(|i| rss_tensor_len(i) as u64).sum();
    let largest = 80 * MIB;
    for disable_mmap in MODES {
        let mode = mode_name(disable_mmap);
        let stdout = run_child("rss", &index, mode);
        let field = |key: &str| -> u64 {
            let (_, rest) = stdout.split_once(&format!("{key}=")).unwrap();
            rest.split_whitespace().next().unwrap().parse().unwrap()
        };
        let (baseline, peak) = (field("baseline"), field("peak"));
        assert_eq!(field("bytes"), total, "{mode}: every byte streamed");
        let bound = RSS_CAP + 64 * MIB + largest;
        eprintln!(
            "{mode}: peak {} MiB above a baseline of {} MiB, bound {} MiB, checkpoint {} MiB",
            (peak - baseline) / MIB,
            baseline / MIB,
            bound / MIB,
            total / MIB
        );
        assert!(
            peak <= baseline + bound,
            "{mode}: peak {peak} bytes, over the baseline {baseline} + the cap {RSS_CAP} + 64 MiB + the largest tensor {largest}"
        );
        // The measure sees the tensors: a cap's worth was resident at once.
        assert!(
            peak >= baseline + RSS_CAP,
            "{mode}: peak {peak}, baseline {baseline}"
        );
    }
}

/// A child: streams the 528 MiB checkpoint with a 64 MiB cap, checking a
/// byte of every page, taking its time and dropping each tensor, and prints
/// its peak resident memory before and after.
fn rss_in_child() {
    let ck = open_in_child();
    let baseline = peak_rss();
    let mut bytes = 0u64;
    ck.for_each(RSS_CAP, |t| -> safeload::Result<()> {
        let i: usize = t.name().trim_start_matches('t').parse().unwrap();
        let data = t.as_bytes();
        assert_eq!(data.len(), rss_tensor_len(i));
        for offset in (0..data.len()).step_by(4096).chain([data.len() - 1]) {
            assert_eq!(
                data[offset],
                rss_byte(i, offset),
                "{} at {offset}",
                t.name()
            );
        }
        bytes += data.len() as u64;
        // An engine slower than the reads (a device upload), so that
        // readers without a bound would run far ahead.
        std::thread::sleep(Duration::from_millis(20));
        Ok(())
    })
    .unwrap();
    println!(
        "RESULT baseline={baseline} peak={} bytes={bytes}",
        peak_rss()
    );
}

// ------------------------------------------------------------ no threads

#[test]
fn with_no_thread_to_spawn_the_calling_thread_reads_every_tensor() {
    let _streaming = common::streaming();
    let dir = tempfile::tempdir().unwrap();
    let index = write_sharded(dir.path(), &specs(), 3);
    let expected_sum: u64 = specs()
        .iter()
        .flat_map(|s| s.data.iter().map(|&b| u64::from(b)))
        .sum();
    for disable_mmap in MODES {
        let Some(cgroup) = Cgroup::new(Controller::Pids) else {
            return;
        };
        let mode = mode_name(disable_mmap);
        let mut command = child_command(module_path!(), "no-threads", &index);
        command.env(MODE, mode);
        let mut held = spawn_held(command);
        // No task more than the child has now: every thread spawn fails.
        cgroup.enter(held.child.id());
        cgroup.limit(1);
        held.go();
        let (ok, stdout) = finish(held.child, held.out, mode);
        assert!(
            ok,
            "{mode}: the child failed (its stderr is above)\n{stdout}"
        );
        let result = stdout
            .lines()
            .find_map(|l| l.split_once("RESULT "))
            .map(|(_, r)| r);
        assert_eq!(
            result.unwrap_or_default(),
            format!("readers=0 tensors={} sum={expected_sum}", specs().len()),
            "{mode}"
        );
    }
}

/// A child: says `READY`, waits for the parent's line (it is moved into a
/// cgroup where it can start no thread meanwhile), streams, and prints how
/// many readers it ever saw, the tensors and the sum of their bytes.
fn no_threads_in_child() {
    wait_for_go();
    let ck = open_in_child();
    let (mut readers, mut tensors, mut sum) = (0, 0, 0u64);
    ck.for_each(KIB, |t| -> safeload::Result<()> {
        readers = readers_alive().max(readers);
        tensors += 1;
        sum += t.as_bytes().iter().map(|&b| u64::from(b)).sum::<u64>();
        Ok(())
    })
    .unwrap();
    println!("RESULT readers={readers} tensors={tensors} sum={sum}");
}
