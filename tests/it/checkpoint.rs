//! `Checkpoint`: a checkpoint opened from its headers alone, then read tensor
//! by tensor, into the caller's memory, or as a filtered load; in every read
//! mode (`read_modes`), equal to what a whole load gives.

use crate::common::*;
use safeload::{Checkpoint, ErrorKind, Loader, report::Strategy};
use tempfile::tempdir;

#[test]
fn opening_lists_every_tensor_in_load_order_from_the_headers() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    let sd = safeload::load_state_dict(&index, None).unwrap();
    let ck = Checkpoint::open(&index).unwrap();
    let names: Vec<&str> = ck.tensors().map(|t| t.name()).collect();
    assert_eq!(names, sd.names().collect::<Vec<_>>());
    assert_eq!(ck.len(), sd.len());
    assert!(!ck.is_empty());
    assert_eq!(ck.total_bytes(), sd.total_bytes());
    assert_eq!(ck.metadata(), sd.metadata());
    assert_eq!(ck.index_metadata(), sd.index_metadata());
    assert_eq!(ck.files().count(), 3);
    for spec in &specs {
        let info = ck.get(&spec.name).unwrap();
        assert_eq!(info.dtype(), spec.dtype, "{}", spec.name);
        assert_eq!(info.shape(), &spec.shape[..], "{}", spec.name);
        assert_eq!(info.nbytes(), spec.data.len() as u64, "{}", spec.name);
        assert_eq!(info.num_elements(), spec.shape.iter().product::<usize>());
        let tensor = sd.get(&spec.name).unwrap();
        let file = sd
            .report()
            .files
            .iter()
            .find(|f| info.file() == f.path)
            .unwrap();
        assert!(file.tensors > 0 && tensor.nbytes() == info.nbytes());
    }
    assert!(ck.get("no.such.tensor").is_none());
}

#[test]
fn reads_equal_the_loaded_tensors_in_both_modes() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    for (mode, loader) in read_modes() {
        let buffered = mode != "mmap";
        let ck = loader.open(&index).unwrap();
        for file in &ck.report().files {
            let expected = if buffered {
                Strategy::Buffered
            } else {
                Strategy::Mmap
            };
            assert_eq!(file.strategy, expected, "{}", file.explain());
            assert_eq!(file.bytes_read, 0, "nothing is read at open");
        }
        for spec in &specs {
            let tensor = ck.read(&spec.name).unwrap();
            assert_eq!(tensor.name(), spec.name);
            assert_eq!(tensor.dtype(), spec.dtype);
            assert_eq!(tensor.shape(), &spec.shape[..]);
            assert_eq!(tensor.as_bytes(), &spec.data[..], "{} {mode}", spec.name);
            if buffered {
                assert!(
                    tensor.is_aligned(),
                    "{}: owned bytes are aligned",
                    spec.name
                );
            }
            let mut mine = vec![0xEEu8; spec.data.len()];
            ck.read_into(&spec.name, &mut mine).unwrap();
            assert_eq!(mine, spec.data, "{}", spec.name);
        }
    }
}

#[test]
fn reads_name_what_is_wrong() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    for (mode, loader) in read_modes() {
        let ck = loader.open(&path).unwrap();
        let err = ck.read("missing").unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::TensorNotFound {
                tensor: "missing".into()
            },
            "{mode}"
        );
        assert_eq!(err.tensor(), Some("missing"));
        assert_eq!(err.path(), Some(path.as_path()));
        let info = ck.get("f32.matrix").unwrap();
        let mut short = vec![0u8; info.nbytes() as usize - 1];
        let err = ck.read_into("f32.matrix", &mut short).unwrap_err();
        assert_eq!(
            err.kind(),
            &ErrorKind::LengthMismatch {
                tensor: Some("f32.matrix".into()),
                expected: info.nbytes(),
                actual: info.nbytes() - 1
            }
        );
        assert!(
            err.to_string().contains("f32.matrix"),
            "the error names the tensor: {err}"
        );
    }
}

