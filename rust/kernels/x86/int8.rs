//! The int8 block operations of fast numerics on 256-bit integer vectors (AVX2 + SSSE3
//! instructions), shared by the AVX2 and AVX-512 tiers. Every function here is
//! `#[inline(always)]` and is only called from a tier method that runs with those features.
//!
//! A block dot product of signed weights w and signed activations x uses `vpmaddubsw`,
//! which wants one unsigned operand: |w| (u8) times x with w's sign applied (`vpsignb`).
//! |w| <= 12 and |x| <= 127 (`quant`), so a pair sum is at most 2 * 127 * 127 and never
//! saturates; `vpmaddwd` with ones widens to eight i32 lane sums, exactly.

use std::arch::x86_64::*;

/// `quant::I8_OF_E2M1` as a `pshufb` table.
#[inline(always)]
unsafe fn table() -> __m128i {
    // SAFETY: SSE2 (baseline); the caller runs with the tier's features.
    unsafe { _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12) }
}

/// 16 packed e2m1 bytes at p as 32 int8 weights [16 low nibbles, 16 high nibbles].
///
/// # Safety
/// The CPU has AVX2; `p` is valid for reading 16 bytes.
#[inline(always)]
pub(crate) unsafe fn fp4_i8(p: *const u8) -> __m256i {
    // SAFETY: the caller's contract (features and 16 readable bytes, read unaligned).
    unsafe {
        let b = _mm_loadu_si128(p.cast());
        let m = _mm_set1_epi8(15);
        let lo = _mm_shuffle_epi8(table(), _mm_and_si128(b, m));
        let hi = _mm_shuffle_epi8(table(), _mm_and_si128(_mm_srli_epi16::<4>(b), m));
        _mm256_set_m128i(hi, lo)
    }
}

/// Eight i32 lanes summing to w · x (32 int8 each), as f32.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
pub(crate) unsafe fn dot(w: __m256i, x: __m256i) -> __m256 {
    // SAFETY: the caller's contract (features).
    unsafe {
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
        _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
    }
}

/// 32 int8 at p.
///
/// # Safety
/// The CPU has AVX2; `p` is valid for reading 32 bytes.
#[inline(always)]
pub(crate) unsafe fn load(p: *const i8) -> __m256i {
    // SAFETY: the caller's contract, read unaligned.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The int8 `Simd` methods of an x86 tier, written once for both: `$widen` turns the eight
/// 256-bit lane sums into the tier's vector (AVX-512: the upper half zero; the lanes' sum is
/// the same). Inside the tier's `impl Simd`.
macro_rules! int8_methods {
    ($widen:path) => {
        #[inline(always)]
        unsafe fn dot_i8(self, w: *const i8, x: *const i8) -> Self::V {
            use $crate::kernels::x86::int8;
            // SAFETY: see the impl; `w` and `x` are valid for 32 bytes (caller).
            unsafe { $widen(int8::dot(int8::load(w), int8::load(x))) }
        }

        #[inline(always)]
        unsafe fn fp4_i8(self, p: *const u8, out: *mut i8) {
            // SAFETY: see the impl; `p` is valid for 16 bytes and `out` for 32 (caller).
            unsafe { _mm256_storeu_si256(out.cast(), $crate::kernels::x86::int8::fp4_i8(p)) }
        }

        /// The weights `fp4_i8` forms, kept in a register: the same lanes as the pair.
        #[inline(always)]
        unsafe fn dot_fp4_i8(self, p: *const u8, x: *const i8) -> Self::V {
            use $crate::kernels::x86::int8;
            // SAFETY: see the impl; `p` is valid for 16 bytes and `x` for 32 (caller).
            unsafe { $widen(int8::dot(int8::fp4_i8(p), int8::load(x))) }
        }
    };
}
pub(crate) use int8_methods;

/// The AVX2 tier's `$widen` for `int8_methods!`: its vectors are the 256-bit sums.
#[inline(always)]
pub(super) fn as_is(v: __m256) -> __m256 {
    v
}
