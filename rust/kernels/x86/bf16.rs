//! Official numerics' FP8/FP4 products as `vdpbf16ps`, on CPUs with avx512_bf16.
//!
//! Why BF16 loses nothing here: official numerics rounds every activation that enters an
//! FP8 or FP4 product to E4M3 times a power of two (`quant::fp8_act_qdq`), and every decoded
//! weight is E4M3 or E2M1 times a power of two. Each has at most 4 significant bits, so each
//! is a BF16 value (8 bits), converting it is exact, and the product of two of them (at most
//! 8 bits) is exact in f32. What remains is the order of the additions.
//!
//! `vdpbf16ps` adds to f32 lane j the products of its bf16 elements 2j + 1 and then 2j, each
//! addition rounded to nearest even (Intel's definition; measured the same on AMD Zen 4),
//! with bf16 denormal inputs read as zero and denormal results flushed to zero. With exact
//! products that is two FMA steps per lane, so every (row, token) output here is one fixed
//! chain per lane over the 32-column chunks in order, then the AVX-512 tier's fixed-tree
//! lane sum (`Simd::hsum`): the same value in the fused path for up to 16 tokens (`fused`,
//! each weight chunk decoded once for a pass of tokens) and the prefill path for more
//! (`decode` into a buffer, then `gemm`), for any thread count (the driver's task split),
//! as `driver` requires. It differs from `matmul`'s
//! f32 chain by rounding only (the columns meet the lanes in another order). Flushing can
//! only matter below 2^-126, which no E4M3 activation (>= 2^-31 times its block's scale)
//! or real checkpoint weight comes near.
//!
//! Column layout of a 32-column chunk (weights and x alike, as bf16):
//! - FP8: the columns in order (elements 2j, 2j + 1 are columns 2j, 2j + 1);
//! - FP4: one 32-column scale block as [16 even columns, 16 odd columns], the low then the
//!   high nibbles of its 16 bytes (the AVX-512 tier's FP4 group).
//!
//! FP8 weights decode through the AVX-512 tier's f16 route to e4m3 / 256 times the block
//! scale, then `vcvtne2ps2bf16`; the `* 256` is applied to the sum, exactly. FP4 weights
//! are one `vpermw` of the nibbles into the E2M1 table times the block scale, in bf16.

use super::super::driver::{run_tasks, task_split, token_blocks, Product, GROUP};
use super::super::generic::{prefetch_next, Simd};
use super::super::matrix::Weights;
use super::super::rows::{view, Rows, RowsView};
use super::avx512::Avx512;
use crate::dtype::e8m0_to_f32;
use crate::scratch;
use std::arch::x86_64::*;

/// Proof that the CPU has avx512_bf16 on top of the AVX-512 tier; only `detect` makes one.
#[derive(Clone, Copy)]
pub(crate) struct Bf16(Avx512);

impl Bf16 {
    pub(crate) fn detect() -> Option<Self> {
        let a = Avx512::detect()?;
        is_x86_feature_detected!("avx512bf16").then_some(Bf16(a))
    }

    /// Whether these kernels outrun the f32 ones on this CPU, by a fixed rule on the CPU's
    /// vendor (never a timing: fast numerics' output must not depend on how busy the machine
    /// was at load). Measured (benches/README.md):
    /// - AMD Zen 4 and Zen 5 run `vdpbf16ps` at the rate of `vfmadd231ps` with twice the
    ///   multiply-adds: prefill kernels at 1.8-2x the f32 ones.
    /// - An Intel Xeon with AMX (Sapphire Rapids class) runs one `vdpbf16ps` per 2 cycles
    ///   against two `vfmadd231ps` per cycle, zmm and ymm alike: these kernels ran at 0.66x
    ///   the f32 ones, and whole runs prefilled 7 % and decoded 2-3 % slower.
    ///
    /// Other vendors are untested, so they keep the f32 kernels.
    pub(crate) fn full_rate(self) -> bool {
        super::cpu::amd()
    }
}

/// bf16 columns per chunk (one `vdpbf16ps`).
const CH: usize = 32;
/// Chunks per panel in the prefill path: 16 rows x 1024 bf16 = 32 KiB stay in L1.
const PANEL: usize = 32;

/// `v` rounded to bf16 (to nearest even; exact for the values this path is given).
fn to_bf16(v: f32) -> u16 {
    half::bf16::from_f32(v).to_bits()
}

