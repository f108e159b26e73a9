//! `safeload mounts`: the filesystem a path is on, what the auto policy does with a file there and why, and optionally the whole mount table.

use std::fmt::Write as _;
use std::path::Path;

use safeload::mount::{self, Mount, MountTable};
use safeload::{DISABLE_MMAP_ENV, HF_SHARD_PREFETCH_ENV, PREFETCH_ENV};

use crate::args::MountsArgs;
use crate::failure::Failure;
use crate::{json, output};

/// The variables a load follows instead of the auto policy's choice.
const OVERRIDES: [&str; 3] = [DISABLE_MMAP_ENV, PREFETCH_ENV, HF_SHARD_PREFETCH_ENV];

/// Runs `safeload mounts`.
pub fn run(args: &MountsArgs) -> Result<(), Failure> {
    let path = args.path.as_deref().unwrap_or(Path::new("."));
    // One reading of the table for the lookup and the listing, so they
    // agree. A table that cannot be read leaves the answer to statfs(2),
    // as in a load.
    let table = MountTable::current().unwrap_or_default();
    let found = mount::lookup_in(&table, path)
        .map_err(|e| Failure::io("looking up the filesystem of", path, e))?;
    let environment: Vec<(&'static str, String)> = OVERRIDES
        .iter()
        .filter_map(|&name| std::env::var(name).ok().map(|value| (name, value)))
        .collect();
    if args.json {
        let value = json::Mounts {
            path: path.to_string_lossy().into_owned(),
            mount: found.clone(),
            auto_policy: json::Policy::new(&found.auto_policy()),
            environment: environment
                .iter()
                .map(|(name, value)| json::Variable {
                    name,
                    value: value.clone(),
                })
                .collect(),
            mounts: args
                .all
                .then(|| table.entries().iter().map(json::TableEntry::new).collect()),
        };
        return output::json(&value);
    }
    let mut out = describe(path, &found, &environment);
    if args.all {
        out.push('\n');
        out.push_str(&listing(&table));
    }
    output::text(&out)
}

/// The mount of `path` and the auto policy there, one fact a line.
fn describe(path: &Path, found: &Mount, environment: &[(&str, String)]) -> String {
    let mut out = String::new();
    let _ = write!(out, "path:         {}", path.display());
    // A Hugging Face cache snapshot links into blobs/, maybe on another
    // mount: the lookup judges where the link leads.
    match std::fs::canonicalize(path) {
        Ok(real) if real != path => {
            let _ = writeln!(out, " (resolves to {})", real.display());
        }
        _ => out.push('\n'),
    }
    let _ = writeln!(out, "kind:         {}", found.kind);
    let unknown = |s: &str| {
        if s.is_empty() {
            "-".to_string()
        } else {
            s.to_string()
        }
    };
    let _ = writeln!(out, "type:         {}", unknown(&found.fs_type));
    let _ = writeln!(out, "source:       {}", unknown(&found.source));
    let _ = writeln!(
        out,
        "mount point:  {}",
        unknown(&found.mount_point.to_string_lossy())
    );
    let _ = writeln!(out, "found by:     {}", found.detected_by);

    let policy = found.auto_policy();
    let _ = writeln!(out, "auto policy:  {}: {}", policy.strategy, policy.reason);
    if policy.strategy == safeload::report::Strategy::Buffered {
        let direct = if policy.direct_io {
            "O_DIRECT for a file not already in the page cache"
        } else {
            "through the page cache"
        };
        let _ = writeln!(out, "reads:        {direct}");
    }
    match policy.prefetch_streams {
        Some(streams) => {
            let _ = writeln!(
                out,
                "prefetch:     {streams} stream(s) before mapping a file not already in the page cache"
            );
        }
        None => {
            let _ = writeln!(out, "prefetch:     none unless asked for");
        }
    }
    for (name, value) in environment {
        let _ = writeln!(
            out,
            "note:         {name}={value} is set: a load follows it instead"
        );
    }
    out
}

/// Every mount of the table, with its kind, as aligned columns.
fn listing(table: &MountTable) -> String {
    let rows: Vec<[String; 4]> = table
        .entries()
        .iter()
        .map(|e| {
            [
                e.kind().to_string(),
                e.fs_type().to_string(),
                e.source().to_string(),
                e.mount_point().display().to_string(),
            ]
        })
        .collect();
    let header = ["KIND", "TYPE", "SOURCE", "MOUNT POINT"].map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
        );
    }
    out
}
