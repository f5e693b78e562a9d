//! Rotary embeddings: interleaved pairs on the trailing `rope_dim` dims. Two tables: `main`
//! (θ = rope_theta, plain) for sliding layers and `compress` (θ = compress_rope_theta, YaRN
//! frequencies, no mscale) for compressed layers, their compressors and the indexer.

use crate::config::{ModelConfig, Yarn};

#[derive(Clone)]
pub struct Rope {
    /// [rope_dim / 2] inverse frequencies, f32 as transformers computes them.
    pub inv_freq: Vec<f32>,
}

impl Rope {
    pub fn main(c: &ModelConfig) -> Rope {
        Rope {
            inv_freq: default_inv_freq(c.rope_theta, c.rope_dim),
        }
    }

    pub fn compress(c: &ModelConfig) -> Rope {
        match c.yarn {
            None => Rope {
                inv_freq: default_inv_freq(c.compress_rope_theta, c.rope_dim),
            },
            Some(y) => Rope {
                inv_freq: yarn_inv_freq(c.compress_rope_theta, c.rope_dim, &y),
            },
        }
    }

    /// cos/sin [rope_dim/2] at an absolute position (angle = f32(pos) * inv_freq in f32).
    pub fn cos_sin(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let p = pos as f32;
        for (i, &f) in self.inv_freq.iter().enumerate() {
            let a = p * f;
            cos[i] = a.cos();
            sin[i] = a.sin();
        }
    }

    pub fn half(&self) -> usize {
        self.inv_freq.len()
    }

    /// Rotates the trailing dims of every `width`-sized head in `x` at `pos`; sign -1 de-rotates.
    pub fn apply(&self, x: &mut [f32], width: usize, pos: usize, sign: f32) {
        let h = self.half();
        let mut cos = vec![0f32; h];
        let mut sin = vec![0f32; h];
        self.cos_sin(pos, &mut cos, &mut sin);
        for head in x.chunks_exact_mut(width) {
            crate::kernels::ops::rope_interleaved(head, &cos, &sin, sign);
        }
    }
}

/// 1 / base^(2i/dim), computed like torch: the exponent in f32, the power in f32.
fn default_inv_freq(base: f64, dim: usize) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let e = (2 * i) as f32 / dim as f32;
            1.0f32 / pow_f32(base as f32, e)
        })
        .collect()
}

/// f32 power rounded from f64 (torch's float pow is correctly rounded for these inputs).
fn pow_f32(b: f32, e: f32) -> f32 {
    (b as f64).powf(e as f64) as f32
}

/// YaRN inverse frequencies (transformers `_compute_yarn_parameters`, truncate = true).
fn yarn_inv_freq(base: f64, dim: usize, y: &Yarn) -> Vec<f32> {
    let corr = |rot: f64| {
        (dim as f64
            * (y.original_max_position_embeddings / (rot * 2.0 * std::f64::consts::PI)).ln())
            / (2.0 * base.ln())
    };
    let low = corr(y.beta_fast).floor().max(0.0);
    let high = corr(y.beta_slow).ceil().min(dim as f64 - 1.0);
    let (lo, mut hi) = (low as f32, high as f32);
    if lo == hi {
        hi += 0.001;
    }
    let factor = y.factor as f32;
    (0..dim / 2)
        .map(|i| {
            let pos_freq = pow_f32(base as f32, (2 * i) as f32 / dim as f32);
            let extra = 1.0f32 / pos_freq;
            let inter = 1.0f32 / (factor * pos_freq);
            let ramp = ((i as f32 - lo) / (hi - lo)).clamp(0.0, 1.0);
            let ext_factor = 1.0 - ramp;
            inter * (1.0 - ext_factor) + extra * ext_factor
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yarn_matches_spec_ranges() {
        let y = Yarn {
            factor: 16.0,
            original_max_position_embeddings: 65536.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let f = yarn_inv_freq(160000.0, 64, &y);
        let d = default_inv_freq(160000.0, 64);
        for i in 0..=15 {
            assert_eq!(f[i], d[i], "entry {i} unchanged");
        }
        for i in 25..32 {
            let want = 1.0 / (16.0 * (1.0 / d[i]));
            assert!(
                (f[i] - want).abs() <= want * 1e-6,
                "entry {i} divided by 16"
            );
        }
        assert!(f[20] < d[20] && f[20] > d[20] / 16.0);
    }

    #[test]
    fn rotation_is_orthogonal_and_invertible() {
        let r = Rope {
            inv_freq: default_inv_freq(10000.0, 8),
        };
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.37 - 2.0).collect();
        let orig = x.clone();
        r.apply(&mut x, 16, 37, 1.0);
        assert_eq!(&x[..8], &orig[..8], "nope dims untouched");
        r.apply(&mut x, 16, 37, -1.0);
        for (a, b) in x.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
