//! The fused path for few tokens (`dot_xt`, up to 4 tokens a pass): each weight chunk
//! decoded once into registers and multiplied into every token's accumulator.

use super::super::rows::{Rows, RowsView};
use super::decode::{chunk, ld, prefetch_next, Fp8As};
use super::simd::{Fp4Loop, Fp8Loop, Simd};

/// The T tokens' chunks at column `off` (tokens `xs` apart from `xp`).
///
/// # Safety
/// `xp` is valid for reading (T - 1) xs + off + L f32.
#[inline(always)]
unsafe fn x_chunks<S: Simd, const T: usize>(
    s: S,
    xp: *const f32,
    xs: usize,
    off: usize,
) -> [S::V; T] {
    let mut v = [s.splat(0.0); T];
    for t in 0..T {
        // SAFETY: the caller's contract.
        v[t] = unsafe { s.load(xp.add(t * xs + off)) };
    }
    v
}

/// acc[t] = fma(w, x[t], acc[t]) for each of the T tokens.
#[inline(always)]
fn fma_tokens<S: Simd, const T: usize>(s: S, w: S::V, x: &[S::V; T], acc: &mut [S::V; T]) {
    for t in 0..T {
        acc[t] = s.fma(w, x[t], acc[t]);
    }
}

/// The FP8 part of `rows_xt`: the R rows at `qp` (`cols` bytes apart) times the T tokens
/// over chunks 0..full, into `acc`. The block scales are in x already (`driver::scale_x`),
/// times 2^112 with `BITS` (then the weights enter as their bits: the same products). Two
/// chunks per step where the tier pairs them (`fp8_pair`; always with `BITS`), each row's
/// FMAs still in chunk order.
///
/// # Safety
/// `qp` is valid for reading R rows of `cols` bytes, and `xpp` for reading chunks 0..full of
/// T tokens `xs` apart.
#[inline(always)]
unsafe fn fp8_steps<S: Simd, const R: usize, const T: usize, const BITS: bool>(
    s: S,
    qp: *const u8,
    cols: usize,
    (xpp, xs): (*const f32, usize),
    full: usize,
    acc: &mut [[S::V; T]; R],
) {
    let l = S::LANES;
    let mut c = 0;
    if BITS && T == 1 && full >= 2 {
        let p = Fp8Loop {
            q: qp,
            cols,
            x: xpp,
            pairs: full / 2,
        };
        // SAFETY: R rows of `cols` bytes at qp and the token's first `full` chunks at xpp
        // (the contract); acc holds R x 1 accumulators.
        c = unsafe { s.fp8_bits_loop(R, p, acc.as_flattened_mut()) };
    }
    while (BITS || S::FP8_PAIR) && c + 2 <= full {
        prefetch_next(s, qp.wrapping_add(R * cols), 2 * R * l, c / 2);
        // SAFETY: (c + 2) L <= full L, inside every token's row (the contract).
        let (x0, x1) = unsafe {
            (
                x_chunks::<S, T>(s, xpp, xs, c * l),
                x_chunks::<S, T>(s, xpp, xs, (c + 1) * l),
            )
        };
        for k in 0..R {
            // SAFETY: row k's 2L bytes from cL lie inside the row (the contract).
            let (w0, w1) = unsafe {
                let p = qp.add(k * cols + c * l);
                if BITS {
                    s.fp8_bits_pair(p)
                } else {
                    s.fp8_pair(p)
                }
            };
            fma_tokens(s, w0, &x0, &mut acc[k]);
            fma_tokens(s, w1, &x1, &mut acc[k]);
        }
        c += 2;
    }
    while c < full {
        prefetch_next(s, qp.wrapping_add(R * cols), R * l, c);
        // SAFETY: as above, for one chunk.
        let xv = unsafe { x_chunks::<S, T>(s, xpp, xs, c * l) };
        for k in 0..R {
            // SAFETY: as above, for one chunk.
            let wv = unsafe {
                let p = qp.add(k * cols + c * l);
                if BITS {
                    s.fp8_bits(p)
                } else {
                    s.fp8(p)
                }
            };
            fma_tokens(s, wv, &xv, &mut acc[k]);
        }
        c += 1;
    }
}

