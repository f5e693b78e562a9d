//! The speculative step (docs/model.md §9): the pending token and k drafted tokens go through
//! the model in one pass; position i is sampled exactly as plain step i would be (the same
//! sampler, seed + step index), and the drafts are kept while the samples equal them. The
//! first sample that differs (or the one after the last draft) is the new pending token; the
//! state is cut back to what was right (`Model::cut_back`, no recomputation). The tokens are
//! the ones plain generation gives, for every sampling setting: a wrong draft costs time only.
//!
//! The caller is handed one token per step. Until the last of a verify's tokens is handed
//! out, the state holds the whole pass with its journal open (`Verified`); whatever comes
//! next — the next step, or any other call on the session (feed, snapshot, save, another
//! generation) — first `settle`s it: the state is cut back to the tokens handed out, so a
//! caller that stops early (a stop string, a budget, a cancel) finds plain decoding's state.

use super::{Generation, Session, TokenLogprobs};
use crate::error::{Error, Result};
use crate::model::sample::Sampler;
use crate::model::session::Snapshot;
use crate::model::Want;
use crate::speculate::cost::{CostModel, K_MAX};
use crate::speculate::lookup::PromptLookup;
use crate::speculate::{Drafter, Mode, SpecStats};
use std::time::Instant;

/// A generation's speculation: its drafter, the cost model that decides how many drafts a
/// step verifies, and counters.
pub struct Speculator {
    pub(super) drafter: Drafter,
    /// The cost model of the drafter that reads the sequence (lookup, oracle), and DSpark's
    /// (`dspark` and `auto`: its acceptance and draft time are its own; both see every
    /// pass's time).
    cost: CostModel,
    pub(super) dcost: CostModel,
    stats: SpecStats,
    /// Tests: verify this many drafts (or all there are) at every step, whatever the cost.
    pub(super) force_k: Option<usize>,
    /// Tests: DSpark's drafts replaced by this oracle's (after DSpark drafted: the same
    /// path, state and timing), so that drafts are accepted on the random fixtures.
    #[cfg(test)]
    pub(super) dspark_oracle: Option<crate::speculate::oracle::Oracle>,
}

impl Speculator {
    pub fn new(drafter: Drafter) -> Speculator {
        Speculator {
            drafter,
            cost: CostModel::new(),
            dcost: CostModel::new(),
            stats: SpecStats::default(),
            force_k: None,
            #[cfg(test)]
            dspark_oracle: None,
        }
    }

    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The running estimate of the drafts' acceptance (DSpark's when it drafts with DSpark
    /// only).
    pub fn acceptance(&self) -> f64 {
        match self.drafter {
            Drafter::DSpark => self.dcost.acceptance(),
            _ => self.cost.acceptance(),
        }
    }

    /// Records a pass of `m` tokens in both cost models.
    fn observe_pass(&mut self, m: usize, secs: f64) {
        self.cost.observe_pass(m, secs);
        self.dcost.observe_pass(m, secs);
    }
}

/// A verify whose sampled tokens are being handed out (`Session::verified`).
pub(crate) struct Verified {
    /// The generation that made it (`Generation::id`).
    generation: u64,
    /// The state before the pass (its journal open since).
    before: Snapshot,
    /// The token pending before the pass (its first fed token).
    pending_before: u32,
    /// Each sampled token, its log-probabilities when asked for, and whether the generation
    /// stops with it. `out[i]` for i < len - 1 equals the i-th draft (fed by the pass).
    out: Vec<(u32, Option<TokenLogprobs>, bool)>,
    /// How many of `out` the caller was handed (at least the first).
    handed: usize,
}

impl Verified {
    /// The tokens fed and the pending token as plain decoding has them after the handed-out
    /// tokens: the pass's first `handed` fed tokens, then the last one handed out.
    pub(super) fn visible(&self) -> (usize, Option<u32>) {
        let h = self.handed.clamp(1, self.out.len());
        (self.before.pos() + h, Some(self.out[h - 1].0))
    }
}

