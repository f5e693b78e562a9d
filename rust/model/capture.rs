//! Opt-in capture, during the model's forward pass, of the hidden states entering some
//! layers: what a DSpark drafter reads of the target (`dspark`). Each token's streams entering
//! layer `l` [hc, H] are averaged over the hc streams into [H]; a token's row holds one such
//! block per captured layer, in the order the layers were given. The normal forward pass
//! takes no capture, and a capture only reads the streams, so logits are the same bits with
//! or without one.

use super::forward::Seq;
use super::session::State;
use super::{Model, Want};
use crate::error::{Error, Result};
use std::ops::Range;
use std::sync::Mutex;

/// The rows captured for a batch: per sequence, [fed tokens, layers.len() · H].
pub struct Capture {
    layers: Vec<usize>,
    width: usize,
    rows: Mutex<Vec<Vec<f32>>>,
}

impl Capture {
    /// A capture of `layers` (distinct, each < the model's layers) for sequences feeding
    /// `lens` tokens each, hidden size `h`.
    pub fn new(layers: &[usize], lens: &[usize], h: usize) -> Capture {
        let width = layers.len() * h;
        Capture {
            layers: layers.to_vec(),
            width,
            rows: Mutex::new(lens.iter().map(|&n| vec![0f32; n * width]).collect()),
        }
    }

    /// Records the streams x [n, hc, H] entering layer `l` for `rows`: (sequence, its rows of
    /// x, the index among its fed tokens of the first of them).
    pub(super) fn record(
        &self,
        l: usize,
        x: &[f32],
        hcm: usize,
        h: usize,
        rows: impl Iterator<Item = (usize, Range<usize>, usize)>,
    ) {
        let Some(j) = self.layers.iter().position(|&t| t == l) else {
            return;
        };
        let mut all = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let inv = hcm as f32;
        for (seq, r, first) in rows {
            let Some(dst) = all.get_mut(seq) else {
                continue;
            };
            for (i, t) in r.enumerate() {
                let xt = &x[t * hcm * h..(t + 1) * hcm * h];
                let at = (first + i) * self.width + j * h;
                let Some(out) = dst.get_mut(at..at + h) else {
                    continue;
                };
                out.copy_from_slice(&xt[..h]);
                for s in 1..hcm {
                    for (o, &v) in out.iter_mut().zip(&xt[s * h..(s + 1) * h]) {
                        *o += v;
                    }
                }
                for o in out.iter_mut() {
                    *o /= inv;
                }
            }
        }
    }

    /// The captured rows, per sequence of the batch.
    pub fn into_rows(self) -> Vec<Vec<f32>> {
        self.rows.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl Model {
    /// `forward`, also returning the rows captured for `layers` (`Capture`): [ids.len(),
    /// layers.len() · H]. The logits are the same bits as `forward`'s.
    pub fn forward_capture(
        &self,
        st: &mut State,
        ids: &[u32],
        want: Want,
        layers: &[usize],
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        if let Some(&l) = layers.iter().find(|&&l| l >= self.cfg.num_layers) {
            return Err(Error::arg(format!(
                "cannot capture layer {l}: the model has {} layers",
                self.cfg.num_layers
            )));
        }
        let cap = Capture::new(layers, &[ids.len()], self.cfg.hidden_size);
        let mut seqs = [Seq { st, ids, want }];
        let mut out = self.forward_batch_capturing(&mut seqs, cancel, &|_| {}, Some(&cap))?;
        let logits = out.pop().unwrap_or_default();
        let rows = cap.into_rows().pop().unwrap_or_default();
        Ok((logits, rows))
    }
}
