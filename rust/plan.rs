//! The memory planner: before anything is loaded, split a RAM budget between the resident
//! dense weights, the session state for the context length, scratch buffers, a fixed process
//! overhead, and what is left for expert cache slots. A budget that cannot hold the dense part
//! plus a minimum working set fails at once, saying how much is needed.

use crate::checkpoint::sizes::TableBytes;
use crate::checkpoint::Checkpoint;
use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::options::LoadOptions;
use serde::Serialize;
use std::num::NonZeroUsize;
use std::path::Path;

/// Context length when none is given: the memory plan reserves session state for it.
pub const DEFAULT_CTX: usize = 65536;
/// Python, libraries, thread stacks and allocator slack, counted against the budget.
pub const OVERHEAD_BYTES: u64 = 400 << 20;
/// Tokens per prefill chunk (bounds the scratch buffers).
pub const PREFILL_CHUNK_MIN: usize = 256;
/// The most sessions `Plan::parallel` proposes (beyond 4, one more sequence per pass adds
/// little on a CPU: benches/README.md, "Many conversations").
pub const PARALLEL_DEFAULT_MAX: usize = 4;
/// The largest prefill chunk: the tokens whose attention runs in one pass, and what the
/// scratch buffers are sized for. Activations cost about 1 MB per token of chunk for V4 Flash
/// (next to 13 MB per expert), so the plan sizes the chunk from the budget: the largest power
/// of two up to this that takes at most a quarter of what would otherwise go to the expert
/// cache. Expert reads are bounded by the span (`PREFILL_SPAN_MAX`), not the chunk.
pub const PREFILL_CHUNK_MAX: usize = 4096;
/// The most prompt tokens prefilled layer by layer in one pass (a "span"). A span runs each
/// layer's attention over its tokens chunk by chunk, then that layer's MoE over all of the
/// span's tokens at once, so every routed expert is read at most once per layer per span,
/// whatever the cache size. It keeps the span's hidden streams and MoE buffers (about
/// 0.28 MB per token for V4 Flash), sized like the chunk: the largest power of two from the
/// chunk up to this, whose memory takes at most another quarter of the experts' room.
pub const PREFILL_SPAN_MAX: usize = 16384;

/// A memory plan; its fields are what `plan()` and `Model.plan()` report, under these names
/// (serde), with `cache_bytes` and `total_bytes` (`report::PlanReport`).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// The budget given (bytes), or None when sized from available memory.
    #[serde(rename = "budget_bytes")]
    pub budget: Option<u64>,
    /// Memory considered available when no budget was given.
    #[serde(rename = "available_bytes")]
    pub available: Option<u64>,
    /// Resident weights: everything but the routed experts and the drafter.
    pub dense_bytes: u64,
    /// The drafter's tensors in the checkpoint (`mtp.*`), loaded or not.
    pub drafter_bytes: u64,
    /// What a loaded drafter (`LoadOptions::drafter`) keeps resident, and its own expert
    /// cache: slots and bytes. All 0 when the drafter is not loaded; in the total.
    pub drafter_resident_bytes: u64,
    pub drafter_slots: usize,
    pub drafter_cache_bytes: u64,
    /// Of which the embedding and the output head.
    pub embed_head_bytes: u64,
    /// The state of `sessions` sessions at the full context, each with the copy of its
    /// windows a call keeps (one session's: `state_bytes / sessions`).
    pub state_bytes: u64,
    /// Sessions the plan holds state for (`LoadOptions::sessions`): what a server may run
    /// side by side, stepped together by `Model::forward_batch`.
    pub sessions: usize,
    /// The most sessions at `ctx` the budget could hold: with the smallest expert cache and
    /// prefill chunk that run (each session beyond `sessions` takes its state from the
    /// expert cache).
    pub max_sessions: usize,
    /// The sessions a server runs side by side when not told (`serve --parallel`): all of
    /// `PARALLEL_DEFAULT_MAX` when every routed expert fits in the cache, else as many as
    /// can take their state from a quarter of the cache (each one more session is one more
    /// sequence per pass, but its state would evict experts every sequence needs); at least
    /// 1, at most `max_sessions`.
    pub parallel: usize,
    pub scratch_bytes: u64,
    /// Tokens per prefill chunk (what `scratch_bytes` is sized for).
    pub prefill_chunk: usize,
    /// Tokens prefilled layer by layer in one pass (>= `prefill_chunk`; see
    /// `PREFILL_SPAN_MAX`), and the memory that takes beyond one chunk's scratch.
    pub prefill_span: usize,
    pub span_bytes: u64,
    pub overhead_bytes: u64,
    /// Bytes of one expert cache slot (an expert plus alignment padding).
    pub slot_bytes: u64,
    pub slots: usize,
    pub total_experts: usize,
    pub ctx: usize,
}

