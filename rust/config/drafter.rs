//! The drafter a config describes besides the model: the first release's MTP block(s) or the
//! 0731 release's DSpark stages (`dspark_*` keys).

use super::read::{pos, short, uint};
use super::ModelConfig;
use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// The drafter a checkpoint carries besides the model, as its config describes it. Its tensors
/// are listed by `checkpoint::expected::drafter_tensors`; the engine reads none of them yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Drafter {
    #[default]
    None,
    /// The first release's multi-token-prediction block(s) `mtp.0..` (`e_proj`, `h_proj`,
    /// `enorm`, `hnorm`): `num_nextn_predict_layers` of them.
    Mtp { blocks: usize },
    /// The 0731 release's DSpark drafter (`dspark_*` keys): stages `mtp.0..`, one per
    /// `compress_ratios` entry after the layers.
    DSpark(DSpark),
}

impl Drafter {
    /// The name `info` and `doctor` print.
    pub fn name(&self) -> &'static str {
        match self {
            Drafter::None => "none",
            Drafter::Mtp { .. } => "MTP block",
            Drafter::DSpark(_) => "DSpark",
        }
    }

    /// Blocks (MTP) or stages (DSpark): `mtp.0` .. `mtp.{n-1}`.
    pub fn blocks(&self) -> usize {
        match self {
            Drafter::None => 0,
            Drafter::Mtp { blocks } => *blocks,
            Drafter::DSpark(d) => d.stages,
        }
    }
}

/// The `dspark_*` keys of a 0731 config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DSpark {
    /// Stages `mtp.0..stages`: the `compress_ratios` entries after the layers.
    pub stages: usize,
    /// `dspark_block_size`: the draft block, the last token followed by noise tokens.
    pub block_size: usize,
    /// `dspark_noise_token_id`: the token that fills the block's drafted positions.
    pub noise_token_id: u32,
    /// `dspark_target_layer_ids`: the layers whose hidden states feed `main_proj`.
    pub target_layer_ids: Vec<usize>,
    /// `dspark_markov_rank`: the Markov head's rank.
    pub markov_rank: usize,
}

/// The config keys of the DSpark drafter; they come together.
pub const DSPARK_KEYS: [&str; 4] = [
    "dspark_block_size",
    "dspark_noise_token_id",
    "dspark_target_layer_ids",
    "dspark_markov_rank",
];

/// The drafter of a validated config: DSpark when any `dspark_*` key is present (then all
/// four must be, valid, with at least one `compress_ratios` entry after the layers for its
/// stages), else the first release's MTP block(s) when `num_nextn_predict_layers` > 0.
pub(super) fn drafter(o: &Map<String, Value>, c: &ModelConfig) -> Result<Drafter> {
    // null counts as absent (the summary writes null for a config without a DSpark drafter)
    let has = |k: &str| o.get(k).is_some_and(|v| !v.is_null());
    let given: Vec<&str> = DSPARK_KEYS.iter().copied().filter(|k| has(k)).collect();
    if given.is_empty() {
        return Ok(match c.nextn_layers {
            0 => Drafter::None,
            n => Drafter::Mtp { blocks: n },
        });
    }
    if let Some(k) = DSPARK_KEYS.iter().find(|k| !has(k)) {
        return Err(Error::config(format!(
            "missing key \"{k}\" (a DSpark drafter's four dspark_* keys come together; found {})",
            given.join(", ")
        )));
    }
    let bad = |m: String| Err(Error::config(m));
    let block_size = uint(o, "dspark_block_size")?;
    if !(2..=1024).contains(&block_size) {
        return bad(format!(
            "\"dspark_block_size\" = {block_size} must be between 2 (the last token and one drafted position) and 1024"
        ));
    }
    let noise = uint(o, "dspark_noise_token_id")?;
    if noise >= c.vocab_size {
        return bad(format!(
            "\"dspark_noise_token_id\" = {noise} is outside the vocabulary (vocab_size {})",
            c.vocab_size
        ));
    }
    let markov_rank = pos(o, "dspark_markov_rank")?;
    if markov_rank > 1 << 16 {
        return bad(format!(
            "\"dspark_markov_rank\" = {markov_rank} is implausibly large (at most 65536)"
        ));
    }
    let ids = match o.get("dspark_target_layer_ids") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(v) => {
            return bad(format!(
                "\"dspark_target_layer_ids\" must be a non-empty list of layer numbers, found {}",
                short(v)
            ))
        }
        None => unreachable!("checked above"),
    };
    let mut target_layer_ids = Vec::with_capacity(ids.len());
    for (i, v) in ids.iter().enumerate() {
        match v.as_u64() {
            Some(l) if (l as usize) < c.num_layers && l <= u32::MAX as u64 => {
                if target_layer_ids.contains(&(l as usize)) {
                    return bad(format!(
                        "dspark_target_layer_ids[{i}] = {l} is listed twice"
                    ));
                }
                target_layer_ids.push(l as usize)
            }
            Some(l) => {
                return bad(format!(
                    "dspark_target_layer_ids[{i}] = {l} is not a layer of the model (num_hidden_layers {})",
                    c.num_layers
                ))
            }
            None => {
                return bad(format!(
                    "dspark_target_layer_ids[{i}] must be a layer number, found {}",
                    short(v)
                ))
            }
        }
    }
    let stages = c.compress_ratios.len() - c.num_layers;
    if stages == 0 {
        return bad(format!(
            "\"compress_ratios\" has {} entries, one per layer and none for the DSpark drafter's stages \
             that the dspark_* keys describe (expected num_hidden_layers + stages)",
            c.compress_ratios.len()
        ));
    }
    Ok(Drafter::DSpark(DSpark {
        stages,
        block_size,
        noise_token_id: noise as u32,
        target_layer_ids,
        markov_rank,
    }))
}
