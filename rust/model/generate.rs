//! A generating session: a sequence's `State` plus what generation needs between calls (the
//! last sampled token, not yet fed, and the logits after the last fed token), and the one
//! sampling step that `generate` and streaming both run.
//!
//! The rules live here and only here:
//! - step i of a generation samples with `seed + i` (wrapping), so a generation streamed
//!   step by step, run in one call, or run again after a rollback gives the same tokens;
//! - a sampled token is fed by the *next* step (or the next call), so a finished answer costs
//!   no forward pass for its last token;
//! - a generation stops after a stop id, after `max_new` tokens, or when the context is full
//!   (the sampled token is returned; it cannot be fed and stays pending in the session);
//! - `cancel` is polled between layers of every forward pass; a cancelled call leaves the
//!   session consistent (the tokens sampled so far stay in it);
//! - a generation with a grammar (`with_constraint`) samples only among the tokens its mask
//!   allows (computed while the forward pass runs), and the sampled token advances it; the
//!   constraint belongs to the generation, never to the session (docs/architecture.md §7.2).

mod draft;
mod speculate;
mod together;

use speculate::Verified;
pub use speculate::{drafter_for, Speculator};
pub use together::{Mark, Stepped, Turn};

use super::sample::{SampleParams, Sampler};
use super::session::file as session_file;
use super::session::{Snapshot, State};
use super::{Model, Seq, Want};
use crate::error::{Error, Result};
use crate::grammar::Constraint;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A sequence being fed and generated from. One call at a time (`&mut self`); the binding
/// guards it with a lock.
pub struct Session {
    model: Arc<Model>,
    st: State,
    /// The last sampled token, returned to the caller but not yet fed: the next step or call
    /// feeds it first.
    pending: Option<u32>,
    /// Logits after the last fed token. Invariant: `Some` whenever no token is pending and
    /// the state holds at least one token (a rollback restores them from the snapshot), so
    /// generation can always continue from where the session stands.
    last: Option<Vec<f32>>,
    /// A speculative verify whose sampled tokens were not all handed out yet: the state holds
    /// the whole pass (its journal open) until `settle` cuts it back to what was handed out,
    /// so that whatever the caller does next sees plain decoding's state (docs/model.md §9).
    verified: Option<Box<Verified>>,
    /// The DSpark drafter's state, kept in step with `st` while the session drafts with
    /// DSpark (`draft.rs` has the rules); None for every other session.
    ds: Option<crate::model::dspark::DraftState>,
}

/// One session's part of `Session::feed_batch`: the tokens it feeds after its pending one,
/// and the logits it wants back.
pub struct BatchFeed<'a> {
    pub session: &'a mut Session,
    pub ids: &'a [u32],
    pub want: Want,
}

/// One generation's arguments and progress: the prompt to feed first, the sampling
/// parameters, the stop ids, and how many tokens it produced (the step index of the seed
/// rule). Advance it with `Session::step`; it is independent of the session's other calls.
pub struct Generation {
    /// Unique among generations: a verify's tokens go out only to the generation that made it.
    id: u64,
    /// Fed by the first step (with a pending token before it); `None` once fed.
    prompt: Option<Vec<u32>>,
    params: SampleParams,
    stop_ids: Vec<u32>,
    max_new: usize,
    produced: usize,
    /// A stop id, `max_new` or a full context was reached.
    stopped: bool,
    /// Record each sampled token's log-probability and this many alternatives (None: off).
    logprobs: Option<usize>,
    /// The last step's, when asked for.
    last_logprobs: Option<TokenLogprobs>,
    /// A grammar the sampled tokens must follow (its mask applied before sampling).
    constraint: Option<Constraint>,
    /// Drafting and verifying (`with_speculation`); None: plain steps.
    spec: Option<Box<Speculator>>,
}

