//! The DeepSeek V4 Flash model: resident weights, the expert store, and the forward pass
//! over a chunk of tokens (docs/model.md §2–§5). Prefill and decode run the same code;
//! prefill just passes more tokens per call.

pub mod attention;
pub mod capture;
pub mod compressor;
pub mod dspark;
mod forward;
pub mod generate;
pub mod hc;
mod journal;
pub mod layer_probe;
pub mod moe;
pub mod rope;
pub mod sample;
pub mod session;
pub mod weights;

use crate::checkpoint::Checkpoint;
use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::kernels::Numerics;
use crate::plan::Plan;
use crate::store::{ExpertStore, StoreOptions};
use attention::{AttnWeights, Ctx, IndexerWeights};
use compressor::CompressorWeights;
use hc::HyperConn;
use moe::MoeWeights;
use rope::Rope;
use session::State;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use weights::{Linear, Loader};

pub use crate::options::LoadOptions;
pub use forward::Seq;

pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub hc_attn: HyperConn,
    pub hc_ffn: HyperConn,
    pub attn: AttnWeights,
    pub moe: MoeWeights,
}

#[derive(Default)]
pub struct Counters {
    pub prefill_tokens: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub prefill_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    /// Time in attention (incl. compressors and indexer), MoE (incl. waits for expert
    /// reads) and the final head, over all calls.
    pub attn_ns: AtomicU64,
    pub moe_ns: AtomicU64,
    pub head_ns: AtomicU64,
    /// Look-ahead of learned-routing layers (`run_layer`): experts guessed and prefetched,
    /// how many of them the layer then used, and how many distinct experts those layers used.
    pub guessed: AtomicU64,
    pub guessed_used: AtomicU64,
    pub guess_needed: AtomicU64,
    /// Speculative decoding over all generations (`generate::speculate`).
    pub speculation: std::sync::Mutex<crate::speculate::SpecStats>,
}

impl Counters {
    pub fn add_speculation(&self, s: &crate::speculate::SpecStats) {
        self.speculation
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(s);
    }

    pub fn speculation(&self) -> crate::speculate::SpecStats {
        *self.speculation.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Model {
    pub cfg: ModelConfig,
    pub ck: Arc<Checkpoint>,
    /// [V, H]
    embed: Linear,
    /// [V, H]
    head: Linear,
    /// [H]
    norm: Vec<f32>,
    /// [hc, hc·H]
    hc_head_fn: Vec<f32>,
    hc_head_base: Vec<f32>,
    hc_head_scale: f32,
    pub layers: Vec<Layer>,
    rope_main: Rope,
    rope_comp: Rope,
    pub experts: ExpertStore,
    pub plan: Plan,
    /// Numerics mode of every forward pass.
    pub numerics: Numerics,
    /// Whether learned-routing layers prefetch their guessed experts before their attention
    /// (`run_layer`): when the store has a cache to fill and `Tuning::lookahead` is on.
    pub lookahead: bool,
    /// The switches it was loaded with (`LoadOptions::tuning`).
    pub tuning: crate::tuning::Tuning,
    pub pool: rayon::ThreadPool,
    pub threads: usize,
    /// Maximum tokens per session.
    pub ctx: usize,
    pub resident_bytes: usize,
    pub counters: Counters,
    /// Unique per loaded model in this process: sessions and snapshots carry it, so a
    /// snapshot is only ever restored into a session of the model that made it.
    pub id: u64,
    /// The DSpark drafter, when loaded (`LoadOptions::drafter`).
    pub drafter: Option<dspark::DSpark>,
    /// Speculative decoding unless a generation asks otherwise (`LoadOptions::speculate`).
    pub speculate: crate::speculate::Mode,
    /// Steps its sessions together when it is loaded for several (`scheduler`), feeding
    /// `round_prefill` prompt tokens per round (`LoadOptions::round_prefill`).
    scheduler: std::sync::OnceLock<crate::schedule::Scheduler>,
    round_prefill: Option<usize>,
}

/// Source of `Model::id`.
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

/// What logits a forward call returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Want {
    None,
    Last,
    All,
}

impl Model {
    pub fn load(dir: &Path, opts: &LoadOptions) -> Result<Model> {
        Self::load_cancellable(dir, opts, &|| false)
    }

