//! A path that names nothing: an I/O error naming it, the cause in `source()`.

use tempfile::tempdir;

use super::refused;
use safeload::ErrorKind;

#[test]
fn checkpoint_path_that_does_not_exist() {
    let dir = tempdir().unwrap();
    let path = dir.path().join("absent.safetensors");
    let err = refused(&path, &path);
    assert!(matches!(err.kind(), ErrorKind::Io { .. }), "{err:?}");
    assert_eq!(err.io_error().unwrap().kind(), std::io::ErrorKind::NotFound);
    assert!(
        std::error::Error::source(&err).is_some(),
        "the io::Error is the source: {err:?}"
    );
}
