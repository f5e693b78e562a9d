//! The model configuration, read from the checkpoint's `config.json` exactly as DeepSeek
//! publishes it (legacy keys: `compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
//! `rope_scaling`). Layer kinds come from `compress_ratios` the way DeepSeek's own code reads
//! them (0 → sliding window, 4 → compressed sparse attention with an indexer, any other m →
//! heavily compressed attention with ratio m); never the V4-Pro fallback pattern.
//!
//! The Python side validates the same file with user-facing messages first; this parser is
//! the core's own guard so that nothing downstream can index out of bounds.

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
}

fn get<'a>(o: &'a Map<String, Value>, k: &str) -> Result<&'a Value> {
    o.get(k)
        .ok_or_else(|| Error::config(format!("missing key \"{k}\"")))
}

fn uint(o: &Map<String, Value>, k: &str) -> Result<usize> {
    let v = get(o, k)?;
    let n = v.as_u64().ok_or_else(|| {
        Error::config(format!("\"{k}\" must be a non-negative integer, found {v}"))
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
        .ok_or_else(|| Error::config(format!("\"{k}\" must be a number, found {v}")))?;
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

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<ModelConfig> {
        let meta = std::fs::metadata(path)
            .map_err(|e| Error::io(path, "config.json of the checkpoint", e))?;
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
        Self::from_json(&v)
    }

    pub fn from_json(v: &Value) -> Result<ModelConfig> {
        let o = v
            .as_object()
            .ok_or_else(|| Error::config("the top level must be a JSON object"))?;
        match o.get("model_type").and_then(Value::as_str) {
            Some("deepseek_v4") => {}
            Some(other) => {
                return Err(Error::config(format!(
                    "\"model_type\" is \"{other}\", expected \"deepseek_v4\" (v4flash runs DeepSeek V4 Flash only)"
                )))
            }
            None => return Err(Error::config("missing key \"model_type\" (expected \"deepseek_v4\")")),
        }
        let num_layers = pos(o, "num_hidden_layers")?;
        let ratios = get(o, "compress_ratios")?
            .as_array()
            .ok_or_else(|| Error::config("\"compress_ratios\" must be a list of integers"))?;
        let nextn = match o.get("num_nextn_predict_layers") {
            None => 0,
            Some(_) => uint(o, "num_nextn_predict_layers")?,
        };
        if ratios.len() != num_layers && Some(ratios.len()) != num_layers.checked_add(nextn) {
            return Err(Error::config(format!(
                "\"compress_ratios\" has {} entries, expected num_hidden_layers ({num_layers}){}",
                ratios.len(),
                if nextn > 0 {
                    format!(
                        " or num_hidden_layers + num_nextn_predict_layers ({})",
                        num_layers.saturating_add(nextn)
                    )
                } else {
                    String::new()
                }
            )));
        }
        let mut layer_kinds = Vec::with_capacity(num_layers);
        for (i, r) in ratios.iter().take(num_layers).enumerate() {
            let m = r.as_u64().ok_or_else(|| {
                Error::config(format!(
                    "compress_ratios[{i}] must be a non-negative integer, found {r}"
                ))
            })?;
            layer_kinds.push(match m {
                0 => LayerKind::Sliding,
                4 => LayerKind::Csa { ratio: 4 },
                m if m <= 1 << 20 => LayerKind::Hca { ratio: m as usize },
                m => {
                    return Err(Error::config(format!(
                        "compress_ratios[{i}] = {m} is implausibly large"
                    )))
                }
            });
        }
        let yarn = match o.get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(Value::Object(rs)) => {
                let t = rs
                    .get("type")
                    .or_else(|| rs.get("rope_type"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if t != "yarn" {
                    return Err(Error::config(format!(
                        "\"rope_scaling.type\" is {t:?}, only \"yarn\" is supported"
                    )));
                }
                Some(Yarn {
                    factor: pos_num(rs, "factor").map_err(|e| prefix(e, "rope_scaling."))?,
                    original_max_position_embeddings: pos_num(
                        rs,
                        "original_max_position_embeddings",
                    )
                    .map_err(|e| prefix(e, "rope_scaling."))?,
                    beta_fast: rs.get("beta_fast").and_then(Value::as_f64).unwrap_or(32.0),
                    beta_slow: rs.get("beta_slow").and_then(Value::as_f64).unwrap_or(1.0),
                })
            }
            Some(other) => {
                return Err(Error::config(format!(
                    "\"rope_scaling\" must be an object, found {other}"
                )))
            }
        };
        if let Some(s) = o.get("scoring_func").and_then(Value::as_str) {
            if s != "sqrtsoftplus" {
                return Err(Error::config(format!(
                    "\"scoring_func\" is \"{s}\", expected \"sqrtsoftplus\""
                )));
            }
        }
        if let Some(kvh) = o.get("num_key_value_heads") {
            if kvh.as_u64() != Some(1) {
                return Err(Error::config(format!(
                    "\"num_key_value_heads\" is {kvh}, expected 1 (shared-KV attention)"
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
        };
        c.check()?;
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
                "num_attention_heads ({}) must be divisible by o_groups ({})",
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
        if self.hidden_size % 32 != 0 || self.moe_inter % 32 != 0 {
            return bad(format!(
                "hidden_size ({}) and moe_intermediate_size ({}) must be multiples of 32 (FP4 scale blocks)",
                self.hidden_size, self.moe_inter
            ));
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
        if self.hc_mult > 64 || self.hc_sinkhorn_iters > 10_000 {
            return bad(format!(
                "hc_mult ({}) or hc_sinkhorn_iters ({}) is implausible",
                self.hc_mult, self.hc_sinkhorn_iters
            ));
        }
        Ok(())
    }

    pub fn is_hash_layer(&self, layer: usize) -> bool {
        layer < self.num_hash_layers
    }
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
        serde_json::json!({
            "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
            "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
            "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "n_routed_experts": 256,
            "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2048,
            "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "sliding_window": 128,
            "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
                4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 0],
            "num_hash_layers": 3, "rope_theta": 10000, "compress_rope_theta": 160000,
            "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 65536, "type": "yarn"},
            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "index_n_heads": 64,
            "index_head_dim": 128, "index_topk": 512, "num_nextn_predict_layers": 1, "bos_token_id": 0,
            "eos_token_id": 1, "max_position_embeddings": 1048576, "scoring_func": "sqrtsoftplus"
        })
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
                "\"compress_ratios\" has 2 entries",
            ),
            (
                Box::new(|v| v["model_type"] = serde_json::json!("llama")),
                "expected \"deepseek_v4\"",
            ),
            (
                Box::new(|v| v["o_groups"] = serde_json::json!(7)),
                "divisible by o_groups",
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
                "multiples of 32",
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
}
