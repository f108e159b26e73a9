//! A file's life in one load, owned here: planned, then filling (its destinations allocated, the read engine writing them), then sealed (read-only, its tensors handed out). Each state is a type; each transition consumes the one before.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use std::time::Instant;

use safetensors::Dtype;

use super::{MapError, OpenedFile, map_checked, size_mismatch};
use crate::dest::Fill;
use crate::error::Operation;
use crate::error::{Error, Result};
use crate::format::header::{Header, TensorEntry};
use crate::plan::{ConvertPlan, FilePlan, Placement};
use crate::policy::DirectIo;
use crate::report::FileReport;
use crate::source::{DirectGuard, LocalFile, Source};
use crate::storage::Buffer;
use crate::storage::{BufferLayout, Storage};
use crate::tensor::Tensor;
use crate::verify::Digest256;

/// A file of a load with its plan, nothing allocated yet.
pub(crate) struct Planned<'a> {
    file: &'a OpenedFile,
    plan: FilePlan,
    started_at: u64,
    /// The file's node copy, where the ranks share one (the node crate's share step): an image
    /// of the file that a `Placement::Map` views instead of the file's map.
    copy: Option<Arc<Storage>>,
}

/// Where a file's own tensors land while a load fills them.
pub(crate) enum Destination {
    /// The file's read-only map: nothing to fill.
    Map(Arc<Storage>),
    /// Memory the read engine fills (an owned buffer), laid out so.
    Buffer {
        buffer: Box<dyn Fill>,
        layout: BufferLayout,
    },
}

/// A file whose destinations exist and are being filled by the read engine.
pub(crate) struct Filling<'a> {
    file: &'a OpenedFile,
    plan: FilePlan,
    destination: Destination,
    convert: Option<(ConvertPlan, Box<dyn Fill>)>,
    started_at: u64,
    finished_at: AtomicU64,
    overflowed: AtomicU64,
    sha256: Option<Digest256>,
    populated: bool,
    /// Clears `O_DIRECT` from the descriptor when the reads are done, also
    /// when a load fails (a checkpoint that stays open shares the
    /// descriptor).
    direct: DirectGuard<'a>,
}

/// A file whose bytes are all in place and read-only.
pub(crate) struct Sealed<'a> {
    file: &'a OpenedFile,
    plan: FilePlan,
    storage: Arc<Storage>,
    layout: Option<BufferLayout>,
    converted: Option<(ConvertPlan, Arc<Storage>)>,
    started_at: u64,
    finished_at: u64,
    overflowed: u64,
    sha256: Option<Digest256>,
    populated: bool,
}

impl<'a> Planned<'a> {
    /// `started_at`: nanoseconds from the start of the load when the file's
    /// part in it began (its opening, or the load's start for a checkpoint
    /// opened before).
    pub(crate) fn new(file: &'a OpenedFile, plan: FilePlan, started_at: u64) -> Self {
        Planned {
            file,
            plan,
            started_at,
            copy: None,
        }
    }

    /// Its tensors are to be views of this node copy of the file.
    pub(crate) fn with_copy(mut self, copy: Option<Arc<Storage>>) -> Self {
        self.copy = copy;
        self
    }

    /// Allocates the file's buffers, or maps it where the plan says so and
    /// it is not mapped yet (the memory guard's choice), and turns direct I/O
    /// on where the plan wants it. `clock`: the load's start, the origin of
    /// its times.
    pub(crate) fn fill(self, clock: Instant) -> Result<Filling<'a>> {
        let Planned {
            file,
            mut plan,
            started_at,
            copy,
        } = self;
        let Placed {
            destination,
            mapped_at,
        } = match &plan.placement {
            Placement::Map => place_map(file, copy)?,
            Placement::Buffer { layout, .. } => Placed {
                destination: Destination::Buffer {
                    buffer: alloc(layout.len, file)?,
                    layout: layout.clone(),
                },
                mapped_at: None,
            },
        };
        let convert = plan
            .convert
            .take()
            .map(|part| alloc(part.len, file).map(|buffer| (part, buffer)))
            .transpose()?;
        let direct = direct_io(file, &mut plan);
        Ok(Filling {
            file,
            plan,
            destination,
            convert,
            started_at,
            finished_at: AtomicU64::new(done_at(mapped_at, clock, started_at)),
            overflowed: AtomicU64::new(0),
            sha256: None,
            populated: false,
            direct,
        })
    }
}

