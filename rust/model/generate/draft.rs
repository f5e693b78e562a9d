//! The session's DSpark drafter state (docs/model.md §9, "DSpark in generation"): kept in step
//! with the model's state by observing every pass that feeds the session, only for sessions
//! that draft with DSpark.
//!
//! The rules, the simplest that are always correct:
//! - a session keeps a `DraftState` when its model has the DSpark drafter loaded and drafts
//!   with it by default (`speculate` dspark or auto), from its first token; or, on any other
//!   session of such a model, once a generation that uses DSpark starts on it while it is
//!   still empty. Other sessions never capture nor observe anything: they run as before;
//! - while it keeps one, every pass that feeds it (feed, a generation's prompt, a plain step,
//!   a verify) captures the target's rows and observes them (`forward_fed`), so the drafter
//!   state stands where the model's state does;
//! - a verify's cut back truncates it to the kept position (`follow`); a rollback restores
//!   the snapshot's copy (`Session::snapshot` keeps one), else truncates it when the
//!   snapshot is within its undo depth;
//! - a batched feed (`feed_batch`) observes the sessions that keep one in the same pass
//!   (`forward_batch_observed`: one capture for the batch);
//! - whatever cannot keep it in step drops it, and the session drafts no more with DSpark
//!   (its generations step plainly, or with prompt lookup under `auto`): tokens fed before
//!   it was kept (a session fed, then asked for `dspark`), a rollback further back than it
//!   can undo, a session loaded from a file, a failed observation. Re-observing would mean running the model over the whole
//!   sequence again (a second prefill): never done behind the caller's back.
//!
//! Why truncating is always right: the positions the drafter state observed are the first
//! tokens of the session's sequence, or the state is dropped. Only observed passes add tokens
//! while it is kept (`forward_fed`, `forward_batch_observed`), and whatever takes tokens away
//! (a rollback, a cut back, a scheduler's `restore`) keeps the tokens before the new end.
//! So a state ahead of the session is truncated to it, lazily at the next pass
//! (`draft_follow`), whichever path moved the session back.
//!
//! Drafts are proposals only: the tokens are plain decoding's whatever the drafter state
//! holds (the verify samples every position as the plain step would).

use super::{Session, Speculator};
use crate::error::Result;
use crate::model::capture::Capture;
use crate::model::dspark::DraftState;
use crate::model::session::Snapshot;
use crate::model::{Model, Seq, Want};
use crate::speculate::{Drafter, Mode};

/// A drafted token is verified only while the drafter's confidence in it (its estimate of
/// the probability that the target accepts it) is at least this (the first always is).
pub const CONFIDENCE_MIN: f32 = 0.3;

/// The drafter state a new session of `model` keeps from its first token: when the drafter
/// is loaded and the model drafts with it unless told otherwise.
pub(super) fn initial(model: &Model) -> Option<DraftState> {
    if model.drafter.is_some() && matches!(model.speculate, Mode::DSpark | Mode::Auto) {
        model.drafter_state().ok()
    } else {
        None
    }
}

