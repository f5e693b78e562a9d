//! Manifold-constrained hyper-connections: the residual is `hc` parallel streams; each block
//! collapses them with `pre` weights, and writes back `post ⊗ out + combᵀ · X` where comb is
//! Sinkhorn-normalised (docs/model.md §2.2), computed in f32 exactly in transformers' order.

use crate::kernels::ops;

/// Parameters of one hyper-connection module.
pub struct HyperConn {
    /// [(2+hc)·hc, hc·H] f32.
    pub fn_w: Vec<f32>,
    /// [(2+hc)·hc]
    pub base: Vec<f32>,
    /// [3]
    pub scale: Vec<f32>,
}

/// What a hyper-connection produces for one token.
pub struct HcMix {
    /// [hc]
    pub post: Vec<f32>,
    /// [hc, hc] row-major comb[j][k]
    pub comb: Vec<f32>,
    /// [H] the collapsed input of the block.
    pub collapsed: Vec<f32>,
}

impl HyperConn {
    /// x: one token's streams [hc, H].
    pub fn mix(&self, x: &[f32], hc: usize, iters: usize, eps: f32, norm_eps: f32) -> HcMix {
        let h = x.len() / hc;
        let mixes = norm_project(x, &self.fn_w, (2 + hc) * hc, norm_eps);
        let mut pre = vec![0f32; hc];
        let mut post = vec![0f32; hc];
        for j in 0..hc {
            pre[j] = ops::sigmoid(mixes[j] * self.scale[0] + self.base[j]) + eps;
            post[j] = 2.0 * ops::sigmoid(mixes[hc + j] * self.scale[1] + self.base[hc + j]);
        }
        let mut comb = vec![0f32; hc * hc];
        for j in 0..hc {
            let row = &mut comb[j * hc..(j + 1) * hc];
            for k in 0..hc {
                row[k] =
                    mixes[2 * hc + j * hc + k] * self.scale[2] + self.base[2 * hc + j * hc + k];
            }
            ops::softmax(row);
            for v in row.iter_mut() {
                *v += eps;
            }
        }
        normalize_cols(&mut comb, hc, eps);
        for _ in 1..iters {
            normalize_rows(&mut comb, hc, eps);
            normalize_cols(&mut comb, hc, eps);
        }
        HcMix {
            post,
            comb,
            collapsed: collapse(x, &pre, h),
        }
    }
}

/// Unweighted RMSNorm of the flattened streams, then `w` [out, hc·H] times it.
pub fn norm_project(x: &[f32], w: &[f32], out: usize, norm_eps: f32) -> Vec<f32> {
    let mut xn = x.to_vec();
    ops::rms_norm_unweighted(&mut xn, norm_eps);
    let n = x.len();
    (0..out)
        .map(|o| ops::dot(&w[o * n..(o + 1) * n], &xn))
        .collect()
}

/// Σ_j pre[j] · X[j].
pub fn collapse(x: &[f32], pre: &[f32], h: usize) -> Vec<f32> {
    let mut c = vec![0f32; h];
    for (j, &p) in pre.iter().enumerate() {
        let xs = &x[j * h..(j + 1) * h];
        if j == 0 {
            for (o, &v) in c.iter_mut().zip(xs) {
                *o = p * v;
            }
        } else {
            for (o, &v) in c.iter_mut().zip(xs) {
                *o += p * v;
            }
        }
    }
    c
}

fn normalize_rows(m: &mut [f32], hc: usize, eps: f32) {
    for row in m.chunks_exact_mut(hc) {
        let s: f32 = row.iter().sum::<f32>() + eps;
        for v in row.iter_mut() {
            *v /= s;
        }
    }
}

fn normalize_cols(m: &mut [f32], hc: usize, eps: f32) {
    for k in 0..hc {
        let mut s = 0f32;
        for j in 0..hc {
            s += m[j * hc + k];
        }
        s += eps;
        for j in 0..hc {
            m[j * hc + k] /= s;
        }
    }
}

/// Writes back one token's streams: X'[k] = post[k]·out + Σ_j comb[j][k]·X[j].
pub fn write_back(x: &mut [f32], out: &[f32], mix: &HcMix, hc: usize) {
    let h = out.len();
    let old = x.to_vec();
    for k in 0..hc {
        let xk = &mut x[k * h..(k + 1) * h];
        let p = mix.post[k];
        for (i, v) in xk.iter_mut().enumerate() {
            let mut acc = p * out[i];
            for j in 0..hc {
                acc += mix.comb[j * hc + k] * old[j * h + i];
            }
            *v = acc;
        }
    }
}

/// The final hyper-head: pre = sigmoid(mix·scale + base) + eps, no Sinkhorn; returns Σ pre·X.
pub fn head_collapse(
    x: &[f32],
    fn_w: &[f32],
    base: &[f32],
    scale: f32,
    hc: usize,
    eps: f32,
    norm_eps: f32,
) -> Vec<f32> {
    let h = x.len() / hc;
    let mixes = norm_project(x, fn_w, hc, norm_eps);
    let pre: Vec<f32> = (0..hc)
        .map(|j| ops::sigmoid(mixes[j] * scale + base[j]) + eps)
        .collect();
    collapse(x, &pre, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_is_nearly_doubly_stochastic() {
        let hc = 4;
        let h = 8;
        let n = hc * h;
        let hcw = HyperConn {
            fn_w: (0..(2 + hc) * hc * n)
                .map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.3)
                .collect(),
            base: (0..(2 + hc) * hc).map(|i| (i as f32 * 0.1).sin()).collect(),
            scale: vec![0.5, 0.7, 1.3],
        };
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).cos()).collect();
        let m = hcw.mix(&x, hc, 20, 1e-6, 1e-6);
        for k in 0..hc {
            let col: f32 = (0..hc).map(|j| m.comb[j * hc + k]).sum();
            assert!((col - 1.0).abs() < 1e-4, "column {k} sums to {col}");
            let row: f32 = m.comb[k * hc..(k + 1) * hc].iter().sum();
            assert!((row - 1.0).abs() < 1e-3, "row {k} sums to {row}");
        }
        assert!(m.post.iter().all(|&p| p > 0.0 && p < 2.0));
    }
}
