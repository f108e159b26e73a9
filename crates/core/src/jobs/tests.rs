//! The job queue's tests: cancellation, the helper that fills ahead, reads cut to a measured size.

use std::io::Write;
use std::sync::Arc;

use super::*;

/// No advice: the tests' destinations are vectors of the heap.
fn pages() -> PageSizes {
    PageSizes::unadvised()
}

fn file_of(bytes: &[u8]) -> crate::source::LocalFile {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    crate::source::LocalFile::new("test".into(), f, None).unwrap()
}

fn reads<'a>(file: &'a dyn Source, direct: bool, dst: &'a mut [u8]) -> Vec<Tagged<'a>> {
    dst.chunks_mut(1 << 20)
        .enumerate()
        .map(|(k, dst)| Tagged {
            file_index: 0,
            job: Job::Read {
                file,
                direct,
                offset: (k << 20) as u64,
                required: dst.len(),
                dst,
                hashed: false,
            },
        })
        .collect()
}

/// The flags of a load whose caller's flag is `flag`.
fn flags(flag: &Arc<AtomicBool>) -> crate::cancel::Cancel {
    crate::cancel::Cancel::default().with_caller(Arc::clone(flag))
}

#[test]
fn a_run_cancelled_before_it_starts_reads_nothing() {
    let file = file_of(&[1; 4 << 20]);
    let mut dst = vec![0u8; 4 << 20];
    let flag = Arc::new(AtomicBool::new(false));
    let done = AtomicUsize::new(0);
    flag.store(true, Ordering::Relaxed);
    let (result, _, _) = run(
        reads(&file, false, &mut dst),
        Concurrency::pinned(2),
        &pages(),
        &|_, _| {
            done.fetch_add(1, Ordering::Relaxed);
        },
        &flags(&flag),
    );
    let failure = result.unwrap_err();
    assert_eq!((failure.file_index, failure.offset), (0, 0));
    assert!(
        failure
            .error
            .get_ref()
            .is_some_and(|e| e.to_string() == "the load was cancelled")
    );
    assert_eq!(done.load(Ordering::Relaxed), 0);
    assert!(dst.iter().all(|&b| b == 0));
}

#[test]
fn a_run_cancelled_midway_takes_no_further_job() {
    let file = file_of(&[1; 4 << 20]);
    let mut dst = vec![0u8; 4 << 20];
    let flag = Arc::new(AtomicBool::new(false));
    let done = AtomicUsize::new(0);
    let (result, _, _) = run(
        reads(&file, false, &mut dst),
        Concurrency::pinned(1),
        &pages(),
        &|_, _| {
            done.fetch_add(1, Ordering::Relaxed);
            flag.store(true, Ordering::Relaxed);
        },
        &flags(&flag),
    );
    // The one reader finished its first job, then saw the flag before
    // the second.
    let failure = result.unwrap_err();
    assert_eq!((failure.file_index, failure.offset), (0, 1 << 20));
    assert_eq!(done.load(Ordering::Relaxed), 1);
    assert!(dst[..1 << 20].iter().all(|&b| b == 1));
    assert!(dst[1 << 20..].iter().all(|&b| b == 0));
}

#[test]
fn a_run_given_no_flags_is_not_cancelled() {
    let file = file_of(&[1; 2 << 20]);
    let mut dst = vec![0u8; 2 << 20];
    let (result, _, _) = run(
        reads(&file, false, &mut dst),
        Concurrency::pinned(2),
        &pages(),
        &|_, _| {},
        &crate::cancel::Cancel::NONE,
    );
    result.unwrap();
    assert!(dst.iter().all(|&b| b == 1));
}

#[test]
fn only_direct_reads_bring_the_helper() {
    let file = file_of(&[1; 4096]);
    let mut dst = vec![0u8; 4096];
    assert!(!reads_bypass_the_page_cache(&reads(&file, false, &mut dst)));
    assert!(reads_bypass_the_page_cache(&reads(&file, true, &mut dst)));
    assert!(!reads_bypass_the_page_cache(&[]));
}

#[test]
fn reads_filled_ahead_land_every_byte_in_fresh_memory() {
    let len = 24 << 20;
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let file = file_of(&bytes);
    for direct in [false, true] {
        let mut owned = crate::storage::Buffer::new(len).unwrap();
        let dst = owned.bytes_mut();
        let (result, _, _) = run(
            reads(&file, direct, dst),
            Concurrency::pinned(2),
            &pages(),
            &|_, _| {},
            &crate::cancel::Cancel::NONE,
        );
        result.unwrap();
        assert!(owned.bytes_mut()[..] == bytes[..], "direct {direct}");
    }
}

#[test]
fn a_reader_passes_over_a_job_the_helper_holds_and_waits_only_for_the_last() {
    let file = file_of(&[1; 3 << 20]);
    let mut dst = vec![0u8; 3 << 20];
    let queue = queue_of(reads(&file, false, &mut dst));
    let cursor = AtomicUsize::new(0);
    // The helper faulting the first job in, under its lock.
    let held = queue[0].lock().unwrap();
    let next = take(&queue, &cursor).unwrap();
    assert_eq!(next.index, 1);
    assert_eq!(cursor.load(Ordering::Acquire), 0, "the cursor stays on it");
    assert_eq!(take(&queue, &cursor).unwrap().index, 2);
    // Only the held job is left: a reader waits for it, and takes it.
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let start = std::time::Instant::now();
            take(&queue, &cursor).map(|t| (t.index, start.elapsed()))
        });
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(held);
        let (index, waited) = reader.join().unwrap().unwrap();
        assert_eq!(index, 0);
        assert!(waited >= std::time::Duration::from_millis(40), "{waited:?}");
    });
    assert!(take(&queue, &cursor).is_none());
    assert_eq!(cursor.load(Ordering::Acquire), 3, "past every slot");
}