/// `Model::forward_batch` over `seqs`, capturing the drafter's rows of the sequences that
/// have an observer (their drafter state, standing at the sequence's position) and observing
/// them: the logits, and per sequence whether it was observed (false without an observer or
/// when its observation failed: the caller drops that state). On error nothing changes.
pub(super) fn forward_batch_observed(
    model: &Model,
    seqs: &mut [Seq<'_>],
    mut observers: Vec<Option<(&mut DraftState, usize)>>,
    cancel: &(dyn Fn() -> bool + Sync),
) -> Result<(Vec<Vec<f32>>, Vec<bool>)> {
    let Some(d) = model
        .drafter
        .as_ref()
        .filter(|_| observers.iter().any(Option::is_some))
    else {
        let outs = model.forward_batch(seqs, cancel)?;
        return Ok((outs, vec![false; seqs.len()]));
    };
    let lens: Vec<usize> = seqs
        .iter()
        .zip(&observers)
        .map(|(s, o)| if o.is_some() { s.ids.len() } else { 0 })
        .collect();
    let cap = Capture::new(d.target_layers(), &lens, model.cfg.hidden_size);
    let outs = model.forward_batch_capturing(seqs, cancel, &|_| {}, Some(&cap))?;
    let observed = observers
        .iter_mut()
        .zip(cap.into_rows())
        .map(|(o, rows)| match o {
            Some((ds, pos0)) => model.drafter_observe(ds, &rows, *pos0).is_ok(),
            None => false,
        })
        .collect();
    Ok((outs, observed))
}

impl Session {
    /// Whether the session keeps a DSpark drafter state (in step with its model's state).
    pub fn observes_drafter(&self) -> bool {
        self.ds.is_some()
    }

    /// The model's forward pass over `ids` (`Model::forward_reporting`), also observed into
    /// the drafter state when the session keeps one. On error nothing changes. An
    /// observation that fails after the pass drops the drafter state (the pass stands).
    pub(super) fn forward_fed(
        &mut self,
        ids: &[u32],
        want: Want,
        cancel: &(dyn Fn() -> bool + Sync),
        report: &(dyn Fn(u64) + Sync),
    ) -> Result<Vec<f32>> {
        self.draft_follow(); // a state left ahead (the session went back): truncated
        let pos0 = self.st.pos();
        let layers = match (&self.ds, &self.model.drafter) {
            (Some(ds), Some(d)) if ds.len() == pos0 => d.target_layers().to_vec(),
            _ => {
                self.ds = None;
                return self
                    .model
                    .forward_reporting(&mut self.st, ids, want, cancel, report);
            }
        };
        let cap = Capture::new(&layers, &[ids.len()], self.model.cfg.hidden_size);
        let mut seqs = [Seq {
            st: &mut self.st,
            ids,
            want,
        }];
        let mut out = self
            .model
            .forward_batch_capturing(&mut seqs, cancel, report, Some(&cap))?;
        let logits = out.pop().unwrap_or_default();
        let rows = cap.into_rows().pop().unwrap_or_default();
        let observed = match self.ds.as_mut() {
            Some(ds) => self.model.drafter_observe(ds, &rows, pos0).is_ok(),
            None => false,
        };
        if !observed {
            self.ds = None;
        }
        Ok(logits)
    }

    /// Brings the drafter state to where the model's state stands after it went back (a
    /// verify's cut back): truncated, or dropped when it cannot be.
    pub(super) fn draft_follow(&mut self) {
        let pos = self.st.pos();
        if let Some(ds) = self.ds.as_mut() {
            if ds.len() != pos && (ds.len() < pos || ds.truncate(pos).is_err()) {
                self.ds = None;
            }
        }
    }

    /// After the model's state went back to `snap`: the snapshot's drafter state when it
    /// has one, else the session's truncated (or none).
    pub(super) fn draft_rollback(&mut self, snap: &Snapshot) {
        match &snap.draft {
            Some(d) if d.len() == snap.pos() => self.ds = Some(d.clone()),
            _ => self.draft_follow(),
        }
    }

    /// At the start of a generation that drafts with DSpark: an empty session starts keeping
    /// a drafter state (its prompt is then observed as it is fed).
    pub(super) fn draft_begin(&mut self, spec: Option<&Speculator>) {
        let uses = spec.is_some_and(|s| s.drafter.uses_dspark());
        if uses
            && self.ds.is_none()
            && self.st.pos() == 0
            && self.pending.is_none()
            && self.verified.is_none()
        {
            self.ds = self.model.drafter_state().ok();
        }
    }

    /// How many tokens DSpark drafts at this step of `spec`: None when the step does not
    /// use DSpark (another drafter, or `auto` where DSpark is not predicted to gain); Some(0)
    /// for a plain step (`dspark` with its state out of step, or not predicted to gain).
    pub(super) fn dspark_k(&self, spec: &mut Speculator, room: usize) -> Option<usize> {
        if !spec.drafter.uses_dspark() {
            return None;
        }
        let ready = self
            .ds
            .as_ref()
            .is_some_and(|ds| ds.len() == self.st.pos() && !ds.is_empty());
        let bs = self.model.drafter.as_ref().map_or(0, |d| d.block_size());
        let avail = room.min(bs);
        let k = if ready && avail > 0 {
            match spec.force_k {
                Some(k) => k.min(avail),
                None => spec.dcost.choose(avail),
            }
        } else {
            0
        };
        match spec.drafter {
            Drafter::Auto(_) if k == 0 => None,
            _ => Some(k),
        }
    }

    /// DSpark's draft of up to `k` tokens after `pending`; with `cut`, only up to the first
    /// token whose confidence is below `CONFIDENCE_MIN` (at least one). Nothing when the
    /// draft fails (drafts are only proposals: a step without them is a plain step).
    pub(super) fn dspark_draft(&self, pending: u32, k: usize, cut: bool) -> Vec<u32> {
        let Some(ds) = self.ds.as_ref() else {
            return Vec::new();
        };
        let Ok(d) = self.model.draft(ds, pending, k) else {
            return Vec::new();
        };
        let n = if cut {
            d.iter()
                .take_while(|t| t.1 >= CONFIDENCE_MIN)
                .count()
                .max(1)
        } else {
            d.len()
        };
        d.into_iter().take(n).map(|t| t.0).collect()
    }
}
