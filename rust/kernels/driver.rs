//! The tier-independent half of `matmul`: splitting rows into tasks, preparing x, and
//! choosing between the fused path (up to `FUSED_MAX` tokens, FP4 up to the tier's
//! `FP4_FUSED_MAX`, in passes of up to 4 that decode each weight once into registers) and
//! the decode-then-multiply panel path.
//!
//! Every tier computes one (row, token) output the same way, whatever n, the row range or
//! the thread count:
//!
//! ```text
//! acc[LANES] = 0
//! for each chunk c of LANES columns (in the tier's column layout, zero padded):
//!     acc = fma(w_dec[c], xp[c], acc)      // xp = x prepared for this row (see prep_x)
//! y = hsum(acc) (fixed tree) * post       // post = 256 for FP8, 1 otherwise
//! ```
//!
//! Scales never enter the loop as a separate step: every UE8M0 scale is a power of two, so
//! scaling is exact, and a single running FMA chain per row replaces per-block partial sums.
//! FP4: the 16-entry table is scaled per 32-block. FP8, panel path: each decoded chunk is
//! multiplied by its 128x128 block's scale s. FP8, fused path: all rows of a task share one
//! row of block scales, so x is multiplied by them once per task (`scale_x`) and the kernel
//! multiplies unscaled decoded weights, one multiply fewer per chunk. `(w * s) * x` and
//! `w * (x * s)` are the same exact product as long as x * s stays in f32's normal range
//! (|x * s| >= 2^-126 or 0; activations are O(1) and scales near 2^-8, so only exact zeros
//! come near it): then the FMA chains round the same values and both paths agree to the bit.
//! FP8 decodes through f16 to `e4m3 / 256` (see the SIMD tiers); the `* 256` is applied once
//! at the end, which is exact. In the fused path a tier may take the weights as their bits
//! instead (`Simd::fp8_bits`: e4m3 * 2^-120, no conversion instruction) against an x scaled
//! by a further 2^112: the same exact products, so the same bits; where x * s * 2^112 would
//! not be finite the driver keeps the f16 route (`scale_x`).
//! Because the fused path (one token included) and the panel path perform this same
//! sequence of operations on the same values, each token's result is bit-identical to
//! computing it alone.

use super::generic::{panel_stride, Kernel};
use super::matrix::{MatRef, Weights};
use super::quant::quantize;
use super::rows::{view, Rows};
use crate::dtype::e8m0_to_f32;
use crate::scratch::{self, Buf};
use rayon::prelude::*;
use std::ops::Range;

/// The operands of one product, y [n, rows.len()] = x [n, cols] · W[rows]ᵀ: checked by the
/// caller (the lengths; at least one row and one token).
#[derive(Clone)]
pub(crate) struct Product<'a> {
    pub m: &'a MatRef<'a>,
    pub rows: Range<usize>,
    /// [n, cols]
    pub x: &'a [f32],
    pub n: usize,
}

/// Rows decoded together in the prefill path.
pub(super) const GROUP: usize = 16;

/// Most tokens the fused path takes (in passes of up to 4); more go through the panel path.
/// Measured on Zen 5, 2 threads, AVX-512: the fused path is 1.1-3.8x faster from 2 to 8
/// tokens (FP4 2048x4096 at 2 tokens 86 -> 255 GFLOP/s, FP8 32768x1024 41 -> 158); from 12
/// to 32 it wins or loses depending on the shape (FP8 1024x4096 at 12: 232 -> 202).
const FUSED_MAX: usize = 8;

/// Tokens per block in the prefill path (see `matmul`).
const TOKEN_BLOCK: usize = 128;

/// x prepared for the kernels: [n, cp], zero padded. FP4: each group of `K::FP4_GROUP`
/// columns stored in the tier's column order (`K::fp4_col`), matching its decoded chunks.
/// Otherwise a copy.
fn prep_x<K: Kernel>(m: &MatRef, x: &[f32], n: usize, cp: usize) -> Buf {
    let cols = m.cols;
    let mut xp = scratch::zeroed(n * cp);
    let gs = K::FP4_GROUP;
    for (xs, d) in x.chunks_exact(cols).zip(xp.chunks_exact_mut(cp)) {
        match m.w {
            Weights::Fp4 { .. } => {
                for (xg, dg) in xs.chunks_exact(gs).zip(d.chunks_exact_mut(gs)) {
                    for (k, v) in dg.iter_mut().enumerate() {
                        *v = xg[K::fp4_col(k)];
                    }
                }
            }
            _ => d[..cols].copy_from_slice(xs),
        }
    }
    xp
}