/// x [n, cols] as bf16 [n, stride] in the chunk layout, zero padded.
fn prep_x(fp4: bool, x: &[f32], n: usize, cols: usize, stride: usize) -> Vec<u16> {
    let mut xb = vec![0u16; n * stride];
    for (xs, d) in x.chunks_exact(cols).zip(xb.chunks_exact_mut(stride)) {
        if fp4 {
            for (xg, dg) in xs.chunks_exact(CH).zip(d.chunks_exact_mut(CH)) {
                for k in 0..CH / 2 {
                    dg[k] = to_bf16(xg[2 * k]);
                    dg[CH / 2 + k] = to_bf16(xg[2 * k + 1]);
                }
            }
        } else {
            for (v, o) in xs.iter().zip(d.iter_mut()) {
                *o = to_bf16(*v);
            }
        }
    }
    xb
}

/// 32 bf16 at p.
///
/// # Safety
/// The CPU has avx512f; `p` is valid for reading 64 bytes.
#[inline(always)]
unsafe fn load_bh(p: *const u16) -> __m512bh {
    // SAFETY: the caller's contract (unaligned read); __m512i and __m512bh are both 64-byte
    // vectors and every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(p.cast())) }
}

/// 32 FP8 bytes at p (columns in order) as bf16 e4m3 / 256 times the block scale `sv`.
///
/// # Safety
/// The CPU has this tier's features; `p` is valid for reading 32 bytes.
#[inline(always)]
unsafe fn fp8_bh(a: Avx512, p: *const u8, sv: __m512) -> __m512bh {
    // SAFETY: the caller's contract; `fp8` reads 16 bytes at p and at p + 16.
    unsafe {
        let lo = a.mul(a.fp8(p), sv);
        let hi = a.mul(a.fp8(p.add(16)), sv);
        _mm512_cvtne2ps_pbh(hi, lo)
    }
}

/// The E2M1 table times `scale` as 16 bf16 in the low half of a word table (`fp4_bh`).
///
/// # Safety
/// The CPU has this tier's features.
#[inline(always)]
unsafe fn fp4_table(a: Avx512, scale: f32) -> __m512i {
    // SAFETY: the caller's contract; __m256bh and __m256i are both 32-byte vectors and every
    // bit pattern is valid for either.
    unsafe {
        let t = _mm512_cvtneps_pbh(a.mul(a.fp4_table(), a.splat(scale)));
        _mm512_zextsi256_si512(std::mem::transmute::<__m256bh, __m256i>(t))
    }
}

/// One FP4 scale block (16 bytes at p) as bf16 [16 even columns, 16 odd columns]: the
/// nibbles widened to 16-bit indices, then one `vpermw` into `t` (`fp4_table`).
///
/// # Safety
/// The CPU has this tier's features; `p` is valid for reading 16 bytes.
#[inline(always)]
unsafe fn fp4_bh(p: *const u8, t: __m512i) -> __m512bh {
    // SAFETY: the caller's contract (an unaligned 16-byte read); the transmute as in
    // `load_bh`.
    unsafe {
        let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
        let m = _mm256_set1_epi16(15);
        let lo = _mm256_and_si256(b, m);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(b), m);
        let idx = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        std::mem::transmute::<__m512i, __m512bh>(_mm512_permutexvar_epi16(idx, t))
    }
}

/// Chunk c of row r decoded (the last FP8 chunk zero padded); an FP4 block takes its table
/// from `tables` (`fp4_tables`).
///
/// # Safety
/// The CPU has this tier's features.
#[inline(always)]
unsafe fn chunk(
    a: Avx512,
    rows: Rows,
    (r, cols, c): (usize, usize, usize),
    tables: &[__m512i; 256],
) -> __m512bh {
    let j = c * CH;
    match rows {
        Rows::Fp8 { q, scale } => {
            let row = &q[r * cols..(r + 1) * cols];
            let mut b = [0u8; CH];
            let v = if j + CH <= cols {
                &row[j..j + CH]
            } else {
                b[..cols - j].copy_from_slice(&row[j..]);
                &b[..]
            };
            let sv = a.splat(e8m0_to_f32(scale[j / 128]));
            // SAFETY: `v` holds 32 bytes; features by the caller's contract.
            unsafe { fp8_bh(a, v.as_ptr(), sv) }
        }
        Rows::Fp4 { q, scale } => {
            let v = &q[(r * cols + j) / 2..][..CH / 2];
            // SAFETY: `v` holds 16 bytes; features by the caller's contract.
            unsafe { fp4_bh(v.as_ptr(), tables[scale[(r * cols + j) / 32] as usize]) }
        }
        Rows::F32(_) | Rows::Bf16(_) => unreachable!("the bf16 path takes FP8 and FP4 rows"),
    }
}

