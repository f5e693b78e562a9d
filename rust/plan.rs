//! The memory planner: before anything is loaded, split a RAM budget between the resident
//! dense weights, the session state for the context length, scratch buffers, a fixed process
//! overhead, and what is left for expert cache slots. A budget that cannot hold the dense part
//! plus a minimum working set fails at once, saying how much is needed.

use crate::checkpoint::Checkpoint;
use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};

/// Python, libraries, thread stacks and allocator slack, counted against the budget.
pub const OVERHEAD_BYTES: u64 = 400 << 20;
/// Tokens per prefill chunk (bounds the scratch buffers).
pub const PREFILL_CHUNK: usize = 256;

#[derive(Debug, Clone)]
pub struct Plan {
    /// The budget given (bytes), or None when sized from available memory.
    pub budget: Option<u64>,
    /// Memory considered available when no budget was given.
    pub available: Option<u64>,
    /// Resident weights: everything but the routed experts (and the ignored MTP block).
    pub dense_bytes: u64,
    /// Of which the embedding and the output head.
    pub embed_head_bytes: u64,
    /// One session's state at the full context, plus one snapshot of its windows.
    pub state_bytes: u64,
    pub scratch_bytes: u64,
    pub overhead_bytes: u64,
    /// Bytes of one expert cache slot (an expert plus alignment padding).
    pub slot_bytes: u64,
    pub slots: usize,
    pub total_experts: usize,
    pub ctx: usize,
}

impl Plan {
    pub fn cache_bytes(&self) -> u64 {
        self.slots as u64 * self.slot_bytes
    }
    pub fn total_bytes(&self) -> u64 {
        self.dense_bytes
            + self.state_bytes
            + self.scratch_bytes
            + self.overhead_bytes
            + self.cache_bytes()
    }
}

fn is_routed_expert(name: &str) -> bool {
    name.contains(".ffn.experts.")
}

/// Session state bytes at `ctx` tokens (f32).
pub fn state_bytes(c: &ModelConfig, ctx: usize) -> u64 {
    let (d, id) = (c.head_dim as u64, c.index_head_dim as u64);
    let win = c.sliding_window.saturating_sub(1) as u64 * d;
    let mut elems = 0u64;
    for k in &c.layer_kinds {
        elems += 2 * win; // ring + the copy kept while a call runs
        elems += match *k {
            LayerKind::Sliding => 0,
            LayerKind::Hca { ratio } => (ctx / ratio) as u64 * d + 2 * ratio as u64 * d,
            LayerKind::Csa { ratio } => {
                (ctx / ratio) as u64 * (d + id)
                    + 4 * ratio as u64 * (d + id)
                    + 2 * ratio as u64 * (d + id)
            }
        };
    }
    elems * 4
}

/// Scratch for one prefill chunk (activations, attention outputs, expert buffers, logits).
pub fn scratch_bytes(c: &ModelConfig) -> u64 {
    let n = PREFILL_CHUNK as u64;
    let (h, qd) = (c.hidden_size as u64, (c.num_heads * c.head_dim) as u64);
    let per_tok = 3 * qd
        + 12 * h
        + c.hc_mult as u64 * h * 2
        + c.experts_per_tok as u64 * h * 2
        + 4 * c.moe_inter as u64
        + (c.index_n_heads * c.index_head_dim) as u64
        + (c.o_groups * c.o_lora_rank) as u64 * 2;
    (n * per_tok + 2 * c.vocab_size as u64) * 4
}

