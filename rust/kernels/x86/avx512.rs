//! AVX-512 tier (avx512f/bw/vl + f16c): 16 f32 lanes.
//!
//! FP8: 16 bytes sign-extended to 16-bit lanes, `(s << 7) & 0xBF80` is the f16 of e4m3/256
//! (subnormals included, no f32 denormals), then `vcvtph2ps`; on AMD the one-token and
//! fused paths take the bits straight into f32 lanes instead (`fp8_bits`, `cpu::fp8_bits`).
//! FP4: the 16-entry E2M1 table times the block scale sits in one register and `vpermps`
//! picks by nibble; column groups are 32 wide ([16 even, 16 odd]). Eight rows share each x
//! load in the one-token path; the prefill micro-kernel runs 4 rows x 6 tokens (24
//! accumulators of 32 registers).

use super::super::generic::{simd_kernel, Simd};
use super::cpu::{rules_methods, Prefetch, Rules};
use super::int8::int8_methods;
use super::lanes::lane_methods;
use crate::dtype::E2M1_LUT;
use std::arch::x86_64::*;

/// Proof that the CPU has this tier's features, with the rules it follows on this CPU; only
/// `detect` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(Rules);

impl Avx512 {
    pub(crate) fn detect() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then(|| Avx512(Rules::new(Prefetch::avx512())))
    }
}

simd_kernel!(Avx512, "avx512f,avx512bw,avx512vl,avx2,fma,f16c");

// In every method below, SAFETY: `self` exists, so `detect` found avx512f/bw/vl, avx2, fma
// and f16c, the features of every intrinsic called; pointer validity is the caller's
// contract (see `Simd`).
impl Simd for Avx512 {
    type V = __m512;
    const LANES: usize = 16;

    lane_methods!(
        __m512,
        _mm512_set1_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_add_ps,
        _mm512_mul_ps,
        _mm512_fmadd_ps
    );

    #[inline(always)]
    fn lane0(self, x: f32) -> __m512 {
        // SAFETY: see the impl.
        unsafe { _mm512_zextps128_ps512(_mm_set_ss(x)) }
    }

