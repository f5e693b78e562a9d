//! The prefill path for more tokens (`gemm`): a group's rows decoded panel by panel into a
//! buffer (`decode_panel`), then register tiles of R rows x T tokens over each panel.

use super::super::rows::{Rows, RowsView};
use super::decode::{chunk, fp4_group, ld, st, Fp8As};
use super::simd::Simd;
use crate::dtype::e8m0_to_f32;

/// Row stride of the prefill path's decoded panel for rows of `nch` chunks of `lanes`, in
/// panels of `panel` columns (`Simd::GEMM_PANEL`): the panel's width plus 64 bytes, so that
/// its rows do not all map to the same L1 sets.
pub(crate) fn panel_stride(nch: usize, lanes: usize, panel: usize) -> usize {
    (nch * lanes).min(panel) + 16
}

/// pbuf[r * ps..][..(c1 - c0) L] = chunks c0..c1 of row r, decoded in the column
/// layout (FP8 times its block scales; the last chunk zero padded). FP4: c0 and c1
/// multiples of G / L (whole groups).
#[inline(always)]
fn decode_panel<S: Simd>(
    s: S,
    w: &RowsView,
    (c0, c1): (usize, usize),
    (pbuf, ps): (&mut [f32], usize),
) {
    let (l, cols) = (S::LANES, w.cols);
    assert!(pbuf.len() >= w.nrows * ps && (c1 - c0) * l <= ps);
    for r in 0..w.nrows {
        let row = &mut pbuf[r * ps..(r + 1) * ps];
        match w.rows {
            Rows::Fp4 { q, scale } => {
                let gc = S::FP4_GROUP / l;
                for g in c0 / gc..c1 / gc {
                    let w = fp4_group(s, q, scale, r, cols, g);
                    for c in 0..gc {
                        st(s, row, (g * gc + c - c0) * l, w[c]);
                    }
                }
            }
            Rows::Fp8 { q, scale } => {
                // whole chunks two at a time (a pair never straddles a 128-column scale
                // block: 128 / L is even), the same values `chunk` gives; then the rest
                let qr = &q[r * cols..(r + 1) * cols];
                let full = (cols / l).min(c1);
                let mut c = c0;
                while c + 2 <= full {
                    let sv = s.splat(e8m0_to_f32(scale[c * l / 128]));
                    // SAFETY: (c + 2) L <= cols, so the 2L bytes from cL lie inside the row.
                    let (a, b) = unsafe { s.fp8_pair(qr.as_ptr().add(c * l)) };
                    st(s, row, (c - c0) * l, s.mul(a, sv));
                    st(s, row, (c + 1 - c0) * l, s.mul(b, sv));
                    c += 2;
                }
                for c in c..c1 {
                    st(
                        s,
                        row,
                        (c - c0) * l,
                        chunk(s, w.rows, r, cols, c, Fp8As::Scaled),
                    );
                }
            }
            Rows::Bf16(d) => {
                // whole chunks straight from the row (what `chunk` gives them, without its
                // per-chunk slicing and tail buffer); then the rest
                let dr = &d[r * cols * 2..(r + 1) * cols * 2];
                let full = (cols / l).min(c1);
                for c in c0..full {
                    // SAFETY: (c + 1) L <= cols, so the 2L bytes from 2cL lie inside the row.
                    let v = unsafe { s.bf16(dr.as_ptr().add(2 * c * l)) };
                    st(s, row, (c - c0) * l, v);
                }
                for c in full.max(c0)..c1 {
                    st(
                        s,
                        row,
                        (c - c0) * l,
                        chunk(s, w.rows, r, cols, c, Fp8As::Scaled),
                    );
                }
            }
            Rows::F32(_) => {
                for c in c0..c1 {
                    st(
                        s,
                        row,
                        (c - c0) * l,
                        chunk(s, w.rows, r, cols, c, Fp8As::Scaled),
                    );
                }
            }
        }
    }
}

