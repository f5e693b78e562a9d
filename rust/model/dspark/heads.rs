//! A draft: the block `[last, noise, …]` through the stages, then the last stage's output
//! side: the hyper-head collapse (`hidden`), the norm and the target's head (logits), and,
//! left to right, the Markov bias of the previous token before each greedy pick and the
//! confidence head on [hidden, Markov embedding].

use super::super::{embed_row, hc, Model};
use super::{DSpark, DraftState};
use crate::error::{Error, Result};
use crate::kernels::{self, ops};

/// One draft: the drafted tokens, with their confidences and the last stage's logits.
#[derive(Debug, Clone)]
pub struct Draft {
    /// (token, confidence) per drafted position: the confidence head's probability
    /// (sigmoid of its score) that the target accepts the token.
    pub tokens: Vec<(u32, f32)>,
    /// [k, V] the logits each token was picked from (the Markov bias added).
    pub logits: Vec<f32>,
    /// [k] the confidence head's scores (logits; `tokens` holds their sigmoid).
    pub scores: Vec<f32>,
}

impl Model {
    /// Drafts `k` (1..=block_size) tokens after the positions `ds` has observed, `last`
    /// being the token at the next position (the one the target just produced): (token,
    /// confidence) each, confidence in (0, 1). Changes no state.
    pub fn draft(&self, ds: &DraftState, last: u32, k: usize) -> Result<Vec<(u32, f32)>> {
        Ok(self.draft_full(ds, last, k)?.tokens)
    }

    /// `draft`, with the logits and the confidence scores.
    pub fn draft_full(&self, ds: &DraftState, last: u32, k: usize) -> Result<Draft> {
        let d = self.drafter()?;
        let bs = d.block_size();
        if !(1..=bs).contains(&k) {
            return Err(Error::arg(format!(
                "a draft proposes 1 to {bs} tokens (dspark_block_size), not {k}"
            )));
        }
        if ds.owner() != self.id {
            return Err(Error::arg(
                "this drafter state belongs to another model (make it with this model's drafter_state)",
            ));
        }
        if ds.is_empty() {
            return Err(Error::arg(
                "the drafter has observed no position yet: observe the target's rows of the prompt first",
            ));
        }
        self.check_ids(&[last])?;
        if self.pool.current_thread_index().is_some() {
            return Err(Error::arg(
                "internal: a draft was started from the model's own compute pool",
            ));
        }
        // the block: the last token, then noise; at the positions after the observed ones
        let mut ids = vec![d.keys.noise_token_id; bs];
        ids[0] = last;
        let pos: Vec<usize> = (ds.len()..ds.len() + bs).collect();
        let cx = self.ctx(None);
        let mut x = self.embed_streams(&ids)?; // [B, hc, H]
        d.experts.next_token(bs as u64);
        for s in 0..d.stages.len() {
            d.stage(self, &cx, s, &mut x, &ids, &pos, ds.window(s))?;
        }
        self.pool.install(|| d.head(self, &x, last, k))
    }
}

impl DSpark {
    /// The output side for the first k block rows of the streams x [B, hc, H]: hidden =
    /// hc_head(x), logits = head(norm(hidden)), then the Markov picks and confidences.
    fn head(&self, m: &Model, x: &[f32], last: u32, k: usize) -> Result<Draft> {
        let c = &m.cfg;
        let (h, hcm, v) = (c.hidden_size, c.hc_mult, c.vocab_size);
        let r = self.keys.markov_rank;
        // [k, H] before the norm (the confidence head's input), and normed (the head's)
        let mut hidden = vec![0f32; k * h];
        let mut normed = vec![0f32; k * h];
        for i in 0..k {
            let row = hc::head_collapse(
                &x[i * hcm * h..(i + 1) * hcm * h],
                &self.hc_head_fn,
                &self.hc_head_base,
                self.hc_head_scale,
                hcm,
                c.hc_eps,
                c.rms_norm_eps,
            );
            hidden[i * h..(i + 1) * h].copy_from_slice(&row);
            normed[i * h..(i + 1) * h].copy_from_slice(&row);
            ops::rms_norm(&mut normed[i * h..(i + 1) * h], &self.norm, c.rms_norm_eps);
        }
        let mut logits = m.head.forward_vec(&normed, k); // [k, V]
        let w1 = self.markov_w1.mat();
        let (mut prev, mut tokens, mut scores) =
            (last, Vec::with_capacity(k), Vec::with_capacity(k));
        for i in 0..k {
            // the Markov embedding of the previous token [r] and its bias [V]
            let me = embed_row(&w1, prev as usize, r)?;
            let bias = self.markov_w2.forward_vec(&me, 1);
            let li = &mut logits[i * v..(i + 1) * v];
            for (l, b) in li.iter_mut().zip(&bias) {
                *l += b;
            }
            let tok = argmax(li);
            let score = kernels::dot(&self.confidence[..h], &hidden[i * h..(i + 1) * h])
                + kernels::dot(&self.confidence[h..], &me);
            scores.push(score);
            tokens.push((tok, ops::sigmoid(score)));
            prev = tok;
        }
        Ok(Draft {
            tokens,
            logits,
            scores,
        })
    }
}

/// The index of the largest value, the first of equal ones (torch's argmax); NaN never wins.
fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    #[test]
    fn argmax_takes_the_first_of_equal_values_and_skips_nan() {
        assert_eq!(super::argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(super::argmax(&[f32::NAN, -1.0, 0.5]), 2);
        assert_eq!(super::argmax(&[f32::NEG_INFINITY]), 0);
    }
}
