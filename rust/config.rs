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

use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::path::Path;

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

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub experts_per_tok: usize,
    pub moe_inter: usize,
    pub routed_scaling_factor: f32,
    pub swiglu_limit: f32,
    pub sliding_window: usize,
    pub layer_kinds: Vec<LayerKind>,
    pub num_hash_layers: usize,
    pub rope_theta: f64,
    pub compress_rope_theta: f64,
    pub yarn: Option<Yarn>,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f32,
    pub rms_norm_eps: f32,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub bos_token_id: u32,
    pub eos_token_id: u32,
    pub max_position_embeddings: usize,
    /// `compress_ratios` as written: one entry per layer, then one per drafter stage.
    pub compress_ratios: Vec<usize>,
    /// `num_nextn_predict_layers` (0 when absent).
    pub nextn_layers: usize,
    /// The drafter the config describes (the engine does not run it yet).
    pub drafter: Drafter,
}

/// The drafter a checkpoint carries besides the model, as its config describes it. Its tensors
/// are listed by `checkpoint::expected::drafter_tensors`; the engine reads none of them yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drafter {
    None,
    /// The first release's multi-token-prediction block(s) `mtp.0..` (`e_proj`, `h_proj`,
    /// `enorm`, `hnorm`): `num_nextn_predict_layers` of them.
    Mtp {
        blocks: usize,
    },
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

/// A JSON value as it appears in a message: its text, cut after 60 characters.
fn short(v: &Value) -> String {
    let t = v.to_string();
    match t.char_indices().nth(60) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t,
    }
}

fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Result<&'a Value> {
    o.get(k)
        .ok_or_else(|| Error::config(format!("missing key \"{k}\"")))
}

fn uint(o: &Map<String, Value>, k: &str) -> Result<usize> {
    let v = get(o, k)?;
    let n = v.as_u64().ok_or_else(|| {
        Error::config(format!(
            "\"{k}\" must be a non-negative integer, found {}",
            short(v)
        ))
    })?;
    usize::try_from(n).map_err(|_| Error::config(format!("\"{k}\" = {n} is too large")))
}

fn pos(o: &Map<String, Value>, k: &str) -> Result<usize> {
    let n = uint(o, k)?;
    if n == 0 {
        return Err(Error::config(format!("\"{k}\" must be positive, found 0")));
    }
    Ok(n)
}

fn num(o: &Map<String, Value>, k: &str) -> Result<f64> {
    let v = get(o, k)?;
    let x = v
        .as_f64()
        .ok_or_else(|| Error::config(format!("\"{k}\" must be a number, found {}", short(v))))?;
    if !x.is_finite() {
        return Err(Error::config(format!("\"{k}\" must be finite, found {x}")));
    }
    Ok(x)
}

fn pos_num(o: &Map<String, Value>, k: &str) -> Result<f64> {
    let x = num(o, k)?;
    if x <= 0.0 {
        return Err(Error::config(format!(
            "\"{k}\" must be positive, found {x}"
        )));
    }
    Ok(x)
}

/// The published `config.json` of deepseek-ai/DeepSeek-V4-Flash, every key (docs/checkpoint.md
/// §2.1): the model `bench --predict` and `doctor` size through the tensor table
/// (`_core.PUBLISHED_CONFIG`), and the tests' real config.
pub const PUBLISHED_CONFIG: &str = r#"{
  "architectures": ["DeepseekV4ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 0,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
  "compress_rope_theta": 160000,
  "eos_token_id": 1,
  "expert_dtype": "fp4",
  "hc_eps": 1e-06,
  "hc_mult": 4,
  "hc_sinkhorn_iters": 20,
  "head_dim": 512,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "index_head_dim": 128,
  "index_n_heads": 64,
  "index_topk": 512,
  "initializer_range": 0.02,
  "max_position_embeddings": 1048576,
  "model_type": "deepseek_v4",
  "moe_intermediate_size": 2048,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "norm_topk_prob": true,
  "num_attention_heads": 64,
  "num_experts_per_tok": 6,
  "num_hash_layers": 3,
  "num_hidden_layers": 43,
  "num_key_value_heads": 1,
  "num_nextn_predict_layers": 1,
  "o_groups": 8,
  "o_lora_rank": 1024,
  "q_lora_rank": 1024,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536, "type": "yarn"},
  "rope_theta": 10000,
  "routed_scaling_factor": 1.5,
  "scoring_func": "sqrtsoftplus",
  "sliding_window": 128,
  "swiglu_limit": 10.0,
  "tie_word_embeddings": false,
  "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16",
  "transformers_version": "4.57.1",
  "use_cache": true,
  "vocab_size": 129280
}"#;

