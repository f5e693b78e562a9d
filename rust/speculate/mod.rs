//! Speculative decoding: a drafter proposes the next tokens, the target verifies them in one
//! forward pass (`model::generate::Session`'s speculative step), and a cost model decides,
//! step by step, how many drafts are worth verifying. Verification samples every position
//! exactly as plain generation would, so the output never depends on the drafter: a wrong
//! draft only costs time. docs/model.md §6 describes it.
//!
//! - `lookup`: prompt lookup (n-gram) drafting, free to make;
//! - `cost`: the cost model (measured pass times, running acceptance);
//! - `oracle`: the benchmark-only drafter of a chosen acceptance.

pub mod cost;
pub mod lookup;
pub mod oracle;

use crate::error::{Error, Result};

/// What `--speculate` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Plain decoding.
    Off,
    /// Prompt lookup, verified whenever the cost model predicts a gain.
    Lookup,
    /// The checkpoint's DSpark drafter (0731 checkpoints).
    DSpark,
    /// The best drafter the checkpoint and the cost model allow; never predicted to lose.
    #[default]
    Auto,
}

/// `--speculate`'s words, in the order the help lists them.
pub const MODES: &[&str] = &["off", "lookup", "dspark", "auto"];

impl Mode {
    pub fn from_name(s: &str) -> Option<Mode> {
        [Mode::Off, Mode::Lookup, Mode::DSpark, Mode::Auto]
            .into_iter()
            .find(|m| m.name() == s)
    }

    pub fn parse(s: &str) -> Result<Mode> {
        Mode::from_name(s).ok_or_else(|| {
            Error::arg(format!(
                "speculate must be one of {}, got {s:?}",
                MODES.join(", ")
            ))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Lookup => "lookup",
            Mode::DSpark => "dspark",
            Mode::Auto => "auto",
        }
    }
}

/// A drafter a generation uses.
#[derive(Debug, Clone)]
pub enum Drafter {
    Lookup(lookup::PromptLookup),
    Oracle(oracle::Oracle),
    /// The checkpoint's DSpark drafter (`model::dspark`): it drafts from the session's drafter
    /// state, so the session drafts for it (`generate::Session`), not `propose`.
    DSpark,
    /// `auto` on a model with its DSpark drafter loaded: DSpark at the steps where its cost
    /// model predicts a gain, prompt lookup at the others.
    Auto(lookup::PromptLookup),
}

impl Drafter {
    /// Up to `k` tokens to follow `seq` (the whole sequence, the pending token included)
    /// from the drafters that need nothing but the sequence (DSpark proposes nothing here).
    pub fn propose(&mut self, seq: &[u32], k: usize) -> Vec<u32> {
        match self {
            Drafter::Lookup(l) | Drafter::Auto(l) => l.propose(seq, k),
            Drafter::Oracle(o) => o.propose(seq, k),
            Drafter::DSpark => Vec::new(),
        }
    }

    /// Whether it drafts with DSpark (at least at some steps): the session then keeps its
    /// drafter state in step with the model's.
    pub fn uses_dspark(&self) -> bool {
        matches!(self, Drafter::DSpark | Drafter::Auto(_))
    }
}

/// What speculation did, for `stats()` and the server's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// Verify passes (each fed the pending token and at least one draft).
    pub verifies: u64,
    /// Drafted tokens verified, and how many of them were right.
    pub drafted: u64,
    pub accepted: u64,
    /// Plain steps taken while a drafter was on.
    pub plain_steps: u64,
    /// Seconds saved: per verify, the plain steps its tokens would have cost (at the
    /// measured plain-step time) minus its own time; negative when drafting lost.
    pub saved_s: f64,
}

impl SpecStats {
    pub fn add(&mut self, o: &SpecStats) {
        self.verifies += o.verifies;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.plain_steps += o.plain_steps;
        self.saved_s += o.saved_s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_name_each_other() {
        for &m in MODES {
            assert_eq!(Mode::parse(m).unwrap().name(), m);
        }
        let e = Mode::parse("oracle:0.7").unwrap_err().to_string();
        assert!(
            e.contains("off, lookup, dspark, auto") && e.contains("oracle"),
            "{e}"
        );
    }
}