/// 2^112: x times this meets weights decoded as `Simd::fp8_bits` (e4m3 * 2^-120) in the
/// same products as x meets `Simd::fp8` (e4m3 * 2^-8).
const FP8_BITS_X: f32 = (1u128 << 112) as f32;

/// xp [n, cp] with column c of every token times the FP8 block scale of c (`scale`: one
/// row of 128x128 block scales, [ceil(cols / 128)]), and with `bits` times 2^112 as well
/// (for `Simd::fp8_bits`); the padding stays zero. Also whether every value is finite
/// (with `bits` it may not be: a block scale of 2^16 or more, a huge x; then the caller
/// scales without it). Both factors are powers of two, so where the result is finite and
/// normal each product with a weight is the one the path without `bits` forms.
fn scale_x(xp: &[f32], n: usize, cp: usize, cols: usize, scale: &[u8], bits: bool) -> (Buf, bool) {
    let mut xs = scratch::zeroed(n * cp);
    let extra = if bits { FP8_BITS_X } else { 1.0 };
    let mut finite = true;
    for (src, dst) in xp.chunks_exact(cp).zip(xs.chunks_exact_mut(cp)) {
        for ((s, d), &sb) in src[..cols]
            .chunks(128)
            .zip(dst[..cols].chunks_mut(128))
            .zip(scale)
        {
            let f = e8m0_to_f32(sb) * extra;
            for (a, b) in s.iter().zip(d.iter_mut()) {
                *b = a * f;
                finite &= b.is_finite();
            }
        }
    }
    (xs, finite)
}

/// Rows per parallel task: enough tasks to balance the pool, at most one FP8 row block.
fn task_rows(nr: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    nr.div_ceil(threads * 4)
        .next_multiple_of(GROUP)
        .clamp(GROUP, 128)
}

/// `rows` split into the parallel tasks, in order; with `fp8` no task straddles a 128-row
/// block (a view has one scale row).
pub(super) fn task_split(rows: &Range<usize>, fp8: bool) -> Vec<Range<usize>> {
    let step = task_rows(rows.len());
    let mut tasks = Vec::new();
    let mut r = rows.start;
    while r < rows.end {
        let mut e = (r + step).min(rows.end);
        if fp8 {
            e = e.min((r / 128 + 1) * 128);
        }
        tasks.push(r..e);
        r = e;
    }
    tasks
}

