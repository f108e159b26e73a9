//! What the fuzz targets share: a scratch directory, loading in both strategies, and the oracles every load or parse is checked against.
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
//!   same bytes for every tensor ([`reference`] reads a file as it does);
//! * the header parser, called directly, accepts exactly what the reference
//!   accepts, but for a tensor named twice, and reads the same tensors, with
//!   the same offsets, from what it accepts ([`check_parse`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use safeload::__fuzz::ParsedHeader;
use safeload::mount::MountTable;
use safeload::{Dtype, ErrorKind, Loader, StateDict, Tensor};
use safetensors::{SafeTensorError, SafeTensors};
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

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
            // tests/it/malformed, found by this target).
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
    let reference = match reference(file) {
        Ok(reference) => reference,
        Err(e) => panic!("safeload loaded a file the reference parser refuses: {e}"),
    };
    assert_eq!(
        reference.tensors.len(),
        loaded.len(),
        "tensor counts differ"
    );
    for (name, tensor) in loaded.iter() {
        reference
            .tensor(name)
            .assert_same(name, tensor.dtype(), tensor.shape(), tensor.as_bytes());
    }
}

/// A whole file as the reference parser reads it.
pub struct Reference<'a> {
    /// The header's length in bytes, after the 8-byte prefix.
    pub header_len: usize,
    /// Every tensor by name; of a name written twice, the last entry, which
    /// is the one the reference keeps.
    pub tensors: BTreeMap<String, ReferenceTensor<'a>>,
    /// The `__metadata__` object.
    pub metadata: Option<HashMap<String, String>>,
}

/// One tensor as the reference parser reads it.
pub struct ReferenceTensor<'a> {
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its byte range in the data section.
    pub data_offsets: (usize, usize),
    /// Its bytes.
    pub data: &'a [u8],
}

/// The verdict of [`SafeTensors::deserialize`] on `file`, and, when it
/// accepts, every tensor and the metadata as it reads them (its offsets and
/// metadata through [`SafeTensors::read_metadata`], the first half of
/// `deserialize`, which the `SafeTensors` it returns does not give back).
pub fn reference(file: &[u8]) -> Result<Reference<'_>, SafeTensorError> {
    let deserialized = SafeTensors::deserialize(file)?;
    let (header_len, metadata) =
        SafeTensors::read_metadata(file).expect("read_metadata accepts what deserialize accepts");
    let tensors = metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let view = deserialized
                .tensor(&name)
                .expect("the reference gives every tensor it lists");
            let tensor = ReferenceTensor {
                dtype: info.dtype,
                shape: info.shape.clone(),
                data_offsets: info.data_offsets,
                data: view.data(),
            };
            (name, tensor)
        })
        .collect();
    Ok(Reference {
        header_len,
        tensors,
        metadata: metadata.metadata().clone(),
    })
}

impl<'a> Reference<'a> {
    /// The tensor `name`, which safeload found: it must be in the reference too.
    pub fn tensor(&self, name: &str) -> &ReferenceTensor<'a> {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("{name}: missing from the reference"))
    }
}

impl ReferenceTensor<'_> {
    /// Asserts that what safeload gives for the tensor `name` is this: the
    /// same dtype, shape and bytes.
    pub fn assert_same(&self, name: &str, dtype: Dtype, shape: &[usize], bytes: &[u8]) {
        assert_eq!(self.dtype, dtype, "{name}: dtype");
        assert_eq!(self.shape, shape, "{name}: shape");
        assert!(self.data == bytes, "{name}: bytes differ");
    }
}

