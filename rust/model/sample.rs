//! Token selection: greedy when temperature is 0, else temperature / top-k / top-p sampling
//! from a seeded generator (SplitMix64), so a given seed always gives the same tokens.

use crate::args::Arg;
use crate::error::{Error, Result};
use toktrie::SimpleVob;

#[derive(Clone, Debug)]
pub struct SampleParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub seed: u64,
}

impl SampleParams {
    /// The sampling parameters of a request, checked: the one place their rules live (every
    /// front end, Python's API, the CLI and the server's dialects, converts its arguments and
    /// calls this). `seed` None draws a random one. Errors name the parameter first.
    pub fn new(temperature: f64, top_p: f64, top_k: usize, seed: Option<u64>) -> Result<Self> {
        let p = SampleParams {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed: seed.unwrap_or_else(random_seed),
        };
        if !(temperature.is_finite() && temperature >= 0.0 && p.temperature.is_finite()) {
            return Err(Error::arg(format!(
                "temperature must be a finite number >= 0, got {temperature}"
            )));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(Error::arg(format!("top_p must be in (0, 1], got {top_p}")));
        }
        Ok(p)
    }

    /// The sampling parameters from a caller's arguments: `temperature` and `top_p` numbers
    /// (default 1), `top_k` an integer >= 0 (default 0, no limit), `seed` an integer >= 0
    /// (beyond 64 bits its low 64 bits; absent draws one), then `new`'s rules. Also returns
    /// temperature and top_p as given (f64: the caller keeps what it passed).
    pub fn from_args(
        temperature: &Arg,
        top_p: &Arg,
        top_k: &Arg,
        seed: &Arg,
    ) -> Result<(f64, f64, SampleParams)> {
        let t = temperature
            .number("temperature", "a number")?
            .unwrap_or(1.0);
        let p = top_p.number("top_p", "a number")?.unwrap_or(1.0);
        let k = top_k.integer("top_k", 0)?.unwrap_or(0);
        let seed = seed.integer("seed", 0)?.map(|s| s as u64);
        let k = usize::try_from(k).unwrap_or(usize::MAX);
        Ok((t, p, SampleParams::new(t, p, k, seed)?))
    }

    pub fn check(&self) -> Result<()> {
        Self::new(
            self.temperature as f64,
            self.top_p as f64,
            self.top_k,
            Some(self.seed),
        )
        .map(|_| ())
    }
}

/// A seed for a request that gave none: from the standard library's randomly keyed hasher
/// (seeded from the operating system once per process, and a fresh key for every call).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
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
        self.pick_allowed(logits, None)
    }

    /// `pick` among the tokens `allowed` (a grammar's mask; None: all), the mask applied
    /// before temperature, top-k and top-p: the disallowed tokens are not candidates at all,
    /// so a mask that allows every token gives exactly `pick`'s token. An empty mask allows
    /// every token (the grammar never gives one: `grammar::Constraint::mask`).
    pub fn pick_allowed(&mut self, logits: &[f32], allowed: Option<&SimpleVob>) -> u32 {
        let allowed = allowed.filter(|m| !m.is_zero());
        let ok = |i: usize| allowed.is_none_or(|m| i < m.len() && m.is_allowed(i as u32));
        if self.p.temperature == 0.0 {
            return match allowed {
                None => argmax(logits),
                Some(_) => argmax_where(logits, ok),
            };
        }
        let inv_t = 1.0 / self.p.temperature as f64;
        let mut cand: Vec<(f64, u32)> = logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| ok(i))
            .map(|(i, &l)| (l as f64 * inv_t, i as u32))
            .collect();
        if cand.is_empty() {
            // a mask wider than the logits allowed none of them: sample from all
            cand = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (l as f64 * inv_t, i as u32))
                .collect();
        }
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

/// Index of the largest logit among those `ok` accepts (the lowest index among equal maxima;
/// 0 when it accepts none).
fn argmax_where(x: &[f32], ok: impl Fn(usize) -> bool) -> u32 {
    let mut best: Option<usize> = None;
    for (i, &v) in x.iter().enumerate() {
        if ok(i) && best.is_none_or(|b| v > x[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
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
    fn the_rules_of_the_parameters() {
        let p = SampleParams::new(0.7, 0.9, 40, Some(5)).unwrap();
        assert_eq!((p.temperature, p.top_p, p.top_k, p.seed), (0.7, 0.9, 40, 5));
        for (t, p, want) in [
            (
                -0.1,
                1.0,
                "temperature must be a finite number >= 0, got -0.1",
            ),
            (f64::NAN, 1.0, "temperature must be"),
            (1e300, 1.0, "temperature must be"),
            (1.0, 0.0, "top_p must be in (0, 1], got 0"),
            (1.0, 1.5, "top_p must be in (0, 1], got 1.5"),
        ] {
            let e = SampleParams::new(t, p, 0, Some(1)).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
        }
        // no seed: a random one, different from call to call
        let a = SampleParams::new(1.0, 1.0, 0, None).unwrap().seed;
        let b = SampleParams::new(1.0, 1.0, 0, None).unwrap().seed;
        assert_ne!(a, b);
    }

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

    #[test]
    fn a_mask_removes_candidates_before_sampling() {
        let l = [0.1f32, 2.0, 1.9, -1.0, 2.0];
        let mask = |ids: &[u32]| {
            let mut m = SimpleVob::alloc(l.len());
            for &i in ids {
                m.allow_token(i);
            }
            m
        };
        let p = |temperature, top_p, top_k, seed| SampleParams {
            temperature,
            top_p,
            top_k,
            seed,
        };
        // greedy: the best allowed token, the lowest id on ties
        let mut g = Sampler::new(p(0.0, 1.0, 0, 0));
        assert_eq!(g.pick_allowed(&l, Some(&mask(&[0, 2, 3]))), 2);
        assert_eq!(g.pick_allowed(&l, Some(&mask(&[3, 4, 1]))), 1);
        assert_eq!(g.pick_allowed(&l, Some(&mask(&[0]))), 0);
        // sampling never leaves the mask, whatever top-k / top-p keep
        for (t, tp, k) in [(1.0, 1.0, 0), (2.0, 0.5, 0), (1.0, 1.0, 1), (0.7, 0.9, 2)] {
            for seed in 0..30 {
                let mut s = Sampler::new(p(t, tp, k, seed));
                let tok = s.pick_allowed(&l, Some(&mask(&[0, 3])));
                assert!(tok == 0 || tok == 3, "{tok}");
            }
        }
        // a mask of every token (or an empty one) changes nothing
        let all = mask(&[0, 1, 2, 3, 4]);
        for seed in 0..30 {
            for (t, tp, k) in [(0.0, 1.0, 0), (1.0, 1.0, 0), (0.8, 0.7, 3)] {
                let mut a = Sampler::new(p(t, tp, k, seed));
                let mut b = Sampler::new(p(t, tp, k, seed));
                let mut c = Sampler::new(p(t, tp, k, seed));
                let want = a.pick(&l);
                assert_eq!(b.pick_allowed(&l, Some(&all)), want);
                assert_eq!(c.pick_allowed(&l, Some(&mask(&[]))), want);
            }
        }
    }
}
