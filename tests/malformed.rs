//! Malformed checkpoints, built in code: each refused with its exact `ErrorKind`, naming the file at fault, in every read mode.
//!
//! Never a panic, a hang, or an allocation of the size a file claims.
//!
//! Every case runs through `load_state_dict(path, Some(true))` (buffered),
//! `Some(false)` (mapped) and `None` (decided per file), which must agree.
//! Single-file cases are built as bytes by small helpers and listed once, in
//! `header_cases!`, which makes one test per case and also feeds the fuzz
//! targets' seed corpus (see `fuzz_seeds_are_up_to_date` at the end).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use common::*;
use safeload::{Dtype, Error, ErrorKind, MAX_HEADER_LEN, load_state_dict};
use tempfile::tempdir;

// ---------------------------------------------------------------------------
// Allocation watch: the largest single allocation request of the process.
// ---------------------------------------------------------------------------

/// Forwards to the system allocator and remembers the largest request, so
/// that a test can assert that a length field of 2^64 - 1 (or a tensor of a
/// terabyte) did not lead to an attempt to allocate anything of that size.
struct LargestAllocation;

static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards its arguments to `System` unchanged, so the
// `GlobalAlloc` contract is `System`'s; the only addition is an atomic counter,
// which does not allocate.
unsafe impl GlobalAlloc for LargestAllocation {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc_zeroed`'s contract, passed on as is.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: the caller upholds `realloc`'s contract, passed on as is.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller upholds `dealloc`'s contract, passed on as is.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestAllocation = LargestAllocation;

/// Held by every test that measures the largest allocation or makes a large
/// one, so that they do not see each other's. The other tests of this file
/// allocate far less than `SMALL`.
static ALLOCATION_WATCH: Mutex<()> = Mutex::new(());

/// More than any load of these small files needs, or any other test of this
/// file allocates meanwhile (the nesting bombs' parsers reach 1 MiB), and far
/// less than the 100 MB and more that the files claim.
const SMALL: usize = 16 << 20;

fn watch_allocations() -> MutexGuard<'static, ()> {
    ALLOCATION_WATCH
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` and returns the largest single allocation requested meanwhile.
fn largest_allocation_during(f: impl FnOnce()) -> usize {
    LARGEST_ALLOCATION.store(0, Ordering::Relaxed);
    f();
    LARGEST_ALLOCATION.load(Ordering::Relaxed)
}

// ---------------------------------------------------------------------------
// The assertion every case makes.
// ---------------------------------------------------------------------------

/// Every `disable_mmap` value: buffered, mapped, decided per file.
const EVERY_MODE: [Option<bool>; 3] = [Some(true), Some(false), None];

/// Loads `path` in every mode and asserts that each fails, with the same kind,
/// blaming `at` (in `path()` and in the message). Returns the first error.
fn refused(path: &Path, at: &Path) -> Error {
    let mut errors: Vec<Error> = Vec::new();
    for mode in EVERY_MODE {
        let err = match load_state_dict(path, mode) {
            Ok(sd) => panic!(
                "{}: disable_mmap={mode:?} loaded {} tensors, expected an error",
                path.display(),
                sd.len()
            ),
            Err(err) => err,
        };
        assert_eq!(err.path(), Some(at), "disable_mmap={mode:?}: {err}");
        assert!(
            err.to_string().contains(&at.display().to_string()),
            "the message names the file: {err}"
        );
        if let Some(first) = errors.first() {
            assert_eq!(
                err.kind(),
                first.kind(),
                "disable_mmap={mode:?} fails differently from Some(true)"
            );
        }
        errors.push(err);
    }
    errors.swap_remove(0)
}

/// Loads `path` in every mode and asserts that each load succeeds with these
/// tensors.
fn loads_as(path: &Path, expected: &[Spec]) {
    for mode in EVERY_MODE {
        let sd = load_state_dict(path, mode)
            .unwrap_or_else(|e| panic!("disable_mmap={mode:?}: {e} ({e:?})"));
        assert_eq!(loaded(&sd), sorted(expected), "disable_mmap={mode:?}");
    }
}

// ---------------------------------------------------------------------------
// Single files, as bytes.
// ---------------------------------------------------------------------------

/// A file: the 8-byte little-endian length of `header`, `header`, then
/// `data_len` bytes of data.
fn file(header: &str, data_len: usize) -> Vec<u8> {
    file_of_bytes(header.as_bytes(), data_len)
}

/// `file`, for a header that is not UTF-8.
fn file_of_bytes(header: &[u8], data_len: usize) -> Vec<u8> {
    with_length_field(header.len() as u64, header, data_len)
}

/// A file whose length field says `len`, whatever follows it: `rest`, then
/// `data_len` bytes of data.
fn with_length_field(len: u64, rest: &[u8], data_len: usize) -> Vec<u8> {
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend_from_slice(rest);
    bytes.extend(bytes_for("data", data_len));
    bytes
}

/// A header of one tensor `t` whose fields are given as JSON text.
fn one_tensor(dtype: &str, shape: &str, offsets: &str) -> String {
    format!(r#"{{"t":{{"dtype":{dtype},"shape":{shape},"data_offsets":{offsets}}}}}"#)
}

/// A file of one tensor `t` of the named dtype, with `data_len` bytes of data.
fn tensor_file(dtype: &str, shape: &str, offsets: &str, data_len: usize) -> Vec<u8> {
    file(&one_tensor(&format!("{dtype:?}"), shape, offsets), data_len)
}

/// A header of tensors `a` (F32 [2], bytes 0..8) and `b` (U8 [3]) with the
/// given offsets for `b`.
fn two_tensors(b_offsets: &str) -> String {
    let a = r#""a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}"#;
    format!(r#"{{{a},"b":{{"dtype":"U8","shape":[3],"data_offsets":{b_offsets}}}}}"#)
}

/// A header of two U8 [1] tensors, the second written as `second` and at
/// `offsets`.
fn two_bytes(second: &str, offsets: &str) -> String {
    let first = r#""t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}"#;
    format!(r#"{{{first},"{second}":{{"dtype":"U8","shape":[1],"data_offsets":{offsets}}}}}"#)
}

/// 2^40 U8 elements at bytes 0..2^40: a terabyte, claimed in a few bytes.
const TERABYTE: &str =
    r#"{"t":{"dtype":"U8","shape":[1099511627776],"data_offsets":[0,1099511627776]}}"#;

/// `{"<key>": [[[...]]]}`, `depth` brackets deep.
fn nested(key: &str, depth: usize) -> String {
    format!(r#"{{"{key}":{}}}"#, arrays(depth))
}

/// `[[[...]]]`, `depth` arrays deep.
fn arrays(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

/// A header of one valid tensor `t` (U8 [1], one byte of data) with an
/// unknown field `x` holding `value`: the outer object and the entry are two
/// levels of nesting, `value`'s are the rest.
fn with_unknown_field(value: &str) -> String {
    format!(r#"{{"t":{{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{value}}}}}"#)
}

/// The valid header the single-tensor cases mutate: `t`, F32 [2], 8 bytes.
const VALID_ONE: &str = r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;

/// The length a file of `header` with `data_len` bytes of data has.
fn file_len(header: &str, data_len: usize) -> u64 {
    (8 + header.len() + data_len) as u64
}

/// What a case must fail with.
enum Expect {
    /// Exactly this kind.
    Kind(ErrorKind),
    /// `InvalidHeader` whose reason mentions this text (the parser's message,
    /// so that a case cannot pass by failing for some other reason).
    InvalidHeader(&'static str),
}

fn check_header_case(name: &str, bytes: Vec<u8>, expect: Expect) {
    let dir = tempdir().unwrap();
    let path = dir.path().join(format!("{name}.safetensors"));
    fs::write(&path, bytes).unwrap();
    let err = refused(&path, &path);
    match (err.kind(), expect) {
        (actual, Expect::Kind(expected)) => assert_eq!(actual, &expected, "{name}"),
        (ErrorKind::InvalidHeader { reason }, Expect::InvalidHeader(mentions)) => assert!(
            reason.contains(mentions),
            "{name}: the reason {reason:?} should mention {mentions:?}"
        ),
        (actual, Expect::InvalidHeader(_)) => {
            panic!("{name}: expected InvalidHeader, got {actual:?}")
        }
    }
    assert!(err.io_error().is_none(), "{name}: not an I/O error");
}

/// One test per case, and `header_cases()` listing them all for the seed
/// corpus.
macro_rules! header_cases {
    ($($name:ident: $bytes:expr => $expect:expr;)*) => {
        $(
            #[test]
            fn $name() {
                check_header_case(stringify!($name), $bytes, $expect);
            }
        )*

        /// Every single-file case: its name and its bytes.
        fn header_cases() -> Vec<(&'static str, Vec<u8>)> {
            vec![$((stringify!($name), $bytes)),*]
        }
    };
}

use Expect::{InvalidHeader, Kind};

header_cases! {
    // --- The length field.
    empty_file: vec![] => Kind(ErrorKind::FileTooSmall { len: 0 });
    one_byte: vec![2] => Kind(ErrorKind::FileTooSmall { len: 1 });
    seven_bytes: vec![2, 0, 0, 0, 0, 0, 0] => Kind(ErrorKind::FileTooSmall { len: 7 });
    zero_length_header: with_length_field(0, b"", 0) => InvalidHeader("EOF");
    header_length_past_the_end: with_length_field(1000, b"{}", 0)
        => Kind(ErrorKind::HeaderOutOfBounds { len: 1000, file_len: 10 });
    header_length_one_past_the_end: with_length_field(3, b"{}", 0)
        => Kind(ErrorKind::HeaderOutOfBounds { len: 3, file_len: 10 });
    header_length_u64_max: with_length_field(u64::MAX, b"{}", 0)
        => Kind(ErrorKind::HeaderTooLarge { len: u64::MAX, limit: MAX_HEADER_LEN });
    // 8 + len overflows a u64: the limit must be checked before any addition.
    header_length_u64_max_minus_7: with_length_field(u64::MAX - 7, b"{}", 0)
        => Kind(ErrorKind::HeaderTooLarge { len: u64::MAX - 7, limit: MAX_HEADER_LEN });
    header_length_2_pow_63: with_length_field(1 << 63, b"{}", 0)
        => Kind(ErrorKind::HeaderTooLarge { len: 1 << 63, limit: MAX_HEADER_LEN });
    // The limit is checked before the file size: one past the cap is "too
    // large", not "out of bounds", even in a 10-byte file.
    header_length_one_past_the_cap: with_length_field(MAX_HEADER_LEN + 1, b"{}", 0)
        => Kind(ErrorKind::HeaderTooLarge { len: MAX_HEADER_LEN + 1, limit: MAX_HEADER_LEN });

    // --- The header's text.
    header_not_json: file("not json", 0) => InvalidHeader("expected");
    header_truncated_json: file(r#"{"t":{"dtype":"F32""#, 0) => InvalidHeader("EOF");
    header_json_then_garbage: file("{} x", 0) => InvalidHeader("trailing characters");
    header_not_utf8: file_of_bytes(b"{\"\xff\":1}", 0) => InvalidHeader("UTF-8");
    header_name_not_utf8: file_of_bytes(
        b"{\"t\xc3\x28\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        8,
    ) => InvalidHeader("UTF-8");
    header_with_byte_order_mark: file("\u{feff}{}", 0) => InvalidHeader("expected value");
    header_padded_with_nul: file("{}\0\0\0\0\0\0", 0) => InvalidHeader("trailing characters");
    header_is_array: file("[]", 0) => InvalidHeader("invalid type: sequence");
    header_is_number: file("42", 0) => InvalidHeader("invalid type: integer");
    header_is_string: file(r#""model""#, 0) => InvalidHeader("invalid type: string");
    header_is_null: file("null", 0) => InvalidHeader("invalid type: null");
    // Deep nesting must not overflow the stack, and is refused where the
    // reference refuses it. In a field the parser skips, closed or not: at
    // the 128th level of arrays and objects, the outer object the first
    // (serde_json's recursion limit, under which the reference parses; it
    // says "recursion limit exceeded"), before anything else is checked. 127
    // levels load (`templates_of_the_cases_load`). As an entry or as
    // metadata: at the first level, for its type, as in the reference.
    header_nested_unclosed_100_000_deep:
        file(&format!(r#"{{"t":{{"x":{}"#, "[".repeat(100_000)), 0)
            => InvalidHeader("nesting limit exceeded");
    header_nested_100_000_deep:
        file(&format!(r#"{{"t":{{{}}}}}"#, &nested("x", 100_000)[1..nested("x", 100_000).len() - 1]), 0)
            => InvalidHeader("nesting limit exceeded");
    // Issue 16: a valid entry, so that only the nest can refuse it; the
    // parser skipped it unchecked, and the file loaded.
    tensor_unknown_field_nested_100_000_deep: file(&with_unknown_field(&arrays(100_000)), 1)
        => InvalidHeader("nesting limit exceeded");
    tensor_unknown_field_nested_128_levels: file(&with_unknown_field(&arrays(126)), 1)
        => InvalidHeader("nesting limit exceeded: more than 127 levels");
    tensor_unknown_field_objects_nested_128_levels: file(
        &with_unknown_field(&format!("{}{{}}{}", r#"{"a":"#.repeat(125), "}".repeat(125))),
        1,
    ) => InvalidHeader("nesting limit exceeded: more than 127 levels");
    // What the reference checks in a value it has no use for, besides its
    // nesting (it reads every entry whole): escapes that decode, numbers
    // that fit an f64. Both loaded, skipped unchecked, with the nest above.
    tensor_unknown_field_lone_surrogate: file(&with_unknown_field(r#""\ud800""#), 1)
        => InvalidHeader("hex escape");
    tensor_unknown_field_number_out_of_range: file(&with_unknown_field("1e400"), 1)
        => InvalidHeader("number out of range");
    header_entry_nested_100_000_deep:
        file(&nested("t", 100_000), 0) => InvalidHeader("invalid type: sequence");
    metadata_nested_100_000_deep:
        file(&nested("__metadata__", 100_000), 0) => InvalidHeader("invalid type: sequence");

    // --- Tensor entries.
    tensor_not_an_object: file(r#"{"t":1}"#, 0) => InvalidHeader("invalid type");
    tensor_missing_dtype: file(r#"{"t":{"shape":[2],"data_offsets":[0,8]}}"#, 8)
        => InvalidHeader("missing field `dtype`");
    tensor_missing_shape: file(r#"{"t":{"dtype":"F32","data_offsets":[0,8]}}"#, 8)
        => InvalidHeader("missing field `shape`");
    tensor_missing_data_offsets: file(r#"{"t":{"dtype":"F32","shape":[2]}}"#, 8)
        => InvalidHeader("missing field `data_offsets`");
    unknown_dtype: tensor_file("F128", "[2]", "[0,8]", 8) => InvalidHeader("unknown variant");
    lowercase_dtype: tensor_file("f32", "[2]", "[0,8]", 8) => InvalidHeader("unknown variant");
    dtype_not_a_string: file(&one_tensor("4", "[2]", "[0,8]"), 8) => InvalidHeader("invalid type");
    shape_negative: tensor_file("F32", "[-2]", "[0,8]", 8) => InvalidHeader("invalid value");
    shape_fractional: tensor_file("F32", "[2.0]", "[0,8]", 8)
        => InvalidHeader("invalid type: floating point");
    shape_not_an_array: tensor_file("F32", "2", "[0,8]", 8) => InvalidHeader("invalid type");
    // 2^64 is no u64: serde_json reads it as a float.
    shape_past_u64: tensor_file("F32", "[18446744073709551616]", "[0,8]", 8)
        => InvalidHeader("invalid type: floating point");
    // 2^62 * 2^62 elements: the product overflows, which must be caught.
    shape_product_overflows:
        tensor_file("F32", "[4611686018427387904,4611686018427387904]", "[0,8]", 8)
        => InvalidHeader("overflow");
    // 2^62 elements of 4 bytes: the byte count overflows.
    shape_bytes_overflow: tensor_file("F32", "[4611686018427387904]", "[0,8]", 8)
        => InvalidHeader("overflow");
    // Twelve bits of F4 are not whole bytes.
    shape_not_whole_bytes: tensor_file("F4", "[3]", "[0,2]", 2) => InvalidHeader("byte boundary");

    // --- Offsets and lengths.
    data_offsets_reversed: tensor_file("F32", "[2]", "[8,0]", 8) => InvalidHeader("invalid offset");
    data_offsets_negative: tensor_file("F32", "[2]", "[-8,0]", 8) => InvalidHeader("invalid value");
    data_offsets_three_numbers: tensor_file("F32", "[2]", "[0,4,8]", 8)
        => InvalidHeader("invalid length");
    data_offsets_not_from_zero: tensor_file("F32", "[2]", "[4,12]", 12)
        => InvalidHeader("invalid offset");
    data_offsets_leave_a_gap: file(&two_tensors("[9,12]"), 12) => InvalidHeader("invalid offset");
    data_offsets_overlap: file(&two_tensors("[6,9]"), 9) => InvalidHeader("invalid offset");
    data_offsets_same_range_twice: file(&two_tensors("[0,3]"), 8)
        => InvalidHeader("invalid offset");
    data_offsets_past_u64: tensor_file("U8", "[8]", "[0,18446744073709551616]", 8)
        => InvalidHeader("invalid type: floating point");
    // Consistent in themselves, but the file holds 4 of the 8 bytes.
    data_offsets_past_the_end: file(VALID_ONE, 4) => Kind(ErrorKind::SizeMismatch {
        expected: file_len(VALID_ONE, 8),
        actual: file_len(VALID_ONE, 4),
    });
    // Refused by the file's size before anything is allocated (see
    // `huge_length_fields_allocate_nothing_of_their_size`).
    data_offsets_claim_a_terabyte: file(TERABYTE, 8) => Kind(ErrorKind::SizeMismatch {
        expected: file_len(TERABYTE, 1 << 40),
        actual: file_len(TERABYTE, 8),
    });
    byte_length_not_shape_times_dtype: tensor_file("F32", "[2]", "[0,4]", 4)
        => InvalidHeader("invalid shape, data type, or offset");
    byte_length_of_the_wrong_dtype: tensor_file("F64", "[2]", "[0,8]", 8)
        => InvalidHeader("invalid shape, data type, or offset");
    truncated_data: file(&two_tensors("[8,11]"), 10) => Kind(ErrorKind::SizeMismatch {
        expected: file_len(&two_tensors("[8,11]"), 11),
        actual: file_len(&two_tensors("[8,11]"), 10),
    });
    trailing_bytes_after_the_data: file(&two_tensors("[8,11]"), 12)
        => Kind(ErrorKind::SizeMismatch {
            expected: file_len(&two_tensors("[8,11]"), 11),
            actual: file_len(&two_tensors("[8,11]"), 12),
        });
    trailing_bytes_after_an_empty_header: file("{}", 1)
        => Kind(ErrorKind::SizeMismatch { expected: 10, actual: 11 });

    // --- Names and metadata.
    duplicate_tensor_name: file(&two_bytes("t", "[0,1]"), 1) => InvalidHeader("twice");
    // The same name, the second time written with an escape.
    duplicate_tensor_name_escaped: file(&two_bytes("\\u0074", "[1,2]"), 2)
        => InvalidHeader("twice");
    duplicate_metadata: file(r#"{"__metadata__":{},"__metadata__":{"a":"b"}}"#, 0)
        => InvalidHeader("twice");
    metadata_value_not_a_string: file(r#"{"__metadata__":{"a":1}}"#, 0)
        => InvalidHeader("invalid type: integer");
    metadata_value_null: file(r#"{"__metadata__":{"a":null}}"#, 0)
        => InvalidHeader("invalid type: null");
    metadata_not_an_object: file(r#"{"__metadata__":["a"]}"#, 0)
        => InvalidHeader("invalid type: sequence");
}

/// The templates the cases above mutate load, so each case fails because of
/// its mutation and nothing else.
#[test]
fn templates_of_the_cases_load() {
    let dir = tempdir().unwrap();
    let cases = [
        ("one", file(VALID_ONE, 8), vec!["t"]),
        ("two", file(&two_tensors("[8,11]"), 11), vec!["a", "b"]),
        ("empty", file("{}", 0), vec![]),
        ("spaces", file("{}      ", 0), vec![]),
        ("meta", file(r#"{"__metadata__":{"a":"1"}}"#, 0), vec![]),
        ("f4", tensor_file("F4", "[4]", "[0,2]", 2), vec!["t"]),
        // The deepest nesting the reference accepts: 127 levels.
        (
            "nested_127_levels",
            file(&with_unknown_field(&arrays(125)), 1),
            vec!["t"],
        ),
    ];
    for (name, bytes, tensors) in cases {
        let path = dir.path().join(format!("{name}.safetensors"));
        fs::write(&path, &bytes).unwrap();
        for mode in EVERY_MODE {
            let sd = load_state_dict(&path, mode).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(sd.names().collect::<Vec<_>>(), tensors, "{name}");
            let reference = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for (tensor_name, tensor) in sd.iter() {
                let view = reference.tensor(tensor_name).unwrap();
                assert_eq!(tensor.as_bytes(), view.data(), "{name}: {tensor_name}");
            }
        }
    }
}

/// The naive twin's verdict on every case above: the reference parser
/// (`safetensors::SafeTensors::deserialize`) refuses each one too, so that
/// none is refused here that the format allows; the templates they mutate
/// load in both (`templates_of_the_cases_load`). One exception, on purpose: a
/// tensor named twice, which the reference collapses to its last entry and
/// safeload refuses (the crate docs' "Safety and limits"; the property tests
/// allow the same one).
#[test]
fn the_reference_refuses_every_header_case_too() {
    for (name, bytes) in header_cases() {
        let reference = safetensors::SafeTensors::deserialize(&bytes);
        if name == "duplicate_tensor_name" {
            assert!(reference.is_ok(), "{name}: {:?}", reference.err());
        } else {
            assert!(reference.is_err(), "{name}: the reference loads it");
        }
    }
}

/// Found by the `header` fuzz target (2026-11-29, minimized by hand): two
/// tensors with the same `data_offsets`. The `safetensors` parser sorts
/// entries by offsets after collecting them in a `HashMap`, so which of two
/// equal-offset entries it checks first, and therefore the reason it gives,
/// changes from load to load. The same file must give the same error every
/// time; here the reason alternated between "invalid offset for tensor `t`"
/// and "... `u`" (and, for the fuzzer's input, between "invalid shape, data
/// type, or offset" and the sub-byte "byte boundary" message), with mmap and
/// buffered loads of one file disagreeing.
#[test]
fn invalid_header_reason_is_the_same_on_every_load() {
    let dir = tempdir().unwrap();
    let files = [
        ("equal_offsets", file(&two_bytes("u", "[0,1]"), 1)),
        (
            "fuzz_crash_79306ef2",
            file(
                concat!(
                    r#"{"t":{"dtype":"F4","shape":[1],"data_offsets":[0,1]},"#,
                    r#""r":{"dtype":"U8","shape":[0],"data_offsets":[0,1]}}"#
                ),
                1,
            ),
        ),
    ];
    for (name, bytes) in files {
        let path = dir.path().join(format!("{name}.safetensors"));
        fs::write(&path, bytes).unwrap();
        let reasons: BTreeSet<String> = (0..32)
            .flat_map(|_| EVERY_MODE)
            .map(
                |mode| match load_state_dict(&path, mode).map_err(|e| e.kind().clone()) {
                    Err(ErrorKind::InvalidHeader { reason }) => reason,
                    other => panic!("{name}: expected InvalidHeader, got {other:?}"),
                },
            )
            .collect();
        assert_eq!(reasons.len(), 1, "{name}: {reasons:#?}");
    }
}

// ---------------------------------------------------------------------------
// Huge lengths: refused without allocating anything of their size.
// ---------------------------------------------------------------------------

#[test]
fn huge_length_fields_allocate_nothing_of_their_size() {
    let files = [
        with_length_field(u64::MAX, b"{}", 0),
        with_length_field(u64::MAX - 7, b"{}", 0),
        with_length_field(1 << 63, b"{}", 0),
        with_length_field(MAX_HEADER_LEN + 1, b"{}", 0),
        with_length_field(MAX_HEADER_LEN, b"{}", 0),
        file(TERABYTE, 8),
    ];
    let dir = tempdir().unwrap();
    let _watch = watch_allocations();
    for (i, bytes) in files.iter().enumerate() {
        let path = dir.path().join(format!("{i}.safetensors"));
        fs::write(&path, bytes).unwrap();
        let largest = largest_allocation_during(|| {
            refused(&path, &path);
        });
        assert!(
            largest < SMALL,
            "file {i}: an allocation of {largest} bytes was attempted"
        );
    }
}

/// A file whose length field says one byte past the cap, with that many bytes
/// really following: written sparse (`set_len`), so it costs no disk.
#[test]
fn header_just_over_the_cap_with_the_bytes_present() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    fs::write(&path, (MAX_HEADER_LEN + 1).to_le_bytes()).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(8 + MAX_HEADER_LEN + 1).unwrap();
    drop(file);

    let _watch = watch_allocations();
    let largest = largest_allocation_during(|| {
        let err = refused(&path, &path);
        assert_eq!(
            err.kind(),
            &ErrorKind::HeaderTooLarge {
                len: MAX_HEADER_LEN + 1,
                limit: MAX_HEADER_LEN
            }
        );
    });
    assert!(
        largest < SMALL,
        "an allocation of {largest} bytes was attempted"
    );
}

/// The cap itself is accepted as a length: a header of exactly 100 MB (sparse,
/// so all NUL bytes) is read, once, and refused as JSON.
#[test]
fn header_exactly_at_the_cap_is_read_once_and_parsed() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("cap.safetensors");
    fs::write(&path, MAX_HEADER_LEN.to_le_bytes()).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(8 + MAX_HEADER_LEN).unwrap();
    drop(file);

    let _watch = watch_allocations();
    let largest = largest_allocation_during(|| {
        let err = refused(&path, &path);
        assert!(
            matches!(err.kind(), ErrorKind::InvalidHeader { .. }),
            "{err:?}"
        );
    });
    assert!(
        largest <= MAX_HEADER_LEN as usize,
        "a header of {MAX_HEADER_LEN} bytes needed an allocation of {largest}"
    );
}

// ---------------------------------------------------------------------------
// Sharded checkpoints: the index.
// ---------------------------------------------------------------------------

/// Two valid shards, `a.safetensors` (x, y) and `b.safetensors` (z), in `dir`.
fn two_shards(dir: &Path) -> Vec<Spec> {
    let a = vec![spec("x", Dtype::F32, &[2]), spec("y", Dtype::BF16, &[3])];
    let b = vec![spec("z", Dtype::U8, &[4])];
    write_file(&dir.join("a.safetensors"), &a, None);
    write_file(&dir.join("b.safetensors"), &b, None);
    a.into_iter().chain(b).collect()
}

fn index_path(dir: &Path) -> PathBuf {
    dir.join("model.safetensors.index.json")
}

/// The valid index of `two_shards`.
const VALID_INDEX: &str = r#"{"metadata":{"total_size":18},"weight_map":{
    "x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}}"#;

/// Index texts that are not `{"weight_map": {"tensor": "shard"}}`, each refused
/// as `InvalidIndex`, whose reason mentions the given text.
const INVALID_INDEXES: [(&str, &[u8], &str); 14] = [
    ("empty", b"", ""),
    ("not_json", b"{oops", "key must be a string"),
    ("truncated", br#"{"weight_map":{"x":"a.safetensors""#, "EOF"),
    (
        "not_utf8",
        b"{\"weight_map\":{\"x\":\"a\xff.safetensors\"}}",
        "unicode",
    ),
    ("array", b"[]", ""),
    ("number", b"7", ""),
    ("no_weight_map", br#"{"metadata":{}}"#, "weight_map"),
    ("weight_map_null", br#"{"weight_map":null}"#, "missing"),
    (
        "weight_map_array",
        br#"{"weight_map":["a.safetensors"]}"#,
        "invalid type",
    ),
    (
        "shard_not_a_string",
        br#"{"weight_map":{"x":1}}"#,
        "invalid type: integer",
    ),
    (
        "shard_null",
        br#"{"weight_map":{"x":null}}"#,
        "invalid type: null",
    ),
    (
        "metadata_not_an_object",
        br#"{"metadata":1,"weight_map":{"x":"a.safetensors"}}"#,
        "invalid type",
    ),
    (
        "json_then_garbage",
        br#"{"weight_map":{"x":"a.safetensors"}} x"#,
        "trailing characters",
    ),
    ("nested_100_000_deep", b"", "recursion limit"), // built below: too long to write here
];

fn invalid_index_bytes(name: &str, bytes: &[u8]) -> Vec<u8> {
    if name == "nested_100_000_deep" {
        let metadata = nested("x", 100_000);
        format!(r#"{{"metadata":{metadata},"weight_map":{{"x":"a.safetensors"}}}}"#).into_bytes()
    } else {
        bytes.to_vec()
    }
}

#[test]
fn the_valid_index_loads() {
    let dir = tempdir().unwrap();
    let specs = two_shards(dir.path());
    fs::write(index_path(dir.path()), VALID_INDEX).unwrap();
    loads_as(dir.path(), &specs);
    loads_as(&index_path(dir.path()), &specs);
}

#[test]
fn index_that_is_not_an_index() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    for (name, bytes, mentions) in INVALID_INDEXES {
        fs::write(&index, invalid_index_bytes(name, bytes)).unwrap();
        for entry in [dir.path(), index.as_path()] {
            let err = refused(entry, &index);
            match err.kind() {
                ErrorKind::InvalidIndex { reason } => assert!(
                    reason.contains(mentions),
                    "{name}: the reason {reason:?} should mention {mentions:?}"
                ),
                other => panic!("{name}: expected InvalidIndex, got {other:?}"),
            }
        }
    }
}

/// Found by the `index` fuzz target (2026-11-29, minimized by hand): bytes
/// that are not UTF-8 anywhere inside the value of an unknown field (which
/// the parser skips) were never checked, so the file loaded; the same bytes
/// in a key, or in a shard name, are refused. JSON text is UTF-8 (RFC 8259 §8.1)
/// and Python's `json.load` refuses such a file, so it must be refused here too.
#[test]
fn index_not_utf8_where_the_parser_skips() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    let texts: [&[u8]; 3] = [
        b"{\"extra\":\"\xff\",\"weight_map\":{\"x\":\"a.safetensors\"}}",
        b"{\"extra\xff\":1,\"weight_map\":{\"x\":\"a.safetensors\"}}",
        // The fuzzer's input, shortened: an unknown "metadat$" object.
        b"{\"metadat$\":{\"total\xc0\xff_size\":18},\"weight_map\":{\"x\":\"a.safetensors\"}}",
    ];
    for text in texts {
        fs::write(&index, text).unwrap();
        let err = refused(dir.path(), &index);
        assert!(
            matches!(err.kind(), ErrorKind::InvalidIndex { .. }),
            "{}: {err:?}",
            String::from_utf8_lossy(text)
        );
    }
}

/// An index must be a JSON object. A derived `Deserialize` also accepts a
/// struct written as an array of its fields in order (`[metadata,
/// weight_map]`), which no writer produces and no other reader accepts.
#[test]
fn index_as_a_json_array_of_its_fields() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    fs::write(
        &index,
        r#"[null,{"x":"a.safetensors","y":"a.safetensors","z":"b.safetensors"}]"#,
    )
    .unwrap();
    let err = refused(dir.path(), &index);
    assert!(
        matches!(err.kind(), ErrorKind::InvalidIndex { .. }),
        "{err:?}"
    );
}

/// An index of 100 MB + 1 byte (sparse): refused by its size, before it is
/// read.
#[test]
fn index_over_the_size_limit() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    fs::write(&index, b"{").unwrap();
    let file = fs::OpenOptions::new().write(true).open(&index).unwrap();
    file.set_len(100_000_001).unwrap();
    drop(file);

    let _watch = watch_allocations();
    let largest = largest_allocation_during(|| {
        let err = refused(dir.path(), &index);
        assert!(
            matches!(err.kind(), ErrorKind::InvalidIndex { reason } if reason.contains("exceeds")),
            "{err:?}"
        );
    });
    assert!(
        largest < SMALL,
        "an allocation of {largest} bytes was attempted"
    );
}

#[test]
fn index_names_a_missing_shard() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","w":"gone.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &dir.path().join("gone.safetensors"));
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
}

#[test]
fn index_maps_a_tensor_to_a_shard_that_lacks_it() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","y":"a.safetensors","z":"a.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &dir.path().join("a.safetensors"));
    assert_eq!(
        err.kind(),
        &ErrorKind::TensorNotInShard {
            tensor: "z".into(),
            shard: "a.safetensors".into()
        }
    );
    assert_eq!(err.tensor(), Some("z"));
}

/// `DuplicateTensor` is documented as "the same tensor name appears in two
/// shards, or twice in the index": a key written twice in `weight_map` is the
/// second case, and the error names the tensor (`err.tensor()`), which a
/// generic `InvalidIndex` cannot.
#[test]
fn index_puts_one_tensor_in_two_shards_by_a_duplicate_key() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    fs::write(
        &index,
        r#"{"weight_map":{"x":"a.safetensors","z":"b.safetensors","x":"b.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &index);
    assert_eq!(
        err.kind(),
        &ErrorKind::DuplicateTensor {
            tensor: "x".into(),
            first: index.clone()
        }
    );
    assert_eq!(err.tensor(), Some("x"));
}

#[test]
fn one_tensor_physically_in_two_shards() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    // b.safetensors holds x as well; the index lists x once, in a.
    write_file(
        &dir.path().join("b.safetensors"),
        &[spec("z", Dtype::U8, &[4]), spec("x", Dtype::F32, &[2])],
        None,
    );
    fs::write(index_path(dir.path()), VALID_INDEX).unwrap();
    let err = refused(dir.path(), &dir.path().join("b.safetensors"));
    assert_eq!(
        err.kind(),
        &ErrorKind::DuplicateTensor {
            tensor: "x".into(),
            first: dir.path().join("a.safetensors")
        }
    );
    assert_eq!(err.tensor(), Some("x"));
}

/// Names that leave the checkpoint directory are refused before anything is
/// opened; each one names a real, valid file, so following it would load.
#[test]
fn index_names_a_shard_outside_the_directory() {
    let root = tempdir().unwrap();
    let dir = root.path().join("ckpt");
    fs::create_dir_all(dir.join("sub")).unwrap();
    two_shards(&dir);
    let outside = root.path().join("outside.safetensors");
    write_file(&outside, &[spec("w", Dtype::U8, &[1])], None);
    write_file(
        &dir.join("sub").join("inner.safetensors"),
        &[spec("w", Dtype::U8, &[1])],
        None,
    );
    fs::write(dir.join("sub\\inner.safetensors"), b"").unwrap();
    let absolute = outside.to_str().unwrap().to_string();
    let index = index_path(&dir);
    for name in [
        "../outside.safetensors",
        absolute.as_str(),
        "sub/inner.safetensors",
        "./a.safetensors",
        "sub\\inner.safetensors",
        "",
        "a.safetensors\0",
        "a\0b",
        "\0",
        ".",
        "..",
    ] {
        let text = serde_json::json!({"weight_map": {"x": "a.safetensors", "w": name}});
        fs::write(&index, text.to_string()).unwrap();
        let err = refused(&dir, &index);
        assert_eq!(
            err.kind(),
            &ErrorKind::UnsafeShardName {
                name: name.to_string()
            },
            "{name:?}"
        );
    }
}

/// An index that names itself as a shard: opened as a safetensors file, its
/// first 8 bytes of JSON read as a header length far past the cap.
#[test]
fn index_names_itself_as_a_shard() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let index = index_path(dir.path());
    let text = r#"{"weight_map":{"x":"model.safetensors.index.json"}}"#;
    fs::write(&index, text).unwrap();
    let err = refused(dir.path(), &index);
    let len = u64::from_le_bytes(text.as_bytes()[..8].try_into().unwrap());
    assert_eq!(
        err.kind(),
        &ErrorKind::HeaderTooLarge {
            len,
            limit: MAX_HEADER_LEN
        }
    );
}

/// A shard name that is a directory, not a file.
#[test]
fn index_names_a_directory() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::create_dir(dir.path().join("c.safetensors")).unwrap();
    fs::write(
        index_path(dir.path()),
        r#"{"weight_map":{"x":"a.safetensors","w":"c.safetensors"}}"#,
    )
    .unwrap();
    let err = refused(dir.path(), &dir.path().join("c.safetensors"));
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    // Refused at the open as not a regular file, or by the first read.
    assert!(
        matches!(
            err.io_error().unwrap().kind(),
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::IsADirectory
        ),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------
// A path that names nothing: an I/O error naming it, the cause in `source()`.
// ---------------------------------------------------------------------------

#[test]
fn checkpoint_path_that_does_not_exist() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("absent.safetensors");
    let err = refused(&path, &path);
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
    assert!(
        std::error::Error::source(&err).is_some(),
        "the io::Error is the source: {err:?}"
    );
}

// ---------------------------------------------------------------------------
// Directories with no checkpoint to pick.
// ---------------------------------------------------------------------------

#[test]
fn directory_without_a_checkpoint() {
    let dir = tempdir().unwrap();
    fs::write(dir.path().join("README.md"), b"hi").unwrap();
    let err = refused(dir.path(), dir.path());
    assert_eq!(err.kind(), &ErrorKind::NoCheckpoint { found: vec![] });
}

#[test]
fn directory_with_two_files_and_no_index() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    let err = refused(dir.path(), dir.path());
    assert_eq!(
        err.kind(),
        &ErrorKind::NoCheckpoint {
            found: vec!["a.safetensors".into(), "b.safetensors".into()]
        }
    );
}

#[test]
fn directory_with_two_indexes() {
    let dir = tempdir().unwrap();
    two_shards(dir.path());
    fs::write(dir.path().join("one.safetensors.index.json"), VALID_INDEX).unwrap();
    fs::write(dir.path().join("two.safetensors.index.json"), VALID_INDEX).unwrap();
    let err = refused(dir.path(), dir.path());
    assert_eq!(
        err.kind(),
        &ErrorKind::NoCheckpoint {
            found: vec![
                "one.safetensors.index.json".into(),
                "two.safetensors.index.json".into(),
                "a.safetensors".into(),
                "b.safetensors".into(),
            ]
        }
    );
}

// ---------------------------------------------------------------------------
// Symlinks: loops fail fast; links at shard names are followed.
// ---------------------------------------------------------------------------

#[cfg(unix)]
mod symlinks {
    use std::os::unix::fs::symlink;

    use super::*;

    /// `ELOOP`, "too many levels of symbolic links" (symlink(7)); Rust has no
    /// stable `io::ErrorKind` for it.
    const ELOOP: i32 = 40;

    fn assert_loop(err: &Error) {
        assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
        assert_eq!(
            err.io_error().unwrap().raw_os_error(),
            Some(ELOOP),
            "{err:?}"
        );
    }

    #[test]
    fn checkpoint_path_is_a_symlink_to_itself() {
        let dir = tempdir().unwrap();
        let link = dir.path().join("loop");
        symlink(&link, &link).unwrap();
        assert_loop(&refused(&link, &link));
    }

    #[test]
    fn checkpoint_path_runs_through_a_loop() {
        let dir = tempdir().unwrap();
        symlink("b", dir.path().join("a")).unwrap();
        symlink("a", dir.path().join("b")).unwrap();
        let path = dir.path().join("a").join("model.safetensors");
        assert_loop(&refused(&path, &path));
    }

    #[test]
    fn index_names_a_shard_that_is_a_loop() {
        let dir = tempdir().unwrap();
        two_shards(dir.path());
        let shard = dir.path().join("loop.safetensors");
        symlink("loop.safetensors", &shard).unwrap();
        fs::write(
            index_path(dir.path()),
            r#"{"weight_map":{"x":"a.safetensors","w":"loop.safetensors"}}"#,
        )
        .unwrap();
        assert_loop(&refused(dir.path(), &shard));
    }

    /// `model.safetensors` that links to itself is not a file, so the
    /// directory holds no checkpoint — the same answer the Hugging Face
    /// loaders give (`os.path.isfile` is false), and no hang.
    #[test]
    fn directory_whose_model_file_is_a_loop() {
        let dir = tempdir().unwrap();
        symlink("model.safetensors", dir.path().join("model.safetensors")).unwrap();
        let err = refused(dir.path(), dir.path());
        assert_eq!(err.kind(), &ErrorKind::NoCheckpoint { found: vec![] });
    }

    /// A directory that contains a link to itself is not walked: the loader
    /// only looks at the names directly inside it.
    #[test]
    fn directory_containing_a_loop_still_loads() {
        let dir = tempdir().unwrap();
        let specs = vec![spec("t", Dtype::F16, &[2, 2])];
        write_single(dir.path(), &specs);
        symlink(".", dir.path().join("self")).unwrap();
        symlink("self", dir.path().join("self2")).unwrap();
        loads_as(dir.path(), &specs);
        loads_as(
            &dir.path().join("self/self2/self/model.safetensors"),
            &specs,
        );
    }

    /// The layout of a Hugging Face cache: every file of a snapshot is a
    /// relative link into `blobs/`, outside the snapshot directory. Only the
    /// names written in the index are confined; links at those names are
    /// followed, or no cached checkpoint could load.
    fn hf_cache(root: &Path) -> (PathBuf, Vec<Spec>) {
        let blobs = root.join("blobs");
        let snapshot = root.join("snapshots").join("0123abcd");
        fs::create_dir_all(&blobs).unwrap();
        fs::create_dir_all(&snapshot).unwrap();
        let specs = vec![
            spec("x", Dtype::F32, &[2]),
            spec("y", Dtype::BF16, &[3]),
            spec("z", Dtype::I64, &[]),
        ];
        write_sharded(&blobs, &specs, 2);
        for (i, name) in [shard_name(0, 2), shard_name(1, 2)].iter().enumerate() {
            fs::rename(blobs.join(name), blobs.join(format!("shard{i}"))).unwrap();
            symlink(format!("../../blobs/shard{i}"), snapshot.join(name)).unwrap();
        }
        fs::rename(index_path(&blobs), blobs.join("index")).unwrap();
        symlink("../../blobs/index", index_path(&snapshot)).unwrap();
        (snapshot, specs)
    }

    #[test]
    fn symlinked_shards_are_followed() {
        let root = tempdir().unwrap();
        let (snapshot, specs) = hf_cache(root.path());
        loads_as(&snapshot, &specs);
        loads_as(&index_path(&snapshot), &specs);
        // Errors name the link, not its target: that is the name the user
        // knows.
        let sd = load_state_dict(&snapshot, Some(true)).unwrap();
        assert!(
            sd.report()
                .files()
                .iter()
                .all(|f| f.path().starts_with(&snapshot)),
            "{:?}",
            sd.report().files()
        );
    }

    #[test]
    fn a_dangling_shard_link_is_an_io_error_naming_the_link() {
        let root = tempdir().unwrap();
        let (snapshot, _) = hf_cache(root.path());
        fs::remove_file(root.path().join("blobs").join("shard1")).unwrap();
        let link = snapshot.join(shard_name(1, 2));
        let err = refused(&snapshot, &link);
        assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
        assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
    }

    /// A shard whose *name* is plain but which links to an absolute path
    /// elsewhere (a cache on another disk, a snapshot whose blobs were moved)
    /// is allowed: the index's author chose the name, the filesystem's owner
    /// chose the link.
    #[test]
    fn a_shard_linking_outside_the_directory_is_allowed() {
        let elsewhere = tempdir().unwrap();
        let dir = tempdir().unwrap();
        let specs = two_shards(elsewhere.path());
        for name in ["a.safetensors", "b.safetensors"] {
            symlink(elsewhere.path().join(name), dir.path().join(name)).unwrap();
        }
        fs::write(index_path(dir.path()), VALID_INDEX).unwrap();
        loads_as(dir.path(), &specs);
    }

    /// A single-file checkpoint given as a link is followed too.
    #[test]
    fn a_symlinked_single_file_loads() {
        let elsewhere = tempdir().unwrap();
        let dir = tempdir().unwrap();
        let specs = every_dtype();
        let target = write_single(elsewhere.path(), &specs);
        symlink(&target, dir.path().join("model.safetensors")).unwrap();
        loads_as(dir.path(), &specs);
    }
}

// ---------------------------------------------------------------------------
// Files that are not regular files.
// ---------------------------------------------------------------------------

#[cfg(unix)]
mod special_files {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Loads `path` in every mode on another thread; `None` if that does not
    /// finish in 5 seconds (the thread is left blocked; the test process
    /// ends it).
    fn load_with_deadline(path: &Path) -> Option<Vec<Result<usize, Error>>> {
        let (send, receive) = mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || {
            let results: Vec<_> = EVERY_MODE
                .iter()
                .map(|mode| load_state_dict(&path, *mode).map(|sd| sd.len()))
                .collect();
            let _ = send.send(results);
        });
        receive.recv_timeout(Duration::from_secs(5)).ok()
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// A FIFO at a shard's name: opening it for reading blocks until a writer
    /// appears, which for a hostile checkpoint is never. Expected: refused as
    /// not a regular file, promptly, naming the FIFO.
    #[test]
    fn index_names_a_fifo() {
        let dir = tempdir().unwrap();
        two_shards(dir.path());
        let fifo = dir.path().join("c.safetensors");
        mkfifo(&fifo);
        fs::write(
            index_path(dir.path()),
            r#"{"weight_map":{"x":"a.safetensors","w":"c.safetensors"}}"#,
        )
        .unwrap();
        let results = load_with_deadline(dir.path()).expect("loading a FIFO shard hung");
        for result in results {
            let err = result.expect_err("a FIFO is not a checkpoint");
            assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
            assert_eq!(err.path(), Some(fifo.as_path()));
        }
    }

    /// The same for a FIFO given as the checkpoint path itself.
    #[test]
    fn checkpoint_path_is_a_fifo() {
        let dir = tempdir().unwrap();
        let fifo = dir.path().join("model.safetensors");
        mkfifo(&fifo);
        let results = load_with_deadline(&fifo).expect("loading a FIFO hung");
        for result in results {
            let err = result.expect_err("a FIFO is not a checkpoint");
            assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
            assert_eq!(err.path(), Some(fifo.as_path()));
        }
    }

    /// A character device is not a checkpoint either: refused at the open,
    /// not read (`/dev/zero` would read as endless data).
    #[test]
    fn checkpoint_path_is_a_device() {
        for device in ["/dev/null", "/dev/zero"] {
            let path = Path::new(device);
            if path.exists() {
                let err = refused(path, path);
                assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The fuzz targets' seed corpus.
// ---------------------------------------------------------------------------

/// The committed seed corpus of the fuzz targets, `fuzz/corpus/seed-header/`
/// (every single-file case above, and a few valid files) and
/// `fuzz/corpus/seed-index/` (indexes over the fuzz target's fixed shards),
/// is what these cases generate: a case added here without its seed fails.
/// To rewrite the corpus after changing the cases:
///
/// ```text
/// SAFELOAD_WRITE_FUZZ_SEEDS=1 cargo test --test malformed fuzz_seeds_are_up_to_date
/// ```
#[test]
fn fuzz_seeds_are_up_to_date() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus");
    let header_dir = corpus.join("seed-header");
    let index_dir = corpus.join("seed-index");
    let rewrite = std::env::var_os("SAFELOAD_WRITE_FUZZ_SEEDS").is_some_and(|v| v == "1");
    if rewrite {
        for dir in [&header_dir, &index_dir] {
            if dir.exists() {
                fs::remove_dir_all(dir).unwrap();
            }
            fs::create_dir_all(dir).unwrap();
        }
    }
    let mut expected: BTreeSet<std::path::PathBuf> = BTreeSet::new();

    let mut total = 0;
    let mut seed = |dir: &Path, name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        if rewrite {
            fs::write(&path, bytes).unwrap();
        } else {
            let committed = fs::read(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; rewrite the corpus (see this test's docs)",
                    path.display()
                )
            });
            assert!(
                committed == bytes,
                "{} is out of date; rewrite the corpus",
                path.display()
            );
        }
        expected.insert(path);
        total += bytes.len();
    };
    for (name, bytes) in header_cases() {
        // The 100 KB nesting bomb would be most of the budget; the fuzzer
        // finds deep nesting from a few brackets.
        if bytes.len() <= 4096 {
            seed(&header_dir, name, &bytes);
        }
    }
    let scratch = tempdir().unwrap();
    let valid: [(&str, Vec<Spec>); 4] = [
        ("valid_every_dtype", every_dtype()),
        (
            "valid_scalar_and_empty",
            vec![spec("s", Dtype::F64, &[]), spec("e", Dtype::BF16, &[0, 4])],
        ),
        (
            "valid_f16_bf16",
            vec![spec("h", Dtype::F16, &[3]), spec("b", Dtype::BF16, &[2, 2])],
        ),
        ("valid_one_u8", vec![spec("u", Dtype::U8, &[5])]),
    ];
    for (name, specs) in valid {
        let path = scratch.path().join(name);
        // One metadata entry: with two, the bytes would follow a HashMap's
        // order and change on every run.
        let format = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_file(&path, &specs, Some(format));
        seed(&header_dir, name, &fs::read(&path).unwrap());
    }
    // Packed: a U8 of 3 bytes, then an F32 at offset 3, header not padded.
    let packed = concat!(
        r#"{"u":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"#,
        r#""f":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}"#
    );
    seed(&header_dir, "valid_packed", &file(packed, 11));

    // The index target's fixture (fuzz/src/lib.rs): a.safetensors holds x
    // (F32 [2]) and y (BF16 [3]); b.safetensors holds z (U8 [4]) and e
    // (F16 [0]); ../outside.safetensors and sub/inner.safetensors exist and
    // must stay unreachable.
    let indexes: [(&str, &str); 9] = [
        (
            "valid",
            concat!(
                r#"{"metadata":{"total_size":18},"weight_map":{"x":"a.safetensors","#,
                r#""y":"a.safetensors","z":"b.safetensors","e":"b.safetensors"}}"#
            ),
        ),
        ("valid_one_shard", r#"{"weight_map":{"x":"a.safetensors"}}"#),
        (
            "tensor_not_in_shard",
            r#"{"weight_map":{"x":"b.safetensors"}}"#,
        ),
        (
            "duplicate_key",
            r#"{"weight_map":{"x":"a.safetensors","x":"b.safetensors"}}"#,
        ),
        ("missing_shard", r#"{"weight_map":{"x":"c.safetensors"}}"#),
        (
            "parent",
            r#"{"weight_map":{"outside":"../outside.safetensors"}}"#,
        ),
        (
            "subdirectory",
            r#"{"weight_map":{"inner":"sub/inner.safetensors"}}"#,
        ),
        ("directory", r#"{"weight_map":{"x":"sub"}}"#),
        (
            "escaped_slash",
            r#"{"weight_map":{"inner":"sub\/inner.safetensors","x":"a.safetensors"}}"#,
        ),
    ];
    for (name, text) in indexes {
        seed(&index_dir, name, text.as_bytes());
    }
    for (name, bytes, _) in INVALID_INDEXES {
        if name != "nested_100_000_deep" {
            seed(&index_dir, &format!("invalid_{name}"), bytes);
        }
    }
    assert!(total < 100 << 10, "the seed corpus is {total} bytes");
    // Nothing stale: every committed seed is one of the cases.
    for dir in [&header_dir, &index_dir] {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            assert!(
                expected.contains(&path),
                "{} is no longer a case; rewrite the corpus",
                path.display()
            );
        }
    }
}