/// y [n, rows.len()] = x · W[rows]ᵀ (`p`) on kernel `k`, with f32 activations.
pub(crate) fn matmul<K: Kernel>(k: K, p: Product, y: &mut [f32]) {
    let Product { m, rows, x, n } = p;
    // Row stride of x and decoded weights: padded by 64 bytes so that rows of power-of-two
    // length do not all map to the same L1 sets in the prefill micro-kernel.
    let cp = m.cols.div_ceil(K::LANES) * K::LANES + 16;
    let fp8 = matches!(m.w, Weights::Fp8 { .. });
    let xp = prep_x::<K>(m, x, n, cp);

    let post = if fp8 { 256.0 } else { 1.0 };
    run_tasks(task_split(&rows, fp8), rows.start, n, y, |tr, o| {
        // few tokens: fused passes of up to 4 tokens, each decoding the weights once (FP8:
        // the block scales go into x, `scale_x`); more: the panel path, which decodes each
        // weight once for a block of up to TOKEN_BLOCK tokens (FP8: scaling the decoded
        // weights, as a [n, cols] copy of x per task would cost more than it saves)
        let fp4 = matches!(m.w, Weights::Fp4 { .. });
        const {
            assert!(K::FP4_FUSED_MAX >= FUSED_MAX && K::FP4_FUSED_MAX <= 16);
        }
        let fused_max = if fp4 { K::FP4_FUSED_MAX } else { FUSED_MAX };
        if n <= fused_max {
            let mut v = view(m, tr.clone());
            let scaled;
            let xp: &[f32] = match v.rows {
                Rows::Fp8 { scale, .. } => {
                    // the weights as their bits where the tier and this CPU take them and x times
                    // 2^112 stays finite; else through `Simd::fp8`
                    let (mut xs, mut bits) = (None, false);
                    if K::FP8_BITS && k.fp8_bits_on() {
                        let (x, finite) = scale_x(&xp, n, cp, m.cols, scale, true);
                        (xs, bits) = (finite.then_some(x), finite);
                    }
                    v.fp8_bits = bits;
                    scaled = match xs {
                        Some(x) => x,
                        None => scale_x(&xp, n, cp, m.cols, scale, false).0,
                    };
                    &scaled
                }
                _ => &xp,
            };
            let pass = match v.rows {
                Rows::Fp4 { .. } => K::FP4_PASS.clamp(1, 4),
                _ => 4,
            };
            // passes of equal size (5 tokens: 3 + 2, not 4 + 1; a one-token pass decodes
            // every weight for a single multiply-add)
            let mut t0 = 0;
            while t0 < n {
                let nt = (n - t0).div_ceil((n - t0).div_ceil(pass));
                k.dot_xt(&v, (&xp[t0 * cp..], cp, nt), (&mut o[t0..], n));
                t0 += nt;
            }
        } else {
            // Token blocks of at most TOKEN_BLOCK: every row group of the task passes over
            // the same block of x (TOKEN_BLOCK x cols f32, 2 MiB at 4,096 columns: from L2
            // and L3 rather than DRAM), so all of x streams from memory once per task, not
            // once per row group; each group's panels are decoded again per block (a few
            // operations per weight against the block's TOKEN_BLOCK multiply-adds). Measured
            // on Zen 5: blocks of 16-64 tokens (x block in L2) lose more to the repeated
            // decoding than they gain; 128 and 256 tie; 512 loses.
            let nb = n.min(TOKEN_BLOCK);
            let ps = panel_stride(m.cols.div_ceil(K::LANES), K::LANES, K::GEMM_PANEL);
            let mut pbuf = scratch::zeroed(GROUP * ps);
            // the micro-kernel's accumulators, once per task (not once per row group)
            let mut accs = scratch::zeroed(GROUP * nb * K::LANES);
            token_blocks(tr, n, nb, o, |(t0, nt), g, oo| {
                let xb = (&xp[t0 * cp..(t0 + nt) * cp], cp, nt);
                k.gemm(&view(m, g), xb, oo, &mut accs, &mut pbuf);
            });
        }
        if post != 1.0 {
            for v in o.iter_mut() {
                *v *= post;
            }
        }
    });
}

/// The panel paths' loop over a task's rows `tr` and n tokens: token blocks of at most `nb`
/// tokens, and in each block every group of GROUP rows in order. `f((t0, nt), rows, out)`
/// computes that group's [rows.len(), nt] outputs for tokens t0..t0 + nt into `out`, which
/// is `o`'s own rows when one block covers all n tokens, else a buffer whose rows are then
/// copied into `o`'s columns t0..t0 + nt (`o`: the task's [tr.len(), n] block).
pub(super) fn token_blocks(
    tr: &Range<usize>,
    n: usize,
    nb: usize,
    o: &mut [f32],
    mut f: impl FnMut((usize, usize), Range<usize>, &mut [f32]),
) {
    let mut ob = scratch::zeroed(if nb < n { GROUP * nb } else { 0 });
    let mut t0 = 0;
    while t0 < n {
        let nt = nb.min(n - t0);
        let mut g0 = tr.start;
        while g0 < tr.end {
            let g1 = (g0 + GROUP).min(tr.end);
            let (gl, r0) = (g1 - g0, g0 - tr.start);
            if nt == n {
                f((t0, nt), g0..g1, &mut o[r0 * n..(r0 + gl) * n]);
            } else {
                let oo = &mut ob[..gl * nt];
                f((t0, nt), g0..g1, oo);
                for (r, v) in oo.chunks_exact(nt).enumerate() {
                    o[(r0 + r) * n + t0..][..nt].copy_from_slice(v);
                }
            }
            g0 = g1;
        }
        t0 += nt;
    }
}

