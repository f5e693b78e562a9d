//! Where each routed expert lives in the checkpoint and where it lands in a cache slot: the
//! six tensors of an expert (w1, w3, w2, each FP4 weights + UE8M0 scales), the reads that
//! fill a slot (adjacent tensors coalesced, every read landing at an ALIGN-aligned place so
//! that direct I/O can target it), and the slot size. Pure functions of the tensor table.

use super::region::ALIGN;
use crate::checkpoint::{expected, Checkpoint};
use crate::config::ModelConfig;
use crate::error::Result;

/// Slot-part indices of the three scale tensors (`checkpoint::expected::EXPERT_PARTS` order).
pub const SCALE_PARTS: [usize; 3] = [1, 3, 5];

use crate::checkpoint::expected::block_expert_part_name;
/// The checkpoint name of part `k` of expert `e` of layer `l`.
pub use crate::checkpoint::expected::expert_part_name as part_name;
use std::sync::Arc;

/// The blocks whose routed experts a store holds, by checkpoint prefix (`layers.N` for the
/// model, `mtp.S` for a drafter's stages), each with `n_experts`: the store's "layer" `l` is
/// block `l` of this list, and expert key `l * n_experts + e`.
#[derive(Clone, Debug)]
pub struct Blocks {
    pub prefixes: Arc<Vec<String>>,
    pub n_experts: usize,
}

impl Blocks {
    /// The model's layers `layers.0` .. `layers.{L-1}`.
    pub fn of_model(c: &ModelConfig) -> Blocks {
        Blocks::new(
            (0..c.num_layers).map(|l| format!("layers.{l}")).collect(),
            c,
        )
    }

    pub fn new(prefixes: Vec<String>, c: &ModelConfig) -> Blocks {
        Blocks {
            prefixes: Arc::new(prefixes),
            n_experts: c.n_routed_experts,
        }
    }

    pub fn len(&self) -> usize {
        self.prefixes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    fn split(&self, key: u32) -> (&str, usize) {
        let (l, e) = (
            key as usize / self.n_experts.max(1),
            key as usize % self.n_experts.max(1),
        );
        (self.prefixes.get(l).map_or("?", |p| p.as_str()), e)
    }

    /// "`block`.ffn.experts.E" for an expert key.
    pub fn expert_name(&self, key: u32) -> String {
        let (b, e) = self.split(key);
        format!("{b}.ffn.experts.{e}")
    }

    /// The checkpoint name of part `k` of the expert of `key`.
    pub fn part_name(&self, key: u32, k: usize) -> String {
        let (b, e) = self.split(key);
        block_expert_part_name(b, e, k)
    }
}

/// Where one of an expert's six tensors lives in the checkpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Part {
    pub shard: u32,
    pub offset: u64,
    pub len: u64,
}

impl Part {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A read of one file range into a slot: the ALIGN-aligned file envelope of
/// [offset, offset+len) lands at slot byte `dst` (ALIGN-aligned), so the range itself starts
/// at `dst + offset % ALIGN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOp {
    pub shard: u32,
    pub offset: u64,
    pub len: u64,
    pub dst: usize,
}

impl ReadOp {
    /// Bytes of the slot this read may write: [dst, dst + envelope). The envelopes of one
    /// expert's reads are disjoint, so concurrent reads of one expert never overlap.
    pub fn envelope(&self) -> usize {
        envelope(self.offset, self.len)
    }

    /// Where the requested range starts inside the envelope.
    pub fn delta(&self) -> usize {
        (self.offset % ALIGN as u64) as usize
    }
}

/// An expert's layout in its slot: the six parts' (start, len) in the slot, their places in
/// the checkpoint, and the reads that fill the slot.
#[derive(Clone, Debug)]
pub struct Layout {
    pub parts: [(usize, usize); 6],
    pub files: [Part; 6],
    pub reads: Vec<ReadOp>,
}

/// Plans the reads of one expert: parts sorted by file position, adjacent ones (gaps of at
/// most ALIGN bytes) coalesced into one read, each read landing at an ALIGN-aligned place in
/// the slot right after the previous read's envelope. Returns the layout and the slot bytes
/// it needs.
pub fn layout(parts: &[Part; 6]) -> (Layout, usize) {
    let a = ALIGN as u64;
    let mut order: Vec<usize> = (0..6).collect();
    order.sort_by_key(|&k| (parts[k].shard, parts[k].offset));
    let mut reads: Vec<ReadOp> = Vec::new();
    let mut out = [(0usize, 0usize); 6];
    for &k in &order {
        let p = parts[k];
        let extend = reads.last().is_some_and(|r| {
            r.shard == p.shard && p.offset >= r.offset && p.offset <= r.offset + r.len + a
        });
        if extend {
            if let Some(r) = reads.last_mut() {
                r.len = p.end().max(r.offset + r.len) - r.offset;
            }
        } else {
            let dst = reads.last().map_or(0, |r| r.dst + r.envelope());
            reads.push(ReadOp {
                shard: p.shard,
                offset: p.offset,
                len: p.len,
                dst,
            });
        }
        // a read was pushed or extended just above
        let r = reads[reads.len() - 1];
        out[k] = (
            r.dst + r.delta() + (p.offset - r.offset) as usize,
            p.len as usize,
        );
    }
    let total = reads.last().map_or(0, |r| r.dst + r.envelope());
    (
        Layout {
            parts: out,
            files: *parts,
            reads,
        },
        total,
    )
}

