//! What the fuzz targets share: a scratch directory, loading in both strategies, and the oracles every load is checked against.
//!
//! The oracles turn "did not panic" into stronger properties, so that a wrong
//! answer is a crash too:
//!
//! * mmap and buffered loads of the same bytes agree: both fail with the same
//!   [`ErrorKind`], or both load the same tensors;
//! * a loaded tensor's bytes are touched end to end, and converted to `f32`
//!   where its dtype allows; a buffered tensor is always aligned;
//! * a single file that loads is also accepted by the reference parser
//!   ([`safetensors::SafeTensors::deserialize`], the naive twin), which gives the
//!   same bytes for every tensor.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safeload::mount::MountTable;
use safeload::{Dtype, ErrorKind, Loader, StateDict, Tensor};

/// A directory of this process's own for the files a target writes: under
/// `/dev/shm` where it exists (a write per execution costs no disk I/O there),
/// else the system's temporary directory. Named by target and process id, so
/// that parallel jobs do not share files; created once, left for the OS (or
/// `rm -rf /dev/shm/safeload-fuzz-*`) to clean.
pub fn scratch(target: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("safeload-fuzz-{target}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("creating the scratch directory");
        dir
    })
}

/// Loads `path` buffered, then mapped. One reader and one file at a time: the
/// inputs are tiny, and threads would only cost executions per second. An
/// empty mount table, because reading `/proc/self/mountinfo` on every
/// execution would cost most of the time and test nothing new.
pub fn load_both(path: &Path) -> [Result<StateDict, safeload::Error>; 2] {
    static NO_MOUNTS: OnceLock<MountTable> = OnceLock::new();
    let table = NO_MOUNTS.get_or_init(|| MountTable::parse(""));
    [true, false].map(|disable_mmap| {
        Loader::new()
            .disable_mmap(disable_mmap)
            .threads(1)
            .io_concurrency(1)
            .mount_table(table.clone())
            .load(path)
    })
}

/// Checks that the two strategies agree, and touches every tensor of a
/// successful load. Returns the loaded state dict, if any.
pub fn check_agreement(results: [Result<StateDict, safeload::Error>; 2]) -> Option<StateDict> {
    let [buffered, mapped] = results;
    match (buffered, mapped) {
        (Ok(buffered), Ok(mapped)) => {
            assert_eq!(buffered.len(), mapped.len(), "tensor counts differ");
            for ((name_b, b), (name_m, m)) in buffered.iter().zip(mapped.iter()) {
                assert_eq!(name_b, name_m, "tensor order differs");
                assert!(b == m, "{name_b}: buffered and mapped tensors differ");
                assert!(b.is_aligned(), "{name_b}: a buffered tensor is misaligned");
                touch(b, true);
                touch(m, false);
            }
            Some(buffered)
        }
        (Err(b), Err(m)) => {
            // Reasons included: the same file must fail the same way every
            // time (see `invalid_header_reason_is_the_same_on_every_load` in
            // tests/malformed.rs, found by this target).
            assert_eq!(b.kind(), m.kind(), "buffered and mapped fail differently");
            assert_eq!(
                b.path(),
                m.path(),
                "buffered and mapped blame different files"
            );
            // Displaying an error must not panic either.
            let _ = (b.to_string(), m.to_string());
            None
        }
        (Ok(_), Err(e)) => panic!("buffered load succeeded, mapped failed: {e:?}"),
        (Err(e), Ok(_)) => panic!("mapped load succeeded, buffered failed: {e:?}"),
    }
}

/// Reads every byte of a tensor and converts it where the dtype allows; a
/// buffered tensor must also give a zero-copy typed view.
fn touch(tensor: &Tensor, buffered: bool) {
    let bytes = tensor.as_bytes();
    let sum = bytes.iter().fold(0u8, |acc, b| acc.wrapping_add(*b));
    std::hint::black_box(sum);
    let bits = tensor.num_elements() as u128 * tensor.dtype().bitsize() as u128;
    assert_eq!(
        bits,
        bytes.len() as u128 * 8,
        "{}: shape and byte length disagree",
        tensor.name()
    );
    match tensor.dtype() {
        Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64 => {
            let floats = tensor.to_f32().expect("a float tensor converts to f32");
            assert_eq!(floats.len(), tensor.num_elements());
        }
        _ => assert!(matches!(
            tensor.to_f32().map_err(|e| e.kind().clone()),
            Err(ErrorKind::DtypeMismatch { .. })
        )),
    }
    if buffered && tensor.dtype() == Dtype::F32 {
        let view = tensor
            .as_slice::<f32>()
            .expect("a buffered f32 tensor is aligned");
        assert_eq!(view.len(), tensor.num_elements());
    }
}

