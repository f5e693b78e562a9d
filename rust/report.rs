//! What the engine reports about itself: a loaded model's counters (`Stats`, Python's
//! `Model.stats()`), a memory plan (`PlanReport`, `plan()` and `Model.plan()`) and the
//! switches in force (`TuningReport`, in both). Each is a struct whose field names are the keys
//! Python sees (serde), so no key is mapped by hand; `_core.pyi` describes them as TypedDicts.

use crate::kernels::Numerics;
use crate::model::Model;
use crate::plan::Plan;
use crate::tuning::Tuning;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// The switches in force (`tuning.rs`): the kernels' choices for this process and a model's
/// own switches.
#[derive(Debug, Clone, Serialize)]
pub struct TuningReport {
    /// The kernel tier (`kernels::tier_name`).
    pub kernels: &'static str,
    /// Whether fast and official numerics multiply with `vdpbf16ps` here.
    pub bf16_products: bool,
    /// How fast numerics multiplies FP8/FP4 here: "bf16", "int8" or "f32".
    pub fast_products: &'static str,
    /// `V4FLASH_FP8_BITS` as set: None when the CPU's rule decides (on for AMD).
    pub fp8_bits: Option<bool>,
    /// `V4FLASH_GEMM_X_AHEAD` as set: None when the CPU's rule decides (off for AMD).
    pub gemm_x_ahead: Option<bool>,
    /// The per-model switches (`LoadOptions::tuning`).
    pub lookahead: bool,
    pub prefault: bool,
    pub io_uring: bool,
}

impl TuningReport {
    /// The kernels' choices and `t`'s per-model switches.
    pub fn of(t: &Tuning) -> TuningReport {
        let process = Tuning::process();
        TuningReport {
            kernels: crate::kernels::tier_name(),
            bf16_products: crate::kernels::bf16_products(),
            fast_products: crate::kernels::fast_products().name(),
            fp8_bits: process.fp8_bits,
            gemm_x_ahead: process.gemm_x_ahead,
            lookahead: t.lookahead,
            prefault: t.prefault,
            io_uring: t.io_uring,
        }
    }
}

/// A memory plan as reported: its fields (`Plan`), the cache and total bytes, and the
/// switches of the load it is (or would be) for.
#[derive(Debug, Serialize)]
pub struct PlanReport<'a> {
    #[serde(flatten)]
    pub plan: &'a Plan,
    pub cache_bytes: u64,
    pub total_bytes: u64,
    pub tuning: TuningReport,
}

impl<'a> PlanReport<'a> {
    pub fn new(plan: &'a Plan, tuning: &Tuning) -> PlanReport<'a> {
        PlanReport {
            plan,
            cache_bytes: plan.cache_bytes(),
            total_bytes: plan.total_bytes(),
            tuning: TuningReport::of(tuning),
        }
    }
}

/// A loaded model's counters since it was loaded (times in seconds), its expert cache and
/// what it runs with.
#[derive(Debug, Serialize)]
pub struct Stats {
    pub prefill_tokens: u64,
    pub decode_tokens: u64,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub attn_s: f64,
    pub moe_s: f64,
    pub head_s: f64,
    /// Whether learned layers' experts are guessed and read during the attention.
    pub lookahead: bool,
    pub lookahead_guessed: u64,
    pub lookahead_guessed_used: u64,
    pub lookahead_needed: u64,
    pub expert_requests: u64,
    pub expert_hits: u64,
    pub expert_misses: u64,
    /// hits / requests, None before any request.
    pub expert_hit_rate: Option<f64>,
    pub expert_prefetches: u64,
    pub expert_prefetch_used: u64,
    pub expert_bytes_read: u64,
    pub expert_read_s: f64,
    pub expert_wait_s: f64,
    pub expert_slots: usize,
    /// The read engine that runs (`ExpertStore::engine`).
    pub io_engine: String,
    pub io_uring_interrupts: u64,
    pub direct_io: bool,
    pub kernel_tier: &'static str,
    pub numerics: &'static str,
    /// Whether this model's products run on `vdpbf16ps` (fast and official numerics only).
    pub bf16_products: bool,
    /// fast numerics' products ("bf16", "int8", "f32"), None in other modes.
    pub fast_products: Option<&'static str>,
    /// Time in the matrix kernels and their floating-point operations (all models).
    pub kernel_s: f64,
    pub kernel_gflop: f64,
    pub prefaulted_slots: usize,
    pub prefault_running: bool,
    pub warm_slots: usize,
    pub threads: usize,
    pub tuning: TuningReport,
    /// Speculative decoding: verifies, drafted and accepted tokens, plain steps taken while a
    /// drafter was on, seconds saved (negative: lost).
    pub speculation: crate::speculate::SpecStats,
    /// Continuous batching (`crate::schedule`), when the model was loaded for several
    /// sessions: rounds, requests stepped, the widest round, prompt tokens fed in parts.
    pub batching: Option<crate::schedule::Stats>,
}

impl Stats {
    pub fn of(m: &Model) -> Stats {
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let secs = |a: &AtomicU64| ld(a) as f64 * 1e-9;
        let c = &m.counters;
        let e = m.experts.counters();
        let (kns, kflops) = crate::kernels::kernel_counters();
        let requests = ld(&e.requests);
        let hits = ld(&e.hits);
        Stats {
            prefill_tokens: ld(&c.prefill_tokens),
            decode_tokens: ld(&c.decode_tokens),
            prefill_s: secs(&c.prefill_ns),
            decode_s: secs(&c.decode_ns),
            attn_s: secs(&c.attn_ns),
            moe_s: secs(&c.moe_ns),
            head_s: secs(&c.head_ns),
            lookahead: m.lookahead,
            lookahead_guessed: ld(&c.guessed),
            lookahead_guessed_used: ld(&c.guessed_used),
            lookahead_needed: ld(&c.guess_needed),
            expert_requests: requests,
            expert_hits: hits,
            expert_misses: ld(&e.misses),
            expert_hit_rate: (requests > 0).then(|| hits as f64 / requests as f64),
            expert_prefetches: ld(&e.prefetches),
            expert_prefetch_used: ld(&e.prefetch_used),
            expert_bytes_read: ld(&e.bytes_read),
            expert_read_s: secs(&e.read_ns),
            expert_wait_s: secs(&e.wait_ns),
            expert_slots: m.experts.n_slots,
            io_engine: m.experts.engine(),
            io_uring_interrupts: ld(&e.uring_interrupts),
            direct_io: m.experts.direct_io(),
            kernel_tier: crate::kernels::tier_name(),
            numerics: m.numerics.name(),
            bf16_products: matches!(m.numerics, Numerics::Fast | Numerics::Official)
                && crate::kernels::bf16_products(),
            fast_products: (m.numerics == Numerics::Fast)
                .then(|| crate::kernels::fast_products().name()),
            kernel_s: kns as f64 * 1e-9,
            kernel_gflop: kflops as f64 * 1e-9,
            prefaulted_slots: m.experts.prefaulted(),
            prefault_running: m.experts.prefault_running(),
            warm_slots: m.experts.warm_slots(),
            threads: m.threads,
            tuning: TuningReport::of(&m.tuning),
            speculation: c.speculation(),
            batching: m.scheduler().map(|s| s.stats()),
        }
    }
}
