//! A load split between the nodes of a job (issue 27): the nodes agree on the files and their plan, each reads its share of the buffered files' pieces from storage, then every piece is broadcast from the node that read it, checked by its digest, into the same place of every other node's buffer.
//!
//! Every node makes the same collectives in the same order: one all-gather
//! (also where a node cannot take part), then one checked broadcast per
//! piece in the split's order.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::adapt::Concurrency;
use crate::cluster::{Exchange, ExchangeError, ExchangeErrorKind, broadcast_checked};
use crate::dest::node::CopyFill;
use crate::error::{Error, Operation, Result};
use crate::file::life::{Destination, Filling};
use crate::file::{OpenedFile, read_error, since};
use crate::jobs::{self, JobSource};
use crate::plan::cluster::{self, FileFacts, PIECE, Piece};
use crate::progress::Meter;
use crate::report::LoadNote;
use crate::source::VersionTag;
use crate::storage::{BufferLayout, Segment};

use super::Left;

/// A node copy the load fills (`extras::Pending`): the file and its writer.
pub(crate) type Copy<'a> = (&'a OpenedFile, &'a CopyFill);

/// Where the copies are among a load's pieces (after the `buffers`), and
/// whose pieces are read here (`me`'s).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    pub buffers: usize,
    pub me: usize,
}

/// The layout of a node copy: an image of the whole file.
fn image(len: u64) -> BufferLayout {
    BufferLayout {
        placements: Vec::new(),
        segments: vec![Segment {
            src: 0,
            dst: 0,
            len,
            required: len,
        }],
        len,
        image: true,
    }
}

/// The pieces of a load read alone: the copies', after the `buffers`.
pub(crate) fn alone(buffers: usize, copies: &[Copy<'_>]) -> Vec<Piece> {
    let images: Vec<BufferLayout> = copies.iter().map(|(f, _)| image(f.size())).collect();
    let mut refs: Vec<Option<&BufferLayout>> = vec![None; buffers];
    refs.extend(images.iter().map(Some));
    cluster::split(&refs, PIECE, 1)
}

/// What makes a load refuse a split between nodes.
pub(crate) struct Facts {
    pub converting: bool,
    pub verifying: bool,
}

/// Agrees with the other nodes on the files and their plan: the pieces to
/// split, else `None` (every node reads alone) and the reason in `notes`.
pub(crate) fn agree(
    exchange: &dyn Exchange,
    filling: &mut [Filling<'_>],
    copies: &[Copy<'_>],
    facts: &Facts,
    path: &std::path::Path,
    notes: &mut Vec<LoadNote>,
) -> Result<Option<Vec<Piece>>> {
    let files = compared(filling, copies);
    let mut refusal = refusal(facts);
    let described = describe(&files, &mut refusal);
    let all = exchange
        .all_gather(&offer(refusal.as_deref(), &described))
        .map_err(|e| exchange_error(path, None, &e))?;
    if let Some(why) = refused(&all).or_else(|| cluster::agree(&all).err()) {
        notes.push(LoadNote::NodesReadAlone { why });
        return Ok(None);
    }
    let refs: Vec<Option<&BufferLayout>> = files.iter().map(|f| f.layout.as_ref()).collect();
    let pieces = cluster::split(&refs, PIECE, exchange.nodes());
    Ok((!pieces.is_empty()).then_some(pieces))
}

/// One file the nodes compare, its layout `None` where mapped.
struct Compared<'a> {
    file: &'a OpenedFile,
    name: String,
    layout: Option<BufferLayout>,
}

/// The files the nodes compare: `filling`'s, then the node copies'.
fn compared<'a>(filling: &'a mut [Filling<'_>], copies: &[Copy<'a>]) -> Vec<Compared<'a>> {
    let mut layouts: Vec<Option<BufferLayout>> = filling
        .iter_mut()
        .map(|f| match &*f.parts().destination {
            Destination::Buffer { layout, .. } => Some(layout.clone()),
            Destination::Map(_) => None,
        })
        .collect();
    layouts.extend(copies.iter().map(|(f, _)| Some(image(f.size()))));
    let files: Vec<&OpenedFile> = filling
        .iter()
        .map(Filling::file)
        .chain(copies.iter().map(|(f, _)| *f))
        .collect();
    files
        .into_iter()
        .zip(layouts)
        .map(|(file, layout)| {
            // Its file name, else its path.
            let path = file.path();
            let name = path.file_name().map_or(path.as_os_str(), |n| n);
            let name = name.to_string_lossy().into_owned();
            Compared { file, name, layout }
        })
        .collect()
}