/// R rows x T tokens over the nc chunks of one panel: w holds the panel's decoded rows
/// (`ps` apart), x the tokens' same columns (`xs` apart). Each (row, token) keeps its
/// accumulator vector in `accs` ([rows, n, L]) between panels, so its FMA chain is the same
/// as in `rows_xt`; the first panel starts from zero instead of `accs`. With `AHEAD`, each
/// chunk step also prefetches the same columns of the two x rows at `ahead` (tokens of the
/// next tile; any address: a prefetch never faults).
#[inline(always)]
fn tile<S: Simd, const R: usize, const T: usize, const AHEAD: bool>(
    s: S,
    (w, r0, ps): (&[f32], usize, usize),
    (x, xs, t0, n): (&[f32], usize, usize, usize),
    (nc, first): (usize, bool),
    accs: &mut [f32],
    ahead: [*const f32; 2],
) {
    let l = S::LANES;
    assert!(t0 + T <= n && nc * l <= ps && nc * l <= xs);
    assert!(w.len() >= (r0 + R - 1) * ps + nc * l && x.len() >= (t0 + T - 1) * xs + nc * l);
    assert!(accs.len() >= (r0 + R) * n * l);
    let (wp, xpp, ap) = (w.as_ptr(), x.as_ptr(), accs.as_mut_ptr());
    let mut acc = [[s.splat(0.0); T]; R];
    // SAFETY: rows r0..r0 + R and tokens t0..t0 + T exist (asserted), chunk indices are below
    // nc within each row / token (asserted), and accs holds [rows, n, L] f32.
    unsafe {
        if !first {
            for k in 0..R {
                for t in 0..T {
                    acc[k][t] = s.load(ap.add(((r0 + k) * n + t0 + t) * l));
                }
            }
        }
        for c in 0..nc {
            if AHEAD {
                for a in ahead {
                    s.prefetch_x(a.wrapping_add(c * l).cast());
                }
            }
            let mut xv = [s.splat(0.0); T];
            for t in 0..T {
                xv[t] = s.load(xpp.add((t0 + t) * xs + c * l));
            }
            for k in 0..R {
                let wv = s.load(wp.add((r0 + k) * ps + c * l));
                for t in 0..T {
                    acc[k][t] = s.fma(wv, xv[t], acc[k][t]);
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

/// `tile` of R rows x `tt` tokens, tt <= T <= 8 (monomorphised for every width).
#[inline(always)]
fn tiles<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: (&[f32], usize, usize),
    x: (&[f32], usize, usize, usize),
    nc: (usize, bool),
    accs: &mut [f32],
    tt: usize,
) {
    assert!(tt >= 1 && tt <= T && T <= 8);
    let no = [std::ptr::null(); 2];
    match tt {
        t if t == T => tile::<S, R, T, false>(s, w, x, nc, accs, no),
        1 => tile::<S, R, 1, false>(s, w, x, nc, accs, no),
        2 => tile::<S, R, 2, false>(s, w, x, nc, accs, no),
        3 => tile::<S, R, 3, false>(s, w, x, nc, accs, no),
        4 => tile::<S, R, 4, false>(s, w, x, nc, accs, no),
        5 => tile::<S, R, 5, false>(s, w, x, nc, accs, no),
        6 => tile::<S, R, 6, false>(s, w, x, nc, accs, no),
        _ => tile::<S, R, 7, false>(s, w, x, nc, accs, no),
    }
}

/// out[r, t] = row r of `w` · xp[t] for its rows (at most GROUP) and n tokens (`xs` apart
/// in xp, in the column layout). Panel by panel: `Simd::GEMM_PANEL` columns of the rows
/// are decoded into `pbuf` ([GROUP, panel_stride]), then every token passes over them in
/// R x T register tiles (R x (n % T) for the last tokens), the accumulators kept in `accs`
/// (scratch of at least nrows * n * L f32) between panels.
#[inline(always)]
pub(crate) fn gemm<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: &RowsView,
    (xp, xs, n): (&[f32], usize, usize),
    out: &mut [f32],
    accs: &mut [f32],
    pbuf: &mut [f32],
) {
    let (l, nrows) = (S::LANES, w.nrows);
    let nch = w.cols.div_ceil(l);
    let panel = S::GEMM_PANEL;
    const { assert!(S::GEMM_PANEL.is_multiple_of(32)) };
    let ps = panel_stride(nch, l, panel);
    let ahead = s.gemm_x_ahead();
    assert!(
        accs.len() >= nrows * n * l && out.len() >= nrows * n && pbuf.len() >= nrows * ps,
        "gemm: accs must hold [nrows, n, L], out [nrows, n] and pbuf [nrows, panel_stride]"
    );
    // panel -> token tile -> row tile: the x tile is reused across the row tiles and the
    // panel of decoded rows (in L2) across token tiles.
    let mut c0 = 0;
    while c0 < nch {
        let c1 = (c0 + panel / l).min(nch);
        decode_panel(s, w, (c0, c1), (pbuf, ps));
        let (wp, x) = (&pbuf[..], &xp[c0 * l..]);
        let nc = (c1 - c0, c0 == 0);
        let mut t = 0;
        while t < n {
            // full T-token tiles, then one tile of the n % T tokens left
            let tt = T.min(n - t);
            let mut r = 0;
            while r + R <= nrows {
                if ahead && tt == T && t + T < n {
                    // row tile i brings tokens 2i and 2i + 1 of the next tile into L1 (its
                    // x comes from L2 or L3 otherwise: a token block of 4,096 columns is
                    // 2 MiB), so the next tile finds its x there; past the next tile's
                    // last token, its own (already in L1)
                    let i = r / R;
                    let at = |j: usize| {
                        let k = t + T + 2 * i + j;
                        let k = if 2 * i + j < T && k < n { k } else { t };
                        x.as_ptr().wrapping_add(k * xs)
                    };
                    let w = (wp, r, ps);
                    tile::<S, R, T, true>(s, w, (x, xs, t, n), nc, accs, [at(0), at(1)]);
                } else {
                    tiles::<S, R, T>(s, (wp, r, ps), (x, xs, t, n), nc, accs, tt);
                }
                r += R;
            }
            while r < nrows {
                tiles::<S, 1, T>(s, (wp, r, ps), (x, xs, t, n), nc, accs, tt);
                r += 1;
            }
            t += tt;
        }
        c0 = c1;
    }
    for (o, a) in out.iter_mut().zip(accs.chunks_exact(l)) {
        *o = s.hsum(ld(s, a, 0));
    }
}
