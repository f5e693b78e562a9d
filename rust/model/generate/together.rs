//! Several generations stepped in one forward pass (`Session::step_together`), the
//! scheduler's unit of work (`crate::schedule`, docs/architecture.md §7.4): each generation's
//! step feeds its pending token or a part of its prompt, all in one `feed_batch`, then
//! samples as its plain `step` would.
//!
//! Why a generation's tokens are the ones it gets alone: the batched pass gives each
//! sequence the bits of feeding it alone (`Model::forward_batch`), feeding a prompt in parts
//! gives the bits of feeding it whole (every product is per token, docs/architecture.md
//! §5.5), and the sampling is `step`'s own (`Session::sample`, seed + step index). A turn
//! alone in its batch is a plain `step`, speculation included.

use super::{BatchFeed, Generation, Session};
use crate::error::{Error, Result};
use crate::model::session::Snapshot;
use crate::model::Want;

/// One generation's part of `Session::step_together`.
pub struct Turn<'a> {
    pub session: &'a mut Session,
    pub gen: &'a mut Generation,
    /// The most prompt tokens this step may feed (at least 1): a longer prompt is fed in
    /// parts, one per step, and the step that feeds its last part samples.
    pub prefill: usize,
}

/// What a turn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// Fed this many of the prompt's tokens (a part); nothing sampled yet.
    Fed(usize),
    /// Sampled this token (as `step` returns it).
    Token(u32),
    /// The generation had stopped: nothing sampled (`step` returning `None`).
    Done,
}

/// Where a session stood before a prompt fed in parts (`Session::mark`): `restore` takes it
/// back there when the rest is abandoned (cancelled, failed), as a feed in one pass that
/// fails leaves the session unchanged.
pub struct Mark {
    snap: Snapshot,
    pending: Option<u32>,
    last: Option<Vec<f32>>,
}

/// What a turn does in the pass.
enum Plan {
    /// Done without the pass (a verify's token, a stopped generation, an error).
    Settled(Result<Stepped>),
    /// Feeds `ids` (pending token first); samples after them when `sample`.
    Feed {
        ids: Vec<u32>,
        part: usize,
        sample: bool,
    },
}

impl Generation {
    /// Prompt tokens not fed yet.
    pub fn prompt_left(&self) -> usize {
        self.prompt.as_ref().map_or(0, Vec::len)
    }

    /// The prompt tokens not fed yet (for a scheduler that may have to put them back).
    pub fn prompt_rest(&self) -> Option<Vec<u32>> {
        self.prompt.clone()
    }

    /// Puts back prompt tokens that a `Mark`'s restore took out of the session again.
    pub fn set_prompt_rest(&mut self, rest: Option<Vec<u32>>) {
        self.prompt = rest;
    }
}

impl Session {
    /// Where the session stands now, for `restore`.
    pub fn mark(&mut self) -> Result<Mark> {
        self.settle()?;
        Ok(Mark {
            snap: self.st.snapshot(),
            pending: self.pending,
            last: self.last.clone(),
        })
    }

    /// Back to `mark` (taken on this session, which has only grown since).
    pub fn restore(&mut self, mark: &Mark) -> Result<()> {
        self.settle()?;
        self.st.rollback(&mark.snap)?;
        self.pending = mark.pending;
        self.last.clone_from(&mark.last);
        Ok(())
    }

