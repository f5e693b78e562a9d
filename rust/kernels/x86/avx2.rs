//! AVX2 + FMA + F16C tier: 8 f32 lanes.
//!
//! FP8 goes through f16 like the AVX-512 tier (`vcvtph2ps` from F16C) in the prefill path;
//! the one-token and fused paths take its bits straight into f32 lanes on AMD (`fp8_bits`: a
//! sign-extending widening, a shift and a mask, no conversion). FP4 decodes one
//! whole 32-column scale block at a time (`FP4_GROUP` = 32) with byte shuffles, which Zen 3
//! runs two per cycle, instead of `vpermps` per 8 weights: every scaled E2M1 value is
//! exactly the top 16 bits of its f32 (a 2-bit significand times a power of two), so
//! `vpshufb` looks up its high and low byte in two 16-entry tables (`FP4_BYTES`, per scale
//! byte), the bytes are interleaved into 16-bit words and the words moved to the top of
//! 32-bit lanes. One block's 16 bytes give 4 chunks in the order `fp4_col` states. Four
//! FP4 rows share each x load in the one-token path (`FP4_X_BY_CHUNK`), eight FP8 and BF16
//! rows; the prefill micro-kernel runs 4 rows x 3 tokens (12 accumulators of 16 registers).
//! The FP4 passes of 1 to 4 tokens and the one-token FP8 pass run as assembly loops
//! (`fp4_loops`, `fp8_loops`; `fp4_loop` and `fp8_bits_loop` below).

use super::super::generic::{simd_kernel, Fp4Loop, Fp8Loop, Simd};
use super::cpu::{rules_methods, Prefetch, Rules};
use super::int8::int8_methods;
use super::lanes::lane_methods;
use crate::dtype::{e8m0_to_f32, E2M1_LUT};
use std::arch::x86_64::*;

/// Proof that the CPU has this tier's features, with the rules it follows on this CPU; only
/// `detect` creates one.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(Rules);

impl Avx2 {
    pub(crate) fn detect() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then(|| Avx2(Rules::new(Prefetch::avx2())))
    }
}

simd_kernel!(Avx2, "avx2,fma,f16c");

// In every method below, SAFETY: `self` exists, so `detect` found avx2, fma and f16c, the
// features of every intrinsic called; pointer validity is the caller's contract (see
// `Simd`).
impl Simd for Avx2 {
    type V = __m256;
    const LANES: usize = 8;

    lane_methods!(
        __m256,
        _mm256_set1_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_add_ps,
        _mm256_mul_ps,
        _mm256_fmadd_ps
    );

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

    /// Each byte sign-extended to 32 bits, shifted left by 20 (sign into bit 31, the
    /// exponent and mantissa into bits 26-20) and masked: three integer operations per 8
    /// weights, against a widening, a shift, a mask and the two-µop `vcvtph2ps` of `fp8`.
    /// Measured on Zen 3 (one core, 8 rows x 1024 columns from L2): 14.2 GB/s against 10.6.
    const FP8_BITS: bool = true;

