//! `Kernel`: a tier's entry points, each a function compiled for the tier's features, and
//! `simd_kernel!`, which writes them for a `Simd` tier.

use super::super::rows::RowsView;
use super::simd::Simd;

/// n tokens of x for the loops: (xp, stride, n), the tokens `stride` f32 apart in the tier's
/// column layout.
pub(crate) type Tokens<'a> = (&'a [f32], usize, usize);

/// Fast numerics' int8 values with their steps, one per 32 values (`quant`): (q, d).
pub(crate) type Int8<'a> = (&'a [i8], &'a [f32]);

/// One kernel tier as the driver calls it: the tier's `Simd` operations and constants, and
/// the entry points below, each of which runs one of `generic`'s loops inside a function
/// compiled for the tier's features. A value exists only when the CPU runs the tier
/// (`Simd`), so the methods are safe to call. Every tier implements it with `simd_kernel!`.
pub(crate) trait Kernel: Simd + Send + Sync {
    /// out[r * os + t] = dot(row r, x[t]) for every row of `w` and 1 to 4 tokens, out = (out,
    /// os): decoded on the fly, each weight once for the n tokens (`fused::dot_xt`).
    fn dot_xt(self, w: &RowsView, x: Tokens, out: (&mut [f32], usize));
    /// out[r, t] = dot(row r, x[t]) for the rows of `w` (at most GROUP) and n tokens
    /// (`gemm::gemm`). Decodes the rows panel by panel into `pbuf` (at least GROUP *
    /// `panel_stride` f32); `accs` is scratch of at least nrows * n * LANES f32. Any
    /// contents, reused across calls.
    fn gemm(self, w: &RowsView, x: Tokens, out: &mut [f32], accs: &mut [f32], pbuf: &mut [f32]);
    /// Fast numerics, FP4 rows only: out[r] = row r · x with int8 activations (xq [cols] in
    /// the FP4 block order, xd [cols / 32] steps; see `quant`).
    fn dot_q8_x1(self, w: &RowsView, xq: &[i8], xd: &[f32], out: &mut [f32]);
    /// wq [nrows, cols] = the FP4 rows as int8 weights `2 * E2M1` in block order, ws
    /// [nrows, cols / 32] their block scales (e8m0 / 2).
    fn decode_q8(self, w: &RowsView, wq: &mut [i8], ws: &mut [f32]);
    /// out[r, t] = (wq, ws)[r] · (xq, xd)[t] for r < nrows, t < n (w as `decode_q8` writes
    /// it, x as `quant::quantize` does); rows and tokens are `cols` int8 apart. `accs`:
    /// scratch as in `gemm`.
    fn gemm_q8(
        self,
        w: Int8,
        nrows: usize,
        cols: usize,
        x: Int8,
        n: usize,
        out: &mut [f32],
        accs: &mut [f32],
    );
    /// a · b in the tier's FMA lanes (`attend::dot`).
    fn dot(self, a: &[f32], b: &[f32]) -> f32;
    /// a · b in 16 lanes of separate multiplies and adds, the same bits on every tier
    /// (`attend::dot16`).
    fn dot16(self, a: &[f32], b: &[f32]) -> f32;
    /// Attention heads sharing their keys: each head's out = softmax-weighted sum of `keys`
    /// (`attend::attend`); q, out [h, d], sinks [h].
    fn attend(self, q: &[f32], keys: &[&[f32]], scale: f32, sinks: &[f32], out: &mut [f32]);
    /// The register-only multiply-add loop of `fma_probe`; returns a value to keep it alive.
    fn fma_loop(self, iters: usize) -> f32;
    /// Benchmark support: a register-only multiply-add loop of `iters` rounds; returns (a
    /// value to keep it alive, f32 flops performed).
    fn fma_probe(self, iters: usize) -> (f32, u64) {
        let flops = iters * Self::CHAINS * Self::LANES * 2;
        (self.fma_loop(iters), flops as u64)
    }
}

