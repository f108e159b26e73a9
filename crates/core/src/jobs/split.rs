//! A file's reads, conversions and populates cut into jobs of about the measured size, each writing a disjoint part of its destination.

use std::fs::File;

use memmap2::Mmap;
use safetensors::Dtype;

use super::{ConvertSource, Job, Tagged};
use crate::format::header::Header;
use crate::source::Source;

/// Where a read's bytes come from, and how they are read (`Job::Read`).
#[derive(Clone, Copy)]
pub(crate) struct ReadFrom<'a> {
    pub source: &'a dyn Source,
    pub direct: bool,
    pub hashed: bool,
}

/// What a file converts: the tensors of `header` placed in its buffer at
/// `placements` (`None`: not converted), as `to`.
#[derive(Clone, Copy)]
pub(crate) struct Conversion<'p> {
    pub header: &'p Header,
    pub placements: &'p [Option<u64>],
    pub to: Dtype,
}

/// The `len` bytes at `dst` of a buffer cut front to back, `rest` its part
/// from `at` on; `None` past its end.
pub(crate) fn carve<'a>(
    rest: &mut &'a mut [u8],
    at: &mut u64,
    dst: u64,
    len: u64,
) -> Option<&'a mut [u8]> {
    let skip = usize::try_from(dst.checked_sub(*at)?).ok()?;
    let (_, tail) = std::mem::take(rest).split_at_mut_checked(skip)?;
    let (piece, tail) = tail.split_at_mut_checked(usize::try_from(len).ok()?)?;
    (*rest, *at) = (tail, dst + len);
    Some(piece)
}

/// Splits the read of `dst` from `from` at `offset` into jobs of at most
/// `chunk` bytes, of which `required` must be read.
pub(crate) fn split_read<'a>(
    out: &mut Vec<Tagged<'a>>,
    file_index: usize,
    from: ReadFrom<'a>,
    offset: u64,
    dst: &'a mut [u8],
    required: usize,
    chunk: usize,
) {
    let mut at = 0usize;
    for piece in dst.chunks_mut(chunk.max(1)) {
        let len = piece.len();
        out.push(Tagged {
            file_index,
            job: Job::Read {
                file: from.source,
                direct: from.direct,
                offset: offset + at as u64,
                dst: piece,
                required: required.saturating_sub(at).min(len),
                hashed: from.hashed,
            },
        });
        at += len;
    }
}

/// Where the tensors a file converts come from.
pub(crate) enum ConvertFrom<'a> {
    Map(&'a [u8]),
    File(&'a dyn Source),
}

/// Splits the conversion of a file's tensors into `dst` into jobs of about
/// `chunk` source bytes, whole elements each.
pub(crate) fn split_convert<'a>(
    out: &mut Vec<Tagged<'a>>,
    file_index: usize,
    Conversion {
        header,
        placements,
        to,
    }: Conversion<'_>,
    dst: &'a mut [u8],
    from: ConvertFrom<'a>,
    chunk: usize,
) {
    let to_size = to.bitsize() / 8;
    let mut rest = dst;
    let mut at = 0u64;
    for (tensor, placement) in header.tensors.iter().zip(placements) {
        let Some(place) = *placement else {
            continue;
        };
        let size = (tensor.dtype.bitsize() / 8).max(1);
        let elements = usize::try_from((tensor.end - tensor.start) / size as u64).unwrap_or(0);
        let skip = usize::try_from(place.saturating_sub(at)).unwrap_or(usize::MAX);
        let Some((_, tail)) = rest.split_at_mut_checked(skip) else {
            return;
        };
        let Some((target, tail)) = tail.split_at_mut_checked(elements * to_size) else {
            return;
        };
        rest = tail;
        at = place + (elements * to_size) as u64;
        let per_job = (chunk / size).max(1);
        let mut src = header.data_start + tensor.start;
        // No piece where `to` is packed (`to_size` 0): `target` is empty.
        for piece in target.chunks_mut((per_job * to_size).max(1)) {
            let len = piece.len() / to_size * size;
            let source = match &from {
                ConvertFrom::Map(bytes) => {
                    let start = usize::try_from(src).unwrap_or(usize::MAX);
                    let Some(s) = start.checked_add(len).and_then(|end| bytes.get(start..end))
                    else {
                        return;
                    };
                    ConvertSource::Mapped(s)
                }
                ConvertFrom::File(file) => ConvertSource::File {
                    file: *file,
                    offset: src,
                    len,
                },
            };
            out.push(Tagged {
                file_index,
                job: Job::Convert {
                    source,
                    from: tensor.dtype,
                    to,
                    dst: piece,
                },
            });
            src += len as u64;
        }
    }
}

/// A file's map and the file (`Job::Populate`).
#[derive(Clone, Copy)]
pub(crate) struct MappedFile<'a> {
    pub map: &'a Mmap,
    pub file: &'a File,
}

/// Splits the population of a whole map into jobs of at most `chunk` bytes.
pub(crate) fn split_populate<'a>(
    out: &mut Vec<Tagged<'a>>,
    file_index: usize,
    MappedFile { map, file }: MappedFile<'a>,
    chunk: usize,
) {
    let chunk = chunk.max(1);
    for offset in (0..map.len()).step_by(chunk) {
        let len = chunk.min(map.len() - offset);
        out.push(Tagged {
            file_index,
            job: Job::Populate {
                map,
                file,
                offset,
                len,
            },
        });
    }
}
