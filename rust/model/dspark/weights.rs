//! The drafter's weights: its stages' resident tensors (loaded through the model's loader,
//! against `checkpoint::expected::drafter_dense_tensors`) and its routed experts in an expert
//! store of its own.

use super::super::weights::{Linear, Loader};
use super::super::{load_block, Layer};
use crate::checkpoint::expected::{drafter_block, drafter_dense_tensors};
use crate::checkpoint::Checkpoint;
use crate::config::{LayerKind, ModelConfig};
use crate::error::Result;
use crate::options::LoadOptions;
use crate::store::{ExpertStore, StoreOptions};
use std::sync::Arc;

/// A loaded DSpark drafter.
pub struct DSpark {
    /// The config's `dspark_*` keys.
    pub keys: crate::config::DSpark,
    /// [H, T·H] FP8: the captured target rows in (`mtp.0.main_proj`).
    pub main_proj: Linear,
    /// [H] (`mtp.0.main_norm`)
    pub main_norm: Vec<f32>,
    /// The stages `mtp.0..`: V4 blocks with sliding-window attention and learned routing.
    pub stages: Vec<Layer>,
    /// [H] the last stage's output norm.
    pub norm: Vec<f32>,
    /// [hc, hc·H] the last stage's hyper-head.
    pub hc_head_fn: Vec<f32>,
    /// [hc]
    pub hc_head_base: Vec<f32>,
    pub hc_head_scale: f32,
    /// [V, r] BF16: row t is the Markov embedding of previous token t.
    pub markov_w1: Linear,
    /// [V, r] BF16: the Markov bias is markov_w2 · embedding.
    pub markov_w2: Linear,
    /// [H + r]: the confidence head's weights over [hidden, Markov embedding].
    pub confidence: Vec<f32>,
    /// The stages' routed experts ("layer" s = stage s).
    pub experts: ExpertStore,
    /// Bytes of the resident tensors.
    pub resident_bytes: usize,
}

impl DSpark {
    /// Loads the drafter of `c` from `ck` with an expert cache of `slots` slots (the plan's).
    pub fn load(
        ck: &Arc<Checkpoint>,
        c: &ModelConfig,
        opts: &LoadOptions,
        slots: usize,
    ) -> Result<DSpark> {
        let keys = super::require(c)?.clone();
        let mut ld =
            Loader::new(ck, drafter_dense_tensors(c)).map_err(|e| super::missing(ck, e))?;
        let experts = ExpertStore::open_blocks(
            ck.clone(),
            c,
            super::blocks(c, &keys),
            &StoreOptions {
                slots,
                io: opts.io,
                policy: opts.policy,
                io_threads: opts.io_threads.get(),
                prefault: opts.tuning.prefault,
                io_uring: opts.tuning.io_uring,
            },
        )?;
        let n = keys.stages;
        let mut stages = Vec::with_capacity(n);
        let (mut main_proj, mut main_norm) = (None, None);
        let mut last = None;
        for s in 0..n {
            let p = drafter_block(s);
            stages.push(load_block(&mut ld, c, &p, LayerKind::Sliding, false)?);
            if s == 0 {
                main_proj = Some(ld.fp8(&format!("{p}.main_proj"))?);
                main_norm = Some(ld.floats(&format!("{p}.main_norm.weight"))?);
            }
            if s + 1 == n {
                let norm = ld.floats(&format!("{p}.norm.weight"))?;
                let hc_fn = ld.floats(&format!("{p}.hc_head_fn"))?;
                let hc_base = ld.floats(&format!("{p}.hc_head_base"))?;
                let hc_scale = ld.scalar(&format!("{p}.hc_head_scale"))?;
                let w1 = ld.dense(&format!("{p}.markov_head.markov_w1"))?;
                let w2 = ld.dense(&format!("{p}.markov_head.markov_w2"))?;
                let conf = ld.floats(&format!("{p}.confidence_head.proj.weight"))?;
                last = Some((norm, hc_fn, hc_base, hc_scale, w1, w2, conf));
            }
        }
        let resident_bytes = ld.finish()?;
        // the expected table lists these for stage 0 and the last stage, which exist (the
        // config has at least one stage), so `finish` above failed if one was not read
        let (Some(main_proj), Some(main_norm), Some(last)) = (main_proj, main_norm, last) else {
            return Err(crate::error::Error::System(
                "internal: the DSpark drafter's table has no first or last stage".into(),
            ));
        };
        let (norm, hc_head_fn, hc_head_base, hc_head_scale, markov_w1, markov_w2, confidence) =
            last;
        Ok(DSpark {
            keys,
            main_proj,
            main_norm,
            stages,
            norm,
            hc_head_fn,
            hc_head_base,
            hc_head_scale,
            markov_w1,
            markov_w2,
            confidence,
            experts,
            resident_bytes,
        })
    }

    /// The target layers whose entering streams the drafter reads (`dspark_target_layer_ids`).
    pub fn target_layers(&self) -> &[usize] {
        &self.keys.target_layer_ids
    }

    /// The draft block's length (`dspark_block_size`): the most tokens one draft proposes.
    pub fn block_size(&self) -> usize {
        self.keys.block_size
    }
}
