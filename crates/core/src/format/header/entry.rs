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

/// One tensor's entry, the crate's `TensorInfo`, read so that a wrong dtype or offset pair
/// says what it is (serde_json's enum and tuple errors say only "expected value").
pub(super) struct Entry {
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
    pub(super) data_offsets: (usize, usize),
}

/// As derived (an object of the fields, or an array of them in order), but unknown fields are
/// skipped with [`Skip`], not [`de::IgnoredAny`].
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

/// A value the parser has no use for, read through `deserialize_any` as the reference's
/// `#[serde(flatten)]` reads it, so serde_json checks it as the reference does: nesting within
/// [`MAX_NESTING`](super::MAX_NESTING) (a deep nest is refused, not a stack overflow), escapes
/// that decode (no `"\ud800"`), numbers in range (no `1e400`).
///
/// NOTE: [`de::IgnoredAny`] checks none of the three (serde_json skips it with a stack of its
/// own); a depth counter of our own would not be the reference's count by construction.
pub(super) struct Skip;

/// `Skip`'s visitors of scalars, which have nothing to check.
macro_rules! skip_scalars {
    ($($visit:ident: $ty:ty),*) => {
        $(fn $visit<E: de::Error>(self, _: $ty) -> Result<Skip, E> {
            Ok(Skip)
        })*
    };
}

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
    skip_scalars!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64);
    skip_scalars!(visit_str: &str);
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
