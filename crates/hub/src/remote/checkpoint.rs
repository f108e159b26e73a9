//! A remote checkpoint resolved: its location, the index or single file found there, and the objects opened while finding them, handed to the open path so that no file is opened twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::location::{RemoteLocation, RemoteSettings};
use super::object::RemoteObject;
use super::store::IoRuntime;
use crate::cancel::Cancel;
use crate::error::{Error, ErrorKind, Operation, RemoteFailure, Result};
use crate::format::{INDEX_FILE, MAX_INDEX_BYTES, SINGLE_FILE};
use crate::source::Source;

/// A remote checkpoint's place and the objects opened so far, by file name.
#[derive(Debug)]
pub(crate) struct RemoteCheckpoint {
    location: RemoteLocation,
    opened: Mutex<HashMap<String, Arc<RemoteObject>>>,
}

pub(crate) use crate::extras::Found;

impl RemoteCheckpoint {
    /// Parses `text`, configures its client from the environment, and finds the
    /// checkpoint there ([`Self::find`]).
    pub(crate) fn resolve(text: &str, cancel: &Cancel) -> Result<(RemoteCheckpoint, Found)> {
        let checkpoint = RemoteCheckpoint::new(text, cancel)?;
        let found = checkpoint.find()?;
        Ok((checkpoint, found))
    }

    /// Parses `text` and configures its client, sending nothing yet; `cancel` stops its
    /// requests.
    pub(crate) fn new(text: &str, cancel: &Cancel) -> Result<RemoteCheckpoint> {
        let runtime = IoRuntime::new(cancel.clone()).map_err(|e| {
            let detail = format!("cannot start the I/O runtime: {e}");
            Error::remote_failed(Operation::Open, text, None, RemoteFailure::Config, &detail)
        })?;
        let location = RemoteLocation::new(text, RemoteSettings::from_env(), Arc::new(runtime))
            .map_err(|e| e.into_error(Operation::Open))?;
        Ok(RemoteCheckpoint {
            location,
            opened: Mutex::new(HashMap::new()),
        })
    }

    /// The error of a place that holds no checkpoint.
    pub(crate) fn no_checkpoint(&self) -> Error {
        let found = Vec::new();
        Error::new(
            ErrorKind::NoCheckpoint { found },
            self.location.shown_prefix(),
        )
    }

    pub(crate) fn location(&self) -> &RemoteLocation {
        &self.location
    }

    /// Finds the checkpoint: the file the address names, else `model.safetensors`, else the
    /// index. A repository or revision the hub lacks is that error.
    pub(crate) fn find(&self) -> Result<Found> {
        let missing = |e: &Error| e.remote_failure() == Some(RemoteFailure::FileNotFound);
        if let Some(name) = self.location.file().map(str::to_owned) {
            if name.ends_with(".safetensors.index.json") {
                let (bytes, _) = self.read_index(&name)?;
                return Ok(Found::Index(name, bytes));
            }
            self.open(&name)?;
            return Ok(Found::Single(name));
        }
        match self.open(SINGLE_FILE) {
            Ok(_) => return Ok(Found::Single(SINGLE_FILE.to_owned())),
            Err(e) if missing(&e) => {}
            Err(e) => return Err(e),
        }
        match self.read_index(INDEX_FILE) {
            Ok((bytes, _)) => Ok(Found::Index(INDEX_FILE.to_owned(), bytes)),
            Err(e) if missing(&e) => Err(self.no_checkpoint()),
            Err(e) => Err(e),
        }
    }

    /// The index `name`, read whole (refused past [`MAX_INDEX_BYTES`]), and its object.
    pub(crate) fn read_index(&self, name: &str) -> Result<(Vec<u8>, Arc<RemoteObject>)> {
        let object = self.open(name)?;
        let len = object.len();
        if len > MAX_INDEX_BYTES {
            return Err(Error::new(
                ErrorKind::InvalidIndex {
                    reason: format!(
                        "index of {len} bytes exceeds the limit of {MAX_INDEX_BYTES} bytes"
                    ),
                },
                object.path(),
            ));
        }
        let bytes = read_whole(&object, MAX_INDEX_BYTES)?;
        // The index is read once; its object is not a shard.
        self.lock().remove(name);
        Ok((bytes, object))
    }

    /// Keeps `object` as the file `name` for the open path to take.
    pub(crate) fn keep(&self, name: &str, object: Arc<RemoteObject>) {
        self.lock().insert(name.to_owned(), object);
    }

    /// The object `name` of the location: the one opened while resolving, or opened now.
    pub(crate) fn open(&self, name: &str) -> Result<Arc<RemoteObject>> {
        if let Some(object) = self.lock().get(name) {
            return Ok(Arc::clone(object));
        }
        let object = self.location.open_file(name);
        let object = Arc::new(object.map_err(|e| e.into_error(Operation::Open))?);
        self.lock().insert(name.to_owned(), Arc::clone(&object));
        Ok(object)
    }

    /// Takes the object `name` opened while resolving, if any.
    pub(crate) fn take(&self, name: &str) -> Result<Arc<RemoteObject>> {
        let taken = self.lock().remove(name);
        match taken {
            Some(object) => Ok(object),
            None => self
                .location
                .open_file(name)
                .map(Arc::new)
                .map_err(|e| e.into_error(Operation::Open)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RemoteObject>>> {
        self.opened.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The address a file of the checkpoint is shown by (the same a [`RemoteObject`] shows).
    pub(crate) fn shown(&self, name: &str) -> String {
        self.location.shown_file(name)
    }
}
/// The bytes of a small object, read whole: no more than `limit` nor the memory headroom.
pub(crate) fn read_whole(object: &RemoteObject, limit: u64) -> Result<Vec<u8>> {
    object
        .read_small(limit)
        .map_err(|e| e.into_error(Operation::Read))
}
