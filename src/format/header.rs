//! The safetensors header: its length prefix, and its JSON parsed into checked tensor entries by the `safetensors` crate's rules.
//!
//! Pure: everything here takes bytes and never opens a file, so every check is
//! exercised by unit tests, property tests and the fuzz targets alike.

use std::collections::{HashMap, HashSet};
use std::fmt;

use safetensors::Dtype;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::ErrorKind;

/// The largest header accepted, in bytes; the same limit as the `safetensors`
/// crate, checked here before anything is allocated.
pub const MAX_HEADER_LEN: u64 = 100_000_000;
/// Bytes of the little-endian header-length prefix.
pub const PREFIX_LEN: u64 = 8;
/// The deepest nesting of JSON arrays and objects a header may have, its
/// outer object counting as the first level: the reference parses headers
/// with serde_json, whose recursion limit of 128 refuses the 128th level.
/// serde_json applies it here too (see [`Skip`]); this constant names it for
/// the message and the tests.
pub(crate) const MAX_NESTING: usize = 127;

/// One tensor as the header describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TensorEntry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range relative to the start of the data section.
    pub start: u64,
    pub end: u64,
}

/// A parsed, checked header.
#[derive(Debug, Clone)]
pub(crate) struct Header {
    /// Where the data section starts in the file (8 + header length).
    pub data_start: u64,
    /// Tensors in file order: by offset, ties (empty tensors) by name.
    pub tensors: Vec<TensorEntry>,
    /// The `__metadata__` object.
    pub metadata: Option<HashMap<String, String>>,
}

impl TensorEntry {
    /// The number of elements (1 for a scalar); `None` past `usize`, which
    /// a checked header never has.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }
}

impl Header {
    /// The file length this header implies.
    pub fn file_len(&self) -> u64 {
        self.data_start + self.tensors.last().map_or(0, |t| t.end)
    }
}

/// Reads the header length from the first 8 bytes and checks it against the
/// limit and the file's length, before anything of that length is allocated.
pub(crate) fn header_len(prefix: &[u8], file_len: u64) -> Result<u64, ErrorKind> {
    let Some(bytes) = prefix.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return Err(ErrorKind::FileTooSmall { len: file_len });
    };
    let len = u64::from_le_bytes(bytes);
    if len > MAX_HEADER_LEN {
        return Err(ErrorKind::HeaderTooLarge {
            len,
            limit: MAX_HEADER_LEN,
        });
    }
    if len > file_len.saturating_sub(PREFIX_LEN) {
        return Err(ErrorKind::HeaderOutOfBounds { len, file_len });
    }
    Ok(len)
}

/// Parses the header's JSON (the bytes after the 8-byte prefix) and checks
/// it describes a file of exactly `file_len` bytes: every entry by the rules
/// of the `safetensors` crate (a known dtype, offsets contiguous from 0 in
/// order, each tensor's byte length its shape's, all with checked
/// arithmetic), no name twice, nothing after the last tensor.
///
/// NOTE: the entries are read with the crate's own `Dtype` deserializer,
/// but not through its `Metadata`, whose deserializer goes
/// through serde's `flatten`: that buffers the whole header into a
/// generic tree before building a hash map from it. On a 1.35 M-tensor,
/// 94 MB header that cost more time and memory than the rest of the load
/// (BENCHMARKS.md, "Big headers"); one pass into a vector, one sort by
/// offset and a set of names for duplicates does the same checks. The
/// property tests, the fuzz target and `seed_corpus_verdicts_are_the_references`
/// hold the two parsers to the same verdict on damaged files.
///
/// JSON nested deeper than [`MAX_NESTING`] levels is refused, as the
/// reference refuses it.
pub(crate) fn parse(json: &[u8], file_len: u64) -> Result<Header, ErrorKind> {
    let invalid = |reason: String| ErrorKind::InvalidHeader { reason };
    let text = std::str::from_utf8(json).map_err(|e| invalid(format!("not UTF-8: {e}")))?;
    let Entries {
        metadata,
        mut tensors,
    } = serde_json::from_str(text).map_err(|e| invalid(json_reason(&e)))?;
    // File order: by offsets; empty tensors share offsets with their
    // neighbours, so ties go by name and the order (and the first fault
    // named) is the same on every run.
    tensors.sort_unstable_by(|(a, x), (b, y)| (x.data_offsets, a).cmp(&(y.data_offsets, b)));
    let mut names = HashSet::with_capacity(tensors.len());
    for (name, _) in &tensors {
        if !names.insert(name.as_str()) {
            return Err(invalid(format!("tensor {name:?} appears twice")));
        }
    }
    drop(names);
    check(&tensors).map_err(invalid)?;

    let data_start = PREFIX_LEN + json.len() as u64;
    let tensors: Vec<TensorEntry> = tensors
        .into_iter()
        .map(|(name, info)| TensorEntry {
            name,
            dtype: info.dtype,
            shape: info.shape,
            start: info.data_offsets.0 as u64,
            end: info.data_offsets.1 as u64,
        })
        .collect();
    let header = Header {
        data_start,
        tensors,
        metadata,
    };
    let expected = header.file_len();
    if expected != file_len {
        return Err(ErrorKind::SizeMismatch {
            expected,
            actual: file_len,
        });
    }
    Ok(header)
}