/// What the 0731 release (deepseek-ai/DeepSeek-V4-Flash-0731) changes in `PUBLISHED_CONFIG`:
/// one `compress_ratios` entry per DSpark drafter stage after the layers' (three, 0: sliding
/// window), and the four `dspark_*` keys. Every other key keeps its value.
pub const PUBLISHED_0731_CHANGES: &str = r#"{
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0, 0, 0],
  "dspark_block_size": 5,
  "dspark_noise_token_id": 128799,
  "dspark_target_layer_ids": [40, 41, 42],
  "dspark_markov_rank": 256
}"#;

/// The published config.json of a release: `"first"` (DeepSeek-V4-Flash) or `"0731"`.
pub fn published_config(release: &str) -> Result<Value> {
    let parse = |t: &str| -> Value {
        serde_json::from_str(t).expect("the published configs are valid JSON")
    };
    let mut v = parse(PUBLISHED_CONFIG);
    match release {
        "first" => {}
        "0731" => {
            if let (Some(o), Value::Object(changes)) =
                (v.as_object_mut(), parse(PUBLISHED_0731_CHANGES))
            {
                o.extend(changes);
            }
        }
        r => {
            return Err(Error::arg(format!(
                "unknown release {r:?} (expected \"first\" or \"0731\")"
            )))
        }
    }
    Ok(v)
}

