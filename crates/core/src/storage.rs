//! The bytes of one file: a read-only memory map, or an aligned buffer laid out so every tensor is aligned for its dtype.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapMut, MmapOptions};

use crate::format::header::{Header, dtype_align};
use crate::os::DIRECT_ALIGN;

/// The bytes of one file, shared by its tensors through an `Arc`: a read-only [`Mmap`], the
/// file's own or an anonymous one filled and sealed (`Buffer::seal`), whose padding to whole
/// huge pages never leaves this module.
pub struct Storage {
    map: Mmap,
    /// The bytes of the map that are data.
    len: usize,
    path: PathBuf,
    /// Whether the map is a file's, not an owned buffer's.
    of_file: bool,
    /// Dropped after the map (fields drop in order): tells a stream its lent bytes are unmapped.
    _on_drop: Option<Box<dyn Send + Sync>>,
}

impl Storage {
    /// A whole file's map (or a node copy's); `guard`, where given, is dropped with the map.
    pub(crate) fn of_file(
        map: Mmap,
        path: PathBuf,
        guard: Option<Box<dyn Send + Sync>>,
    ) -> Storage {
        Storage {
            len: map.len(),
            map,
            path,
            of_file: true,
            _on_drop: guard,
        }
    }

    /// A file's map, to populate or hash it; `None` for an owned buffer.
    pub(crate) fn file_map(&self) -> Option<&Mmap> {
        self.of_file.then_some(&self.map)
    }

    /// The data: exactly the bytes the storage holds, never a buffer's padding.
    pub fn bytes(&self) -> &[u8] {
        self.map.get(..self.len).unwrap_or_default()
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Maps a whole file read-only, under the mapped contract
/// ([`Strategy::Mmap`](crate::report::Strategy::Mmap)).
pub fn map_file(file: &File) -> io::Result<Mmap> {
    // SAFETY: the map is read-only and private to the `Storage` that owns it; a later
    // truncation by someone else is the documented contract of mapped loading.
    unsafe { MmapOptions::new().map(file) }
}

/// An owned buffer being filled: an anonymous, zero-filled, page-aligned allocation of which
/// exactly `len` bytes are handed out, then sealed into a [`Storage`].
///
/// One of 2 MiB or more is mapped in whole huge pages, which Linux places on a huge page
/// boundary (6.7; multiples of one since 6.12), so each can be one (`dest/pages.rs` decides).
pub(crate) struct Buffer {
    map: MmapMut,
    len: usize,
}

impl Buffer {
    /// A zero-filled buffer of `len` bytes.
    pub(crate) fn new(len: usize) -> io::Result<Buffer> {
        const HUGE: usize = 2 << 20;
        let mapped = if len >= HUGE {
            len.checked_next_multiple_of(HUGE)
                .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?
        } else {
            len
        };
        Ok(Buffer {
            map: MmapMut::map_anon(mapped)?,
            len,
        })
    }

    /// The buffer's bytes, exactly `len` of them.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.map.get_mut(..self.len).unwrap_or_default()
    }

    /// The bytes made read-only, for tensors to view; `guard`, if any, is dropped with them.
    pub(crate) fn seal(
        self,
        path: PathBuf,
        guard: Option<Box<dyn Send + Sync>>,
    ) -> io::Result<Storage> {
        let map = self.map.make_read_only()?;
        Ok(Storage {
            map,
            len: self.len,
            path,
            of_file: false,
            _on_drop: guard,
        })
    }
}

/// Where each selected tensor lands in a buffer, and which runs of the file fill it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BufferLayout {
    /// For each tensor of the header: its offset in the buffer, or `None` where left out.
    pub placements: Vec<Option<u64>>,
    /// Contiguous copies from the file into the buffer, in increasing order of both offsets.
    pub segments: Vec<Segment>,
    /// The buffer's length.
    pub len: u64,
    /// Whether the buffer is an image of the file in whole 4 KiB blocks, as direct I/O needs.
    pub image: bool,
}

/// One contiguous run: `len` bytes at file offset `src` go to `dst` in the buffer; the first
/// `required` must exist (the rest round a direct read up to a whole block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub src: u64,
    pub dst: u64,
    pub len: u64,
    pub required: u64,
}

impl BufferLayout {
    /// The layout for a file: an image of the file when every tensor is selected and aligned in
    /// it; otherwise the selected tensors packed with alignment padding.
    pub fn for_file(header: &Header, selected: &[bool]) -> BufferLayout {
        let all = selected.iter().all(|&s| s);
        let aligned = header
            .tensors
            .iter()
            .all(|t| (header.data_start + t.start) % dtype_align(t.dtype) == 0);
        if all && aligned && !header.tensors.is_empty() {
            BufferLayout::image(header)
        } else {
            BufferLayout::packed(header, |i| selected.get(i).copied().unwrap_or(false))
        }
    }

