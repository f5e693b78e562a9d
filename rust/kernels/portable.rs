//! Portable tier: `Simd` on plain `[f32; 16]` arrays with no data-dependent branches, so
//! LLVM vectorizes the generic loops (SSE2 on baseline x86_64, NEON on aarch64). Plain
//! multiply + add, never `mul_add`: without a hardware FMA that is a libm call per element.
//! FP8 / FP4 decode by table lookup; FP4 column groups are 32 wide ([16 even, 16 odd]).
//!
//! This tier is the scalar twin every tier (x86 and NEON) is tested against.

use super::generic::{simd_kernel, Simd};
use crate::dtype::{bf16_to_f32, E2M1_LUT};

const L: usize = 16;

/// e4m3 / 256 exactly as the SIMD tiers decode it through f16, for every byte. The NaN
/// codes 0x7F / 0xFF (absent from valid checkpoints) decode to ±480 / 256 like on SIMD.
pub(crate) static FP8_LUT: [f32; 256] = fp8_lut();

const fn fp8_lut() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut b = 0;
    while b < 256 {
        let e = ((b >> 3) & 15) as u32;
        let m = (b & 7) as f32;
        // f16 bits (b & 0x80) << 8 | (b & 0x7f) << 7: exponent e - 15, or subnormal.
        let v = if e == 0 {
            m * f32::from_bits((127 - 17) << 23) // m/8 * 2^-14
        } else {
            (8.0 + m) * f32::from_bits((e + 127 - 15 - 3) << 23)
        };
        t[b] = if b & 0x80 != 0 { -v } else { v };
        b += 1;
    }
    t
}

#[derive(Clone, Copy)]
pub(crate) struct Portable;

simd_kernel!(Portable);

type V = [f32; L];

/// N bytes at p (any alignment).
///
/// # Safety
/// `p` is valid for reading N bytes.
#[inline(always)]
unsafe fn bytes<const N: usize>(p: *const u8) -> [u8; N] {
    // SAFETY: the caller's contract.
    unsafe { p.cast::<[u8; N]>().read_unaligned() }
}

impl Simd for Portable {
    type V = V;
    const LANES: usize = L;
    #[inline(always)]
    fn splat(self, x: f32) -> V {
        [x; L]
    }

    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> V {
        // SAFETY: `p` is valid for L f32 (caller); read unaligned.
        unsafe { p.cast::<V>().read_unaligned() }
    }

    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: V) {
        // SAFETY: `p` is valid for L f32 (caller); written unaligned.
        unsafe { p.cast::<V>().write_unaligned(v) }
    }

    #[inline(always)]
    fn add(self, a: V, b: V) -> V {
        std::array::from_fn(|i| a[i] + b[i])
    }

    #[inline(always)]
    fn mul(self, a: V, b: V) -> V {
        std::array::from_fn(|i| a[i] * b[i])
    }

    /// Multiply, then add (two roundings).
    #[inline(always)]
    fn fma(self, a: V, b: V, c: V) -> V {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }

    #[inline(always)]
    fn lane0(self, x: f32) -> V {
        let mut v = [0.0; L];
        v[0] = x;
        v
    }

    #[inline(always)]
    fn hsum(self, v: V) -> f32 {
        hsum(v)
    }

    #[inline(always)]
    unsafe fn fp8(self, p: *const u8) -> V {
        // SAFETY: `p` is valid for L bytes (caller).
        let b = unsafe { bytes::<L>(p) };
        std::array::from_fn(|i| FP8_LUT[b[i] as usize])
    }

    #[inline(always)]
    unsafe fn bf16(self, p: *const u8) -> V {
        // SAFETY: `p` is valid for 2L bytes (caller).
        let b = unsafe { bytes::<{ 2 * L }>(p) };
        std::array::from_fn(|i| bf16_to_f32(b[2 * i], b[2 * i + 1]))
    }

    #[inline(always)]
    fn fp4_table(self) -> V {
        E2M1_LUT
    }

    #[inline(always)]
    unsafe fn fp4(self, p: *const u8, t: &V) -> [V; 4] {
        // SAFETY: `p` is valid for L bytes (caller).
        let b = unsafe { bytes::<L>(p) };
        let lo: V = std::array::from_fn(|i| t[(b[i] & 15) as usize]);
        let hi: V = std::array::from_fn(|i| t[(b[i] >> 4) as usize]);
        [lo, hi, lo, hi]
    }

    // ---- register tiles of the loops ----

    const ROWS_XT: [usize; 4] = [4, 2, 2, 2];
    const GEMM_TILE: (usize, usize) = (1, 3);
    const Q8_ROWS: usize = 1;
    const CHAINS: usize = 8;
}

#[inline(always)]
fn hsum(mut a: [f32; L]) -> f32 {
    let mut h = L / 2;
    while h > 0 {
        for i in 0..h {
            a[i] += a[i + h];
        }
        h /= 2;
    }
    a[0]
}
