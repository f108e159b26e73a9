//! Opening one file of a checkpoint: its descriptor, its header read and checked, its mount looked up, how it will be read (a checked map, or positional reads); then, for a load, which of its tensors it reads and into what layout, with or without direct I/O.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use memmap2::{Mmap, MmapMut};
use std::sync::Arc;

use super::resolve::{Resolved, ShardFile};
use crate::error::{Error, ErrorKind, Result};
use crate::format::header::{self, Header, PREFIX_LEN};
use crate::mount::{self, Mount, MountTable};
use crate::os;
use crate::policy::{self, Direct, FileDecision, MemoryVerdict, Origin, ReadMode, Strategy};
use crate::storage::{self, BufferLayout, Storage};
use safetensors::Dtype;

/// What the opening of every file of a checkpoint shares.
pub(crate) struct Context<'a> {
    pub resolved: &'a Resolved,
    pub mode: ReadMode,
    pub origin: Origin,
    pub table: Option<&'a MountTable>,
    pub clock: Instant,
}

/// A file whose header is parsed and whose strategy is decided.
pub(crate) struct OpenFile {
    pub path: PathBuf,
    /// `path` with symlinks resolved (the path itself where that fails).
    pub canonical: PathBuf,
    /// The one open of the file for this load: every byte of the load is
    /// read through it (with `O_DIRECT` set on it while the read engine
    /// runs, where [`choose_direct_io`](Self::choose_direct_io) says so).
    pub file: File,
    pub size: u64,
    pub header: Header,
    /// Per tensor of the header: whether the load reads it (all of them
    /// until [`prepare`](Self::prepare) says otherwise).
    pub selected: Vec<bool>,
    pub decision: FileDecision,
    pub mount: Option<Mount>,
    pub body: Body,
    /// Nanoseconds since the load started: when the file was opened, and
    /// when its last byte arrived.
    pub opened_at: u64,
    pub finished_at: AtomicU64,
    /// The file's SHA-256, once computed (`Loader::verify`).
    pub sha256: Option<crate::verify::Digest256>,
    /// The tensors a converting load (`Loader::dtype`) converts, and the
    /// buffer they are converted into.
    pub convert: Option<ConvertPart>,
    /// Whether the read engine populated the file's map.
    pub populated: bool,
}

/// The tensors of a file converted while loading, into one buffer of their
/// own: each is read (or taken from the map) and converted in the same pass
/// by the read engine, never loaded first and converted after.
pub(crate) struct ConvertPart {
    /// The dtype they become.
    pub to: Dtype,
    /// Per tensor of the header: its offset in the buffer, where converted.
    pub placements: Vec<Option<u64>>,
    /// The buffer's length.
    pub len: u64,
    pub buffer: ConvertBuffer,
    /// Values that were finite and became infinite.
    pub overflowed: AtomicU64,
}

/// The converted buffer, as a load goes on.
pub(crate) enum ConvertBuffer {
    Pending,
    Filling(MmapMut),
    Sealed(Arc<Storage>),
    Taken,
}

/// The bytes of a file, as a load goes on.
pub(crate) enum Body {
    /// The file's own map, shared with the tensors that view it.
    Mapped(Arc<Storage>),
    /// To be read (the policy chose it, or the map was refused); how is not
    /// known until a load says which tensors it wants.
    Unread,
    /// To be read into a buffer laid out so.
    Pending(BufferLayout),
    /// A buffer to be filled by the read engine.
    Buffered {
        buffer: MmapMut,
        layout: BufferLayout,
    },
    /// A filled buffer made read-only.
    Read { map: Mmap, layout: BufferLayout },
    /// Moved out while changing state.
    Taken,
}

impl OpenFile {
    /// The file handed to prefetch, which neither opens nor looks it up
    /// again.
    pub(crate) fn handed(&self) -> crate::prefetch::LoadFile<'_> {
        crate::prefetch::LoadFile {
            path: &self.path,
            canonical: &self.canonical,
            file: &self.file,
            mount: self.mount.as_ref(),
            mapped: matches!(self.body, Body::Mapped(_)),
            len: self.size,
        }
    }

    /// Bytes a buffered read of this file still has to allocate (not
    /// counting its converted tensors).
    pub(crate) fn pending_bytes(&self) -> u64 {
        match &self.body {
            Body::Pending(layout) => layout.len,
            _ => 0,
        }
    }

    /// Bytes its converted tensors need, which no map can hold instead.
    pub(crate) fn converted_bytes(&self) -> u64 {
        match &self.convert {
            Some(part) if matches!(part.buffer, ConvertBuffer::Pending) => part.len,
            _ => 0,
        }
    }

    /// Maps the file instead of reading it, as the memory guard decided;
    /// `false` (and nothing changes) where the map is refused.
    pub(crate) fn map_instead(&mut self, verdict: &MemoryVerdict, available: u64) -> bool {
        match map_checked(&self.file, &self.path, &self.header) {
            Ok(map) => {
                self.body = Body::Mapped(Arc::new(Storage::new(map, self.path.clone())));
                self.decision.memory_guard(verdict, available);
                true
            }
            Err(_) => false,
        }
    }

    /// Allocates the buffer of a pending file, and of its converted tensors.
    pub(crate) fn allocate(&mut self) -> Result<()> {
        if let Some(part) = &mut self.convert {
            if matches!(part.buffer, ConvertBuffer::Pending) {
                let len = usize::try_from(part.len).unwrap_or(usize::MAX);
                let buffer = storage::alloc_buffer(len)
                    .map_err(|e| Error::io("allocating a buffer for", &self.path, None, e))?;
                part.buffer = ConvertBuffer::Filling(buffer);
            }
        }
        let Body::Pending(layout) = &self.body else {
            return Ok(());
        };
        let len = usize::try_from(layout.len).unwrap_or(usize::MAX);
        let buffer = storage::alloc_buffer(len)
            .map_err(|e| Error::io("allocating a buffer for", &self.path, None, e))?;
        if let Body::Pending(layout) = std::mem::replace(&mut self.body, Body::Taken) {
            self.body = Body::Buffered { buffer, layout };
        }
        Ok(())
    }
}

