//! The DeepSeek V4 Flash model: resident weights, the expert store, and the forward pass
//! over a chunk of tokens (docs/model.md §2–§5). Prefill and decode run the same code;
//! prefill just passes more tokens per call.

pub mod attention;
pub mod compressor;
pub mod generate;
pub mod hc;
pub mod layer_probe;
pub mod moe;
pub mod rope;
pub mod sample;
pub mod session;
pub mod weights;

use crate::checkpoint::Checkpoint;
use crate::config::{LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::kernels::{ops, Numerics};
use crate::plan::Plan;
use crate::scratch::{self, Buf};
use crate::store::{ExpertStore, StoreOptions};
use attention::{AttnWeights, Ctx, IndexerWeights};
use compressor::CompressorWeights;
use hc::HyperConn;
use moe::MoeWeights;
use rayon::prelude::*;
use rope::Rope;
use session::State;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use weights::{Linear, Loader};

pub use crate::options::LoadOptions;

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
}

/// Source of `Model::id`.
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

/// What a forward pass polls and tells as it goes: `cancel` (between layers and chunks) and
/// `report(tokens x layers done)` after each layer.
#[derive(Clone, Copy)]
struct Hooks<'a> {
    cancel: &'a (dyn Fn() -> bool + Sync),
    report: &'a (dyn Fn(u64) + Sync),
}

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

    /// A caller's token ids, checked against the vocabulary (`check_ids`), as the model's.
    pub fn token_ids(&self, ids: &[u64]) -> Result<Vec<u32>> {
        self.check_ids(ids)?;
        Ok(ids.iter().map(|&t| t as u32).collect())
    }

    /// Runs `ids` through the model, advancing `st`. On error (including cancellation) the
    /// state is restored to what it was before the call.
    pub fn forward(
        &self,
        st: &mut State,
        ids: &[u32],
        want: Want,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<f32>> {
        self.forward_reporting(st, ids, want, cancel, &|_| {})
    }

    /// `forward`, calling `report(done)` after each layer of each span, with done = the
    /// tokens x layers finished so far (of ids.len() x layers), and checking `cancel` right
    /// after: a caller can show prefill progress, or stop it from `report`.
    pub fn forward_reporting(
        &self,
        st: &mut State,
        ids: &[u32],
        want: Want,
        cancel: &(dyn Fn() -> bool + Sync),
        report: &(dyn Fn(u64) + Sync),
    ) -> Result<Vec<f32>> {
        let done = AtomicU64::new(0);
        let report = |n: u64| report(done.fetch_add(n, Ordering::Relaxed) + n);
        let report = &report;
        self.check_ids(ids)?;
        if st.pos() + ids.len() > self.ctx {
            return Err(Error::arg(format!(
                "the sequence would reach {} tokens ({} already in the session + {} new), more than the context of {} tokens (set a larger ctx / --ctx)",
                st.pos() + ids.len(),
                st.pos(),
                ids.len(),
                self.ctx
            )));
        }
        if st.owner() != self.id {
            return Err(Error::arg(
                "this session state belongs to another model (load the session from the model it was made with)",
            ));
        }
        // The forward pass runs on the calling thread and hands only compute to the pool:
        // it waits for experts, which a pool worker must never do (see store::slots).
        if self.pool.current_thread_index().is_some() {
            return Err(Error::arg(
                "internal: a forward pass was started from the model's own compute pool",
            ));
        }
        let snap = st.snapshot();
        let t0 = Instant::now();
        // the pass's working buffers are reused from layer to layer and chunk to chunk, up
        // to the plan's scratch and span bytes, and let go when it ends (`scratch`)
        let limit = self.plan.scratch_bytes.saturating_add(self.plan.span_bytes);
        let scope = scratch::global().scope(usize::try_from(limit).unwrap_or(usize::MAX));
        let r = self.forward_chunks(st, ids, want, Hooks { cancel, report });
        drop(scope);
        if r.is_err() {
            st.rollback(&snap)?;
        } else {
            let (tok, ns) = if ids.len() == 1 {
                (&self.counters.decode_tokens, &self.counters.decode_ns)
            } else {
                (&self.counters.prefill_tokens, &self.counters.prefill_ns)
            };
            tok.fetch_add(ids.len() as u64, Ordering::Relaxed);
            ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        r
    }

    fn forward_chunks(
        &self,
        st: &mut State,
        ids: &[u32],
        want: Want,
        h: Hooks,
    ) -> Result<Vec<f32>> {
        // spans as long as the plan allows (each reads its experts once per layer)
        let size = self.plan.prefill_span.max(self.plan.prefill_chunk).max(1);
        let mut out = Vec::new();
        let n_spans = ids.len().div_ceil(size);
        for (si, span) in ids.chunks(size).enumerate() {
            let w = match want {
                Want::All => Want::All,
                Want::Last if si + 1 == n_spans => Want::Last,
                _ => Want::None,
            };
            out.extend(self.forward_span(st, span, w, h)?);
        }
        Ok(out)
    }

    /// One span of tokens through every layer, layer by layer: a layer's attention runs over
    /// the span in chunks of `plan.prefill_chunk` (each advancing that layer's state in
    /// order), then its MoE over all of the span's tokens at once, so each routed expert is
    /// read at most once per layer per span. Every token's result is bit-identical to any
    /// other split (attention sees the same state; the kernels and the expert sum do not
    /// depend on the batch).
    fn forward_span(&self, st: &mut State, ids: &[u32], want: Want, h: Hooks) -> Result<Vec<f32>> {
        let Hooks { cancel, report } = h;
        let c = &self.cfg;
        let n = ids.len();
        // within the context: `forward_reporting` checked the whole call
        let pos0 = st.pos();
        let mut x = self.embed_streams(ids)?; // [n, hc, H]
        let cx = self.ctx(None);
        // The hash layers' experts are known from the token ids: start reading them now, in
        // layer order, at most half the cache in all. (Each layer's own share used to be
        // capped, not the sum: a long prompt's later hash layers then evicted the first
        // one's prefetches before it ran; 196 tokens on a 137-slot cache read 87 experts,
        // 10 % of the bytes, for nothing.) What does not fit is prefetched by the layer
        // before, once its last experts are pinned (`MoeWeights::forward`'s `next`).
        self.experts.next_token(n as u64);
        let mut budget = (self.experts.max_batch() / 2).max(1);
        for l in 0..c.num_hash_layers.min(c.num_layers) {
            if let Some(es) = self.layers[l].moe.hash_experts(ids, c.experts_per_tok) {
                let take = es.len().min(budget);
                self.experts.prefetch(l, &es[..take]);
                budget -= take;
            }
        }
        for l in 0..self.layers.len() {
            self.run_layer(&cx, l, &mut st.layers[l], &mut x, ids, pos0, cancel)?;
            report(n as u64);
            if cancel() {
                return Err(Error::Cancelled);
            }
        }
        st.tokens.extend_from_slice(ids);
        let rows: Vec<usize> = match want {
            Want::None => return Ok(Vec::new()),
            Want::Last => vec![n - 1],
            Want::All => (0..n).collect(),
        };
        Ok(self.head_logits(&x, &rows))
    }

    /// The logits [rows.len(), V] of the given tokens' final streams (x: [n, hc, H]).
    fn head_logits(&self, x: &[f32], rows: &[usize]) -> Vec<f32> {
        let c = &self.cfg;
        let (h, hcm) = (c.hidden_size, c.hc_mult);
        let mut hs = vec![0f32; rows.len() * h];
        for (i, &t) in rows.iter().enumerate() {
            let mut v = hc::head_collapse(
                &x[t * hcm * h..(t + 1) * hcm * h],
                &self.hc_head_fn,
                &self.hc_head_base,
                self.hc_head_scale,
                hcm,
                c.hc_eps,
                c.rms_norm_eps,
            );
            ops::rms_norm(&mut v, &self.norm, c.rms_norm_eps);
            hs[i * h..(i + 1) * h].copy_from_slice(&v);
        }
        let t0 = Instant::now();
        let logits = self.pool.install(|| self.head.forward_vec(&hs, rows.len()));
        self.counters
            .head_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        logits
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

    /// Layer `l` over n tokens at positions pos0.. with streams x [n, hc, H], in place:
    /// its attention chunk by chunk (X' = post ⊗ attn(norm(pre · X)) + combᵀ · X, each
    /// chunk advancing `lst`), with the MoE block's input side for the same tokens, then its
    /// MoE over all n tokens at once.
    #[allow(clippy::too_many_arguments)]
    fn run_layer(
        &self,
        cx: &Ctx,
        l: usize,
        lst: &mut attention::AttnState,
        x: &mut [f32],
        ids: &[u32],
        pos0: usize,
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<()> {
        let c = &self.cfg;
        let (h, hcm, n) = (c.hidden_size, c.hc_mult, ids.len());
        let layer = &self.layers[l];
        let pool = &self.pool;
        let chunk = self.plan.prefill_chunk.max(1);
        let stream = hcm * h;
        let mut ffn_mixes = Vec::with_capacity(n);
        // [n, H]
        let mut ffn_in = scratch::zeroed(n * h);
        // Look-ahead: a learned-routing layer's experts are known only after its attention.
        // Guess them from the layer's input (the FFN's mix, norm and router applied to the
        // pre-attention streams) and start reading them, so the reads overlap the attention.
        // A guess only warms the expert cache; no result depends on it.
        let guess = if self.lookahead {
            pool.install(|| {
                let (_, y) = self.hc_in(&layer.hc_ffn, &layer.ffn_norm, x, n);
                layer.moe.guess_experts(c, &y, n)
            })
        } else {
            None
        };
        if let Some(es) = &guess {
            let cap = (self.experts.max_batch() / 2).max(1);
            self.experts.prefetch(l, &es[..es.len().min(cap)]);
        }
        for a in (0..n).step_by(chunk) {
            if cancel() {
                return Err(Error::Cancelled);
            }
            let b = (a + chunk).min(n);
            let xs = &mut x[a * stream..b * stream];
            let (mixes, xin) = pool.install(|| {
                let (mixes, xin) = self.hc_in(&layer.hc_attn, &layer.attn_norm, xs, b - a);
                let t0 = Instant::now();
                let o = layer.attn.forward(cx, lst, &xin, b - a, pos0 + a);
                self.counters
                    .attn_ns
                    .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                hc_out(xs, &o, &mixes, hcm);
                self.hc_in(&layer.hc_ffn, &layer.ffn_norm, xs, b - a)
            });
            ffn_in[a * h..b * h].copy_from_slice(&xin);
            ffn_mixes.extend(mixes);
        }
        // the next layer's experts, where its token ids tell them (a hash layer)
        let next = self
            .layers
            .get(l + 1)
            .and_then(|nl| nl.moe.hash_experts(ids, c.experts_per_tok))
            .map(|es| (l + 1, es));
        let t0 = Instant::now();
        let (f, used) = layer.moe.forward(
            c,
            l,
            &self.experts,
            pool,
            self.numerics,
            (&ffn_in, ids, n),
            next.as_ref().map(|(nl, es)| (*nl, es.as_slice())),
        )?;
        self.counters
            .moe_ns
            .fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(es) = &guess {
            // count the guesses the layer used (`used` is ascending, `es` by votes)
            let hit = es.iter().filter(|e| used.binary_search(e).is_ok()).count();
            let cn = &self.counters;
            cn.guessed.fetch_add(es.len() as u64, Ordering::Relaxed);
            cn.guessed_used.fetch_add(hit as u64, Ordering::Relaxed);
            cn.guess_needed
                .fetch_add(used.len() as u64, Ordering::Relaxed);
        }
        pool.install(|| hc_out(x, &f, &ffn_mixes, hcm));
        Ok(())
    }

    /// The first layer's input streams [n, hc, H]: each id's embedding in every stream.
    fn embed_streams(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let (h, hcm) = (self.cfg.hidden_size, self.cfg.hc_mult);
        let mut x = vec![0f32; ids.len() * hcm * h];
        let emb = self.embed.mat();
        for (t, &id) in ids.iter().enumerate() {
            let row = embed_row(&emb, id as usize, h)?;
            for j in 0..hcm {
                x[(t * hcm + j) * h..(t * hcm + j + 1) * h].copy_from_slice(&row);
            }
        }
        Ok(x)
    }

    /// One hyper-connection's input side for n tokens: the mixes of x [n, hc, H] and the
    /// collapsed, RMS-normed block input [n, H]. Tokens in parallel (on the pool this runs
    /// in): each token's values come from its own streams alone, so they are the same
    /// whatever the thread count.
    fn hc_in(&self, hcw: &HyperConn, norm: &[f32], x: &[f32], n: usize) -> (Vec<hc::HcMix>, Buf) {
        let c = &self.cfg;
        let (h, hcm) = (c.hidden_size, c.hc_mult);
        let mixes: Vec<hc::HcMix> = x[..n * hcm * h]
            .par_chunks(hcm * h)
            .with_min_len(HC_MIN_TOKENS)
            .map(|xt| hcw.mix(xt, hcm, c.hc_sinkhorn_iters, c.hc_eps, c.rms_norm_eps))
            .collect();
        let mut xin = scratch::zeroed(n * h);
        xin.par_chunks_mut(h)
            .with_min_len(HC_MIN_TOKENS)
            .zip(mixes.par_iter())
            .for_each(|(dst, m)| {
                dst.copy_from_slice(&m.collapsed);
                ops::rms_norm(dst, norm, c.rms_norm_eps);
            });
        (mixes, xin)
    }
}

/// Fewest tokens per parallel piece of the hyper-connections' per-token work (`hc_in`,
/// `hc_out`; tens of microseconds per token at V4-Flash widths).
const HC_MIN_TOKENS: usize = 4;

/// The output side: writes each token's block output back into its streams, tokens in
/// parallel (each token's streams depend on its own values alone).
fn hc_out(x: &mut [f32], out: &[f32], mixes: &[hc::HcMix], hcm: usize) {
    let n = mixes.len();
    if n == 0 {
        return;
    }
    let h = out.len() / n;
    x[..n * hcm * h]
        .par_chunks_mut(hcm * h)
        .with_min_len(HC_MIN_TOKENS)
        .zip(out.par_chunks(h))
        .zip(mixes.par_iter())
        .for_each(|((xt, ot), m)| hc::write_back(xt, ot, m, hcm));
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
    let p = format!("layers.{l}");
    let hcw = |ld: &mut Loader, which: &str| -> Result<HyperConn> {
        Ok(HyperConn {
            fn_w: ld.floats(&format!("{p}.hc_{which}_fn"))?,
            base: ld.floats(&format!("{p}.hc_{which}_base"))?,
            scale: ld.floats(&format!("{p}.hc_{which}_scale"))?,
        })
    };
    let hc_attn = hcw(ld, "attn")?;
    let hc_ffn = hcw(ld, "ffn")?;
    let kind = c.layer_kinds[l];
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
    let hash = c.is_hash_layer(l);
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
mod tests_fixtures;