/// Chunk c of T tokens `xs` apart from xp (no closure: it would be compiled without the
/// tier's features, see `generic`).
///
/// # Safety
/// The CPU has avx512f; xp is valid for reading (T - 1) xs + 32 (c + 1) bf16.
#[inline(always)]
unsafe fn x_chunks<const T: usize>(xp: *const u16, xs: usize, c: usize) -> [__m512bh; T] {
    // SAFETY: the caller's contract.
    unsafe {
        let mut v = [load_bh(xp.add(c * CH)); T];
        for (t, x) in v.iter_mut().enumerate().skip(1) {
            *x = load_bh(xp.add(t * xs + c * CH));
        }
        v
    }
}

/// R rows from r0 and T tokens (xb, `xs` apart): acc[k][t] = dpbf16(acc[k][t], w[k][c],
/// x[t][c]) over the chunks, each weight chunk decoded once for the T tokens.
///
/// # Safety
/// The CPU has this tier's features.
#[inline(always)]
unsafe fn rows_xt<const R: usize, const T: usize>(
    a: Avx512,
    w: &RowsView,
    r0: usize,
    (xb, xs): (&[u16], usize),
    tables: &[__m512i; 256],
) -> [[f32; T]; R] {
    let cols = w.cols;
    let (full, nch) = (cols / CH, cols.div_ceil(CH));
    assert!(xs >= nch * CH && xb.len() >= (T - 1) * xs + nch * CH && r0 + R <= w.nrows);
    let xp = xb.as_ptr();
    let mut acc = [[a.splat(0.0); T]; R];
    // SAFETY: the features by the caller's contract; the pointer offsets are inside the
    // buffers as each loop's comment says.
    unsafe {
        match w.rows {
            Rows::Fp4 { q, scale } => {
                assert!(q.len() >= (r0 + R) * cols / 2 && scale.len() >= (r0 + R) * cols / 32);
                let qp = q[r0 * cols / 2..].as_ptr();
                let sc = &scale[r0 * cols / 32..];
                // FP4 cols are a multiple of 32: every chunk is full. Chunk c of row k is
                // bytes 16c..16c + 16 of that row's cols / 2, inside q (asserted).
                for c in 0..full {
                    prefetch_next(a, qp.wrapping_add(R * cols / 2), R * CH / 2, c);
                    let xv = x_chunks::<T>(xp, xs, c);
                    for k in 0..R {
                        let tb = tables[sc[k * (cols / 32) + c] as usize];
                        let wv = fp4_bh(qp.add(k * cols / 2 + c * CH / 2), tb);
                        for t in 0..T {
                            acc[k][t] = _mm512_dpbf16_ps(acc[k][t], wv, xv[t]);
                        }
                    }
                }
            }
            Rows::Fp8 { q, scale } => {
                assert!(q.len() >= (r0 + R) * cols && scale.len() >= cols.div_ceil(128));
                let qp = q[r0 * cols..].as_ptr();
                // full chunks: columns 32c..32c + 32 <= cols of each row, inside q
                for c in 0..full {
                    prefetch_next(a, qp.wrapping_add(R * cols), R * CH, c);
                    let sv = a.splat(e8m0_to_f32(scale[c * CH / 128]));
                    let xv = x_chunks::<T>(xp, xs, c);
                    for k in 0..R {
                        let wv = fp8_bh(a, qp.add(k * cols + c * CH), sv);
                        for t in 0..T {
                            acc[k][t] = _mm512_dpbf16_ps(acc[k][t], wv, xv[t]);
                        }
                    }
                }
                if full < nch {
                    let xv = x_chunks::<T>(xp, xs, full);
                    for k in 0..R {
                        let wv = chunk(a, w.rows, (r0 + k, cols, full), tables);
                        for t in 0..T {
                            acc[k][t] = _mm512_dpbf16_ps(acc[k][t], wv, xv[t]);
                        }
                    }
                }
            }
            Rows::F32(_) | Rows::Bf16(_) => unreachable!("the bf16 path takes FP8 and FP4 rows"),
        }
    }
    let mut out = [[0f32; T]; R];
    for k in 0..R {
        for t in 0..T {
            out[k][t] = a.hsum(acc[k][t]);
        }
    }
    out
}

