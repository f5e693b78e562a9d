//! When drafting pays: a cost model from measured pass times and the drafter's running
//! acceptance, which picks how many drafted tokens to verify each step (0: a plain step).
//!
//! A pass that feeds `m` tokens costs `t(m)`; a plain decode step is `t(1)`. Verifying `k`
//! drafts feeds `k + 1` tokens (the pending one and the drafts) and yields, when each draft
//! is right with probability `a` independently, `1 + a + a² + … + a^k` tokens on average
//! (the tokens accepted, then the one sampled where the first draft failed, or after the
//! last). Drafting `k` pays when that many tokens per `t(k + 1)` beat one per `t(1)`.
//!
//! `t(m)` is the running average of measured passes of `m` tokens; a size not measured yet is
//! predicted on the line through the sizes that were (a plain step and, measured by the first
//! verifies, a pass of two). Until passes of two were measured three times (one may meet a
//! cold cache), each opportunity verifies one draft: what one more token costs differs too much between machines (a few percent of
//! a step when the experts are in RAM, nearly a whole step when each token's experts come from
//! disk) for any figure but a measured one. The acceptance starts from a prior of one half
//! worth two observations and then follows the drafter (each verify counts its accepted
//! drafts as successes and the first rejected one as a failure; older observations decay).
//! Where drafting is predicted to lose, only an occasional probe (one draft) keeps the
//! acceptance current, which bounds what a drafter that is never right costs.
//!
//! A drafter that costs time to draft (DSpark: a pass of its stages, `observe_draft`) adds its
//! measured draft time `d(k)` to the pass: verifying `k` drafts pays when
//! `E(a, k) / (t(k + 1) + d(k))` beats `1 / t(1)`. The draft is made before `k` is verified,
//! so it is only made when `choose` picked `k > 0`; its probes come as much rarer as a probe
//! costs more than a plain step (`probe_every`), so that a drafter that never pays costs at
//! most about a thirty-second of a step's time.

/// Most drafts verified in one pass.
pub const K_MAX: usize = 6;
/// A draft must be predicted to gain at least this much (a fraction of the plain step's
/// speed) to be verified: noise in the measured times must not make drafting lose.
const MARGIN: f64 = 0.03;
/// While drafting is predicted to lose, one opportunity in this many verifies a single draft.
const PROBE_EVERY: u32 = 32;
/// Passes of two measured before their average is trusted (one may meet a cold cache).
const EXPLORE: u32 = 3;
/// Weight of the newest pass time in its running average, and of an acceptance observation.
const TIME_WEIGHT: f64 = 0.2;
const ACCEPT_DECAY: f64 = 0.97;

#[derive(Debug, Clone)]
pub struct CostModel {
    /// Running average of measured pass times by tokens fed (index m; 0 unused).
    t: [Option<f64>; K_MAX + 2],
    /// Passes measured by size.
    seen: [u32; K_MAX + 2],
    /// Acceptance observations (decayed): successes and trials.
    succ: f64,
    trials: f64,
    since_probe: u32,
    /// Running average of measured draft times by drafts made (index k; 0 unused): zero for
    /// a drafter never timed (prompt lookup, free to make).
    draft: [Option<f64>; K_MAX + 2],
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            t: [None; K_MAX + 2],
            seen: [0; K_MAX + 2],
            succ: 1.0,
            trials: 2.0,
            since_probe: 0,
            draft: [None; K_MAX + 2],
        }
    }
}

/// The tokens a verify of `k` drafts yields on average at acceptance `a`.
pub fn expected_tokens(a: f64, k: usize) -> f64 {
    let mut e = 0.0;
    let mut p = 1.0;
    for _ in 0..=k {
        e += p;
        p *= a;
    }
    e
}

impl CostModel {
    pub fn new() -> CostModel {
        CostModel::default()
    }

    /// Records a pass that fed `m` tokens and took `secs`.
    pub fn observe_pass(&mut self, m: usize, secs: f64) {
        if m == 0 || m >= self.t.len() || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        self.seen[m] = self.seen[m].saturating_add(1);
        self.t[m] = Some(match self.t[m] {
            None => secs,
            Some(old) => old + TIME_WEIGHT * (secs - old),
        });
    }

    /// Records a draft of `k` tokens that took `secs` to make.
    pub fn observe_draft(&mut self, k: usize, secs: f64) {
        if k == 0 || k >= self.draft.len() || !secs.is_finite() || secs < 0.0 {
            return;
        }
        self.draft[k] = Some(match self.draft[k] {
            None => secs,
            Some(old) => old + TIME_WEIGHT * (secs - old),
        });
    }

    /// What drafting `k` tokens costs: measured, else the most any measured draft took (a
    /// DSpark draft runs its whole block whatever k, so k changes it by tens of percent at
    /// most; a k chosen on that guess is measured from then on), else 0 (a drafter never
    /// timed is free).
    pub fn draft_time(&self, k: usize) -> f64 {
        if let Some(Some(t)) = self.draft.get(k) {
            return *t;
        }
        self.draft.iter().flatten().fold(0.0, |a, &t| a.max(t))
    }

