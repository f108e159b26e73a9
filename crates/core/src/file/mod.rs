//! A file of a checkpoint, opened: the one open path shared by loads, checkpoints and prefetch, and the immutable facts it yields (source, header, mount, the policy's first decision, the map where it maps).
//!
//! What a load then does with a file is its life in [`life`]: planned,
//! filling, sealed, each a type of its own moved by consuming transitions.

pub(crate) mod life;

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use crate::error::Operation;
use crate::error::{Error, ErrorKind, Result};
use crate::format::header::{self, Header, PREFIX_LEN};
use crate::mount::MountTable;
use crate::options::Options;
use crate::policy::{self, Environment, FileDecision, Origin, ReadMode, Strategy};
use crate::report::LoadNote;
use crate::resolve::{Resolved, ShardFile};
pub(crate) use crate::source::read_error;
use crate::source::{LocalFile, Source};
use crate::storage::Storage;
use crate::{trace, workers};

/// A file opened and its header checked: facts that no load changes.
pub(crate) struct OpenedFile {
    source: Arc<dyn Source>,
    header: Header,
    decision: FileDecision,
    map: Option<Arc<Storage>>,
    opened_at: u64,
    /// When its map was made, where it was mapped at open.
    mapped_at: Option<Instant>,
}

impl OpenedFile {
    /// Where its bytes come from.
    pub(crate) fn source(&self) -> &dyn Source {
        &*self.source
    }

    /// The source, shared (what outlives the load: a cache write's check).
    pub(crate) fn shared_source(&self) -> Arc<dyn Source> {
        Arc::clone(&self.source)
    }

    /// The local file behind it; `None` for a remote object.
    pub(crate) fn local(&self) -> Option<&LocalFile> {
        self.source.local()
    }

    /// The path it was opened by.
    pub(crate) fn path(&self) -> &Path {
        self.source.path()
    }

    /// Its length when opened.
    pub(crate) fn size(&self) -> u64 {
        self.source.len()
    }

    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// How the policy chose to read it when it was opened, and why.
    pub(crate) fn decision(&self) -> &FileDecision {
        &self.decision
    }

    /// Its map, where the policy maps it.
    pub(crate) fn map(&self) -> Option<&Arc<Storage>> {
        self.map.as_ref()
    }

    /// Nanoseconds from the start of the load that opened it.
    pub(crate) fn opened_at(&self) -> u64 {
        self.opened_at
    }

    /// When its map was made, where it was mapped when opened.
    pub(crate) fn mapped_at(&self) -> Option<Instant> {
        self.mapped_at
    }

    /// The file handed to the warm-up, which neither opens nor looks it up
    /// again; `None` for a remote object (no page cache to warm).
    pub(crate) fn handed(&self) -> Option<crate::extras::WarmFile<'_>> {
        let local = self.local()?;
        Some(crate::extras::WarmFile::of(local, self.map.is_some()))
    }

    /// The file handed to the share step.
    pub(crate) fn to_share(&self) -> crate::extras::ShareFile<'_> {
        crate::extras::ShareFile {
            source: self.source(),
            header: &self.header,
            buffered: self.map.is_none()
                && self.decision.strategy == crate::policy::Strategy::Buffered,
        }
    }
}

/// What the opening of every file of a checkpoint shares.
struct Context<'a> {
    resolved: &'a Resolved,
    mode: ReadMode,
    origin: Origin,
    table: Option<&'a MountTable>,
    clock: Instant,
}

/// Files opened at once: the caller's number, else the machine's.
pub(crate) fn threads(opts: &Options) -> usize {
    opts.threads.unwrap_or_else(workers::default_width).max(1)
}

/// What the report says of files a server sends whole, ignoring `Range`
/// (each fetched once, by its first request), if there are any.
pub(crate) fn fetched_whole<'a>(
    files: impl IntoIterator<Item = &'a OpenedFile>,
) -> Option<LoadNote> {
    let files = files
        .into_iter()
        .filter(|f| f.source().fetched_whole())
        .count();
    (files > 0).then_some(LoadNote::RangesIgnored { files })
}

/// Opens `shards` of `resolved` in parallel ([`open`] each), then checks the
/// headers against each other and the index; also returns what went
/// otherwise than planned (threads refused).
pub(crate) fn open_all(
    opts: &Options,
    resolved: &Resolved,
    shards: &[&ShardFile],
    env: &Environment,
    clock: Instant,
) -> Result<(Vec<OpenedFile>, Vec<LoadNote>)> {
    let (mode, origin) = policy::effective_mode(opts.mode, env);
    let table = mount_table(opts);
    let ctx = Context {
        resolved,
        mode,
        origin,
        table: table.as_ref(),
        clock,
    };
    // A remote file's open waits on a round trip, not a core: every file at
    // once (up to the readers' most), unless the caller set the threads.
    let width = match (resolved.is_remote(), opts.threads) {
        (true, None) => shards.len().clamp(1, crate::adapt::MAX_READERS),
        _ => threads(opts),
    };
    let (files, openers) = workers::map(shards, width, "safeload-open", |shard| open(shard, &ctx))?;
    let notes = LoadNote::threads("opening files", &openers)
        .into_iter()
        .collect();
    let headers: Vec<_> = files.iter().map(|f| (f.path(), &f.header)).collect();
    resolved.check_headers(&headers)?;
    trace::traced! {
        for file in &files {
            tracing::debug!(
                target: "safeload",
                file = %file.path().display(),
                strategy = %file.decision.strategy,
                reason = %file.decision,
                "opened"
            );
        }
    }
    Ok((files, notes))
}