/// The header's entries in the order the JSON gives them.
struct Entries {
    metadata: Option<HashMap<String, String>>,
    tensors: Vec<(String, Entry)>,
}

/// The reason a header that does not parse as the expected JSON is refused:
/// serde_json's message, or, past the nesting limit, one that says so.
fn json_reason(e: &serde_json::Error) -> String {
    let message = e.to_string();
    // serde_json exposes no error code (`Category::Syntax` covers every
    // syntax error), so its message is matched, at its start, where no text
    // from the header can appear. Should a release reword it, its own
    // message stands, and `nesting_limit_is_the_references` fails.
    if e.is_syntax() && message.starts_with("recursion limit exceeded") {
        return format!(
            "nesting limit exceeded: more than {MAX_NESTING} levels of arrays and objects, at \
             line {} column {} (serde_json's recursion limit, under which the safetensors crate \
             parses headers)",
            e.line(),
            e.column()
        );
    }
    message
}

/// One tensor's entry: the fields of the crate's `TensorInfo`, read so that
/// a wrong dtype or offset pair says what it is (serde_json's direct enum
/// and tuple errors say only "expected value" or "trailing characters").
struct Entry {
    dtype: Dtype,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

/// Written out rather than derived, for one difference: a derived
/// `Deserialize` skips unknown fields with [`de::IgnoredAny`], this one with
/// [`Skip`]. Otherwise as derived: an object of the three fields in any
/// order, each at most once, unknown ones allowed; or an array of the three
/// in order, which the reference's derived `TensorInfo` accepts too.
impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The fields by name; any other is skipped.
        enum Field {
            Dtype,
            Shape,
            DataOffsets,
            Unknown,
        }
        impl<'de> Deserialize<'de> for Field {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Name;
                impl Visitor<'_> for Name {
                    type Value = Field;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a field name")
                    }
                    fn visit_str<E: de::Error>(self, name: &str) -> Result<Field, E> {
                        Ok(match name {
                            "dtype" => Field::Dtype,
                            "shape" => Field::Shape,
                            "data_offsets" => Field::DataOffsets,
                            _ => Field::Unknown,
                        })
                    }
                }
                deserializer.deserialize_identifier(Name)
            }
        }
        /// A field's value, refused if the field was already given.
        fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
            map: &mut A,
            slot: &mut Option<T>,
            name: &'static str,
        ) -> Result<(), A::Error> {
            if slot.is_some() {
                return Err(de::Error::duplicate_field(name));
            }
            *slot = Some(map.next_value()?);
            Ok(())
        }

        struct EntryVisitor;
        impl<'de> Visitor<'de> for EntryVisitor {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("struct Entry")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
                let (mut dtype, mut shape, mut data_offsets) = (None, None, None);
                while let Some(field) = map.next_key()? {
                    match field {
                        Field::Dtype => once(&mut map, &mut dtype, "dtype")?,
                        Field::Shape => once(&mut map, &mut shape, "shape")?,
                        Field::DataOffsets => once(&mut map, &mut data_offsets, "data_offsets")?,
                        Field::Unknown => {
                            map.next_value::<Skip>()?;
                        }
                    }
                }
                let DtypeName(dtype) = dtype.ok_or_else(|| de::Error::missing_field("dtype"))?;
                let shape = shape.ok_or_else(|| de::Error::missing_field("shape"))?;
                let Offsets(data_offsets) =
                    data_offsets.ok_or_else(|| de::Error::missing_field("data_offsets"))?;
                Ok(Entry {
                    dtype,
                    shape,
                    data_offsets,
                })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entry, A::Error> {
                let short = |read| de::Error::invalid_length(read, &"struct Entry with 3 elements");
                let DtypeName(dtype) = seq.next_element()?.ok_or_else(|| short(0))?;
                let shape = seq.next_element()?.ok_or_else(|| short(1))?;
                let Offsets(data_offsets) = seq.next_element()?.ok_or_else(|| short(2))?;
                Ok(Entry {
                    dtype,
                    shape,
                    data_offsets,
                })
            }
        }
        deserializer.deserialize_struct("Entry", &["dtype", "shape", "data_offsets"], EntryVisitor)
    }
}