/// Implements `Kernel` for a `Simd` tier, whose target features (if any) are `$feat`:
/// `simd_kernel!(Avx2, "avx2,fma,f16c")`. Each method enters a function compiled with those
/// features, in which the generic loop and the tier's operations inline (`entry!`); the
/// loops' register tiles are the tier's constants (`Simd::ROWS_XT` and the ones after it).
///
/// `dot16`'s function goes in a module of its own (`$lanes`, `lanes16` unless named: a file
/// with two tiers names them apart). In the tier's module, its code changed LLVM's register
/// allocation of the tier's other loops in the release build (measured: 8 more register
/// moves per step of the AVX-512 one-token FP4 loop); in a module of its own, the other loops
/// compile as they did without it.
macro_rules! simd_kernel {
    ($tier:ty $(, $feat:literal)?) => {
        $crate::kernels::generic::simd_kernel!($tier, lanes16 $(, $feat)?);
    };
    ($tier:ty, $lanes:ident $(, $feat:literal)?) => {
        impl $crate::kernels::generic::Kernel for $tier {
            fn dot_xt(
                self,
                w: &$crate::kernels::rows::RowsView,
                x: $crate::kernels::generic::Tokens,
                out: (&mut [f32], usize),
            ) {
                use $crate::kernels::generic::{dot_xt, Simd};
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    w: &$crate::kernels::rows::RowsView,
                    (xp, xs, n): $crate::kernels::generic::Tokens,
                    out: (&mut [f32], usize),
                ) {
                    const R: [usize; 4] = <$tier as Simd>::ROWS_XT;
                    match n {
                        1 => dot_xt::<_, { R[0] }, 1>(s, w, (xp, xs), out),
                        2 => dot_xt::<_, { R[1] }, 2>(s, w, (xp, xs), out),
                        3 => dot_xt::<_, { R[2] }, 3>(s, w, (xp, xs), out),
                        _ => dot_xt::<_, { R[3] }, 4>(s, w, (xp, xs), out),
                    }
                }
                /// One FP4 token, in its own function: compiled inside `go`, beside the
                /// other formats' passes, the same loop ran slower (AVX2 on Zen 4: 9.2
                /// against 11.2 GB/s).
                ///
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go_fp4(
                    s: $tier,
                    w: &$crate::kernels::rows::RowsView,
                    (xp, xs): (&[f32], usize),
                    out: (&mut [f32], usize),
                ) {
                    dot_xt::<_, { <$tier as Simd>::FP4_ROWS_X1 }, 1>(s, w, (xp, xs), out)
                }
                assert!((1..=4).contains(&x.2), "dot_xt takes 1 to 4 tokens");
                // SAFETY: `self` exists only once the CPU was found to have the features
                // `go` and `go_fp4` enable (`Simd`).
                unsafe {
                    if x.2 == 1 && matches!(w.rows, $crate::kernels::rows::Rows::Fp4 { .. }) {
                        go_fp4(self, w, (x.0, x.1), out)
                    } else {
                        go(self, w, x, out)
                    }
                }
            }

            fn gemm(
                self,
                w: &$crate::kernels::rows::RowsView,
                x: $crate::kernels::generic::Tokens,
                out: &mut [f32],
                accs: &mut [f32],
                pbuf: &mut [f32],
            ) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    w: &$crate::kernels::rows::RowsView,
                    x: $crate::kernels::generic::Tokens,
                    (out, accs, pbuf): (&mut [f32], &mut [f32], &mut [f32]),
                ) {
                    const T: (usize, usize) = <$tier as $crate::kernels::generic::Simd>::GEMM_TILE;
                    $crate::kernels::generic::gemm::<_, { T.0 }, { T.1 }>(s, w, x, out, accs, pbuf)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, w, x, (out, accs, pbuf)) }
            }

            fn gemm_q8(
                self,
                w: $crate::kernels::generic::Int8,
                nrows: usize,
                cols: usize,
                x: $crate::kernels::generic::Int8,
                n: usize,
                out: &mut [f32],
                accs: &mut [f32],
            ) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    w: $crate::kernels::generic::Int8,
                    (nrows, cols): (usize, usize),
                    x: $crate::kernels::generic::Int8,
                    (n, out, accs): (usize, &mut [f32], &mut [f32]),
                ) {
                    const R: usize = <$tier as $crate::kernels::generic::Simd>::Q8_ROWS;
                    $crate::kernels::generic::gemm_q8::<_, { R }>(s, w, nrows, cols, x, n, out, accs)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, w, (nrows, cols), x, (n, out, accs)) }
            }

            fn attend(self, q: &[f32], keys: &[&[f32]], scale: f32, sinks: &[f32], out: &mut [f32]) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    q: &[f32],
                    keys: &[&[f32]],
                    (scale, sinks): (f32, &[f32]),
                    out: &mut [f32],
                ) {
                    $crate::kernels::generic::attend(s, q, keys, (scale, sinks), out)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, q, keys, (scale, sinks), out) }
            }

            $crate::kernels::generic::entry!([$($feat)?] $tier, s,
                fn dot_q8_x1(w: &$crate::kernels::rows::RowsView, xq: &[i8], xd: &[f32],
                    out: &mut [f32]) {
                    const R: usize = <$tier as $crate::kernels::generic::Simd>::ROWS_XT[0];
                    $crate::kernels::generic::dot_q8_x1::<_, { R }>(s, w, xq, xd, out)
                });
            $crate::kernels::generic::entry!([$($feat)?] $tier, s,
                fn decode_q8(w: &$crate::kernels::rows::RowsView, wq: &mut [i8], ws: &mut [f32]) {
                    $crate::kernels::generic::decode_q8(s, w, wq, ws)
                });
            $crate::kernels::generic::entry!([$($feat)?] $tier, s,
                fn dot(a: &[f32], b: &[f32]) -> f32 {
                    $crate::kernels::generic::dot(s, a, b)
                });
            fn dot16(self, a: &[f32], b: &[f32]) -> f32 {
                // SAFETY: `self` exists only once the CPU was found to have the features `go`
                // enables (`Simd`).
                unsafe { $lanes::go(self, a, b) }
            }
            $crate::kernels::generic::entry!([$($feat)?] $tier, s,
                fn fma_loop(iters: usize) -> f32 {
                    const C: usize = <$tier as $crate::kernels::generic::Simd>::CHAINS;
                    $crate::kernels::generic::fma_probe::<_, { C }>(s, iters)
                });
        }

        mod $lanes {
            #[allow(unused_imports)]
            use super::*;

            /// `Kernel::dot16`'s loop, compiled with the tier's features.
            ///
            /// # Safety
            /// The CPU must have the enabled features.
            $(#[target_feature(enable = $feat)])?
            pub(super) unsafe fn go(s: $tier, a: &[f32], b: &[f32]) -> f32 {
                $crate::kernels::generic::dot16(s, a, b)
            }
        }
    };
}
pub(crate) use simd_kernel;

/// One method of `simd_kernel!`: `fn $name(self, args) -> ret` calls `go`, which evaluates
/// `$body` with the tier's value bound to `$s`, compiled with the tier's features `$feat` (if
/// any), so that the loop and the tier's `Simd` operations inline into it.
macro_rules! entry {
    ([$($feat:literal)?] $tier:ty, $s:ident,
     fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? $body:block) => {
        fn $name(self, $($a: $t),*) $(-> $r)? {
            /// # Safety
            /// The CPU must have the enabled features.
            $(#[target_feature(enable = $feat)])?
            unsafe fn go($s: $tier, $($a: $t),*) $(-> $r)? $body
            // SAFETY: `self` exists only once the CPU was found to have the features `go`
            // enables (`Simd`).
            unsafe { go(self, $($a),*) }
        }
    };
}
pub(crate) use entry;
