//! A sequence's state: per-layer sliding windows and compressor states, the position and the
//! token history. Snapshots are cheap: compressed entries are append-only, so a snapshot
//! keeps their counts plus copies of the small mutable parts (windows, pending buffers,
//! overlap halves), and rollback truncates.

use super::attention::AttnState;
use super::compressor::CompState;
use crate::error::{Error, Result};

#[derive(Clone, Default)]
pub struct State {
    pub layers: Vec<AttnState>,
    pub tokens: Vec<u32>,
    /// The `Model::id` of the model this state belongs to.
    owner: u64,
}

impl State {
    pub fn new(n_layers: usize, owner: u64) -> State {
        State {
            layers: vec![AttnState::default(); n_layers],
            tokens: Vec::new(),
            owner,
        }
    }

    pub fn owner(&self) -> u64 {
        self.owner
    }

    pub fn pos(&self) -> usize {
        self.tokens.len()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            owner: self.owner,
            tokens: self.tokens.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| LayerSnap {
                    window: l.window.clone(),
                    comp: small(&l.comp),
                    idx: small(&l.idx),
                })
                .collect(),
        }
    }

    /// Restores an earlier snapshot of this sequence.
    pub fn rollback(&mut self, s: &Snapshot) -> Result<()> {
        if s.owner != self.owner {
            return Err(Error::arg(
                "this snapshot was taken on a session of another model (a snapshot can only be \
                 restored into a session of the model object that made it)",
            ));
        }
        if s.layers.len() != self.layers.len() || !self.tokens.starts_with(&s.tokens) {
            return Err(Error::arg(format!(
                "snapshot at position {} does not belong to this session's history (position {}); \
                 a snapshot can only restore a prefix of the tokens fed since it was taken",
                s.tokens.len(),
                self.tokens.len()
            )));
        }
        for (l, sn) in self.layers.iter_mut().zip(&s.layers) {
            l.window.clone_from(&sn.window);
            restore(&mut l.comp, &sn.comp);
            restore(&mut l.idx, &sn.idx);
        }
        self.tokens.truncate(s.tokens.len());
        Ok(())
    }
}

#[derive(Clone)]
pub struct Snapshot {
    /// The `Model::id` of the model whose session took it.
    owner: u64,
    pub tokens: Vec<u32>,
    layers: Vec<LayerSnap>,
}

impl Snapshot {
    pub fn pos(&self) -> usize {
        self.tokens.len()
    }
}

#[derive(Clone)]
struct LayerSnap {
    window: Vec<f32>,
    comp: CompSnap,
    idx: CompSnap,
}

#[derive(Clone)]
struct CompSnap {
    pend_kv: Vec<f32>,
    pend_gate: Vec<f32>,
    over_kv: Vec<f32>,
    over_gate: Vec<f32>,
    entries_len: usize,
}

fn small(c: &CompState) -> CompSnap {
    CompSnap {
        pend_kv: c.pend_kv.clone(),
        pend_gate: c.pend_gate.clone(),
        over_kv: c.over_kv.clone(),
        over_gate: c.over_gate.clone(),
        entries_len: c.entries.len(),
    }
}

fn restore(c: &mut CompState, s: &CompSnap) {
    c.pend_kv.clone_from(&s.pend_kv);
    c.pend_gate.clone_from(&s.pend_gate);
    c.over_kv.clone_from(&s.over_kv);
    c.over_gate.clone_from(&s.over_gate);
    c.entries.truncate(s.entries_len);
}
