//! The split of a load's reads between the nodes of a cluster (issue 27), as pure functions: which node reads which piece of each buffered file, and the description of the files the nodes compare before moving a byte.
//!
//! Every node plans the same load of the same files and so computes the
//! same pieces, in the same order; the pieces are cut from each file's
//! buffer layout at a fixed size, whatever size the reads themselves take,
//! and given to the nodes in consecutive runs of about equal bytes (the
//! local ranks' split of a prefetch is the same rule).

use crate::storage::BufferLayout;

/// The bytes of one piece that moves between nodes as one broadcast.
///
/// NOTE: 64 MiB, the largest ranged request of a remote load: large enough
/// that a collective's fixed cost vanishes (a broadcast of 64 MiB over a
/// fabric of 10 GB/s takes ~7 ms), small enough that 8 nodes of a 2 GiB
/// checkpoint still get ~4 pieces each to balance.
pub(crate) const PIECE: u64 = 64 << 20;

/// One piece of a file's buffer: where it lies (offset into the buffer, its
/// bytes) and at which file offset its bytes start; and the node that reads
/// it from the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    /// The file's index in the load.
    pub file: usize,
    /// Where it starts in the file's buffer.
    pub dst: u64,
    /// Where its bytes start in the file.
    pub src: u64,
    pub len: u64,
    /// The bytes of it that must come from the file (the rest rounds a
    /// direct read up past the end of the file, and may stay unread).
    pub required: u64,
    /// The node that reads it.
    pub owner: usize,
}

/// The pieces of `files` (each buffered file's layout, by its index in the
/// load; `None` for a file read otherwise), cut at `size` bytes within each
/// segment, in file order, each given to one of `nodes` nodes: consecutive
/// runs of about equal bytes, node 0 first.
pub(crate) fn split(files: &[Option<&BufferLayout>], size: u64, nodes: usize) -> Vec<Piece> {
    let size = size.max(1);
    let nodes = nodes.max(1);
    let mut pieces = Vec::new();
    for (file, layout) in files.iter().enumerate() {
        let Some(layout) = layout else {
            continue;
        };
        for segment in &layout.segments {
            let mut at = 0u64;
            while at < segment.len {
                let len = size.min(segment.len - at);
                pieces.push(Piece {
                    file,
                    dst: segment.dst + at,
                    src: segment.src + at,
                    len,
                    required: segment.required.saturating_sub(at).min(len),
                    owner: 0,
                });
                at += len;
            }
        }
    }
    let total: u64 = pieces.iter().map(|p| p.len).sum();
    let mut before = 0u64;
    for piece in &mut pieces {
        // The node whose share holds the piece's middle byte.
        let middle = u128::from(before) + u128::from(piece.len / 2);
        let owner = middle * nodes as u128 / u128::from(total.max(1));
        piece.owner = usize::try_from(owner).unwrap_or(nodes - 1).min(nodes - 1);
        before += piece.len;
    }
    pieces
}

/// What a node says of one file it is about to load, for the nodes to
/// compare: its name in the checkpoint, its length, its version as the node
/// sees it where it is the same on every node (a remote object's ETag, a
/// file's modification time; never an inode number, which differs per
/// node's mount), and the plan of its buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileFacts<'a> {
    pub name: &'a str,
    pub len: u64,
    pub version: String,
    pub layout: Option<&'a BufferLayout>,
}

