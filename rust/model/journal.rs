//! Keeping part of a pass (the speculative verify, docs/model.md §9): a pass feeds the pending
//! token and k drafts; when only the first few are right, the state is cut back to them
//! without running anything again. The window rows of the pass are still in the window, and
//! the compressors' logged projections are pushed again (the same entries, the same bits).

use super::attention::{comp_qdq, index_qdq};
use super::session::{Snapshot, State};
use super::Model;
use crate::error::{Error, Result};

impl Model {
    /// Tokens a journaled pass may feed and still be cut back (`State::cut_back`): the
    /// window's rows.
    pub fn journal_capacity(&self) -> usize {
        self.cfg.sliding_window.saturating_sub(1)
    }

    /// Cuts `st` back to the first `keep` tokens fed since `State::journal_begin` returned
    /// `before`, and closes its journal. On error `st` is unchanged.
    pub fn cut_back(&self, st: &mut State, before: &Snapshot, keep: usize) -> Result<()> {
        let c = &self.cfg;
        let mut missing = false;
        st.cut_back(
            before,
            keep,
            c.head_dim,
            self.journal_capacity(),
            |layer, indexer, cs, kv, gate, n| {
                let attn = &self.layers[layer].attn;
                let (cw, qdq) = if indexer {
                    match attn.indexer.as_ref() {
                        Some(ix) => (&ix.comp, index_qdq(self.numerics)),
                        None => {
                            missing = true;
                            return;
                        }
                    }
                } else {
                    match attn.comp.as_ref() {
                        Some(cw) => (cw, comp_qdq(self.numerics, c)),
                        None => {
                            missing = true;
                            return;
                        }
                    }
                };
                cw.push_projected(cs, kv, gate, n, &self.rope_comp, c.rms_norm_eps, qdq);
            },
        )?;
        if missing {
            return Err(Error::arg(
                "internal: a compressor logged projections in a layer that has none",
            ));
        }
        Ok(())
    }
}
