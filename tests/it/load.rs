//! Loading: every dtype, single and sharded, both strategies, equal to what was written.

use safeload::report::DirectIo;
use std::sync::Arc;

use crate::common::*;
use safeload::{Dtype, ErrorKind, Loader, StateDict, Tensor, load_state_dict, report::Strategy};
use tempfile::tempdir;

#[test]
fn single_file_every_dtype_both_modes() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let path = write_single(dir.path(), &specs);
    for disable in MODES {
        let sd = load_state_dict(&path, Some(disable)).unwrap();
        assert_eq!(loaded(&sd), sorted(&specs), "disable_mmap={disable}");
        let expected = if disable {
            Strategy::Buffered
        } else {
            Strategy::Mmap
        };
        assert!(sd.report().files.iter().all(|f| f.strategy == expected));
        assert_eq!(sd.metadata().get("format").map(String::as_str), Some("pt"));
        assert_eq!(
            sd.total_bytes(),
            specs.iter().map(|s| s.data.len() as u64).sum::<u64>()
        );
    }
}

#[test]
fn sharded_every_dtype_both_modes_and_entry_points() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    for disable in MODES {
        for entry in [index.clone(), dir.path().to_path_buf()] {
            let sd = load_state_dict(&entry, Some(disable)).unwrap();
            assert_eq!(loaded(&sd), sorted(&specs));
            assert_eq!(sd.report().files.len(), 3);
            let total = specs.iter().map(|s| s.data.len()).sum::<usize>();
            assert_eq!(
                sd.index_metadata().unwrap()["total_size"],
                total.to_string()
            );
        }
    }
}

#[test]
fn mmap_and_buffered_equal_tensor_for_tensor() {
    let dir = tempdir().unwrap();
    let index = write_sharded(dir.path(), &every_dtype(), 4);
    let mapped = load_state_dict(&index, Some(false)).unwrap();
    let buffered = load_state_dict(&index, Some(true)).unwrap();
    assert_eq!(mapped.len(), buffered.len());
    for ((a_name, a), (b_name, b)) in mapped.iter().zip(buffered.iter()) {
        assert_eq!(a_name, b_name);
        assert_eq!(a, b);
    }
}

#[test]
fn order_is_shard_then_offset() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    for disable in MODES {
        let sd = load_state_dict(&index, Some(disable)).unwrap();
        let mut expected = Vec::new();
        for i in 0..3 {
            let bytes = std::fs::read(dir.path().join(shard_name(i, 3))).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
            let mut names: Vec<_> = st
                .names()
                .into_iter()
                .map(|n| (meta.info(n).unwrap().data_offsets, n.to_string()))
                .collect();
            names.sort();
            expected.extend(names.into_iter().map(|(_, n)| n));
        }
        assert_eq!(sd.names().collect::<Vec<_>>(), expected);
    }
}

#[test]
fn engine_settings_match_the_naive_reader() {
    // Chunks far smaller than tensors and than files, so chunks straddle
    // tensors and files end mid-chunk; files of 0, 1, chunk-1, chunk and
    // chunk+1 data bytes.
    let chunk = 4096;
    let dir = tempdir().unwrap();
    let mut specs = vec![
        spec("big", Dtype::F32, &[3, 1000]),
        spec("odd", Dtype::U8, &[12_345]),
    ];
    for (i, len) in [0, 1, chunk - 1, chunk, chunk + 1].into_iter().enumerate() {
        specs.push(spec(&format!("len{i}"), Dtype::U8, &[len]));
    }
    // One tensor per shard for the sized ones: 7 shards.
    let index = write_sharded(dir.path(), &specs, specs.len());
    let files: Vec<_> = (0..specs.len())
        .map(|i| dir.path().join(shard_name(i, specs.len())))
        .collect();
    let naive = naive_load(&files);
    for chunk_size in [chunk, 3 * chunk + 1, 8 << 20] {
        for readers in [1, 2, 5] {
            for direct in [false, true] {
                let sd = Loader::new()
                    .disable_mmap(true)
                    .direct_io(direct)
                    .read_size(chunk_size)
                    .io_concurrency(readers)
                    .threads(1 + readers % 3)
                    .load(&index)
                    .unwrap();
                let what = format!("chunk {chunk_size}, readers {readers}, direct {direct}");
                assert_eq!(loaded(&sd), naive, "{what}");
                if direct {
                    // Direct reads where the filesystem takes them (ext4, xfs;
                    // not tmpfs, which refuses O_DIRECT and falls back).
                    let refused = sd
                        .report()
                        .files
                        .iter()
                        .any(|f| f.explain().contains("O_DIRECT refused"));
                    assert!(
                        refused
                            || sd
                                .report()
                                .files
                                .iter()
                                .all(|f| f.direct_io == DirectIo::On),
                        "{what}"
                    );
                }
            }
            // Mapped and populated in parallel by the same engine.
            let sd = Loader::new()
                .disable_mmap(false)
                .populate(true)
                .read_size(chunk_size)
                .io_concurrency(readers)
                .load(&index)
                .unwrap();
            assert_eq!(
                loaded(&sd),
                naive,
                "populate, chunk {chunk_size}, readers {readers}"
            );
        }
    }
}

