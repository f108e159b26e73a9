//! The parser against its naive twin, the reference
//! `safetensors::SafeTensors::deserialize`, on headers built to sit on either
//! side of its limits, and on the fuzz target's seed corpus.

use std::path::Path;

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
        reason.starts_with("nesting limit exceeded: more than 127 levels of arrays and objects"),
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
/// single-file case of `tests/it/malformed` up to 4 KB, and valid files),
/// and the corpus a local fuzzing run leaves in `fuzz/corpus/header/`, if
/// any: the reference accepts exactly what the parser accepts, but for a
/// tensor named twice, which the reference collapses to the last entry
/// and the parser refuses (the crate docs' "Safety and limits"; the
/// property tests allow the same one difference).
#[test]
fn seed_corpus_verdicts_are_the_references() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
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