    /// Records a verify of `k` drafts of which the first `accepted` were right.
    pub fn observe_verify(&mut self, k: usize, accepted: usize) {
        if k == 0 {
            return;
        }
        let accepted = accepted.min(k);
        self.succ = self.succ * ACCEPT_DECAY + accepted as f64;
        self.trials =
            self.trials * ACCEPT_DECAY + accepted as f64 + f64::from(u8::from(accepted < k));
    }

    /// The running estimate of the probability that a draft is right.
    pub fn acceptance(&self) -> f64 {
        if self.trials <= 0.0 {
            0.0
        } else {
            (self.succ / self.trials).clamp(0.0, 1.0)
        }
    }

    /// The cost of a pass of `m` tokens: measured, else predicted; None before a plain step
    /// was measured.
    pub fn pass_time(&self, m: usize) -> Option<f64> {
        if m == 0 || m >= self.t.len() {
            return None;
        }
        if let Some(t) = self.t[m] {
            return Some(t);
        }
        let t1 = self.t[1]?;
        Some(t1 + (m - 1) as f64 * self.per_extra_token(t1))
    }

    /// What one more token adds to a pass: a line through the measured passes when there
    /// are two or more, else (nothing known) as much as a plain step.
    fn per_extra_token(&self, t1: f64) -> f64 {
        let pts: Vec<(f64, f64)> = self
            .t
            .iter()
            .enumerate()
            .filter_map(|(m, t)| t.map(|t| (m as f64, t)))
            .collect();
        if pts.len() >= 2 {
            let n = pts.len() as f64;
            let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
            let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
            let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
            let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
            if sxx > 0.0 {
                return (sxy / sxx).max(0.0);
            }
        }
        t1
    }

    /// The predicted speed-up of verifying `k` drafts over plain steps (1.0 for k = 0), the
    /// draft's time included.
    pub fn gain(&self, k: usize) -> Option<f64> {
        let t1 = self.pass_time(1)?;
        let tk = self.pass_time(k + 1)?;
        let dk = if k == 0 { 0.0 } else { self.draft_time(k) };
        Some(expected_tokens(self.acceptance(), k) / (tk + dk) * t1)
    }

    /// Opportunities between probes: `PROBE_EVERY`, times what a probe costs over a plain
    /// step in plain steps (at least once): a probe of a free drafter costs one token more
    /// in a pass, one of DSpark also a draft.
    fn probe_every(&self) -> u32 {
        let (Some(t1), Some(t2)) = (self.pass_time(1), self.pass_time(2)) else {
            return PROBE_EVERY;
        };
        let extra = (t2 - t1).max(0.0) + self.draft_time(1);
        let times = (extra / t1).ceil().clamp(1.0, 1000.0);
        PROBE_EVERY.saturating_mul(times as u32)
    }

