//! The published `config.json` of both releases, every key: the model `bench --predict`,
//! `doctor` and `hub` size through the tensor table, and the tests' real config.

use crate::error::{Error, Result};
use serde_json::Value;

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