    /// The file from the 4 KiB boundary at or before its data section, in whole blocks.
    pub(crate) fn image(header: &Header) -> BufferLayout {
        let base = header.data_start - header.data_start % DIRECT_ALIGN;
        let required = header.file_len() - base;
        let len = required.next_multiple_of(DIRECT_ALIGN);
        BufferLayout {
            placements: header
                .tensors
                .iter()
                .map(|t| Some(header.data_start - base + t.start))
                .collect(),
            segments: vec![Segment {
                src: base,
                dst: 0,
                len,
                required,
            }],
            len,
            image: true,
        }
    }

    /// Lays out the selected tensors back to back, each aligned for its dtype; runs adjacent in
    /// the file and the buffer read as one segment.
    pub(crate) fn packed(header: &Header, selected: impl Fn(usize) -> bool) -> BufferLayout {
        let mut layout = BufferLayout::default();
        let mut cursor = 0u64;
        let mut open: Option<Segment> = None;
        for (i, tensor) in header.tensors.iter().enumerate() {
            if !selected(i) {
                layout.placements.push(None);
                continue;
            }
            let align = dtype_align(tensor.dtype);
            let len = tensor.end - tensor.start;
            let src = header.data_start + tensor.start;
            let continues = open.is_some_and(|s| s.src + s.len == src) && cursor % align == 0;
            if !continues {
                layout.segments.extend(open.take().filter(|s| s.len > 0));
                cursor = cursor.next_multiple_of(align);
                open = Some(Segment {
                    src,
                    dst: cursor,
                    len: 0,
                    required: 0,
                });
            }
            if let Some(segment) = open.as_mut() {
                segment.len += len;
                segment.required += len;
            }
            layout.placements.push(Some(cursor));
            cursor += len;
        }
        layout.segments.extend(open.filter(|s| s.len > 0));
        layout.len = cursor;
        layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header::TensorEntry;
    use safetensors::Dtype;

    fn header(data_start: u64, tensors: &[(Dtype, u64, u64)]) -> Header {
        Header {
            data_start,
            tensors: tensors
                .iter()
                .map(|&(dtype, start, end)| TensorEntry {
                    name: format!("t{start}"),
                    dtype,
                    shape: vec![],
                    start,
                    end,
                })
                .collect(),
            metadata: None,
        }
    }

    fn seg(src: u64, dst: u64, len: u64) -> Segment {
        Segment {
            src,
            dst,
            len,
            required: len,
        }
    }

    #[test]
    fn aligned_file_is_an_image_in_whole_blocks() {
        let h = header(
            4104,
            &[
                (Dtype::F32, 0, 16),
                (Dtype::F16, 16, 20),
                (Dtype::U8, 20, 23),
            ],
        );
        let layout = BufferLayout::for_file(&h, &[true; 3]);
        assert!(layout.image);
        // From the 4 KiB boundary before the data (4096) to the end (4127), rounded up.
        assert_eq!(
            layout.segments,
            [Segment {
                src: 4096,
                dst: 0,
                len: 4096,
                required: 31
            }]
        );
        assert_eq!(layout.placements, [Some(8), Some(24), Some(28)]);
        assert_eq!(layout.len, 4096);
    }

    #[test]
    fn packed_file_gets_padding() {
        // A U8 of 3 bytes then two F32s: packed, the first F32 sits at offset 3.
        let h = header(
            16,
            &[(Dtype::U8, 0, 3), (Dtype::F32, 3, 11), (Dtype::F32, 11, 15)],
        );
        let layout = BufferLayout::for_file(&h, &[true; 3]);
        assert!(!layout.image);
        assert_eq!(layout.placements, [Some(0), Some(4), Some(12)]);
        assert_eq!(layout.segments, [seg(16, 0, 3), seg(19, 4, 12)]);
        assert_eq!(layout.len, 16);
    }

    #[test]
    fn filter_reads_only_selected() {
        let h = header(
            8,
            &[
                (Dtype::F32, 0, 16),
                (Dtype::F32, 16, 32),
                (Dtype::F32, 32, 48),
            ],
        );
        let layout = BufferLayout::for_file(&h, &[true, false, true]);
        assert_eq!(layout.placements, [Some(0), None, Some(16)]);
        assert_eq!(layout.segments, [seg(8, 0, 16), seg(40, 16, 16)]);
    }
}
