//! The DSpark drafter of the 0731 release (docs/model.md §8): three V4 blocks (`mtp.0..2`)
//! that draft `dspark_block_size` tokens in one pass from the target's hidden states, for
//! the target to verify.
//!
//! How it is used, per sequence:
//! 1. the target's forward pass captures, for every token it is fed, the streams entering
//!    each of `dspark_target_layer_ids`, averaged over the hc streams (`Model::forward_capture`
//!    with `DSpark::target_layers`): a row [T·H] per token;
//! 2. `Model::drafter_observe` turns those rows into every stage's window keys
//!    (`main_norm(main_proj(row))` through the stage's own key path, roped at the token's
//!    position) and appends them to the sequence's `DraftState`;
//! 3. `Model::draft` runs the block `[last, noise, …]` after the observed positions through
//!    the stages and drafts up to `block_size` tokens with their confidences; it changes no
//!    state;
//! 4. `DraftState::truncate` undoes observed positions (a rejected draft's), back to a
//!    bounded depth.
//!
//! Why a module of its own: the stages reuse the model's block code (hyper-connections,
//! attention's query/key/output paths, MoE) but their attention is not the model's (keys
//! from another source, no causal mask inside the block), their routed experts live in a
//! store of their own (drafting never evicts the model's experts), and their state is not a
//! session's.

mod heads;
mod stage;
mod state;
#[cfg(test)]
mod tests;
mod weights;

pub use state::DraftState;
pub use weights::DSpark;

use super::{Model, Want};
use crate::checkpoint::expected::drafter_block;
use crate::checkpoint::Checkpoint;
use crate::config::{Drafter, ModelConfig};
use crate::error::{Error, Result};
use crate::store::layout::Blocks;

/// Positions a `DraftState` keeps beyond the sliding window, so that `truncate` can undo
/// that many observed positions (a verify step adds at most `block_size` + 1).
pub const UNDO_POSITIONS: usize = 64;

/// The DSpark keys of `c`, or the error that says why there is no DSpark drafter to load.
pub fn require(c: &ModelConfig) -> Result<&crate::config::DSpark> {
    match &c.drafter {
        Drafter::DSpark(d) => Ok(d),
        Drafter::Mtp { blocks } => Err(Error::arg(format!(
            "this checkpoint has no DSpark drafter: it carries the first release's MTP block \
             ({blocks} block(s), mtp.0 …), which v4flash does not run; load it with drafter off, \
             or use the 0731 release"
        ))),
        Drafter::None => Err(Error::arg(
            "this checkpoint has no DSpark drafter (its config.json has no dspark_* keys); \
             load it with drafter off",
        )),
    }
}

/// A drafter tensor the checkpoint does not have (or not as expected), reported with the
/// drafter-only shards that could not be opened, if any.
pub fn missing(ck: &Checkpoint, e: Error) -> Error {
    let skipped = ck.skipped_shards();
    if skipped.is_empty() {
        return e;
    }
    let why: Vec<String> = skipped.iter().map(|(f, w)| format!("{f}: {w}")).collect();
    Error::checkpoint(
        skipped[0].0.clone(),
        format!(
            "the DSpark drafter cannot be loaded: {e} (drafter shards that could not be opened: {})",
            why.join("; ")
        ),
    )
}

/// The blocks of the drafter's expert store: its stages `mtp.0` ...
pub fn blocks(c: &ModelConfig, d: &crate::config::DSpark) -> Blocks {
    Blocks::new((0..d.stages).map(drafter_block).collect(), c)
}

/// The drafter's expert cache: every expert one draft can use (each stage, each block row its
/// own top-k), so that a draft never reads an expert twice and a draft that routes like the
/// previous one reads none; at most all of the stages' experts. V4 Flash: 3 × 5 × 6 = 90
/// slots, 1.2 GB. (With one stage's worth, 30, drafts on the synthetic checkpoint read 27
/// experts each even when repeated: the stages evict each other.)
pub fn drafter_slots(c: &ModelConfig, d: &crate::config::DSpark) -> usize {
    (d.stages * c.experts_per_tok * d.block_size)
        .min(d.stages * c.n_routed_experts)
        .max(1)
}

impl Model {
    /// The loaded drafter, or the error that says why there is none.
    pub fn drafter(&self) -> Result<&DSpark> {
        match &self.drafter {
            Some(d) => Ok(d),
            None => match require(&self.cfg) {
                Err(e) => Err(e),
                Ok(_) => Err(Error::arg(
                    "the DSpark drafter is not loaded: load the model with drafter=true",
                )),
            },
        }
    }

    /// A new, empty drafter state for one sequence.
    pub fn drafter_state(&self) -> Result<DraftState> {
        let c = &self.cfg;
        Ok(DraftState::new(
            self.drafter()?,
            c.sliding_window,
            c.head_dim,
            self.id,
        ))
    }

    /// Feeds `ids` to the target (`forward`), capturing the drafter's rows, and observes them
    /// into `ds` at the positions the target was at: the target's logits as `want`, bitwise
    /// those of `forward`. The target's state and `ds` must stand at the same position.
    pub fn forward_observe(
        &self,
        st: &mut super::session::State,
        ds: &mut DraftState,
        ids: &[u32],
        want: Want,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<f32>> {
        let d = self.drafter()?;
        if ds.len() != st.pos() {
            return Err(Error::arg(format!(
                "the drafter state is at position {} but the session at {}",
                ds.len(),
                st.pos()
            )));
        }
        let pos0 = st.pos();
        let (logits, rows) = self.forward_capture(st, ids, want, d.target_layers(), cancel)?;
        self.drafter_observe(ds, &rows, pos0)?;
        Ok(logits)
    }
}