/// A sampled token's log-probability under the model (the log-softmax of its raw logits,
/// before temperature, top-k and top-p), and the `top` most likely tokens' (most likely
/// first; ties by id).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    pub fn of(logits: &[f32], tok: u32, top: usize) -> TokenLogprobs {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - m).exp()).sum();
        let lse = m + sum.ln();
        let lp = |i: usize| (logits[i] as f64 - lse) as f32;
        let k = top.min(logits.len());
        let mut best: Vec<(f32, u32)> = Vec::new();
        if k > 0 {
            best = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l, i as u32))
                .collect();
            let cmp = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
            if k < best.len() {
                best.select_nth_unstable_by(k - 1, cmp);
                best.truncate(k);
            }
            best.sort_by(cmp);
        }
        TokenLogprobs {
            logprob: lp(tok as usize),
            top: best.iter().map(|&(_, i)| (i, lp(i as usize))).collect(),
        }
    }
}

impl Generation {
    /// A generation that feeds `prompt`, then samples up to `max_new` tokens.
    pub fn new(
        prompt: Vec<u32>,
        max_new: usize,
        params: SampleParams,
        stop_ids: Vec<u32>,
    ) -> Result<Generation> {
        params.check()?;
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Ok(Generation {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            prompt: Some(prompt),
            params,
            stop_ids,
            max_new,
            produced: 0,
            stopped: max_new == 0,
            logprobs: None,
            last_logprobs: None,
            constraint: None,
            spec: None,
        })
    }

    /// Samples only what `c` allows (its mask applied to the logits before temperature, top-k
    /// and top-p, in every sampling mode), advancing it with each sampled token. The
    /// constraint must be made for this model's vocabulary (`Constraint::vocab_size`).
    pub fn with_constraint(mut self, c: Constraint) -> Generation {
        self.constraint = Some(c);
        self
    }

    /// Drafts with `drafter` and verifies the drafts the cost model picks (docs/model.md §9):
    /// the same tokens as without, sooner when drafts are right. Steps with a constraint
    /// stay plain.
    pub fn with_speculation(mut self, drafter: crate::speculate::Drafter) -> Generation {
        self.spec = Some(Box::new(Speculator::new(drafter)));
        self
    }

    /// Tests: every speculative step verifies `k` drafts (or all the drafter has), bypassing
    /// the cost model, so that verifies happen whatever the measured times say.
    pub fn forcing_drafts(mut self, k: usize) -> Generation {
        if let Some(s) = self.spec.as_mut() {
            s.force_k = Some(k);
        }
        self
    }

    /// The speculation, when on.
    pub fn speculation(&self) -> Option<&Speculator> {
        self.spec.as_deref()
    }

    /// The constraint, as far as it has advanced.
    pub fn constraint(&self) -> Option<&Constraint> {
        self.constraint.as_ref()
    }

    /// Also records each sampled token's log-probability and the `top` alternatives'
    /// (`last_logprobs`).
    pub fn with_logprobs(mut self, top: usize) -> Generation {
        self.logprobs = Some(top);
        self
    }

    /// The log-probabilities of the last sampled token, when asked for.
    pub fn last_logprobs(&self) -> Option<&TokenLogprobs> {
        self.last_logprobs.as_ref()
    }

    /// Tokens sampled so far.
    pub fn produced(&self) -> usize {
        self.produced
    }

    /// Nothing is left to do: the prompt is fed and no further token will be sampled.
    pub fn finished(&self) -> bool {
        self.stopped && self.prompt.is_none()
    }
}

