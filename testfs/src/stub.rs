//! Platforms without the FUSE support this crate needs: nothing mounts.

use std::convert::Infallible;
use std::io;
use std::path::Path;
use std::sync::Arc;

use crate::{Options, Shared};

/// A running session; none can exist here.
pub(crate) type Session = Infallible;

pub(crate) fn can_mount() -> Result<(), String> {
    Err("safeload-testfs mounts on Linux only".to_owned())
}

pub(crate) fn mount(
    _source: &Path,
    _mount_point: &Path,
    _options: &Options,
    _shared: Arc<Shared>,
) -> io::Result<Session> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "safeload-testfs mounts on Linux only",
    ))
}

pub(crate) fn set_read_ahead_kb(_mount_point: &Path, _kb: u32) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "safeload-testfs mounts on Linux only",
    ))
}

pub(crate) fn unmount(session: Session, _mount_point: &Path) {
    match session {}
}
