//! A test and measurement hook: one layer alone, on input streams the caller chooses.
//!
//! Holding a numerics mode with rounding steps (`official`) to a reference token for token
//! through the whole model is not meaningful: a value that lands on a rounding boundary
//! flips, and the flip grows through the layers. Fed the reference's own input, one layer's
//! output shows whether the engine computes what the reference computes, with flips kept
//! local. The same hook reports the lightning indexer's selections, which the normal forward
//! pass does not expose.

use super::attention::Part;
use super::{Model, State};
use crate::config::LayerKind;
use crate::error::{Error, Result};
use std::sync::Mutex;

/// What `Model::layer_probe` returns.
pub struct LayerProbe {
    /// [n, hc, H] the layer's output streams.
    pub out: Vec<f32>,
    /// For a CSA layer, each token's indexer selection (ascending compressed-entry indices).
    pub selections: Option<Vec<Vec<usize>>>,
}

impl Model {
    /// Runs layer `l` over `ids` from position 0 on a fresh state, with input streams
    /// `x` [n, hc, H] (None: the embedded ids, the first layer's input). The ids matter
    /// for hash routing. Nothing is kept between calls; `cancel` is checked between chunks.
    pub fn layer_probe(
        &self,
        l: usize,
        ids: &[u32],
        x: Option<&[f32]>,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<LayerProbe> {
        let c = &self.cfg;
        if l >= c.num_layers {
            return Err(Error::arg(format!(
                "layer {l} out of range (the model has {} layers)",
                c.num_layers
            )));
        }
        self.check_ids(ids)?;
        if ids.is_empty() || ids.len() > self.ctx {
            return Err(Error::arg(format!(
                "layer_probe needs 1..={} ids, got {}",
                self.ctx,
                ids.len()
            )));
        }
        let width = c.hc_mult * c.hidden_size;
        let mut xs = match x {
            Some(x) if x.len() == ids.len() * width => x.to_vec(),
            Some(x) => {
                return Err(Error::arg(format!(
                    "layer_probe input has {} values, expected {} ids x {width}",
                    x.len(),
                    ids.len()
                )))
            }
            None => self.embed_streams(ids)?,
        };
        let trace = Mutex::new(Vec::new());
        let cx = self.ctx(Some(&trace));
        let mut st = State::new(c.num_layers, self.id);
        self.experts.next_token(ids.len() as u64);
        let mut parts = [Part {
            st: &mut st.layers[l],
            rows: 0..ids.len(),
            pos0: 0,
        }];
        self.run_layer(&cx, l, &mut parts, &mut xs, ids, cancel)?;
        let sel = trace
            .into_inner()
            .map_err(|_| Error::arg("internal: the indexer trace was poisoned"))?;
        Ok(LayerProbe {
            out: xs,
            selections: matches!(c.layer_kinds[l], LayerKind::Csa { .. }).then_some(sel),
        })
    }

    /// The logits [rows.len(), V] of final streams x [n, hc, H] (the output of the last
    /// layer, e.g. from `layer_probe`) at the given rows.
    pub fn probe_logits(&self, x: &[f32], rows: &[usize]) -> Result<Vec<f32>> {
        let width = self.cfg.hc_mult * self.cfg.hidden_size;
        if x.len() % width != 0 || rows.iter().any(|&r| r >= x.len() / width) {
            return Err(Error::arg(format!(
                "probe_logits: {} values are not whole [hc, H] rows, or a row is out of range",
                x.len()
            )));
        }
        Ok(self.head_logits(x, rows))
    }
}