impl Session {
    pub fn new(model: Arc<Model>) -> Session {
        Session {
            st: model.new_state(),
            ds: draft::initial(&model),
            model,
            pending: None,
            last: None,
            verified: None,
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Tests: the state itself.
    #[cfg(test)]
    pub(crate) fn state(&self) -> &State {
        &self.st
    }

    /// Tokens fed and the pending token as plain decoding would have them: while a verify's
    /// tokens are being handed out, its settled view.
    fn visible(&self) -> (usize, Option<u32>) {
        match &self.verified {
            Some(v) => v.visible(),
            None => (self.st.pos(), self.pending),
        }
    }

    /// Tokens in the sequence, including a sampled token not yet fed.
    pub fn position(&self) -> usize {
        let (fed, pending) = self.visible();
        fed + pending.is_some() as usize
    }

    /// Token ids of the whole sequence, including a sampled token not yet fed.
    pub fn tokens(&self) -> Vec<u32> {
        let (fed, pending) = self.visible();
        let mut t = Vec::with_capacity(fed + 1);
        t.extend_from_slice(&self.st.tokens[..fed]);
        t.extend(pending);
        t
    }

    /// Logits after the last fed token, when they are at hand (not while a sampled token
    /// waits to be fed, nor before anything was fed).
    pub fn last_logits(&self) -> Option<&[f32]> {
        match self.verified {
            Some(_) => None, // a token is pending
            None => self.last.as_deref(),
        }
    }

    /// Feeds the pending token (if any) and `ids` in one forward pass, keeping the logits
    /// after the last one. On error (cancelled included) nothing changes.
    fn flush<C: Fn() -> bool + Sync>(&mut self, ids: &[u32], cancel: &C) -> Result<()> {
        self.flush_reporting(ids, cancel, &|_| {})
    }

    /// `flush`, reporting progress to `report` (see `Model::forward_reporting`).
    fn flush_reporting<C: Fn() -> bool + Sync>(
        &mut self,
        ids: &[u32],
        cancel: &C,
        report: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        self.settle()?;
        let mut all = Vec::with_capacity(ids.len() + 1);
        all.extend(self.pending);
        all.extend_from_slice(ids);
        if all.is_empty() {
            return Ok(());
        }
        let v = self.forward_fed(&all, Want::Last, cancel, report)?;
        self.pending = None;
        self.last = Some(v);
        Ok(())
    }

    /// Feeds several sessions of one model in one batched forward pass
    /// (`Model::forward_batch`): each its pending token (if any) then its `ids`, keeping the
    /// logits after its last token as `feed` does. Returns, per item, the logits it asked
    /// for: `Last` [V], `All` [rows, V] with one row per token fed (a pending token's first:
    /// the row that scores the first of `ids`), `None` nothing. An item with nothing to feed
    /// takes no part and returns nothing. Each session ends as a `feed` of it alone would
    /// leave it, bit for bit. On error (cancelled included) no session changes.
    pub fn feed_batch<C: Fn() -> bool + Sync>(
        items: &mut [BatchFeed<'_>],
        cancel: &C,
    ) -> Result<Vec<Vec<f32>>> {
        let Some(model) = items.first().map(|i| i.session.model.clone()) else {
            return Ok(Vec::new());
        };
        if items.iter().any(|i| !Arc::ptr_eq(&i.session.model, &model)) {
            return Err(Error::arg(
                "the sessions of a batch must belong to one model",
            ));
        }
        for i in items.iter_mut() {
            i.session.settle()?;
            i.session.draft_follow();
        }
        let fed: Vec<Vec<u32>> = items
            .iter()
            .map(|i| i.session.pending.iter().chain(i.ids).copied().collect())
            .collect();
        let mut seqs: Vec<Seq> = Vec::with_capacity(items.len());
        let mut observers = Vec::with_capacity(items.len());
        for (i, ids) in items.iter_mut().zip(&fed) {
            let s = &mut *i.session;
            // the drafter states in step are observed in the same pass (draft.rs)
            let pos0 = s.st.pos();
            observers.push(s.ds.as_mut().filter(|d| d.len() == pos0).map(|d| (d, pos0)));
            seqs.push(Seq {
                st: &mut s.st,
                ids,
                // the last row always: the session keeps it
                want: match i.want {
                    Want::All => Want::All,
                    _ => Want::Last,
                },
            });
        }
        let (outs, observed) = draft::forward_batch_observed(&model, &mut seqs, observers, cancel)?;
        drop(seqs);
        let v = model.cfg.vocab_size;
        let mut res = Vec::with_capacity(items.len());
        for ((i, ok), ids) in items.iter_mut().zip(observed).zip(&fed) {
            if !ok && !ids.is_empty() {
                i.session.ds = None; // fed without being observed
            }
        }
        for ((i, ids), out) in items.iter_mut().zip(&fed).zip(outs) {
            if ids.is_empty() {
                res.push(Vec::new());
                continue;
            }
            let last = out[out.len() - v..].to_vec();
            i.session.pending = None;
            res.push(match i.want {
                Want::None => Vec::new(),
                Want::Last => last.clone(),
                Want::All => out,
            });
            i.session.last = Some(last);
        }
        Ok(res)
    }

    /// Feeds tokens (prefill) without sampling.
    pub fn feed<C: Fn() -> bool + Sync>(&mut self, ids: &[u32], cancel: &C) -> Result<()> {
        self.flush(ids, cancel)
    }

    /// `feed`, calling `report(tokens x layers done)` after each layer (a pending sampled
    /// token, fed first, counts as one more token) and checking `cancel` right after.
    pub fn feed_reporting<C: Fn() -> bool + Sync>(
        &mut self,
        ids: &[u32],
        cancel: &C,
        report: &(dyn Fn(u64) + Sync),
    ) -> Result<()> {
        self.flush_reporting(ids, cancel, report)
    }

    /// One step of `g`: feeds its prompt (first step) or the previous step's token, then
    /// samples the next token with `seed + step index`, among the tokens its constraint
    /// allows (if it has one: the mask is computed on another thread while the forward pass
    /// runs, then the sampled token advances the constraint). Returns `None` once the
    /// generation has stopped. On error nothing is sampled and `g` can be stepped again.
    pub fn step<C: Fn() -> bool + Sync>(
        &mut self,
        g: &mut Generation,
        cancel: &C,
    ) -> Result<Option<u32>> {
        if let Some(prompt) = &g.prompt {
            if prompt.is_empty() && self.pending.is_none() && self.last.is_none() {
                return Err(Error::arg(if self.st.pos() == 0 {
                    "generate needs at least one token to condition on (the prompt is empty)"
                } else {
                    "internal: the session has no logits to sample from"
                }));
            }
        }
        // tokens a speculative verify of this generation sampled go out first; another
        // generation's are settled
        if let Some(tok) = self.hand_out(g)? {
            return Ok(Some(tok));
        }
        if g.prompt.is_some() {
            self.draft_begin(g.spec.as_deref());
        }
        if g.stopped {
            if let Some(prompt) = &g.prompt {
                self.flush(prompt, cancel)?;
                g.prompt = None;
            }
            return Ok(None);
        }
        if g.prompt.is_none() && g.spec.is_some() {
            if let Some(tok) = self.speculative_step(g, cancel)? {
                return Ok(Some(tok));
            }
        }
        let feed: &[u32] = g.prompt.as_deref().unwrap_or(&[]);
        let mask = match g.constraint.as_mut() {
            // the mask depends only on the tokens sampled so far: it is computed while the
            // forward pass feeds the last of them
            Some(c) if !c.waiting() => {
                let (fed, mask) = std::thread::scope(|s| {
                    let h = s.spawn(|| c.mask());
                    let fed = self.flush(feed, cancel);
                    let mask = h.join().unwrap_or_else(|_| {
                        Err(Error::arg("internal: computing the grammar's mask failed"))
                    });
                    (fed, mask)
                });
                fed?;
                mask?
            }
            _ => {
                self.flush(feed, cancel)?;
                None
            }
        };
        g.prompt = None;
        self.sample(g, mask.as_ref()).map(Some)
    }

    /// Samples `g`'s next token from the logits after the last fed token (`last`, taken),
    /// among what `mask` allows, with `seed + step index`; the token becomes pending and
    /// advances `g` (its constraint, logprobs, count and stop). On error the logits stay.
    fn sample(&mut self, g: &mut Generation, mask: Option<&toktrie::SimpleVob>) -> Result<u32> {
        let logits = self
            .last
            .take()
            .ok_or_else(|| Error::arg("internal: the session has no logits to sample from"))?;
        let mut p = g.params.clone();
        p.seed = g.params.seed.wrapping_add(g.produced as u64);
        let mut tok = Sampler::new(p).pick_allowed(&logits, mask);
        if let Some(c) = g.constraint.as_mut() {
            tok = c.replace(tok);
            if let Err(e) = c.commit(tok) {
                self.last = Some(logits);
                return Err(e);
            }
        }
        if let Some(top) = g.logprobs {
            g.last_logprobs = Some(TokenLogprobs::of(&logits, tok, top));
        }
        self.pending = Some(tok);
        g.produced += 1;
        // the sampled token is fed by the next step; when the context is full it cannot be
        // fed, so the generation stops and returns it
        g.stopped =
            g.stop_ids.contains(&tok) || g.produced >= g.max_new || self.st.pos() >= self.model.ctx;
        Ok(tok)
    }

    /// Runs `g` to its end, calling `on_token` with each token as soon as it is sampled;
    /// returns all of them. The same steps as streaming with `step`.
    pub fn generate_with<C: Fn() -> bool + Sync, F: FnMut(u32)>(
        &mut self,
        g: &mut Generation,
        cancel: &C,
        mut on_token: F,
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        while let Some(tok) = self.step(g, cancel)? {
            on_token(tok);
            out.push(tok);
        }
        Ok(out)
    }

    /// Runs `g` to its end; returns the sampled tokens.
    pub fn generate<C: Fn() -> bool + Sync>(
        &mut self,
        g: &mut Generation,
        cancel: &C,
    ) -> Result<Vec<u32>> {
        self.generate_with(g, cancel, |_| {})
    }

    /// A restorable point at the current position (feeds a pending token first, so the
    /// snapshot holds the logits to continue from).
    pub fn snapshot<C: Fn() -> bool + Sync>(&mut self, cancel: &C) -> Result<Snapshot> {
        self.flush(&[], cancel)?;
        let mut snap = self.st.snapshot();
        snap.logits = self.last.clone();
        snap.draft = self.ds.clone();
        Ok(snap)
    }

    /// Returns to `snap` (taken on a session of the same model whose tokens are a prefix of
    /// this one's). On error the session is unchanged.
    pub fn rollback(&mut self, snap: &Snapshot) -> Result<()> {
        self.settle()?;
        // a pending token lies after every snapshot position (snapshots feed it): dropped
        self.st.rollback(snap)?;
        self.pending = None;
        self.last.clone_from(&snap.logits);
        self.draft_rollback(snap);
        Ok(())
    }

    /// Writes the session to `path` in the session file format (`session/file.rs`,
    /// docs/architecture.md §7.1), atomically: the whole state, the pending token and the
    /// last logits, so that `load` gives a session that continues bit for bit. With `at`, the
    /// state as it was at that snapshot (which must belong to this session, as for
    /// `rollback`). `metadata` is stored as is (a JSON value the caller reads back).
    /// Returns the file's size in bytes.
    pub fn save<C: Fn() -> bool + Sync>(
        &mut self,
        path: &Path,
        at: Option<&Snapshot>,
        metadata: Option<&serde_json::Value>,
        cancel: &C,
    ) -> Result<u64> {
        self.settle()?;
        let (view, pending, last) = match at {
            None => (self.st.view(), self.pending, self.last.as_deref()),
            Some(s) => (self.st.view_at(s)?, None, s.logits.as_deref()),
        };
        let parts = session_file::Parts {
            state: &view,
            pending,
            last,
            metadata,
        };
        session_file::save(path, &self.model, &parts, cancel)
    }

    /// A session of `model` read from a file `save` wrote, and the metadata saved with it.
    /// Refuses (naming the file and what differs) a file of another model, config or
    /// numerics mode, a truncated or corrupted one, and one longer than `model`'s context.
    pub fn load<C: Fn() -> bool + Sync>(
        model: Arc<Model>,
        path: &Path,
        cancel: &C,
    ) -> Result<(Session, Option<serde_json::Value>)> {
        let f = session_file::load(path, &model, cancel)?;
        let s = Session {
            model,
            st: f.state,
            pending: f.pending,
            last: f.last,
            verified: None,
            ds: None, // what the model was fed before is not observed (draft.rs)
        };
        Ok((s, f.metadata))
    }

    /// Empties the sequence.
    pub fn reset(&mut self) {
        self.st = self.model.new_state();
        self.pending = None;
        self.last = None;
        self.verified = None;
        self.ds = match self.ds {
            Some(_) => self.model.drafter_state().ok(),
            None => draft::initial(&self.model),
        };
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_dspark;