/// out[r * os + t] = row r · token t for every row of `w` and the T tokens of xb (`xs`
/// apart), R rows at a time: the fused path for few tokens, one token included.
///
/// # Safety
/// The CPU has this tier's features.
#[inline(always)]
unsafe fn dot_xt<const R: usize, const T: usize>(
    a: Avx512,
    w: &RowsView,
    x: (&[u16], usize),
    (out, os): (&mut [f32], usize),
    tables: &[__m512i; 256],
) {
    assert!(os >= T && (w.nrows == 0 || out.len() >= (w.nrows - 1) * os + T));
    let mut r = 0;
    // SAFETY: the features by the caller's contract.
    unsafe {
        while r + R <= w.nrows {
            let v = rows_xt::<R, T>(a, w, r, x, tables);
            for k in 0..R {
                out[(r + k) * os..][..T].copy_from_slice(&v[k]);
            }
            r += R;
        }
        while r < w.nrows {
            out[r * os..][..T].copy_from_slice(&rows_xt::<1, T>(a, w, r, x, tables)[0]);
            r += 1;
        }
    }
}

/// Most tokens one pass of the fused path takes (`fused`).
const PASS_TOKENS: usize = 8;

/// Most tokens the fused path takes (in passes of at most PASS_TOKENS, each reading the
/// weights again); more go through `decode` + `gemm`. Measured on Zen 4 (`kernels_ab
/// prefill fp4-bf16 2048 4096`, 2 threads, GFLOP/s counted as f32 multiply-adds, medians of
/// 3, `decode` + `gemm` -> fused): 2 tokens 79 -> 161, 4 150 -> 296, 5 150 -> 270, 8 199 ->
/// 267, 9 181 -> 228, 16 204 -> 281; from 24 tokens they tie and at 64 `gemm` wins.
const FUSED_TOKENS: usize = 16;

