//! A path that names nothing: an I/O error naming it and the OS's reason, matched without strings.

use tempfile::tempdir;

use super::refused;
use safeload::ErrorKind;
use safeload::error::Operation;

#[test]
fn checkpoint_path_that_does_not_exist() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("absent.safetensors");
    let err = refused(&path, &path);
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Io {
                operation: Operation::Stat,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_not_found() && !err.is_corrupt(), "{err:?}");
    assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
    // The OS's reason is in the message, once; `source()` does not repeat it.
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "{}: I/O error while reading the metadata: ",
            path.display()
        )),
        "{text}"
    );
    assert!(text.contains("No such file or directory"), "{text}");
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
}