/// y [n, nr] (nr = the rows the tasks cover, from `row0`) by running `f(rows, out)` for each
/// task in parallel, `out` being that task's block [rows.len(), n] (row-major). For n == 1
/// the block is y's own slice; otherwise each task copies its block into its columns of y
/// (for every token a contiguous run), so no [nr, n] buffer and no serial transpose exist.
pub(super) fn run_tasks(
    tasks: Vec<Range<usize>>,
    row0: usize,
    n: usize,
    y: &mut [f32],
    f: impl Fn(&Range<usize>, &mut [f32]) + Sync,
) {
    let nr: usize = tasks.iter().map(|t| t.len()).sum();
    assert_eq!(y.len(), nr * n, "y must be [n, rows]");
    if n == 1 {
        let mut parts = Vec::with_capacity(tasks.len());
        let mut rest = y;
        for tr in tasks {
            let (a, b) = rest.split_at_mut(tr.len());
            parts.push((tr, a));
            rest = b;
        }
        parts.into_par_iter().for_each(|(tr, o)| f(&tr, o));
        return;
    }
    // the tasks' row ranges tile row0..row0 + nr without overlap (checked here)
    let mut at = row0;
    for tr in &tasks {
        assert_eq!(tr.start, at, "tasks must tile the rows in order");
        at = tr.end;
    }
    let dst = SharedOut(y.as_mut_ptr());
    tasks.into_par_iter().for_each(|tr| {
        let mut o = scratch::zeroed(tr.len() * n);
        f(&tr, &mut o);
        let c0 = tr.start - row0;
        for t in 0..n {
            // SAFETY: y holds [n, nr] (asserted) and stays borrowed for this whole call;
            // element (t, c0 + i) for i < tr.len() is inside it, and no other task writes
            // columns c0..c0 + tr.len() (the ranges tile the rows without overlap, checked
            // above), so these writes never race.
            let row = unsafe { std::slice::from_raw_parts_mut(dst.at(t * nr + c0), tr.len()) };
            for (i, v) in row.iter_mut().enumerate() {
                *v = o[i * n + t];
            }
        }
    });
}

/// y's base pointer, shared by the tasks of `run_tasks` (each writes only its own columns).
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: the pointer is only used by `run_tasks`, whose tasks write disjoint elements of a
// buffer that outlives them.
unsafe impl Send for SharedOut {}
// SAFETY: as for Send.
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// `matmul` in fast numerics for an FP4 matrix: x quantized to int8 per 32-column block
/// (`quant::quantize`), integer block dot products, f32 accumulation. Same task split, so
/// the thread count never changes a result, and each token's result equals computing it
/// alone (see `generic`).
pub(crate) fn matmul_q8<K: Kernel>(k: K, p: Product, y: &mut [f32]) {
    let Product { m, rows, x, n } = p;
    assert!(
        matches!(m.w, Weights::Fp4 { .. }),
        "the int8 path is only for FP4"
    );
    let (cols, nb) = (m.cols, m.cols / 32);
    let qx = quantize(x, cols); // q [n, cols], d [n, nb]
    run_tasks(task_split(&rows, false), rows.start, n, y, |tr, o| {
        if n == 1 {
            k.dot_q8_x1(&view(m, tr.clone()), &qx.q, &qx.d, o);
        } else {
            // [GROUP, cols] int8 weights and [GROUP, nb] block scales
            let (mut wq, mut ws) = (vec![0i8; GROUP * cols], vec![0f32; GROUP * nb]);
            let mut accs = vec![0f32; GROUP * n * K::LANES];
            let mut g0 = tr.start;
            while g0 < tr.end {
                let g1 = (g0 + GROUP).min(tr.end);
                let gl = g1 - g0;
                k.decode_q8(&view(m, g0..g1), &mut wq[..gl * cols], &mut ws[..gl * nb]);
                let oo = &mut o[(g0 - tr.start) * n..(g1 - tr.start) * n];
                k.gemm_q8((&wq, &ws), gl, cols, (&qx.q, &qx.d), n, oo, &mut accs);
                g0 = g1;
            }
        }
    });
}