    /// One step of each turn's generation, all the feeding in one batched forward pass.
    /// Per turn, as `step` would do it: a token of its verify handed out, or its prompt (up
    /// to `prefill` tokens of it: `Fed`) or pending token fed, then a token sampled; `Done`
    /// once stopped. Every result is the turn's own: an error (a prompt beyond the context,
    /// the pass failing or cancelled) leaves that turn's session and generation as they
    /// were, to be stepped again. The sessions must be distinct and of one model.
    pub fn step_together<C: Fn() -> bool + Sync>(
        turns: &mut [Turn<'_>],
        cancel: &C,
    ) -> Vec<Result<Stepped>> {
        if let [t] = turns {
            if t.gen.prompt_left() <= t.prefill.max(1) {
                let r = t.session.step(t.gen, cancel);
                return vec![r.map(|o| o.map_or(Stepped::Done, Stepped::Token))];
            }
        }
        let mut plans: Vec<Plan> = turns.iter_mut().map(|t| t.plan()).collect();
        let mut feeding: Vec<usize> = Vec::new();
        let mut feeds: Vec<BatchFeed> = Vec::new();
        let mut sampling: Vec<(usize, &mut Generation)> = Vec::new();
        for (i, (t, p)) in turns.iter_mut().zip(&plans).enumerate() {
            if let Plan::Feed { ids, sample, .. } = p {
                if *sample {
                    sampling.push((i, &mut *t.gen));
                }
                if !ids.is_empty() || t.session.pending.is_some() {
                    feeding.push(i);
                    feeds.push(BatchFeed {
                        session: &mut *t.session,
                        ids,
                        want: if *sample { Want::Last } else { Want::None },
                    });
                }
            }
        }
        // the masks of the turns that sample under a grammar, computed while the pass runs
        let (fed, masks) = std::thread::scope(|s| {
            let hs: Vec<_> = sampling
                .iter_mut()
                .filter_map(|(i, g)| match g.constraint.as_mut() {
                    Some(c) if !c.waiting() => Some((*i, s.spawn(move || c.mask()))),
                    _ => None,
                })
                .collect();
            let fed = Session::feed_batch(&mut feeds, cancel);
            let masks: Vec<(usize, Result<crate::grammar::Mask>)> = hs
                .into_iter()
                .map(|(i, h)| {
                    let m = h.join().unwrap_or_else(|_| {
                        Err(Error::arg("internal: computing the grammar's mask failed"))
                    });
                    (i, m)
                })
                .collect();
            (fed, masks)
        });
        drop(feeds);
        drop(sampling);
        if let Err(e) = fed {
            for &i in &feeding {
                plans[i] = Plan::Settled(Err(e.duplicate()));
            }
        }
        let mut masks = masks.into_iter().peekable();
        turns
            .iter_mut()
            .zip(plans)
            .enumerate()
            .map(|(i, (t, p))| {
                let mask = masks.next_if(|(j, _)| *j == i).map(|(_, m)| m);
                match p {
                    Plan::Settled(r) => r,
                    Plan::Feed { part, sample, .. } => t.finish(part, sample, mask),
                }
            })
            .collect()
    }
}

impl Turn<'_> {
    /// What this turn does in the pass: `step`'s checks and order.
    fn plan(&mut self) -> Plan {
        let (s, g) = (&mut *self.session, &mut *self.gen);
        if let Some(prompt) = &g.prompt {
            if prompt.is_empty() && s.pending.is_none() && s.last.is_none() {
                return Plan::Settled(Err(Error::arg(if s.st.pos() == 0 {
                    "generate needs at least one token to condition on (the prompt is empty)"
                } else {
                    "internal: the session has no logits to sample from"
                })));
            }
        }
        match s.hand_out(g) {
            Ok(Some(tok)) => return Plan::Settled(Ok(Stepped::Token(tok))),
            Ok(None) => {}
            Err(e) => return Plan::Settled(Err(e)),
        }
        let left = g.prompt_left();
        if g.stopped && g.prompt.is_none() {
            return Plan::Settled(Ok(Stepped::Done));
        }
        let part = left.min(self.prefill.max(1));
        let ids = g.prompt.as_ref().map_or(Vec::new(), |p| p[..part].to_vec());
        let mut all = Vec::with_capacity(ids.len() + 1);
        all.extend(s.pending);
        all.extend_from_slice(&ids);
        if let Err(e) = s.model.check_seq(&s.st, &all) {
            return Plan::Settled(Err(e));
        }
        Plan::Feed {
            ids,
            part,
            sample: !g.stopped && part == left,
        }
    }

    /// After the pass fed `part` prompt tokens: the rest of the prompt waits, or the token
    /// is sampled (`step`'s sampling, under `mask`).
    fn finish(
        &mut self,
        part: usize,
        sample: bool,
        mask: Option<Result<crate::grammar::Mask>>,
    ) -> Result<Stepped> {
        let g = &mut *self.gen;
        if let Some(p) = g.prompt.as_mut() {
            p.drain(..part);
        }
        if !sample {
            if g.prompt_left() == 0 {
                g.prompt = None;
                if g.stopped {
                    return Ok(Stepped::Done);
                }
            }
            return Ok(Stepped::Fed(part));
        }
        let mask = match mask {
            Some(m) => m?,
            None => None,
        };
        g.prompt = None;
        self.session.sample(g, mask.as_ref()).map(Stepped::Token)
    }
}