/// Where a file's own tensors land, and when it was mapped if that made it
/// done.
struct Placed {
    destination: Destination,
    /// A mapped file is done when its map is made: at its open, or now.
    mapped_at: Option<Instant>,
}

/// Maps a file whose plan says so: its node copy, its map from its open, or a
/// map made now.
fn place_map(file: &OpenedFile, copy: Option<Arc<Storage>>) -> Result<Placed> {
    let path = file.path();
    match copy.as_ref().or(file.map()) {
        Some(map) => {
            // The node copy was mapped now, the file's own map at open.
            let mapped_at = match copy {
                Some(_) => Some(Instant::now()),
                None => file.mapped_at(),
            };
            Ok(Placed {
                destination: Destination::Map(Arc::clone(map)),
                mapped_at,
            })
        }
        None => match file.local().map(|local| map_checked(local, file.header())) {
            None => {
                let e = std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "a remote object cannot be mapped",
                );
                Err(Error::io(Operation::Map, path, None, e))
            }
            Some(Ok(map)) => Ok(Placed {
                destination: Destination::Map(map),
                mapped_at: Some(Instant::now()),
            }),
            Some(Err(MapError::Checked(e))) => Err(e),
            // The memory guard chose a map the filesystem refuses:
            // the file cannot be read within the memory either.
            Some(Err(MapError::Refused(e))) => Err(Error::io(Operation::Map, path, None, e)),
        },
    }
}

/// Turns `O_DIRECT` on where the plan reads the file into a buffer directly,
/// noting in the plan's decision why it could not be.
fn direct_io<'a>(file: &'a OpenedFile, plan: &mut FilePlan) -> DirectGuard<'a> {
    let mut direct = DirectGuard::default();
    if let Placement::Buffer { direct: true, .. } = plan.placement {
        match file.local().map(|local| direct.add(local)) {
            Some(Ok(())) => {}
            Some(Err(e)) => plan.decision.set_direct(DirectIo::Refused {
                error: e.to_string(),
            }),
            None => plan.decision.set_direct(DirectIo::Refused {
                error: "not a local file".to_owned(),
            }),
        }
    }
    direct
}

/// When a file is done so far, in nanoseconds from `clock`: when it was
/// mapped, if it was, and never before its part in the load began.
fn done_at(mapped_at: Option<Instant>, clock: Instant, started_at: u64) -> u64 {
    mapped_at
        .map(|at| {
            let since = at.saturating_duration_since(clock).as_nanos();
            u64::try_from(since).unwrap_or(u64::MAX)
        })
        .unwrap_or(0)
        .max(started_at)
}

/// An owned buffer of `len` bytes for `file`.
fn alloc(len: u64, file: &OpenedFile) -> Result<Box<dyn Fill>> {
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    match Buffer::new(len) {
        Ok(buffer) => Ok(Box::new(buffer)),
        Err(e) => Err(Error::io(Operation::Allocate, file.path(), None, e)),
    }
}

/// What the read engine needs of a filling file, borrowed apart.
pub(crate) struct Parts<'f> {
    pub source: &'f dyn Source,
    pub header: &'f Header,
    pub destination: &'f mut Destination,
    /// Whether the buffer's reads bypass the page cache.
    pub direct: bool,
    /// The converted tensors' plan and buffer.
    pub convert: Option<(&'f ConvertPlan, &'f mut [u8])>,
    /// The file's descriptor, for populating its map (a local file's).
    pub file: Option<&'f std::fs::File>,
    pub finished_at: &'f AtomicU64,
    pub overflowed: &'f AtomicU64,
    pub populated: &'f mut bool,
}

