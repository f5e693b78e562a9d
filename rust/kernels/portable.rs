//! Portable tier: plain Rust in fixed 16-lane chunks with no data-dependent branches in the
//! inner loops, so LLVM vectorizes it (SSE2 on baseline x86_64, NEON on aarch64). Plain
//! multiply + add, never `mul_add`: without a hardware FMA that is a libm call per element.
//!
//! Future NEON intrinsics belong in a sibling `neon.rs` implementing `Kernel` like the x86
//! tiers do; this file stays the scalar twin every tier is tested against.

use super::driver::{Kernel, Rows, RowsView};
use crate::dtype::{bf16_to_f32, e8m0_to_f32, E2M1_LUT};

const L: usize = 16;

/// e4m3 / 256 exactly as the SIMD tiers decode it through f16, for every byte. The NaN
/// codes 0x7F / 0xFF (absent from valid checkpoints) decode to ±480 / 256 like on SIMD.
pub(crate) static FP8_LUT: [f32; 256] = fp8_lut();

const fn fp8_lut() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        let e = ((b >> 3) & 15) as u32;
        let m = (b & 7) as f32;
        // f16 bits (b & 0x80) << 8 | (b & 0x7f) << 7: exponent e - 15, or subnormal.
        let v = if e == 0 {
            m * f32::from_bits((127 - 17) << 23) // m/8 * 2^-14
        } else {
            (8.0 + m) * f32::from_bits((e + 127 - 15 - 3) << 23)
        };
        t[b] = if b & 0x80 != 0 { -v } else { v };
        b += 1;
    }
    t
}

#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl Kernel for Portable {
    const LANES: usize = L;

    fn dot_x1(self, w: &RowsView, xp: &[f32], out: &mut [f32]) {
        let cp = w.cols.div_ceil(L) * L;
        let xp = &xp[..cp];
        let mut buf = vec![0f32; cp];
        for (r, o) in out.iter_mut().enumerate() {
            decode_row(w, r, &mut buf);
            *o = dot(&buf, xp);
        }
    }

    fn decode(self, w: &RowsView, stride: usize, wbuf: &mut [f32]) {
        let cp = w.cols.div_ceil(L) * L;
        for r in 0..w.nrows {
            decode_row(w, r, &mut wbuf[r * stride..r * stride + cp]);
        }
    }

    fn gemm(
        self,
        wbuf: &[f32],
        nrows: usize,
        cols: usize,
        stride: usize,
        xp: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        let cp = cols.div_ceil(L) * L;
        for r in 0..nrows {
            let wr = &wbuf[r * stride..r * stride + cp];
            for (t, o) in out[r * n..(r + 1) * n].iter_mut().enumerate() {
                *o = dot(wr, &xp[t * stride..t * stride + cp]);
            }
        }
    }
}

/// Row r of `w` decoded into `out` (length cp >= cols; the tail is zeroed).
fn decode_row(w: &RowsView, r: usize, out: &mut [f32]) {
    let c = w.cols;
    out[c..].fill(0.0);
    match w.rows {
        Rows::F32(d) => out[..c].copy_from_slice(&d[r * c..(r + 1) * c]),
        Rows::Bf16(d) => {
            for (o, b) in out
                .iter_mut()
                .zip(d[r * c * 2..(r + 1) * c * 2].chunks_exact(2))
            {
                *o = bf16_to_f32(b[0], b[1]);
            }
        }
        Rows::Fp8 { q, scale } => {
            let qr = &q[r * c..(r + 1) * c];
            for ((ob, qb), &s) in out.chunks_mut(128).zip(qr.chunks(128)).zip(scale) {
                let s = e8m0_to_f32(s);
                for (o, &b) in ob.iter_mut().zip(qb) {
                    *o = FP8_LUT[b as usize] * s;
                }
            }
        }
        Rows::Fp4 { q, scale } => {
            let qr = &q[r * c / 2..(r + 1) * c / 2];
            let sr = &scale[r * c / 32..(r + 1) * c / 32];
            // 32 columns = 16 bytes: low nibbles (even columns) then high nibbles.
            for ((og, qg), &s) in out.chunks_exact_mut(32).zip(qr.chunks_exact(16)).zip(sr) {
                let s = e8m0_to_f32(s);
                for k in 0..16 {
                    og[k] = E2M1_LUT[(qg[k] & 15) as usize] * s;
                    og[16 + k] = E2M1_LUT[(qg[k] >> 4) as usize] * s;
                }
            }
        }
    }
}

/// 16-lane dot product with a fixed reduction order (any lengths; the shorter one rules).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [0f32; L];
    let ca = a.chunks_exact(L);
    let cb = b.chunks_exact(L);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..L {
            acc[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] += x * y;
    }
    hsum(acc)
}

#[inline]
fn hsum(mut a: [f32; L]) -> f32 {
    let mut h = L / 2;
    while h > 0 {
        for i in 0..h {
            a[i] += a[i + h];
        }
        h /= 2;
    }
    a[0]
}

/// Register-only multiply-add loop (the portable tier's "FMA" is mul + add): 8 x 16 lanes.
pub(crate) fn fma_probe(iters: usize) -> f32 {
    let mut acc = [[1f32; L]; 8];
    for _ in 0..iters {
        for v in acc.iter_mut() {
            for l in 0..L {
                v[l] = v[l] * 0.999_999 + 1e-7;
            }
        }
    }
    acc.iter().map(|v| hsum(*v)).sum()
}
