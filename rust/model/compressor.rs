//! KV compressors (docs/model.md §3.5–3.7, §3.9). Raw projections of the tokens of the current
//! incomplete window wait in a pending buffer; when `ratio` tokens are there, the window is
//! pooled (a per-channel softmax over its slots of gate + position bias), normed, roped at
//! the window's first position and appended as one compressed entry. Pooling the stored raw
//! values when the window closes reproduces transformers exactly (an online softmax would not).
//!
//! CSA (overlap) compressors project 2·d channels: Ca = [..d] feeds the NEXT window's
//! entry, Cb = [d..] the current one; entry w pools Ca of window w-1 (slots 0..ratio) with
//! Cb of window w (slots ratio..2·ratio). The first window has no predecessor: zero weight.

use super::rope::Rope;
use crate::kernels::{hadamard, ops, quant};
use crate::scratch::Buf;

/// What official numerics does to an entry after its norm and rope (DeepSeek's reference
/// `Compressor.forward` in `inference/model.py`, revision 60d8d70): nothing in the other
/// modes; the FP8 round trip of the non-rope dims for the attention's compressors; the
/// Hadamard rotation then FP4 round trip of the whole entry for the indexer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryQdq {
    None,
    Fp8 { rope_dim: usize },
    RotateFp4,
}

/// Parameters of one compressor.
pub struct CompressorWeights {
    /// [ratio, c·d] f32 (`ape`), c = 2 with overlap, else 1.
    pub ape: Vec<f32>,
    /// [d]
    pub norm: Vec<f32>,
    pub wkv: super::weights::Linear,
    pub wgate: super::weights::Linear,
    pub ratio: usize,
    /// Output width d of one entry.
    pub dim: usize,
    pub overlap: bool,
}

/// A compressor's per-sequence state.
#[derive(Clone, Default)]
pub struct CompState {
    /// [pending, c·d] raw kv of the tokens of the incomplete window.
    pub pend_kv: Vec<f32>,
    /// [pending, c·d] raw gate (no bias).
    pub pend_gate: Vec<f32>,
    /// CSA: Ca half of the last complete window: kv [ratio, d] and gate + bias [ratio, d].
    pub over_kv: Vec<f32>,
    pub over_gate: Vec<f32>,
    /// [n_entries, d] emitted entries (post-norm, post-rope).
    pub entries: Vec<f32>,
    /// While a speculative verify runs (`journal.rs`): the projections pushed, kv and gate
    /// [tokens, c·d] each, so that the state can be cut back to any of its tokens. None
    /// otherwise (never saved, never in a snapshot).
    pub log: Option<Box<(Vec<f32>, Vec<f32>)>>,
}

impl CompState {
    pub fn n_entries(&self, d: usize) -> usize {
        self.entries.len() / d
    }
}

impl CompressorWeights {
    fn width(&self) -> usize {
        if self.overlap {
            2 * self.dim
        } else {
            self.dim
        }
    }

    /// The raw projections of n tokens (normed hidden states x [n, H]): kv and gate, each
    /// [n, c·d]. One product over all the tokens given, whichever sequences they belong to
    /// (each row depends on its own token alone).
    pub fn project(&self, x: &[f32], n: usize) -> (Buf, Buf) {
        (self.wkv.forward(x, n), self.wgate.forward(x, n))
    }

    /// Feeds the projections (`project`) kv and gate [n, c·d] of n consecutive tokens of one
    /// sequence; emits every window that closes, each entry finished by `qdq`.
    #[allow(clippy::too_many_arguments)]
    pub fn push_projected(
        &self,
        st: &mut CompState,
        kv: &[f32],
        gate: &[f32],
        n: usize,
        rope: &Rope,
        eps: f32,
        qdq: EntryQdq,
    ) {
        let w = self.width();
        if let Some(log) = st.log.as_mut() {
            log.0.extend_from_slice(&kv[..n * w]);
            log.1.extend_from_slice(&gate[..n * w]);
        }
        for t in 0..n {
            st.pend_kv.extend_from_slice(&kv[t * w..(t + 1) * w]);
            st.pend_gate.extend_from_slice(&gate[t * w..(t + 1) * w]);
            if st.pend_kv.len() == self.ratio * w {
                self.emit(st, rope, eps, qdq);
                st.pend_kv.clear();
                st.pend_gate.clear();
            }
        }
    }

    /// Width c·d of one token's projection (the row length of `project`'s outputs).
    pub fn row_width(&self) -> usize {
        self.width()
    }

    fn emit(&self, st: &mut CompState, rope: &Rope, eps: f32, qdq: EntryQdq) {
        let (m, d, w) = (self.ratio, self.dim, self.width());
        let idx = st.n_entries(d);
        let mut pooled = vec![0f32; d];
        if self.overlap {
            // slots: [prev Ca (m) | this Cb (m)], per channel softmax over 2m slots.
            let has_prev = !st.over_kv.is_empty();
            let mut g = vec![0f32; 2 * m];
            let mut v = vec![0f32; 2 * m];
            for c in 0..d {
                for j in 0..m {
                    if has_prev {
                        g[j] = st.over_gate[j * d + c];
                        v[j] = st.over_kv[j * d + c];
                    } else {
                        g[j] = f32::NEG_INFINITY;
                        v[j] = 0.0;
                    }
                    g[m + j] = st.pend_gate[j * w + d + c] + self.ape[j * w + d + c];
                    v[m + j] = st.pend_kv[j * w + d + c];
                }
                pooled[c] = pool(&mut g, &v);
            }
            st.over_kv.clear();
            st.over_gate.clear();
            for j in 0..m {
                for c in 0..d {
                    st.over_kv.push(st.pend_kv[j * w + c]);
                    st.over_gate
                        .push(st.pend_gate[j * w + c] + self.ape[j * w + c]);
                }
            }
        } else {
            let mut g = vec![0f32; m];
            let mut v = vec![0f32; m];
            for c in 0..d {
                for j in 0..m {
                    g[j] = st.pend_gate[j * w + c] + self.ape[j * w + c];
                    v[j] = st.pend_kv[j * w + c];
                }
                pooled[c] = pool(&mut g, &v);
            }
        }
        ops::rms_norm(&mut pooled, &self.norm, eps);
        rope.apply(&mut pooled, d, idx * m, 1.0);
        match qdq {
            EntryQdq::None => {}
            EntryQdq::Fp8 { rope_dim } => quant::fp8_kv_qdq(&mut pooled, d, rope_dim),
            EntryQdq::RotateFp4 => {
                hadamard::rotate(&mut pooled, d);
                quant::fp4_qdq(&mut pooled, d);
            }
        }
        st.entries.extend_from_slice(&pooled);
    }
}

/// Σ_j softmax(g)_j · v_j, with the softmax in f32 as torch computes it.
fn pool(g: &mut [f32], v: &[f32]) -> f32 {
    ops::softmax(g);
    let mut s = 0f32;
    for (a, b) in g.iter().zip(v) {
        s += a * b;
    }
    s
}