/// The oracle of the `header_parse` target: `ours`, the header parser's
/// answer on `file` (`safeload::__fuzz::parse_file`), against the reference's.
///
/// * Both refuse, or both accept; the one difference allowed is a tensor
///   named twice, which the reference collapses to the last entry and
///   safeload refuses, saying so and naming it (the crate docs' "Safety and
///   limits"; `tests/it/malformed` and the property tests allow the same
///   one). That the header names a tensor twice is found here independently
///   ([`tensor_names_written_twice`]), not taken from safeload's reason.
/// * On accept: the same tensors, with the same dtype, shape, offsets and
///   bytes; the data section where the reference has it; the tensors in
///   file order (by offsets, ties by name); the same metadata; no name
///   written twice.
/// * A refusal is a header error, and displays without panicking.
pub fn check_parse(file: &[u8], ours: Result<ParsedHeader, ErrorKind>) {
    match (ours, reference(file)) {
        (Ok(ours), Ok(reference)) => check_parsed(file, &ours, &reference),
        (Err(ours), Err(_)) => {
            assert!(is_header_kind(&ours), "not a header error: {ours:?}");
            let _ = ours.to_string();
        }
        (Ok(_), Err(e)) => panic!("safeload accepts a header the reference refuses: {e}"),
        (Err(ours), Ok(_)) => {
            let twice = tensor_names_written_twice(file);
            assert!(
                !twice.is_empty(),
                "the reference accepts a header safeload refuses: {ours:?}"
            );
            assert!(
                matches!(
                    &ours,
                    ErrorKind::InvalidHeader { reason } if reason.contains("twice")
                        && twice.iter().any(|name| reason.contains(&format!("{name:?}")))
                ),
                "a header naming {twice:?} twice, refused for another reason: {ours:?}"
            );
        }
    }
}

/// Both accept: the same reading of the file.
fn check_parsed(file: &[u8], ours: &ParsedHeader, reference: &Reference<'_>) {
    assert_eq!(
        ours.data_start,
        8 + reference.header_len as u64,
        "data start"
    );
    assert_eq!(
        ours.tensors.len(),
        reference.tensors.len(),
        "tensor counts differ"
    );
    for pair in ours.tensors.windows(2) {
        let [a, b] = pair else { unreachable!() };
        assert!(
            (a.data_offsets, &a.name) < (b.data_offsets, &b.name),
            "{:?} before {:?}: not in file order",
            a.name,
            b.name
        );
    }
    for tensor in &ours.tensors {
        let name = &tensor.name;
        let expected = reference.tensor(name);
        let (start, end) = expected.data_offsets;
        assert_eq!(
            tensor.data_offsets,
            (start as u64, end as u64),
            "{name}: data_offsets"
        );
        let bytes = usize::try_from(ours.data_start)
            .ok()
            .and_then(|data_start| file.get(data_start + start..data_start + end))
            .unwrap_or_else(|| panic!("{name}: data_offsets past the end of the file"));
        expected.assert_same(name, tensor.dtype, &tensor.shape, bytes);
    }
    let end = ours.tensors.last().map_or(0, |t| t.data_offsets.1);
    assert_eq!(ours.data_start + end, file.len() as u64, "file length");
    assert_eq!(ours.metadata, reference.metadata, "metadata");
    assert!(
        tensor_names_written_twice(file).is_empty(),
        "accepted a header that names a tensor twice"
    );
}

/// The errors a header can be refused with.
fn is_header_kind(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::FileTooSmall { .. }
            | ErrorKind::HeaderTooLarge { .. }
            | ErrorKind::HeaderOutOfBounds { .. }
            | ErrorKind::InvalidHeader { .. }
            | ErrorKind::SizeMismatch { .. }
    )
}

/// The tensor names (keys of the header's object other than `__metadata__`)
/// written more than once in `file`'s header; empty if the header is not a
/// JSON object. Read with serde_json alone, key by key, as a map type would
/// hide the repeats; values are skipped unchecked, as only the keys count.
pub fn tensor_names_written_twice(file: &[u8]) -> BTreeSet<String> {
    /// Collects the keys seen twice.
    struct Twice(BTreeSet<String>);
    impl<'de> de::Deserialize<'de> for Twice {
        fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_map(Keys)
        }
    }
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Twice;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Twice, A::Error> {
            let (mut seen, mut twice) = (BTreeSet::new(), BTreeSet::new());
            while let Some(key) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if key != "__metadata__" && !seen.insert(key.clone()) {
                    twice.insert(key);
                }
            }
            Ok(Twice(twice))
        }
    }
    let json = file
        .get(..8)
        .and_then(|prefix| usize::try_from(u64::from_le_bytes(prefix.try_into().ok()?)).ok())
        .and_then(|len| file.get(8..8usize.checked_add(len)?));
    json.and_then(|json| serde_json::from_slice::<Twice>(json).ok())
        .map_or_else(BTreeSet::new, |Twice(names)| names)
}

/// One tensor of a fixture shard: name, dtype, shape.
pub type FixtureTensor = (&'static str, Dtype, &'static [usize]);

/// The tensors of the fixed shards next to the fuzzed index, by shard name.
/// The seed corpus (`fuzz/corpus/seed-index/`, written by
/// `tests/it/malformed`) names the same files and tensors.
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
