//! AVX2 + FMA + F16C tier: 8 f32 lanes.
//!
//! FP8 goes through f16 like the AVX-512 tier (`vcvtph2ps` from F16C). FP4: `vpermps` picks
//! the scaled magnitude from an 8-entry table by the low 3 bits of the nibble, and the
//! nibble shifted to bits 28..31 is xored in, which sets the sign (the table is stored
//! pre-xored so that the other three bits cancel). Column groups are 16 wide
//! ([8 even, 8 odd]), matching `prep_x` with 8 lanes. Eight rows share each x load in the
//! one-token path; the prefill micro-kernel runs 4 rows x 3 tokens (12 accumulators of 16
//! registers).

use super::super::driver::RowsView;
use super::super::generic::{simd_kernel, Simd};
use super::int8;
use crate::dtype::E2M1_LUT;
use std::arch::x86_64::*;

/// Proof that the CPU has this tier's features; only `detect` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    pub(crate) fn detect() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx2(()))
    }
}

simd_kernel!(
    Avx2,
    features = "avx2,fma,f16c",
    rows_xt = [8, 2, 2, 2],
    gemm_rows = 4,
    gemm_tokens = 3,
    q8_rows = 4,
    chains = 12
);

// In every method below, SAFETY: `self` exists, so `detect` found avx2, fma and f16c, the
// features of every intrinsic called; pointer validity is the caller's contract (see
// `Simd`).
impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;

    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m256 {
        // SAFETY: see the impl; `p` is valid for 8 f32 (caller).
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m256) {
        // SAFETY: see the impl; `p` is valid for 8 f32 (caller).
        unsafe { _mm256_storeu_ps(p, v) }
    }

    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_add_ps(a, b) }
    }

    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    fn fma(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    fn lane0(self, x: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe { _mm256_zextps128_ps256(_mm_set_ss(x)) }
    }

    #[inline(always)]
    fn hsum(self, v: __m256) -> f32 {
        // SAFETY: see the impl.
        unsafe {
            let b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
            _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
        }
    }

    #[inline(always)]
    unsafe fn fp8(self, p: *const u8) -> __m256 {
        // SAFETY: see the impl; `p` is valid for 8 bytes (caller), read unaligned.
        unsafe {
            let s = _mm_cvtepi8_epi16(_mm_loadl_epi64(p.cast()));
            let h = _mm_and_si128(_mm_slli_epi16::<7>(s), _mm_set1_epi16(0xBF80u16 as i16));
            _mm256_cvtph_ps(h)
        }
    }

    const FP8_PAIR: bool = true;

    /// 16 bytes widened and shifted as one 256-bit vector, then converted in two halves.
    #[inline(always)]
    unsafe fn fp8_pair(self, p: *const u8) -> (__m256, __m256) {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), read unaligned.
        unsafe {
            let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()));
            let h = _mm256_and_si256(
                _mm256_slli_epi16::<7>(s),
                _mm256_set1_epi16(0xBF80u16 as i16),
            );
            (
                _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
            )
        }
    }

    #[inline(always)]
    unsafe fn bf16(self, p: *const u8) -> __m256 {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), read unaligned.
        unsafe {
            let b = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(b)))
        }
    }

    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        // SAFETY: see the impl; `prefetcht0` reads nothing architecturally and never faults,
        // whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
    }

    /// The first 8 E2M1 entries: the magnitudes (`fp4` applies the sign bit).
    #[inline(always)]
    fn fp4_table(self) -> __m256 {
        // SAFETY: see the impl; E2M1_LUT holds 16 f32, 8 are read.
        unsafe { _mm256_loadu_ps(E2M1_LUT.as_ptr()) }
    }

    /// The scaled magnitudes with entry i's bits xored with `i << 28`: `fp4` xors each
    /// picked entry with its whole nibble `<< 28`, which undoes that and leaves the nibble's
    /// sign bit in bit 31 (one `and` fewer per vector than masking the sign).
    #[inline(always)]
    fn fp4_scaled_table(self, scale: f32) -> __m256 {
        // SAFETY: see the impl.
        unsafe {
            let t = _mm256_mul_ps(self.fp4_table(), _mm256_set1_ps(scale));
            let i = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_xor_ps(t, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(i)))
        }
    }

    /// Lane j: low nibble n of byte j, `t[n & 7] ^ (n << 28)` = the magnitude with the sign
    /// bit n >> 3 (see `fp4_scaled_table`); the high nibble likewise.
    #[inline(always)]
    unsafe fn fp4(self, p: *const u8, t: __m256) -> (__m256, __m256) {
        // SAFETY: see the impl; `p` is valid for 8 bytes (caller), read unaligned.
        unsafe {
            let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            let h = _mm256_srli_epi32::<4>(b);
            // b << 28 keeps only the low nibble (b < 256); h < 16
            let lo = _mm256_permutevar8x32_ps(t, b);
            let hi = _mm256_permutevar8x32_ps(t, h);
            (
                _mm256_xor_ps(lo, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(b))),
                _mm256_xor_ps(hi, _mm256_castsi256_ps(_mm256_slli_epi32::<28>(h))),
            )
        }
    }

    #[inline(always)]
    unsafe fn dot_i8(self, w: *const i8, x: *const i8) -> Self::V {
        // SAFETY: see the impl; `w` and `x` are valid for 32 bytes (caller).
        unsafe { int8::dot(int8::load(w), int8::load(x)) }
    }

    #[inline(always)]
    unsafe fn fp4_i8(self, p: *const u8, out: *mut i8) {
        // SAFETY: see the impl; `p` is valid for 16 bytes and `out` for 32 (caller).
        unsafe { _mm256_storeu_si256(out.cast(), int8::fp4_i8(p)) }
    }

    /// The weights `fp4_i8` forms, kept in a register: the same lanes as the pair.
    #[inline(always)]
    unsafe fn dot_fp4_i8(self, p: *const u8, x: *const i8) -> Self::V {
        // SAFETY: see the impl; `p` is valid for 16 bytes and `x` for 32 (caller).
        unsafe { int8::dot(int8::fp4_i8(p), int8::load(x)) }
    }
}