impl<'a> Filling<'a> {
    pub(crate) fn file(&self) -> &'a OpenedFile {
        self.file
    }

    /// The file's parts, for the read engine.
    pub(crate) fn parts(&mut self) -> Parts<'_> {
        Parts {
            source: self.file.source(),
            header: self.file.header(),
            destination: &mut self.destination,
            direct: self.direct.is_on(),
            convert: self.convert.as_mut().map(|(p, b)| (&*p, b.bytes_mut())),
            file: self.file.local().map(LocalFile::file),
            finished_at: &self.finished_at,
            overflowed: &self.overflowed,
            populated: &mut self.populated,
        }
    }

    /// The digest the read engine computed as the file's chunks landed.
    pub(crate) fn set_sha256(&mut self, digest: Digest256) {
        self.sha256 = Some(digest);
    }

    /// Makes every buffer read-only, after checking that the file did not
    /// change length while it was read.
    pub(crate) fn seal(self) -> Result<Sealed<'a>> {
        let Filling {
            file,
            mut plan,
            destination,
            convert,
            started_at,
            finished_at,
            overflowed,
            sha256,
            populated,
            direct,
        } = self;
        if let Some(why) = direct.dropped() {
            plan.decision.set_direct(DirectIo::Dropped {
                why: why.to_string(),
            });
        }
        drop(direct);
        let path = file.path();
        let expected = file.header().file_len();
        // A local file may have been truncated or grown during the read (a
        // remote object's every request required the version opened).
        if let (true, None, Some(local)) = (plan.reads(), file.map(), file.local()) {
            let now = local
                .len_now()
                .map_err(|e| Error::io(Operation::Stat, path, None, e))?;
            if now != expected {
                return Err(size_mismatch(path, expected, now));
            }
        }
        let seal = |buffer: Box<dyn Fill>| -> Result<Arc<Storage>> {
            match buffer.seal(path) {
                Ok(storage) => Ok(Arc::new(storage)),
                Err(e) => Err(Error::io(Operation::Seal, path, None, e)),
            }
        };
        let (storage, layout) = match destination {
            Destination::Map(storage) => (storage, None),
            Destination::Buffer { buffer, layout } => (seal(buffer)?, Some(layout)),
        };
        let converted = convert
            .map(|(part, buffer)| Ok((part, seal(buffer)?)))
            .transpose()?;
        Ok(Sealed {
            file,
            plan,
            storage,
            layout,
            converted,
            started_at,
            finished_at: finished_at.into_inner(),
            overflowed: overflowed.into_inner(),
            sha256,
            populated,
        })
    }
}

