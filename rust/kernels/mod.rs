//! Matrix kernels over the checkpoint's own weight formats, and the small vector helpers.
//!
//! The engine is memory-bound in decode: every generated token streams the dense weights
//! once, so these kernels decode FP8/FP4/BF16 on the fly from the checkpoint layout and
//! accumulate in f32. A kernel tier (AVX-512, AVX2+FMA, portable) is chosen once at run time.
//!
//! Determinism contract (tests rely on it):
//! - output rows are independent; threads split rows, so any thread count gives
//!   bit-identical results;
//! - `matmul` with n tokens gives, for every token, bit-identical results to `matmul` with
//!   that token alone (the per-row accumulation order does not depend on n).

pub mod ops;
mod portable;

use std::ops::Range;

/// A weight matrix [rows, cols] in one of the checkpoint's formats, borrowed.
#[derive(Clone, Copy)]
pub enum Weights<'a> {
    /// [rows, cols] f32.
    F32(&'a [f32]),
    /// [rows, cols] little-endian bf16 (2 bytes per element, any alignment).
    Bf16(&'a [u8]),
    /// q: [rows, cols] e4m3; scale: [ceil(rows/128), ceil(cols/128)] ue8m0.
    Fp8 { q: &'a [u8], scale: &'a [u8] },
    /// q: [rows, cols/2] packed e2m1, low nibble = even column; scale: [rows, cols/32] ue8m0.
    Fp4 { q: &'a [u8], scale: &'a [u8] },
}

#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub rows: usize,
    pub cols: usize,
    pub w: Weights<'a>,
}

impl<'a> MatRef<'a> {
    /// Checks the buffer lengths against the geometry (the loader validates shapes before,
    /// so a failure here is a programming error reported as a message, never a panic).
    pub fn new(rows: usize, cols: usize, w: Weights<'a>) -> Result<Self, String> {
        let (need, got, what) = match w {
            Weights::F32(d) => (rows * cols, d.len(), "f32 elements"),
            Weights::Bf16(d) => (rows * cols * 2, d.len(), "bf16 bytes"),
            Weights::Fp8 { q, scale } => {
                let s = rows.div_ceil(128) * cols.div_ceil(128);
                if scale.len() != s {
                    return Err(format!("fp8 scale has {} bytes, expected {s}", scale.len()));
                }
                (rows * cols, q.len(), "fp8 bytes")
            }
            Weights::Fp4 { q, scale } => {
                if cols % 32 != 0 {
                    return Err(format!("fp4 matrix needs cols % 32 == 0, got {cols}"));
                }
                if scale.len() != rows * cols / 32 {
                    return Err(format!(
                        "fp4 scale has {} bytes, expected {}",
                        scale.len(),
                        rows * cols / 32
                    ));
                }
                (rows * cols / 2, q.len(), "fp4 bytes")
            }
        };
        if need != got {
            return Err(format!(
                "matrix [{rows}, {cols}] needs {need} {what}, got {got}"
            ));
        }
        Ok(MatRef { rows, cols, w })
    }

    /// Bytes of weight data (and scales) a full pass over the matrix reads.
    pub fn bytes(&self) -> usize {
        match self.w {
            Weights::F32(d) => d.len() * 4,
            Weights::Bf16(d) => d.len(),
            Weights::Fp8 { q, scale } | Weights::Fp4 { q, scale } => q.len() + scale.len(),
        }
    }
}

/// y[n, rows.len()] = x[n, cols] · W[rows]ᵀ, parallel over rows in the current rayon pool.
pub fn matmul(m: &MatRef, rows: Range<usize>, x: &[f32], n: usize, y: &mut [f32]) {
    assert!(
        rows.end <= m.rows && rows.start <= rows.end,
        "row range out of bounds"
    );
    assert_eq!(x.len(), n * m.cols, "x must be [n, cols]");
    assert_eq!(y.len(), n * rows.len(), "y must be [n, rows]");
    portable::matmul(m, rows, x, n, y)
}

/// y[rows] = W x.
pub fn matvec(m: &MatRef, x: &[f32], y: &mut [f32]) {
    matmul(m, 0..m.rows, x, 1, y)
}

/// The kernel tier in use (decided once).
pub fn tier_name() -> &'static str {
    "portable"
}

/// Flops per iteration of [`fma_chains`].
pub const FMA_CHAIN_FLOPS: usize = 2 * 16 * 12;

/// Runs 12 independent 16-lane FMA chains for `iters` iterations (an FMA-peak probe that
/// LLVM keeps in registers; with AVX-512 or AVX2 enabled it runs at the machine's peak).
pub fn fma_chains(iters: usize, seed: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: avx512f was detected at run time.
            return unsafe { fma_chains_avx512(iters, seed) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: avx2 and fma were detected at run time.
            return unsafe { fma_chains_avx2(iters, seed) };
        }
    }
    fma_chains_generic(iters, seed)
}

#[inline(always)]
fn fma_chains_generic(iters: usize, seed: f32) -> f32 {
    let mut acc = [[seed; 16]; 12];
    let m = [0.999_999f32; 16];
    let a = [1e-7f32; 16];
    for _ in 0..iters {
        for c in acc.iter_mut() {
            for l in 0..16 {
                c[l] = c[l].mul_add(m[l], a[l]);
            }
        }
    }
    acc.iter().flatten().sum()
}

macro_rules! fma_chain_body {
    ($vec:ty, $set1:path, $fmadd:path, $store:path, $lanes:expr, $iters:expr, $seed:expr) => {{
        let m = $set1(0.999_999);
        let a = $set1(1e-7);
        let mut acc: [$vec; 12] = [$set1($seed); 12];
        for _ in 0..$iters {
            // 12 independent chains hide the FMA latency on two FMA ports
            acc[0] = $fmadd(acc[0], m, a);
            acc[1] = $fmadd(acc[1], m, a);
            acc[2] = $fmadd(acc[2], m, a);
            acc[3] = $fmadd(acc[3], m, a);
            acc[4] = $fmadd(acc[4], m, a);
            acc[5] = $fmadd(acc[5], m, a);
            acc[6] = $fmadd(acc[6], m, a);
            acc[7] = $fmadd(acc[7], m, a);
            acc[8] = $fmadd(acc[8], m, a);
            acc[9] = $fmadd(acc[9], m, a);
            acc[10] = $fmadd(acc[10], m, a);
            acc[11] = $fmadd(acc[11], m, a);
        }
        let mut out = [0f32; $lanes];
        let mut s = 0f32;
        for v in acc {
            // SAFETY: `out` has exactly one vector's worth of lanes.
            unsafe { $store(out.as_mut_ptr(), v) };
            s += out.iter().sum::<f32>();
        }
        s
    }};
}

/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn fma_chains_avx512(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let r: f32 = fma_chain_body!(
        __m512,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_storeu_ps,
        16,
        iters,
        seed
    );
    r
}

/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains_avx2(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    // 8-lane vectors: twice the iterations give the same flop count as the other tiers
    let r: f32 = fma_chain_body!(
        __m256,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_storeu_ps,
        8,
        2 * iters,
        seed
    );
    r
}