    #[inline(always)]
    unsafe fn fp8_bits(self, p: *const u8) -> __m256 {
        // SAFETY: see the impl; `p` is valid for 8 bytes (caller), read unaligned.
        unsafe {
            let s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()));
            let b = _mm256_and_si256(
                _mm256_slli_epi32::<20>(s),
                _mm256_set1_epi32(0x87F0_0000u32 as i32),
            );
            _mm256_castsi256_ps(b)
        }
    }

    /// 8 rows (the one-token pass) run as the assembly loop of `fp8_loops`, with this CPU's
    /// read-ahead hint (`cpu::Prefetch`).
    #[inline(always)]
    unsafe fn fp8_bits_loop(self, r: usize, p: Fp8Loop, acc: &mut [__m256]) -> usize {
        if r != 8 || p.pairs == 0 {
            return 0;
        }
        let Ok(a) = <&mut [__m256; 8]>::try_from(acc) else {
            return 0;
        };
        // SAFETY: see the impl; the caller's contract is the loop's (`Fp8Loop`).
        unsafe {
            if self.0.pf.l2 {
                super::fp8_loops::r8_l2(p, a)
            } else {
                super::fp8_loops::r8_l1(p, a)
            }
        }
        2 * p.pairs
    }

    #[inline(always)]
    unsafe fn bf16(self, p: *const u8) -> __m256 {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), read unaligned.
        unsafe {
            let b = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(b)))
        }
    }

    rules_methods!();

    /// The first 8 E2M1 values; not used by this tier (`fp4_scaled_table` reads
    /// `FP4_BYTES`).
    #[inline(always)]
    fn fp4_table(self) -> __m256 {
        // SAFETY: see the impl; E2M1_LUT holds 16 f32, 8 are read.
        unsafe { _mm256_loadu_ps(E2M1_LUT.as_ptr()) }
    }

    const FP4_GROUP: usize = 32;

    /// Passes of up to 4 tokens. With x loaded for a whole group (before session 39 read it
    /// per row and `FP4_X_BY_CHUNK` chunk by chunk), a pass of 4 tokens held 16 x vectors
    /// beside the decode and spilled: measured on Zen 3 (FP4 2048 x 4096, GFLOP/s), 3 tokens
    /// 110, 4 tokens 86, so passes were of at most 3 then.
    const FP4_PASS: usize = 4;

    /// FP4 rows take passes of 4 tokens up to 16 tokens (since session 41: with the passes
    /// as assembly loops, `fp4_loops`). Measured on Zen 4 (FP4 2048 x 4096, `kernels_ab
    /// prefill`, share of the FMA peak, one thread, the former path -> passes): 5 tokens
    /// 57-58 -> 61-62 %, 8 tokens 53-59 -> 73 % (the former 5-to-8-token panel loop, now
    /// removed), 9 tokens 59-60 -> 66 %, 12 tokens 62-65 -> 73 %, 16 tokens 65-67 -> 73-74 %
    /// (the panel path); two threads at 16 tokens 130 -> 146-151 GFLOP/s.
    const FP4_FUSED_MAX: usize = 16;

    /// Measured on Zen 4 (FP4 2048 x 4096, `kernels_ab prefill`, one thread, share of the
    /// FMA peak): 3 tokens 42-45 % with a group's x in registers, 56-61 % with x read per
    /// row from memory (session 39), 63-64 % chunk by chunk (57-58 % for per row in the same
    /// runs); 4 tokens 58-59 % per row or chunk by chunk. Chunk by chunk also lets a 2-token
    /// pass take 3 rows (6 FMA chains instead of 4; `rows_xt` above): 47 % -> 53 %. One
    /// token (`kernels_ab decode`, GB/s): 8 rows with a group's x in registers 10.6-10.7,
    /// chunk by chunk 4 rows 11.1-11.3 (8 rows 8.2-8.3, 3 rows 10.0, 5 rows 8.3-9.7); two
    /// threads from DRAM, medians of three runs, 16.8 -> 18.3.
    const FP4_X_BY_CHUNK: bool = true;

    /// Chunk q, lane i of a block: lanes 0-3 come from the low nibbles (even columns),
    /// lanes 4-7 from the high nibbles of the same bytes; chunk 0 holds the even and chunk 1
    /// the odd 16-bit words interleaved from bytes 0-7, chunks 2 and 3 likewise from bytes
    /// 8-15 (see `fp4`).
    #[inline(always)]
    fn fp4_col(k: usize) -> usize {
        let (q, i) = (k / 8, k % 8);
        16 * (q >> 1) + 4 * (i & 3) + 2 * (q & 1) + (i >> 2)
    }

    /// `FP4_BYTES[b]` as a vector: [high bytes of the 16 values | their low bytes].
    #[inline(always)]
    fn fp4_scaled_table(self, b: u8) -> __m256 {
        // SAFETY: see the impl; each entry of FP4_BYTES holds 32 bytes.
        unsafe { _mm256_loadu_ps(FP4_BYTES.0[b as usize].as_ptr().cast()) }
    }

    /// 16 packed bytes (one scale block): `vpshufb` of the nibbles (low nibbles in the low
    /// 128-bit lane, high nibbles in the high one) into the high-byte and low-byte tables,
    /// the two results interleaved into 16-bit words, each word moved to the top of a
    /// 32-bit lane (a shift for the even words, a mask for the odd ones).
    #[inline(always)]
    unsafe fn fp4(self, p: *const u8, t: &__m256) -> [__m256; 4] {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller) and `t` for 32, both read
        // unaligned (each half of `t` broadcast straight from memory).
        unsafe {
            let tp: *const __m128i = (t as *const __m256).cast();
            let th = _mm256_broadcastsi128_si256(_mm_loadu_si128(tp));
            let tl = _mm256_broadcastsi128_si256(_mm_loadu_si128(tp.add(1)));
            let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
            let sh = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
            let idx = _mm256_and_si256(_mm256_srlv_epi32(v, sh), _mm256_set1_epi8(15));
            let (h, l) = (_mm256_shuffle_epi8(th, idx), _mm256_shuffle_epi8(tl, idx));
            let (p0, p1) = (_mm256_unpacklo_epi8(l, h), _mm256_unpackhi_epi8(l, h));
            let top = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
            [
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(p0)),
                _mm256_castsi256_ps(_mm256_and_si256(p0, top)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(p1)),
                _mm256_castsi256_ps(_mm256_and_si256(p1, top)),
            ]
        }
    }

    /// 4 rows x 1 token, 2 rows x 3 or 4 tokens and 3 rows x 2 tokens run as the assembly
    /// loops of `fp4_loops`, with this CPU's read-ahead hint (`cpu::Prefetch`).
    #[inline(always)]
    unsafe fn fp4_loop(self, r: usize, p: Fp4Loop<__m256>, acc: &mut [__m256]) -> bool {
        use super::fp4_loops::*;
        if p.groups == 0 {
            return false;
        }
        let l2 = self.0.pf.l2;
        // Runs the loop with R x T = `$n` accumulators (with this CPU's read-ahead hint) if
        // `acc` holds that many.
        macro_rules! run {
            ($n:literal, $l1:ident, $l2:ident) => {
                if let Ok(a) = <&mut [__m256; $n]>::try_from(&mut *acc) {
                    if l2 {
                        $l2(p, a)
                    } else {
                        $l1(p, a)
                    }
                    return true;
                }
            };
        }
        // SAFETY: see the impl; the caller's contract is the loops' (`Fp4Loop`), and each
        // loop gets exactly its R x T accumulators.
        unsafe {
            match r {
                4 => run!(4, r4t1_l1, r4t1_l2),
                2 => {
                    run!(8, r2t4_l1, r2t4_l2);
                    run!(6, r2t3_l1, r2t3_l2);
                }
                3 => run!(6, r3t2_l1, r3t2_l2),
                _ => {}
            }
        }
        false
    }

    int8_methods!(super::int8::as_is);

    // ---- register tiles of the loops ----

    /// 3 rows for 2-token passes (2 before session 40), measured on Zen 4 (`kernels_ab
    /// prefill`, one thread, share of the FMA peak, 2 tokens): FP4 2048 x 4096 46-47 -> 52-53 %
    /// (with `FP4_X_BY_CHUNK`), FP8 4096 x 4096 39-41 -> 49-50 %, BF16 27-29 -> 36-38 %. 3 rows
    /// for 3 or 4 tokens lost (FP4 64 -> 38 %, 58 -> 47 %): 16 registers.
    const ROWS_XT: [usize; 4] = [8, 3, 2, 2];
    /// 4 FP4 rows share each x load in the one-token path (`FP4_X_BY_CHUNK`).
    const FP4_ROWS_X1: usize = 4;
    /// 4 rows x 3 tokens: 12 accumulators of 16 registers.
    const GEMM_TILE: (usize, usize) = (4, 3);
    const Q8_ROWS: usize = 4;
    const CHAINS: usize = 12;
}

/// Per UE8M0 scale byte b: the high bytes (0..16) and low bytes (16..32) of the f32 of each
/// E2M1 value (by nibble) times 2^(b - 127). Exact: such a product has at most two
/// significant bits, so its f32 is zero below bit 16 (also for the subnormal 0.5 * 2^-127
/// = 2^-128, bit 21). Byte 255 (NaN, which the reader rejects) gives NaN throughout.
#[repr(C, align(32))]
struct Fp4Bytes([[u8; 32]; 256]);

static FP4_BYTES: Fp4Bytes = Fp4Bytes(fp4_bytes());

const fn fp4_bytes() -> [[u8; 32]; 256] {
    let mut t = [[0u8; 32]; 256];
    let mut b = 0;
    while b < 256 {
        let mut n = 0;
        while n < 16 {
            let v = if b == 255 {
                0x7FC0_0000
            } else {
                (E2M1_LUT[n] * e8m0_to_f32(b as u8)).to_bits()
            };
            t[b][n] = (v >> 24) as u8;
            t[b][16 + n] = (v >> 16) as u8;
            n += 1;
        }
        b += 1;
    }
    t
}