impl Plan {
    /// Saturating, although `plan()` refuses any plan whose sums overflow.
    pub fn cache_bytes(&self) -> u64 {
        (self.slots as u64).saturating_mul(self.slot_bytes)
    }
    /// Saturating, although `plan()` refuses any plan whose sums overflow.
    pub fn total_bytes(&self) -> u64 {
        self.dense_bytes
            .saturating_add(self.drafter_resident_bytes)
            .saturating_add(self.drafter_cache_bytes)
            .saturating_add(self.state_bytes)
            .saturating_add(self.scratch_bytes)
            .saturating_add(self.span_bytes)
            .saturating_add(self.overhead_bytes)
            .saturating_add(self.cache_bytes())
    }
}

/// The context length a model runs with: `ctx` when given (at least 1 token, at most the
/// model's `max_position_embeddings`), else min(max_position_embeddings, DEFAULT_CTX). The one
/// place this is decided: loading a model and planning one without loading both call it.
pub fn resolve_ctx(cfg: &ModelConfig, ctx: Option<NonZeroUsize>) -> Result<usize> {
    match ctx.map(NonZeroUsize::get) {
        Some(n) if n > cfg.max_position_embeddings => Err(Error::arg(format!(
            "ctx {n} exceeds the model's max_position_embeddings ({})",
            cfg.max_position_embeddings
        ))),
        Some(n) => Ok(n),
        None => Ok(cfg.max_position_embeddings.min(DEFAULT_CTX)),
    }
}

/// The plan for an open checkpoint at context `ctx` (`resolve_ctx`) with `opts`' budget and
/// expert cache: the slot size from its experts' layouts, then `plan`.
pub fn plan_for(ck: &Checkpoint, c: &ModelConfig, ctx: usize, opts: &LoadOptions) -> Result<Plan> {
    let slot = crate::store::slot_size(ck, c)?;
    let drafter = if opts.drafter {
        Some(DrafterNeed::of(ck, c)?)
    } else {
        None
    };
    plan(
        ck,
        c,
        ctx,
        opts.ram_bytes,
        opts.expert_cache_bytes,
        slot as u64,
        drafter,
        opts.sessions.get(),
    )
}

/// What a loaded DSpark drafter takes besides the model: its resident tensors (their bytes
/// in the checkpoint; the few float vectors widened to f32 add kilobytes) and its own expert
/// cache (`model::dspark::drafter_slots` slots of its experts' slot size).
#[derive(Debug, Clone, Copy, Default)]
pub struct DrafterNeed {
    pub resident_bytes: u64,
    pub slots: usize,
    pub slot_bytes: u64,
}

impl DrafterNeed {
    /// The need of `c`'s drafter in `ck`: an error when it has none to load (no DSpark keys),
    /// or when its tensors are not all there.
    pub fn of(ck: &Checkpoint, c: &ModelConfig) -> Result<DrafterNeed> {
        let d = crate::model::dspark::require(c)?;
        let mut resident = 0u64;
        for t in crate::checkpoint::expected::drafter_dense_tensors(c) {
            let info = ck
                .expect(&t.name, t.dtypes, &t.shape)
                .map_err(|e| crate::model::dspark::missing(ck, e))?;
            resident = resident.saturating_add(info.len);
        }
        let blocks = crate::model::dspark::blocks(c, d);
        let (_, slot) = crate::store::layout::plan_blocks(ck, c, &blocks, false)
            .map_err(|e| crate::model::dspark::missing(ck, e))?;
        Ok(DrafterNeed {
            resident_bytes: resident,
            slots: crate::model::dspark::drafter_slots(c, d),
            slot_bytes: slot as u64,
        })
    }