    /// How many of `available` drafted tokens to verify: the `k` with the best predicted
    /// gain when it beats a plain step by the margin; otherwise 0, except for an occasional
    /// one-draft probe (which keeps the acceptance and `t(2)` measured).
    pub fn choose(&mut self, available: usize) -> usize {
        let available = available.min(K_MAX);
        if available == 0 || self.pass_time(1).is_none() {
            return 0;
        }
        if self.seen[2] < EXPLORE {
            return 1; // measure what one more token costs
        }
        let mut best = (1.0 + MARGIN, 0);
        for k in 1..=available {
            if let Some(g) = self.gain(k) {
                if g > best.0 {
                    best = (g, k);
                }
            }
        }
        if best.1 > 0 {
            self.since_probe = 0;
            return best.1;
        }
        self.since_probe += 1;
        if self.since_probe >= self.probe_every() {
            self.since_probe = 0;
            return 1;
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(t: &[(usize, f64)]) -> CostModel {
        let mut c = CostModel::new();
        for &(m, s) in t {
            for _ in 0..EXPLORE {
                c.observe_pass(m, s);
            }
        }
        c
    }

    #[test]
    fn expected_tokens_is_the_geometric_sum() {
        assert_eq!(expected_tokens(0.0, 4), 1.0);
        assert_eq!(expected_tokens(1.0, 4), 5.0);
        assert!((expected_tokens(0.5, 2) - 1.75).abs() < 1e-12);
    }

    #[test]
    fn nothing_is_drafted_before_a_plain_step_was_measured() {
        let mut c = CostModel::new();
        assert_eq!(c.choose(4), 0);
        c.observe_pass(1, 1.0);
        assert!(c.pass_time(1).is_some());
    }

    #[test]
    fn cheap_passes_and_good_drafts_verify_many() {
        // passes barely cost more per token (experts in RAM, dense reads dominate)
        let mut c = measured(&[(1, 1.0), (2, 1.05), (3, 1.1), (5, 1.2)]);
        for _ in 0..50 {
            c.observe_verify(4, 4);
        }
        assert!(c.acceptance() > 0.9);
        assert_eq!(c.choose(4), 4);
        assert_eq!(c.choose(2), 2); // only what is available
    }

    #[test]
    fn expensive_passes_or_bad_drafts_verify_none() {
        // every token costs a plain step's time (experts streamed from disk)
        let mut c = measured(&[(1, 1.0), (2, 2.0), (3, 3.0)]);
        for _ in 0..50 {
            c.observe_verify(2, 2);
        }
        assert_eq!(
            c.choose(4),
            0,
            "a pass of k+1 tokens costs k+1 steps: never a gain"
        );
        // cheap passes but drafts that are never right
        let mut c = measured(&[(1, 1.0), (2, 1.05), (3, 1.1)]);
        for _ in 0..50 {
            c.observe_verify(2, 0);
        }
        assert!(c.acceptance() < 0.05);
        assert_eq!(c.choose(4), 0);
    }

    #[test]
    fn a_losing_drafter_is_probed_rarely() {
        let mut c = measured(&[(1, 1.0), (2, 1.05)]);
        for _ in 0..50 {
            c.observe_verify(1, 0);
        }
        let picks: Vec<usize> = (0..(PROBE_EVERY as usize * 3))
            .map(|_| c.choose(4))
            .collect();
        assert_eq!(picks.iter().filter(|&&k| k > 0).count(), 3);
        assert!(picks.iter().all(|&k| k <= 1));
    }

    #[test]
    fn the_first_opportunity_measures_a_pass_of_two() {
        let mut c = measured(&[(1, 1.0)]);
        for _ in 0..EXPLORE {
            assert_eq!(c.choose(5), 1);
            // even when it is slow: then nothing more
            c.observe_pass(2, 2.0);
        }
        assert_eq!(c.choose(5), 0);
    }

    #[test]
    fn unmeasured_pass_sizes_follow_the_measured_line() {
        let mut c = measured(&[(1, 1.0)]);
        // one size measured: one more token is assumed to cost a whole step (never optimistic)
        assert_eq!(c.pass_time(3), Some(3.0));
        // two measured sizes: their line
        c.observe_pass(3, 1.4);
        assert!((c.pass_time(2).unwrap() - 1.2).abs() < 1e-12);
        assert!((c.pass_time(5).unwrap() - 1.8).abs() < 1e-12);
    }

    #[test]
    fn acceptance_counts_the_first_rejection_only() {
        let mut c = CostModel::new();
        c.succ = 0.0;
        c.trials = 0.0;
        c.observe_verify(4, 2); // 2 right, then 1 wrong; the 4th was never judged
        assert!((c.acceptance() - 2.0 / 3.0).abs() < 1e-12);
        c.observe_verify(3, 3); // all right, no failure
        assert!(c.acceptance() > 2.0 / 3.0);
    }

    #[test]
    fn the_draft_time_counts_against_the_gain() {
        // cheap passes and good drafts: verified when drafting is free
        let mut c = measured(&[(1, 1.0), (2, 1.05), (3, 1.1), (5, 1.2)]);
        for _ in 0..50 {
            c.observe_verify(4, 3);
        }
        assert!(c.choose(4) > 0);
        assert_eq!(c.draft_time(3), 0.0, "nothing timed: free");
        // a draft that costs 3 plain steps: never a gain at this acceptance (3/4: at most
        // 3.05 tokens per 4.2 steps)
        c.observe_draft(4, 3.0);
        assert_eq!(c.draft_time(4), 3.0);
        assert_eq!(
            c.draft_time(2),
            3.0,
            "unmeasured sizes: the most any draft took"
        );
        assert!(c.gain(4).unwrap() < 1.0);
        assert_eq!(c.choose(4), 0);
        // ... and it is probed more rarely than a free drafter
        assert!(c.probe_every() >= 2 * PROBE_EVERY);
        let picks = (0..(PROBE_EVERY as usize * 4))
            .filter(|_| c.choose(4) > 0)
            .count();
        assert!(picks <= 2, "{picks} probes");
        // a cheap draft (the full model: a step takes seconds) keeps the gain
        let mut c = measured(&[(1, 1.0), (2, 1.05), (3, 1.1), (5, 1.2)]);
        for _ in 0..50 {
            c.observe_verify(4, 3);
        }
        c.observe_draft(4, 0.05);
        assert!(c.gain(4).unwrap() > 1.5);
        assert!(c.choose(4) > 0);
        c.observe_draft(0, 9.0);
        c.observe_draft(3, f64::NAN);
        assert_eq!(c.draft_time(3), 0.05);
    }

    #[test]
    fn odd_measurements_are_ignored() {
        let mut c = CostModel::new();
        c.observe_pass(0, 1.0);
        c.observe_pass(1, f64::NAN);
        c.observe_pass(1, -1.0);
        c.observe_pass(K_MAX + 5, 1.0);
        assert_eq!(c.pass_time(1), None);
    }
}
