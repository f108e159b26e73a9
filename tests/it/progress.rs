//! `Loader::on_progress`: the caller hears how far a load is, a few times a
//! second, never once per read, and last with the totals.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::common::{self, *};
use safeload::{Loader, report::Phase, report::Progress};
use tempfile::tempdir;

fn recorder() -> (
    Arc<Mutex<Vec<Progress>>>,
    impl Fn(&Progress) + Send + Sync + 'static,
) {
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = Arc::clone(&seen);
    (seen, move |p: &Progress| sink.lock().unwrap().push(*p))
}

#[test]
fn a_buffered_load_reports_bytes_and_files_at_a_sensible_rate() {
    let dir = tempdir().unwrap();
    let specs: Vec<Spec> = (0..6)
        .map(|i| spec(&format!("t{i}"), safetensors::Dtype::U8, &[1 << 20]))
        .collect();
    let index = write_sharded(dir.path(), &specs, 3);
    let (seen, callback) = recorder();
    let started = Instant::now();
    let sd = Loader::new()
        .disable_mmap(true)
        .read_size(4096) // 1,536 reads
        .io_concurrency(2)
        .on_progress(callback)
        .load(&index)
        .unwrap();
    let elapsed = started.elapsed();
    let seen = seen.lock().unwrap();
    let reads: Vec<&Progress> = seen.iter().filter(|p| p.phase == Phase::Read).collect();
    let last = reads.last().expect("at least the final call");
    assert_eq!(last.bytes_done, last.bytes_total);
    // Every byte read counts: the tensors', and the rest of the 4 KiB block
    // a direct or whole-file read starts on (a piece of the header).
    let tensors = sd.report().bytes_read();
    assert!(
        (tensors..tensors + 3 * 4096).contains(&last.bytes_total),
        "{} read for {tensors} tensor bytes",
        last.bytes_total
    );
    assert_eq!((last.files_done, last.files_total), (3, 3));
    // At most one call per 50 ms, and the last.
    let allowed = (elapsed.as_millis() / 50) as usize + 2;
    assert!(
        reads.len() <= allowed,
        "{} calls in {elapsed:?}",
        reads.len()
    );
    assert!(reads.len() < 1536 / 10, "not one call per read");
    assert!(reads.windows(2).all(|w| w[0].bytes_done <= w[1].bytes_done));
}

#[test]
fn a_mapped_load_reads_nothing_and_says_nothing_of_bytes() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let (seen, callback) = recorder();
    Loader::new()
        .disable_mmap(false)
        .on_progress(callback)
        .load(&path)
        .unwrap();
    assert!(seen.lock().unwrap().iter().all(|p| p.bytes_total == 0));
}

#[test]
fn prefetch_reports_what_it_warms() {
    let dir = tempdir().unwrap();
    let specs: Vec<Spec> = (0..4)
        .map(|i| spec(&format!("t{i}"), safetensors::Dtype::U8, &[1 << 20]))
        .collect();
    let index = write_sharded(dir.path(), &specs, 2);
    safeload::evict(&index).unwrap();
    let (seen, callback) = recorder();
    let report = Loader::new()
        .local_rank(0, 1)
        .on_progress(callback)
        .prefetch_with(
            safeload::PrefetchOptions::new()
                .streams(2)
                .chunk_size(256 << 10),
        )
        .warm(&index)
        .unwrap();
    let seen = seen.lock().unwrap();
    let last = seen
        .iter()
        .rfind(|p| p.phase == Phase::Prefetch)
        .expect("prefetch progress");
    assert_eq!(last.files_total, 2);
    assert_eq!(last.files_done, 2);
    // Every chunk this process handled is counted, resident or not.
    assert!(
        last.bytes_done >= report.warmed.min(last.bytes_total),
        "{last:?} {report}"
    );
}

#[test]
fn streaming_reports_the_tensors_handed_out() {
    let dir = tempdir().unwrap();
    let specs: Vec<Spec> = (0..6)
        .map(|i| spec(&format!("t{i}"), safetensors::Dtype::U8, &[64 << 10]))
        .collect();
    let index = write_sharded(dir.path(), &specs, 3);
    let (seen, callback) = recorder();
    let ck = Loader::new().on_progress(callback).open(&index).unwrap();
    // Its reader threads would be counted by the stream tests.
    let _streaming = common::streaming();
    ck.for_each(1 << 20, |t| -> Result<(), safeload::Error> {
        drop(t);
        Ok(())
    })
    .unwrap();
    let seen = seen.lock().unwrap();
    let last = seen
        .iter()
        .rfind(|p| p.phase == Phase::Stream)
        .expect("stream progress");
    assert_eq!((last.bytes_done, last.bytes_total), (6 << 16, 6 << 16));
    assert_eq!((last.files_done, last.files_total), (3, 3));
}
