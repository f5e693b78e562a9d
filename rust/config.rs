//! The model configuration, read from the checkpoint's `config.json` exactly as DeepSeek
//! publishes it (legacy keys: `compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
//! `rope_scaling`). Layer kinds come from `compress_ratios` the way DeepSeek's own code reads
//! them (0 → sliding window, 4 → compressed sparse attention with an indexer, any other m →
//! heavily compressed attention with ratio m); never the V4-Pro fallback pattern.
//!
//! This is the one validator: the engine loads with it, and Python's `v4flash.config` is a
//! thin wrapper over it (`_core.validate_config`), so both give the same verdict and the same
//! message (naming the key, what was expected and what was found). It is also the core's guard
//! that nothing downstream can index out of bounds.
//!
//! Every key the engine reads is written once, in the table of `model_config!` below: its
//! field, its reader (the rule its value must follow) and whether a session file's identity
//! holds it. Reading (`from_json`), the summary Python's `Config` is made of
//! (`validate_json`, `summary_keys`) and the session identity (`identity_values`) all come
//! from that table.

use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

mod drafter;
mod published;
mod read;
#[cfg(test)]
mod tests;

pub use drafter::{DSpark, Drafter, DSPARK_KEYS};
pub use published::{published_config, PUBLISHED_0731_CHANGES, PUBLISHED_CONFIG};
use read::{or, pos, pos_f32, pos_num, ratios, rope_scaling, short, token_id, uint};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Sliding-window attention only.
    Sliding,
    /// Compressed sparse attention: overlapping windows of `ratio` (4) plus the indexer.
    Csa { ratio: usize },
    /// Heavily compressed attention: non-overlapping windows of `ratio`, no indexer.
    Hca { ratio: usize },
}