/// The naive twin of a single-file load: the reference parser must accept the
/// same bytes and give every tensor the same dtype, shape and bytes.
pub fn check_against_reference(file: &[u8], loaded: &StateDict) {
    let reference = match safetensors::SafeTensors::deserialize(file) {
        Ok(reference) => reference,
        Err(e) => panic!("safeload loaded a file the reference parser refuses: {e}"),
    };
    assert_eq!(reference.len(), loaded.len(), "tensor counts differ");
    for (name, tensor) in loaded.iter() {
        let view = reference
            .tensor(name)
            .unwrap_or_else(|e| panic!("{name}: missing from the reference: {e}"));
        assert_eq!(view.dtype(), tensor.dtype(), "{name}: dtype");
        assert_eq!(view.shape(), tensor.shape(), "{name}: shape");
        assert!(view.data() == tensor.as_bytes(), "{name}: bytes differ");
    }
}

/// One tensor of a fixture shard: name, dtype, shape.
pub type FixtureTensor = (&'static str, Dtype, &'static [usize]);

/// The tensors of the fixed shards next to the fuzzed index, by shard name.
/// The seed corpus (`fuzz/corpus/seed-index/`, written by
/// `tests/malformed.rs`) names the same files and tensors.
pub const INDEX_SHARDS: [(&str, &[FixtureTensor]); 2] = [
    (
        "a.safetensors",
        &[("x", Dtype::F32, &[2]), ("y", Dtype::BF16, &[3])],
    ),
    (
        "b.safetensors",
        &[("z", Dtype::U8, &[4]), ("e", Dtype::F16, &[0])],
    ),
];

/// Tensors that live where no index may reach: `../outside.safetensors` (in
/// the parent of the checkpoint directory) and `sub/inner.safetensors` (in a
/// subdirectory). Loading either is a confinement bug.
pub const UNREACHABLE_TENSORS: [&str; 2] = ["outside", "inner"];

/// Writes the fixed shards once and returns the checkpoint directory:
///
/// ```text
/// <scratch>/outside.safetensors        tensor "outside"
/// <scratch>/ckpt/a.safetensors         x, y
/// <scratch>/ckpt/b.safetensors         z, e
/// <scratch>/ckpt/sub/inner.safetensors tensor "inner"
/// <scratch>/ckpt/model.safetensors.index.json  <- the fuzzed bytes
/// ```
pub fn index_fixture() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = scratch("index");
        let ckpt = root.join("ckpt");
        std::fs::create_dir_all(ckpt.join("sub")).expect("creating the fixture");
        for (shard, tensors) in INDEX_SHARDS {
            write_shard(&ckpt.join(shard), tensors);
        }
        write_shard(
            &root.join("outside.safetensors"),
            &[("outside", Dtype::U8, &[1])],
        );
        write_shard(
            &ckpt.join("sub").join("inner.safetensors"),
            &[("inner", Dtype::U8, &[1])],
        );
        ckpt
    })
}

/// The bytes written for a fixture tensor: its name, repeated.
pub fn fixture_bytes(name: &str, dtype: Dtype, shape: &[usize]) -> Vec<u8> {
    let len = shape.iter().product::<usize>() * dtype.bitsize() / 8;
    name.bytes().cycle().take(len).collect()
}

fn write_shard(path: &Path, tensors: &[FixtureTensor]) {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(name, dtype, shape)| fixture_bytes(name, *dtype, shape))
        .collect();
    let views = tensors
        .iter()
        .zip(&data)
        .map(|((name, dtype, shape), data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.to_vec(), data)
                .expect("a valid fixture tensor");
            (*name, view)
        });
    safetensors::serialize_to_file(views, None, path).expect("writing a fixture shard");
}

/// Checks a successful load of the fuzzed index against what the index says:
/// it parses as JSON, every `weight_map` entry names a fixture shard that
/// holds the tensor, and the tensors loaded are exactly those of the shards
/// named, with their fixture bytes.
pub fn check_index_load(index: &[u8], loaded: &StateDict) {
    for name in UNREACHABLE_TENSORS {
        assert!(
            !loaded.contains(name),
            "loaded {name:?} from outside the checkpoint directory"
        );
    }
    let json: serde_json::Value =
        serde_json::from_slice(index).expect("an index that loads is JSON");
    let weight_map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .expect("an index that loads has a weight_map object");
    let mut expected = std::collections::BTreeMap::new();
    for (tensor, shard) in weight_map {
        let shard = shard.as_str().expect("shard names are strings");
        let (_, tensors) = INDEX_SHARDS
            .iter()
            .find(|(name, _)| *name == shard)
            .unwrap_or_else(|| panic!("loaded an index naming {shard:?}, not a fixture shard"));
        assert!(
            tensors.iter().any(|(name, ..)| name == tensor),
            "loaded an index mapping {tensor:?} to {shard:?}, which lacks it"
        );
        for (name, dtype, shape) in tensors.iter() {
            expected.insert(*name, (*dtype, shape.to_vec()));
        }
    }
    assert_eq!(
        loaded.len(),
        expected.len(),
        "tensors loaded: {:?}",
        loaded.names().collect::<Vec<_>>()
    );
    for (name, (dtype, shape)) in expected {
        let tensor = loaded
            .get(name)
            .unwrap_or_else(|| panic!("{name:?} is missing"));
        assert_eq!(tensor.dtype(), dtype);
        assert_eq!(tensor.shape(), shape);
        assert_eq!(tensor.as_bytes(), fixture_bytes(name, dtype, &shape));
    }
}
