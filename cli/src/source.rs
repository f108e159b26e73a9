//! The checkpoint a command works on: the path given, or the library's demo checkpoint written to a temporary directory that lives as long as the command.

use std::path::{Path, PathBuf};

use tempfile::TempDir;

use crate::args::CheckpointArg;
use crate::failure::Failure;

/// A checkpoint path, and the demo's directory where it is the demo.
pub struct Source {
    path: PathBuf,
    /// Kept so that the directory is removed when the command ends, not
    /// before.
    demo: Option<TempDir>,
}

impl Source {
    /// The path of `arg`, or a freshly written demo checkpoint (its index).
    pub fn from_arg(arg: &CheckpointArg) -> Result<Source, Failure> {
        match &arg.path {
            Some(path) if !arg.demo => Ok(Source {
                path: path.clone(),
                demo: None,
            }),
            // clap requires PATH unless --demo, and refuses both.
            _ => Source::demo(),
        }
    }

    fn demo() -> Result<Source, Failure> {
        let dir = tempfile::Builder::new()
            .prefix("safeload-demo-")
            .tempdir()
            .map_err(|e| Failure::io("creating a directory in", &std::env::temp_dir(), e))?;
        let path = safeload::demo::write(dir.path())?;
        Ok(Source {
            path,
            demo: Some(dir),
        })
    }

    /// The checkpoint's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether it is the demo checkpoint.
    pub fn is_demo(&self) -> bool {
        self.demo.is_some()
    }

    /// Tells on stderr where the demo was written, for a person reading
    /// the report (stdout stays the report's alone).
    pub fn announce(&self) {
        if let Some(dir) = &self.demo {
            eprintln!(
                "demo checkpoint written to {} (removed on exit)",
                dir.path().display()
            );
        }
    }
}