/// Validates a parsed config.json (`ModelConfig::from_json`) and returns the config with its
/// summary under config.json's names, which is what the Python `Config` holds: every value the
/// engine reads (the numbers exactly as written, although the engine computes with some of
/// them in f32), `compress_ratios` as written (the layers', then the drafter's entries),
/// `num_nextn_predict_layers`, the `dspark_*` keys (null without a DSpark drafter), and three derived
/// entries: `layer_types` (`LayerKind::name`, one per layer), `drafter` (null or
/// `{"kind": "mtp" | "dspark", "blocks": n}`) and `rope_scaling` with its defaults filled in,
/// or null. With `"model_type": "deepseek_v4"` added and `layer_types` and `drafter` left
/// out, the summary validates to the same config.
pub fn validate_json(v: &Value) -> Result<(ModelConfig, Value)> {
    let c = ModelConfig::from_json(v)?;
    let o = v
        .as_object()
        .ok_or_else(|| Error::config("the top level must be a JSON object"))?;
    let mut s = Map::new();
    for (k, n) in [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("num_hidden_layers", c.num_layers),
        ("num_attention_heads", c.num_heads),
        ("head_dim", c.head_dim),
        ("qk_rope_head_dim", c.rope_dim),
        ("q_lora_rank", c.q_lora_rank),
        ("o_groups", c.o_groups),
        ("o_lora_rank", c.o_lora_rank),
        ("n_routed_experts", c.n_routed_experts),
        ("num_experts_per_tok", c.experts_per_tok),
        ("moe_intermediate_size", c.moe_inter),
        ("sliding_window", c.sliding_window),
        ("hc_mult", c.hc_mult),
        ("hc_sinkhorn_iters", c.hc_sinkhorn_iters),
        ("index_n_heads", c.index_n_heads),
        ("index_head_dim", c.index_head_dim),
        ("index_topk", c.index_topk),
        ("num_hash_layers", c.num_hash_layers),
        ("bos_token_id", c.bos_token_id as usize),
        ("eos_token_id", c.eos_token_id as usize),
        ("max_position_embeddings", c.max_position_embeddings),
    ] {
        s.insert(k.into(), n.into());
    }
    for k in [
        "routed_scaling_factor",
        "swiglu_limit",
        "rope_theta",
        "compress_rope_theta",
        "hc_eps",
        "rms_norm_eps",
    ] {
        s.insert(k.into(), num(o, k)?.into());
    }
    s.insert("compress_ratios".into(), c.compress_ratios.clone().into());
    let kinds: Vec<Value> = c.layer_kinds.iter().map(|k| k.name().into()).collect();
    s.insert("layer_types".into(), kinds.into());
    s.insert("num_nextn_predict_layers".into(), c.nextn_layers.into());
    for k in DSPARK_KEYS {
        s.insert(k.into(), Value::Null);
    }
    let drafter = match &c.drafter {
        Drafter::None => Value::Null,
        Drafter::Mtp { blocks } => serde_json::json!({"kind": "mtp", "blocks": blocks}),
        Drafter::DSpark(d) => {
            s.insert("dspark_block_size".into(), d.block_size.into());
            s.insert("dspark_noise_token_id".into(), d.noise_token_id.into());
            s.insert(
                "dspark_target_layer_ids".into(),
                d.target_layer_ids.clone().into(),
            );
            s.insert("dspark_markov_rank".into(), d.markov_rank.into());
            serde_json::json!({"kind": "dspark", "blocks": d.stages})
        }
    };
    s.insert("drafter".into(), drafter);
    let rope = match c.yarn {
        None => Value::Null,
        Some(y) => serde_json::json!({
            "type": "yarn",
            "factor": y.factor,
            "original_max_position_embeddings": y.original_max_position_embeddings,
            "beta_fast": y.beta_fast,
            "beta_slow": y.beta_slow,
        }),
    };
    s.insert("rope_scaling".into(), rope);
    Ok((c, Value::Object(s)))
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
        let num_layers = pos(o, "num_hidden_layers")?;
        let ratios = match o.get("compress_ratios") {
            None => {
                return Err(Error::config(
                    "missing key \"compress_ratios\" (the per-layer attention kinds; v4flash never guesses them)",
                ))
            }
            Some(Value::Array(a)) => a,
            Some(other) => {
                return Err(Error::config(format!(
                    "\"compress_ratios\" must be a list of integers, found {}",
                    short(other)
                )))
            }
        };
        let nextn = match o.get("num_nextn_predict_layers") {
            None => 0,
            Some(_) => uint(o, "num_nextn_predict_layers")?,
        };
        if ratios.len() < num_layers {
            return Err(Error::config(format!(
                "\"compress_ratios\" has {} entries, expected at least num_hidden_layers ({num_layers}): \
                 one per layer (entries after those belong to the drafter)",
                ratios.len()
            )));
        }
        let mut compress_ratios = Vec::with_capacity(ratios.len());
        for (i, r) in ratios.iter().enumerate() {
            let m = r.as_u64().ok_or_else(|| {
                Error::config(format!(
                    "compress_ratios[{i}] must be a non-negative integer, found {}",
                    short(r)
                ))
            })?;
            if m > 1 << 20 {
                return Err(Error::config(format!(
                    "compress_ratios[{i}] = {m} is implausibly large"
                )));
            }
            compress_ratios.push(m as usize);
        }
        let layer_kinds = compress_ratios[..num_layers]
            .iter()
            .map(|&m| match m {
                0 => LayerKind::Sliding,
                4 => LayerKind::Csa { ratio: 4 },
                m => LayerKind::Hca { ratio: m },
            })
            .collect();
        let yarn = match o.get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(Value::Object(rs)) => {
                match rs.get("type").or_else(|| rs.get("rope_type")) {
                    Some(Value::String(t)) if t == "yarn" => {}
                    Some(t) => {
                        return Err(Error::config(format!(
                            "\"rope_scaling.type\" is {}, only \"yarn\" is supported",
                            short(t)
                        )))
                    }
                    None => {
                        return Err(Error::config(
                            "\"rope_scaling.type\" is missing, only \"yarn\" is supported",
                        ))
                    }
                }
                let p = |e| prefix(e, "rope_scaling.");
                let opt = |k: &str, default: f64| match rs.get(k) {
                    None => Ok(default),
                    Some(_) => num(rs, k).map_err(p),
                };
                Some(Yarn {
                    factor: pos_num(rs, "factor").map_err(p)?,
                    original_max_position_embeddings: pos_num(
                        rs,
                        "original_max_position_embeddings",
                    )
                    .map_err(p)?,
                    beta_fast: opt("beta_fast", 32.0)?,
                    beta_slow: opt("beta_slow", 1.0)?,
                })
            }
            Some(other) => {
                return Err(Error::config(format!(
                    "\"rope_scaling\" must be an object, found {}",
                    short(other)
                )))
            }
        };
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
        let c = ModelConfig {
            vocab_size: pos(o, "vocab_size")?,
            hidden_size: pos(o, "hidden_size")?,
            num_layers,
            num_heads: pos(o, "num_attention_heads")?,
            head_dim: pos(o, "head_dim")?,
            rope_dim: pos(o, "qk_rope_head_dim")?,
            q_lora_rank: pos(o, "q_lora_rank")?,
            o_groups: pos(o, "o_groups")?,
            o_lora_rank: pos(o, "o_lora_rank")?,
            n_routed_experts: pos(o, "n_routed_experts")?,
            n_shared_experts: match o.get("n_shared_experts") {
                None => 1,
                Some(_) => uint(o, "n_shared_experts")?,
            },
            experts_per_tok: pos(o, "num_experts_per_tok")?,
            moe_inter: pos(o, "moe_intermediate_size")?,
            routed_scaling_factor: pos_num(o, "routed_scaling_factor")? as f32,
            swiglu_limit: pos_num(o, "swiglu_limit")? as f32,
            sliding_window: pos(o, "sliding_window")?,
            layer_kinds,
            num_hash_layers: uint(o, "num_hash_layers")?,
            rope_theta: pos_num(o, "rope_theta")?,
            compress_rope_theta: pos_num(o, "compress_rope_theta")?,
            yarn,
            hc_mult: pos(o, "hc_mult")?,
            hc_sinkhorn_iters: pos(o, "hc_sinkhorn_iters")?,
            hc_eps: pos_num(o, "hc_eps")? as f32,
            rms_norm_eps: pos_num(o, "rms_norm_eps")? as f32,
            index_n_heads: pos(o, "index_n_heads")?,
            index_head_dim: pos(o, "index_head_dim")?,
            index_topk: pos(o, "index_topk")?,
            bos_token_id: token_id(o, "bos_token_id", 0)?,
            eos_token_id: token_id(o, "eos_token_id", 1)?,
            max_position_embeddings: match o.get("max_position_embeddings") {
                None => 1 << 20,
                Some(_) => pos(o, "max_position_embeddings")?,
            },
            drafter: Drafter::None,
            compress_ratios,
            nextn_layers: nextn,
        };
        c.check()?;
        let drafter = drafter(o, &c)?;
        Ok(ModelConfig { drafter, ..c })
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

