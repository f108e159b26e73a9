//! The layout of a load to a device, pure: a file's slab (its tensors, or their parts, at aligned offsets in file order), cut into chunks of at most one staging buffer, each cut into pieces the readers fill (reads of at most a piece's size, close runs merged, conversions in whole elements).

use std::ops::Range;

use safeload_core::dest::device::Placed as Wanted;
use safetensors::Dtype;

/// A tensor's bytes on the device.
pub(crate) fn out_len(w: &Wanted) -> usize {
    let (src, out) = grain(w.from, w.to);
    w.runs.iter().map(|r| r.1).sum::<usize>() / src * out
}

/// The bytes of one element of `from` read and of `to` written, where a
/// run may be cut: a byte where nothing is converted (so packed dtypes are
/// copied as bytes), a whole element where it is.
fn grain(from: Dtype, to: Dtype) -> (usize, usize) {
    if from == to {
        return (1, 1);
    }
    ((from.bitsize() / 8).max(1), (to.bitsize() / 8).max(1))
}

/// A file's slab: its length, and where each wanted tensor starts in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slab {
    pub len: usize,
    pub offsets: Vec<usize>,
}

/// The slab of `wanted`, each at the next multiple of `align` (a power of
/// two) after the one before; `None` where its length overflows.
pub(crate) fn slab(wanted: &[Wanted], align: usize) -> Option<Slab> {
    let mut offsets = Vec::with_capacity(wanted.len());
    let mut end = 0usize;
    for w in wanted {
        let at = end.checked_next_multiple_of(align.max(1))?;
        offsets.push(at);
        end = at.checked_add(out_len(w))?;
    }
    Some(Slab { len: end, offsets })
}

/// `len` bytes of the file at `src`, converted from `from` to `to` (or
/// copied), landing at `dst` of the chunk's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub src: u64,
    pub len: usize,
    pub dst: usize,
    pub from: Dtype,
    pub to: Dtype,
}

impl Segment {
    /// Its bytes in the buffer.
    pub(crate) fn out_len(&self) -> usize {
        let (src, out) = grain(self.from, self.to);
        self.len / src * out
    }

    /// Whether it is copied as it is.
    pub(crate) fn raw(&self) -> bool {
        self.from == self.to
    }
}

/// What one reader does at once: read `read` of the file (or copy it from
/// its map) and place its segments, all within `dst` of the chunk's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub dst: Range<usize>,
    pub read: Range<u64>,
    pub segments: Vec<Segment>,
}

impl Piece {
    /// Whether its read lands as it is, in one run of the buffer (its
    /// segments copied, each following the one before in the file and in
    /// the buffer alike): then it is read straight into its place, with no
    /// scratch buffer.
    pub(crate) fn straight(&self) -> bool {
        let mut next = (self.read.start, self.dst.start);
        for s in &self.segments {
            if !s.raw() || (s.src, s.dst) != next {
                return false;
            }
            next = (s.src + s.len as u64, s.dst + s.len);
        }
        next == (self.read.end, self.dst.end)
    }
}

/// One copy to the device: `slab` of file `file`'s slab, filled in its
/// pieces (their `dst` ranges increasing and disjoint, within
/// `0..slab.len()`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub file: usize,
    pub slab: Range<usize>,
    pub pieces: Vec<Piece>,
}

/// How the chunks are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sizes {
    /// The most bytes of one chunk (a staging buffer).
    pub chunk: usize,
    /// The most bytes one piece reads straight into its place.
    pub piece: usize,
    /// The most bytes one piece reads otherwise (through a reader's scratch
    /// buffer: merged runs with gaps, conversions): what bounds each
    /// reader's scratch memory.
    pub scratch: usize,
    /// Runs of one piece less than this far apart are read as one.
    pub merge_gap: usize,
}

