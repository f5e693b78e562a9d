//! `portable::dot` (16 fixed lanes, the RMSNorms' and hyper-connections' dot product) with
//! its lanes in vector registers: the same multiplies and adds in the same order, so the
//! same bits as the scalar definition on every CPU.

use super::super::portable::{dot_tail, L};
use std::arch::x86_64::*;

/// `portable::dot_lanes` on AVX-512: the 16 lanes are one register, each a chain of
/// `vmulps` and `vaddps` (the same two roundings as the scalar code).
#[target_feature(enable = "avx512f")]
pub(crate) fn dot16_avx512(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let full = len / L * L;
    let mut acc = _mm512_setzero_ps();
    for i in (0..full).step_by(L) {
        // SAFETY: i + 16 <= full <= the length of both slices; unaligned loads.
        let (x, y) = unsafe {
            (
                _mm512_loadu_ps(a.as_ptr().add(i)),
                _mm512_loadu_ps(b.as_ptr().add(i)),
            )
        };
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
    }
    let mut lanes = [0f32; L];
    // SAFETY: `lanes` holds 16 f32.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc) };
    dot_tail(lanes, &a[full..len], &b[full..len])
}

/// `portable::dot_lanes` on AVX2: lanes 0-7 and 8-15 in two registers.
#[target_feature(enable = "avx2")]
pub(crate) fn dot16_avx2(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let full = len / L * L;
    let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for i in (0..full).step_by(L) {
        // SAFETY: i + 16 <= full <= the length of both slices; unaligned loads.
        let (xl, yl, xh, yh) = unsafe {
            let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
            (
                _mm256_loadu_ps(pa),
                _mm256_loadu_ps(pb),
                _mm256_loadu_ps(pa.add(8)),
                _mm256_loadu_ps(pb.add(8)),
            )
        };
        lo = _mm256_add_ps(lo, _mm256_mul_ps(xl, yl));
        hi = _mm256_add_ps(hi, _mm256_mul_ps(xh, yh));
    }
    let mut lanes = [0f32; L];
    // SAFETY: `lanes` holds 16 f32: 8 from each register.
    unsafe {
        _mm256_storeu_ps(lanes.as_mut_ptr(), lo);
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8), hi);
    }
    dot_tail(lanes, &a[full..len], &b[full..len])
}