#[test]
fn filter_loads_only_what_it_keeps() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    for disable in MODES {
        let sd = Loader::new()
            .disable_mmap(disable)
            .filter(|name| name.starts_with("f16."))
            .load(&index)
            .unwrap();
        let expected: Vec<_> = specs
            .iter()
            .filter(|s| s.name.starts_with("f16."))
            .cloned()
            .collect();
        assert_eq!(loaded(&sd), sorted(&expected));
        // Only the shards holding f16 tensors are opened.
        let shards: std::collections::BTreeSet<_> = specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.name.starts_with("f16."))
            .map(|(i, _)| i % 3)
            .collect();
        assert_eq!(sd.report().files.len(), shards.len());
        if disable {
            let read: u64 = sd.report().files.iter().map(|f| f.bytes_read).sum();
            assert_eq!(
                read,
                sd.total_bytes(),
                "buffered reads only the kept tensors"
            );
        }
    }
}

#[test]
fn directory_resolution() {
    // model.safetensors
    let dir = tempdir().unwrap();
    let specs = vec![spec("a", Dtype::F32, &[2])];
    write_single(dir.path(), &specs);
    assert_eq!(loaded(&load_state_dict(dir.path(), None).unwrap()), specs);

    // exactly one *.safetensors file of another name
    let dir = tempdir().unwrap();
    write_file(&dir.path().join("weights.safetensors"), &specs, None);
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    assert_eq!(loaded(&load_state_dict(dir.path(), None).unwrap()), specs);

    // two candidates: an error that lists them
    write_file(&dir.path().join("other.safetensors"), &specs, None);
    let err = load_state_dict(dir.path(), None).unwrap_err();
    match err.kind() {
        ErrorKind::NoCheckpoint { found } => {
            assert_eq!(found, &["other.safetensors", "weights.safetensors"]);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("weights.safetensors"), "{err}");

    // nothing at all
    let empty = tempdir().unwrap();
    let err = load_state_dict(empty.path(), None).unwrap_err();
    assert_eq!(err.kind(), &ErrorKind::NoCheckpoint { found: vec![] });
    assert_eq!(err.path(), Some(empty.path()));
}

#[test]
#[cfg(unix)]
fn symlinked_files_like_a_hub_cache_snapshot() {
    // snapshots/<rev>/<file> -> ../../blobs/<hash>, as the Hugging Face cache lays them out.
    let root = tempdir().unwrap();
    let blobs = root.path().join("blobs");
    let snapshot = root.path().join("snapshots").join("0123abc");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(&snapshot).unwrap();
    let specs = every_dtype();
    let staging = tempdir().unwrap();
    write_sharded(staging.path(), &specs, 2);
    for entry in std::fs::read_dir(staging.path()).unwrap() {
        let entry = entry.unwrap();
        let blob = format!("blob-{}", entry.file_name().to_string_lossy().len());
        let blob = blobs.join(format!("{blob}-{}", entry.file_name().to_string_lossy()));
        std::fs::copy(entry.path(), &blob).unwrap();
        let target = std::path::Path::new("../..")
            .join("blobs")
            .join(blob.file_name().unwrap());
        std::os::unix::fs::symlink(target, snapshot.join(entry.file_name())).unwrap();
    }
    for disable in MODES {
        let sd = load_state_dict(&snapshot, Some(disable)).unwrap();
        assert_eq!(loaded(&sd), sorted(&specs));
        // Reported under the snapshot's names, not the blobs'.
        assert!(
            sd.report()
                .files
                .iter()
                .all(|f| f.path.starts_with(&snapshot))
        );
    }
}

#[test]
fn typed_views_and_conversion() {
    let dir = tempdir().unwrap();
    let halves: Vec<half::f16> = [1.0f32, -2.5, 65504.0, 0.0]
        .map(half::f16::from_f32)
        .to_vec();
    let brains: Vec<half::bf16> = [1.0f32, -2.5, 3.0e38, 1e-3]
        .map(half::bf16::from_f32)
        .to_vec();
    let floats = [1.0f32, f32::MIN_POSITIVE, -0.0, 7.25];
    let doubles = [1.0f64, -1e300, 0.1];
    let ints = [-1i32, 0, i32::MAX];
    let specs = vec![
        Spec {
            name: "h".into(),
            dtype: Dtype::F16,
            shape: vec![4],
            data: bytemuck::cast_slice(&halves).to_vec(),
        },
        Spec {
            name: "b".into(),
            dtype: Dtype::BF16,
            shape: vec![2, 2],
            data: bytemuck::cast_slice(&brains).to_vec(),
        },
        Spec {
            name: "f".into(),
            dtype: Dtype::F32,
            shape: vec![4],
            data: bytemuck::cast_slice(&floats).to_vec(),
        },
        Spec {
            name: "d".into(),
            dtype: Dtype::F64,
            shape: vec![3],
            data: bytemuck::cast_slice(&doubles).to_vec(),
        },
        Spec {
            name: "i".into(),
            dtype: Dtype::I32,
            shape: vec![3],
            data: bytemuck::cast_slice(&ints).to_vec(),
        },
        Spec {
            name: "e".into(),
            dtype: Dtype::F16,
            shape: vec![0],
            data: vec![],
        },
    ];
    let path = write_single(dir.path(), &specs);
    for disable in MODES {
        let sd = load_state_dict(&path, Some(disable)).unwrap();
        let t = |n: &str| sd.get(n).unwrap();
        assert_eq!(t("h").as_slice::<half::f16>().unwrap(), &halves[..]);
        assert_eq!(t("b").as_slice::<half::bf16>().unwrap(), &brains[..]);
        assert_eq!(t("f").as_slice::<f32>().unwrap(), &floats[..]);
        assert_eq!(t("d").as_slice::<f64>().unwrap(), &doubles[..]);
        assert_eq!(t("i").as_slice::<i32>().unwrap(), &ints[..]);
        assert!(t("e").as_slice::<half::f16>().unwrap().is_empty());
        assert!(t("e").to_f32().unwrap().is_empty());

        // Conversion against the per-element reference.
        let naive_h: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
        let naive_b: Vec<f32> = brains.iter().map(|h| h.to_f32()).collect();
        assert_eq!(t("h").to_f32().unwrap(), naive_h);
        assert_eq!(t("b").to_f32().unwrap(), naive_b);
        assert_eq!(t("f").to_f32().unwrap(), floats);
        assert_eq!(t("d").to_f32().unwrap(), doubles.map(|x| x as f32));

        // Wrong type: a dtype error naming the tensor and the file.
        let err = t("h").as_slice::<f32>().unwrap_err();
        assert!(matches!(
            err.kind(),
            ErrorKind::DtypeMismatch {
                actual: Dtype::F16,
                ..
            }
        ));
        assert_eq!(err.tensor(), Some("h"));
        assert_eq!(err.path(), Some(path.as_path()));
        assert!(matches!(
            t("i").to_f32().unwrap_err().kind(),
            ErrorKind::DtypeMismatch { .. }
        ));
        assert_eq!(t("b").shape(), [2, 2]);
        assert_eq!(t("b").num_elements(), 4);
    }
}

/// A file written without alignment, as MLX packs tensors back to back.
fn packed_file(dir: &std::path::Path) -> (std::path::PathBuf, Vec<f32>, Vec<half::f16>) {
    let floats = vec![1.5f32, -3.0, 1e-7];
    let halves = vec![half::f16::from_f32(0.5), half::f16::from_f32(-8.0)];
    let mut data = vec![7u8]; // 1 byte, then an F32 at offset 1, then an F16 at 13
    data.extend(floats.iter().flat_map(|x| x.to_le_bytes()));
    data.extend(halves.iter().flat_map(|x| x.to_le_bytes()));
    let header = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[3],"data_offsets":[1,13]},"h":{"dtype":"F16","shape":[2],"data_offsets":[13,17]}}"#;
    // Pad the header to a multiple of 8 so only the tensor offsets misalign.
    let header = format!("{header:<width$}", width = header.len().next_multiple_of(8));
    let path = dir.join("packed.safetensors");
    write_raw(&path, &header, &data);
    (path, floats, halves)
}

