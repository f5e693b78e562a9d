//! The MoE block (docs/model.md §4): sqrt-softplus router (bias only for the selection,
//! renormalised weights × routed_scaling_factor), hash routing by `tid2eid[token]` on the
//! first layers, SwiGLU experts with the clamps, and the shared expert. Each selected expert
//! is applied once per chunk to all the tokens that chose it; per token, experts add up in
//! ascending expert order whatever the chunking, so results do not depend on how tokens are
//! batched.

use super::weights::Linear;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::kernels::{self, ops, MatRef, Numerics};
use crate::scratch::{self, Buf};
use crate::store::{ExpertStore, ExpertView};
use rayon::prelude::*;
use std::ops::Range;

/// Tokens of experts run side by side in one parallel call (`MoeWeights::experts_out`):
/// enough for a decode step's experts; experts with more tokens run one at a time, so the
/// memory of side-by-side experts' intermediates stays that of a few tokens.
const SIDE_BY_SIDE_TOKENS: usize = 16;

pub struct MoeWeights {
    /// [E, H] router
    pub gate: Linear,
    /// [E] selection bias (learned-routing layers)
    pub bias: Option<Vec<f32>>,
    /// [V, K] (hash layers)
    pub tid2eid: Option<Vec<u16>>,
    /// shared expert: w1 [I, H], w3 [I, H], w2 [H, I]
    pub sw1: Linear,
    pub sw3: Linear,
    pub sw2: Linear,
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// silu(min(g, limit)) · clamp(u, -limit, limit), in place into g.
fn swiglu(g: &mut [f32], u: &[f32], limit: f32) {
    for (a, &b) in g.iter_mut().zip(u) {
        *a = ops::silu(a.min(limit)) * b.clamp(-limit, limit);
    }
}

fn mm(m: &MatRef, x: &[f32], n: usize, numerics: Numerics) -> Buf {
    let mut y = scratch::zeroed(n * m.rows);
    kernels::matmul_in(numerics, m, 0..m.rows, x, n, &mut y);
    y
}

impl MoeWeights {
    /// The experts a hash layer will use for these tokens (known before the layer runs).
    pub fn hash_experts(&self, ids: &[u32], k: usize) -> Option<Vec<usize>> {
        let tab = self.tid2eid.as_ref()?;
        let mut v: Vec<usize> = ids
            .iter()
            .flat_map(|&id| {
                tab[id as usize * k..(id as usize + 1) * k]
                    .iter()
                    .map(|&e| e as usize)
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        Some(v)
    }

    /// A guess at the experts a learned-routing layer will use, from `y` [n, H] (the caller
    /// passes the layer's pre-attention input through the FFN's mix and norm; the real input
    /// differs by the attention's output): this layer's router on it, the union of every
    /// token's top k, the experts more tokens picked first (ties ascending), so a prefetch
    /// capped below the union reads the likeliest. None for hash layers (their experts are
    /// known exactly). Only for prefetching: nothing computed depends on it.
    pub fn guess_experts(&self, c: &ModelConfig, y: &[f32], n: usize) -> Option<Vec<usize>> {
        if self.tid2eid.is_some() {
            return None;
        }
        let mut votes = vec![0usize; c.n_routed_experts];
        for r in self.route(c, y, &[], n) {
            for (e, _) in r {
                votes[e] += 1;
            }
        }
        let mut v: Vec<usize> = (0..votes.len()).filter(|&e| votes[e] > 0).collect();
        v.sort_by(|&a, &b| votes[b].cmp(&votes[a]).then(a.cmp(&b)));
        Some(v)
    }

    /// Routing for n tokens: per token, the (expert, weight) pairs. Pure compute (run it on
    /// the pool). `ids` is read only by hash layers.
    fn route(&self, c: &ModelConfig, y: &[f32], ids: &[u32], n: usize) -> Vec<Vec<(usize, f32)>> {
        let (k, ne) = (c.experts_per_tok, c.n_routed_experts);
        let logits = self.gate.forward(y, n); // [n, E]
        let mut routes: Vec<Vec<(usize, f32)>> = Vec::with_capacity(n);
        for t in 0..n {
            let s: Vec<f32> = logits[t * ne..(t + 1) * ne]
                .iter()
                .map(|&x| softplus(x).sqrt())
                .collect();
            let idx: Vec<usize> = match (&self.tid2eid, &self.bias) {
                (Some(tab), _) => {
                    let id = ids[t] as usize;
                    tab[id * k..(id + 1) * k]
                        .iter()
                        .map(|&e| e as usize)
                        .collect()
                }
                (None, bias) => {
                    let mut order: Vec<(f32, usize)> = s
                        .iter()
                        .enumerate()
                        .map(|(e, &v)| (v + bias.as_ref().map_or(0.0, |b| b[e]), e))
                        .collect();
                    order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                    order[..k].iter().map(|p| p.1).collect()
                }
            };
            let mut sum = 0f32;
            for &e in &idx {
                sum += s[e];
            }
            let denom = sum + 1e-20;
            routes.push(
                idx.iter()
                    .map(|&e| (e, s[e] / denom * c.routed_scaling_factor))
                    .collect(),
            );
        }
        routes
    }

    /// y: [n, H] normed inputs; ids: the n token ids. Returns [n, H] and the distinct
    /// experts used, ascending. `next`: the next layer and experts it is known to need (a
    /// hash layer), prefetched during this layer's last wave into the slots it leaves free
    /// and into each slot its experts give back once computed (as each wave does for the
    /// next wave), so their reads overlap this layer's last experts and the next attention.
    ///
    /// Runs on the caller's thread, never on `pool`: waiting for experts (`acquire`,
    /// `wait_any`) happens here, and only pure compute is handed to the pool, so no pool
    /// worker ever blocks on the expert cache (see `store::slots` for why that matters).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        c: &ModelConfig,
        layer: usize,
        store: &ExpertStore,
        pool: &rayon::ThreadPool,
        numerics: Numerics,
        (y, ids, n): (&[f32], &[u32], usize),
        next: Option<(usize, &[usize])>,
    ) -> Result<(Buf, Vec<usize>)> {
        let (h, ne) = (c.hidden_size, c.n_routed_experts);
        let routes = pool.install(|| self.route(c, y, ids, n));
        // expert-major: each distinct expert once per chunk. Reads for a whole wave are
        // issued at once and each expert is computed as soon as its bytes arrive; outputs are
        // then summed per token in ascending expert order, so arrival order never matters.
        let mut users: Vec<Vec<(usize, f32)>> = vec![Vec::new(); ne];
        for (t, r) in routes.iter().enumerate() {
            for &(e, w) in r {
                users[e].push((t, w));
            }
        }
        let distinct: Vec<usize> = (0..ne).filter(|&e| !users[e].is_empty()).collect();
        // official: each expert's routing weight multiplies its activation before the down
        // projection, whose input is then round-tripped (DeepSeek's reference
        // `Expert.forward`, `inference/model.py` revision 60d8d70); the other modes weight
        // the output, as transformers does
        let pre_weight = numerics.official();
        // one wave's outputs at a time: each wave is added in once it is complete, so the
        // memory is bounded by a wave, not by the whole batch
        let mut outs: Vec<Option<Buf>> = (0..ne).map(|_| None).collect();
        let mut routed = scratch::zeroed(n * h); // [n, H]
        let mut started = vec![false; n];
        let mut shared = None;
        let batch = store.max_batch().max(1);
        let wave_list: Vec<&[usize]> = distinct.chunks(batch).collect();
        for (w, &wave) in wave_list.iter().enumerate() {
            // holds no pins here: the previous wave's were dropped at the end of its loop
            let mut pins = store.acquire(layer, wave)?;
            // what comes after this wave: the next wave, or after the last one the next
            // layer's experts where they are known. Read into the slots left free now, then
            // into each slot this wave's experts give back once computed, so the disk keeps
            // reading while the wave's last experts are computed and the next attention runs.
            let upcoming = match wave_list.get(w + 1) {
                Some(&nw) => Some((layer, nw)),
                None => next,
            };
            let mut upcoming_done = upcoming.is_none_or(|(nl, es)| store.prefetch(nl, es));
            let mut first = shared.is_none();
            loop {
                // the first time, what is cached already (perhaps nothing) goes with the
                // shared expert while the first wave's reads are in flight; then every
                // expert as soon as it is here, those that are here together
                let ready = if first {
                    store.take_ready(&mut pins)?
                } else {
                    store.wait_ready(&mut pins)?
                };
                if ready.is_empty() && !first {
                    break;
                }
                let mut views = Vec::with_capacity(ready.len());
                for &i in &ready {
                    views.push((pins[i].expert, store.view(&pins[i])?));
                }
                let run = |views: &[(usize, ExpertView)]| -> Vec<Buf> {
                    self.experts_out(c, numerics, y, &users, views)
                };
                let ys = if first {
                    let (s, ys) = pool
                        .install(|| rayon::join(|| self.shared(c, numerics, y, n), || run(&views)));
                    shared = Some(s);
                    first = false;
                    ys
                } else {
                    pool.install(|| run(&views))
                };
                for ((e, _), o) in views.iter().zip(ys) {
                    outs[*e] = Some(o);
                }
                drop(views);
                if !ready.is_empty() {
                    for &i in &ready {
                        pins[i].release();
                    }
                    if let (false, Some((nl, es))) = (upcoming_done, upcoming) {
                        upcoming_done = store.prefetch(nl, es);
                    }
                }
            }
            drop(pins);
            // waves are in ascending expert order, and so is each wave: every token's sum
            // runs over its experts in ascending order whatever the waves and arrival order
            accumulate(
                h,
                wave,
                &users,
                &mut outs,
                &mut routed,
                &mut started,
                pre_weight,
            );
        }
        let shared = match shared {
            Some(s) => s,
            None => pool.install(|| self.shared(c, numerics, y, n)),
        };
        for (r, s) in routed.iter_mut().zip(shared.iter()) {
            *r += s;
        }
        Ok((routed, distinct))
    }

    /// The outputs [m, H] of experts whose weights are here (`views`: expert, weights), for
    /// their users' rows of y [n, H]; on the pool. Experts with few tokens run side by side
    /// in groups of up to `SIDE_BY_SIDE_TOKENS` tokens, so that one parallel call covers
    /// several of them: a decode step's experts are each a few MB, and a fork-join per
    /// product costs a visible share of their time (`kernels_ab wave`, benches/README.md).
    /// Each expert's output is computed the same way wherever it runs.
    fn experts_out(
        &self,
        c: &ModelConfig,
        numerics: Numerics,
        y: &[f32],
        users: &[Vec<(usize, f32)>],
        views: &[(usize, ExpertView)],
    ) -> Vec<Buf> {
        let one = |(e, ex): &(usize, ExpertView)| expert_out(c, numerics, y, &users[*e], ex);
        let tokens: Vec<usize> = views.iter().map(|(e, _)| users[*e].len()).collect();
        let mut outs = Vec::with_capacity(views.len());
        for g in side_by_side(&tokens, SIDE_BY_SIDE_TOKENS) {
            if g.len() == 1 {
                outs.push(one(&views[g.start]));
            } else {
                outs.par_extend(views[g].par_iter().map(one));
            }
        }
        outs
    }

    /// The shared expert's output [n, H] for y [n, H].
    fn shared(&self, c: &ModelConfig, numerics: Numerics, y: &[f32], n: usize) -> Buf {
        let mut g = self.sw1.forward_in(numerics, y, n);
        let u = self.sw3.forward_in(numerics, y, n);
        swiglu(&mut g, &u, c.swiglu_limit);
        self.sw2.forward_in(numerics, &g, n)
    }
}

/// `tokens` (experts' token counts, in order) cut into consecutive groups: each the longest
/// run from its start whose tokens stay within `budget`, at least one expert.
fn side_by_side(tokens: &[usize], budget: usize) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    while start < tokens.len() {
        let (mut end, mut sum) = (start + 1, tokens[start]);
        while end < tokens.len() && sum + tokens[end] <= budget {
            sum += tokens[end];
            end += 1;
        }
        groups.push(start..end);
        start = end;
    }
    groups
}

/// One expert's output [m, H] for its m users' rows of y [n, H] (`us`: token, weight):
/// w2 · (silu(w1 x) · w3 x) with the clamps, the weight applied before w2 in official
/// numerics. On the pool.
fn expert_out(
    c: &ModelConfig,
    numerics: Numerics,
    y: &[f32],
    us: &[(usize, f32)],
    ex: &ExpertView,
) -> Buf {
    let (h, m) = (c.hidden_size, us.len());
    let mut xe = scratch::zeroed(m * h);
    for (j, &(t, _)) in us.iter().enumerate() {
        xe[j * h..(j + 1) * h].copy_from_slice(&y[t * h..(t + 1) * h]);
    }
    // w1 and w3 share their input: one fork for both (each also splits its rows), not two
    // one after the other. One token's FP4 expert: 1.4-6.5 % more GB/s on an Intel Xeon VM
    // whose fork-join costs 30-40 us a call (`kernels_ab expert`, benches/README.md)
    let (mut g, u) = rayon::join(
        || mm(&ex.w1(), &xe, m, numerics),
        || mm(&ex.w3(), &xe, m, numerics),
    );
    swiglu(&mut g, &u, c.swiglu_limit);
    if numerics.official() {
        for (gj, &(_, w)) in g.chunks_exact_mut(ex.w1().rows).zip(us) {
            gj.iter_mut().for_each(|v| *v *= w);
        }
    }
    mm(&ex.w2(), &g, m, numerics) // [m, H]
}

/// Adds the outputs of `experts` (ascending) into `routed` [n, H], weighted (unless the
/// outputs are `pre_weighted`), and frees them: a token's first expert sets its row, each
/// later one adds to it.
fn accumulate(
    h: usize,
    experts: &[usize],
    users: &[Vec<(usize, f32)>],
    outs: &mut [Option<Buf>],
    routed: &mut [f32],
    started: &mut [bool],
    pre_weighted: bool,
) {
    for &e in experts {
        let out = outs[e].take();
        let out: &[f32] = out.as_deref().unwrap_or(&[]);
        for (i, &(t, w)) in users[e].iter().enumerate() {
            let w = if pre_weighted { 1.0 } else { w };
            let dst = &mut routed[t * h..(t + 1) * h];
            let src = &out[i * h..(i + 1) * h];
            if started[t] {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d += s * w;
                }
            } else {
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d = s * w;
                }
                started[t] = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::side_by_side;

    #[test]
    fn side_by_side_groups_cover_every_expert_in_order_within_the_budget() {
        // a decode step: six one-token experts in one group
        assert_eq!(side_by_side(&[1; 6], 16), vec![0..6]);
        // runs close before the budget is passed; an expert over it alone
        assert_eq!(
            side_by_side(&[5, 6, 5, 1, 40, 3, 16], 16),
            vec![0..3, 3..4, 4..5, 5..6, 6..7]
        );
        assert_eq!(side_by_side(&[], 16), Vec::<std::ops::Range<usize>>::new());
        for tokens in [vec![1, 2, 3, 4, 5, 6, 7, 8, 9], vec![17, 1, 15, 2, 14]] {
            let g = side_by_side(&tokens, 16);
            let flat: Vec<usize> = g.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(flat, (0..tokens.len()).collect::<Vec<_>>(), "{tokens:?}");
            for r in &g {
                let sum: usize = tokens[r.clone()].iter().sum();
                assert!(
                    r.len() == 1 || sum <= 16,
                    "{tokens:?}: {r:?} has {sum} tokens"
                );
            }
        }
    }
}
