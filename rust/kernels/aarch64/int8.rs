//! The int8 block dot product of fast numerics on NEON, in two forms: `Plain` (widening
//! multiplies, every aarch64 CPU) and `Sdot` (`sdot`, the `dotprod` extension). Each gives
//! the dot of 32 int8 weights and 32 int8 activations as two vectors of four i32 lanes (one
//! per 16-byte half), whose eight lanes sum to the exact integer dot: every step below is an
//! exact integer operation, so the `Simd::dot_i8` contract holds for any lane split.

use std::arch::aarch64::*;

/// One way of forming the block dot product. The implementing value is the proof that the
/// CPU has the instructions it uses.
pub(crate) trait BlockDot: Copy {
    /// (w[0..16] · x[0..16] as 4 i32 lanes, w[16..32] · x[16..32] as 4 i32 lanes).
    fn dot(self, w: (int8x16_t, int8x16_t), x: (int8x16_t, int8x16_t)) -> (int32x4_t, int32x4_t);
}

/// `smull` / `smull2` to i16 (|w * x| <= 128 * 128 fits), then `sadalp` pair sums into i32.
#[derive(Clone, Copy)]
pub(crate) struct Plain(());

impl Plain {
    /// NEON is part of the aarch64 baseline the crate is built for; checked anyway.
    pub(crate) fn detect() -> Option<Self> {
        std::arch::is_aarch64_feature_detected!("neon").then_some(Plain(()))
    }
}

impl Plain {
    /// 16 products of one half, summed in pairs into 4 i32 lanes.
    #[inline(always)]
    fn half(self, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SAFETY: `self` exists, so `detect` found NEON, the feature of every intrinsic here.
        unsafe {
            let lo = vmull_s8(vget_low_s8(w), vget_low_s8(x));
            let hi = vmull_high_s8(w, x);
            vpadalq_s16(vpaddlq_s16(lo), hi)
        }
    }
}

impl BlockDot for Plain {
    #[inline(always)]
    fn dot(self, w: (int8x16_t, int8x16_t), x: (int8x16_t, int8x16_t)) -> (int32x4_t, int32x4_t) {
        (self.half(w.0, x.0), self.half(w.1, x.1))
    }
}

/// `sdot`: each i32 lane gains the dot of four byte pairs.
#[derive(Clone, Copy)]
pub(crate) struct Sdot(());

impl Sdot {
    pub(crate) fn detect() -> Option<Self> {
        let ok = std::arch::is_aarch64_feature_detected!("neon")
            && std::arch::is_aarch64_feature_detected!("dotprod");
        ok.then_some(Sdot(()))
    }
}

impl Sdot {
    /// 4 i32 lanes, lane i = sum of w[4i..4i + 4] * x[4i..4i + 4].
    ///
    /// `vdotq_s32` is not stable Rust yet, so this is the instruction itself. It is only
    /// inlined into functions compiled with `dotprod` (the tier's `simd_kernel!` features),
    /// which is also what lets the assembler accept it.
    #[inline(always)]
    fn half(self, w: int8x16_t, x: int8x16_t) -> int32x4_t {
        // SAFETY: `self` exists, so `detect` found NEON.
        let mut acc = unsafe { vdupq_n_s32(0) };
        // SAFETY: `sdot` needs `dotprod`, which `detect` found before `self` existed; the
        // instruction reads and writes these registers only.
        unsafe {
            std::arch::asm!(
                "sdot {acc:v}.4s, {w:v}.16b, {x:v}.16b",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                x = in(vreg) x,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }
}

impl BlockDot for Sdot {
    #[inline(always)]
    fn dot(self, w: (int8x16_t, int8x16_t), x: (int8x16_t, int8x16_t)) -> (int32x4_t, int32x4_t) {
        (self.half(w.0, x.0), self.half(w.1, x.1))
    }
}