impl Session {
    /// Cuts a verify's pass back to the tokens handed out (`Verified`), closing its journal;
    /// nothing to do without one.
    pub(super) fn settle(&mut self) -> Result<()> {
        let Some(v) = self.verified.take() else {
            return Ok(());
        };
        let (keep, pending) = v.visible();
        let keep = keep - v.before.pos();
        let fed = self.st.pos() - v.before.pos();
        let cut = if keep == fed {
            self.st.journal_end();
            Ok(())
        } else {
            self.model.cut_back(&mut self.st, &v.before, keep)
        };
        if let Err(e) = cut {
            // cannot happen by construction; stay consistent: back to before the pass
            self.st.journal_end();
            self.st.rollback(&v.before)?;
            self.draft_follow();
            self.pending = Some(v.pending_before);
            self.last = None;
            return Err(e);
        }
        self.draft_follow();
        self.pending = pending;
        self.last = None;
        Ok(())
    }

    /// The next token of `g`'s verify, if one waits; a verify of another generation is
    /// settled first.
    pub(super) fn hand_out(&mut self, g: &mut Generation) -> Result<Option<u32>> {
        let Some(v) = self.verified.as_mut() else {
            return Ok(None);
        };
        if v.generation != g.id || v.handed >= v.out.len() {
            self.settle()?;
            return Ok(None);
        }
        let (tok, lp, stopped) = v.out[v.handed].clone();
        v.handed += 1;
        let last = v.handed == v.out.len();
        g.produced += 1;
        g.stopped = stopped;
        g.last_logprobs = lp;
        if last {
            self.settle()?;
        }
        Ok(Some(tok))
    }
}