/// The drafter of a validated config: DSpark when any `dspark_*` key is present (then all
/// four must be, valid, with at least one `compress_ratios` entry after the layers for its
/// stages), else the first release's MTP block(s) when `num_nextn_predict_layers` > 0.
fn drafter(o: &Map<String, Value>, c: &ModelConfig) -> Result<Drafter> {
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

/// An optional token id (`default` when absent); must fit in u32 (checked against the
/// vocabulary later).
fn token_id(o: &Map<String, Value>, k: &str, default: u32) -> Result<u32> {
    if o.get(k).is_none() {
        return Ok(default);
    }
    let n = uint(o, k)?;
    u32::try_from(n).map_err(|_| Error::config(format!("\"{k}\" = {n} is too large")))
}

fn prefix(e: Error, p: &str) -> Error {
    match e {
        Error::Config(m) => Error::Config(m.replacen('"', &format!("\"{p}"), 1)),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> Value {
        serde_json::from_str(PUBLISHED_CONFIG).unwrap()
    }

    #[test]
    fn real_config_layer_kinds() {
        let c = ModelConfig::from_json(&real()).unwrap();
        assert_eq!(c.layer_kinds.len(), 43);
        assert_eq!(c.layer_kinds[0], LayerKind::Sliding);
        assert_eq!(c.layer_kinds[1], LayerKind::Sliding);
        for i in 2..43 {
            let want = if i % 2 == 0 {
                LayerKind::Csa { ratio: 4 }
            } else {
                LayerKind::Hca { ratio: 128 }
            };
            assert_eq!(c.layer_kinds[i], want, "layer {i}");
        }
        assert!(c.is_hash_layer(2) && !c.is_hash_layer(3));
        assert_eq!(c.yarn.unwrap().factor, 16.0);
    }

    #[test]
    fn bad_configs_name_the_key() {
        type Edit = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|v| drop(v.as_object_mut().unwrap().remove("hidden_size"))),
                "missing key \"hidden_size\"",
            ),
            (
                Box::new(|v| v["hidden_size"] = serde_json::json!(-4)),
                "\"hidden_size\" must be a non-negative integer",
            ),
            (
                Box::new(|v| v["head_dim"] = serde_json::json!(0)),
                "\"head_dim\" must be positive",
            ),
            (
                Box::new(|v| v["compress_ratios"] = serde_json::json!([0, 4])),
                "\"compress_ratios\" has 2 entries, expected at least num_hidden_layers (43)",
            ),
            (
                Box::new(|v| v["model_type"] = serde_json::json!("llama")),
                "expected \"deepseek_v4\"",
            ),
            (
                Box::new(|v| v["o_groups"] = serde_json::json!(7)),
                "\"num_attention_heads\" = 64 must be divisible by \"o_groups\" = 7",
            ),
            (
                Box::new(|v| v["num_experts_per_tok"] = serde_json::json!(300)),
                "exceeds \"n_routed_experts\"",
            ),
            (
                Box::new(|v| v["rope_scaling"]["factor"] = serde_json::json!("x")),
                "\"rope_scaling.factor\" must be a number",
            ),
            (
                Box::new(|v| v["eos_token_id"] = serde_json::json!(129280)),
                "\"eos_token_id\" = 129280 is outside the vocabulary",
            ),
            (
                Box::new(|v| v["bos_token_id"] = serde_json::json!([0])),
                "\"bos_token_id\" must be a non-negative integer",
            ),
            (
                Box::new(|v| v["hidden_size"] = serde_json::json!(4100)),
                "\"hidden_size\" = 4100 must be a multiple of 32",
            ),
            (
                Box::new(|v| v["moe_intermediate_size"] = serde_json::json!(2050)),
                "\"moe_intermediate_size\" = 2050 must be a multiple of 32",
            ),
            // a value of the wrong JSON type is refused, never skipped or defaulted
            (
                Box::new(|v| v["scoring_func"] = serde_json::json!(5)),
                "\"scoring_func\" is 5, expected \"sqrtsoftplus\"",
            ),
            (
                Box::new(|v| v["scoring_func"] = Value::Null),
                "\"scoring_func\" is null, expected \"sqrtsoftplus\"",
            ),
            (
                Box::new(|v| v["scoring_func"] = serde_json::json!("softmax")),
                "\"scoring_func\" is \"softmax\", expected \"sqrtsoftplus\"",
            ),
            (
                Box::new(|v| v["model_type"] = serde_json::json!(4)),
                "\"model_type\" is 4, expected \"deepseek_v4\"",
            ),
            (
                Box::new(|v| v["rope_scaling"]["beta_fast"] = serde_json::json!("32")),
                "\"rope_scaling.beta_fast\" must be a number, found \"32\"",
            ),
            (
                Box::new(|v| v["rope_scaling"]["type"] = serde_json::json!(["yarn"])),
                "\"rope_scaling.type\" is [\"yarn\"], only \"yarn\" is supported",
            ),
            (
                Box::new(|v| drop(v["rope_scaling"].as_object_mut().unwrap().remove("type"))),
                "\"rope_scaling.type\" is missing",
            ),
            (
                Box::new(|v| v["compress_ratios"] = serde_json::json!({"0": 4})),
                "\"compress_ratios\" must be a list of integers, found {\"0\":4}",
            ),
            (
                Box::new(|v| drop(v.as_object_mut().unwrap().remove("compress_ratios"))),
                "missing key \"compress_ratios\" (the per-layer attention kinds",
            ),
            (
                Box::new(|v| v["hc_mult"] = serde_json::json!(65)),
                "\"hc_mult\" = 65 is implausibly large (at most 64)",
            ),
            (
                Box::new(|v| v["vocab_size"] = serde_json::json!("x".repeat(200))),
                "\"vocab_size\" must be a non-negative integer, found \"xxxxxxxxxx",
            ),
            (
                Box::new(|v| v["num_hash_layers"] = serde_json::json!(44)),
                "\"num_hash_layers\" = 44 exceeds",
            ),
            (
                Box::new(|v| drop(v.as_object_mut().unwrap().remove("model_type"))),
                "missing key \"model_type\"",
            ),
        ];
        for (edit, want) in cases {
            let mut v = real();
            edit(&mut v);
            let e = ModelConfig::from_json(&v).unwrap_err().to_string();
            assert!(e.contains(want), "want {want:?} in {e:?}");
            assert!(e.starts_with("config.json"), "{e}");
        }
    }

    fn release_0731() -> Value {
        published_config("0731").unwrap()
    }

    #[test]
    fn the_0731_release_is_the_same_model_with_a_dspark_drafter() {
        let first = ModelConfig::from_json(&real()).unwrap();
        assert_eq!(first.drafter, Drafter::Mtp { blocks: 1 });
        let c = ModelConfig::from_json(&release_0731()).unwrap();
        assert_eq!(c.layer_kinds, first.layer_kinds);
        assert_eq!(c.compress_ratios.len(), 46);
        assert_eq!(c.nextn_layers, 1);
        assert_eq!(
            c.drafter,
            Drafter::DSpark(DSpark {
                stages: 3,
                block_size: 5,
                noise_token_id: 128799,
                target_layer_ids: vec![40, 41, 42],
                markov_rank: 256,
            })
        );
        assert_eq!(c.drafter.blocks(), 3);
        // every other key keeps its value
        let (a, b) = (real(), release_0731());
        for (k, v) in a.as_object().unwrap() {
            if k != "compress_ratios" {
                assert_eq!(&b[k], v, "{k}");
            }
        }
        assert!(published_config("v5").is_err());
        // no drafter: no num_nextn_predict_layers, one ratio per layer
        let mut v = real();
        v.as_object_mut()
            .unwrap()
            .remove("num_nextn_predict_layers");
        v["compress_ratios"] = serde_json::json!(v["compress_ratios"].as_array().unwrap()[..43]);
        assert_eq!(ModelConfig::from_json(&v).unwrap().drafter, Drafter::None);
        // more entries than layers + drafter are the drafter's (DeepSeek reads them by layer)
        let mut v = real();
        v["compress_ratios"].as_array_mut().unwrap().push(0.into());
        assert_eq!(
            ModelConfig::from_json(&v).unwrap().layer_kinds,
            first.layer_kinds
        );
    }

    #[test]
    fn bad_drafter_keys_and_other_releases_name_the_key() {
        type Edit = Box<dyn Fn(&mut Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|v| v["dspark_block_size"] = serde_json::json!(1)),
                "\"dspark_block_size\" = 1 must be between 2",
            ),
            (
                Box::new(|v| v["dspark_block_size"] = serde_json::json!("5")),
                "\"dspark_block_size\" must be a non-negative integer, found \"5\"",
            ),
            (
                Box::new(|v| v["dspark_noise_token_id"] = serde_json::json!(129280)),
                "\"dspark_noise_token_id\" = 129280 is outside the vocabulary (vocab_size 129280)",
            ),
            (
                Box::new(|v| v["dspark_markov_rank"] = serde_json::json!(0)),
                "\"dspark_markov_rank\" must be positive",
            ),
            (
                Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([40, 41, 43])),
                "dspark_target_layer_ids[2] = 43 is not a layer of the model (num_hidden_layers 43)",
            ),
            (
                Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([40, 40])),
                "dspark_target_layer_ids[1] = 40 is listed twice",
            ),
            (
                Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([40, "41"])),
                "dspark_target_layer_ids[1] must be a layer number, found \"41\"",
            ),
            (
                Box::new(|v| v["dspark_target_layer_ids"] = serde_json::json!([])),
                "\"dspark_target_layer_ids\" must be a non-empty list of layer numbers, found []",
            ),
            (
                Box::new(|v| drop(v.as_object_mut().unwrap().remove("dspark_markov_rank"))),
                "missing key \"dspark_markov_rank\" (a DSpark drafter's four dspark_* keys come together",
            ),
            (
                Box::new(|v| {
                    v["compress_ratios"] =
                        serde_json::json!(v["compress_ratios"].as_array().unwrap()[..43])
                }),
                "none for the DSpark drafter's stages",
            ),
            (
                Box::new(|v| {
                    v["compress_ratios"] =
                        serde_json::json!(v["compress_ratios"].as_array().unwrap()[..42])
                }),
                "\"compress_ratios\" has 42 entries, expected at least num_hidden_layers (43)",
            ),
            (
                Box::new(|v| v["compress_ratios"][44] = serde_json::json!(-1)),
                "compress_ratios[44] must be a non-negative integer, found -1",
            ),
            (
                Box::new(|v| {
                    v["model_type"] = serde_json::json!("deepseek_v41");
                    v["text_config"] = serde_json::json!({"hidden_size": 5120});
                }),
                "\"model_type\" is \"deepseek_v41\": this is DeepSeek V4.1",
            ),
        ];
        for (edit, want) in cases {
            let mut v = release_0731();
            edit(&mut v);
            let e = ModelConfig::from_json(&v).unwrap_err().to_string();
            assert!(e.contains(want), "want {want:?} in {e:?}");
            assert!(e.starts_with("config.json"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn the_summary_is_a_config_of_the_same_model() {
        let (c, sum) = validate_json(&real()).unwrap();
        assert_eq!(sum["compress_ratios"].as_array().unwrap().len(), 44);
        assert_eq!(
            sum["drafter"],
            serde_json::json!({"kind": "mtp", "blocks": 1})
        );
        let (c7, sum7) = validate_json(&release_0731()).unwrap();
        assert_eq!(
            sum7["drafter"],
            serde_json::json!({"kind": "dspark", "blocks": 3})
        );
        assert_eq!(
            sum7["dspark_target_layer_ids"],
            serde_json::json!([40, 41, 42])
        );
        let mut again = sum7.clone();
        again["model_type"] = "deepseek_v4".into();
        let (c7b, sum7b) = validate_json(&again).unwrap();
        assert_eq!((sum7b, c7b.drafter), (sum7, c7.drafter));
        assert_eq!(sum["layer_types"][2], "compressed_sparse_attention");
        assert_eq!(sum["layer_types"][3], "heavily_compressed_attention");
        assert_eq!(sum["layer_types"][42], "compressed_sparse_attention");
        // numbers as written, not rounded to f32
        assert_eq!(sum["rms_norm_eps"].as_f64(), Some(1e-6));
        assert_eq!(sum["rope_scaling"]["beta_fast"].as_f64(), Some(32.0));
        let mut again = sum.clone();
        again["model_type"] = "deepseek_v4".into();
        let (c2, sum2) = validate_json(&again).unwrap();
        assert_eq!(sum2, sum);
        assert_eq!(c2.layer_kinds, c.layer_kinds);
        assert_eq!(c2.max_position_embeddings, c.max_position_embeddings);
        // absent optional keys: defaults
        let mut v = real();
        let o = v.as_object_mut().unwrap();
        for k in [
            "rope_scaling",
            "bos_token_id",
            "max_position_embeddings",
            "scoring_func",
        ] {
            o.remove(k);
        }
        let (_, sum) = validate_json(&v).unwrap();
        assert_eq!(sum["rope_scaling"], Value::Null);
        assert_eq!(sum["bos_token_id"], 0);
        assert_eq!(sum["max_position_embeddings"], 1 << 20);
    }
}
