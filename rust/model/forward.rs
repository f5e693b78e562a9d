//! The forward pass (docs/architecture.md §6) over a batch of sequences: each with its own
//! state, its own tokens (one for a decode step, several for a prefill chunk or a speculative
//! verify) and the logits it wants, all in one pass. Every dense product runs once over all
//! the batch's tokens; the window, compressors, indexer and attention of each token read its
//! own sequence's state; each layer's MoE runs once over all the tokens (each routed expert
//! read at most once per layer per span, whatever the batch). `forward` for one sequence is
//! the batch of one.
//!
//! Why a sequence's logits are the same bits as when it runs alone, whatever the batch's
//! composition, order, positions and thread count: every product gives each token the same
//! FMA chain whatever the other tokens (docs/architecture.md §5.5), the hyper-connections,
//! norms and ropes are per token, attention reads only the token's own sequence, and the MoE
//! adds each token's experts in ascending expert order whatever groups they ran in (`moe.rs`).

use super::attention::{AttnState, Ctx, Part};
use super::session::{Snapshot, State};
use super::{hc, Model, Want};
use crate::error::{Error, Result};
use crate::kernels::ops;
use crate::scratch::{self, Buf};
use rayon::prelude::*;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// One sequence of a batched forward pass (`Model::forward_batch`).
pub struct Seq<'a> {
    /// Its state, advanced by `ids`.
    pub st: &'a mut State,
    /// The tokens to feed (may be empty: the sequence then takes no part).
    pub ids: &'a [u32],
    /// The logits it wants back: none, the last token's [V], or every token's [len, V].
    pub want: Want,
}

/// What a forward pass polls and tells as it goes: `cancel` (between layers and chunks) and
/// `report(tokens x layers done)` after each layer.
#[derive(Clone, Copy)]
struct Hooks<'a> {
    cancel: &'a (dyn Fn() -> bool + Sync),
    report: &'a (dyn Fn(u64) + Sync),
    /// Records the streams entering some layers (`Capture`; opt-in, None on the normal path).
    capture: Option<&'a super::capture::Capture>,
}

/// A sequence's share of a span: its index in the batch, its rows of the span's tokens, and
/// the range of its own ids they are.
struct Share {
    seq: usize,
    rows: Range<usize>,
    ids: Range<usize>,
}

