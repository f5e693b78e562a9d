//! AVX-512 tier (avx512f/bw/vl + f16c): 16 f32 lanes.
//!
//! FP8: 16 bytes sign-extended to 16-bit lanes, `(s << 7) & 0xBF80` is the f16 of e4m3/256
//! (subnormals included, no f32 denormals), then `vcvtph2ps`. FP4: the 16-entry E2M1 table
//! times the block scale sits in one register and `vpermps` picks by nibble. Four rows share
//! each x load in the one-token path; the prefill micro-kernel runs 4 rows x 3 tokens.

use super::super::driver::{Kernel, Rows, RowsView};
use crate::dtype::{e8m0_to_f32, E2M1_LUT};
use std::arch::x86_64::*;

/// Proof that the CPU has this tier's features; only `detect` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(());

impl Avx512 {
    pub(crate) fn detect() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx512(()))
    }
}

impl Kernel for Avx512 {
    const LANES: usize = 16;

    fn dot_x1(self, w: &RowsView, xp: &[f32], out: &mut [f32]) {
        // SAFETY: `self` exists, so `detect` found avx512f/bw/vl, avx2, fma and f16c.
        unsafe { dot_x1(w, xp, out) }
    }

    fn decode(self, w: &RowsView, stride: usize, wbuf: &mut [f32]) {
        // SAFETY: `self` exists, so `detect` found avx512f/bw/vl, avx2, fma and f16c.
        unsafe { decode(w, stride, wbuf) }
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
        // SAFETY: `self` exists, so `detect` found avx512f/bw/vl, avx2, fma and f16c.
        unsafe { gemm(wbuf, nrows, cols, stride, xp, n, out) }
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn ld(s: &[f32], i: usize) -> __m512 {
    let s = &s[i..i + 16];
    // SAFETY: `s` holds 16 f32.
    unsafe { _mm512_loadu_ps(s.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn st(s: &mut [f32], i: usize, v: __m512) {
    let s = &mut s[i..i + 16];
    // SAFETY: `s` holds 16 f32.
    unsafe { _mm512_storeu_ps(s.as_mut_ptr(), v) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn ld16b(s: &[u8], i: usize) -> __m128i {
    let s = &s[i..i + 16];
    // SAFETY: `s` holds 16 bytes; unaligned load.
    unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2")]
fn ld32b(s: &[u8], i: usize) -> __m256i {
    let s = &s[i..i + 32];
    // SAFETY: `s` holds 32 bytes; unaligned load.
    unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
}

/// The last partial chunk of a row, zero padded to `N` bytes.
#[inline]
fn tail<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut b = [0u8; N];
    b[..s.len()].copy_from_slice(s);
    b
}

#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
fn fp8x16(b: __m128i) -> __m512 {
    let s = _mm256_cvtepi8_epi16(b);
    let h = _mm256_and_si256(
        _mm256_slli_epi16::<7>(s),
        _mm256_set1_epi16(0xBF80u16 as i16),
    );
    _mm512_cvtph_ps(h)
}

#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn bf16x16(b: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b)))
}

/// Chunk c (16 columns) of a row of `cols` columns, decoded; the last one zero padded.
#[inline]
#[target_feature(enable = "avx512f,avx2,f16c")]
fn chunk(rows: Rows, r: usize, cols: usize, c: usize) -> __m512 {
    let j = c * 16;
    let full = j + 16 <= cols;
    match rows {
        Rows::F32(d) => {
            let row = &d[r * cols..(r + 1) * cols];
            if full {
                ld(row, j)
            } else {
                let mut b = [0f32; 16];
                b[..cols - j].copy_from_slice(&row[j..]);
                ld(&b, 0)
            }
        }
        Rows::Bf16(d) => {
            let row = &d[r * cols * 2..(r + 1) * cols * 2];
            if full {
                bf16x16(ld32b(row, 2 * j))
            } else {
                bf16x16(ld32b(&tail::<32>(&row[2 * j..]), 0))
            }
        }
        Rows::Fp8 { q, scale } => {
            let row = &q[r * cols..(r + 1) * cols];
            let w = if full {
                fp8x16(ld16b(row, j))
            } else {
                fp8x16(ld16b(&tail::<16>(&row[j..]), 0))
            };
            _mm512_mul_ps(w, _mm512_set1_ps(e8m0_to_f32(scale[j / 128])))
        }
        Rows::Fp4 { .. } => unreachable!("fp4 is decoded in pairs"),
    }
}

/// Columns 32g..32g+32 of an FP4 row: (even columns, odd columns), scaled.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
fn fp4_pair(
    q: &[u8],
    scale: &[u8],
    r: usize,
    cols: usize,
    g: usize,
    lut: __m512,
) -> (__m512, __m512) {
    let s = _mm512_set1_ps(e8m0_to_f32(scale[r * cols / 32 + g]));
    let t = _mm512_mul_ps(lut, s);
    let b = _mm512_cvtepu8_epi32(ld16b(q, r * cols / 2 + g * 16));
    let lo = _mm512_permutexvar_ps(b, t);
    let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(b), t);
    (lo, hi)
}

#[inline]
#[target_feature(enable = "avx512f")]
fn hsum(v: __m512) -> f32 {
    let a = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
}

/// R rows from r0, one token: acc[k] = fma(w[k][c], xp[c], acc[k]) over chunks in order.
/// The full chunks run on raw pointers (bounds checked once up front); the last partial
/// chunk goes through `chunk`, which decodes exactly like `decode`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn rows_x1<const R: usize>(w: &RowsView, r0: usize, xp: &[f32], sf: &[f32]) -> [f32; R] {
    let cols = w.cols;
    let full = cols / 16;
    assert!(xp.len() >= cols.div_ceil(16) * 16 && r0 + R <= w.nrows);
    let xpp = xp.as_ptr();
    let mut acc = [_mm512_setzero_ps(); R];
    match w.rows {
        Rows::Fp4 { q, scale } => {
            assert!(q.len() >= (r0 + R) * cols / 2 && scale.len() >= (r0 + R) * cols / 32);
            let _ = scale;
            // SAFETY: E2M1_LUT holds 16 f32.
            let lut = unsafe { _mm512_loadu_ps(E2M1_LUT.as_ptr()) };
            let qp = q[r0 * cols / 2..].as_ptr();
            let sf = &sf[r0 * cols / 32..(r0 + R) * cols / 32];
            for g in 0..cols / 32 {
                // SAFETY: g < cols / 32, so xp[32g..32g + 32] is inside xp (len >= cols).
                let (xe, xo) = unsafe {
                    (
                        _mm512_loadu_ps(xpp.add(32 * g)),
                        _mm512_loadu_ps(xpp.add(32 * g + 16)),
                    )
                };
                for k in 0..R {
                    let t = _mm512_mul_ps(lut, _mm512_set1_ps(sf[k * cols / 32 + g]));
                    // SAFETY: row k's bytes 16g..16g + 16 lie within its cols / 2 bytes, inside q
                    // (asserted above).
                    let b = unsafe { _mm_loadu_si128(qp.add(k * cols / 2 + 16 * g).cast()) };
                    let b = _mm512_cvtepu8_epi32(b);
                    let lo = _mm512_permutexvar_ps(b, t);
                    let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(b), t);
                    acc[k] = _mm512_fmadd_ps(lo, xe, acc[k]);
                    acc[k] = _mm512_fmadd_ps(hi, xo, acc[k]);
                }
            }
        }
        Rows::Fp8 { q, scale } => {
            assert!(q.len() >= (r0 + R) * cols && scale.len() >= cols.div_ceil(128));
            let qp = q[r0 * cols..].as_ptr();
            // 128-column blocks; all R rows share the block row's scale.
            for (b, &sb) in scale.iter().enumerate() {
                let sv = _mm512_set1_ps(e8m0_to_f32(sb));
                for c in b * 8..((b + 1) * 8).min(full) {
                    // SAFETY: 16c + 16 <= cols, so the x chunk is inside xp and each row's 16
                    // bytes lie inside that row (rows asserted inside q above).
                    unsafe {
                        let xv = _mm512_loadu_ps(xpp.add(16 * c));
                        for k in 0..R {
                            let b = _mm_loadu_si128(qp.add(k * cols + 16 * c).cast());
                            let w = _mm512_mul_ps(fp8x16(b), sv);
                            acc[k] = _mm512_fmadd_ps(w, xv, acc[k]);
                        }
                    }
                }
            }
        }
        Rows::Bf16(d) => {
            assert!(d.len() >= (r0 + R) * cols * 2);
            let dp = d[r0 * cols * 2..].as_ptr();
            for c in 0..full {
                // SAFETY: 16c + 16 <= cols, so the x chunk is inside xp and each row's 32
                // bytes lie inside that row (rows asserted inside d above).
                unsafe {
                    let xv = _mm512_loadu_ps(xpp.add(16 * c));
                    for k in 0..R {
                        let b = _mm256_loadu_si256(dp.add(2 * (k * cols + 16 * c)).cast());
                        acc[k] = _mm512_fmadd_ps(bf16x16(b), xv, acc[k]);
                    }
                }
            }
        }
        Rows::F32(d) => {
            assert!(d.len() >= (r0 + R) * cols);
            let dp = d[r0 * cols..].as_ptr();
            for c in 0..full {
                // SAFETY: 16c + 16 <= cols, so the x chunk is inside xp and each row's 16
                // floats lie inside that row (rows asserted inside d above).
                unsafe {
                    let xv = _mm512_loadu_ps(xpp.add(16 * c));
                    for k in 0..R {
                        let wv = _mm512_loadu_ps(dp.add(k * cols + 16 * c));
                        acc[k] = _mm512_fmadd_ps(wv, xv, acc[k]);
                    }
                }
            }
        }
    }
    if !matches!(w.rows, Rows::Fp4 { .. }) && full * 16 < cols {
        let xv = ld(xp, 16 * full);
        for k in 0..R {
            acc[k] = _mm512_fmadd_ps(chunk(w.rows, r0 + k, cols, full), xv, acc[k]);
        }
    }
    let mut out = [0f32; R];
    for k in 0..R {
        out[k] = hsum(acc[k]);
    }
    out
}

/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx2, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn dot_x1(w: &RowsView, xp: &[f32], out: &mut [f32]) {
    // FP4 block scales as f32 up front, so the inner loop only broadcasts from memory.
    let sf: Vec<f32> = match w.rows {
        Rows::Fp4 { scale, .. } => scale.iter().map(|&b| e8m0_to_f32(b)).collect(),
        _ => Vec::new(),
    };
    let mut r = 0;
    while r + 4 <= w.nrows {
        out[r..r + 4].copy_from_slice(&rows_x1::<4>(w, r, xp, &sf));
        r += 4;
    }
    while r < w.nrows {
        out[r] = rows_x1::<1>(w, r, xp, &sf)[0];
        r += 1;
    }
}

/// # Safety
/// The CPU must support avx512f, avx512bw, avx512vl, avx2, fma and f16c.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn decode(w: &RowsView, stride: usize, wbuf: &mut [f32]) {
    let cols = w.cols;
    let cp = cols.div_ceil(16) * 16;
    for r in 0..w.nrows {
        let row = &mut wbuf[r * stride..r * stride + cp];
        if let Rows::Fp4 { q, scale } = w.rows {
            // SAFETY: E2M1_LUT holds 16 f32.
            let lut = unsafe { _mm512_loadu_ps(E2M1_LUT.as_ptr()) };
            for g in 0..cols / 32 {
                let (lo, hi) = fp4_pair(q, scale, r, cols, g, lut);
                st(row, 32 * g, lo);
                st(row, 32 * g + 16, hi);
            }
        } else {
            for c in 0..cp / 16 {
                st(row, 16 * c, chunk(w.rows, r, cols, c));
            }
        }
    }
}

/// Columns per panel in the prefill path: 16 rows x 512 f32 = 32 KiB of decoded weights
/// stay in L1 while every token tile passes over them.
const PANEL: usize = 512;

/// R rows x T tokens over chunks c0..c1 of the prefill product. Each (row, token) keeps
/// its accumulator vector in `accs` ([rows, n, 16]) between panels, so its FMA chain is the
/// same as in `rows_x1`.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn tile<const R: usize, const T: usize>(
    wbuf: &[f32],
    r0: usize,
    cp: usize,
    xp: &[f32],
    t0: usize,
    n: usize,
    (c0, c1): (usize, usize),
    accs: &mut [f32],
) {
    assert!(r0 + R <= wbuf.len().div_ceil(cp) && t0 + T <= n && c1 * 16 <= cp);
    assert!(wbuf.len() >= (r0 + R - 1) * cp + c1 * 16 && xp.len() >= (t0 + T - 1) * cp + c1 * 16);
    assert!(accs.len() >= (r0 + R) * n * 16);
    let (wp, xpp, ap) = (wbuf.as_ptr(), xp.as_ptr(), accs.as_mut_ptr());
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    // SAFETY: rows r0..r0 + R and tokens t0..t0 + T exist (asserted), chunk indices are below
    // c1 within each row / token (asserted), and accs holds [rows, n, 16] f32.
    unsafe {
        for k in 0..R {
            for t in 0..T {
                acc[k][t] = _mm512_loadu_ps(ap.add(((r0 + k) * n + t0 + t) * 16));
            }
        }
        for c in c0..c1 {
            let mut xv = [_mm512_setzero_ps(); T];
            for t in 0..T {
                xv[t] = _mm512_loadu_ps(xpp.add((t0 + t) * cp + 16 * c));
            }
            for k in 0..R {
                let wv = _mm512_loadu_ps(wp.add((r0 + k) * cp + 16 * c));
                for t in 0..T {
                    acc[k][t] = _mm512_fmadd_ps(wv, xv[t], acc[k][t]);
                }
            }
        }
        for k in 0..R {
            for t in 0..T {
                _mm512_storeu_ps(ap.add(((r0 + k) * n + t0 + t) * 16), acc[k][t]);
            }
        }
    }
}

/// # Safety
/// The CPU must support avx512f and fma.
#[target_feature(enable = "avx512f,fma")]
unsafe fn gemm(
    wbuf: &[f32],
    nrows: usize,
    cols: usize,
    cp: usize,
    xp: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let nch = cols.div_ceil(16);
    let mut accs = vec![0f32; nrows * n * 16];
    // panel -> token tile -> row tile: the x tile stays in L1 across the row tiles and the
    // panel of decoded rows stays in L1 across token tiles.
    let mut c0 = 0;
    while c0 < nch {
        let cs = (c0, (c0 + PANEL / 16).min(nch));
        let mut t = 0;
        while t < n {
            let three = t + 3 <= n;
            let mut r = 0;
            while r + 8 <= nrows {
                if three {
                    tile::<8, 3>(wbuf, r, cp, xp, t, n, cs, &mut accs);
                } else {
                    tile::<8, 1>(wbuf, r, cp, xp, t, n, cs, &mut accs);
                }
                r += 8;
            }
            while r < nrows {
                if three {
                    tile::<1, 3>(wbuf, r, cp, xp, t, n, cs, &mut accs);
                } else {
                    tile::<1, 1>(wbuf, r, cp, xp, t, n, cs, &mut accs);
                }
                r += 1;
            }
            t += if three { 3 } else { 1 };
        }
        c0 = cs.1;
    }
    for (o, a) in out.iter_mut().zip(accs.chunks_exact(16)) {
        *o = hsum(ld(a, 0));
    }
}

/// Register-only FMA loop for the benchmark's peak: 16 independent chains.
///
/// # Safety
/// The CPU must support avx512f and fma.
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn fma_probe(iters: usize) -> f32 {
    let mut acc = [_mm512_set1_ps(1.0); 16];
    let a = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(1e-7);
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = _mm512_fmadd_ps(*v, a, b);
        }
    }
    let mut s = _mm512_setzero_ps();
    for v in acc {
        s = _mm512_add_ps(s, v);
    }
    hsum(s)
}
