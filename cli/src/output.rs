//! Writing results to stdout: text or one JSON object, written once; a reader that went away (`| head`) is not an error.

use std::io::{self, Write};

use serde::Serialize;

use crate::failure::Failure;

/// Writes `text` to stdout as it is.
pub fn text(text: &str) -> Result<(), Failure> {
    write_all(text.as_bytes())
}

/// Writes `value` to stdout as one JSON object on one line, so that
/// `safeload ... --json | jq` and line-oriented readers both work.
pub fn json(value: &impl Serialize) -> Result<(), Failure> {
    let mut bytes = serde_json::to_vec(value).map_err(|e| Failure::Output(e.into()))?;
    bytes.push(b'\n');
    write_all(&bytes)
}

fn write_all(bytes: &[u8]) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        // The reader has all it wanted; the tool's work is done either way.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::Output),
    }
}
