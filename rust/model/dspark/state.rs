//! A sequence's drafter state: every stage's window keys of the observed positions (the last
//! `sliding_window` are what a draft attends to, `UNDO_POSITIONS` more are kept so that
//! `truncate` can undo a rejected draft's positions), and how many positions were observed.

use super::{DSpark, UNDO_POSITIONS};
use crate::error::{Error, Result};

#[derive(Clone)]
pub struct DraftState {
    /// Positions observed: the next observed row is at position `len`, and a draft's block
    /// starts there.
    len: usize,
    /// The first position whose keys are still kept.
    first: usize,
    /// Per stage [len - first, D]: its window keys of positions first..len.
    keys: Vec<Vec<f32>>,
    /// The stages' sliding window (`sliding_window`) and key width (`head_dim`).
    window: usize,
    d: usize,
    /// The `Model::id` of the model it belongs to.
    owner: u64,
}

impl DraftState {
    pub(super) fn new(dr: &DSpark, window: usize, d: usize, owner: u64) -> DraftState {
        DraftState {
            len: 0,
            first: 0,
            keys: vec![Vec::new(); dr.stages.len()],
            window,
            d,
            owner,
        }
    }

    /// Positions observed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first position `truncate` can go back to from here (0 while nothing was dropped).
    pub fn earliest(&self) -> usize {
        if self.first == 0 {
            0
        } else {
            self.first + self.window
        }
    }

    pub(super) fn owner(&self) -> u64 {
        self.owner
    }

    /// Stage `s`'s keys [n, D] of the last `sliding_window` observed positions (fewer at the
    /// start).
    pub(super) fn window(&self, s: usize) -> &[f32] {
        let k = &self.keys[s];
        let n = k.len() / self.d;
        &k[n.saturating_sub(self.window) * self.d..]
    }

    /// Appends each stage's keys [n, D] of the next n positions, then drops what is beyond
    /// the window plus `UNDO_POSITIONS`.
    pub(super) fn push(&mut self, keys: Vec<Vec<f32>>, n: usize) {
        for (k, new) in self.keys.iter_mut().zip(keys) {
            k.extend_from_slice(&new);
        }
        self.len += n;
        let held = self.len - self.first;
        let keep = self.window + UNDO_POSITIONS;
        if held > keep {
            let drop = held - keep;
            for k in &mut self.keys {
                k.drain(..drop * self.d);
            }
            self.first += drop;
        }
    }

    /// Forgets the positions from `pos` on (a rejected draft's): the state is then as if only
    /// positions 0..pos had been observed. Fails, changing nothing, when `pos` is past the
    /// observed positions or further back than the kept keys reach (`earliest`).
    pub fn truncate(&mut self, pos: usize) -> Result<()> {
        if pos > self.len {
            return Err(Error::arg(format!(
                "cannot truncate the drafter state to position {pos}: it has observed {} positions",
                self.len
            )));
        }
        if pos < self.earliest() {
            return Err(Error::arg(format!(
                "cannot truncate the drafter state to position {pos}: it can go back to position {} \
                 (the window of {} plus {UNDO_POSITIONS} to undo); observe again from a fresh state",
                self.earliest(),
                self.window
            )));
        }
        let keep = (pos - self.first) * self.d;
        for k in &mut self.keys {
            k.truncate(keep);
        }
        self.len = pos;
        Ok(())
    }
}
