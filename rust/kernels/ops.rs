//! Small vector helpers used by the forward pass.

use super::generic::Kernel;
use super::tier::{active_tier, with_kernel};

pub use super::generic::softmax;

/// Weighted RMSNorm in place: x = w * (x * rsqrt(mean(x²) + eps)).
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let r = rms_factor(x, eps);
    for (v, &g) in x.iter_mut().zip(w) {
        *v = g * (*v * r);
    }
}

/// Unweighted RMSNorm in place.
pub fn rms_norm_unweighted(x: &mut [f32], eps: f32) {
    let r = rms_factor(x, eps);
    for v in x.iter_mut() {
        *v *= r;
    }
}

/// rsqrt(mean(x²) + eps), sum in f32 with 16 fixed lanes (`dot`).
pub fn rms_factor(x: &[f32], eps: f32) -> f32 {
    let ss = dot(x, x);
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Interleaved rope on the trailing `cos.len()*2` dims of `x`: pairs (2i, 2i+1).
/// `sign` = -1 applies the conjugate rotation (output de-rotation).
pub fn rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32], sign: f32) {
    let rd = cos.len() * 2;
    let off = x.len() - rd;
    let t = &mut x[off..];
    for i in 0..cos.len() {
        let (a, b) = (t[2 * i], t[2 * i + 1]);
        let s = sin[i] * sign;
        t[2 * i] = a * cos[i] - b * s;
        t[2 * i + 1] = b * cos[i] + a * s;
    }
}

/// a · b (the shorter one rules) with the same bits on every CPU and kernel tier: 16 fixed
/// lanes of separate multiplies and adds, reduced in a fixed tree (`generic::dot16`), run on
/// the active tier's registers. The RMSNorms' and the hyper-connection mixes' dot product.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    with_kernel!(active_tier(), k => k.dot16(a, b))
}
