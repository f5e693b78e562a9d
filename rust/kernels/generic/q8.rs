//! Fast numerics' FP4 products with int8 activations (see `quant`): the one-token path and
//! the prefill path.

use super::super::rows::{Rows, RowsView};
use super::decode::{ld, prefetch_next};
use super::kernel::Int8;
use super::simd::Simd;
use crate::dtype::e8m0_to_f32;

// ---- fast numerics: FP4 weights x int8 activations (see `quant`) ----
//
// Every (row, token) output is one FMA chain over the 32-column blocks in order,
// `acc = fma(dot_i8(w_b, x_b), splat(ws_b * d_b), acc)`, then `hsum`, in both the one-token
// path (`dot_fp4_i8` on the packed bytes) and the prefill path (`decode_q8` + `gemm_q8`);
// the tier guarantees `dot_fp4_i8(p, x)` has the lanes of `dot_i8(fp4_i8(p), x)`, so each
// token's result is bit-identical to computing it alone.

/// The scale of the int8 weights `2 * E2M1` of a block with scale byte `b`: 2^(b - 127) / 2.
#[inline(always)]
fn half_scale(b: u8) -> f32 {
    e8m0_to_f32(b) * 0.5
}

/// R FP4 rows from r0, one token of int8 activations (xq [cols] in block order, xd
/// [cols / 32] steps).
#[inline(always)]
fn rows_q8_x1<S: Simd, const R: usize>(
    s: S,
    w: &RowsView,
    r0: usize,
    xq: &[i8],
    xd: &[f32],
) -> [f32; R] {
    let Rows::Fp4 { q, scale } = w.rows else {
        unreachable!("the int8 path is only for FP4 rows")
    };
    let (cols, nb) = (w.cols, w.cols / 32);
    assert!(r0 + R <= w.nrows && q.len() >= (r0 + R) * cols / 2 && scale.len() >= (r0 + R) * nb);
    assert!(xq.len() >= cols && xd.len() >= nb);
    let (qp, xp) = (q[r0 * cols / 2..].as_ptr(), xq.as_ptr());
    let sc = &scale[r0 * nb..(r0 + R) * nb];
    let mut acc = [s.splat(0.0); R];
    for b in 0..nb {
        prefetch_next(s, qp.wrapping_add(R * cols / 2), 16 * R, b);
        for k in 0..R {
            let f = s.splat(half_scale(sc[k * nb + b]) * xd[b]);
            // SAFETY: row k's block b is bytes 16b..16b + 16 of its cols / 2 (rows asserted
            // inside q), and x's block b is xq[32b..32b + 32] (xq.len() >= cols).
            let v = unsafe { s.dot_fp4_i8(qp.add(k * cols / 2 + 16 * b), xp.add(32 * b)) };
            acc[k] = s.fma(v, f, acc[k]);
        }
    }
    let mut out = [0f32; R];
    for k in 0..R {
        out[k] = s.hsum(acc[k]);
    }
    out
}

/// out[r] = row r · x for every FP4 row of `w`, int8 activations, R rows at a time.
#[inline(always)]
pub(crate) fn dot_q8_x1<S: Simd, const R: usize>(
    s: S,
    w: &RowsView,
    xq: &[i8],
    xd: &[f32],
    out: &mut [f32],
) {
    let mut r = 0;
    while r + R <= w.nrows {
        out[r..r + R].copy_from_slice(&rows_q8_x1::<S, R>(s, w, r, xq, xd));
        r += R;
    }
    while r < w.nrows {
        out[r] = rows_q8_x1::<S, 1>(s, w, r, xq, xd)[0];
        r += 1;
    }
}

/// wq[r * cols..][..cols] = FP4 row r as int8 weights in block order; ws[r * cols / 32 + b] =
/// its block scales (`half_scale`).
#[inline(always)]
pub(crate) fn decode_q8<S: Simd>(s: S, w: &RowsView, wq: &mut [i8], ws: &mut [f32]) {
    let Rows::Fp4 { q, scale } = w.rows else {
        unreachable!("the int8 path is only for FP4 rows")
    };
    let (cols, nb) = (w.cols, w.cols / 32);
    assert!(wq.len() >= w.nrows * cols && ws.len() >= w.nrows * nb);
    assert!(q.len() >= w.nrows * cols / 2 && scale.len() >= w.nrows * nb);
    for r in 0..w.nrows {
        for b in 0..nb {
            let src = &q[r * cols / 2 + 16 * b..][..16];
            let dst = &mut wq[r * cols + 32 * b..][..32];
            // SAFETY: `src` holds 16 bytes and `dst` 32.
            unsafe { s.fp4_i8(src.as_ptr(), dst.as_mut_ptr()) };
            ws[r * nb + b] = half_scale(scale[r * nb + b]);
        }
    }
}