    #[inline(always)]
    fn hsum(self, v: __m512) -> f32 {
        // SAFETY: see the impl.
        unsafe {
            let a = _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            );
            let b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
            let c = _mm_add_ps(b, _mm_movehl_ps(b, b));
            _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)))
        }
    }

    #[inline(always)]
    unsafe fn fp8(self, p: *const u8) -> __m512 {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), read unaligned.
        unsafe {
            let s = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.cast()));
            let h = _mm256_and_si256(
                _mm256_slli_epi16::<7>(s),
                _mm256_set1_epi16(0xBF80u16 as i16),
            );
            _mm512_cvtph_ps(h)
        }
    }

    /// A group's rows decoded for 4,096 columns (GROUP x 16 KiB, in L2), so that the
    /// register tile's accumulators go to memory once per 4,096 columns instead of 512.
    /// Measured on Zen 4 (32 KiB L1d, 1 MiB L2; two threads, % of the FMA peak, 512 ->
    /// 4,096): FP4 2048x4096 16 tokens 47-53 -> 59-67, FP4 4096x2048 48 tokens 60-63 ->
    /// 65-74, FP8 32768x1024 256 tokens 68-70 -> 70-77, BF16 8192x4096 64 tokens 56-76 ->
    /// 64-71. The AVX2 tier ties there and keeps 512.
    const GEMM_PANEL: usize = 4096;

    /// FP4 rows take the fused passes (of 4 tokens) up to 16 tokens, not 8. Measured on
    /// Zen 4 (`kernels_ab prefill fp4`, 2 threads, GFLOP/s, medians of 3, panel path ->
    /// fused): 2048 x 4096 at 9 tokens 121 -> 155, 12 142 -> 170, 16 146 -> 171; 4096 x 2048
    /// at 9 145 -> 183, 12 154 -> 183, 16 171 -> 193; at 24 and 32 tokens the panel path
    /// wins (158 -> 148, 150 -> 133).
    const FP4_FUSED_MAX: usize = 16;

    /// Measured on Zen 4 (FP4 2048 x 4096, `kernels_ab`, one thread): one token 14.2 ->
    /// 15.0-15.1 GB/s (two threads from DRAM, medians of three runs, 22.7 -> 25.2); 2 tokens
    /// 66-68 -> 72 % of the FMA peak, 3 to 16 tokens 80-84 % either way.
    const FP4_X_BY_CHUNK: bool = true;

    const FP8_PAIR: bool = true;

    /// 32 bytes widened and shifted as one 512-bit vector, then converted in two halves.
    #[inline(always)]
    unsafe fn fp8_pair(self, p: *const u8) -> (__m512, __m512) {
        // SAFETY: see the impl; `p` is valid for 32 bytes (caller), read unaligned.
        unsafe {
            let s = _mm512_cvtepi8_epi16(_mm256_loadu_si256(p.cast()));
            let h = _mm512_and_si512(
                _mm512_slli_epi16::<7>(s),
                _mm512_set1_epi16(0xBF80u16 as i16),
            );
            (
                _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)),
            )
        }
    }

    /// Each byte sign-extended to 32 bits, shifted left by 20 (sign into bit 31, the
    /// exponent and mantissa into bits 26-20) and masked, as on AVX2: no `vcvtph2ps`.
    /// Measured on Zen 4 (one core, matrix in cache, GFLOP/s, f16 route -> bits): FP8
    /// 1024 x 4096 1 token 25 -> 29-31, 2 tokens 42 -> 53-55, 4 tokens 57-60 -> 57-66,
    /// 8 tokens 65-69 -> 66-70.
    const FP8_BITS: bool = true;

    #[inline(always)]
    unsafe fn fp8_bits(self, p: *const u8) -> __m512 {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), read unaligned.
        unsafe {
            let s = _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()));
            let b = _mm512_and_si512(
                _mm512_slli_epi32::<20>(s),
                _mm512_set1_epi32(0x87F0_0000u32 as i32),
            );
            _mm512_castsi512_ps(b)
        }
    }

    #[inline(always)]
    unsafe fn bf16(self, p: *const u8) -> __m512 {
        // SAFETY: see the impl; `p` is valid for 32 bytes (caller), read unaligned.
        unsafe {
            let b = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(b)))
        }
    }

    rules_methods!();

    #[inline(always)]
    fn fp4_table(self) -> __m512 {
        // SAFETY: see the impl; E2M1_LUT holds 16 f32.
        unsafe { _mm512_loadu_ps(E2M1_LUT.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn fp4(self, p: *const u8, t: &__m512) -> [__m512; 4] {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), read unaligned.
        unsafe {
            let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
            let lo = _mm512_permutexvar_ps(b, *t);
            let hi = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(b), *t);
            [lo, hi, lo, hi]
        }
    }

    int8_methods!(_mm512_zextps256_ps512);

    // ---- register tiles of the loops ----

    /// 3 rows for 4-token passes (2 before session 40), measured on Zen 4 with the FP4
    /// passes chunk by chunk (`kernels_ab prefill`, one thread, share of the FMA peak): FP4
    /// 2048 x 4096 at 4 tokens 84-85 -> 90-91 % (8 to 16 tokens, in passes of 4: 84-85 ->
    /// 90-91 %), 4096 x 2048 87 -> 88-89 %; FP8 4096 x 4096 at 4 tokens 60-63 -> 77-80 %, BF16
    /// 34-38 -> 57-66 %. 4 rows: the same for FP4 and FP8, BF16 69-74 %, FP4 4096 x 2048 86 %.
    const ROWS_XT: [usize; 4] = [8, 4, 3, 3];
    /// 4 rows x 6 tokens: 24 accumulators of 32 registers.
    const GEMM_TILE: (usize, usize) = (4, 6);
    const Q8_ROWS: usize = 4;
    const CHAINS: usize = 16;
}