impl Model {
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
    /// after: a caller can show prefill progress, or stop it from `report`. The batch of one
    /// sequence (`forward_batch_reporting`).
    pub fn forward_reporting(
        &self,
        st: &mut State,
        ids: &[u32],
        want: Want,
        cancel: &(dyn Fn() -> bool + Sync),
        report: &(dyn Fn(u64) + Sync),
    ) -> Result<Vec<f32>> {
        let mut seqs = [Seq { st, ids, want }];
        let mut out = self.forward_batch_reporting(&mut seqs, cancel, report)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Runs every sequence of `seqs` through the model in one pass, advancing each one's
    /// state by its ids; returns each one's logits as it asked (`Seq::want`; empty for
    /// `Want::None`), in the batch's order. Each sequence's logits are bit-identical to a
    /// `forward` of it alone. On error (including cancellation) every state is restored to
    /// what it was before the call.
    pub fn forward_batch(
        &self,
        seqs: &mut [Seq<'_>],
        cancel: &(dyn Fn() -> bool + Sync),
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_reporting(seqs, cancel, &|_| {})
    }

    /// `forward_batch`, calling `report(done)` after each layer of each span with done = the
    /// tokens x layers finished so far (of all the batch's tokens x layers), and checking
    /// `cancel` right after.
    pub fn forward_batch_reporting(
        &self,
        seqs: &mut [Seq<'_>],
        cancel: &(dyn Fn() -> bool + Sync),
        report: &(dyn Fn(u64) + Sync),
    ) -> Result<Vec<Vec<f32>>> {
        self.forward_batch_capturing(seqs, cancel, report, None)
    }

    /// `forward_batch_reporting`, recording into `capture` (when given) the streams entering
    /// its layers (`capture::Capture`): reading them changes no result.
    pub(super) fn forward_batch_capturing(
        &self,
        seqs: &mut [Seq<'_>],
        cancel: &(dyn Fn() -> bool + Sync),
        report: &(dyn Fn(u64) + Sync),
        capture: Option<&super::capture::Capture>,
    ) -> Result<Vec<Vec<f32>>> {
        let done = AtomicU64::new(0);
        let report = |n: u64| report(done.fetch_add(n, Ordering::Relaxed) + n);
        let report = &report;
        for (i, s) in seqs.iter().enumerate() {
            self.check_seq(s.st, s.ids).map_err(|e| match e {
                Error::InvalidArgument(m) if seqs.len() > 1 => {
                    Error::InvalidArgument(format!("sequence {i} of the batch: {m}"))
                }
                e => e,
            })?;
        }
        // The forward pass runs on the calling thread and hands only compute to the pool:
        // it waits for experts, which a pool worker must never do (see store::slots).
        if self.pool.current_thread_index().is_some() {
            return Err(Error::arg(
                "internal: a forward pass was started from the model's own compute pool",
            ));
        }
        let snaps: Vec<Snapshot> = seqs.iter().map(|s| s.st.snapshot()).collect();
        let t0 = Instant::now();
        // the pass's working buffers are reused from layer to layer and chunk to chunk, up
        // to the plan's scratch and span bytes, and let go when it ends (`scratch`)
        let limit = self.plan.scratch_bytes.saturating_add(self.plan.span_bytes);
        let scope = scratch::global().scope(usize::try_from(limit).unwrap_or(usize::MAX));
        let hooks = Hooks {
            cancel,
            report,
            capture,
        };
        let r = self.forward_spans(seqs, hooks);
        drop(scope);
        if r.is_err() {
            // every sequence back to its snapshot, even if one of them could not be
            let mut restored = Ok(());
            for (s, snap) in seqs.iter_mut().zip(&snaps) {
                restored = restored.and(s.st.rollback(snap));
            }
            restored?;
        } else {
            let fed: usize = seqs.iter().map(|s| s.ids.len()).sum();
            let busy = seqs.iter().filter(|s| !s.ids.is_empty()).count();
            // decode steps: every sequence of the batch fed one token
            let (tok, ns) = if fed > 0 && fed == busy {
                (&self.counters.decode_tokens, &self.counters.decode_ns)
            } else {
                (&self.counters.prefill_tokens, &self.counters.prefill_ns)
            };
            tok.fetch_add(fed as u64, Ordering::Relaxed);
            ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        r
    }

    /// Whether `ids` may be fed to `st`: ids in the vocabulary, within the context, a state
    /// of this model.
    pub(crate) fn check_seq(&self, st: &State, ids: &[u32]) -> Result<()> {
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
        Ok(())
    }

    /// The batch's tokens, sequence after sequence, cut into spans as long as the plan allows
    /// (each reads its experts once per layer); a sequence's share of a span is one run of
    /// its tokens, and its shares come in order, so each share starts where its sequence
    /// stands.
    fn forward_spans(&self, seqs: &mut [Seq<'_>], h: Hooks) -> Result<Vec<Vec<f32>>> {
        let size = self.plan.prefill_span.max(self.plan.prefill_chunk).max(1);
        let mut starts = Vec::with_capacity(seqs.len());
        let mut total = 0usize;
        for s in seqs.iter() {
            starts.push(total);
            total += s.ids.len();
        }
        let mut out = vec![Vec::new(); seqs.len()];
        let mut a = 0;
        while a < total {
            let b = (a + size).min(total);
            let shares: Vec<Share> = seqs
                .iter()
                .zip(&starts)
                .enumerate()
                .filter_map(|(i, (s, &s0))| {
                    let (lo, hi) = (s0.max(a), (s0 + s.ids.len()).min(b));
                    (lo < hi).then(|| Share {
                        seq: i,
                        rows: lo - a..hi - a,
                        ids: lo - s0..hi - s0,
                    })
                })
                .collect();
            for (i, v) in self.forward_span(seqs, &shares, h)? {
                out[i].extend(v);
            }
            a = b;
        }
        Ok(out)
    }

    /// One span of the batch's tokens through every layer, layer by layer: a layer's
    /// attention runs over the span in chunks of `plan.prefill_chunk` (each advancing its
    /// sequences' states in order), then its MoE over all of the span's tokens at once, so
    /// each routed expert is read at most once per layer per span. Every token's result is
    /// bit-identical to any other split (attention sees the same state; the kernels and the
    /// expert sum do not depend on the batch). Returns (sequence, logits) of the sequences
    /// that want some from this span.
    fn forward_span(
        &self,
        seqs: &mut [Seq<'_>],
        shares: &[Share],
        h: Hooks,
    ) -> Result<Vec<(usize, Vec<f32>)>> {
        let Hooks {
            cancel,
            report,
            capture,
        } = h;
        let c = &self.cfg;
        let ids: Vec<u32> = shares
            .iter()
            .flat_map(|s| seqs[s.seq].ids[s.ids.clone()].iter().copied())
            .collect();
        let n = ids.len();
        // within the context: `forward_batch_reporting` checked the whole call
        let pos0: Vec<usize> = shares.iter().map(|s| seqs[s.seq].st.pos()).collect();
        let mut x = self.embed_streams(&ids)?; // [n, hc, H]
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
            if let Some(es) = self.layers[l].moe.hash_experts(&ids, c.experts_per_tok) {
                let take = es.len().min(budget);
                self.experts.prefetch(l, &es[..take]);
                budget -= take;
            }
        }
        for l in 0..self.layers.len() {
            // each share's layer state (shares are in batch order, one per sequence)
            let mut parts = Vec::with_capacity(shares.len());
            let mut next = shares.iter().zip(&pos0).peekable();
            for (i, s) in seqs.iter_mut().enumerate() {
                if let Some((sh, &p0)) = next.next_if(|(sh, _)| sh.seq == i) {
                    let st: &mut AttnState = &mut s.st.layers[l];
                    parts.push(Part {
                        st,
                        rows: sh.rows.clone(),
                        pos0: p0,
                    });
                }
            }
            if let Some(cap) = capture {
                let rows = shares.iter().map(|s| (s.seq, s.rows.clone(), s.ids.start));
                cap.record(l, &x, c.hc_mult, c.hidden_size, rows);
            }
            self.run_layer(&cx, l, &mut parts, &mut x, &ids, cancel)?;
            report(n as u64);
            if cancel() {
                return Err(Error::Cancelled);
            }
        }
        let mut rows = Vec::new();
        let mut owners: Vec<(usize, usize)> = Vec::new(); // (sequence, rows)
        for sh in shares {
            let s = &mut seqs[sh.seq];
            let fed = s.ids;
            s.st.tokens.extend_from_slice(&fed[sh.ids.clone()]);
            let before = rows.len();
            match s.want {
                Want::All => rows.extend(sh.rows.clone()),
                Want::Last if sh.ids.end == fed.len() => rows.push(sh.rows.end - 1),
                _ => {}
            }
            if rows.len() > before {
                owners.push((sh.seq, rows.len() - before));
            }
        }
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let logits = self.head_logits(&x, &rows);
        let v = c.vocab_size;
        let mut out = Vec::with_capacity(owners.len());
        let mut at = 0;
        for (seq, k) in owners {
            out.push((seq, logits[at * v..(at + k) * v].to_vec()));
            at += k;
        }
        Ok(out)
    }

    /// The logits [rows.len(), V] of the given tokens' final streams (x: [n, hc, H]): one
    /// product over all the rows.
    pub(super) fn head_logits(&self, x: &[f32], rows: &[usize]) -> Vec<f32> {
        let c = &self.cfg;
        let (h, hcm) = (c.hidden_size, c.hc_mult);
        let mut hs = vec![0f32; rows.len() * h]; // [rows, H]
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

    /// Layer `l` over the n tokens of `parts` (each a sequence's rows of x, at its
    /// positions), with streams x [n, hc, H], in place: its attention chunk by chunk
    /// (X' = post ⊗ attn(norm(pre · X)) + combᵀ · X, each chunk advancing its sequences'
    /// states), with the MoE block's input side for the same tokens, then its MoE over all
    /// n tokens at once. `ids`: the n tokens' ids (hash routing).
    pub(super) fn run_layer(
        &self,
        cx: &Ctx,
        l: usize,
        parts: &mut [Part],
        x: &mut [f32],
        ids: &[u32],
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
            // the parts' rows within this chunk, at their positions
            let mut sub: Vec<Part> = parts
                .iter_mut()
                .filter_map(|p| {
                    let (lo, hi) = (p.rows.start.max(a), p.rows.end.min(b));
                    (lo < hi).then(|| Part {
                        st: &mut *p.st,
                        rows: lo - a..hi - a,
                        pos0: p.pos0 + (lo - p.rows.start),
                    })
                })
                .collect();
            let xs = &mut x[a * stream..b * stream];
            let (mixes, xin) = pool.install(|| {
                let (mixes, xin) = self.hc_in(&layer.hc_attn, &layer.attn_norm, xs, b - a);
                let t0 = Instant::now();
                let o = layer.attn.forward(cx, &mut sub, &xin, b - a);
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
    pub(super) fn embed_streams(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let (h, hcm) = (self.cfg.hidden_size, self.cfg.hc_mult);
        let mut x = vec![0f32; ids.len() * hcm * h];
        let emb = self.embed.mat();
        for (t, &id) in ids.iter().enumerate() {
            let row = super::embed_row(&emb, id as usize, h)?;
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
    pub(super) fn hc_in(
        &self,
        hcw: &hc::HyperConn,
        norm: &[f32],
        x: &[f32],
        n: usize,
    ) -> (Vec<hc::HcMix>, Buf) {
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
pub(super) fn hc_out(x: &mut [f32], out: &[f32], mixes: &[hc::HcMix], hcm: usize) {
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
