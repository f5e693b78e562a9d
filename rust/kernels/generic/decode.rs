//! What the row loops share: a vector from a slice (`ld`, `st`), one chunk of a row decoded
//! (`chunk`, the fused path's last chunk and the panel path's; `fp4_group`, the panel path's
//! FP4 groups), and the read-ahead of the next rows (`prefetch_next`).

use super::super::rows::Rows;
use super::simd::Simd;
use crate::dtype::e8m0_to_f32;

/// v[i..i + L] as a vector.
#[inline(always)]
pub(super) fn ld<S: Simd>(s: S, v: &[f32], i: usize) -> S::V {
    let v = &v[i..i + S::LANES];
    // SAFETY: `v` holds L f32.
    unsafe { s.load(v.as_ptr()) }
}

/// v[i..i + L] = a.
#[inline(always)]
pub(super) fn st<S: Simd>(s: S, v: &mut [f32], i: usize, a: S::V) {
    let v = &mut v[i..i + S::LANES];
    // SAFETY: `v` holds L f32.
    unsafe { s.store(v.as_mut_ptr(), a) }
}

/// Room for the zero-padded last chunk of a row (L <= 16).
const TAIL: usize = 32;

/// How `chunk` decodes an FP8 chunk: times its block scale (the panel path), unscaled
/// (`Simd::fp8`: the fused path, whose x holds the block scales), or as its bits
/// (`Simd::fp8_bits`: the fused path whose x holds the block scales times 2^112).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Fp8As {
    Scaled,
    Unscaled,
    Bits,
}

/// Chunk c of row r (of `cols` columns), decoded; the last one zero padded. Not FP4. FP8
/// as `fp8` says (see `Fp8As`).
#[inline(always)]
pub(super) fn chunk<S: Simd>(
    s: S,
    rows: Rows,
    r: usize,
    cols: usize,
    c: usize,
    fp8: Fp8As,
) -> S::V {
    let l = S::LANES;
    let j = c * l;
    let n = l.min(cols - j);
    match rows {
        Rows::F32(d) => {
            let row = &d[r * cols..(r + 1) * cols];
            if n == l {
                ld(s, row, j)
            } else {
                let mut b = [0f32; TAIL];
                b[..n].copy_from_slice(&row[j..]);
                ld(s, &b, 0)
            }
        }
        Rows::Bf16(d) => {
            let row = &d[r * cols * 2..(r + 1) * cols * 2];
            let mut b = [0u8; 2 * TAIL];
            let v = if n == l {
                &row[2 * j..2 * j + 2 * l]
            } else {
                b[..2 * n].copy_from_slice(&row[2 * j..]);
                &b[..2 * l]
            };
            // SAFETY: `v` holds 2L bytes.
            unsafe { s.bf16(v.as_ptr()) }
        }
        Rows::Fp8 { q, scale } => {
            let row = &q[r * cols..(r + 1) * cols];
            let mut b = [0u8; TAIL];
            let v = if n == l {
                &row[j..j + l]
            } else {
                b[..n].copy_from_slice(&row[j..]);
                &b[..l]
            };
            // SAFETY: `v` holds L bytes.
            let w = unsafe {
                match fp8 {
                    Fp8As::Bits => s.fp8_bits(v.as_ptr()),
                    Fp8As::Scaled | Fp8As::Unscaled => s.fp8(v.as_ptr()),
                }
            };
            match fp8 {
                Fp8As::Scaled => s.mul(w, s.splat(e8m0_to_f32(scale[j / 128]))),
                // the fused path: the driver put the block scales in x (times 2^112 for
                // `Bits`)
                Fp8As::Unscaled | Fp8As::Bits => w,
            }
        }
        Rows::Fp4 { .. } => unreachable!("fp4 is decoded in pairs"),
    }
}

/// FP4 group g of row r (columns gG..gG + G, G = `Simd::FP4_GROUP`): its G / L chunks,
/// scaled (see `Simd::fp4`).
#[inline(always)]
pub(super) fn fp4_group<S: Simd>(
    s: S,
    q: &[u8],
    scale: &[u8],
    r: usize,
    cols: usize,
    g: usize,
) -> [S::V; 4] {
    const { assert!(S::FP4_GROUP == 2 * S::LANES || S::FP4_GROUP == 32) };
    let gs = S::FP4_GROUP;
    let t = s.fp4_scaled_table(scale[(r * cols + g * gs) / 32]);
    let b = &q[(r * cols + g * gs) / 2..][..gs / 2];
    // SAFETY: `b` holds G / 2 bytes.
    unsafe { s.fp4(b.as_ptr(), &t) }
}

/// Step `i` over the current R-row block of the one-token path, which reads `step` bytes
/// of the block per step (R rows times each row's bytes per step): prefetches the same
/// share of the next block, bytes i * step..(i + 1) * step from `next` (the rows that
/// follow, contiguous in the checkpoint layout, the same size), so the next block arrives
/// as one stream while this one is computed. Measured on Zen 5: with short rows (1-8 KiB)
/// the hardware prefetchers stop at each row's end, so without this every block of R row
/// streams waits on DRAM at its start (FP4 4096x4096 decode: 34 -> 72 % of the streaming
/// read on 2 threads, with 8 rows). Past the last block it prefetches the next task's
/// rows, or nothing useful: harmless (see `Simd::prefetch`). No division: this runs in the
/// inner loop.
#[inline(always)]
pub(crate) fn prefetch_next<S: Simd>(s: S, next: *const u8, step: usize, i: usize) {
    let mut o = (i * step).next_multiple_of(64);
    let end = (i + 1) * step;
    while o < end {
        s.prefetch(next.wrapping_add(o));
        o += 64;
    }
}