/// Tokens per block in the panel path (see `matmul`). Measured on Zen 4, 2 threads, FP8
/// 4096x4096 at 2,048 tokens: 189-225 GFLOP/s without blocks, 277 with blocks of 128, 285
/// with 64, 261 with 256; with 1,024 columns (x small enough already) blocks tie.
const TOKEN_BLOCK: usize = 128;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
/// out[r * os + t] = row r · token t for every row of `w` and n <= FUSED_TOKENS tokens of
/// xb (`xs` apart), in passes of at most PASS_TOKENS tokens of equal size: each weight
/// chunk decoded once per pass, no decoded copy. R rows per step, R x T accumulators within
/// the 32 registers with the x chunks and the decode's temporaries.
///
/// # Safety
/// The CPU has the enabled features.
unsafe fn fused(
    a: Avx512,
    w: &RowsView,
    (xb, xs): (&[u16], usize),
    n: usize,
    out: &mut [f32],
    tables: &[__m512i; 256],
) {
    let mut t0 = 0;
    while t0 < n {
        let passes = (n - t0).div_ceil(PASS_TOKENS);
        let tn = (n - t0).div_ceil(passes);
        let (x, o) = ((&xb[t0 * xs..], xs), (&mut out[t0..], n));
        // SAFETY: the features by the caller's contract.
        unsafe {
            match tn {
                1 => dot_xt::<8, 1>(a, w, x, o, tables),
                2 => dot_xt::<4, 2>(a, w, x, o, tables),
                3 => dot_xt::<4, 3>(a, w, x, o, tables),
                4 => dot_xt::<4, 4>(a, w, x, o, tables),
                5 => dot_xt::<3, 5>(a, w, x, o, tables),
                6 => dot_xt::<3, 6>(a, w, x, o, tables),
                7 => dot_xt::<2, 7>(a, w, x, o, tables),
                _ => dot_xt::<2, PASS_TOKENS>(a, w, x, o, tables),
            }
        }
        t0 += tn;
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
/// tables[b] = `fp4_table` for scale byte b: the FP4 table of every possible scale, so the
/// loops only load a block's table.
///
/// # Safety
/// The CPU has the enabled features.
unsafe fn fp4_tables(a: Avx512, tables: &mut [__m512i; 256]) {
    for (b, t) in tables.iter_mut().enumerate() {
        // SAFETY: the features by the caller's contract.
        *t = unsafe { fp4_table(a, e8m0_to_f32(b as u8)) };
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
/// wbuf[r * stride..][..chunks * 32] = row r decoded in the chunk layout; FP4 blocks take
/// their table from `tables` (`fp4_tables`; unused for FP8).
///
/// # Safety
/// The CPU has the enabled features.
unsafe fn decode(
    a: Avx512,
    w: &RowsView,
    stride: usize,
    wbuf: &mut [u16],
    tables: &[__m512i; 256],
) {
    let nch = w.cols.div_ceil(CH);
    for r in 0..w.nrows {
        let row = &mut wbuf[r * stride..r * stride + nch * CH];
        for c in 0..nch {
            let d = &mut row[c * CH..(c + 1) * CH];
            // SAFETY: the features by the caller's contract; `d` holds 64 bytes; the vector
            // types have the same size and any bit pattern is valid for both.
            unsafe {
                let v = chunk(a, w.rows, (r, w.cols, c), tables);
                _mm512_storeu_si512(
                    d.as_mut_ptr().cast(),
                    std::mem::transmute::<__m512bh, __m512i>(v),
                );
            }
        }
    }
}

/// R rows x T tokens over chunks c0..c1, each (row, token) keeping its accumulator in
/// `accs` ([rows, n, 16]) between panels so its chain is `rows_xt`'s.
///
/// # Safety
/// The CPU has this tier's features.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const R: usize, const T: usize>(
    a: Avx512,
    (wbuf, r0, stride): (&[u16], usize, usize),
    (xb, t0, n): (&[u16], usize, usize),
    (c0, c1): (usize, usize),
    accs: &mut [f32],
) {
    assert!(t0 + T <= n && c1 * CH <= stride);
    assert!(wbuf.len() >= (r0 + R - 1) * stride + c1 * CH);
    assert!(xb.len() >= (t0 + T - 1) * stride + c1 * CH);
    assert!(accs.len() >= (r0 + R) * n * 16);
    let (wp, xp, ap) = (wbuf.as_ptr(), xb.as_ptr(), accs.as_mut_ptr());
    let mut acc = [[a.splat(0.0); T]; R];
    // SAFETY: the features by the caller's contract; rows r0..r0 + R, tokens t0..t0 + T and
    // chunks below c1 are inside the buffers (asserted), accs holds [rows, n, 16] f32.
    unsafe {
        if c0 > 0 {
            for k in 0..R {
                for t in 0..T {
                    acc[k][t] = a.load(ap.add(((r0 + k) * n + t0 + t) * 16));
                }
            }
        }
        for c in c0..c1 {
            let mut xv = [_mm512_setzero_si512(); T];
            for t in 0..T {
                xv[t] = _mm512_loadu_si512(xp.add((t0 + t) * stride + c * CH).cast());
            }
            for k in 0..R {
                let wv = load_bh(wp.add((r0 + k) * stride + c * CH));
                for t in 0..T {
                    let x = std::mem::transmute::<__m512i, __m512bh>(xv[t]);
                    acc[k][t] = _mm512_dpbf16_ps(acc[k][t], wv, x);
                }
            }
        }
        for k in 0..R {
            for t in 0..T {
                a.store(ap.add(((r0 + k) * n + t0 + t) * 16), acc[k][t]);
            }
        }
    }
}

/// `tile` for R rows and `tt` tokens (1 to TILE_T).
///
/// # Safety
/// As `tile`.
#[inline(always)]
unsafe fn tiles<const R: usize>(
    a: Avx512,
    w: (&[u16], usize, usize),
    x: (&[u16], usize, usize),
    cs: (usize, usize),
    accs: &mut [f32],
    tt: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match tt {
            1 => tile::<R, 1>(a, w, x, cs, accs),
            2 => tile::<R, 2>(a, w, x, cs, accs),
            3 => tile::<R, 3>(a, w, x, cs, accs),
            4 => tile::<R, 4>(a, w, x, cs, accs),
            5 => tile::<R, 5>(a, w, x, cs, accs),
            _ => tile::<R, TILE_T>(a, w, x, cs, accs),
        }
    }
}

/// Micro-kernel shape of the prefill path: 4 rows x 6 tokens (24 accumulators, 6 x and
/// one weight register of 32).
const TILE_R: usize = 4;
const TILE_T: usize = 6;

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")]
/// out[r, t] = wbuf[r] · xb[t] for r < nrows, t < n (panel -> token tile -> row tile).
///
/// # Safety
/// The CPU has the enabled features.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm(
    a: Avx512,
    (wbuf, nrows, nch, stride): (&[u16], usize, usize, usize),
    (xb, n): (&[u16], usize),
    out: &mut [f32],
    accs: &mut [f32],
) {
    assert!(
        accs.len() >= nrows * n * 16,
        "gemm: accs must hold [nrows, n, 16]"
    );
    let mut c0 = 0;
    // SAFETY: the features by the caller's contract.
    unsafe {
        while c0 < nch {
            let cs = (c0, (c0 + PANEL).min(nch));
            let mut t = 0;
            while t < n {
                // the last token tile takes all the tokens left (1 to TILE_T), so that few
                // tokens (an expert's share of a prefill) still load each weight chunk once
                let tt = (n - t).min(TILE_T);
                let mut r = 0;
                while r < nrows {
                    let w = (wbuf, r, stride);
                    let x = (xb, t, n);
                    if nrows - r >= TILE_R {
                        tiles::<TILE_R>(a, w, x, cs, accs, tt);
                        r += TILE_R;
                    } else {
                        tiles::<1>(a, w, x, cs, accs, tt);
                        r += 1;
                    }
                }
                t += tt;
            }
            c0 = cs.1;
        }
        for (o, v) in out.iter_mut().zip(accs.chunks_exact(16)) {
            *o = a.hsum(a.load(v.as_ptr()));
        }
    }
}

/// y[n, rows.len()] = x · W[rows]ᵀ (`p`) for an FP8 or FP4 matrix, x rounded to bf16 (exact
/// for official numerics' activations), products as `vdpbf16ps`.
pub(crate) fn matmul(b: Bf16, p: Product, y: &mut [f32]) {
    let Product { m, rows, x, n } = p;
    let cols = m.cols;
    let fp8 = match m.w {
        Weights::Fp8 { .. } => true,
        Weights::Fp4 { .. } => false,
        Weights::F32(_) | Weights::Bf16(_) => unreachable!("the bf16 path takes FP8 and FP4"),
    };
    let a = b.0;
    let nch = cols.div_ceil(CH);
    // row stride of x and decoded weights, padded by 64 bytes against L1 set conflicts
    let stride = nch * CH + CH;
    let xb = prep_x(!fp8, x, n, cols, stride);
    let post = if fp8 { 256.0 } else { 1.0 };
    run_tasks(task_split(&rows, fp8), rows.start, n, y, |tr, o| {
        // SAFETY: `Bf16` exists, so `detect` found every feature these functions enable.
        unsafe {
            let mut tables = [_mm512_setzero_si512(); 256];
            if !fp8 {
                fp4_tables(a, &mut tables);
            }
            if n <= FUSED_TOKENS {
                fused(a, &view(m, tr.clone()), (&xb, stride), n, o, &tables);
            } else {
                // Token blocks of at most TOKEN_BLOCK, as in the f32 path: every row group
                // of the task passes over the same block of x, so x streams from memory
                // once per task rather than once per row group, and the accumulators
                // ([GROUP, block, 16] f32) stay in L2; each group is decoded again per block.
                let nb = n.min(TOKEN_BLOCK);
                let mut wbuf = vec![0u16; GROUP * stride];
                let mut accs = scratch::zeroed(GROUP * nb * 16);
                token_blocks(tr, n, nb, o, |(t0, nt), g, oo| {
                    let gl = g.len();
                    let xt = &xb[t0 * stride..(t0 + nt) * stride];
                    decode(a, &view(m, g), stride, &mut wbuf[..gl * stride], &tables);
                    let w = (&wbuf[..gl * stride], gl, nch, stride);
                    gemm(a, w, (xt, nt), oo, &mut accs);
                });
            }
        }
        if post != 1.0 {
            for v in o.iter_mut() {
                *v *= post;
            }
        }
    });
}
