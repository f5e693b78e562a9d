//! Shared-KV multi-query attention for the three layer kinds (docs/model.md §3): the
//! low-rank query path, the sliding window, the compressed entries (HCA: all visible ones;
//! CSA: the lightning indexer's top-k of them), per-head sinks, output de-rotation and the
//! grouped output projection.

use super::compressor::{CompState, CompressorWeights, EntryQdq};
use super::rope::Rope;
use super::weights::Linear;
use crate::config::{LayerKind, ModelConfig};
use crate::kernels::{self, hadamard, ops, quant, Numerics};
use crate::scratch::{self, Buf};
use rayon::prelude::*;
use std::ops::Range;

/// Heads of one token per attention task: they share the token's keys, read once per task
/// for all of them; 8 of V4's 64 heads leave 8 tasks per token for the pool.
pub(super) const ATTEND_HEADS: usize = 8;

pub struct IndexerWeights {
    pub comp: CompressorWeights,
    /// [IH·ID, q_lora] FP8
    pub wq_b: Linear,
    /// [IH, H] BF16
    pub weights_proj: Linear,
}

pub struct AttnWeights {
    pub kind: LayerKind,
    /// [q_lora, H]
    pub wq_a: Linear,
    /// [q_lora]
    pub q_norm: Vec<f32>,
    /// [NH·D, q_lora]
    pub wq_b: Linear,
    /// [D, H]
    pub wkv: Linear,
    /// [D]
    pub kv_norm: Vec<f32>,
    /// [G·R, NH·D/G]
    pub wo_a: Linear,
    /// [H, G·R]
    pub wo_b: Linear,
    /// [NH]
    pub sinks: Vec<f32>,
    pub comp: Option<CompressorWeights>,
    pub indexer: Option<IndexerWeights>,
}

/// What the attention's compressor does to an entry after its norm and rope: official
/// numerics round-trips the non-rope dims through FP8 (DeepSeek's reference
/// `Compressor.forward`, revision 60d8d70).
pub fn comp_qdq(numerics: Numerics, c: &ModelConfig) -> EntryQdq {
    if numerics.official() {
        EntryQdq::Fp8 {
            rope_dim: c.rope_dim,
        }
    } else {
        EntryQdq::None
    }
}

/// What the indexer's compressor does to an entry: official numerics rotates it (Hadamard)
/// and round-trips it through FP4.
pub fn index_qdq(numerics: Numerics) -> EntryQdq {
    if numerics.official() {
        EntryQdq::RotateFp4
    } else {
        EntryQdq::None
    }
}

/// Per-sequence attention state of one layer.
#[derive(Clone, Default)]
pub struct AttnState {
    /// [≤ W-1, D] kv of the most recent tokens, oldest first.
    pub window: Vec<f32>,
    pub comp: CompState,
    pub idx: CompState,
}

pub struct Ctx<'a> {
    pub cfg: &'a ModelConfig,
    pub rope_main: &'a Rope,
    pub rope_comp: &'a Rope,
    /// How the FP8 projections meet their inputs (`wo_a` runs exact except in fast numerics:
    /// DeepSeek's reference computes it in BF16, without activation quantization), and
    /// whether the KV entries and the indexer's vectors are round-tripped
    /// (`Numerics::official`).
    pub numerics: Numerics,
    /// If set, each token's indexer selection (ascending entry indices) is appended here
    /// (CSA layers only; for tests and measurements, `Model::layer_probe`).
    pub sel_trace: Option<&'a std::sync::Mutex<Vec<Vec<usize>>>>,
}

/// One sequence's tokens in an attention call: rows `rows` of the call's input, consecutive
/// tokens of that sequence at positions `pos0`.., advancing its layer state `st`. A call takes
/// the parts of several sequences (a batch), each attending over its own state only.
pub struct Part<'s> {
    pub st: &'s mut AttnState,
    pub rows: Range<usize>,
    pub pos0: usize,
}

/// Each row's position and part, for n rows covered by `parts`.
fn rows_of(parts: &[Part], n: usize) -> (Vec<usize>, Vec<usize>) {
    let (mut pos, mut part_of) = (vec![0usize; n], vec![0usize; n]);
    for (i, p) in parts.iter().enumerate() {
        for (j, r) in p.rows.clone().enumerate() {
            pos[r] = p.pos0 + j;
            part_of[r] = i;
        }
    }
    (pos, part_of)
}