impl LayerKind {
    /// The kind's name in the Python `Config.layer_types` (transformers' `layer_types` words).
    pub fn name(self) -> &'static str {
        match self {
            LayerKind::Sliding => "sliding_attention",
            LayerKind::Csa { .. } => "compressed_sparse_attention",
            LayerKind::Hca { .. } => "heavily_compressed_attention",
        }
    }

    pub fn ratio(self) -> usize {
        match self {
            LayerKind::Sliding => 0,
            LayerKind::Csa { ratio } | LayerKind::Hca { ratio } => ratio,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max_position_embeddings: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
}

/// Defines `ModelConfig` from its table of config.json keys (each: field, type, key, reader
/// and its arguments, whether a session file's identity holds it) and its derived fields, and
/// from the table alone: `KEYS`, the reading of every key in table order (`read_keys`), the
/// keys' part of the summary (`key_summary`) and the session identity (`identity_values`).
/// The derived fields are computed from the keys (`from_json`).
macro_rules! model_config {
    (
        $(#[$meta:meta])*
        pub struct ModelConfig {
            keys {
                $(
                    $(#[$kmeta:meta])*
                    $field:ident: $ty:ty = $key:literal, $read:ident($($arg:expr),*), $identity:literal;
                )*
            }
            derived {
                $(
                    $(#[$dmeta:meta])*
                    $dfield:ident: $dty:ty,
                )*
            }
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone)]
        pub struct ModelConfig {
            $($(#[$kmeta])* pub $field: $ty,)*
            $($(#[$dmeta])* pub $dfield: $dty,)*
        }

        /// The config.json keys the engine reads, in the table's order.
        pub const KEYS: &[&str] = &[$($key),*];

        /// Which of `KEYS` a session file's identity holds.
        const IDENTITY: &[bool] = &[$($identity),*];

        impl ModelConfig {
            /// Every key of the table, in its order, each by its own reader; the derived
            /// fields left empty.
            fn read_keys(o: &Map<String, Value>) -> Result<ModelConfig> {
                Ok(ModelConfig {
                    $($field: $read(o, $key $(, $arg)*)?,)*
                    $($dfield: <$dty>::default(),)*
                })
            }

            /// The table's keys as the summary holds them (`KeyValue::summary`); `o` is the
            /// config as written.
            fn key_summary(&self, o: &Map<String, Value>, s: &mut Map<String, Value>) {
                $(s.insert($key.into(), KeyValue::summary(&self.$field, o.get($key)));)*
            }

            /// The config values a session's state and logits depend on, under their
            /// config.json names, in the table's order (`KeyValue::identity`): what a session
            /// file records of its model (docs/architecture.md §7.1).
            pub fn identity_values(&self) -> Vec<(&'static str, Value)> {
                let all = [$(KeyValue::identity(&self.$field, self)),*];
                KEYS.iter()
                    .zip(IDENTITY)
                    .zip(all)
                    .filter(|((_, &id), _)| id)
                    .map(|((&k, _), v)| (k, v))
                    .collect()
            }
        }
    };
}

model_config! {
    /// A validated model configuration (`from_json`).
    pub struct ModelConfig {
        keys {
            // field: type = "config.json key", reader(arguments), in a session's identity;
            // read in this order (a config with several defects is refused for the first)
            vocab_size: usize = "vocab_size", pos(), true;
            hidden_size: usize = "hidden_size", pos(), true;
            num_layers: usize = "num_hidden_layers", pos(), true;
            /// As written: one entry per layer, then one per drafter stage.
            compress_ratios: Vec<usize> = "compress_ratios", ratios(), true;
            num_heads: usize = "num_attention_heads", pos(), true;
            head_dim: usize = "head_dim", pos(), true;
            rope_dim: usize = "qk_rope_head_dim", pos(), true;
            q_lora_rank: usize = "q_lora_rank", pos(), true;
            o_groups: usize = "o_groups", pos(), true;
            o_lora_rank: usize = "o_lora_rank", pos(), true;
            sliding_window: usize = "sliding_window", pos(), true;
            index_n_heads: usize = "index_n_heads", pos(), true;
            index_head_dim: usize = "index_head_dim", pos(), true;
            index_topk: usize = "index_topk", pos(), true;
            n_routed_experts: usize = "n_routed_experts", pos(), true;
            experts_per_tok: usize = "num_experts_per_tok", pos(), true;
            moe_inter: usize = "moe_intermediate_size", pos(), true;
            num_hash_layers: usize = "num_hash_layers", uint(), true;
            routed_scaling_factor: f32 = "routed_scaling_factor", pos_f32(), true;
            swiglu_limit: f32 = "swiglu_limit", pos_f32(), true;
            rope_theta: f64 = "rope_theta", pos_num(), true;
            compress_rope_theta: f64 = "compress_rope_theta", pos_num(), true;
            yarn: Option<Yarn> = "rope_scaling", rope_scaling(), true;
            hc_mult: usize = "hc_mult", pos(), true;
            hc_sinkhorn_iters: usize = "hc_sinkhorn_iters", pos(), true;
            hc_eps: f32 = "hc_eps", pos_f32(), true;
            rms_norm_eps: f32 = "rms_norm_eps", pos_f32(), true;
            n_shared_experts: usize = "n_shared_experts", or(uint, 1), false;
            /// `num_nextn_predict_layers` (0 when absent).
            nextn_layers: usize = "num_nextn_predict_layers", or(uint, 0), false;
            bos_token_id: u32 = "bos_token_id", token_id(0), false;
            eos_token_id: u32 = "eos_token_id", token_id(1), false;
            max_position_embeddings: usize = "max_position_embeddings", or(pos, 1 << 20), false;
        }
        derived {
            /// Per layer, from `compress_ratios`.
            layer_kinds: Vec<LayerKind>,
            /// The drafter the config describes (the engine does not run it yet).
            drafter: Drafter,
        }
    }
}

/// How a key's value appears in the summary and in a session file's identity.
trait KeyValue {
    /// `written`: the value as config.json has it.
    fn summary(&self, written: Option<&Value>) -> Value;
    fn identity(&self, c: &ModelConfig) -> Value;
}

macro_rules! plain_key_value {
    ($($t:ty),*) => {$(
        impl KeyValue for $t {
            fn summary(&self, _: Option<&Value>) -> Value {
                (*self).into()
            }
            fn identity(&self, _: &ModelConfig) -> Value {
                (*self).into()
            }
        }
    )*};
}

plain_key_value!(usize, u32, f64);

/// The engine computes with these in f32: the summary keeps the number as written, the
/// identity the f32's shortest decimal.
impl KeyValue for f32 {
    fn summary(&self, written: Option<&Value>) -> Value {
        written
            .and_then(Value::as_f64)
            .map_or_else(|| f32_value(*self), Value::from)
    }
    fn identity(&self, _: &ModelConfig) -> Value {
        f32_value(*self)
    }
}

/// `compress_ratios`: the summary as written, the identity the layers' ratios.
impl KeyValue for Vec<usize> {
    fn summary(&self, _: Option<&Value>) -> Value {
        self.clone().into()
    }
    fn identity(&self, c: &ModelConfig) -> Value {
        let ratios: Vec<usize> = c.layer_kinds.iter().map(|k| k.ratio()).collect();
        ratios.into()
    }
}

/// `rope_scaling` with its defaults filled in (the identity without its "type"), or null.
impl KeyValue for Option<Yarn> {
    fn summary(&self, _: Option<&Value>) -> Value {
        match self {
            None => Value::Null,
            Some(y) => serde_json::json!({
                "type": "yarn",
                "factor": y.factor,
                "original_max_position_embeddings": y.original_max_position_embeddings,
                "beta_fast": y.beta_fast,
                "beta_slow": y.beta_slow,
            }),
        }
    }
    fn identity(&self, _: &ModelConfig) -> Value {
        let mut v = self.summary(None);
        if let Some(o) = v.as_object_mut() {
            o.remove("type");
        }
        v
    }
}

/// A float the config stores as f32, as the JSON number of its shortest decimal.
pub(crate) fn f32_value(x: f32) -> Value {
    let d: f64 = format!("{x}").parse().unwrap_or(f64::from(x));
    Value::from(d)
}

/// The summary's entries derived from the others: one layer kind per layer
/// (`LayerKind::name`), and the drafter (null or `{"kind": "mtp" | "dspark", "blocks": n}`).
pub const DERIVED_KEYS: [&str; 2] = ["layer_types", "drafter"];

/// Every key of the summary (`validate_json`), in a fixed order: the table's `KEYS`, the
/// `dspark_*` keys, then the `DERIVED_KEYS`. Python's `Config` has one attribute per key.
pub fn summary_keys() -> Vec<&'static str> {
    KEYS.iter()
        .chain(&DSPARK_KEYS)
        .chain(&DERIVED_KEYS)
        .copied()
        .collect()
}

/// Validates a parsed config.json (`ModelConfig::from_json`) and returns the config with its
/// summary under config.json's names, which is what the Python `Config` holds
/// (`summary_keys`): every key of the table (the numbers exactly as written, although the
/// engine computes with some of them in f32; `compress_ratios` as written, the layers', then
/// the drafter's entries; `rope_scaling` with its defaults filled in, or null), the
/// `dspark_*` keys (null without a DSpark drafter) and the `DERIVED_KEYS`. `config_json` of
/// the summary validates to the same config.
pub fn validate_json(v: &Value) -> Result<(ModelConfig, Value)> {
    let c = ModelConfig::from_json(v)?;
    let o = v
        .as_object()
        .ok_or_else(|| Error::config("the top level must be a JSON object"))?;
    let mut s = Map::new();
    c.key_summary(o, &mut s);
    for k in DSPARK_KEYS {
        s.insert(k.into(), Value::Null);
    }
    let kinds: Vec<Value> = c.layer_kinds.iter().map(|k| k.name().into()).collect();
    let drafter = match &c.drafter {
        Drafter::None => Value::Null,
        Drafter::Mtp { blocks } => serde_json::json!({"kind": "mtp", "blocks": blocks}),
        Drafter::DSpark(d) => {
            let values: [Value; 4] = [
                d.block_size.into(),
                d.noise_token_id.into(),
                d.target_layer_ids.clone().into(),
                d.markov_rank.into(),
            ];
            for (k, v) in DSPARK_KEYS.iter().zip(values) {
                s.insert((*k).into(), v);
            }
            serde_json::json!({"kind": "dspark", "blocks": d.stages})
        }
    };
    let [layer_types, drafter_key] = DERIVED_KEYS;
    s.insert(layer_types.into(), kinds.into());
    s.insert(drafter_key.into(), drafter);
    Ok((c, Value::Object(s)))
}

/// A summary (`validate_json`) as a config.json the core accepts as it is, describing the
/// same model: the `DERIVED_KEYS` left out, the `dspark_*` keys only when they have values,
/// `"model_type": "deepseek_v4"` added.
pub fn config_json(summary: &Map<String, Value>) -> Value {
    let mut o: Map<String, Value> = summary
        .iter()
        .filter(|(k, v)| {
            let derived = DERIVED_KEYS.contains(&k.as_str());
            let unset_dspark = DSPARK_KEYS.contains(&k.as_str()) && v.is_null();
            !(derived || unset_dspark)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    o.insert("model_type".into(), "deepseek_v4".into());
    Value::Object(o)
}

/// Reads a config.json (a regular file of at most 64 MiB) as JSON, without validating it.
pub fn read_json(path: &Path) -> Result<Value> {
    let meta =
        std::fs::metadata(path).map_err(|e| Error::io(path, "config.json of the checkpoint", e))?;
    if !meta.is_file() {
        return Err(Error::config(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if meta.len() > 64 << 20 {
        return Err(Error::config(format!(
            "{} bytes is implausibly large for a config (limit {})",
            meta.len(),
            64u64 << 20
        )));
    }
    let text =
        std::fs::read(path).map_err(|e| Error::io(path, "config.json of the checkpoint", e))?;
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| Error::config(format!("not valid JSON ({e})")))?;
    Ok(v)
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        Self::from_json(&read_json(path)?)
    }

    pub fn from_json(v: &Value) -> Result<ModelConfig> {
        let o = v
            .as_object()
            .ok_or_else(|| Error::config("the top level must be a JSON object"))?;
        match o.get("model_type") {
            Some(Value::String(s)) if s == "deepseek_v4" => {}
            Some(Value::String(s)) if s == "deepseek_v41" => {
                return Err(Error::config(
                    "\"model_type\" is \"deepseek_v41\": this is DeepSeek V4.1, a different architecture \
                     (Engram memory, the model under \"text_config\") that v4flash does not support yet; \
                     v4flash runs DeepSeek V4 Flash (\"deepseek_v4\": DeepSeek-V4-Flash or DeepSeek-V4-Flash-0731)",
                ))
            }
            Some(other) => {
                return Err(Error::config(format!(
                    "\"model_type\" is {}, expected \"deepseek_v4\" (v4flash runs DeepSeek V4 Flash only)",
                    short(other)
                )))
            }
            None => return Err(Error::config("missing key \"model_type\" (expected \"deepseek_v4\")")),
        }
        let mut c = ModelConfig::read_keys(o)?;
        if c.compress_ratios.len() < c.num_layers {
            return Err(Error::config(format!(
                "\"compress_ratios\" has {} entries, expected at least num_hidden_layers ({}): \
                 one per layer (entries after those belong to the drafter)",
                c.compress_ratios.len(),
                c.num_layers
            )));
        }
        c.layer_kinds = c.compress_ratios[..c.num_layers]
            .iter()
            .map(|&m| match m {
                0 => LayerKind::Sliding,
                4 => LayerKind::Csa { ratio: 4 },
                m => LayerKind::Hca { ratio: m },
            })
            .collect();
        match o.get("scoring_func") {
            None => {}
            Some(Value::String(s)) if s == "sqrtsoftplus" => {}
            Some(s) => {
                return Err(Error::config(format!(
                    "\"scoring_func\" is {}, expected \"sqrtsoftplus\"",
                    short(s)
                )))
            }
        }
        if let Some(kvh) = o.get("num_key_value_heads") {
            if kvh.as_u64() != Some(1) {
                return Err(Error::config(format!(
                    "\"num_key_value_heads\" is {}, expected 1 (shared-KV attention)",
                    short(kvh)
                )));
            }
        }
        c.check()?;
        c.drafter = drafter::drafter(o, &c)?;
        Ok(c)
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::config(m));
        // Bounds first, so that the arithmetic below and in the loader cannot overflow.
        let dims = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("head_dim", self.head_dim),
            ("num_attention_heads", self.num_heads),
            ("q_lora_rank", self.q_lora_rank),
            ("o_lora_rank", self.o_lora_rank),
            ("moe_intermediate_size", self.moe_inter),
            ("n_routed_experts", self.n_routed_experts),
            ("index_n_heads", self.index_n_heads),
            ("index_head_dim", self.index_head_dim),
        ];
        for (k, d) in dims {
            if d > 1 << 24 {
                return bad(format!("\"{k}\" = {d} is implausibly large"));
            }
        }
        // the expert cache keys layers and experts as u16
        for (k, d) in [
            ("num_hidden_layers", self.num_layers),
            ("n_routed_experts", self.n_routed_experts),
        ] {
            if d > 1 << 16 {
                return bad(format!(
                    "\"{k}\" = {d} is implausibly large (at most 65536)"
                ));
            }
        }
        if self.rope_dim % 2 != 0
            || self.rope_dim > self.head_dim
            || self.rope_dim > self.index_head_dim
        {
            return bad(format!(
                "\"qk_rope_head_dim\" = {} must be even and at most head_dim ({}) and index_head_dim ({})",
                self.rope_dim, self.head_dim, self.index_head_dim
            ));
        }
        if self.num_heads % self.o_groups != 0 {
            return bad(format!(
                "\"num_attention_heads\" = {} must be divisible by \"o_groups\" = {}",
                self.num_heads, self.o_groups
            ));
        }
        if self.experts_per_tok > self.n_routed_experts {
            return bad(format!(
                "\"num_experts_per_tok\" = {} exceeds \"n_routed_experts\" = {}",
                self.experts_per_tok, self.n_routed_experts
            ));
        }
        if self.n_shared_experts != 1 {
            return bad(format!(
                "\"n_shared_experts\" = {}, only 1 is supported",
                self.n_shared_experts
            ));
        }
        for (k, d) in [
            ("hidden_size", self.hidden_size),
            ("moe_intermediate_size", self.moe_inter),
        ] {
            if d % 32 != 0 {
                return bad(format!(
                    "\"{k}\" = {d} must be a multiple of 32 (FP4 expert scale blocks)"
                ));
            }
        }
        if self.num_hash_layers > self.num_layers {
            return bad(format!(
                "\"num_hash_layers\" = {} exceeds num_hidden_layers = {}",
                self.num_hash_layers, self.num_layers
            ));
        }
        for (k, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
        ] {
            if id as usize >= self.vocab_size {
                return bad(format!(
                    "\"{k}\" = {id} is outside the vocabulary (vocab_size {})",
                    self.vocab_size
                ));
            }
        }
        for (k, d, max) in [
            ("hc_mult", self.hc_mult, 64),
            ("hc_sinkhorn_iters", self.hc_sinkhorn_iters, 10_000),
        ] {
            if d > max {
                return bad(format!(
                    "\"{k}\" = {d} is implausibly large (at most {max})"
                ));
            }
        }
        Ok(())
    }

    pub fn is_hash_layer(&self, layer: usize) -> bool {
        layer < self.num_hash_layers
    }
}
