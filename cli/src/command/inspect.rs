//! `safeload inspect`: the tensors, dtypes, shapes, sizes, per-file totals and metadata of a checkpoint, from its headers alone.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use indicatif::HumanBytes;
use safeload::{Checkpoint, TensorInfo};

use crate::args::InspectArgs;
use crate::failure::Failure;
use crate::source::Source;
use crate::{json, output};

/// Runs `safeload inspect`.
pub fn run(args: &InspectArgs) -> Result<(), Failure> {
    let source = Source::from_arg(&args.checkpoint)?;
    if !args.json {
        source.announce();
    }
    // Opening reads the headers and maps what the policy maps, which reads
    // no tensor byte.
    let checkpoint = Checkpoint::open(source.path())?;
    if args.json {
        output::json(&json::Inspect::new(
            source.path(),
            source.is_demo(),
            &checkpoint,
        ))
    } else {
        output::text(&render(&source, &checkpoint))
    }
}

/// The text form: a summary, then per file its totals, how a load would
/// read it, its metadata, and its tensors as a table.
fn render(source: &Source, checkpoint: &Checkpoint) -> String {
    let report = checkpoint.report();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: {} tensors, {} of tensor data in {} file(s)",
        source.path().display(),
        checkpoint.len(),
        HumanBytes(checkpoint.total_bytes()),
        report.files.len(),
    );
    if let Some(index) = checkpoint.index_metadata() {
        let pairs: Vec<String> = index
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let _ = writeln!(out, "index metadata: {}", pairs.join(", "));
    }

    let widths = Widths::of(checkpoint);
    let by_file = tensors_by_file(checkpoint);
    for (file, tensors) in report.files.iter().zip(&by_file) {
        let _ = writeln!(
            out,
            "\n{}  {} tensors, {} ({} file)",
            file.path.display(),
            file.tensors,
            HumanBytes(file.tensor_bytes),
            HumanBytes(file.size),
        );
        let _ = writeln!(out, "  a load would {}: {}", verb(file), file.explain());
        if let Some(metadata) = file.metadata.as_ref().filter(|m| !m.is_empty()) {
            let pairs: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(out, "  metadata: {}", pairs.join(", "));
        }
        let _ = writeln!(
            out,
            "  {:<name$}  {:<dtype$}  {:<shape$}  {:>9}",
            "NAME",
            "DTYPE",
            "SHAPE",
            "SIZE",
            name = widths.name,
            dtype = widths.dtype,
            shape = widths.shape,
        );
        for tensor in tensors {
            let _ = writeln!(
                out,
                "  {:<name$}  {:<dtype$}  {:<shape$}  {:>9}",
                tensor.name(),
                tensor.dtype().to_string(),
                shape(tensor.shape()),
                HumanBytes(tensor.nbytes()).to_string(),
                name = widths.name,
                dtype = widths.dtype,
                shape = widths.shape,
            );
        }
    }
    out
}

/// The tensors of each file, in the order of `files()` (which the
/// opening's report shares).
fn tensors_by_file(checkpoint: &Checkpoint) -> Vec<Vec<&TensorInfo>> {
    let index: HashMap<&Path, usize> = checkpoint
        .files()
        .enumerate()
        .map(|(i, path)| (path, i))
        .collect();
    let mut groups = vec![Vec::new(); index.len()];
    for tensor in checkpoint.tensors() {
        if let Some(group) = index.get(tensor.file()).and_then(|&i| groups.get_mut(i)) {
            group.push(tensor);
        }
    }
    groups
}

fn verb(file: &safeload::report::FileReport) -> &'static str {
    match file.strategy {
        safeload::report::Strategy::Mmap => "map it",
        safeload::report::Strategy::Buffered => "read it (buffered)",
    }
}

/// `[1536, 2048]`, `[]` for a scalar.
fn shape(dims: &[usize]) -> String {
    format!("{dims:?}")
}

/// Column widths shared by every file's table, so the tables line up.
struct Widths {
    name: usize,
    dtype: usize,
    shape: usize,
}

impl Widths {
    fn of(checkpoint: &Checkpoint) -> Widths {
        let mut widths = Widths {
            name: "NAME".len(),
            dtype: "DTYPE".len(),
            shape: "SHAPE".len(),
        };
        for tensor in checkpoint.tensors() {
            widths.name = widths.name.max(tensor.name().chars().count());
            widths.dtype = widths.dtype.max(tensor.dtype().to_string().len());
            widths.shape = widths.shape.max(shape(tensor.shape()).len());
        }
        widths
    }
}