/// Why this load cannot be split between the nodes whatever its files.
fn refusal(facts: &Facts) -> Option<String> {
    let why = if facts.converting {
        "the load converts dtypes"
    } else if facts.verifying {
        "verify hashes each file whole as it reads it"
    } else {
        return None;
    };
    Some(why.to_owned())
}

/// Describes each file; one whose version cannot be told is a `refusal`.
fn describe<'f>(files: &'f [Compared<'_>], refusal: &mut Option<String>) -> Vec<FileFacts<'f>> {
    let describe = |compared: &'f Compared<'_>| {
        let (f, name) = (compared.file, compared.name.as_str());
        let version = match &f.source().version().tag {
            VersionTag::Inode { mtime_ns, .. } => format!("mtime {mtime_ns}"),
            VersionTag::ETag(etag) => format!("etag {etag}"),
            VersionTag::Unknown => {
                refusal.get_or_insert_with(|| format!("the version of {name} cannot be told"));
                String::new()
            }
        };
        let layout = compared.layout.as_ref();
        FileFacts {
            name,
            len: f.size(),
            version,
            layout,
        }
    };
    files.iter().map(describe).collect()
}

/// What this node gives the all-gather: `yes` or `no\t<why>`, then its files.
fn offer(refusal: Option<&str>, described: &[FileFacts<'_>]) -> Vec<u8> {
    let mut mine = match refusal {
        Some(why) => format!("no\t{why}\n").into_bytes(),
        None => b"yes\n".to_vec(),
    };
    mine.extend(cluster::describe(described));
    mine
}

/// The first node that cannot take part, and why, from what every node gave.
fn refused(all: &[Vec<u8>]) -> Option<String> {
    all.iter().enumerate().find_map(|(node, d)| {
        let text = String::from_utf8_lossy(d);
        let why = text.lines().next()?.strip_prefix("no\t")?;
        Some(format!("node {node}: {why}"))
    })
}

/// Broadcasts every piece from its owner into the same place of every other
/// node's buffer or copy, checked: the load's note of what this node did.
pub(crate) fn receive(
    exchange: &dyn Exchange,
    filling: &mut [Filling<'_>],
    copies: &[Copy<'_>],
    pieces: &[Piece],
    clock: Instant,
) -> Result<LoadNote> {
    let me = exchange.node();
    let (mut read, mut total) = (0u64, 0u64);
    let buffers = filling.len();
    for piece in pieces {
        total += piece.len;
        if piece.owner == me {
            read += piece.len;
        }
        if let Some((file, writer)) = piece.file.checked_sub(buffers).and_then(|k| copies.get(k)) {
            let path = file.path();
            writer
                .write_with(piece.dst, piece.len, |bytes| {
                    broadcast_checked(exchange, piece.owner, bytes)
                })
                .map_err(|e| Error::io(Operation::Exchange, path, Some(piece.src), e))?
                .map_err(|e| exchange_error(path, Some(piece.src), &e))?;
            continue;
        }
        let Some(file) = filling.get_mut(piece.file) else {
            continue;
        };
        let path = file.file().path().to_path_buf();
        let parts = file.parts();
        let Destination::Buffer { buffer, .. } = parts.destination else {
            continue;
        };
        let range = usize::try_from(piece.dst)
            .ok()
            .zip(usize::try_from(piece.len).ok())
            .and_then(|(start, len)| Some(start..start.checked_add(len)?));
        let Some(bytes) = range.and_then(|r| buffer.bytes_mut().get_mut(r)) else {
            let e = ExchangeError::new(
                ExchangeErrorKind::Usage,
                format!("a piece of {} bytes lies outside the buffer", piece.len),
            );
            return Err(exchange_error(&path, Some(piece.src), &e));
        };
        broadcast_checked(exchange, piece.owner, bytes)
            .map_err(|e| exchange_error(&path, Some(piece.src), &e))?;
        if piece.owner != me {
            parts.finished_at.fetch_max(since(clock), Ordering::Relaxed);
        }
    }
    Ok(LoadNote::ReadOncePerCluster {
        node: me,
        nodes: exchange.nodes(),
        read,
        total,
    })
}

/// Each buffered file's `bytes_read` in proportion to its pieces `me` read.
pub(crate) fn count_reads(files: &mut [crate::report::FileReport], pieces: &[Piece], me: usize) {
    for (i, file) in files.iter_mut().enumerate() {
        let (mut own, mut all) = (0u128, 0u128);
        for piece in pieces.iter().filter(|p| p.file == i) {
            all += u128::from(piece.len);
            if piece.owner == me {
                own += u128::from(piece.len);
            }
        }
        if let Some(read) = (u128::from(file.bytes_read) * own).checked_div(all) {
            file.bytes_read = u64::try_from(read).unwrap_or(file.bytes_read);
        }
    }
}

/// This node's pieces of the node copies in reads of `read_size`: (copy,
/// offset, length).
pub(crate) fn copy_reads(
    copies: &[Copy<'_>],
    pieces: &[Piece],
    Place { buffers, me }: Place,
    read_size: usize,
) -> Vec<(usize, u64, u64)> {
    // Pieces start at page offsets (an image split at 64 MiB): so do reads.
    let size = (read_size.max(1) as u64).next_multiple_of(crate::os::page_size());
    let mut reads: Vec<(usize, u64, u64)> = Vec::new();
    for piece in pieces.iter().filter(|p| p.owner == me) {
        let Some(k) = piece
            .file
            .checked_sub(buffers)
            .filter(|k| *k < copies.len())
        else {
            continue;
        };
        let mut at = 0;
        while at < piece.len {
            let len = size.min(piece.len - at);
            reads.push((k, piece.src + at, len));
            at += len;
        }
    }
    reads
}

/// Runs `reads` ([`copy_reads`]), `readers` at once: the bytes of tensor
/// data read, per copy.
pub(crate) fn read_copies(
    copies: &[Copy<'_>],
    reads: &[(usize, u64, u64)],
    readers: usize,
    meter: &Meter,
    opts: &crate::options::Options,
) -> Result<Vec<u64>> {
    let files: Vec<&OpenedFile> = copies.iter().map(|(f, _)| *f).collect();
    let _direct =
        crate::extras::direct_reads(files.iter().filter_map(|f| f.local()), opts.direct_io);
    let left = Left::new(copies.len(), reads.iter().map(|&(k, _, len)| (k, len)));
    let source = CopyPieces {
        copies,
        reads,
        cursor: AtomicUsize::new(0),
        meter,
        left: &left,
    };
    let concurrency = Concurrency::pinned(readers);
    let (result, _, _) = jobs::drain(
        &source,
        concurrency,
        reads.len(),
        "safeload-copy",
        &opts.cancel,
    );
    result?;
    // Tensor data only, as the report's `bytes_read` counts it.
    let mut read = vec![0u64; copies.len()];
    for &(k, offset, len) in reads {
        if let (Some(bytes), Some((file, _))) = (read.get_mut(k), copies.get(k)) {
            *bytes += crate::extras::tensor_part(file.header().data_start, offset, len);
        }
    }
    Ok(read)
}

/// This node's reads of the copies as a source of the read loop.
struct CopyPieces<'c, 'a> {
    copies: &'c [Copy<'a>],
    reads: &'c [(usize, u64, u64)],
    cursor: AtomicUsize,
    meter: &'c Meter,
    left: &'c Left,
}

impl JobSource for CopyPieces<'_, '_> {
    type Job = usize;
    type Error = Error;

    fn next(&self, _reader: usize) -> Option<(usize, usize)> {
        let i = self.cursor.fetch_add(1, Ordering::Relaxed);
        (i < self.reads.len()).then_some((i, i))
    }

    fn run(&self, i: usize) -> Result<u64> {
        let Some(&(k, offset, len)) = self.reads.get(i) else {
            return Ok(0);
        };
        let Some(&(file, writer)) = self.copies.get(k) else {
            return Ok(0);
        };
        writer
            .read_chunk(file.source(), offset, len)
            .map_err(|(at, e)| read_error(Operation::Read, file.source(), file.size(), at, e))?;
        self.left.landed(self.meter, k, len);
        Ok(len)
    }

    fn cancelled(&self, i: usize) -> Error {
        let (k, offset, _) = self.reads.get(i).copied().unwrap_or_default();
        let path = self.copies.get(k).map(|(f, _)| f.path());
        let stopped = crate::cancel::stopped();
        match path {
            Some(path) => Error::io(Operation::Read, path, Some(offset), stopped),
            None => Error::without_path(crate::error::ErrorKind::Cancelled),
        }
    }
}

/// A failed exchange as an I/O error of [`Operation::Exchange`] on `path`.
fn exchange_error(path: &std::path::Path, offset: Option<u64>, e: &ExchangeError) -> Error {
    let kind = match e.kind() {
        ExchangeErrorKind::TimedOut => io::ErrorKind::TimedOut,
        ExchangeErrorKind::Corrupt => io::ErrorKind::InvalidData,
        ExchangeErrorKind::Broken => io::ErrorKind::BrokenPipe,
        ExchangeErrorKind::Setup | ExchangeErrorKind::Usage => io::ErrorKind::Other,
    };
    Error::io(
        Operation::Exchange,
        path,
        offset,
        io::Error::new(kind, e.to_string()),
    )
}