/// A dtype by its name, through the crate's own `Dtype` deserializer.
struct DtypeName(Dtype);

impl<'de> Deserialize<'de> for DtypeName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Name;
        impl Visitor<'_> for Name {
            type Value = Dtype;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a dtype name such as \"F32\"")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Dtype, E> {
                Dtype::deserialize(de::value::StrDeserializer::<E>::new(name))
            }
        }
        deserializer.deserialize_str(Name).map(DtypeName)
    }
}

/// `data_offsets`: exactly two numbers.
struct Offsets((usize, usize));

impl<'de> Deserialize<'de> for Offsets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pair;
        impl<'de> Visitor<'de> for Pair {
            type Value = (usize, usize);
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("two offsets")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(usize, usize), A::Error> {
                let start = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(0, &self))?;
                let end = seq
                    .next_element()?
                    .ok_or_else(|| de::Error::invalid_length(1, &self))?;
                let mut extra = 0;
                while seq.next_element::<Skip>()?.is_some() {
                    extra += 1;
                }
                if extra > 0 {
                    return Err(de::Error::invalid_length(2 + extra, &self));
                }
                Ok((start, end))
            }
        }
        deserializer.deserialize_seq(Pair).map(Offsets)
    }
}

/// A value the parser has no use for, read as the reference reads it. The
/// reference's `#[serde(flatten)]` buffers each tensor entry whole through
/// `deserialize_any` before it looks at a field; so does this, without the
/// buffer, and serde_json checks a skipped value as it checks the rest:
/// arrays and objects nested within its recursion limit ([`MAX_NESTING`]),
/// escapes that decode (no lone surrogate such as `"\ud800"`), numbers in
/// range (no `1e400`). The recursion is bounded by that limit: a nest a
/// million deep is refused at its 128th level, not by a stack overflow.
///
/// NOTE: [`de::IgnoredAny`], used here until 2026-12-01 (a derived
/// `Deserialize` skips unknown fields with it), checks none of the three:
/// serde_json skips it with a loop over a stack of its own, so that a
/// 100,000-deep nest in an unknown field of an entry was accepted, as were
/// `"\ud800"` and `1e400`, all three refused by the reference. A depth
/// counter of this crate's own was rejected: serde_json's own count is the
/// reference's by construction, and already bounds every other value here.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor;
        impl<'de> Visitor<'de> for EntriesVisitor {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut metadata = None;
                let mut seen_metadata = false;
                let mut tensors = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    if name == "__metadata__" {
                        if seen_metadata {
                            return Err(de::Error::custom("\"__metadata__\" appears twice"));
                        }
                        seen_metadata = true;
                        metadata = map.next_value()?;
                    } else {
                        let info: Entry = map.next_value()?;
                        tensors.push((name, info));
                    }
                }
                Ok(Entries { metadata, tensors })
            }
        }
        deserializer.deserialize_map(EntriesVisitor)
    }
}

/// The `safetensors` crate's rules for entries in offset order, checked in
/// that order so that the first entry that breaks one is named.
fn check(tensors: &[(String, Entry)]) -> Result<(), String> {
    let mut end = 0usize;
    for (name, info) in tensors {
        let (start, stop) = info.data_offsets;
        if start != end || stop < start {
            return Err(format!(
                "invalid offset for tensor {name:?}: data_offsets [{start}, {stop}], expected to start at \
                 {end} (tensors must be contiguous, in order, without gaps or overlaps)"
            ));
        }
        end = stop;
        let bits = info
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .and_then(|n| n.checked_mul(info.dtype.bitsize()));
        let Some(bits) = bits else {
            return Err(format!(
                "overflow computing buffer size from shape and/or element type: tensor {name:?} of shape {:?}",
                info.shape
            ));
        };
        if bits % 8 != 0 {
            return Err(format!(
                "tensor {name:?} of {} elements of {} does not end on a byte boundary",
                bits / info.dtype.bitsize().max(1),
                info.dtype
            ));
        }
        if stop - start != bits / 8 {
            return Err(format!(
                "invalid shape, data type, or offset for tensor {name:?}: dtype {} and shape {:?} need {} \
                 bytes, its data_offsets give {}",
                info.dtype,
                info.shape,
                bits / 8,
                stop - start
            ));
        }
    }
    Ok(())
}