/// Nanoseconds since `clock`, saturating.
pub(crate) fn since(clock: Instant) -> u64 {
    u64::try_from(clock.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Opens one shard: reads and checks its header, looks up its mount,
/// decides how to read it, and maps it where the decision is a map.
pub(crate) fn open(shard: &ShardFile, ctx: &Context<'_>) -> Result<OpenFile> {
    let path = &shard.path;
    let opened_at = since(ctx.clock);
    let file = ctx
        .resolved
        .open(shard)
        .map_err(|e| Error::io("opening", path, None, e))?;
    let size = file_len(&file, path)?;
    let header = read_header(&file, path, size)?;
    // The file as opened, symlinks resolved then (a Hugging Face cache
    // snapshot links every file into `blobs/`, maybe on another mount).
    let canonical = os::path_of(&file)
        .or_else(|| std::fs::canonicalize(path).ok())
        .unwrap_or_else(|| path.clone());
    let mount = ctx
        .table
        .and_then(|table| mount::lookup_file_in(table, &file, &canonical).ok());
    let mut decision = policy::choose(ctx.mode, ctx.origin, mount.as_ref());
    let body = match decision.strategy {
        Strategy::Mmap => match map_checked(&file, path, &header) {
            Ok(map) => Body::Mapped(Arc::new(Storage::new(map, path.clone()))),
            Err(MapError::Checked(e)) => return Err(e),
            Err(MapError::Refused(e)) => {
                // Some FUSE filesystems refuse mmap (ENODEV); reading works.
                decision.mmap_refused(&e);
                Body::Unread
            }
        },
        Strategy::Buffered => Body::Unread,
    };
    let selected = vec![true; header.tensors.len()];
    Ok(OpenFile {
        path: path.clone(),
        canonical,
        file,
        size,
        header,
        selected,
        decision,
        mount,
        body,
        opened_at,
        finished_at: AtomicU64::new(since(ctx.clock)),
        sha256: None,
        convert: None,
        populated: false,
    })
}

impl OpenFile {
    /// Readies a file for a load of the tensors `keep` selects: a file that
    /// is read gets its buffer layout (whether with direct I/O is decided
    /// later, by [`choose_direct_io`](Self::choose_direct_io)).
    pub(crate) fn prepare(&mut self, keep: Option<&dyn Fn(&str) -> bool>, dtype: Option<Dtype>) {
        self.selected = self
            .header
            .tensors
            .iter()
            .map(|t| keep.is_none_or(|keep| keep(&t.name)))
            .collect();
        // The selected tensors a converting load converts go to a buffer of
        // their own; the file's map or buffer holds the rest.
        let mut in_body = self.selected.clone();
        if let Some(to) = dtype {
            let mut placements = Vec::with_capacity(in_body.len());
            let mut len = 0u64;
            for (t, keep) in self.header.tensors.iter().zip(in_body.iter_mut()) {
                let converted_len = policy::converts_to(t.dtype, to)
                    .filter(|_| *keep)
                    .and_then(|size| t.num_elements()?.checked_mul(size));
                match converted_len {
                    Some(bytes) => {
                        *keep = false;
                        len = len.next_multiple_of(8);
                        placements.push(Some(len));
                        len += bytes as u64;
                    }
                    None => placements.push(None),
                }
            }
            if placements.iter().any(Option::is_some) {
                self.convert = Some(ConvertPart {
                    to,
                    placements,
                    len,
                    buffer: ConvertBuffer::Pending,
                    overflowed: AtomicU64::new(0),
                });
            }
        }
        if !matches!(self.body, Body::Unread) {
            return;
        }
        self.body = Body::Pending(BufferLayout::for_file(&self.header, &in_body));
    }

    /// Decides, just before the read engine runs (after any prefetch), whether
    /// this file's buffered reads bypass the page cache, and sets `O_DIRECT`
    /// on its one descriptor where they do. Direct reads skip the page cache:
    /// a win for a file that is not there, a loss for one that is (it would
    /// be read from storage again: a prefetch just warmed it, or an earlier
    /// load did).
    pub(crate) fn choose_direct_io(&mut self, direct_io: Option<bool>) {
        let (Body::Pending(layout) | Body::Buffered { layout, .. }) = &self.body else {
            return;
        };
        let kind = self.mount.as_ref().map(|m| m.kind);
        if policy::wants_direct_io(direct_io, kind, layout.image, || {
            mostly_cached(&self.file, self.size)
        }) {
            match os::set_direct(&self.file, true) {
                Ok(()) => self.decision.set_direct(Direct::On),
                Err(e) => self.decision.set_direct(Direct::Refused(e.to_string())),
            }
        }
    }

    /// Reads through the descriptor use the page cache again, once the read
    /// engine is done with it (a checkpoint that keeps the file open shares
    /// the open file, and its flags, with this load).
    pub(crate) fn end_direct_io(&self) {
        if self.decision.direct_io() {
            let _ = os::set_direct(&self.file, false);
        }
    }

    /// This file for one more load, from a checkpoint that keeps it open:
    /// the same open file (a second descriptor of it), the same header and
    /// decision, its map shared; not yet prepared.
    pub(crate) fn for_load(&self, clock: Instant) -> Result<OpenFile> {
        let file = self
            .file
            .try_clone()
            .map_err(|e| Error::io("duplicating the descriptor of", &self.path, None, e))?;
        let body = match &self.body {
            Body::Mapped(storage) => Body::Mapped(Arc::clone(storage)),
            _ => Body::Unread,
        };
        let mut decision = self.decision.clone();
        decision.set_direct(Direct::Off);
        Ok(OpenFile {
            path: self.path.clone(),
            canonical: self.canonical.clone(),
            file,
            size: self.size,
            header: self.header.clone(),
            selected: self.selected.clone(),
            decision,
            mount: self.mount.clone(),
            body,
            opened_at: since(clock),
            finished_at: AtomicU64::new(since(clock)),
            sha256: None,
            convert: None,
            populated: false,
        })
    }
}

/// Whether at least half of a file's pages are in the page cache (by
/// `cachestat(2)`); false where that cannot be told.
fn mostly_cached(file: &File, size: u64) -> bool {
    let pages = size.div_ceil(os::page_size());
    os::cached_pages(file, 0, 0).is_ok_and(|cached| cached.saturating_mul(2) >= pages)
}

enum MapError {
    /// The map was made but the file is not what its header says.
    Checked(Error),
    /// The filesystem refused the map.
    Refused(std::io::Error),
}

/// Maps a file and checks the map's length against the header, before any
/// tensor can be handed out.
fn map_checked(file: &File, path: &Path, header: &Header) -> std::result::Result<Mmap, MapError> {
    let map = storage::map_file(file).map_err(MapError::Refused)?;
    let mapped = map.len() as u64;
    if mapped != header.file_len() {
        // The file changed between fstat and mmap.
        return Err(MapError::Checked(size_mismatch(
            path,
            header.file_len(),
            mapped,
        )));
    }
    Ok(map)
}

/// The length of an open file, by `fstat`.
pub(crate) fn file_len(file: &File, path: &Path) -> Result<u64> {
    Ok(file
        .metadata()
        .map_err(|e| Error::io("reading metadata of", path, None, e))?
        .len())
}

pub(crate) fn size_mismatch(path: &Path, expected: u64, actual: u64) -> Error {
    Error::new(ErrorKind::SizeMismatch { expected, actual }, path)
}

/// Reads the 8-byte length, checks it against the limit and the file size,
/// then reads and parses exactly that many bytes of header.
fn read_header(file: &File, path: &Path, size: u64) -> Result<Header> {
    if size < PREFIX_LEN {
        return Err(Error::new(ErrorKind::FileTooSmall { len: size }, path));
    }
    let mut prefix = [0u8; PREFIX_LEN as usize];
    os::read_exact_at(file, &mut prefix, 0)
        .map_err(|(at, e)| read_error("reading", file, path, size, at, e))?;
    let len = header::header_len(&prefix, size).map_err(|kind| Error::new(kind, path))?;
    // Bounded by the limit and by the file's size, both checked above.
    let mut json = vec![0u8; usize::try_from(len).unwrap_or(0)];
    os::read_exact_at(file, &mut json, PREFIX_LEN)
        .map_err(|(at, e)| read_error("reading", file, path, size, at, e))?;
    header::parse(&json, size).map_err(|kind| Error::new(kind, path))
}

/// The error of a failed read (`operation` says of what); a read that ended
/// early means the file shrank, which is reported as such.
pub(crate) fn read_error(
    operation: &'static str,
    file: &File,
    path: &Path,
    expected: u64,
    offset: u64,
    error: std::io::Error,
) -> Error {
    if error.kind() == std::io::ErrorKind::UnexpectedEof {
        if let Ok(actual) = file_len(file, path) {
            if actual < expected {
                return size_mismatch(path, expected, actual);
            }
        }
    }
    Error::io(operation, path, Some(offset), error)
}