#[test]
fn a_file_truncated_after_open_is_a_size_mismatch_for_positional_reads() {
    let dir = tempdir().unwrap();
    let path = write_single(dir.path(), &every_dtype());
    let ck = Loader::new().disable_mmap(true).open(&path).unwrap();
    let last = ck
        .tensors()
        .filter(|t| t.nbytes() > 0)
        .last()
        .unwrap()
        .name()
        .to_string();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let err = ck.read(&last).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::SizeMismatch { expected, actual } if *expected == len && *actual == len - 1),
        "{err:?}"
    );
}

#[test]
fn a_filtered_load_from_an_open_checkpoint_equals_a_filtered_load() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    let keep = |name: &str| name.starts_with('f') || name.ends_with(".scalar");
    for (mode, loader) in read_modes() {
        let ck = loader.clone().open(&index).unwrap();
        let from_ck = ck.load_filtered(keep).unwrap();
        let direct = loader.filter(keep).load(&index).unwrap();
        assert_eq!(loaded(&from_ck), loaded(&direct), "{mode}");
        assert!(from_ck.len() < specs.len());
        // Twice from one checkpoint: the files stay open and usable.
        assert_eq!(loaded(&ck.load_filtered(keep).unwrap()), loaded(&direct));
        let all = ck.load_filtered(|_| true).unwrap();
        assert_eq!(all.len(), specs.len());
    }
}

#[test]
fn a_checkpoint_is_shared_by_threads() {
    let dir = tempdir().unwrap();
    let specs = every_dtype();
    let index = write_sharded(dir.path(), &specs, 3);
    for (_, loader) in read_modes() {
        let ck = loader.open(&index).unwrap();
        std::thread::scope(|scope| {
            for chunk in specs.chunks(7) {
                let ck = ck.clone();
                scope.spawn(move || {
                    for spec in chunk {
                        assert_eq!(ck.read(&spec.name).unwrap().as_bytes(), &spec.data[..]);
                    }
                });
            }
        });
    }
}

/// A BERT word-embedding table read alone, buffered: exactly its 46,881,792 bytes (not
/// rounded up to the 2 MiB of its buffer), the reference's; and a 3 MiB F16 tensor
/// streamed gives as many values as it has elements.
#[test]
fn a_tensor_read_into_a_buffer_of_its_own_is_exactly_its_bytes() {
    let dir = tempdir().unwrap();
    let specs = [
        spec(
            "embeddings.word_embeddings.weight",
            safeload::Dtype::F32,
            &[30522, 384],
        ),
        spec("encoder.f16", safeload::Dtype::F16, &[3, 524_288]),
    ];
    let path = write_single(dir.path(), &specs);
    let reference = naive_load(std::slice::from_ref(&path));
    for (name, loader) in read_modes() {
        let ck = loader.open(&path).unwrap();
        for want in &reference {
            let t = ck.read(&want.name).unwrap();
            assert_eq!(t.nbytes(), want.data.len() as u64, "{name} {}", want.name);
            assert_eq!(t.as_bytes().len(), want.data.len(), "{name} {}", want.name);
            assert!(t.as_bytes() == want.data.as_slice(), "{name} {}", want.name);
        }
        assert_eq!(
            ck.read("embeddings.word_embeddings.weight")
                .unwrap()
                .as_bytes()
                .len(),
            46_881_792
        );
        let _streaming = streaming();
        ck.for_each(1 << 20, |t| {
            let want = reference.iter().find(|s| s.name == t.name()).unwrap();
            assert_eq!(t.as_bytes().len(), want.data.len(), "{name} {}", t.name());
            if t.name() == "encoder.f16" {
                assert_eq!(t.to_f32().unwrap().len(), 3 * 524_288);
            }
            Ok::<(), safeload::Error>(())
        })
        .unwrap();
    }
}