/// The bytes a node contributes to the comparison: one line per file.
pub(crate) fn describe(files: &[FileFacts<'_>]) -> Vec<u8> {
    let mut text = String::new();
    for f in files {
        let plan = f.layout.map_or(0, layout_digest);
        // Names come from the index, which refuses control characters in
        // shard names; a tab or newline in one cannot break the lines.
        text.push_str(&format!(
            "{}\t{}\t{}\t{plan:016x}\n",
            f.name.escape_default(),
            f.len,
            f.version.escape_default()
        ));
    }
    text.into_bytes()
}

/// Compares every node's description (in node order): `Ok` where all are
/// equal, else why not, naming the first file and node that differ from
/// node 0.
pub(crate) fn agree(descriptions: &[Vec<u8>]) -> Result<(), String> {
    let Some(first) = descriptions.first() else {
        return Ok(());
    };
    let ours = String::from_utf8_lossy(first);
    for (node, other) in descriptions.iter().enumerate().skip(1) {
        if other == first {
            continue;
        }
        let theirs = String::from_utf8_lossy(other);
        let mut a = ours.lines();
        let mut b = theirs.lines();
        loop {
            match (a.next(), b.next()) {
                (Some(x), Some(y)) if x == y => continue,
                (Some(x), Some(y)) => {
                    let (fx, fy): (Vec<&str>, Vec<&str>) =
                        (x.split('\t').collect(), y.split('\t').collect());
                    let what = if fx.first() != fy.first() {
                        "another file"
                    } else if fx.get(1) != fy.get(1) {
                        "another length"
                    } else if fx.get(2) != fy.get(2) {
                        "another version"
                    } else {
                        "another plan (filter, dtype or layout)"
                    };
                    let name = fx.first().copied().unwrap_or_default();
                    return Err(format!(
                        "node {node} sees {what} of {name} than node 0 ({y:?} against {x:?})"
                    ));
                }
                _ => {
                    let (ours, theirs) = (ours.lines().count(), theirs.lines().count());
                    return Err(format!(
                        "node {node} loads {theirs} files, node 0 loads {ours}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A digest of a buffer's plan (FNV-1a over its segments and length).
fn layout_digest(layout: &BufferLayout) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut eat = |v: u64| {
        for b in v.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(layout.len);
    for s in &layout.segments {
        for v in [s.src, s.dst, s.len, s.required] {
            eat(v);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::Segment;

    fn layout(segments: &[(u64, u64, u64)]) -> BufferLayout {
        BufferLayout {
            placements: Vec::new(),
            segments: segments
                .iter()
                .map(|&(src, dst, len)| Segment {
                    src,
                    dst,
                    len,
                    required: len,
                })
                .collect(),
            len: segments.iter().map(|s| s.1 + s.2).max().unwrap_or(0),
            image: false,
        }
    }

    #[test]
    fn pieces_tile_every_segment_and_nodes_get_equal_runs() {
        let a = layout(&[(4096, 0, 300)]);
        let b = layout(&[(100, 0, 50), (500, 64, 250)]);
        let files = [Some(&a), None, Some(&b)];
        let pieces = split(&files, 100, 3);
        // Every byte of every segment once, in order.
        let lens: Vec<(usize, u64, u64, u64)> = pieces
            .iter()
            .map(|p| (p.file, p.dst, p.src, p.len))
            .collect();
        assert_eq!(
            lens,
            [
                (0, 0, 4096, 100),
                (0, 100, 4196, 100),
                (0, 200, 4296, 100),
                (2, 0, 100, 50),
                (2, 64, 500, 100),
                (2, 164, 600, 100),
                (2, 264, 700, 50),
            ]
        );
        // 600 bytes over 3 nodes: about 200 each, in consecutive runs.
        let owners: Vec<usize> = pieces.iter().map(|p| p.owner).collect();
        assert_eq!(owners, [0, 0, 1, 1, 2, 2, 2]);
        let per_node: Vec<u64> = (0..3)
            .map(|n| pieces.iter().filter(|p| p.owner == n).map(|p| p.len).sum())
            .collect();
        assert_eq!(per_node, [200, 150, 250]);
        // One node reads everything; more nodes than pieces leaves some idle.
        assert!(split(&files, 100, 1).iter().all(|p| p.owner == 0));
        let many = split(&files, 1000, 16);
        assert!(many.iter().all(|p| p.owner < 16));
        assert!(split(&[None, None], 100, 3).is_empty());
    }

    #[test]
    fn nodes_agree_only_on_the_same_files_versions_and_plans() {
        let a = layout(&[(4096, 0, 300)]);
        let b = layout(&[(4096, 0, 200)]);
        let facts = |name, len, version: &str, layout| FileFacts {
            name,
            len,
            version: version.to_owned(),
            layout,
        };
        let base = describe(&[facts("m-1.safetensors", 4396, "mtime 5", Some(&a))]);
        assert!(agree(&[base.clone(), base.clone(), base.clone()]).is_ok());
        assert!(agree(&[]).is_ok());
        let version = describe(&[facts("m-1.safetensors", 4396, "mtime 6", Some(&a))]);
        let e = agree(&[base.clone(), base.clone(), version]).unwrap_err();
        assert!(
            e.starts_with("node 2 sees another version of m-1.safetensors"),
            "{e}"
        );
        let plan = describe(&[facts("m-1.safetensors", 4396, "mtime 5", Some(&b))]);
        let e = agree(&[base.clone(), plan]).unwrap_err();
        assert!(e.contains("another plan"), "{e}");
        let more = describe(&[
            facts("m-1.safetensors", 4396, "mtime 5", Some(&a)),
            facts("m-2.safetensors", 10, "mtime 5", None),
        ]);
        let e = agree(&[base, more]).unwrap_err();
        assert!(e.contains("loads 2 files, node 0 loads 1"), "{e}");
    }
}