/// Blocks per panel of the int8 prefill path: 16 rows x 512 int8 = 8 KiB of weights stay
/// in L1 while every token tile passes over them.
const PANEL_BLOCKS: usize = 16;

/// R rows x T tokens over blocks b0..b1 of the int8 prefill product; accumulators live in
/// `accs` ([rows, n, L]) between panels, so each chain is the one of `rows_q8_x1`.
#[inline(always)]
fn tile_q8<S: Simd, const R: usize, const T: usize>(
    s: S,
    (wq, ws): (&[i8], &[f32]),
    r0: usize,
    cols: usize,
    (xq, xd): (&[i8], &[f32]),
    (t0, n): (usize, usize),
    (b0, b1): (usize, usize),
    accs: &mut [f32],
) {
    let (l, nb) = (S::LANES, cols / 32);
    assert!(t0 + T <= n && b1 <= nb);
    assert!(wq.len() >= (r0 + R) * cols && ws.len() >= (r0 + R) * nb);
    assert!(xq.len() >= (t0 + T) * cols && xd.len() >= (t0 + T) * nb);
    assert!(accs.len() >= (r0 + R) * n * l);
    let (wp, xp, ap) = (wq.as_ptr(), xq.as_ptr(), accs.as_mut_ptr());
    let mut acc = [[s.splat(0.0); T]; R];
    // SAFETY: rows r0..r0 + R and tokens t0..t0 + T exist (asserted), block indices are
    // below nb so each 32-byte block lies inside its row / token, and accs holds
    // [rows, n, L] f32.
    unsafe {
        if b0 > 0 {
            for k in 0..R {
                for t in 0..T {
                    acc[k][t] = s.load(ap.add(((r0 + k) * n + t0 + t) * l));
                }
            }
        }
        for b in b0..b1 {
            for k in 0..R {
                let wb = wp.add((r0 + k) * cols + 32 * b);
                let sw = ws[(r0 + k) * nb + b];
                for t in 0..T {
                    let v = s.dot_i8(wb, xp.add((t0 + t) * cols + 32 * b));
                    let f = s.splat(sw * xd[(t0 + t) * nb + b]);
                    acc[k][t] = s.fma(v, f, acc[k][t]);
                }
            }
        }
        for k in 0..R {
            for t in 0..T {
                s.store(ap.add(((r0 + k) * n + t0 + t) * l), acc[k][t]);
            }
        }
    }
}

/// out[r, t] = wq[r] · xq[t] (int8, per-block scales) for r < nrows, t < n.
#[inline(always)]
pub(crate) fn gemm_q8<S: Simd, const R: usize>(
    s: S,
    (wq, ws): Int8,
    nrows: usize,
    cols: usize,
    (xq, xd): Int8,
    n: usize,
    out: &mut [f32],
    accs: &mut [f32],
) {
    let (l, nb) = (S::LANES, cols / 32);
    assert!(
        accs.len() >= nrows * n * l,
        "gemm_q8: accs must hold [nrows, n, L]"
    );
    let mut b0 = 0;
    while b0 < nb {
        let bs = (b0, (b0 + PANEL_BLOCKS).min(nb));
        let mut t = 0;
        while t < n {
            // three-token tiles, then one tile of the tokens left
            let tt = (n - t).min(3);
            let x = (xq, xd);
            let mut r = 0;
            while r + R <= nrows {
                match tt {
                    1 => tile_q8::<S, R, 1>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    2 => tile_q8::<S, R, 2>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    _ => tile_q8::<S, R, 3>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                }
                r += R;
            }
            while r < nrows {
                match tt {
                    1 => tile_q8::<S, 1, 1>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    2 => tile_q8::<S, 1, 2>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    _ => tile_q8::<S, 1, 3>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                }
                r += 1;
            }
            t += tt;
        }
        b0 = bs.1;
    }
    for (o, a) in out.iter_mut().zip(accs.chunks_exact(l)) {
        *o = s.hsum(ld(s, a, 0));
    }
}
