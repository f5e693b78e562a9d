//! NEON tiers: 8 f32 lanes as a pair of 128-bit registers (2 x 4).
//!
//! Why 2 x 4 and not 4 lanes (on paper; nothing here was timed on ARM hardware): the byte
//! work of the decoders (FP8 widening and masking, the FP4 nibble split and table lookup)
//! fills 8- and 16-byte registers, so 8 lanes cost the same instructions for it as 4 (only
//! the widening to f32 grows with the lanes), and the load, loop and scale overhead per call
//! is halved; and four rows sharing each x load keep eight independent FMA chains in flight,
//! what two FMA pipes of four cycles' latency (Cortex-A76, Neoverse N1) need to stay busy.
//! With 8 lanes the column layout, the chain and the lane sum are those of the AVX2 tier, so
//! the two give bit-identical results (`tests::kernels_golden_outputs`).
//!
//! - FMA: `vfmaq_f32`, fused like the x86 tiers.
//! - FP8: bytes sign-extended to 16 bits, `(s << 7) & 0xBF80` is the f16 of e4m3 / 256
//!   (subnormals included; 0x7F / 0xFF give ±480 / 256), then `fcvtl` (`vcvt_f32_f16`).
//! - BF16: each 16-bit value widened and shifted left by 16 (`vshll`).
//! - FP4: `vqtbl1q_s8` maps the nibbles to the int8 weights `2 * E2M1` (`quant::I8_OF_E2M1`),
//!   widened to i32 and converted; `fp4_table` is 1/2, so the block's scaled table `t` is
//!   `scale / 2` and `w * t` is the exact E2M1 value times the scale. Column groups are 16
//!   wide ([8 even, 8 odd]).
//! - `hsum`: lanes i + 4 (the two registers), then i + 2, then i + 1 (`faddp`).
//! - int8 (fast numerics): `BlockDot`, `smull`/`sadalp` or `sdot` (`int8`).
//!
//! One-token path: four rows share each x load. Prefill micro-kernel: 4 rows x 2 tokens (16
//! accumulator registers of 32, plus 4 for x and 2 for the weights); the int8 one: 2 rows x
//! 3 tokens.

use super::super::generic::{simd_kernel, Simd};
use super::int8::{BlockDot, Plain, Sdot};
use crate::kernels::quant::I8_OF_E2M1;
use std::arch::aarch64::*;

/// A NEON tier whose int8 block dot product is `D`; holding one means the CPU has NEON and
/// whatever `D` needs (only the `detect`s below create one).
#[derive(Clone, Copy)]
pub(crate) struct NeonTier<D>(D);

/// NEON only (every aarch64 CPU).
pub(crate) type Neon = NeonTier<Plain>;
/// NEON with `dotprod`.
pub(crate) type NeonDot = NeonTier<Sdot>;

impl Neon {
    pub(crate) fn detect() -> Option<Self> {
        Plain::detect().map(NeonTier)
    }
}

impl NeonDot {
    pub(crate) fn detect() -> Option<Self> {
        Sdot::detect().map(NeonTier)
    }
}

simd_kernel!(Neon, lanes16_neon, "neon");
simd_kernel!(NeonDot, lanes16_neon_dot, "neon,dotprod");

type V = float32x4x2_t;

/// The two halves of the 16 int8 weights of 8 packed e2m1 bytes at `b` (low nibbles,
/// high nibbles), each as 8 lanes of f32 (exact small integers).
///
/// # Safety
/// The CPU has NEON.
#[inline(always)]
unsafe fn fp4_ints(b: uint8x8_t) -> (V, V) {
    // SAFETY: the caller's contract (NEON); I8_OF_E2M1 holds 16 bytes.
    unsafe {
        let tab = vld1q_s8(I8_OF_E2M1.as_ptr());
        let idx = vcombine_u8(vand_u8(b, vdup_n_u8(15)), vshr_n_u8::<4>(b));
        let w = vqtbl1q_s8(tab, idx);
        (i16_f32(vmovl_s8(vget_low_s8(w))), i16_f32(vmovl_high_s8(w)))
    }
}