/// R rows from r0 times T tokens (xp holds them `xs` apart): acc[k][t] = fma(w[k][c],
/// xp[t][c], acc[k][t]) over chunks in order, each weight chunk decoded once for the T
/// tokens. With T = 1 this is the one-token path; every (row, token) chain is the same
/// whatever T. The full chunks run on raw pointers (bounds checked once up front); the last
/// partial chunk goes through `chunk`, which decodes exactly like `decode_panel`.
/// `tables[b]`: the FP4 table times the value of scale byte b (see `dot_xt`). An FP4 pass
/// runs as the tier's own loop where it has one for R x T (`Simd::fp4_loop`).
#[inline(always)]
fn rows_xt<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: &RowsView,
    r0: usize,
    (xp, xs): (&[f32], usize),
    tables: &[S::V; 256],
) -> [[f32; T]; R] {
    let (l, cols) = (S::LANES, w.cols);
    let full = cols / l;
    assert!(xs >= cols.div_ceil(l) * l && xp.len() >= (T - 1) * xs + cols.div_ceil(l) * l);
    assert!(r0 + R <= w.nrows);
    let xpp = xp.as_ptr();
    let mut acc = [[s.splat(0.0); T]; R];
    // SAFETY (every `xpp.add` below): token t < T and chunk c with (c + 1) L <= cols are
    // inside xp (asserted: tokens xs >= cols apart).
    match w.rows {
        Rows::Fp4 { q, scale } => {
            let (rb, nb) = (cols / 2, cols / 32);
            // a group lies in one scale block and is 2 or 4 chunks (`Simd::FP4_GROUP`)
            const { assert!(S::FP4_GROUP == 2 * S::LANES || S::FP4_GROUP == 32) };
            const { assert!(32 % S::FP4_GROUP == 0 && S::FP4_GROUP / S::LANES <= 4) };
            let (gs, gc) = (S::FP4_GROUP, S::FP4_GROUP / l);
            assert!(q.len() >= (r0 + R) * rb && scale.len() >= (r0 + R) * nb);
            let qp = q[r0 * rb..].as_ptr();
            let sp = scale[r0 * nb..].as_ptr();
            // chunk by chunk (`Simd::FP4_X_BY_CHUNK`) or the group's x first
            let by_chunk = S::FP4_X_BY_CHUNK && R >= 2;
            let p = Fp4Loop {
                q: qp,
                rb,
                scale: sp,
                nb,
                tables,
                x: xpp,
                xs,
                groups: cols / 32,
            };
            // SAFETY: rows r0..r0 + R of q and scale, and every token's cols columns of x,
            // were asserted above; `tables` has all 256; acc is R x T.
            let looped = gs == 32 && unsafe { s.fp4_loop(R, p, acc.as_flattened_mut()) };
            for g in 0..if looped { 0 } else { cols / gs } {
                prefetch_next(s, qp.wrapping_add(R * rb), R * gs / 2, g);
                let b = g * gs / 32;
                // SAFETY: `row` is called only with k < R, and b < nb, so the scale byte lies
                // in the rows asserted inside `scale`; row k's bytes gG / 2..(g + 1) G / 2 lie
                // within its cols / 2 bytes, inside q (asserted above). Raw pointers: no
                // bounds check per row.
                let row = |k: usize| unsafe {
                    let t = &tables[*sp.add(k * nb + b) as usize];
                    s.fp4(qp.add(k * rb + g * gs / 2), t)
                };
                if by_chunk {
                    let mut ws = [[s.splat(0.0); 4]; R];
                    for (k, wk) in ws.iter_mut().enumerate() {
                        *wk = row(k);
                    }
                    for c in 0..gc {
                        // SAFETY: g < cols / G, so columns gG..gG + G lie in every token's
                        // row.
                        let xc = unsafe { x_chunks::<S, T>(s, xpp, xs, (g * gc + c) * l) };
                        for (wk, ak) in ws.iter().zip(acc.iter_mut()) {
                            fma_tokens(s, wk[c], &xc, ak);
                        }
                    }
                } else {
                    let mut xv = [[s.splat(0.0); T]; 4];
                    for (c, x) in xv.iter_mut().enumerate().take(gc) {
                        // SAFETY: as above.
                        *x = unsafe { x_chunks::<S, T>(s, xpp, xs, (g * gc + c) * l) };
                    }
                    for (k, ak) in acc.iter_mut().enumerate() {
                        let w = row(k);
                        for c in 0..gc {
                            fma_tokens(s, w[c], &xv[c], ak);
                        }
                    }
                }
            }
        }
        Rows::Fp8 { q, scale } => {
            assert!(q.len() >= (r0 + R) * cols && scale.len() >= cols.div_ceil(128));
            let qp = q[r0 * cols..].as_ptr();
            // SAFETY: rows r0..r0 + R of `cols` bytes lie inside q (asserted) and every
            // token's first `full` chunks inside xp (asserted at the top).
            unsafe {
                if S::FP8_BITS && w.fp8_bits {
                    fp8_steps::<S, R, T, true>(s, qp, cols, (xpp, xs), full, &mut acc);
                } else {
                    fp8_steps::<S, R, T, false>(s, qp, cols, (xpp, xs), full, &mut acc);
                }
            }
        }
        Rows::Bf16(d) => {
            assert!(d.len() >= (r0 + R) * cols * 2);
            let dp = d[r0 * cols * 2..].as_ptr();
            for c in 0..full {
                prefetch_next(s, dp.wrapping_add(2 * R * cols), 2 * R * l, c);
                // SAFETY: (c + 1) L <= cols (see above).
                let xv = unsafe { x_chunks::<S, T>(s, xpp, xs, c * l) };
                for k in 0..R {
                    // SAFETY: each row's 2L bytes from 2cL lie inside that row (rows
                    // asserted inside d above).
                    let wv = unsafe { s.bf16(dp.add(2 * (k * cols + c * l))) };
                    fma_tokens(s, wv, &xv, &mut acc[k]);
                }
            }
        }
        Rows::F32(d) => {
            assert!(d.len() >= (r0 + R) * cols);
            let dp = d[r0 * cols..].as_ptr();
            for c in 0..full {
                prefetch_next(s, dp.wrapping_add(R * cols).cast(), 4 * R * l, c);
                // SAFETY: (c + 1) L <= cols (see above).
                let xv = unsafe { x_chunks::<S, T>(s, xpp, xs, c * l) };
                for k in 0..R {
                    // SAFETY: each row's L floats from cL lie inside that row (rows asserted
                    // inside d above).
                    let wv = unsafe { s.load(dp.add(k * cols + c * l)) };
                    fma_tokens(s, wv, &xv, &mut acc[k]);
                }
            }
        }
    }
    if !matches!(w.rows, Rows::Fp4 { .. }) && full * l < cols {
        for k in 0..R {
            let how = if w.fp8_bits {
                Fp8As::Bits
            } else {
                Fp8As::Unscaled
            };
            let wv = chunk(s, w.rows, r0 + k, cols, full, how);
            for t in 0..T {
                acc[k][t] = s.fma(wv, ld(s, xp, t * xs + full * l), acc[k][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for k in 0..R {
        for t in 0..T {
            out[k][t] = s.hsum(acc[k][t]);
        }
    }
    out
}

/// out[r * os + t] = dot(row r, xp[t]) for every row of `w` and the T tokens of xp (`xs`
/// apart), R rows at a time: the fused path for few tokens (`driver::matmul`), one
/// token included (T = 1).
#[inline(always)]
pub(crate) fn dot_xt<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: &RowsView,
    x: (&[f32], usize),
    (out, os): (&mut [f32], usize),
) {
    assert!(os >= T && (w.nrows == 0 || out.len() >= (w.nrows - 1) * os + T));
    // The FP4 table of every possible scale up front (the same tables `fp4_group` forms),
    // so the inner loop only loads the block's table.
    let mut tables = [s.splat(0.0); 256];
    if let Rows::Fp4 { .. } = w.rows {
        for (b, t) in tables.iter_mut().enumerate() {
            *t = s.fp4_scaled_table(b as u8);
        }
    }
    let mut r = 0;
    while r + R <= w.nrows {
        let v = rows_xt::<S, R, T>(s, w, r, x, &tables);
        for k in 0..R {
            out[(r + k) * os..][..T].copy_from_slice(&v[k]);
        }
        r += R;
    }
    while r < w.nrows {
        out[r * os..][..T].copy_from_slice(&rows_xt::<S, 1, T>(s, w, r, x, &tables)[0]);
        r += 1;
    }
}