/// Opens `shards` of `resolved` as sources, without reading anything of
/// them: the first half of [`open_all`], for a prefetch alone
/// (`Loader::warm`), which must not warm headers it has no use for.
pub(crate) fn open_sources(
    opts: &Options,
    resolved: &Resolved,
    shards: &[&ShardFile],
) -> Result<Vec<LocalFile>> {
    let table = mount_table(opts);
    shards
        .iter()
        .map(|shard| open_source(shard, resolved, table.as_ref()))
        .collect()
}

/// Opens one shard: a local file (through the checkpoint's directory, its
/// mount looked up) or a remote object (feature `remote`). The first step of
/// every open.
fn open_any(
    shard: &ShardFile,
    resolved: &Resolved,
    table: Option<&MountTable>,
) -> Result<Arc<dyn Source>> {
    if let Some(remote) = resolved.remote() {
        return remote.take(&shard.name, table);
    }
    Ok(Arc::new(open_source(shard, resolved, table)?))
}

/// Opens one local shard (through the checkpoint's directory) and looks up
/// its mount.
fn open_source(
    shard: &ShardFile,
    resolved: &Resolved,
    table: Option<&MountTable>,
) -> Result<LocalFile> {
    let path = &shard.path;
    let file = resolved
        .open(shard)
        .map_err(|e| Error::io(Operation::Open, path, None, e))?;
    LocalFile::new(path.clone(), file, table).map_err(|e| Error::io(Operation::Stat, path, None, e))
}

/// The caller's mount table, else this process's.
fn mount_table(opts: &Options) -> Option<MountTable> {
    opts.mount_table
        .clone()
        .or_else(|| MountTable::current().ok())
}

/// Nanoseconds since `clock`, saturating.
pub(crate) fn since(clock: Instant) -> u64 {
    u64::try_from(clock.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Opens one shard: reads and checks its header, looks up its mount,
/// decides how to read it, and maps it where the decision is a map.
fn open(shard: &ShardFile, ctx: &Context<'_>) -> Result<OpenedFile> {
    let opened_at = since(ctx.clock);
    let source = open_any(shard, ctx.resolved, ctx.table)?;
    let header = read_header(&*source)?;
    let Some(local) = source.local() else {
        // A remote object is read buffered, whatever the mode.
        return Ok(OpenedFile {
            decision: policy::choose_remote(ctx.mode, ctx.origin),
            source,
            header,
            map: None,
            opened_at,
            mapped_at: None,
        });
    };
    let mut decision = policy::choose(ctx.mode, ctx.origin, local.mount());
    let map = match decision.strategy {
        Strategy::Mmap => match map_checked(local, &header) {
            Ok(map) => Some(map),
            Err(MapError::Checked(e)) => return Err(e),
            Err(MapError::Refused(e)) => {
                // Some FUSE filesystems refuse mmap (ENODEV); reading works.
                decision.mmap_refused(&e);
                None
            }
        },
        Strategy::Buffered => None,
    };
    let mapped_at = map.is_some().then(Instant::now);
    Ok(OpenedFile {
        source,
        header,
        decision,
        map,
        opened_at,
        mapped_at,
    })
}

pub(crate) enum MapError {
    /// The map was made but the file is not what its header says.
    Checked(Error),
    /// The filesystem refused the map.
    Refused(std::io::Error),
}

/// Maps a file and checks the map's length against the header, before any
/// tensor can be handed out.
pub(crate) fn map_checked(
    source: &LocalFile,
    header: &Header,
) -> std::result::Result<Arc<Storage>, MapError> {
    let map = source.map().map_err(MapError::Refused)?;
    let mapped = map.len() as u64;
    if mapped != header.file_len() {
        // The file changed between fstat and mmap.
        return Err(MapError::Checked(size_mismatch(
            source.path(),
            header.file_len(),
            mapped,
        )));
    }
    Ok(Arc::new(Storage::of_file(
        map,
        source.path().to_path_buf(),
        None,
    )))
}

pub(crate) fn size_mismatch(path: &Path, expected: u64, actual: u64) -> Error {
    Error::new(ErrorKind::SizeMismatch { expected, actual }, path)
}

/// Reads the 8-byte length, checks it against the limit and the file size,
/// then reads and parses exactly that many bytes of header.
fn read_header(source: &dyn Source) -> Result<Header> {
    let (path, size) = (source.path(), source.len());
    if size < PREFIX_LEN {
        return Err(Error::new(ErrorKind::FileTooSmall { len: size }, path));
    }
    let mut prefix = [0u8; PREFIX_LEN as usize];
    source
        .read_at(&mut prefix, PREFIX_LEN as usize, 0)
        .map_err(|(at, e)| read_error(Operation::Read, source, size, at, e))?;
    let len = header::header_len(&prefix, size).map_err(|kind| Error::new(kind, path))?;
    // Bounded by the limit and by the file's size, both checked above.
    let mut json = vec![0u8; usize::try_from(len).unwrap_or(0)];
    let want = json.len();
    source
        .read_at(&mut json, want, PREFIX_LEN)
        .map_err(|(at, e)| read_error(Operation::Read, source, size, at, e))?;
    header::parse(&json, size).map_err(|kind| Error::new(kind, path))
}