/// 8 i16 lanes as 8 f32 lanes (not a closure: see `generic`).
///
/// # Safety
/// The CPU has NEON.
#[inline(always)]
unsafe fn i16_f32(h: int16x8_t) -> V {
    // SAFETY: the caller's contract (NEON).
    unsafe {
        float32x4x2_t(
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(h))),
            vcvtq_f32_s32(vmovl_high_s16(h)),
        )
    }
}

/// 8 f16 (as bit patterns) as 8 f32, exactly: `fcvtl` / `fcvtl2` (the instructions behind
/// `vcvt_f32_f16`, which is stable only since Rust 1.94, after this crate's MSRV).
///
/// # Safety
/// The CPU has NEON.
#[inline(always)]
unsafe fn f16x8_f32(h: int16x8_t) -> V {
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: the caller's contract (NEON, which has both instructions); they read and write
    // these registers only.
    unsafe {
        std::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    float32x4x2_t(lo, hi)
}

/// 16 packed e2m1 bytes at p as 32 int8 weights (16 low nibbles, 16 high nibbles).
///
/// # Safety
/// The CPU has NEON; `p` is valid for reading 16 bytes.
#[inline(always)]
unsafe fn fp4_i8x32(p: *const u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: the caller's contract; byte loads need no alignment.
    unsafe {
        let tab = vld1q_s8(I8_OF_E2M1.as_ptr());
        let b = vld1q_u8(p);
        (
            vqtbl1q_s8(tab, vandq_u8(b, vdupq_n_u8(15))),
            vqtbl1q_s8(tab, vshrq_n_u8::<4>(b)),
        )
    }
}

/// 32 int8 at p.
///
/// # Safety
/// The CPU has NEON; `p` is valid for reading 32 bytes.
#[inline(always)]
unsafe fn load_i8x32(p: *const i8) -> (int8x16_t, int8x16_t) {
    // SAFETY: the caller's contract; byte loads need no alignment.
    unsafe { (vld1q_s8(p), vld1q_s8(p.add(16))) }
}

// In every method below, SAFETY: `self` exists, so `detect` found NEON (and what `D`
// needs), the features of every intrinsic called; pointer validity is the caller's contract
// (see `Simd`).
impl<D: BlockDot> Simd for NeonTier<D> {
    type V = V;
    const LANES: usize = 8;
    #[inline(always)]
    fn splat(self, x: f32) -> V {
        // SAFETY: see the impl.
        unsafe { float32x4x2_t(vdupq_n_f32(x), vdupq_n_f32(x)) }
    }

    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> V {
        // SAFETY: see the impl; `p` is valid for 8 f32 (caller); `ld1` needs no more than
        // the f32 alignment every `*const f32` from a slice has.
        unsafe { float32x4x2_t(vld1q_f32(p), vld1q_f32(p.add(4))) }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: V) {
        // SAFETY: see the impl and `load`; `p` is valid for writing 8 f32 (caller).
        unsafe {
            vst1q_f32(p, v.0);
            vst1q_f32(p.add(4), v.1);
        }
    }

    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        // SAFETY: see the impl.
        unsafe { float32x4x2_t(vaddq_f32(a.0, b.0), vaddq_f32(a.1, b.1)) }
    }

    #[inline(always)]
    fn mul(self, a: V, b: V) -> V {
        // SAFETY: see the impl.
        unsafe { float32x4x2_t(vmulq_f32(a.0, b.0), vmulq_f32(a.1, b.1)) }
    }

    #[inline(always)]
    fn fma(self, a: V, b: V, c: V) -> V {
        // SAFETY: see the impl.
        unsafe { float32x4x2_t(vfmaq_f32(c.0, a.0, b.0), vfmaq_f32(c.1, a.1, b.1)) }
    }

    #[inline(always)]
    fn lane0(self, x: f32) -> V {
        // SAFETY: see the impl.
        unsafe {
            let z = vdupq_n_f32(0.0);
            float32x4x2_t(vsetq_lane_f32::<0>(x, z), z)
        }
    }

    #[inline(always)]
    fn hsum(self, v: V) -> f32 {
        // SAFETY: see the impl.
        unsafe {
            let a = vaddq_f32(v.0, v.1); // lane i + lane i + 4
            let b = vadd_f32(vget_low_f32(a), vget_high_f32(a)); // + lane i + 2
            vpadds_f32(b) // lane 0 + lane 1
        }
    }

    #[inline(always)]
    unsafe fn fp8(self, p: *const u8) -> V {
        // SAFETY: see the impl; `p` is valid for 8 bytes (caller); byte loads need no
        // alignment.
        unsafe {
            let s = vmovl_s8(vld1_s8(p.cast()));
            let h = vandq_s16(vshlq_n_s16::<7>(s), vdupq_n_s16(0xBF80u16 as i16));
            f16x8_f32(h)
        }
    }

    #[inline(always)]
    unsafe fn bf16(self, p: *const u8) -> V {
        // SAFETY: see the impl; `p` is valid for 16 bytes (caller), loaded as bytes (no
        // alignment) and reinterpreted as little-endian u16 lanes.
        unsafe {
            let b = vreinterpretq_u16_u8(vld1q_u8(p));
            float32x4x2_t(
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(b))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(b)),
            )
        }
    }

    /// 1/2 in every lane: `fp4` looks up `2 * E2M1` as integers.
    #[inline(always)]
    fn fp4_table(self) -> V {
        self.splat(0.5)
    }

    #[inline(always)]
    unsafe fn fp4(self, p: *const u8, t: &V) -> [V; 4] {
        // SAFETY: see the impl; `p` is valid for 8 bytes (caller), byte loads need no
        // alignment.
        let (lo, hi) = unsafe { fp4_ints(vld1_u8(p)) };
        let (lo, hi) = (self.mul(lo, *t), self.mul(hi, *t));
        [lo, hi, lo, hi]
    }

    #[inline(always)]
    unsafe fn dot_i8(self, w: *const i8, x: *const i8) -> V {
        // SAFETY: see the impl; `w` and `x` are valid for 32 bytes (caller).
        let (w, x) = unsafe { (load_i8x32(w), load_i8x32(x)) };
        let (a, b) = self.0.dot(w, x);
        // SAFETY: see the impl.
        unsafe { float32x4x2_t(vcvtq_f32_s32(a), vcvtq_f32_s32(b)) }
    }

    #[inline(always)]
    unsafe fn fp4_i8(self, p: *const u8, out: *mut i8) {
        // SAFETY: see the impl; `p` is valid for 16 bytes and `out` for 32 (caller).
        unsafe {
            let (lo, hi) = fp4_i8x32(p);
            vst1q_s8(out, lo);
            vst1q_s8(out.add(16), hi);
        }
    }

    /// The weights `fp4_i8` forms, kept in registers: the same lanes as the pair.
    #[inline(always)]
    unsafe fn dot_fp4_i8(self, p: *const u8, x: *const i8) -> V {
        // SAFETY: see the impl; `p` is valid for 16 bytes and `x` for 32 (caller).
        let (w, x) = unsafe { (fp4_i8x32(p), load_i8x32(x)) };
        let (a, b) = self.0.dot(w, x);
        // SAFETY: see the impl.
        unsafe { float32x4x2_t(vcvtq_f32_s32(a), vcvtq_f32_s32(b)) }
    }

    // ---- register tiles of the loops ----

    /// Four rows share each x load in the one-token path.
    const ROWS_XT: [usize; 4] = [4, 2, 1, 1];
    /// 4 rows x 2 tokens: 16 accumulator registers of 32, plus 4 for x and 2 for the weights.
    const GEMM_TILE: (usize, usize) = (4, 2);
    /// 2 rows (x 3 tokens).
    const Q8_ROWS: usize = 2;
    const CHAINS: usize = 8;
}
