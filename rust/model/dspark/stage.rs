//! The target's rows into the stages' window keys (`observe`), and one stage's forward pass
//! over the draft block: the model's block code (hyper-connections, attention's query, key
//! and output paths, MoE) around the DSpark attention, where every block row attends to the
//! window's keys and to all of the block's keys.

use super::super::attention::{Ctx, ATTEND_HEADS};
use super::super::forward::hc_out;
use super::super::Model;
use super::{DSpark, DraftState};
use crate::error::{Error, Result};
use crate::kernels::{self, ops};
use crate::scratch;
use rayon::prelude::*;

impl Model {
    /// Observes the target's captured rows [n, T·H] (`forward_capture` with the drafter's
    /// target layers) of positions pos0 .. pos0+n into `ds`: each stage's window keys of
    /// `main_norm(main_proj(row))`, roped at the row's position. `pos0` must be where `ds`
    /// stands (`DraftState::len`); on error `ds` is unchanged.
    pub fn drafter_observe(&self, ds: &mut DraftState, rows: &[f32], pos0: usize) -> Result<()> {
        let d = self.drafter()?;
        let c = &self.cfg;
        if ds.owner() != self.id {
            return Err(Error::arg(
                "this drafter state belongs to another model (make it with this model's drafter_state)",
            ));
        }
        let width = d.target_layers().len() * c.hidden_size;
        if rows.len() % width != 0 {
            return Err(Error::arg(format!(
                "the drafter's rows hold {} values, not a whole number of rows of {width} \
                 (the target layers {:?} x hidden size {})",
                rows.len(),
                d.target_layers(),
                c.hidden_size
            )));
        }
        if pos0 != ds.len() {
            return Err(Error::arg(format!(
                "the drafter state has observed {} positions: the next rows are at position {}, not {pos0}",
                ds.len(),
                ds.len()
            )));
        }
        let n = rows.len() / width;
        if n == 0 {
            return Ok(());
        }
        if let Some(bad) = rows.iter().position(|v| !v.is_finite()) {
            return Err(Error::arg(format!(
                "the drafter's rows hold a non-finite value (row {}, column {})",
                bad / width,
                bad % width
            )));
        }
        let pos: Vec<usize> = (pos0..pos0 + n).collect();
        let cx = self.ctx(None);
        let keys = self.pool.install(|| {
            let mut main_x = d.main_proj.forward_in(self.numerics, rows, n); // [n, H]
            for r in main_x.chunks_exact_mut(c.hidden_size) {
                ops::rms_norm(r, &d.main_norm, c.rms_norm_eps);
            }
            d.stages
                .iter()
                .map(|s| s.attn.keys(&cx, &main_x, n, &pos).to_vec()) // [n, D] each
                .collect::<Vec<_>>()
        });
        ds.push(keys, n);
        Ok(())
    }
}

impl DSpark {
    /// Stage `s` over the block's streams x [B, hc, H] (ids: the block's tokens, at positions
    /// `pos`), in place, with `window` [w, D] the stage's keys of the last observed positions.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn stage(
        &self,
        m: &Model,
        cx: &Ctx,
        s: usize,
        x: &mut [f32],
        ids: &[u32],
        pos: &[usize],
        window: &[f32],
    ) -> Result<()> {
        let c = &m.cfg;
        let (b, hcm) = (ids.len(), c.hc_mult);
        let st = &self.stages[s];
        m.pool.install(|| {
            let (mixes, xin) = m.hc_in(&st.hc_attn, &st.attn_norm, x, b);
            let o = self.attention(cx, s, &xin, pos, window);
            hc_out(x, &o, &mixes, hcm);
        });
        let (mixes, y) = m.pool.install(|| m.hc_in(&st.hc_ffn, &st.ffn_norm, x, b));
        let (f, _) =
            st.moe
                .forward(c, s, &self.experts, &m.pool, m.numerics, (&y, ids, b), None)?;
        m.pool.install(|| hc_out(x, &f, &mixes, hcm));
        Ok(())
    }

    /// Stage `s`'s attention for the block's normed inputs x [B, H] at positions `pos`: the
    /// queries and keys of the model's attention code, every row attending to the window
    /// keys [w, D] and all B block keys (no mask inside the block), with the sinks; then the
    /// output side. [B, H]. On the pool.
    fn attention(
        &self,
        cx: &Ctx,
        s: usize,
        x: &[f32],
        pos: &[usize],
        window: &[f32],
    ) -> scratch::Buf {
        let c = cx.cfg;
        let (nh, d, b) = (c.num_heads, c.head_dim, pos.len());
        let a = &self.stages[s].attn;
        let (_, q) = a.queries(cx, x, b, pos); // [B, NH·D]
        let kv = a.keys(cx, x, b, pos); // [B, D]
        let keys: Vec<&[f32]> = window.chunks_exact(d).chain(kv.chunks_exact(d)).collect();
        let scale = (d as f32).powf(-0.5);
        let hg = ATTEND_HEADS.min(nh);
        let mut o = scratch::zeroed(b * nh * d);
        o.par_chunks_mut(nh * d)
            .enumerate()
            .flat_map(|(t, ot)| {
                ot.par_chunks_mut(hg * d)
                    .enumerate()
                    .map(move |(g, og)| (t, g * hg, og))
            })
            .for_each(|(t, h0, out)| {
                let heads = out.len() / d;
                let qh = &q[(t * nh + h0) * d..(t * nh + h0 + heads) * d];
                kernels::attend(qh, &keys, scale, &a.sinks[h0..h0 + heads], out);
            });
        a.output(cx, &mut o, b, pos)
    }
}