impl Session {
    /// A speculative step of `g` (its prompt fed, a token pending, no constraint): drafts,
    /// then verifies as many as the cost model chooses, or steps plainly. Returns the first
    /// token; the others wait in the speculator's queue. `None` when speculation does not
    /// apply (the caller steps plainly).
    pub(super) fn speculative_step<C: Fn() -> bool + Sync>(
        &mut self,
        g: &mut Generation,
        cancel: &C,
    ) -> Result<Option<u32>> {
        let Some(pending) = self.pending else {
            return Ok(None);
        };
        let Some(spec) = g.spec.as_mut() else {
            return Ok(None);
        };
        if g.constraint.is_some() || g.stopped {
            return Ok(None);
        }
        // room: the tokens fed (1 + k) within the context and the journal's window, the
        // tokens sampled (at most 1 + k) within max_new
        let pos = self.st.pos();
        let room = [
            self.model.ctx.saturating_sub(pos + 1),
            self.model.journal_capacity().saturating_sub(1),
            g.max_new.saturating_sub(g.produced + 1),
            K_MAX,
        ]
        .into_iter()
        .min()
        .unwrap_or(0);
        if room == 0 {
            return Ok(None);
        }
        // DSpark's drafts when this step uses it (its cost model chose k, the draft is
        // made only then), else the sequence drafter's
        let mut draft_secs = 0.0;
        let (drafts, dspark) = match self.dspark_k(spec, room) {
            Some(0) => (Vec::new(), true),
            Some(k0) => {
                let t = Instant::now();
                let d = self.dspark_draft(pending, k0, spec.force_k.is_none());
                #[cfg(test)]
                let d = match spec.dspark_oracle.as_mut() {
                    Some(o) => {
                        let mut seq = self.st.tokens.clone();
                        seq.push(pending);
                        o.propose(&seq, d.len())
                    }
                    None => d,
                };
                draft_secs = t.elapsed().as_secs_f64();
                spec.dcost.observe_draft(k0, draft_secs);
                (d, true)
            }
            None => {
                let mut seq = Vec::with_capacity(pos + 1);
                seq.extend_from_slice(&self.st.tokens);
                seq.push(pending);
                (spec.drafter.propose(&seq, room), false)
            }
        };
        let k = match (dspark, spec.force_k) {
            (true, _) => drafts.len().min(room),
            (false, Some(k)) => k.min(drafts.len()),
            (false, None) => spec.cost.choose(drafts.len()),
        };
        if k == 0 {
            // a plain step, timed for the cost model
            let t0 = Instant::now();
            self.flush(&[], cancel)?;
            spec.observe_pass(1, t0.elapsed().as_secs_f64());
            let step = SpecStats {
                plain_steps: 1,
                saved_s: -draft_secs,
                ..SpecStats::default()
            };
            spec.stats.add(&step);
            self.model.counters.add_speculation(&step);
            return Ok(None); // sampled by the plain step from the logits now at hand
        }
        let drafts = &drafts[..k];
        let mut fed = Vec::with_capacity(k + 1);
        fed.push(pending);
        fed.extend_from_slice(drafts);
        let t0 = Instant::now();
        let before = self.st.journal_begin();
        let rows = match self.forward_fed(&fed, Want::All, cancel, &|_| {}) {
            Ok(r) => r,
            Err(e) => {
                self.st.journal_end(); // the pass restored the state
                return Err(e);
            }
        };
        let v = self.model.cfg.vocab_size;
        // sample each position as plain step `produced + i` would
        let mut out: Vec<(u32, Option<TokenLogprobs>, bool)> = Vec::with_capacity(k + 1);
        for i in 0..=k {
            let logits = &rows[i * v..(i + 1) * v];
            let mut p = g.params.clone();
            p.seed = g.params.seed.wrapping_add((g.produced + i) as u64);
            let tok = Sampler::new(p).pick_allowed(logits, None);
            let lp = g.logprobs.map(|top| TokenLogprobs::of(logits, tok, top));
            let produced = g.produced + i + 1;
            let stopped =
                g.stop_ids.contains(&tok) || produced >= g.max_new || pos + i + 1 >= self.model.ctx;
            out.push((tok, lp, stopped));
            if stopped || i == k || tok != drafts[i] {
                break;
            }
        }
        let a = out.len(); // tokens sampled; the fed tokens kept are the pending one + a - 1
                           // drafts judged (a stop may end the verify before the others) and the right ones
        let judged = a.min(k);
        let matched = (0..judged).take_while(|&i| out[i].0 == drafts[i]).count();
        let secs = t0.elapsed().as_secs_f64();
        spec.observe_pass(k + 1, secs);
        let cost = if dspark {
            &mut spec.dcost
        } else {
            &mut spec.cost
        };
        cost.observe_verify(judged, matched);
        let mut step = SpecStats {
            verifies: 1,
            drafted: k as u64,
            accepted: matched as u64,
            ..SpecStats::default()
        };
        if let Some(t1) = spec.cost.pass_time(1) {
            step.saved_s = a as f64 * t1 - secs - draft_secs;
        }
        spec.stats.add(&step);
        self.model.counters.add_speculation(&step);
        // the state keeps the whole pass until the tokens are handed out (`settle`)
        self.pending = None;
        self.last = None;
        self.verified = Some(Box::new(Verified {
            generation: g.id,
            before,
            pending_before: pending,
            out,
            handed: 0,
        }));
        self.hand_out(g)
    }
}

/// The drafter `mode` gives a generation on `m` (None: plain decoding). `auto` is DSpark and
/// prompt lookup when the DSpark drafter is loaded (DSpark at the steps its cost model
/// predicts a gain for, lookup at the others), prompt lookup alone otherwise; `dspark` needs
/// the drafter loaded.
pub fn drafter_for(m: &crate::model::Model, mode: Mode) -> Result<Option<Drafter>> {
    Ok(match mode {
        Mode::Off => None,
        Mode::Lookup => Some(Drafter::Lookup(PromptLookup::default())),
        Mode::Auto if m.drafter.is_some() => Some(Drafter::Auto(PromptLookup::default())),
        Mode::Auto => Some(Drafter::Lookup(PromptLookup::default())),
        Mode::DSpark if m.drafter.is_some() => Some(Drafter::DSpark),
        Mode::DSpark => {
            return Err(Error::arg(match crate::model::dspark::require(&m.cfg) {
                Ok(_) => {
                    "speculate='dspark': the DSpark drafter is not loaded: load the model \
                     with drafter=True (--drafter), or use speculate='lookup' or 'auto'"
                }
                Err(_) => {
                    "speculate='dspark' needs the checkpoint's DSpark drafter (a 0731 \
                     checkpoint loaded with drafter=True); this one has none: use \
                     speculate='lookup' or 'auto'"
                }
            }))
        }
    })
}