impl<'a> Sealed<'a> {
    pub(crate) fn file(&self) -> &'a OpenedFile {
        self.file
    }

    /// The file's digest, where the read engine computed it.
    pub(crate) fn sha256(&self) -> Option<Digest256> {
        self.sha256
    }

    /// Its map, where its own tensors are views of the file's map.
    pub(crate) fn map(&self) -> Option<&Arc<Storage>> {
        self.layout.is_none().then_some(&self.storage)
    }

    pub(crate) fn set_sha256(&mut self, digest: Digest256) {
        self.sha256 = Some(digest);
    }

    /// Hands out the selected tensors as views of their storage (pushed to
    /// `tensors`, in file order) and returns the file's report.
    pub(crate) fn into_tensors(self, tensors: &mut Vec<Tensor>) -> Result<FileReport> {
        let file = self.file;
        let header = file.header();
        let mut handed = Handed::default();
        for (i, entry) in header.tensors.iter().enumerate() {
            if !self.plan.selected.get(i).copied().unwrap_or(false) {
                continue;
            }
            let Located {
                dtype,
                holder,
                range,
                converted,
            } = self.locate(i, entry);
            if converted {
                handed.converted += 1;
            }
            let Some(range) = range else {
                return Err(size_mismatch(file.path(), header.file_len(), file.size()));
            };
            handed.tensors += 1;
            handed.tensor_bytes += range.len() as u64;
            if self.layout.is_some() {
                handed.bytes_read += entry.end - entry.start;
            }
            tensors.push(Tensor::new(
                Arc::from(entry.name.as_str()),
                dtype,
                entry.shape.clone(),
                Arc::clone(holder),
                range,
            )?);
        }
        Ok(self.report(&handed))
    }

    /// Finds where tensor `i` (`entry`) lies: its dtype, the storage holding
    /// it and its range there (`None`: past the storage's end).
    fn locate(&self, i: usize, entry: &TensorEntry) -> Located<'_> {
        // Where the tensor's bytes are: a converted part of its own, or
        // the file's storage.
        let place = self
            .converted
            .as_ref()
            .and_then(|(part, into)| Some((part, into, part.placements.get(i).copied()??)));
        match place {
            Some((part, into, place)) => {
                let len = entry.num_elements().unwrap_or(0) * (part.to.bitsize() / 8);
                let range = usize::try_from(place)
                    .ok()
                    .and_then(|s| Some(s..s.checked_add(len)?))
                    .filter(|r| r.end <= into.bytes().len());
                Located {
                    dtype: part.to,
                    holder: into,
                    range,
                    converted: true,
                }
            }
            None => {
                let start = match &self.layout {
                    Some(layout) => layout.placements.get(i).copied().flatten(),
                    None => Some(self.file.header().data_start + entry.start),
                };
                let range = start.and_then(|s| {
                    let s = usize::try_from(s).ok()?;
                    let e = s.checked_add(usize::try_from(entry.end - entry.start).ok()?)?;
                    (e <= self.storage.bytes().len()).then_some(s..e)
                });
                Located {
                    dtype: entry.dtype,
                    holder: &self.storage,
                    range,
                    converted: false,
                }
            }
        }
    }

    /// Writes the file's report from what it handed out.
    fn report(&self, handed: &Handed) -> FileReport {
        let file = self.file;
        // A file written whole to a cache is named where it is published.
        let published = file.source().cache_write().and_then(|w| w.published_path());
        FileReport {
            path: published.unwrap_or_else(|| file.path().to_path_buf()),
            size: file.size(),
            tensors: handed.tensors,
            tensor_bytes: handed.tensor_bytes,
            bytes_read: if self.populated {
                file.size()
            } else {
                handed.bytes_read
            },
            converted: handed.converted,
            overflowed: self.overflowed,
            strategy: self.plan.decision.strategy,
            reason: self.plan.decision.reason(),
            fallback: self.plan.decision.fallback.clone(),
            direct_io: self.plan.decision.direct.clone(),
            mount: file.source().mount().cloned(),
            elapsed: Duration::from_nanos(self.finished_at.saturating_sub(self.started_at)),
            metadata: file.header().metadata.clone(),
            sha256: self.sha256.map(|d| crate::verify::hex(&d)),
            node_copy: None,
            cache: file.source().cache_use(),
            commit: file.source().commit().map(str::to_owned),
            etag: file.source().etag().map(str::to_owned),
        }
    }
}

/// Where one tensor lies among a sealed file's storages.
struct Located<'s> {
    dtype: Dtype,
    /// The storage holding its bytes.
    holder: &'s Arc<Storage>,
    /// Its bytes in `holder`; `None` when they would lie past its end.
    range: Option<Range<usize>>,
    /// Whether it is a converted part's.
    converted: bool,
}

/// What a sealed file handed out, counted for its report.
#[derive(Default)]
struct Handed {
    tensors: usize,
    tensor_bytes: u64,
    bytes_read: u64,
    converted: usize,
}
