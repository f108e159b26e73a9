//! Why a command failed, and how that is told: `error: <message>` on stderr, one `caused by:` line per cause, exit code 1.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A command's failure. Usage errors are not among them: clap reports
/// those itself, with exit code 2, before a command runs.
#[derive(Debug)]
pub enum Failure {
    /// The library failed; its message names the file.
    Library(safeload::Error),
    /// An I/O call of the tool's own failed on `path`.
    Io {
        /// What was being done, e.g. "looking up the filesystem of".
        doing: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// Output could not be written or encoded.
    Output(io::Error),
}

impl Failure {
    /// An I/O failure of `doing` on `path`.
    pub fn io(doing: &'static str, path: &Path, source: io::Error) -> Failure {
        Failure::Io {
            doing,
            path: path.to_path_buf(),
            source,
        }
    }

    /// The message and its chain of causes, as printed on stderr.
    pub fn render(&self) -> String {
        let mut text = format!("error: {self}\n");
        let mut cause = self.source();
        while let Some(error) = cause {
            text.push_str(&format!("  caused by: {error}\n"));
            cause = error.source();
        }
        text
    }
}

impl From<safeload::Error> for Failure {
    fn from(error: safeload::Error) -> Failure {
        Failure::Library(error)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The library's Display already names the path and the OS's
            // reason: print it as it is.
            Failure::Library(error) => write!(f, "{error}"),
            Failure::Io { doing, path, .. } => write!(f, "{doing} {}", path.display()),
            Failure::Output(_) => f.write_str("writing the output"),
        }
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            // The library error's own causes, not the library error again.
            Failure::Library(error) => error.source(),
            Failure::Io { source, .. } | Failure::Output(source) => Some(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_checkpoint_names_the_path_and_the_cause_once() {
        let error = safeload::load_state_dict("/no/such/checkpoint", None).unwrap_err();
        let text = Failure::from(error).render();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("error: /no/such/checkpoint: "),
            "{text}"
        );
        assert!(lines[0].contains("No such file or directory"), "{text}");
        assert_eq!(lines.len(), 1, "{text}");
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
    }

    #[test]
    fn an_io_failure_says_what_was_done_to_which_path() {
        let failure = Failure::io(
            "looking up the filesystem of",
            Path::new("/x"),
            io::Error::from(io::ErrorKind::NotFound),
        );
        assert_eq!(
            failure.render(),
            "error: looking up the filesystem of /x\n  caused by: entity not found\n"
        );
    }
}