impl AttnWeights {
    /// x: [n, H] normed input of the parts' tokens (their rows cover 0..n once; each part's
    /// rows are consecutive tokens of its sequence). Returns [n, H] and advances each part's
    /// state. Every product runs once over all n rows, whatever sequences they belong to;
    /// the window, compressors, indexer and attention of a row read its own sequence's state
    /// only, so each row's output is the same as in a call of its sequence alone.
    /// The rope of this layer's attention: the main one for sliding-window layers, the
    /// compressed one for CSA/HCA.
    pub fn rope<'a>(&self, cx: &Ctx<'a>) -> &'a Rope {
        if self.kind == LayerKind::Sliding {
            cx.rope_main
        } else {
            cx.rope_comp
        }
    }

    /// The query path for x [n, H] at positions `pos`: (qr [n, q_lora], the q_norm'ed low-rank
    /// query the indexer reads too; q [n, NH·D], each head RMS-normed then roped).
    pub fn queries(&self, cx: &Ctx, x: &[f32], n: usize, pos: &[usize]) -> (Buf, Buf) {
        let c = cx.cfg;
        let (nh, d, eps) = (c.num_heads, c.head_dim, c.rms_norm_eps);
        let rope = self.rope(cx);
        let mut qr = self.wq_a.forward_in(cx.numerics, x, n);
        for r in qr.chunks_exact_mut(c.q_lora_rank) {
            ops::rms_norm(r, &self.q_norm, eps);
        }
        let mut q = self.wq_b.forward_in(cx.numerics, &qr, n);
        for (t, qt) in q.chunks_exact_mut(nh * d).enumerate() {
            for head in qt.chunks_exact_mut(d) {
                ops::rms_norm_unweighted(head, eps);
            }
            rope.apply(qt, d, pos[t], 1.0);
        }
        (qr, q)
    }

    /// The window keys (= values) of x [n, H] at positions `pos`: kv_norm(wkv · x), roped;
    /// [n, D]. In official numerics the non-rope dims go through FP8 after norm and rope
    /// (DeepSeek's reference `Attention.forward`, revision 60d8d70).
    pub fn keys(&self, cx: &Ctx, x: &[f32], n: usize, pos: &[usize]) -> Buf {
        let c = cx.cfg;
        let d = c.head_dim;
        let rope = self.rope(cx);
        let mut kv = self.wkv.forward_in(cx.numerics, x, n);
        for (t, k) in kv.chunks_exact_mut(d).enumerate() {
            ops::rms_norm(k, &self.kv_norm, c.rms_norm_eps);
            rope.apply(k, d, pos[t], 1.0);
        }
        if cx.numerics.official() {
            quant::fp8_kv_qdq(&mut kv, d, c.rope_dim);
        }
        kv
    }

    pub fn forward(&self, cx: &Ctx, parts: &mut [Part], x: &[f32], n: usize) -> Buf {
        let c = cx.cfg;
        let (nh, d) = (c.num_heads, c.head_dim);
        let eps = c.rms_norm_eps;
        let (pos, part_of) = rows_of(parts, n);

        // q path: [n, q_lora] → [n, NH·D]
        let (qr, q) = self.queries(cx, x, n, &pos);
        // kv: [n, D]
        let kv = self.keys(cx, x, n, &pos);
        // per part: its window then its new rows, [prev + len, D] at positions pos0 - prev ..
        let keys: Vec<(Vec<f32>, usize)> = parts
            .iter_mut()
            .map(|p| {
                let prev = p.st.window.len() / d;
                let mut k = std::mem::take(&mut p.st.window);
                k.extend_from_slice(&kv[p.rows.start * d..p.rows.end * d]);
                (k, p.pos0 - prev)
            })
            .collect();

        // compressed entries (emitted for every window closed by these tokens): one product
        // for all rows, then each sequence's own pending rows and entries
        if let Some(cw) = &self.comp {
            let qdq = comp_qdq(cx.numerics, c);
            let (pkv, pgate) = cw.project(x, n); // [n, c·d] each
            let w = cw.row_width();
            for p in parts.iter_mut() {
                let r = p.rows.start * w..p.rows.end * w;
                let (kv, gate) = (&pkv[r.clone()], &pgate[r]);
                cw.push_projected(
                    &mut p.st.comp,
                    kv,
                    gate,
                    p.rows.len(),
                    cx.rope_comp,
                    eps,
                    qdq,
                );
            }
        }
        let sel = self
            .indexer
            .as_ref()
            .map(|ix| self.index_select(cx, ix, parts, x, &qr, &pos, &part_of));
        if let (Some(tr), Some(sel)) = (cx.sel_trace, &sel) {
            if let Ok(mut tr) = tr.lock() {
                tr.extend(sel.iter().cloned());
            }
        }
        let ratio = self.kind.ratio();

        // attention per (token, group of heads): a token's heads share its keys, so each
        // group reads every key once for all its heads (`kernels::attend`); each token's
        // keys are its own sequence's window and entries
        let scale = (d as f32).powf(-0.5);
        let w = c.sliding_window;
        let hg = ATTEND_HEADS.min(nh);
        let mut o = scratch::zeroed(n * nh * d);
        {
            let parts: &[Part] = parts;
            o.par_chunks_mut(nh * d)
                .enumerate()
                .flat_map(|(t, ot)| {
                    ot.par_chunks_mut(hg * d)
                        .enumerate()
                        .map(move |(g, og)| (t, g * hg, og))
                })
                .for_each(|(t, h0, out)| {
                    let pos = pos[t];
                    let (keys, first_pos) = (&keys[part_of[t]].0, keys[part_of[t]].1);
                    let entries = &parts[part_of[t]].st.comp.entries;
                    let n_entries = entries.len() / d;
                    let heads = out.len() / d;
                    let qh = &q[(t * nh + h0) * d..(t * nh + h0 + heads) * d];
                    let lo = (pos + 1).saturating_sub(w).max(first_pos) - first_pos;
                    let hi = pos - first_pos; // inclusive
                    let mut ks: Vec<&[f32]> =
                        (lo..=hi).map(|j| &keys[j * d..(j + 1) * d]).collect();
                    if let Some(q) = (pos + 1).checked_div(ratio) {
                        let vis = q.min(n_entries);
                        match &sel {
                            Some(sel) => {
                                for &e in &sel[t] {
                                    ks.push(&entries[e * d..(e + 1) * d]);
                                }
                            }
                            None => {
                                for e in 0..vis {
                                    ks.push(&entries[e * d..(e + 1) * d]);
                                }
                            }
                        }
                    }
                    kernels::attend(qh, &ks, scale, &self.sinks[h0..h0 + heads], out);
                });
        }
        let out = self.output(cx, &mut o, n, &pos);

        // each sequence keeps its last W-1 tokens for the next call
        for (p, (k, _)) in parts.iter_mut().zip(&keys) {
            let total = k.len() / d;
            let keep = total.min(w.saturating_sub(1));
            p.st.window = k[(total - keep) * d..].to_vec();
        }
        out
    }

    /// The output side for the attention outputs o [n, NH·D] of rows at positions `pos`: each
    /// head's rope dims de-rotated (in place), then the grouped output projection; [n, H].
    pub fn output(&self, cx: &Ctx, o: &mut [f32], n: usize, pos: &[usize]) -> Buf {
        let c = cx.cfg;
        let (nh, d) = (c.num_heads, c.head_dim);
        let rope = self.rope(cx);
        for (t, ot) in o.chunks_exact_mut(nh * d).enumerate() {
            rope.apply(ot, d, pos[t], -1.0);
        }

        // grouped output projection: group g = heads g·NH/G.. → rows g·R.. of wo_a. DeepSeek
        // computes wo_a in BF16 without its FP8 activation round trip, so fp8-act and official
        // leave it exact; fast rounds its input to bf16 as for every FP8/FP4 product.
        let wo_a_numerics = match cx.numerics {
            Numerics::Fast => Numerics::Fast,
            _ => Numerics::Exact,
        };
        let (g, r) = (c.o_groups, c.o_lora_rank);
        let gw = nh * d / g;
        let mut z = scratch::zeroed(n * g * r);
        let mut xg = scratch::zeroed(n * gw);
        for gi in 0..g {
            for t in 0..n {
                xg[t * gw..(t + 1) * gw]
                    .copy_from_slice(&o[t * nh * d + gi * gw..t * nh * d + (gi + 1) * gw]);
            }
            let y = self
                .wo_a
                .forward_rows_in(wo_a_numerics, gi * r..(gi + 1) * r, &xg, n);
            for t in 0..n {
                z[t * g * r + gi * r..t * g * r + (gi + 1) * r]
                    .copy_from_slice(&y[t * r..(t + 1) * r]);
            }
        }
        self.wo_b.forward_in(cx.numerics, &z, n)
    }

    /// The lightning indexer: for each of the n queries (row t at position pos[t] of part
    /// part_of[t]), the compressed entries of its own sequence it attends to.
    #[allow(clippy::too_many_arguments)]
    fn index_select(
        &self,
        cx: &Ctx,
        ix: &IndexerWeights,
        parts: &mut [Part],
        x: &[f32],
        qr: &[f32],
        pos: &[usize],
        part_of: &[usize],
    ) -> Vec<Vec<usize>> {
        let c = cx.cfg;
        let n = pos.len();
        let (ih, id) = (c.index_n_heads, c.index_head_dim);
        let official = cx.numerics.official();
        let qdq = index_qdq(cx.numerics);
        let (pkv, pgate) = ix.comp.project(x, n); // [n, 2·ID] each
        let w = ix.comp.row_width();
        for p in parts.iter_mut() {
            let r = p.rows.start * w..p.rows.end * w;
            let (kv, gate) = (&pkv[r.clone()], &pgate[r]);
            let (rope, eps) = (cx.rope_comp, c.rms_norm_eps);
            ix.comp
                .push_projected(&mut p.st.idx, kv, gate, p.rows.len(), rope, eps, qdq);
        }
        let mut qi = ix.wq_b.forward_in(cx.numerics, qr, n); // [n, IH·ID]
        for (t, qt) in qi.chunks_exact_mut(ih * id).enumerate() {
            cx.rope_comp.apply(qt, id, pos[t], 1.0);
        }
        // official: each head's query rotated then through FP4, after its rope, as the keys
        // (DeepSeek's reference `Indexer.forward`, revision 60d8d70)
        if official {
            hadamard::rotate(&mut qi, id);
            quant::fp4_qdq(&mut qi, id);
        }
        let wts = ix.weights_proj.forward(x, n); // [n, IH]
        let ratio = ix.comp.ratio;
        let sm = (id as f32).powf(-0.5);
        let ws = (ih as f32).powf(-0.5);
        let parts: &[Part] = parts;
        (0..n)
            .into_par_iter()
            .map(|t| {
                let st = &parts[part_of[t]].st.idx;
                let n_entries = st.entries.len() / id;
                let k = c.index_topk.min(n_entries);
                let vis = ((pos[t] + 1) / ratio).min(n_entries);
                if vis <= k {
                    return (0..vis).collect();
                }
                let qt = &qi[t * ih * id..(t + 1) * ih * id];
                // parallel over entries too: in decode (n = 1) this is where the work is
                let mut scored: Vec<(f32, usize)> = (0..vis)
                    .into_par_iter()
                    .with_min_len(256)
                    .map(|e| {
                        let ke = &st.entries[e * id..(e + 1) * id];
                        let mut s = 0f32;
                        for h in 0..ih {
                            let dp = kernels::dot(&qt[h * id..(h + 1) * id], ke).max(0.0) * sm;
                            s += dp * (wts[t * ih + h] * ws);
                        }
                        (s, e)
                    })
                    .collect();
                // top-k: partition around the k-th (score desc, index asc), O(vis)
                let cmp =
                    |a: &(f32, usize), b: &(f32, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
                scored.select_nth_unstable_by(k - 1, cmp);
                let mut sel: Vec<usize> = scored[..k].iter().map(|p| p.1).collect();
                sel.sort_unstable();
                sel
            })
            .collect()
    }
}
