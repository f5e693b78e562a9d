//! Portable tier: `Simd` on plain `[f32; 16]` arrays with no data-dependent branches, so
//! LLVM vectorizes the generic loops (SSE2 on baseline x86_64, NEON on aarch64). Plain
//! multiply + add, never `mul_add`: without a hardware FMA that is a libm call per element.
//! FP8 / FP4 decode by table lookup; FP4 column groups are 32 wide ([16 even, 16 odd]).
//!
//! This tier is the scalar twin every tier (x86 and NEON) is tested against.

use super::driver::RowsView;
use super::generic::{simd_kernel, Simd};
use crate::dtype::{bf16_to_f32, E2M1_LUT};

pub(super) const L: usize = 16;

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

simd_kernel!(
    Portable,
    rows_xt = [4, 2, 2, 2],
    fp4_rows_x1 = 4,
    gemm_rows = 1,
    gemm_tokens = 3,
    q8_rows = 1,
    chains = 8
);

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
}

/// 16-lane dot product with a fixed reduction order (any lengths; the shorter one rules).
/// The same bits on every CPU: each lane is a chain of separate multiplies and adds, so the
/// x86 versions below (the lanes in vector registers, the same operations in the same
/// order) only run it faster (it serves the RMSNorms and the hyper-connection mixes: a
/// 196-token run on Zen 4 spent 1.6 % of its samples here as compiled for SSE2, 0.6 % with
/// the AVX-512 version).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has avx512f, the feature `dot16_avx512` needs.
            return unsafe { super::x86::dot16_avx512(a, b) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has avx2, the feature `dot16_avx2` needs.
            return unsafe { super::x86::dot16_avx2(a, b) };
        }
    }
    dot_lanes(a, b)
}

/// The last len % 16 products into their lanes, then the fixed reduction tree.
#[inline(always)]
pub(super) fn dot_tail(mut acc: [f32; L], a: &[f32], b: &[f32]) -> f32 {
    for (l, (x, y)) in a.iter().zip(b).enumerate() {
        acc[l] += x * y;
    }
    hsum(acc)
}

#[inline(always)]
pub(super) fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let len = a.len().min(b.len());
    let (a, b) = (&a[..len], &b[..len]);
    let mut acc = [0f32; L];
    let ca = a.chunks_exact(L);
    let cb = b.chunks_exact(L);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..L {
            acc[l] += x[l] * y[l];
        }
    }
    dot_tail(acc, ra, rb)
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