    fn cache_bytes(&self) -> Option<u64> {
        (self.slots as u64).checked_mul(self.slot_bytes)
    }
}

/// The plan for the checkpoint in `dir` with `opts`, without loading any weights (its config
/// and tensor table only): what `Model::load` would plan.
pub fn plan_checkpoint(dir: &Path, opts: &LoadOptions) -> Result<Plan> {
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let ck = Checkpoint::open(dir)?;
    let ctx = resolve_ctx(&cfg, opts.ctx)?;
    plan_for(&ck, &cfg, ctx, opts)
}

/// The error for a size that does not fit in u64 bytes: no budget can hold it.
fn beyond_u64(ctx: usize, what: &str) -> Error {
    Error::Memory(format!(
        "ctx {ctx} is too large for any memory budget: {what} would need more than 2^64 bytes; \
         lower ctx (--ctx)"
    ))
}

/// Session state bytes at `ctx` tokens (f32); `Error::Memory` when that exceeds u64.
pub fn state_bytes(c: &ModelConfig, ctx: usize) -> Result<u64> {
    state_elems(c, ctx)
        .and_then(|e| e.checked_mul(4))
        .ok_or_else(|| beyond_u64(ctx, "the session state alone"))
}

fn state_elems(c: &ModelConfig, ctx: usize) -> Option<u64> {
    let (d, id) = (c.head_dim as u64, c.index_head_dim as u64);
    let ctx = u64::try_from(ctx).ok()?;
    let win = (c.sliding_window.saturating_sub(1) as u64).checked_mul(d)?;
    let mut elems = 0u64;
    for k in &c.layer_kinds {
        // ring + the copy kept while a call runs
        elems = elems.checked_add(win.checked_mul(2)?)?;
        elems = elems.checked_add(match *k {
            LayerKind::Sliding => 0,
            LayerKind::Hca { ratio } => {
                let r = ratio as u64;
                // compressed entries + the pending buffer (2 × ratio rows)
                (ctx / r)
                    .checked_mul(d)?
                    .checked_add(r.checked_mul(2)?.checked_mul(d)?)?
            }
            LayerKind::Csa { ratio } => {
                let (r, w) = (ratio as u64, d.checked_add(id)?);
                // compressed entries + pending (4 × ratio) + overlap halves (2 × ratio)
                (ctx / r)
                    .checked_mul(w)?
                    .checked_add(r.checked_mul(6)?.checked_mul(w)?)?
            }
        })?;
    }
    Some(elems)
}

/// Scratch for one prefill chunk (activations, attention outputs, expert buffers) and the
/// logits of `sessions` sequences stepped together (a batch cuts its tokens into the same
/// chunks and spans, so its activations are those of a chunk whatever the sessions);
/// `Error::Memory` when that exceeds u64.
pub fn scratch_bytes(c: &ModelConfig, chunk: usize, sessions: usize) -> Result<u64> {
    scratch(c, chunk, sessions).ok_or_else(|| {
        Error::Memory(
            "the model's dimensions are too large for any memory budget: the scratch buffers \
             would need more than 2^64 bytes"
                .into(),
        )
    })
}

fn scratch(c: &ModelConfig, chunk: usize, sessions: usize) -> Option<u64> {
    let n = chunk as u64;
    let u = |x: usize| x as u64;
    let (h, qd) = (u(c.hidden_size), u(c.num_heads).checked_mul(u(c.head_dim))?);
    let terms = [
        qd.checked_mul(3)?,
        h.checked_mul(12)?,
        u(c.hc_mult).checked_mul(h)?.checked_mul(2)?,
        u(c.experts_per_tok).checked_mul(h)?.checked_mul(2)?,
        u(c.moe_inter).checked_mul(4)?,
        u(c.index_n_heads).checked_mul(u(c.index_head_dim))?,
        u(c.o_groups)
            .checked_mul(u(c.o_lora_rank))?
            .checked_mul(2)?,
    ];
    let per_tok = terms.iter().try_fold(0u64, |a, &t| a.checked_add(t))?;
    n.checked_mul(per_tok)?
        .checked_add(u(c.vocab_size).checked_mul(2)?.checked_mul(u(sessions))?)?
        .checked_mul(4)
}

