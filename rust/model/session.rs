//! A sequence's state: per-layer sliding windows and compressor states, the position and the
//! token history. Snapshots are cheap: compressed entries are append-only, so a snapshot
//! keeps their counts plus copies of the small mutable parts (windows, pending buffers,
//! overlap halves), and rollback truncates. `file` saves a state to disk and reads it back.

pub mod file;
mod format;
mod identity;

use super::attention::AttnState;
use super::compressor::CompState;
use crate::error::{Error, Result};

/// What a session file records of the model it belongs to (tensor table and small weights
/// hashed, the numerics mode, the kernel tier): a state only ever resumes on the same.
pub fn model_identity(m: &super::Model) -> serde_json::Map<String, serde_json::Value> {
    identity::of(m)
}

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

    /// A snapshot of this state, without logits (`Snapshot::logits`).
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            logits: None,
            draft: None,
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

    /// A state restored from its parts (a session file, `file.rs`): the caller has
    /// checked every length against the model's geometry.
    pub fn from_parts(layers: Vec<AttnState>, tokens: Vec<u32>, owner: u64) -> State {
        State {
            layers,
            tokens,
            owner,
        }
    }

    /// The whole state, borrowed (for saving it).
    pub fn view(&self) -> StateView<'_> {
        StateView {
            tokens: &self.tokens,
            layers: self
                .layers
                .iter()
                .map(|l| LayerView {
                    window: &l.window,
                    comp: CompView::of(&l.comp, l.comp.entries.len()),
                    idx: CompView::of(&l.idx, l.idx.entries.len()),
                })
                .collect(),
        }
    }

    /// The state this sequence had at snapshot `s`, borrowed: the snapshot's windows,
    /// pending buffers and overlap halves, and the first entries of this state (entries are
    /// append-only, so those are the snapshot's). Refuses a snapshot `rollback` would refuse.
    pub fn view_at<'a>(&'a self, s: &'a Snapshot) -> Result<StateView<'a>> {
        self.check_snapshot(s)?;
        Ok(StateView {
            tokens: &s.tokens,
            layers: self
                .layers
                .iter()
                .zip(&s.layers)
                .map(|(l, sn)| LayerView {
                    window: &sn.window,
                    comp: CompView::at(&l.comp, &sn.comp),
                    idx: CompView::at(&l.idx, &sn.idx),
                })
                .collect(),
        })
    }

    /// Whether `s` can be restored into this sequence: same model, a prefix of its tokens.
    fn check_snapshot(&self, s: &Snapshot) -> Result<()> {
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
        // entries are append-only: a snapshot never counts more than the state holds
        let short = |c: &CompState, sn: &CompSnap| sn.entries_len > c.entries.len();
        if self
            .layers
            .iter()
            .zip(&s.layers)
            .any(|(l, sn)| short(&l.comp, &sn.comp) || short(&l.idx, &sn.idx))
        {
            return Err(Error::arg(
                "internal: the snapshot counts more compressed entries than the session holds",
            ));
        }
        Ok(())
    }

    /// Restores an earlier snapshot of this sequence.
    pub fn rollback(&mut self, s: &Snapshot) -> Result<()> {
        self.check_snapshot(s)?;
        for (l, sn) in self.layers.iter_mut().zip(&s.layers) {
            l.window.clone_from(&sn.window);
            restore(&mut l.comp, &sn.comp);
            restore(&mut l.idx, &sn.idx);
        }
        self.tokens.truncate(s.tokens.len());
        Ok(())
    }
}

/// The speculative verify's journal (docs/model.md §9): while it is open, every compressor
/// logs the projections pushed into it, so that `cut_back` can keep any number of the tokens
/// fed since `journal_begin` without running them again.
impl State {
    /// Opens the journal; returns the state's snapshot, which `cut_back` goes back to.
    pub fn journal_begin(&mut self) -> Snapshot {
        for l in &mut self.layers {
            l.comp.log = Some(Box::default());
            l.idx.log = Some(Box::default());
        }
        self.snapshot()
    }

    /// Closes the journal (its logs dropped).
    pub fn journal_end(&mut self) {
        for l in &mut self.layers {
            l.comp.log = None;
            l.idx.log = None;
        }
    }