/// Bytes of the ALIGN-aligned file envelope of [off, off+len).
pub fn envelope(off: u64, len: u64) -> usize {
    let a = ALIGN as u64;
    let start = off - off % a;
    ((off + len).div_ceil(a) * a - start) as usize
}

/// Locates the six tensors of one expert; with `check`, also checks their dtypes and shapes
/// (`checkpoint::expected::expert_part`)
/// (the planner only needs their sizes, and a checkpoint of another shape is reported by
/// the dense tensors first when it is loaded).
pub fn expert_parts(
    ck: &Checkpoint,
    c: &ModelConfig,
    block: &str,
    e: usize,
    check: bool,
) -> Result<[Part; 6]> {
    let mut parts = [Part::default(); 6];
    for (k, part) in parts.iter_mut().enumerate() {
        let name = block_expert_part_name(block, e, k);
        let t = if check {
            let (dtypes, shape) = expected::expert_part(c, k);
            ck.expect(&name, dtypes, &shape)?
        } else {
            ck.tensor(&name)?
        };
        *part = Part {
            shard: t.shard as u32,
            offset: t.offset,
            len: t.len,
        };
    }
    Ok(parts)
}

/// Every expert's layout of the model's layers (indexed by layer * n_experts + expert) and
/// the slot size: the largest layout rounded up to ALIGN.
pub fn plan_all(ck: &Checkpoint, c: &ModelConfig, check: bool) -> Result<(Vec<Layout>, usize)> {
    plan_blocks(ck, c, &Blocks::of_model(c), check)
}

/// `plan_all` for the experts of `blocks` (indexed by block * n_experts + expert).
pub fn plan_blocks(
    ck: &Checkpoint,
    c: &ModelConfig,
    blocks: &Blocks,
    check: bool,
) -> Result<(Vec<Layout>, usize)> {
    let mut layouts = Vec::with_capacity(blocks.len() * c.n_routed_experts);
    let mut size = 0usize;
    for b in blocks.prefixes.iter() {
        for e in 0..c.n_routed_experts {
            let (lay, s) = layout(&expert_parts(ck, c, b, e, check)?);
            size = size.max(s);
            layouts.push(lay);
        }
    }
    Ok((layouts, size.div_ceil(ALIGN) * ALIGN))
}

/// Bytes of one slot (the largest expert's aligned layout), from the tensor table only.
pub fn slot_size(ck: &Checkpoint, c: &ModelConfig) -> Result<usize> {
    plan_all(ck, c, false).map(|(_, s)| s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(shard: u32, offset: u64, len: u64) -> Part {
        Part { shard, offset, len }
    }

    /// Every part lands inside its read's envelope at the right distance, envelopes are
    /// aligned and disjoint, and reads cover every part's bytes.
    fn check(parts: &[Part; 6]) {
        let (lay, total) = layout(parts);
        for w in lay.reads.windows(2) {
            assert!(w[0].dst + w[0].envelope() <= w[1].dst, "{:?}", lay.reads);
        }
        for r in &lay.reads {
            assert_eq!(r.dst % ALIGN, 0);
            assert!(r.dst + r.envelope() <= total);
        }
        for k in 0..6 {
            let (start, len) = lay.parts[k];
            assert_eq!(len as u64, parts[k].len);
            let r = lay
                .reads
                .iter()
                .find(|r| {
                    r.shard == parts[k].shard
                        && r.offset <= parts[k].offset
                        && parts[k].end() <= r.offset + r.len
                })
                .expect("a read covers the part");
            assert_eq!(
                start,
                r.dst + r.delta() + (parts[k].offset - r.offset) as usize
            );
            assert_eq!(lay.files[k], parts[k]);
        }
    }

    #[test]
    fn contiguous_parts_coalesce_into_one_read() {
        let mut parts = [Part::default(); 6];
        let mut off = 100;
        for (k, q) in parts.iter_mut().enumerate() {
            let len = if k % 2 == 0 { 3000 } else { 96 };
            *q = p(0, off, len);
            off += len;
        }
        let (lay, total) = layout(&parts);
        assert_eq!(lay.reads.len(), 1);
        assert_eq!(total, envelope(100, off - 100));
        check(&parts);
    }

    #[test]
    fn parts_in_two_shards_and_far_apart_get_separate_aligned_reads() {
        let parts = [
            p(1, 10_000, 5000),
            p(0, 4096 * 9 + 7, 40),
            p(1, 15_000, 5000),
            p(0, 1 << 20, 40),
            p(1, 1 << 22, 5000),
            p(0, (1 << 20) + 40, 40),
        ];
        let (lay, _) = layout(&parts);
        assert_eq!(lay.reads.len(), 4, "{:?}", lay.reads);
        check(&parts);
    }

    #[test]
    fn envelope_rounds_both_ends() {
        assert_eq!(envelope(0, 1), ALIGN);
        assert_eq!(envelope(ALIGN as u64 - 1, 2), 2 * ALIGN);
        assert_eq!(envelope(ALIGN as u64, ALIGN as u64), ALIGN);
    }
}