/// Bytes per token of a prefill span beyond its chunk's scratch: the hyper-connection streams
/// [hc, H] and the MoE block's buffers for every token of the span (its input and mixes, the
/// routed and shared sums, the routed outputs of the k experts, and one expert's batch).
pub fn span_bytes_per_token(c: &ModelConfig) -> Option<u64> {
    let u = |x: usize| x as u64;
    let h = u(c.hidden_size);
    let floats = u(c.hc_mult)
        .checked_add(u(c.experts_per_tok))?
        .checked_add(6)?
        .checked_mul(h)?
        .checked_add(u(c.moe_inter).checked_mul(2)?)?;
    floats.checked_mul(4)
}

/// The plan for `sessions` sessions at context `ctx` within `ram_bytes` (or the memory
/// available), with an expert cache of `expert_cache_bytes` if given, else the rest.
pub fn plan(
    ck: &Checkpoint,
    c: &ModelConfig,
    ctx: usize,
    ram_bytes: Option<u64>,
    expert_cache_bytes: Option<u64>,
    slot_bytes: u64,
    drafter: Option<DrafterNeed>,
    sessions: usize,
) -> Result<Plan> {
    let sizes = TableBytes::of_checkpoint(ck);
    if sizes.overflow {
        return Err(Error::Memory(
            "the checkpoint's tensors add up to more than 2^64 bytes".into(),
        ));
    }
    let drafter = drafter.unwrap_or_default();
    let drafter_cache = drafter
        .cache_bytes()
        .ok_or_else(|| beyond_u64(ctx, "the drafter's expert cache"))?;
    // the drafter's resident tensors and cache count as dense: they are fixed once loaded
    let dense = sizes.dense_bytes;
    let dense_all = [drafter.resident_bytes, drafter_cache]
        .iter()
        .try_fold(dense, |a, &b| a.checked_add(b))
        .ok_or_else(|| beyond_u64(ctx, "the dense weights and the drafter"))?;
    let total_experts = c.num_layers.saturating_mul(c.n_routed_experts);
    let sessions = sessions.max(1);
    let one = state_bytes(c, ctx)?;
    let state = one
        .checked_mul(sessions as u64)
        .ok_or_else(|| beyond_u64(ctx, "the sessions' state"))?;
    let scratch = scratch_bytes(c, PREFILL_CHUNK_MIN, sessions)?;
    let fixed = [state, scratch, OVERHEAD_BYTES]
        .iter()
        .try_fold(dense_all, |a, &b| a.checked_add(b))
        .ok_or_else(|| {
            beyond_u64(
                ctx,
                "the dense weights, session state, scratch and overhead together",
            )
        })?;
    let gb = |b: u64| b as f64 / 1e9;
    let min_slots = c.experts_per_tok;
    let min_slot_bytes = (min_slots as u64)
        .checked_mul(slot_bytes)
        .ok_or_else(|| beyond_u64(ctx, "the minimum expert cache"))?;
    let need = fixed
        .checked_add(min_slot_bytes)
        .ok_or_else(|| beyond_u64(ctx, "the minimum working set"))?;
    let (budget, available, room) = match ram_bytes {
        Some(b) => {
            if b < need {
                return Err(Error::Memory(format!(
                    "a RAM budget of {:.2} GB cannot run this model: it needs at least {:.2} GB \
                     (dense weights{} {:.2} GB + session state for {}{ctx} tokens {:.2} GB + scratch {:.2} GB \
                     + overhead {:.2} GB + {min_slots} expert slots {:.2} GB); raise --ram or lower --ctx{}",
                    gb(b),
                    gb(need),
                    if drafter.slots > 0 { " and drafter" } else { "" },
                    gb(dense_all),
                    if sessions > 1 { format!("{sessions} sessions x ") } else { String::new() },
                    gb(state),
                    gb(scratch),
                    gb(OVERHEAD_BYTES),
                    gb(min_slot_bytes),
                    if sessions > 1 { " or the sessions" } else { "" }
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
    // How many sessions the memory could hold at the least: each one more adds its state
    // and its logits' scratch to what runs with one session and the smallest cache.
    let per_session = one.saturating_add(8 * c.vocab_size as u64);
    let base = fixed
        .saturating_sub(state.saturating_sub(one))
        .saturating_sub(scratch.saturating_sub(scratch_bytes(c, PREFILL_CHUNK_MIN, 1)?))
        .saturating_add(min_slot_bytes);
    let cap = match budget {
        Some(b) => b,
        None => fixed.saturating_add(room),
    };
    let max_sessions = match cap.checked_sub(base) {
        Some(spare) => 1 + usize::try_from(spare / per_session.max(1)).unwrap_or(usize::MAX - 1),
        None => 0,
    };
    // An explicit expert cache is claimed first (it must fit next to the smallest chunk).
    let claimed = match expert_cache_bytes {
        Some(cb) => {
            let want = usize::try_from(cb / slot_bytes.max(1))
                .unwrap_or(usize::MAX)
                .clamp(1, total_experts.max(1));
            let fit = usize::try_from(room / slot_bytes.max(1)).unwrap_or(usize::MAX);
            if budget.is_some() && want > fit {
                return Err(Error::Memory(format!(
                    "an expert cache of {:.2} GB ({want} experts) does not fit in the RAM budget of {:.2} GB, \
                     which leaves {:.2} GB for experts",
                    gb(cb),
                    gb(budget.unwrap_or(0)),
                    gb(room)
                )));
            }
            Some(want)
        }
        None => None,
    };
    // Then a larger prefill chunk, paid from what is left for experts (at most a quarter).
    let spare = match claimed {
        Some(w) => room.saturating_sub((w as u64).saturating_mul(slot_bytes)),
        None => room,
    };
    let (mut chunk, mut scratch, mut fixed, mut room) = (PREFILL_CHUNK_MIN, scratch, fixed, room);
    let mut spent = 0u64;
    while chunk < PREFILL_CHUNK_MAX && chunk < ctx {
        let Ok(s2) = scratch_bytes(c, chunk * 2, sessions) else {
            break;
        };
        let extra = s2 - scratch; // grows with the chunk
        if spent + extra > spare / 4 {
            break;
        }
        spent += extra;
        (chunk, scratch, fixed, room) = (chunk * 2, s2, fixed + extra, room - extra);
    }
    // Then a longer span (layer by layer over several chunks), from another quarter.
    let (mut span, mut span_bytes) = (chunk, 0u64);
    if let Some(per_tok) = span_bytes_per_token(c) {
        while span < PREFILL_SPAN_MAX && span < ctx {
            let Some(b) = per_tok.checked_mul((span * 2 - chunk) as u64) else {
                break;
            };
            if b > spare / 4 || b - span_bytes > room {
                break;
            }
            (fixed, room) = (fixed + (b - span_bytes), room - (b - span_bytes));
            (span, span_bytes) = (span * 2, b);
        }
    }
    let fit = usize::try_from(room / slot_bytes.max(1)).unwrap_or(usize::MAX);
    let mut slots = claimed.unwrap_or(fit.min(total_experts));
    if slots == 0 {
        slots = min_slots.min(total_experts).max(1);
    }
    // What a server runs side by side by default (`Plan::parallel`)
    let cache = (slots as u64).saturating_mul(slot_bytes);
    let parallel = if slots >= total_experts {
        PARALLEL_DEFAULT_MAX
    } else {
        let extra = cache / 4 / per_session.max(1);
        1 + usize::try_from(extra)
            .unwrap_or(usize::MAX)
            .min(PARALLEL_DEFAULT_MAX - 1)
    }
    .min(max_sessions.max(1));
    // the whole plan's sum must be representable too (no budget: nothing above bounded it)
    (slots as u64)
        .checked_mul(slot_bytes)
        .and_then(|cache| fixed.checked_add(cache))
        .ok_or_else(|| beyond_u64(ctx, "the plan's total"))?;
    Ok(Plan {
        budget,
        available,
        dense_bytes: dense,
        drafter_bytes: sizes.drafter_bytes,
        drafter_resident_bytes: drafter.resident_bytes,
        drafter_slots: drafter.slots,
        drafter_cache_bytes: drafter_cache,
        embed_head_bytes: sizes.embed_head_bytes,
        state_bytes: state,
        sessions,
        max_sessions,
        parallel,
        scratch_bytes: scratch,
        prefill_chunk: chunk,
        prefill_span: span,
        span_bytes,
        overhead_bytes: OVERHEAD_BYTES,
        slot_bytes,
        slots,
        total_experts,
        ctx,
    })
}

/// Memory the OS reports as available (Linux: MemAvailable); None elsewhere.
pub fn available_memory() -> Option<u64> {
    memory_info().1
}

/// (total, available) memory as the OS reports it (Linux: `MemTotal`, `MemAvailable` of
/// /proc/meminfo); None where it does not.
pub fn memory_info() -> (Option<u64>, Option<u64>) {
    #[cfg(target_os = "linux")]
    {
        match std::fs::read_to_string("/proc/meminfo") {
            Ok(s) => parse_meminfo(&s),
            Err(_) => (None, None),
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        (None, None)
    }
}

/// `MemTotal` and `MemAvailable` of a /proc/meminfo text, in bytes.
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            kb.checked_mul(1024)
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real() -> ModelConfig {
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
        ModelConfig::from_json(&v).unwrap()
    }

    fn fixture() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a")
    }

    #[test]
    fn state_grows_with_context() {
        let c = real();
        let a = state_bytes(&c, 4096).unwrap();
        let b = state_bytes(&c, 8192).unwrap();
        // 21 CSA layers × (512+128)/4 + 20 HCA × 512/128 = 3440 f32 per token
        assert_eq!(b - a, 4096 * 3440 * 4);
        assert!(scratch_bytes(&c, PREFILL_CHUNK_MIN, 1).unwrap() < 1 << 30);
    }

    #[test]
    fn state_beyond_u64_is_a_memory_error() {
        let c = real();
        // 3440 f32 per token: 2^58 tokens need about 2^69.7 bytes
        for ctx in [1usize << 58, 1 << 62, usize::MAX] {
            match state_bytes(&c, ctx) {
                Err(Error::Memory(m)) => {
                    assert!(m.contains(&format!("ctx {ctx} ")), "{m}");
                    assert!(m.contains("more than 2^64 bytes"), "{m}");
                }
                other => panic!("ctx {ctx}: expected Error::Memory, got {other:?}"),
            }
        }
        // the largest context that still fits is computed exactly
        let per_tok = 3440u64 * 4;
        let ok = (u64::MAX / per_tok / 2) as usize;
        assert!(state_bytes(&c, ok).is_ok());
    }

    #[test]
    fn plan_of_a_context_beyond_u64_is_a_memory_error() {
        let ck = Checkpoint::open(&fixture()).unwrap();
        let mut c = ModelConfig::from_file(&fixture().join("config.json")).unwrap();
        c.max_position_embeddings = 1 << 62;
        let slot = crate::store::slot_size(&ck, &c).unwrap() as u64;
        for ram in [Some(2_000_000_000u64), Some(u64::MAX), None] {
            for ctx in [1usize << 58, 1 << 62] {
                let ctx = resolve_ctx(&c, NonZeroUsize::new(ctx)).unwrap();
                match plan(&ck, &c, ctx, ram, None, slot, None, 1) {
                    Err(Error::Memory(m)) => {
                        assert!(m.contains("too large for any memory budget"), "{m}")
                    }
                    other => panic!("ram {ram:?} ctx {ctx}: expected Error::Memory, got {other:?}"),
                }
            }
        }
        // a large context that does not overflow is refused with the size it needs
        match plan(&ck, &c, 1 << 40, Some(2_000_000_000), None, slot, None, 1) {
            Err(Error::Memory(m)) => assert!(m.contains("it needs at least"), "{m}"),
            other => panic!("expected Error::Memory, got {other:?}"),
        }
        // and an ordinary one fits, with a total that adds up
        let p = plan(&ck, &c, 4096, Some(2_000_000_000), None, slot, None, 1).unwrap();
        assert!(p.total_bytes() <= 2_000_000_000);
        assert_eq!(
            p.total_bytes(),
            p.dense_bytes + p.state_bytes + p.scratch_bytes + p.overhead_bytes + p.cache_bytes()
        );
    }

    #[test]
    fn sessions_take_their_state_from_the_expert_cache_up_to_max_sessions() {
        let ck = Checkpoint::open(&fixture()).unwrap();
        let c = ModelConfig::from_file(&fixture().join("config.json")).unwrap();
        let slot = crate::store::slot_size(&ck, &c).unwrap() as u64;
        let (ctx, ram) = (1 << 20, Some(3_000_000_000u64));
        let one = plan(&ck, &c, ctx, ram, None, slot, None, 1).unwrap();
        let per = state_bytes(&c, ctx).unwrap();
        assert_eq!((one.sessions, one.state_bytes), (1, per));
        let max = one.max_sessions;
        assert!(max > 2, "{max} sessions of {per} bytes in 3 GB");
        let mut last_slots = one.slots;
        for n in [2, max] {
            let p = plan(&ck, &c, ctx, ram, None, slot, None, n).unwrap();
            assert_eq!((p.sessions, p.max_sessions), (n, max));
            assert_eq!(p.state_bytes, n as u64 * per);
            let k = p.prefill_chunk;
            assert_eq!(p.scratch_bytes, scratch_bytes(&c, k, n).unwrap());
            assert_eq!(
                scratch_bytes(&c, k, n).unwrap() - scratch_bytes(&c, k, 1).unwrap(),
                (n as u64 - 1) * 8 * c.vocab_size as u64,
                "each session's logits"
            );
            assert!(p.slots <= last_slots && p.total_bytes() <= 3_000_000_000);
            last_slots = p.slots;
        }
        match plan(&ck, &c, ctx, ram, None, slot, None, max + 1) {
            Err(Error::Memory(m)) => {
                assert!(m.contains(&format!("{} sessions x", max + 1)), "{m}");
                assert!(m.contains("or the sessions"), "{m}");
            }
            other => panic!("expected Error::Memory, got {other:?}"),
        }
        // the smallest budget that runs one session holds one
        let need = one.dense_bytes
            + per
            + scratch_bytes(&c, PREFILL_CHUNK_MIN, 1).unwrap()
            + OVERHEAD_BYTES
            + c.experts_per_tok as u64 * slot;
        let p = plan(&ck, &c, ctx, Some(need), None, slot, None, 1).unwrap();
        assert_eq!((p.max_sessions, p.slots), (1, c.experts_per_tok));
        assert!(plan(&ck, &c, ctx, Some(need - 1), None, slot, None, 1).is_err());
    }

    #[test]
    fn meminfo_is_read() {
        let text = "MemTotal:       32000000 kB\nMemFree:  100 kB\nMemAvailable:   24000000 kB\n";
        assert_eq!(
            parse_meminfo(text),
            (Some(32000000 * 1024), Some(24000000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotal: x kB\n"), (None, None));
        let (total, avail) = memory_info();
        if let (Some(t), Some(a)) = (total, avail) {
            assert!(a <= t);
        }
    }

    #[test]
    fn resolve_ctx_cases() {
        let mut c = real();
        c.max_position_embeddings = 1 << 20;
        let n = NonZeroUsize::new;
        assert_eq!(resolve_ctx(&c, None).unwrap(), DEFAULT_CTX);
        assert_eq!(resolve_ctx(&c, n(1)).unwrap(), 1);
        assert_eq!(resolve_ctx(&c, n(1 << 20)).unwrap(), 1 << 20);
        match resolve_ctx(&c, n((1 << 20) + 1)) {
            Err(Error::InvalidArgument(m)) => assert_eq!(
                m,
                "ctx 1048577 exceeds the model's max_position_embeddings (1048576)"
            ),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        match resolve_ctx(&c, n(usize::MAX)) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        // a model whose maximum is below the default runs at its maximum
        c.max_position_embeddings = 1000;
        assert_eq!(resolve_ctx(&c, None).unwrap(), 1000);
    }
}