    /// Keeps the first `keep` of the tokens fed since `journal_begin` returned `before`, as
    /// if only they had been fed, and closes the journal. A window row is `d` floats and a
    /// window keeps `keep_rows` (W - 1) rows: the tokens fed since `before` must all still be
    /// in it (no more than `keep_rows`). Compressors go back to `before` and are given the
    /// kept tokens' logged projections again through `repush(layer, indexer?, state, kv,
    /// gate, tokens)`, which emits the same entries as the pass did. On error the state is
    /// unchanged and the journal stays open.
    pub fn cut_back(
        &mut self,
        before: &Snapshot,
        keep: usize,
        d: usize,
        keep_rows: usize,
        mut repush: impl FnMut(usize, bool, &mut CompState, &[f32], &[f32], usize),
    ) -> Result<()> {
        self.check_snapshot(before)?;
        let n = self.pos() - before.pos();
        if keep > n || n > keep_rows {
            return Err(Error::arg(format!(
                "internal: cannot keep {keep} of the {n} tokens fed since the journal opened \
                 (at most the {keep_rows} a window holds)"
            )));
        }
        let logged = |c: &CompState| c.log.as_ref().map(|l| l.0.len() == l.1.len());
        if self
            .layers
            .iter()
            .any(|l| logged(&l.comp) != Some(true) || logged(&l.idx) != Some(true))
        {
            return Err(Error::arg("internal: the state's journal is not open"));
        }
        for (li, (l, sn)) in self.layers.iter_mut().zip(&before.layers).enumerate() {
            // the window: the snapshot's rows, then the kept new rows (the last n of the
            // window are the pass's, n <= W - 1), its last W - 1 rows
            let rows = l.window.len() / d;
            let new = &l.window[(rows - n) * d..(rows - n + keep) * d];
            let mut w = Vec::with_capacity(sn.window.len() + new.len());
            w.extend_from_slice(&sn.window);
            w.extend_from_slice(new);
            let total = w.len() / d;
            let drop = total - total.min(keep_rows);
            l.window = w.split_off(drop * d);
            for (idx, (c, cs)) in [(&mut l.comp, &sn.comp), (&mut l.idx, &sn.idx)]
                .into_iter()
                .enumerate()
            {
                let log = c.log.take().unwrap_or_default();
                restore(c, cs);
                let (kv, gate) = (&log.0, &log.1);
                if n > 0 && !kv.is_empty() && keep > 0 {
                    let width = kv.len() / n;
                    repush(
                        li,
                        idx == 1,
                        c,
                        &kv[..keep * width],
                        &gate[..keep * width],
                        keep,
                    );
                }
            }
        }
        self.tokens.truncate(before.pos() + keep);
        Ok(())
    }
}

/// A restorable point of a sequence: the state's small mutable parts, the entry counts, and
/// (a generating session's, `generate::Session::snapshot`) the logits after its last token.
///
/// It keeps those logits so that generating right after a rollback samples from them. The
/// alternative, recomputing them by re-feeding the last token, would need the state *before*
/// that token, which the snapshot does not hold (windows and compressor buffers are
/// overwritten in place; only compressed entries are append-only): it would take a second
/// snapshot one token earlier (every layer's window again, far more than one row) plus a
/// decode step per rollback (expert reads from disk). One vocabulary row (~0.5 MB for V4
/// Flash, a few percent of the snapshot's windows) costs less, and restores the logits bit
/// for bit by construction.
#[derive(Clone)]
pub struct Snapshot {
    /// The `Model::id` of the model whose session took it.
    owner: u64,
    pub tokens: Vec<u32>,
    layers: Vec<LayerSnap>,
    /// The logits after the last token, when the session had them (None for the state's own
    /// snapshots, `State::snapshot`).
    pub logits: Option<Vec<f32>>,
    /// The DSpark drafter's state at the snapshot, when the session kept one in step
    /// (`generate::Session::snapshot`), so that a rollback keeps drafting with DSpark.
    pub draft: Option<super::dspark::DraftState>,
}

impl Snapshot {
    /// Tokens in the sequence at the snapshot.
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

/// One compressor's state, borrowed (see `StateView`).
pub struct CompView<'a> {
    pub pend_kv: &'a [f32],
    pub pend_gate: &'a [f32],
    pub over_kv: &'a [f32],
    pub over_gate: &'a [f32],
    pub entries: &'a [f32],
}

impl<'a> CompView<'a> {
    fn of(c: &'a CompState, entries_len: usize) -> CompView<'a> {
        CompView {
            pend_kv: &c.pend_kv,
            pend_gate: &c.pend_gate,
            over_kv: &c.over_kv,
            over_gate: &c.over_gate,
            entries: &c.entries[..entries_len],
        }
    }

    fn at(c: &'a CompState, s: &'a CompSnap) -> CompView<'a> {
        CompView {
            pend_kv: &s.pend_kv,
            pend_gate: &s.pend_gate,
            over_kv: &s.over_kv,
            over_gate: &s.over_gate,
            entries: &c.entries[..s.entries_len],
        }
    }

    /// The five arrays in file order (docs/architecture.md §7.1).
    pub fn arrays(&self) -> [&'a [f32]; 5] {
        [
            self.pend_kv,
            self.pend_gate,
            self.over_kv,
            self.over_gate,
            self.entries,
        ]
    }
}

/// One layer's attention state, borrowed.
pub struct LayerView<'a> {
    pub window: &'a [f32],
    pub comp: CompView<'a>,
    pub idx: CompView<'a>,
}

impl<'a> LayerView<'a> {
    /// The layer's eleven arrays in file order: the window, then the compressor's five, then
    /// the indexer's five.
    pub fn arrays(&self) -> [&'a [f32]; 11] {
        let [a, b, c, d, e] = self.comp.arrays();
        let [f, g, h, i, j] = self.idx.arrays();
        [self.window, a, b, c, d, e, f, g, h, i, j]
    }
}

/// A sequence's state (now, or as it was at a snapshot), borrowed: what a session file holds
/// besides the generation's pending token and logits.
pub struct StateView<'a> {
    pub tokens: &'a [u32],
    pub layers: Vec<LayerView<'a>>,
}

impl AttnState {
    /// A layer state from its eleven arrays in file order (`LayerView::arrays`).
    pub fn from_arrays(a: [Vec<f32>; 11]) -> AttnState {
        let [window, a1, b1, c1, d1, e1, a2, b2, c2, d2, e2] = a;
        let comp = |pend_kv, pend_gate, over_kv, over_gate, entries| CompState {
            pend_kv,
            pend_gate,
            over_kv,
            over_gate,
            entries,
            log: None,
        };
        AttnState {
            window,
            comp: comp(a1, b1, c1, d1, e1),
            idx: comp(a2, b2, c2, d2, e2),
        }
    }
}