/// Parses a whole safetensors file held in memory. Pure; used by tests and
/// the fuzz targets.
#[cfg(test)]
pub(crate) fn parse_file(bytes: &[u8]) -> Result<Header, ErrorKind> {
    let file_len = bytes.len() as u64;
    let len = header_len(bytes, file_len)?;
    let json = usize::try_from(len)
        .ok()
        .and_then(|len| bytes.get(8..8 + len))
        .ok_or(ErrorKind::HeaderOutOfBounds { len, file_len })?;
    parse(json, file_len)
}

/// The alignment a dtype's elements need for a typed view: their size in
/// bytes, at most 8; sub-byte types need none.
pub(crate) fn dtype_align(dtype: Dtype) -> u64 {
    ((dtype.bitsize() / 8).clamp(1, 8)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file: the 8-byte length of `header`, `header`, `data` zero bytes.
    pub(super) fn file(header: &str, data: usize) -> Vec<u8> {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + data, 0);
        bytes
    }

    #[test]
    fn length_prefix_checked_before_allocation() {
        assert_eq!(
            header_len(&[1, 2], 2),
            Err(ErrorKind::FileTooSmall { len: 2 })
        );
        assert!(matches!(
            header_len(&u64::MAX.to_le_bytes(), 100),
            Err(ErrorKind::HeaderTooLarge { .. })
        ));
        assert_eq!(
            header_len(&100u64.to_le_bytes(), 50),
            Err(ErrorKind::HeaderOutOfBounds {
                len: 100,
                file_len: 50
            })
        );
        assert_eq!(header_len(&42u64.to_le_bytes(), 50), Ok(42));
    }

    #[test]
    fn entries_in_offset_order() {
        let bytes = file(
            r#"{"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"format":"pt"}}"#,
            12,
        );
        let header = parse_file(&bytes).unwrap();
        let names: Vec<_> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(header.tensors[1].start, 4);
        assert_eq!(header.metadata.unwrap()["format"], "pt");
    }

    #[test]
    fn duplicates_truncation_and_trailing_bytes() {
        let dup = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(matches!(
            parse_file(&file(dup, 1)),
            Err(ErrorKind::InvalidHeader { .. })
        ));
        let one = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
        assert!(matches!(
            parse_file(&file(one, 1)),
            Err(ErrorKind::SizeMismatch { expected, actual }) if expected > actual
        ));
        assert!(matches!(
            parse_file(&file(one, 3)),
            Err(ErrorKind::SizeMismatch { expected, actual }) if expected < actual
        ));
    }
}

/// The parser against its naive twin, the reference
/// `safetensors::SafeTensors::deserialize`, on headers built to sit on either
/// side of its limits, and on the fuzz target's seed corpus.
#[cfg(test)]
mod reference_verdicts {
    use std::path::Path;

    use super::tests::file;
    use super::*;

    /// `parse_file`'s verdict, after asserting that the reference accepts
    /// the same bytes exactly when it does.
    fn as_the_reference(bytes: &[u8]) -> Result<Header, ErrorKind> {
        let ours = parse_file(bytes);
        let reference = safetensors::SafeTensors::deserialize(bytes);
        assert_eq!(
            ours.is_ok(),
            reference.is_ok(),
            "safeload: {:?}; the reference: {:?}",
            ours.as_ref().err(),
            reference.as_ref().err()
        );
        ours
    }

    /// Asserts that `result` is the refusal of JSON nested past the limit, at
    /// `column` when given.
    fn refused_for_nesting(result: Result<Header, ErrorKind>, column: Option<usize>) {
        let reason = match result {
            Err(ErrorKind::InvalidHeader { reason }) => reason,
            other => panic!("expected InvalidHeader, got {other:?}"),
        };
        assert!(
            reason
                .starts_with("nesting limit exceeded: more than 127 levels of arrays and objects"),
            "{reason}"
        );
        if let Some(column) = column {
            assert!(
                reason.contains(&format!("line 1 column {column} ")),
                "{reason}"
            );
        }
    }

