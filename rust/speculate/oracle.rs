//! A benchmark-only drafter whose acceptance is chosen: it knows the continuation (recorded
//! by a first, plain greedy run) and proposes each next token right with probability `p`
//! (from a seeded stream), else a wrong one. The synthetic checkpoints have random weights,
//! so no real drafter is ever right on them; this one measures the verification machinery
//! at a given acceptance. `bench --speculate oracle:P` is its only way in.

/// The oracle: the recorded continuation after the prompt, the probability that a drafted
/// token is right, and its random stream.
#[derive(Debug, Clone)]
pub struct Oracle {
    /// The prompt's length: `truth[i]` is the token at position `prompt_len + i`.
    prompt_len: usize,
    truth: Vec<u32>,
    p: f64,
    state: u64,
    vocab: u32,
}

impl Oracle {
    pub fn new(prompt_len: usize, truth: Vec<u32>, p: f64, seed: u64, vocab: u32) -> Oracle {
        Oracle {
            prompt_len,
            truth,
            p: p.clamp(0.0, 1.0),
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
            vocab: vocab.max(2),
        }
    }

    /// A uniform draw in [0, 1) (splitmix64).
    fn uniform(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Up to `k` tokens after `seq` (the whole sequence so far): each the recorded one with
    /// probability `p`, else another. Nothing past the recorded continuation.
    pub fn propose(&mut self, seq: &[u32], k: usize) -> Vec<u32> {
        let Some(at) = seq.len().checked_sub(self.prompt_len) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(k);
        for i in at..(at + k).min(self.truth.len()) {
            let right = self.truth[i];
            out.push(if self.uniform() < self.p {
                right
            } else {
                (right + 1) % self.vocab
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_the_recorded_continuation_at_the_chosen_rate() {
        let truth: Vec<u32> = (0..4000).map(|i| (i * 7 % 100) as u32).collect();
        let prompt = vec![1u32; 10];
        let mut o = Oracle::new(10, truth.clone(), 1.0, 1, 100);
        let mut seq = prompt.clone();
        seq.extend_from_slice(&truth[..5]);
        assert_eq!(o.propose(&seq, 3), truth[5..8].to_vec());
        let mut o = Oracle::new(10, truth.clone(), 0.0, 1, 100);
        assert!(o
            .propose(&seq, 3)
            .iter()
            .zip(&truth[5..8])
            .all(|(a, b)| a != b));
        let mut o = Oracle::new(10, truth.clone(), 0.7, 42, 100);
        let mut right = 0;
        for i in 0..3000 {
            let s: Vec<u32> = prompt.iter().chain(&truth[..i]).copied().collect();
            right += (o.propose(&s, 1)[0] == truth[i]) as usize;
        }
        let rate = right as f64 / 3000.0;
        assert!((0.65..0.75).contains(&rate), "{rate}");
        // nothing beyond the recorded tokens, nor before the prompt ends
        let all: Vec<u32> = prompt.iter().chain(&truth).copied().collect();
        assert!(o.propose(&all, 3).is_empty());
        assert!(o.propose(&prompt[..5], 3).is_empty());
    }
}