#[test]
fn unaligned_file_buffered_views_work() {
    let dir = tempdir().unwrap();
    let (path, floats, halves) = packed_file(dir.path());
    let sd = load_state_dict(&path, Some(true)).unwrap();
    assert_eq!(sd.get("f").unwrap().as_slice::<f32>().unwrap(), &floats[..]);
    assert_eq!(
        sd.get("h").unwrap().as_slice::<half::f16>().unwrap(),
        &halves[..]
    );
    assert!(sd.tensors().iter().all(Tensor::is_aligned));
}

#[test]
fn unaligned_file_mapped_reports_misalignment_and_converts() {
    let dir = tempdir().unwrap();
    let (path, floats, halves) = packed_file(dir.path());
    let sd = load_state_dict(&path, Some(false)).unwrap();
    let f = sd.get("f").unwrap();
    assert!(!f.is_aligned());
    let err = f.as_slice::<f32>().unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Misaligned { align: 4, .. }),
        "{err}"
    );
    assert_eq!(f.to_f32().unwrap(), floats);
    let naive: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
    assert_eq!(sd.get("h").unwrap().to_f32().unwrap(), naive);
}

#[test]
fn tensors_outlive_the_state_dict_and_cross_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<StateDict>();
    assert_send_sync::<Tensor>();
    assert_send_sync::<Loader>();
    assert_send_sync::<safeload::Error>();

    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let path = write_single(dir.path(), &specs);
    for disable in MODES {
        let tensors: Arc<Vec<Tensor>> = {
            let sd = Loader::new().disable_mmap(disable).load(&path).unwrap();
            Arc::new(sd.into_tensors())
        };
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let tensors = Arc::clone(&tensors);
                std::thread::spawn(move || {
                    tensors.iter().map(|t| t.as_bytes().len()).sum::<usize>()
                })
            })
            .collect();
        let expected: usize = specs.iter().map(|s| s.data.len()).sum();
        for h in handles {
            assert_eq!(h.join().unwrap(), expected);
        }
    }
}