/// The chunks of file `file`, whose `wanted` tensors lie in `slab`: each
/// chunk from its first byte on (padding before it left out), at most
/// `sizes.chunk` long, in slab order; a tensor may span several, and a
/// chunk hold parts of several.
pub(crate) fn chunks(file: usize, wanted: &[Wanted], slab: &Slab, sizes: Sizes) -> Vec<Chunk> {
    let chunk = sizes.chunk.max(8);
    let mut out = Vec::new();
    // The chunk being filled: where it starts in the slab, its segments.
    let mut open: Option<(usize, Vec<Segment>)> = None;
    for (w, &offset) in wanted.iter().zip(&slab.offsets) {
        let (src_grain, out_grain) = grain(w.from, w.to);
        let mut dst = offset;
        for &(mut src, mut left) in &w.runs {
            while left >= src_grain {
                let (start, segments) = open.get_or_insert_with(|| (dst, Vec::new()));
                let room = (*start + chunk).saturating_sub(dst);
                let units = (left / src_grain).min(room / out_grain);
                if units == 0 {
                    // This chunk is full: the next starts here.
                    out.extend(open.take().map(|(s, segs)| close(file, s, segs, sizes)));
                    continue;
                }
                let (read, written) = (units * src_grain, units * out_grain);
                segments.push(Segment {
                    src,
                    len: read,
                    dst,
                    from: w.from,
                    to: w.to,
                });
                src += read as u64;
                left -= read;
                dst += written;
            }
        }
    }
    out.extend(open.map(|(s, segs)| close(file, s, segs, sizes)));
    out
}

/// The chunk starting at `start` of the slab holding `segments` (slab
/// offsets), cut into pieces.
fn close(file: usize, start: usize, segments: Vec<Segment>, sizes: Sizes) -> Chunk {
    let end = segments.last().map_or(start, |s| s.dst + s.out_len());
    let relative = segments.into_iter().map(|s| Segment {
        dst: s.dst - start,
        ..s
    });
    Chunk {
        file,
        slab: start..end,
        pieces: pieces(relative, sizes),
    }
}

