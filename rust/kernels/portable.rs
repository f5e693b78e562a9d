//! Portable kernels: plain Rust that LLVM vectorizes (and that aarch64 compiles to NEON).

use super::{MatRef, Weights};
use crate::dtype::{bf16_to_f32, e4m3_to_f32, e8m0_to_f32, E2M1_LUT};
use rayon::prelude::*;
use std::ops::Range;

const ROW_CHUNK: usize = 16;

pub fn matmul(m: &MatRef, rows: Range<usize>, x: &[f32], n: usize, y: &mut [f32]) {
    let nr = rows.len();
    if nr == 0 || n == 0 {
        return;
    }
    // y is [n, nr]; compute into a row-major [nr, n] scratch so row chunks are contiguous.
    let mut t = vec![0f32; nr * n];
    t.par_chunks_mut(ROW_CHUNK * n)
        .enumerate()
        .for_each(|(ci, out)| {
            let mut wrow = vec![0f32; m.cols];
            let r0 = rows.start + ci * ROW_CHUNK;
            for (k, o) in out.chunks_mut(n).enumerate() {
                let r = r0 + k;
                row_dot(m, r, &mut wrow, x, n, o);
            }
        });
    for r in 0..nr {
        for i in 0..n {
            y[i * nr + r] = t[r * n + i];
        }
    }
}

/// Dot products of row r with every token; per-block partial sums scaled then accumulated.
fn row_dot(m: &MatRef, r: usize, wrow: &mut [f32], x: &[f32], n: usize, out: &mut [f32]) {
    let cols = m.cols;
    match m.w {
        Weights::F32(d) => {
            let w = &d[r * cols..(r + 1) * cols];
            for i in 0..n {
                out[i] = dot(w, &x[i * cols..(i + 1) * cols]);
            }
        }
        Weights::Bf16(d) => {
            let b = &d[r * cols * 2..(r + 1) * cols * 2];
            for (j, c) in b.chunks_exact(2).enumerate() {
                wrow[j] = bf16_to_f32(c[0], c[1]);
            }
            for i in 0..n {
                out[i] = dot(wrow, &x[i * cols..(i + 1) * cols]);
            }
        }
        Weights::Fp8 { q, scale } => {
            let qr = &q[r * cols..(r + 1) * cols];
            for j in 0..cols {
                wrow[j] = e4m3_to_f32(qr[j]);
            }
            let sc = cols.div_ceil(128);
            let srow = &scale[(r / 128) * sc..(r / 128 + 1) * sc];
            blocked(wrow, srow, 128, x, n, out);
        }
        Weights::Fp4 { q, scale } => {
            let qr = &q[r * cols / 2..(r + 1) * cols / 2];
            for (j, &b) in qr.iter().enumerate() {
                wrow[2 * j] = E2M1_LUT[(b & 15) as usize];
                wrow[2 * j + 1] = E2M1_LUT[(b >> 4) as usize];
            }
            let srow = &scale[r * cols / 32..(r + 1) * cols / 32];
            blocked(wrow, srow, 32, x, n, out);
        }
    }
}

fn blocked(w: &[f32], srow: &[u8], bs: usize, x: &[f32], n: usize, out: &mut [f32]) {
    let cols = w.len();
    for i in 0..n {
        let xi = &x[i * cols..(i + 1) * cols];
        let mut acc = 0f32;
        for (b, &s) in srow.iter().enumerate() {
            let lo = b * bs;
            let hi = (lo + bs).min(cols);
            acc += dot(&w[lo..hi], &xi[lo..hi]) * e8m0_to_f32(s);
        }
        out[i] = acc;
    }
}

/// 16-lane dot product with a fixed reduction order.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let ca = a.chunks_exact(16);
    let cb = b.chunks_exact(16);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        acc[l] = x.mul_add(*y, acc[l]);
    }
    let mut s = 0f32;
    for v in acc {
        s += v;
    }
    s
}
