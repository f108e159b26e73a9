//! The node copy across jobs and versions: two jobs side by side, a file
//! replaced between two jobs, a filter that keeps whole files or not.

use safeload_testfs::{Mount, Options, skip_without_fuse};
use safetensors::Dtype;

use super::*;

/// Two jobs on one node, different checkpoints, side by side: each its own
/// copy, each byte of each served once.
#[test]
fn two_jobs_with_different_checkpoints_side_by_side() {
    if skip_without_fuse() {
        return;
    }
    let source = tempfile::tempdir().unwrap();
    let (a, b) = (source.path().join("a"), source.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let (_, expected_a) = write_checkpoint(&a, 16, 2, "a");
    let (_, expected_b) = write_checkpoint(&b, 16, 2, "b");
    let total = total_size(&shards_of(&a)) + total_size(&shards_of(&b));
    let fs = Mount::new(source.path(), Options::default()).unwrap();
    let index = |d: &str| fs.path().join(d).join("model.safetensors.index.json");
    fs.reset_stats();
    let (job_a, job_b) = (job_id(), job_id());
    let mut ranks: Vec<(u64, Rank)> = (0..2)
        .flat_map(|r| {
            [
                (expected_a, Rank::spawn(&index("a"), (r, 2), &job_a, &[])),
                (expected_b, Rank::spawn(&index("b"), (r, 2), &job_b, &[])),
            ]
        })
        .collect();
    for (expected, rank) in &mut ranks {
        let r = rank.loaded();
        r.assert_copied(*expected);
    }
    for (_, rank) in ranks {
        rank.release();
    }
    let served = fs.stats().bytes_read;
    assert!(
        served as f64 <= 1.05 * total as f64,
        "{served} served for {total}"
    );
}

/// What keys a node copy is the job's identity: two jobs on one node whose
/// launcher gives the same id (here torchrun's run id) meet in one copy,
/// and `SAFELOAD_JOB_ID` set apart keeps them apart (each job its own
/// copy, made by one of its own ranks).
#[test]
fn jobs_with_the_same_launcher_id_meet_unless_the_job_id_sets_them_apart() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(8, Options::default());
    let run_id = job_id();
    let hold = (HOLD, "1".to_string());
    // The ranks of two jobs, the first job's holding its copy meanwhile:
    // per job, the pids of the processes that made its ranks' copies.
    let makers_of = |job_ids: [Option<&str>; 2]| -> Vec<Vec<u32>> {
        let mut jobs: Vec<Vec<Rank>> = Vec::new();
        let mut makers = Vec::new();
        for id in job_ids {
            let mut extra = vec![hold.clone()];
            if let Some(id) = id {
                extra.push(("SAFELOAD_JOB_ID", id.to_string()));
            }
            let mut ranks = spawn_job(&setup.index, 2, &run_id, &extra);
            let mut made: Vec<u32> = Vec::new();
            for rank in &mut ranks {
                let r = rank.loaded();
                r.assert_copied(setup.expected);
                made.extend(r.copies.iter().map(|c| c.made_by.unwrap().0));
            }
            made.sort_unstable();
            made.dedup();
            makers.push(made);
            jobs.push(ranks);
        }
        for rank in jobs.into_iter().flatten() {
            rank.release();
        }
        makers
    };
    let met = makers_of([None, None]);
    assert_eq!(met[0].len(), 1, "{met:?}");
    assert_eq!(met[0], met[1], "the same launcher id: one copy for both");
    let apart = makers_of([Some("serve-a"), Some("serve-b")]);
    assert_eq!((apart[0].len(), apart[1].len()), (1, 1), "{apart:?}");
    assert_ne!(apart[0], apart[1], "SAFELOAD_JOB_ID apart: a copy each");
}

/// A file replaced between two jobs (same size, same job id, the first
/// job still holding its copy): the second job never gets the old copy.
#[test]
fn a_file_replaced_between_two_jobs_is_never_served_from_the_old_copy() {
    if skip_without_fuse() {
        return;
    }
    let setup = on_fuse(8, Options::default());
    let job = job_id();
    let hold = [(HOLD, "1".to_string())];
    let mut first: Vec<Rank> = (0..2)
        .map(|r| Rank::spawn(&setup.index, (r, 2), &job, &hold))
        .collect();
    for rank in &mut first {
        assert_eq!(rank.loaded().digest, setup.expected);
    }
    // The same tensors with other bytes, written beside and renamed over.
    let source = setup.source.path();
    let specs: Vec<Spec> = (0..4)
        .map(|i| spec(&format!("x.w{i:03}"), Dtype::F32, &[512, 1024]))
        .collect();
    let names: Vec<String> = naive_load(&shards_of(source))
        .into_iter()
        .map(|s| s.name)
        .collect();
    let renamed: Vec<Spec> = specs
        .into_iter()
        .zip(&names)
        .map(|(s, name)| Spec {
            name: name.clone(),
            ..s
        })
        .collect();
    let shard = shards_of(source)[0].clone();
    let keep: Vec<String> = naive_load(std::slice::from_ref(&shard))
        .into_iter()
        .map(|s| s.name)
        .collect();
    let replacement: Vec<Spec> = renamed
        .into_iter()
        .filter(|s| keep.contains(&s.name))
        .collect();
    let tmp = source.join("replacement.tmp");
    write_file(&tmp, &replacement, Some(metadata()));
    std::fs::rename(&tmp, &shard).unwrap();
    // The kernel keeps the mount's names and attributes for 1 s (the test
    // filesystem's TTL): past it, the path names the new file.
    std::thread::sleep(Duration::from_millis(1100));
    let expected = digest(&naive_load(&shards_of(source)));
    assert_ne!(expected, setup.expected);

    let mut second: Vec<Rank> = (0..2)
        .map(|r| Rank::spawn(&setup.index, (r, 2), &job, &[]))
        .collect();
    for rank in &mut second {
        let r = rank.loaded();
        assert_eq!(r.digest, expected, "the new version: {r:?}");
        for old in &first {
            let from_old = format!("received from pid {}", old.pid());
            assert!(r.notes.iter().all(|n| !n.contains(&from_old)), "{r:?}");
        }
    }
    for rank in second.into_iter().chain(first) {
        rank.release();
    }
}

/// A filter that keeps every tensor of some files: those files still get
/// the copy; a file the filter cuts says why it gets none.
#[test]
fn a_filter_keeping_whole_files_shares_them_and_says_why_not_the_others() {
    if skip_without_fuse() {
        return;
    }
    // 12 tensors round-robin over 3 files: `m.w00` keeps w000-w009, all of
    // the first file's (0, 3, 6, 9) and part of the others'.
    let setup = on_fuse(24, Options::default());
    let job = job_id();
    let filter = [(FILTER, "m.w00".to_string())];
    let kept: Vec<Spec> = naive_load(&shards_of(setup.source.path()))
        .into_iter()
        .filter(|s| s.name.starts_with("m.w00"))
        .collect();
    let mut ranks = spawn_job(&setup.index, 2, &job, &filter);
    for rank in &mut ranks {
        let r = rank.loaded();
        assert_eq!(r.digest, digest(&kept), "{r:?}");
        assert!(r.notes[0].starts_with("filled here"), "{r:?}");
        for note in &r.notes[1..] {
            assert!(note.starts_with("not used: a filter selects"), "{note}");
        }
    }
    for rank in ranks {
        rank.release();
    }
}