    /// Like `load`, checking `cancel` between layers (Ctrl-C during a long load).
    pub fn load_cancellable(
        dir: &Path,
        opts: &LoadOptions,
        cancel: &dyn Fn() -> bool,
    ) -> Result<Model> {
        let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
        let ck = Arc::new(Checkpoint::open(dir)?);
        let threads = opts.threads.map_or_else(crate::probe::cores, |t| t.get());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("v4flash-{i}"))
            .build()
            .map_err(|e| Error::arg(format!("cannot start {threads} threads: {e}")))?;
        let ctx = crate::plan::resolve_ctx(&cfg, opts.ctx)?;
        // the embedding first: a checkpoint of another layout is reported by its first tensor
        ck.tensor("embed.weight")?;
        let plan = crate::plan::plan_for(&ck, &cfg, ctx, opts)?;
        let c = &cfg;
        // Every resident tensor checked against the expected table (presence, dtype, shape)
        // before any is read; the embedding first, so a config that describes another model
        // is reported by the embedding's shape.
        let mut ld = Loader::new(&ck, crate::checkpoint::expected::dense_tensors(c))?;
        // The expert store next: its slots' pre-fault (first-touch zeroing, about 1 s per GB
        // on some VMs) then runs while the dense weights load, on the core the load leaves
        // idle, instead of in the first prefill's reads.
        let experts = ExpertStore::open(
            ck.clone(),
            c,
            &StoreOptions {
                slots: plan.slots,
                io: opts.io,
                policy: opts.policy,
                io_threads: opts.io_threads.get(),
                prefault: opts.tuning.prefault,
                io_uring: opts.tuning.io_uring,
            },
        )?;
        let lookahead = experts.can_prefetch() && opts.tuning.lookahead;
        let embed = ld.dense("embed")?;
        let head = ld.dense("head")?;
        let norm = ld.floats("norm.weight")?;
        let hc_head_fn = ld.floats("hc_head_fn")?;
        let hc_head_base = ld.floats("hc_head_base")?;
        let hc_head_scale = ld.scalar("hc_head_scale")?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            if cancel() {
                return Err(Error::Cancelled);
            }
            layers.push(load_layer(&mut ld, c, l)?);
        }
        let resident_bytes = ld.finish()?;
        let drafter = if opts.drafter {
            if cancel() {
                return Err(Error::Cancelled);
            }
            Some(dspark::DSpark::load(&ck, c, opts, plan.drafter_slots)?)
        } else {
            None
        };
        Ok(Model {
            rope_main: Rope::main(c),
            rope_comp: Rope::compress(c),
            cfg,
            ck,
            embed,
            head,
            norm,
            hc_head_fn,
            hc_head_base,
            hc_head_scale,
            layers,
            experts,
            plan,
            pool,
            threads,
            ctx,
            numerics: opts.numerics,
            lookahead,
            tuning: opts.tuning.clone(),
            resident_bytes,
            counters: Counters::default(),
            id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
            drafter,
            speculate: opts.speculate,
            scheduler: std::sync::OnceLock::new(),
            round_prefill: opts.round_prefill.map(|n| n.get()),
        })
    }

    /// Reads (without computing) `experts` of `layer` into the cache, in waves of at most the
    /// cache's slots, and returns the wall seconds: the store's cold-read throughput.
    pub fn read_experts(&self, layer: usize, experts: &[usize]) -> Result<f64> {
        let c = &self.cfg;
        if layer >= c.num_layers || experts.iter().any(|&e| e >= c.n_routed_experts) {
            return Err(Error::arg("layer or expert index out of range"));
        }
        let t0 = Instant::now();
        for wave in experts.chunks(self.experts.max_batch().max(1)) {
            let mut pins = self.experts.acquire(layer, wave)?;
            while !self.experts.wait_ready(&mut pins)?.is_empty() {}
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    pub fn new_state(&self) -> State {
        State::new(self.cfg.num_layers, self.id)
    }

    /// Checks token ids (of any width a caller has) against the vocabulary.
    pub fn check_ids<T: Copy + Into<u64>>(&self, ids: &[T]) -> Result<()> {
        let v = self.cfg.vocab_size as u64;
        if let Some(bad) = ids.iter().map(|&t| t.into()).find(|&t| t >= v) {
            return Err(Error::arg(format!(
                "token id {bad} is out of the vocabulary (0..{})",
                v - 1
            )));
        }
        Ok(())
    }

    /// The scheduler that steps this model's sessions together (`crate::schedule`) when it
    /// was loaded for several sessions (`LoadOptions::sessions` > 1); None for one.
    pub fn scheduler(&self) -> Option<&crate::schedule::Scheduler> {
        (self.plan.sessions > 1).then(|| {
            self.scheduler.get_or_init(|| {
                let n = self
                    .round_prefill
                    .unwrap_or_else(|| crate::schedule::default_round_prefill(&self.plan));
                crate::schedule::Scheduler::new(n)
            })
        })
    }

    /// A caller's token ids, checked against the vocabulary (`check_ids`), as the model's.
    pub fn token_ids(&self, ids: &[u64]) -> Result<Vec<u32>> {
        self.check_ids(ids)?;
        Ok(ids.iter().map(|&t| t as u32).collect())
    }
}

impl Model {
    /// The attention context of a forward pass; `sel_trace` collects the indexer's
    /// selections (tests and measurements only, `layer_probe`).
    fn ctx<'a>(&'a self, sel_trace: Option<&'a Mutex<Vec<Vec<usize>>>>) -> Ctx<'a> {
        Ctx {
            cfg: &self.cfg,
            rope_main: &self.rope_main,
            rope_comp: &self.rope_comp,
            numerics: self.numerics,
            sel_trace,
        }
    }
}

/// Row `id` of the embedding [V, H] as f32. The loader keeps it in BF16 or f32 (F16 is widened
/// at load), so another format is an internal error, never silent zeros.
fn embed_row(m: &crate::kernels::MatRef, id: usize, h: usize) -> Result<Vec<f32>> {
    match m.w {
        crate::kernels::Weights::Bf16(d) => Ok(d[id * h * 2..(id + 1) * h * 2]
            .chunks_exact(2)
            .map(|c| crate::dtype::bf16_to_f32(c[0], c[1]))
            .collect()),
        crate::kernels::Weights::F32(d) => Ok(d[id * h..(id + 1) * h].to_vec()),
        _ => Err(Error::arg(
            "internal: the embedding is held in a format other than BF16 or F32",
        )),
    }
}

/// Layer `l`'s resident weights; their shapes come from the expected table (`Loader`).
fn load_layer(ld: &mut Loader, c: &ModelConfig, l: usize) -> Result<Layer> {
    load_block(
        ld,
        c,
        &format!("layers.{l}"),
        c.layer_kinds[l],
        c.is_hash_layer(l),
    )
}

/// The resident weights of the block with checkpoint prefix `p` (a layer's `layers.N`, or a
/// drafter stage's `mtp.S`), of attention kind `kind`, hash-routed or not.
fn load_block(
    ld: &mut Loader,
    c: &ModelConfig,
    p: &str,
    kind: LayerKind,
    hash: bool,
) -> Result<Layer> {
    let hcw = |ld: &mut Loader, which: &str| -> Result<HyperConn> {
        Ok(HyperConn {
            fn_w: ld.floats(&format!("{p}.hc_{which}_fn"))?,
            base: ld.floats(&format!("{p}.hc_{which}_base"))?,
            scale: ld.floats(&format!("{p}.hc_{which}_scale"))?,
        })
    };
    let hc_attn = hcw(ld, "attn")?;
    let hc_ffn = hcw(ld, "ffn")?;
    let a = format!("{p}.attn");
    let comp = |ld: &mut Loader,
                pre: &str,
                ratio: usize,
                dim: usize,
                overlap: bool|
     -> Result<CompressorWeights> {
        Ok(CompressorWeights {
            ape: ld.floats(&format!("{pre}.ape"))?,
            norm: ld.floats(&format!("{pre}.norm.weight"))?,
            wkv: ld.dense(&format!("{pre}.wkv"))?,
            wgate: ld.dense(&format!("{pre}.wgate"))?,
            ratio,
            dim,
            overlap,
        })
    };
    let d = c.head_dim;
    let (compw, indexer) = match kind {
        LayerKind::Sliding => (None, None),
        LayerKind::Hca { ratio } => (
            Some(comp(ld, &format!("{a}.compressor"), ratio, d, false)?),
            None,
        ),
        LayerKind::Csa { ratio } => {
            let cw = comp(ld, &format!("{a}.compressor"), ratio, d, true)?;
            let ix = IndexerWeights {
                comp: comp(
                    ld,
                    &format!("{a}.indexer.compressor"),
                    ratio,
                    c.index_head_dim,
                    true,
                )?,
                wq_b: ld.fp8(&format!("{a}.indexer.wq_b"))?,
                weights_proj: ld.dense(&format!("{a}.indexer.weights_proj"))?,
            };
            (Some(cw), Some(ix))
        }
    };
    let attn = AttnWeights {
        kind,
        wq_a: ld.fp8(&format!("{a}.wq_a"))?,
        q_norm: ld.floats(&format!("{a}.q_norm.weight"))?,
        wq_b: ld.fp8(&format!("{a}.wq_b"))?,
        wkv: ld.fp8(&format!("{a}.wkv"))?,
        kv_norm: ld.floats(&format!("{a}.kv_norm.weight"))?,
        wo_a: ld.fp8(&format!("{a}.wo_a"))?,
        wo_b: ld.fp8(&format!("{a}.wo_b"))?,
        sinks: ld.floats(&format!("{a}.attn_sink"))?,
        comp: compw,
        indexer,
    };
    let f = format!("{p}.ffn");
    let moe = MoeWeights {
        gate: ld.dense(&format!("{f}.gate"))?,
        bias: if hash {
            None
        } else {
            Some(ld.floats(&format!("{f}.gate.bias"))?)
        },
        tid2eid: if hash {
            Some(ld.tid2eid(&format!("{f}.gate.tid2eid"), c.n_routed_experts)?)
        } else {
            None
        },
        sw1: ld.fp8(&format!("{f}.shared_experts.w1"))?,
        sw3: ld.fp8(&format!("{f}.shared_experts.w3"))?,
        sw2: ld.fp8(&format!("{f}.shared_experts.w2"))?,
    };
    Ok(Layer {
        attn_norm: ld.floats(&format!("{p}.attn_norm.weight"))?,
        ffn_norm: ld.floats(&format!("{p}.ffn_norm.weight"))?,
        hc_attn,
        hc_ffn,
        attn,
        moe,
    })
}

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests_batch;
#[cfg(test)]
mod tests_fixtures;
#[cfg(test)]
mod tests_journal;