    /// `depth` levels of arrays and objects, one inside the other, the
    /// outermost first: `[` for an array, `{` for an object (`{"a":` but at
    /// the innermost level).
    fn nest(depth: usize, kinds: &[u8]) -> String {
        let (mut open, mut close) = (String::new(), Vec::new());
        for level in 0..depth {
            let innermost = level + 1 == depth;
            match kinds[level % kinds.len()] {
                b'[' => {
                    open.push('[');
                    close.push(']');
                }
                _ if innermost => {
                    open.push('{');
                    close.push('}');
                }
                _ => {
                    open.push_str(r#"{"a":"#);
                    close.push('}');
                }
            }
        }
        open.extend(close.iter().rev());
        open
    }

    fn arrays(depth: usize) -> String {
        nest(depth, b"[")
    }

    /// The shapes a nest can take: arrays, objects, both in turn.
    fn every_nest(depth: usize) -> [String; 3] {
        [arrays(depth), nest(depth, b"{"), nest(depth, b"[{")]
    }

    /// The tensor entry every nesting case holds: valid, one byte of data.
    const KNOWN_FIELDS: &str = r#""dtype":"U8","shape":[1],"data_offsets":[0,1]"#;

    /// A header whose one tensor entry has an unknown field `x` holding
    /// `value`, after the known fields and before them. Two levels of the
    /// header are the outer object and the entry; the value's are the rest.
    fn with_unknown_field(value: &str) -> [String; 2] {
        [
            format!(r#"{{"t":{{{KNOWN_FIELDS},"x":{value}}}}}"#),
            format!(r#"{{"t":{{"x":{value},{KNOWN_FIELDS}}}}}"#),
        ]
    }

    /// serde_json refuses the 128th level of arrays and objects, counting the
    /// outer object as the first: so does the reference, and so must the
    /// parser, in an unknown field of a tensor entry, the one place where a
    /// nest is not refused for its type first. The reference's deepest
    /// accepted header, found by these depths, nests 127 levels.
    #[test]
    fn nesting_limit_is_the_references() {
        for total in [
            MAX_NESTING - 1,
            MAX_NESTING,
            MAX_NESTING + 1,
            MAX_NESTING + 2,
        ] {
            for value in every_nest(total - 2) {
                for header in with_unknown_field(&value) {
                    let result = as_the_reference(&file(&header, 1));
                    if total <= MAX_NESTING {
                        let header = result.unwrap_or_else(|e| panic!("{total} levels: {e:?}"));
                        assert_eq!(header.tensors.len(), 1);
                    } else {
                        refused_for_nesting(result, None);
                    }
                }
            }
        }
        // Refused where the 128th level opens: the 126th bracket of the
        // field's value, whatever follows.
        for total in [MAX_NESTING + 1, MAX_NESTING + 2] {
            let [after, _] = with_unknown_field(&arrays(total - 2));
            let column = after.find("\"x\":").unwrap() + 4 + (MAX_NESTING + 1 - 2);
            refused_for_nesting(parse_file(&file(&after, 1)), Some(column));
        }
    }

    /// Everywhere else a nest is refused at any depth, by both, for its type:
    /// the header must be an object, a tensor entry an object (or an array)
    /// of a dtype name, a shape of numbers and two offsets, a metadata value
    /// a string. The files are otherwise valid.
    #[test]
    fn nests_where_no_array_belongs_are_refused_at_every_depth() {
        for total in [4, MAX_NESTING - 1, MAX_NESTING, MAX_NESTING + 1, 100_000] {
            for value in every_nest(total) {
                let inner = |levels_above: usize| {
                    let depth = total - levels_above;
                    if value.starts_with('[') {
                        arrays(depth)
                    } else {
                        nest(depth, b"{")
                    }
                };
                let without_tensors = [
                    value.clone(),
                    format!(r#"{{"__metadata__":{}}}"#, inner(1)),
                    format!(r#"{{"__metadata__":{{"k":{}}}}}"#, inner(2)),
                ];
                let with_a_tensor = [
                    format!(r#"{{"t":{}}}"#, inner(1)),
                    format!(
                        r#"{{"t":{{"dtype":{},"shape":[1],"data_offsets":[0,1]}}}}"#,
                        inner(2)
                    ),
                    format!(
                        r#"{{"t":{{"dtype":"U8","shape":[{}],"data_offsets":[0,1]}}}}"#,
                        inner(3)
                    ),
                    format!(
                        r#"{{"t":{{"dtype":"U8","shape":[1],"data_offsets":[0,1,{}]}}}}"#,
                        inner(3)
                    ),
                    format!(r#"{{"t":["U8",[1],[0,1],{}]}}"#, inner(2)),
                ];
                for header in without_tensors {
                    assert!(as_the_reference(&file(&header, 0)).is_err(), "{total}");
                }
                for header in with_a_tensor {
                    assert!(as_the_reference(&file(&header, 1)).is_err(), "{total}");
                }
            }
        }
        // The templates those mutate are valid, so each fails for its nest.
        for (header, data) in [
            (r#"{"__metadata__":{"k":"v"}}"#, 0),
            (r#"{"t":["U8",[1],[0,1]]}"#, 1),
            (
                r#"{"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
                1,
            ),
        ] {
            assert!(as_the_reference(&file(header, data)).is_ok(), "{header}");
        }
    }

    /// A million levels, closed or not, wherever they are: an error, not a
    /// stack overflow; past the limit in an unknown field, for the nesting.
    #[test]
    fn a_million_levels_is_an_error_not_a_stack_overflow() {
        const MILLION: usize = 1_000_000;
        for value in [arrays(MILLION), nest(MILLION, b"{"), nest(MILLION, b"[{")] {
            for header in with_unknown_field(&value) {
                refused_for_nesting(as_the_reference(&file(&header, 1)), None);
            }
            for header in [
                value.clone(),
                format!(r#"{{"t":{value}}}"#),
                format!(r#"{{"__metadata__":{value}}}"#),
            ] {
                assert!(as_the_reference(&file(&header, 0)).is_err());
            }
        }
        let unclosed = format!(r#"{{"t":{{{KNOWN_FIELDS},"x":{}"#, "[".repeat(MILLION));
        refused_for_nesting(as_the_reference(&file(&unclosed, 1)), None);
    }

    /// An unknown field's value is checked as the reference checks it (the
    /// whole entry goes through serde_json's `deserialize_any` there), not
    /// merely skipped: escapes must decode and numbers must fit an `f64`.
    #[test]
    fn unknown_fields_are_checked_as_the_reference_checks_them() {
        let refused = [
            r#""\ud800""#,
            r#""\udc00x""#,
            r#"{"\ud800":1}"#,
            r#""\x""#,
            "1e400",
            "-1e400",
            "[1,1e400]",
            r#"{"a":1e400}"#,
            "tru",
            "01",
            "[1,]",
        ];
        let accepted = [
            r#""\ud83d\ude00""#,
            r#""\u0000""#,
            "1e-400",
            "-0",
            "18446744073709551616",
            "-9223372036854775809",
            "null",
            "true",
            "[]",
            "{}",
            r#"{"a":[1,2.5,"s",null,{"b":false}],"a":0}"#,
        ];
        for value in refused {
            for header in with_unknown_field(value) {
                assert!(as_the_reference(&file(&header, 1)).is_err(), "{header}");
            }
        }
        for value in accepted {
            for header in with_unknown_field(value) {
                assert!(as_the_reference(&file(&header, 1)).is_ok(), "{header}");
            }
        }
    }

    /// The fuzz target's seed corpus, `fuzz/corpus/seed-header/` (every
    /// single-file case of `tests/malformed.rs` up to 4 KB, and valid files),
    /// and the corpus a local fuzzing run leaves in `fuzz/corpus/header/`, if
    /// any: the reference accepts exactly what the parser accepts, but for a
    /// tensor named twice, which the reference collapses to the last entry
    /// and the parser refuses (the crate docs' "Safety and limits"; the
    /// property tests allow the same one difference).
    #[test]
    fn seed_corpus_verdicts_are_the_references() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz")
            .join("corpus");
        let mut inputs = 0;
        for dir in ["seed-header", "header"] {
            let Ok(entries) = std::fs::read_dir(corpus.join(dir)) else {
                assert_eq!(dir, "header", "the seed corpus is missing");
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                let name = path.file_name().unwrap().to_string_lossy();
                let ours = parse_file(&bytes);
                let reference = safetensors::SafeTensors::deserialize(&bytes);
                match (&ours, &reference) {
                    (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
                    (Err(ErrorKind::InvalidHeader { reason }), Ok(_))
                        if reason.ends_with("appears twice") => {}
                    _ => panic!(
                        "{}: safeload {:?}, the reference {:?}",
                        path.display(),
                        ours.err(),
                        reference.err()
                    ),
                }
                if dir == "seed-header" {
                    // Named after their case: only the valid ones load.
                    assert_eq!(ours.is_ok(), name.starts_with("valid_"), "{name}");
                }
                inputs += 1;
            }
        }
        assert!(inputs >= 60, "{inputs} inputs");
    }
}