#[test]
fn many_threads_load_one_checkpoint_at_once() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    let expected = sorted(&specs);
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (index, expected) = (&index, &expected);
            scope.spawn(move || {
                for round in 0..4 {
                    let sd = Loader::new()
                        .disable_mmap((t + round) % 2 == 0)
                        .io_concurrency(1 + t % 3)
                        .load(index)
                        .unwrap();
                    assert_eq!(&loaded(&sd), expected);
                }
            });
        }
    });
}

#[test]
fn runs_inside_a_caller_pool() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 5);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for disable in MODES {
        let sd = pool
            .install(|| load_state_dict(&index, Some(disable)))
            .unwrap();
        assert_eq!(loaded(&sd), sorted(&specs));
        assert_eq!(sd.report().threads, 1, "defaults to the pool's size");
    }
}

#[test]
fn report_describes_every_file() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    for disable in MODES {
        let sd = load_state_dict(&index, Some(disable)).unwrap();
        let report = sd.report();
        for file in &report.files {
            assert!(file.path.exists());
            assert_eq!(file.size, std::fs::metadata(&file.path).unwrap().len());
            assert!(
                file.explain().contains("disable_mmap"),
                "{}",
                file.explain()
            );
            assert_eq!(file.bytes_read > 0, disable);
        }
        let text = report.to_string();
        assert!(
            text.contains(if disable { "buffered" } else { "mmap" }),
            "{text}"
        );
        assert!(text.contains(&shard_name(2, 3)), "{text}");
    }
}

/// A buffered load of a local disk with `O_DIRECT`: its fresh memory's size is
/// chosen with base pages weighed for the smaller requests they make, and the
/// report says so; `HugePages::Off` still means base pages.
#[test]
fn direct_reads_of_a_local_disk_say_so() {
    // Under the target directory, on the disk the build is on (a temporary
    // directory may be a tmpfs).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let specs: Vec<Spec> = (0..4)
        .map(|i| spec(&format!("w{i}"), Dtype::F32, &[1024, 1024]))
        .collect();
    let path = write_sharded(dir.path(), &specs, 2);
    let offered = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .is_ok_and(|t| !t.contains("[never]"));
    for mode in [safeload::HugePages::Auto, safeload::HugePages::Off] {
        let sd = Loader::new()
            .disable_mmap(true)
            .direct_io(true)
            .huge_pages(mode)
            .load(&path)
            .unwrap();
        assert_eq!(sorted(&loaded(&sd)), sorted(&specs));
        let report = sd.report();
        let direct = report.files.iter().all(|f| f.direct_io == DirectIo::On);
        let fresh = report
            .fresh_memory
            .as_ref()
            .expect("fresh memory faulted in");
        let total = fresh.huge_bytes + fresh.base_bytes;
        match mode {
            safeload::HugePages::Auto if direct && offered => {
                assert_eq!(fresh.reason, safeload::report::PageReason::DiskReads);
                assert!(total > 0, "{fresh}");
                assert!(report.to_string().contains("direct reads of a local disk"));
            }
            safeload::HugePages::Auto => {
                assert_ne!(fresh.reason, safeload::report::PageReason::DiskReads)
            }
            _ => assert_eq!(fresh.base_bytes, total, "{fresh}"),
        }
    }
}
