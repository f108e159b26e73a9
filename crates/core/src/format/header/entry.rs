//! The serde visitors that read a header's JSON in one pass: its tensor entries, its metadata, and the values skipped as the reference skips them.

use std::collections::BTreeMap;
use std::fmt;

use safetensors::Dtype;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};

/// The header's entries in the order the JSON gives them.
pub(super) struct Entries {
    pub(super) metadata: Option<BTreeMap<String, String>>,
    pub(super) tensors: Vec<(String, Entry)>,
}

/// One tensor's entry: the fields of the crate's `TensorInfo`, read so that
/// a wrong dtype or offset pair says what it is (serde_json's direct enum
/// and tuple errors say only "expected value" or "trailing characters").
pub(super) struct Entry {
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) data_offsets: (usize, usize),
}

/// Written out rather than derived, for one difference: a derived
/// `Deserialize` skips unknown fields with [`de::IgnoredAny`], this one with
/// [`Skip`]. Otherwise as derived: an object of the three fields in any
/// order, each at most once, unknown ones allowed; or an array of the three
/// in order, which the reference's derived `TensorInfo` accepts too.
impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("Entry", &["dtype", "shape", "data_offsets"], EntryVisitor)
    }
}

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

/// Reads an [`Entry`] from an object of its fields or an array of them.
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
/// arrays and objects nested within its recursion limit
/// ([`MAX_NESTING`](super::MAX_NESTING)), escapes that decode (no lone
/// surrogate such as `"\ud800"`), numbers in range (no `1e400`). The
/// recursion is bounded by that limit: a nest a million deep is refused at
/// its 128th level, not by a stack overflow.
///
/// NOTE: [`de::IgnoredAny`], used here before (a derived `Deserialize`
/// skips unknown fields with it), checks none of the three: serde_json skips
/// it with a stack of its own, so a 100,000-deep nest, `"\ud800"` and `1e400`
/// in an unknown field were accepted (CHANGELOG.md). A depth counter of our
/// own was rejected: serde_json's count is the reference's by construction.
pub(super) struct Skip;

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