/// `segments` (in buffer order) as pieces: each cut to at most
/// `sizes.piece` bytes read (a conversion to `sizes.scratch`, in whole
/// elements), then neighbours merged where the second starts at or after
/// the first's read, less than `sizes.merge_gap` past it, and the read stays
/// within `sizes.piece` where the merged piece is [`straight`](Piece::straight),
/// else within `sizes.scratch`.
fn pieces(segments: impl Iterator<Item = Segment>, sizes: Sizes) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    // Whether the last piece is straight so far (kept, not asked again: a
    // piece may merge thousands of rows).
    let mut straight = false;
    for whole in segments {
        let (src_grain, _) = grain(whole.from, whole.to);
        let most = match whole.raw() {
            true => sizes.piece,
            false => sizes.scratch,
        };
        let step = (most.max(1) / src_grain).max(1) * src_grain;
        let mut at = 0;
        while at < whole.len {
            let len = step.min(whole.len - at);
            let s = Segment {
                src: whole.src + at as u64,
                len,
                dst: whole.dst + Segment { len: at, ..whole }.out_len(),
                ..whole
            };
            at += len;
            let end = s.src + s.len as u64;
            // Merged into the last piece where close enough after it, and
            // where its read stays within the limit of what it then is.
            let follows = |p: &Piece| (s.src, s.dst) == (p.read.end, p.dst.end);
            let still = |p: &Piece| straight && s.raw() && follows(p);
            let merges = out.last().is_some_and(|p| {
                let close = s.src >= p.read.end && s.src - p.read.end < sizes.merge_gap as u64;
                let limit = if still(p) { sizes.piece } else { sizes.scratch };
                close && end - p.read.start <= limit.max(1) as u64
            });
            match out.last_mut() {
                Some(p) if merges => {
                    straight = still(p);
                    p.read.end = end;
                    p.dst.end = s.dst + s.out_len();
                    p.segments.push(s);
                }
                _ => {
                    straight = s.raw();
                    out.push(Piece {
                        dst: s.dst..s.dst + s.out_len(),
                        read: s.src..end,
                        segments: vec![s],
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZES: Sizes = Sizes {
        chunk: 64,
        piece: 16,
        scratch: 14,
        merge_gap: 8,
    };

    fn raw(runs: &[(u64, usize)]) -> Wanted {
        typed(Dtype::U8, Dtype::U8, runs)
    }

    fn typed(from: Dtype, to: Dtype, runs: &[(u64, usize)]) -> Wanted {
        Wanted {
            name: "t".into(),
            shape: vec![],
            from,
            to,
            runs: runs.to_vec(),
        }
    }

    /// The naive twin: each tensor's bytes, converted where asked, one after
    /// another at their slab offsets (`0xee` for padding).
    fn naive(file: &[u8], wanted: &[Wanted], slab: &Slab) -> Vec<u8> {
        let mut out = vec![0xee; slab.len];
        for (w, &offset) in wanted.iter().zip(&slab.offsets) {
            let src: Vec<u8> = w
                .runs
                .iter()
                .flat_map(|&(at, len)| file[at as usize..at as usize + len].to_vec())
                .collect();
            let dst = &mut out[offset..offset + out_len(w)];
            safeload_core::convert::convert(w.from, w.to, &src, dst).unwrap();
        }
        out
    }

    /// The chunks carried out: each piece from the file into its chunk's
    /// buffer, each buffer copied to its place in the slab.
    fn carried_out(file: &[u8], chunks: &[Chunk], slab: &Slab) -> Vec<u8> {
        let mut out = vec![0xee; slab.len];
        for chunk in chunks {
            assert!(chunk.slab.len() <= SIZES.chunk, "{chunk:?}");
            let mut buffer = vec![0xee; chunk.slab.len()];
            let mut last = 0;
            for piece in &chunk.pieces {
                assert!(piece.dst.start >= last, "pieces overlap: {chunk:?}");
                last = piece.dst.end;
                let read = piece.read.end - piece.read.start;
                assert!(read <= SIZES.piece as u64, "{piece:?}");
                if !piece.straight() {
                    assert!(read <= SIZES.scratch as u64, "{piece:?}");
                }
                let read = &file[piece.read.start as usize..piece.read.end as usize];
                for s in &piece.segments {
                    assert!(s.dst >= piece.dst.start && s.dst + s.out_len() <= piece.dst.end);
                    let from = (s.src - piece.read.start) as usize;
                    let dst = &mut buffer[s.dst..s.dst + s.out_len()];
                    let src = &read[from..from + s.len];
                    // Copies are cut anywhere, conversions in whole elements.
                    match s.raw() {
                        true => dst.copy_from_slice(src),
                        false => {
                            _ = safeload_core::convert::convert(s.from, s.to, src, dst).unwrap()
                        }
                    }
                }
            }
            assert!(last <= chunk.slab.len());
            // Padding inside a chunk is copied too: the slab's, as the
            // buffer left it.
            for (i, b) in buffer.iter().enumerate() {
                if *b != 0xee {
                    out[chunk.slab.start + i] = *b;
                }
            }
        }
        out
    }

    fn check(wanted: &[Wanted], align: usize) -> Vec<Chunk> {
        let file: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
        let slab = slab(wanted, align).unwrap();
        for &o in &slab.offsets {
            assert_eq!(o % align, 0);
        }
        let chunks = chunks(3, wanted, &slab, SIZES);
        assert!(chunks.iter().all(|c| c.file == 3));
        assert!(chunks.windows(2).all(|w| w[0].slab.end <= w[1].slab.start));
        assert_eq!(
            carried_out(&file, &chunks, &slab),
            naive(&file, wanted, &slab)
        );
        chunks
    }

    #[test]
    fn tensors_are_aligned_in_file_order_and_empty_ones_take_no_room() {
        let wanted = [
            raw(&[(0, 10)]),
            raw(&[]),
            raw(&[(10, 1)]),
            raw(&[(11, 256)]),
        ];
        let s = slab(&wanted, 16).unwrap();
        assert_eq!(s.offsets, [0, 16, 16, 32]);
        assert_eq!(s.len, 288);
        check(&wanted, 16);
        assert!(slab(&[raw(&[(0, usize::MAX)]), raw(&[(0, 1)])], 16).is_none());
    }

    #[test]
    fn a_chunk_holds_several_tensors_and_a_large_tensor_spans_chunks() {
        let chunks = check(&[raw(&[(0, 5)]), raw(&[(5, 7)]), raw(&[(12, 200)])], 8);
        // 5 + pad + 7 + pad + 200 = 216 bytes: four chunks of at most 64.
        assert_eq!(
            chunks.iter().map(|c| c.slab.clone()).collect::<Vec<_>>(),
            [0..64, 64..128, 128..192, 192..216]
        );
        assert_eq!(chunks[0].pieces.len(), 4, "{:?}", chunks[0]);
        // Near runs are merged into one read: 5 and 7 bytes apart by 0.
        assert_eq!(chunks[0].pieces[0].read, 0..12);
        assert!(chunks[1].pieces.iter().all(Piece::straight));
    }

    #[test]
    fn tensors_next_to_each_other_in_the_file_and_the_slab_are_one_straight_read() {
        // At offsets already aligned: the slab is the file's layout.
        let wanted = [
            raw(&[(0, 8)]),
            raw(&[(8, 4)]),
            raw(&[(12, 4)]),
            raw(&[(16, 3)]),
        ];
        let chunks = check(&wanted, 4);
        let pieces = &chunks[0].pieces;
        assert_eq!(pieces[0].read, 0..16);
        assert!(pieces[0].straight(), "{pieces:?}");
        // A padded one is merged too, through the scratch buffer, within its limit.
        let chunks = check(&[raw(&[(0, 5)]), raw(&[(5, 5)])], 8);
        assert_eq!(chunks[0].pieces.len(), 1);
        assert!(!chunks[0].pieces[0].straight());
        assert!(
            !Piece {
                dst: 0..4,
                read: 0..4,
                segments: vec![Segment {
                    src: 0,
                    len: 4,
                    dst: 0,
                    from: Dtype::F32,
                    to: Dtype::BF16
                }]
            }
            .straight()
        );
    }

    #[test]
    fn strided_runs_are_merged_within_the_gap_and_the_piece() {
        // A column shard: 4-byte runs 10 bytes apart.
        let runs: Vec<(u64, usize)> = (0..12).map(|i| (100 + i * 10, 4)).collect();
        let chunks = check(&[raw(&runs)], 8);
        let reads: Vec<_> = chunks[0].pieces.iter().map(|p| p.read.clone()).collect();
        assert_eq!(
            reads,
            [100..114, 120..134, 140..154, 160..174, 180..194, 200..214]
        );
        // Far apart: each alone.
        let runs: Vec<(u64, usize)> = (0..4).map(|i| (i * 100, 3)).collect();
        assert_eq!(check(&[raw(&runs)], 8)[0].pieces.len(), 4);
    }

    #[test]
    fn conversions_are_cut_in_whole_elements() {
        use Dtype::*;
        let wanted = [
            typed(F32, BF16, &[(0, 4 * 41)]),
            typed(BF16, F32, &[(164, 2 * 37)]),
            typed(F16, F16, &[(238, 10)]),
            typed(F64, F16, &[(256, 8 * 3), (400, 8 * 2)]),
        ];
        let chunks = check(&wanted, 4);
        for piece in chunks.iter().flat_map(|c| &c.pieces) {
            for s in &piece.segments {
                let (a, b) = grain(s.from, s.to);
                assert_eq!((s.len % a, s.dst % b), (0, 0), "{s:?}");
            }
        }
    }

    #[test]
    fn random_layouts_match_the_naive_twin() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n.max(1)
        };
        let dtypes = [Dtype::U8, Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::I64];
        for _ in 0..300 {
            let mut wanted = Vec::new();
            for _ in 0..1 + next(5) {
                let from = dtypes[next(5) as usize];
                let to = match (from, next(3)) {
                    (Dtype::F32 | Dtype::BF16 | Dtype::F16, 0) => Dtype::BF16,
                    (Dtype::F32 | Dtype::BF16 | Dtype::F16, 1) => Dtype::F32,
                    _ => from,
                };
                let size = (from.bitsize() / 8) as u64;
                let mut runs = Vec::new();
                let mut at = next(64) * size;
                for _ in 0..1 + next(6) {
                    let len = next(40) * size;
                    runs.push((at, len as usize));
                    at += len + next(20) * size;
                }
                if at < 4000 {
                    wanted.push(typed(from, to, &runs));
                }
            }
            check(&wanted, [1, 2, 8, 64][next(4) as usize]);
        }
    }
}