pub fn plan(
    ck: &Checkpoint,
    c: &ModelConfig,
    ctx: usize,
    ram_bytes: Option<u64>,
    expert_cache_bytes: Option<u64>,
    slot_bytes: u64,
) -> Result<Plan> {
    let mut dense = 0u64;
    let mut eh = 0u64;
    for name in ck.names() {
        if is_routed_expert(name) || name.starts_with("mtp.") {
            continue;
        }
        let t = ck.get(name).expect("name from the table");
        dense += t.len;
        if name == "embed.weight" || name == "head.weight" {
            eh += t.len;
        }
    }
    let total_experts = c.num_layers * c.n_routed_experts;
    let state = state_bytes(c, ctx);
    let scratch = scratch_bytes(c);
    let fixed = dense + state + scratch + OVERHEAD_BYTES;
    let gb = |b: u64| b as f64 / 1e9;
    let min_slots = c.experts_per_tok;
    let (budget, available, room) = match ram_bytes {
        Some(b) => {
            let need = fixed + min_slots as u64 * slot_bytes;
            if b < need {
                return Err(Error::Memory(format!(
                    "a RAM budget of {:.2} GB cannot run this model: it needs at least {:.2} GB \
                     (dense weights {:.2} GB + session state for {ctx} tokens {:.2} GB + scratch {:.2} GB \
                     + overhead {:.2} GB + {min_slots} expert slots {:.2} GB); raise --ram or lower --ctx",
                    gb(b),
                    gb(need),
                    gb(dense),
                    gb(state),
                    gb(scratch),
                    gb(OVERHEAD_BYTES),
                    gb(min_slots as u64 * slot_bytes)
                )));
            }
            (Some(b), None, b - fixed)
        }
        None => {
            let avail = available_memory();
            let room = match avail {
                Some(a) => {
                    let margin = (a / 10).max(1 << 30);
                    a.saturating_sub(margin).saturating_sub(fixed)
                }
                None => 8 << 30,
            };
            (None, avail, room)
        }
    };
    let mut slots = ((room / slot_bytes.max(1)) as usize).min(total_experts);
    if let Some(cb) = expert_cache_bytes {
        let want = ((cb / slot_bytes.max(1)) as usize).clamp(1, total_experts);
        if budget.is_some() && want > slots {
            return Err(Error::Memory(format!(
                "an expert cache of {:.2} GB ({want} experts) does not fit in the RAM budget of {:.2} GB, \
                 which leaves {:.2} GB for experts",
                gb(cb),
                gb(budget.unwrap_or(0)),
                gb(room)
            )));
        }
        slots = want;
    }
    if slots == 0 {
        slots = min_slots.min(total_experts).max(1);
    }
    Ok(Plan {
        budget,
        available,
        dense_bytes: dense,
        embed_head_bytes: eh,
        state_bytes: state,
        scratch_bytes: scratch,
        overhead_bytes: OVERHEAD_BYTES,
        slot_bytes,
        slots,
        total_experts,
        ctx,
    })
}

/// Memory the OS reports as available (Linux: MemAvailable); None elsewhere.
pub fn available_memory() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let s = std::fs::read_to_string("/proc/meminfo").ok()?;
        for line in s.lines() {
            if let Some(rest) = line.strip_prefix("MemAvailable:") {
                let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
                return Some(kb * 1024);
            }
        }
        None
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_grows_with_context() {
        let v = serde_json::json!({
            "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
            "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024,
            "o_groups": 8, "o_lora_rank": 1024, "n_routed_experts": 256, "num_experts_per_tok": 6,
            "moe_intermediate_size": 2048, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0,
            "sliding_window": 128, "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
            4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
            4, 128, 4, 128, 4, 0], "num_hash_layers": 3, "rope_theta": 10000, "compress_rope_theta": 160000,
            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "index_n_heads": 64,
            "index_head_dim": 128, "index_topk": 512, "num_nextn_predict_layers": 1
        });
        let c = ModelConfig::from_json(&v).unwrap();
        let a = state_bytes(&c, 4096);
        let b = state_bytes(&c, 8192);
        // 21 CSA layers × (512+128)/4 + 20 HCA × 512/128 = 3440 f32 per token
        assert_eq!(b - a, 4096 * 3440 * 4);
        assert!(scratch_bytes(&c) < 1 << 30);
    }
}
