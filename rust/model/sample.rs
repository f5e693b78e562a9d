//! Token selection: greedy when temperature is 0, else temperature / top-k / top-p sampling
//! from a seeded generator (SplitMix64), so a given seed always gives the same tokens.

use crate::error::{Error, Result};

#[derive(Clone, Debug)]
pub struct SampleParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub seed: u64,
}

impl SampleParams {
    pub fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(Error::arg(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::arg(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        Ok(())
    }
}

pub struct Sampler {
    p: SampleParams,
    state: u64,
}

impl Sampler {
    pub fn new(p: SampleParams) -> Sampler {
        let state = p.seed ^ 0x9E37_79B9_7F4A_7C15;
        Sampler { p, state }
    }

    fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn pick(&mut self, logits: &[f32]) -> u32 {
        if self.p.temperature == 0.0 {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.p.temperature as f64;
        let mut cand: Vec<(f64, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (l as f64 * inv_t, i as u32))
            .collect();
        cand.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        if self.p.top_k > 0 && self.p.top_k < cand.len() {
            cand.truncate(self.p.top_k);
        }
        let m = cand[0].0;
        let mut probs: Vec<f64> = cand.iter().map(|c| (c.0 - m).exp()).collect();
        let total: f64 = probs.iter().sum();
        for p in probs.iter_mut() {
            *p /= total;
        }
        if self.p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, p) in probs.iter().enumerate() {
                acc += p;
                if acc >= self.p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            let t: f64 = probs.iter().sum();
            for p in probs.iter_mut() {
                *p /= t;
            }
        }
        let r = self.next_f64();
        let mut acc = 0.0;
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if r < acc {
                return cand[i].1;
            }
        }
        cand[probs.len() - 1].1
    }
}

/// Index of the largest logit (the lowest index among equal maxima).
pub fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded() {
        let l = [0.1f32, 2.0, 1.9, -1.0];
        let mut g = Sampler::new(SampleParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        });
        assert_eq!(g.pick(&l), 1);
        let run = |seed| {
            let mut s = Sampler::new(SampleParams {
                temperature: 1.0,
                top_p: 1.0,
                top_k: 0,
                seed,
            });
            (0..50).map(|_| s.pick(&l)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut k1 = Sampler::new(SampleParams {
            temperature: 5.0,
            top_p: 1.0,
            top_k: 1,
            seed: 3,
        });
        assert!((0..20).all(|_| k1.pick(&l) == 1));
        let mut p = Sampler::new(SampleParams {
            temperature: 1.0,
            top_p: 0.3,
            top_k: 0,
            seed: 3,
        });
        assert!(
            (0..20).all(|_| p.pick(&l) == 1),
            "top_p keeps only the head"
        );
    }
}
