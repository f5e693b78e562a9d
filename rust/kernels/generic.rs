//! The kernel loops, written once for every tier over the `Simd` vector operations.
//!
//! A tier supplies only its intrinsics: a zero-sized proof type (created by the tier's
//! `detect`, so holding one means the CPU has the features) implements `Simd`, and
//! `simd_kernel!` (invoked where `RowsView` is in scope) turns it into a `Kernel` whose
//! methods each enter one `#[target_feature]` function. The loops here and the tier's
//! operations are all `#[inline(always)]`, so they inline into that function and are
//! compiled for the tier's features (memchr's `arch/generic` + `Vector` pattern). Nothing
//! here is specific to an architecture.
//!
//! Column layout (`L` = `Simd::LANES`, a power of two dividing 32):
//! - F32 / BF16 / FP8: chunk c holds columns cL..cL + L; the last one is zero padded.
//! - FP4: group g holds columns gG..gG + G (G = `Simd::FP4_GROUP`, 2L or 32) as G / L
//!   chunks in the tier's column order (`Simd::fp4_col`; `prep_x` lays x out the same way).
//!   The default order is [L even columns, L odd columns], i.e. the low then the high
//!   nibbles of the group's L packed bytes. A group lies inside one 32-column scale block.
//!
//! No closure may call a `Simd` method: a closure is a function of its own, compiled without
//! the tier's features, so the intrinsics in it would not inline (`acc.map(|a| s.hsum(a))`
//! cost the AVX-512 one-token path ~20 %). `nm` on a release build must show no
//! `core_arch` symbols.
//!
//! Every (row, token) output is one FMA chain over the chunks in order followed by
//! `Simd::hsum`, in the fused path for few tokens (`rows_xt`) and in the prefill path
//! (`decode_panel` + `gemm`), as `driver` requires.

use super::driver::{Rows, RowsView};
use crate::dtype::e8m0_to_f32;

/// One tier's vector operations on `V` (L f32 lanes). Implemented by the tier's proof
/// type: holding `self` means the CPU runs the tier, so only the raw-pointer operations are
/// `unsafe` (for the pointer).
pub(crate) trait Simd: Copy {
    type V: Copy;
    const LANES: usize;
    fn splat(self, x: f32) -> Self::V;
    /// # Safety
    /// `p` is valid for reading L f32 (any alignment).
    unsafe fn load(self, p: *const f32) -> Self::V;
    /// # Safety
    /// `p` is valid for writing L f32 (any alignment).
    unsafe fn store(self, p: *mut f32, v: Self::V);
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// a * b + c (fused where the tier has FMA).
    fn fma(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Sum of the lanes in a fixed tree: lane i += lane i + h for h = L/2, L/4, .., 1.
    fn hsum(self, v: Self::V) -> f32;
    /// L bytes of e4m3 as e4m3 / 256 (through f16: 0x7F / 0xFF give ±480 / 256).
    ///
    /// # Safety
    /// `p` is valid for reading L bytes.
    unsafe fn fp8(self, p: *const u8) -> Self::V;
    /// Whether the tier's `fp8_pair` decodes in one pass (then the one-token FP8 loop steps
    /// two chunks at a time; otherwise one, as the portable loops vectorise best).
    const FP8_PAIR: bool = false;
    /// 2L bytes of e4m3: `(fp8(p), fp8(p + L))`, which a tier may decode in one pass.
    ///
    /// # Safety
    /// `p` is valid for reading 2L bytes.
    #[inline(always)]
    unsafe fn fp8_pair(self, p: *const u8) -> (Self::V, Self::V) {
        // SAFETY: the caller's contract covers both halves.
        unsafe { (self.fp8(p), self.fp8(p.add(Self::LANES))) }
    }
    /// Whether the fused path's FP4 passes over 2 or more rows go chunk by chunk: every
    /// row's group decoded first, then each chunk of the T tokens' x loaded once and
    /// multiplied into all the rows before the next chunk is loaded. Otherwise a group's x
    /// is loaded into registers for all its chunks before the rows are decoded one by one
    /// (with 16 registers that does not fit beside the accumulators and a decoded group
    /// from 2 tokens on, and the compiler spills to the stack). Every (row, token) chain is
    /// the same either way (chunks in order): only the speed differs.
    const FP4_X_BY_CHUNK: bool = false;
    /// Columns per panel of the prefill path (`gemm`, a multiple of 32): the rows of a group
    /// are decoded into `pbuf` for this many columns, every token tile passes over them, and
    /// the register tile's accumulators go to memory and back once per panel. The default,
    /// 512 (GROUP rows of f32 = 32 KiB), keeps the panel in L1; a tier on which a panel in
    /// L2 with fewer accumulator round trips is faster sets more (measured).
    const GEMM_PANEL: usize = 512;
    /// Whether the one-token and fused FP8 loops take the weights as their bits
    /// (`fp8_bits`) when the driver could scale x by 2^112 (`driver::scale_x`): set by the
    /// tiers on which that decode is the faster one (measured).
    const FP8_BITS: bool = false;
    /// Whether this CPU takes the `fp8_bits` route where the tier has one (`FP8_BITS`): a
    /// tier may decide per CPU (`x86::fp8_bits`).
    fn fp8_bits_on(self) -> bool {
        Self::FP8_BITS
    }
    /// L bytes of e4m3 as e4m3 * 2^-120: each byte's sign, exponent and mantissa bits put in
    /// place in an f32 (exponent field = the e4m3 exponent field, so subnormal e4m3 values
    /// become subnormal f32s, exactly). The default goes through `fp8`, exactly (a product
    /// with a power of two whose result, at least 2^-129, f32 holds); a tier overrides it
    /// with integer shifts, no conversion instruction.
    ///
    /// # Safety
    /// `p` is valid for reading L bytes.
    #[inline(always)]
    unsafe fn fp8_bits(self, p: *const u8) -> Self::V {
        // SAFETY: the caller's contract.
        let w = unsafe { self.fp8(p) };
        self.mul(w, self.splat(FP8_BITS_FROM_F16))
    }
    /// 2L bytes of e4m3: `(fp8_bits(p), fp8_bits(p + L))`.
    ///
    /// # Safety
    /// `p` is valid for reading 2L bytes.
    #[inline(always)]
    unsafe fn fp8_bits_pair(self, p: *const u8) -> (Self::V, Self::V) {
        // SAFETY: the caller's contract covers both halves.
        unsafe { (self.fp8_bits(p), self.fp8_bits(p.add(Self::LANES))) }
    }
    /// `fp8_steps`' paired one-token chunks over R rows as the tier's own loop, where it has
    /// one for R rows (`acc`: the R rows' accumulators): for each pair of chunks in order,
    /// acc[k] = fma(w1, x1, fma(w0, x0, acc[k])) with the weights as their bits
    /// (`fp8_bits_pair`), so the same bits as the compiled steps. Returns how many chunks
    /// it did (2 x `p.pairs`, or 0 without a loop; the default).
    ///
    /// # Safety
    /// `p` holds what `Fp8Loop` says for R rows, and `acc.len()` = R.
    #[inline(always)]
    unsafe fn fp8_bits_loop(self, r: usize, p: Fp8Loop, acc: &mut [Self::V]) -> usize {
        let _ = (r, p, acc);
        0
    }
    /// 2L bytes of little-endian bf16.
    ///
    /// # Safety
    /// `p` is valid for reading 2L bytes.
    unsafe fn bf16(self, p: *const u8) -> Self::V;
    /// A hint to bring the cache line at `p` into the cache; it never changes a result. Any
    /// address is allowed (callers form it with `wrapping_add`, possibly past the end of a
    /// buffer): a prefetch reads nothing architecturally and never faults. The default does
    /// nothing (tiers whose speed is not measured keep it).
    #[inline(always)]
    fn prefetch(self, p: *const u8) {
        let _ = p;
    }
    /// Whether `gemm` reads the next token tile's x into L1 while it computes the current
    /// tile (`prefetch_x`). A per-CPU rule of the tier; the default is off.
    #[inline(always)]
    fn gemm_x_ahead(self) -> bool {
        false
    }
    /// A hint to bring the cache line at `p` into L1, as `prefetch` (any address, never a
    /// different result); used for x in `gemm` where `gemm_x_ahead` says so.
    #[inline(always)]
    fn prefetch_x(self, p: *const u8) {
        let _ = p;
    }
    /// The E2M1 values in the form `fp4` looks them up in (before scaling).
    fn fp4_table(self) -> Self::V;
    /// Columns of one FP4 group, the unit `fp4` decodes: 2L (the default) or 32 (one
    /// whole scale block). G / L is 2 or 4.
    const FP4_GROUP: usize = 2 * Self::LANES;
    /// Tokens per pass of the fused path for FP4 (1 to 4; see `driver::matmul`). Every
    /// (row, token) result is the same whatever the pass, so this only sets the speed.
    const FP4_PASS: usize = 4;
    /// Most tokens for which FP4 rows take the fused path (passes of `FP4_PASS`) rather than
    /// the panel path: 8 (the driver's limit for every format) unless a tier measured its
    /// passes faster further (at most 16). Every (row, token) result is the same on either
    /// path, so this only sets the speed.
    const FP4_FUSED_MAX: usize = 8;
    /// The column (0..G, within its group) that lane k % L of chunk k / L of a decoded FP4
    /// group holds. The default: [L even columns, L odd columns].
    #[inline(always)]
    fn fp4_col(k: usize) -> usize {
        2 * (k % Self::LANES) + k / Self::LANES
    }
    /// The table `fp4` takes for a block whose UE8M0 scale byte is `b`: `fp4_table` times
    /// 2^(b - 127), in the form the tier's `fp4` expects (a tier may store it transformed).
    #[inline(always)]
    fn fp4_scaled_table(self, b: u8) -> Self::V {
        self.mul(self.fp4_table(), self.splat(e8m0_to_f32(b)))
    }
    /// One FP4 group (G / 2 packed e2m1 bytes at p) as its G / L chunks in the tier's
    /// column order (`fp4_col`), values of `t` (`fp4_scaled_table` of the block's scale).
    /// Entries past G / L are unused (a 2-chunk tier repeats its pair).
    ///
    /// # Safety
    /// `p` is valid for reading G / 2 bytes.
    unsafe fn fp4(self, p: *const u8, t: &Self::V) -> [Self::V; 4];
    /// `rows_xt`'s whole FP4 pass over R rows and T tokens (`acc`: R x T vectors, row by
    /// row) as the tier's own loop, where it has one for that shape: the same FMAs as
    /// `rows_xt`'s chunk-by-chunk path, in the same order per (row, token), so the same
    /// bits. Returns whether it ran; the default has no loops.
    ///
    /// # Safety
    /// `p` holds what `Fp4Loop` says for R rows and T tokens, with 32-column groups
    /// (`FP4_GROUP` = 32), and `acc.len()` = R x T.
    #[inline(always)]
    unsafe fn fp4_loop(self, r: usize, p: Fp4Loop<Self::V>, acc: &mut [Self::V]) -> bool {
        let _ = (r, p, acc);
        false
    }

    // ---- fast numerics (int8 activations; see `quant`) ----
    //
    // The defaults are scalar; a tier overrides them with its integer instructions. Every
    // override must give lanes with the same *sum* as the default (the dot is an exact
    // integer, |dot| <= 32 * 127 * 127 < 2^24, so any lane split is exact in f32); the
    // lanes themselves are the tier's own.

    /// A vector with `x` in lane 0 and zeros elsewhere.
    fn lane0(self, x: f32) -> Self::V;

    /// The dot product of 32 int8 weights and 32 int8 activations (every value in
    /// -127..=127) as lanes of V whose sum is the exact integer dot.
    ///
    /// # Safety
    /// `w` and `x` are valid for reading 32 bytes.
    #[inline(always)]
    unsafe fn dot_i8(self, w: *const i8, x: *const i8) -> Self::V {
        // SAFETY: the caller's contract.
        let (w, x) = unsafe { (&*w.cast::<[i8; 32]>(), &*x.cast::<[i8; 32]>()) };
        let mut d = 0i32;
        for i in 0..32 {
            d += w[i] as i32 * x[i] as i32;
        }
        self.lane0(d as f32)
    }

    /// 16 packed e2m1 bytes (one 32-column FP4 block, low nibble = even column) as 32 int8
    /// weights `2 * E2M1` in the block's fast-numerics order: the 16 low nibbles, then the
    /// 16 high nibbles (`quant::I8_OF_E2M1`).
    ///
    /// # Safety
    /// `p` is valid for reading 16 bytes and `out` for writing 32.
    #[inline(always)]
    unsafe fn fp4_i8(self, p: *const u8, out: *mut i8) {
        // SAFETY: the caller's contract.
        let (p, out) = unsafe { (&*p.cast::<[u8; 16]>(), &mut *out.cast::<[i8; 32]>()) };
        for i in 0..16 {
            out[i] = super::quant::I8_OF_E2M1[(p[i] & 15) as usize];
            out[16 + i] = super::quant::I8_OF_E2M1[(p[i] >> 4) as usize];
        }
    }

    /// `dot_i8(fp4_i8(p), x)`, fused: the same lanes as that pair of calls.
    ///
    /// # Safety
    /// `p` is valid for reading 16 bytes and `x` for reading 32.
    #[inline(always)]
    unsafe fn dot_fp4_i8(self, p: *const u8, x: *const i8) -> Self::V {
        let mut w = [0i8; 32];
        // SAFETY: the caller's contract; `w` holds 32 bytes.
        unsafe {
            self.fp4_i8(p, w.as_mut_ptr());
            self.dot_i8(w.as_ptr(), x)
        }
    }
}

/// Implements `Kernel` for a `Simd` tier. Each method enters a function compiled with the
/// tier's features (if any), in which the generic loop below and the tier's operations
/// inline. `rows_xt`: rows per fused pass of 1, 2, 3 and 4 tokens (they share each x load);
/// `fp4_rows_x1`: the one-token pass's rows for FP4 (`rows_xt[0]` is for the other formats
/// and the int8 path); `gemm_rows`: rows of the prefill micro-kernel (x `gemm_tokens`
/// tokens); `q8_rows`: the same for the int8 path; `chains`: independent FMA chains of the
/// peak probe.
macro_rules! simd_kernel {
    ($tier:ty, $(features = $feat:literal,)? rows_xt = $r1:expr, fp4_rows_x1 = $f1:literal,
     gemm_rows = $rg:literal, gemm_tokens = $tg:literal, q8_rows = $rq:literal,
     chains = $ch:literal) => {
        impl $crate::kernels::driver::Kernel for $tier {
            const LANES: usize = <$tier as $crate::kernels::generic::Simd>::LANES;
            const FP4_GROUP: usize = <$tier as $crate::kernels::generic::Simd>::FP4_GROUP;
            const FP4_PASS: usize = <$tier as $crate::kernels::generic::Simd>::FP4_PASS;
            const FP4_FUSED_MAX: usize =
                <$tier as $crate::kernels::generic::Simd>::FP4_FUSED_MAX;
            const GEMM_PANEL: usize = <$tier as $crate::kernels::generic::Simd>::GEMM_PANEL;

            fn fp4_col(k: usize) -> usize {
                <$tier as $crate::kernels::generic::Simd>::fp4_col(k)
            }

            fn fp8_bits(self) -> bool {
                <$tier as $crate::kernels::generic::Simd>::FP8_BITS
                    && <$tier as $crate::kernels::generic::Simd>::fp8_bits_on(self)
            }

            fn dot_xt(self, w: &RowsView, x: (&[f32], usize, usize), out: (&mut [f32], usize)) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    w: &RowsView,
                    (xp, xs, n): (&[f32], usize, usize),
                    out: (&mut [f32], usize),
                ) {
                    use $crate::kernels::generic::dot_xt;
                    match n {
                        1 => dot_xt::<_, { $r1[0] }, 1>(s, w, (xp, xs), out),
                        2 => dot_xt::<_, { $r1[1] }, 2>(s, w, (xp, xs), out),
                        3 => dot_xt::<_, { $r1[2] }, 3>(s, w, (xp, xs), out),
                        _ => dot_xt::<_, { $r1[3] }, 4>(s, w, (xp, xs), out),
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
                    w: &RowsView,
                    (xp, xs): (&[f32], usize),
                    out: (&mut [f32], usize),
                ) {
                    $crate::kernels::generic::dot_xt::<_, $f1, 1>(s, w, (xp, xs), out)
                }
                assert!((1..=4).contains(&x.2), "dot_xt takes 1 to 4 tokens");
                // SAFETY: `self` exists only once the CPU was found to have the features
                // `go` and `go_fp4` enable.
                unsafe {
                    if x.2 == 1 && matches!(w.rows, $crate::kernels::driver::Rows::Fp4 { .. }) {
                        go_fp4(self, w, (x.0, x.1), out)
                    } else {
                        go(self, w, x, out)
                    }
                }
            }

            fn gemm(
                self,
                w: &RowsView,
                x: (&[f32], usize, usize),
                out: &mut [f32],
                accs: &mut [f32],
                pbuf: &mut [f32],
            ) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    w: &RowsView,
                    x: (&[f32], usize, usize),
                    (out, accs, pbuf): (&mut [f32], &mut [f32], &mut [f32]),
                ) {
                    $crate::kernels::generic::gemm::<_, $rg, $tg>(s, w, x, out, accs, pbuf)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, w, x, (out, accs, pbuf)) }
            }

            fn dot_q8_x1(self, w: &RowsView, xq: &[i8], xd: &[f32], out: &mut [f32]) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(s: $tier, w: &RowsView, xq: &[i8], xd: &[f32], out: &mut [f32]) {
                    $crate::kernels::generic::dot_q8_x1::<_, { $r1[0] }>(s, w, xq, xd, out)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, w, xq, xd, out) }
            }

            fn decode_q8(self, w: &RowsView, wq: &mut [i8], ws: &mut [f32]) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(s: $tier, w: &RowsView, wq: &mut [i8], ws: &mut [f32]) {
                    $crate::kernels::generic::decode_q8(s, w, wq, ws)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, w, wq, ws) }
            }

            fn gemm_q8(
                self,
                w: (&[i8], &[f32]),
                nrows: usize,
                cols: usize,
                x: (&[i8], &[f32]),
                n: usize,
                out: &mut [f32],
                accs: &mut [f32],
            ) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(
                    s: $tier,
                    w: (&[i8], &[f32]),
                    (nrows, cols): (usize, usize),
                    x: (&[i8], &[f32]),
                    (n, out, accs): (usize, &mut [f32], &mut [f32]),
                ) {
                    $crate::kernels::generic::gemm_q8::<_, $rq>(
                        s, w, nrows, cols, x, n, out, accs,
                    )
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, w, (nrows, cols), x, (n, out, accs)) }
            }

            fn dot(self, a: &[f32], b: &[f32]) -> f32 {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(s: $tier, a: &[f32], b: &[f32]) -> f32 {
                    $crate::kernels::generic::dot(s, a, b)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, a, b) }
            }

            fn attend(
                self,
                q: &[f32],
                keys: &[&[f32]],
                scale: f32,
                sinks: &[f32],
                out: &mut [f32],
            ) {
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
                    $crate::kernels::generic::attend(s, q, keys, scale, sinks, out)
                }
                // SAFETY: as in `dot_xt`.
                unsafe { go(self, q, keys, (scale, sinks), out) }
            }

            fn fma_probe(self, iters: usize) -> (f32, u64) {
                /// # Safety
                /// The CPU must have the enabled features.
                $(#[target_feature(enable = $feat)])?
                unsafe fn go(s: $tier, iters: usize) -> f32 {
                    $crate::kernels::generic::fma_probe::<_, $ch>(s, iters)
                }
                let flops = iters * $ch * <Self as $crate::kernels::driver::Kernel>::LANES * 2;
                // SAFETY: as in `dot_xt`.
                (unsafe { go(self, iters) }, flops as u64)
            }
        }
    };
}
pub(crate) use simd_kernel;

/// v[i..i + L] as a vector.
#[inline(always)]
fn ld<S: Simd>(s: S, v: &[f32], i: usize) -> S::V {
    let v = &v[i..i + S::LANES];
    // SAFETY: `v` holds L f32.
    unsafe { s.load(v.as_ptr()) }
}

/// v[i..i + L] = a.
#[inline(always)]
fn st<S: Simd>(s: S, v: &mut [f32], i: usize, a: S::V) {
    let v = &mut v[i..i + S::LANES];
    // SAFETY: `v` holds L f32.
    unsafe { s.store(v.as_mut_ptr(), a) }
}

/// Room for the zero-padded last chunk of a row (L <= 16).
const TAIL: usize = 32;

/// `Simd::fp8` gives e4m3 / 2^8 and `Simd::fp8_bits` e4m3 / 2^120: the ratio.
const FP8_BITS_FROM_F16: f32 = 1.0 / (1u128 << 112) as f32;

/// How `chunk` decodes an FP8 chunk: times its block scale (the panel path), unscaled
/// (`Simd::fp8`: the fused path, whose x holds the block scales), or as its bits
/// (`Simd::fp8_bits`: the fused path whose x holds the block scales times 2^112).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fp8As {
    Scaled,
    Unscaled,
    Bits,
}

/// Chunk c of row r (of `cols` columns), decoded; the last one zero padded. Not FP4. FP8
/// as `fp8` says (see `Fp8As`).
#[inline(always)]
fn chunk<S: Simd>(s: S, rows: Rows, r: usize, cols: usize, c: usize, fp8: Fp8As) -> S::V {
    let l = S::LANES;
    let j = c * l;
    let n = l.min(cols - j);
    match rows {
        Rows::F32(d) => {
            let row = &d[r * cols..(r + 1) * cols];
            if n == l {
                ld(s, row, j)
            } else {
                let mut b = [0f32; TAIL];
                b[..n].copy_from_slice(&row[j..]);
                ld(s, &b, 0)
            }
        }
        Rows::Bf16(d) => {
            let row = &d[r * cols * 2..(r + 1) * cols * 2];
            let mut b = [0u8; 2 * TAIL];
            let v = if n == l {
                &row[2 * j..2 * j + 2 * l]
            } else {
                b[..2 * n].copy_from_slice(&row[2 * j..]);
                &b[..2 * l]
            };
            // SAFETY: `v` holds 2L bytes.
            unsafe { s.bf16(v.as_ptr()) }
        }
        Rows::Fp8 { q, scale } => {
            let row = &q[r * cols..(r + 1) * cols];
            let mut b = [0u8; TAIL];
            let v = if n == l {
                &row[j..j + l]
            } else {
                b[..n].copy_from_slice(&row[j..]);
                &b[..l]
            };
            // SAFETY: `v` holds L bytes.
            let w = unsafe {
                match fp8 {
                    Fp8As::Bits => s.fp8_bits(v.as_ptr()),
                    Fp8As::Scaled | Fp8As::Unscaled => s.fp8(v.as_ptr()),
                }
            };
            match fp8 {
                Fp8As::Scaled => s.mul(w, s.splat(e8m0_to_f32(scale[j / 128]))),
                // the fused path: the driver put the block scales in x (times 2^112 for
                // `Bits`)
                Fp8As::Unscaled | Fp8As::Bits => w,
            }
        }
        Rows::Fp4 { .. } => unreachable!("fp4 is decoded in pairs"),
    }
}

/// FP4 group g of row r (columns gG..gG + G, G = `Simd::FP4_GROUP`): its G / L chunks,
/// scaled (see `Simd::fp4`).
#[inline(always)]
fn fp4_group<S: Simd>(s: S, q: &[u8], scale: &[u8], r: usize, cols: usize, g: usize) -> [S::V; 4] {
    const { assert!(S::FP4_GROUP == 2 * S::LANES || S::FP4_GROUP == 32) };
    let gs = S::FP4_GROUP;
    let t = s.fp4_scaled_table(scale[(r * cols + g * gs) / 32]);
    let b = &q[(r * cols + g * gs) / 2..][..gs / 2];
    // SAFETY: `b` holds G / 2 bytes.
    unsafe { s.fp4(b.as_ptr(), &t) }
}

/// Step `i` over the current R-row block of the one-token path, which reads `step` bytes
/// of the block per step (R rows times each row's bytes per step): prefetches the same
/// share of the next block, bytes i * step..(i + 1) * step from `next` (the rows that
/// follow, contiguous in the checkpoint layout, the same size), so the next block arrives
/// as one stream while this one is computed. Measured on Zen 5: with short rows (1-8 KiB)
/// the hardware prefetchers stop at each row's end, so without this every block of R row
/// streams waits on DRAM at its start (FP4 4096x4096 decode: 34 -> 72 % of the streaming
/// read on 2 threads, with 8 rows). Past the last block it prefetches the next task's
/// rows, or nothing useful: harmless (see `Simd::prefetch`). No division: this runs in the
/// inner loop.
#[inline(always)]
pub(crate) fn prefetch_next<S: Simd>(s: S, next: *const u8, step: usize, i: usize) {
    let mut o = (i * step).next_multiple_of(64);
    let end = (i + 1) * step;
    while o < end {
        s.prefetch(next.wrapping_add(o));
        o += 64;
    }
}

/// The T tokens' chunks at column `off` (tokens `xs` apart from `xp`).
///
/// # Safety
/// `xp` is valid for reading (T - 1) xs + off + L f32.
#[inline(always)]
unsafe fn x_chunks<S: Simd, const T: usize>(
    s: S,
    xp: *const f32,
    xs: usize,
    off: usize,
) -> [S::V; T] {
    let mut v = [s.splat(0.0); T];
    for t in 0..T {
        // SAFETY: the caller's contract.
        v[t] = unsafe { s.load(xp.add(t * xs + off)) };
    }
    v
}

/// acc[t] = fma(w, x[t], acc[t]) for each of the T tokens.
#[inline(always)]
fn fma_tokens<S: Simd, const T: usize>(s: S, w: S::V, x: &[S::V; T], acc: &mut [S::V; T]) {
    for t in 0..T {
        acc[t] = s.fma(w, x[t], acc[t]);
    }
}

/// The FP8 part of `rows_xt`: the R rows at `qp` (`cols` bytes apart) times the T tokens
/// over chunks 0..full, into `acc`. The block scales are in x already (`driver::scale_x`),
/// times 2^112 with `BITS` (then the weights enter as their bits: the same products). Two
/// chunks per step where the tier pairs them (`fp8_pair`; always with `BITS`), each row's
/// FMAs still in chunk order.
///
/// # Safety
/// `qp` is valid for reading R rows of `cols` bytes, and `xpp` for reading chunks 0..full of
/// T tokens `xs` apart.
#[inline(always)]
unsafe fn fp8_steps<S: Simd, const R: usize, const T: usize, const BITS: bool>(
    s: S,
    qp: *const u8,
    cols: usize,
    (xpp, xs): (*const f32, usize),
    full: usize,
    acc: &mut [[S::V; T]; R],
) {
    let l = S::LANES;
    let mut c = 0;
    if BITS && T == 1 && full >= 2 {
        let p = Fp8Loop {
            q: qp,
            cols,
            x: xpp,
            pairs: full / 2,
        };
        // SAFETY: R rows of `cols` bytes at qp and the token's first `full` chunks at xpp
        // (the contract); acc holds R x 1 accumulators.
        c = unsafe { s.fp8_bits_loop(R, p, acc.as_flattened_mut()) };
    }
    while (BITS || S::FP8_PAIR) && c + 2 <= full {
        prefetch_next(s, qp.wrapping_add(R * cols), 2 * R * l, c / 2);
        // SAFETY: (c + 2) L <= full L, inside every token's row (the contract).
        let (x0, x1) = unsafe {
            (
                x_chunks::<S, T>(s, xpp, xs, c * l),
                x_chunks::<S, T>(s, xpp, xs, (c + 1) * l),
            )
        };
        for k in 0..R {
            // SAFETY: row k's 2L bytes from cL lie inside the row (the contract).
            let (w0, w1) = unsafe {
                let p = qp.add(k * cols + c * l);
                if BITS {
                    s.fp8_bits_pair(p)
                } else {
                    s.fp8_pair(p)
                }
            };
            fma_tokens(s, w0, &x0, &mut acc[k]);
            fma_tokens(s, w1, &x1, &mut acc[k]);
        }
        c += 2;
    }
    while c < full {
        prefetch_next(s, qp.wrapping_add(R * cols), R * l, c);
        // SAFETY: as above, for one chunk.
        let xv = unsafe { x_chunks::<S, T>(s, xpp, xs, c * l) };
        for k in 0..R {
            // SAFETY: as above, for one chunk.
            let wv = unsafe {
                let p = qp.add(k * cols + c * l);
                if BITS {
                    s.fp8_bits(p)
                } else {
                    s.fp8(p)
                }
            };
            fma_tokens(s, wv, &xv, &mut acc[k]);
        }
        c += 1;
    }
}

/// The paired one-token FP8 steps of `fp8_steps` as raw pointers, for a tier's own loop
/// (`Simd::fp8_bits_loop`): for every row k < R, the first 2 L `pairs` bytes at `q` + k
/// `cols` are readable, and so are the first 2 L `pairs` f32 at `x`.
#[derive(Clone, Copy)]
// only the AVX2 tier has such a loop (`x86::fp8_loops`)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Fp8Loop {
    /// row 0's first e4m3 byte
    pub q: *const u8,
    /// bytes (columns) from one row to the next
    pub cols: usize,
    /// the token's activations (f32, block scales times 2^112 in them: `driver::scale_x`)
    pub x: *const f32,
    /// pairs of L-column chunks per row
    pub pairs: usize,
}

/// A whole FP4 pass of `rows_xt` as raw pointers, for a tier's own loop
/// (`Simd::fp4_loop`): for every group g < `groups` and row k < R, the 16 packed bytes at
/// `q` + k `rb` + 16 g, the scale byte at `scale` + k `nb` + g and its table in `tables`
/// are readable, and so are the 32 f32 at `x` + t `xs` + 32 g for every token t < T.
#[derive(Clone, Copy)]
// only the AVX2 tier has such loops (`x86::fp4_loops`)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Fp4Loop<V> {
    /// row 0's first packed byte (2 E2M1 values a byte)
    pub q: *const u8,
    /// bytes from one row to the next (cols / 2)
    pub rb: usize,
    /// row 0's first UE8M0 scale byte (one per 32 columns)
    pub scale: *const u8,
    /// scale bytes from one row to the next (cols / 32)
    pub nb: usize,
    /// `Simd::fp4_scaled_table` of every scale byte
    pub tables: *const [V; 256],
    /// token 0's activations (f32)
    pub x: *const f32,
    /// f32 from one token to the next
    pub xs: usize,
    /// 32-column groups per row
    pub groups: usize,
}

/// R rows from r0 times T tokens (xp holds them `xs` apart): acc[k][t] = fma(w[k][c],
/// xp[t][c], acc[k][t]) over chunks in order, each weight chunk decoded once for the T
/// tokens. With T = 1 this is the one-token path; every (row, token) chain is the same
/// whatever T. The full chunks run on raw pointers (bounds checked once up front); the last
/// partial chunk goes through `chunk`, which decodes exactly like `decode_panel`.
/// `tables[b]`: the FP4 table times the value of scale byte b (see `dot_xt`). An FP4 pass
/// runs as the tier's own loop where it has one for R x T (`Simd::fp4_loop`).
#[inline(always)]
fn rows_xt<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: &RowsView,
    r0: usize,
    (xp, xs): (&[f32], usize),
    tables: &[S::V; 256],
) -> [[f32; T]; R] {
    let (l, cols) = (S::LANES, w.cols);
    let full = cols / l;
    assert!(xs >= cols.div_ceil(l) * l && xp.len() >= (T - 1) * xs + cols.div_ceil(l) * l);
    assert!(r0 + R <= w.nrows);
    let xpp = xp.as_ptr();
    let mut acc = [[s.splat(0.0); T]; R];
    // SAFETY (every `xpp.add` below): token t < T and chunk c with (c + 1) L <= cols are
    // inside xp (asserted: tokens xs >= cols apart).
    match w.rows {
        Rows::Fp4 { q, scale } => {
            let (rb, nb) = (cols / 2, cols / 32);
            // a group lies in one scale block and is 2 or 4 chunks (`Simd::FP4_GROUP`)
            const { assert!(S::FP4_GROUP == 2 * S::LANES || S::FP4_GROUP == 32) };
            const { assert!(32 % S::FP4_GROUP == 0 && S::FP4_GROUP / S::LANES <= 4) };
            let (gs, gc) = (S::FP4_GROUP, S::FP4_GROUP / l);
            assert!(q.len() >= (r0 + R) * rb && scale.len() >= (r0 + R) * nb);
            let qp = q[r0 * rb..].as_ptr();
            let sp = scale[r0 * nb..].as_ptr();
            // chunk by chunk (`Simd::FP4_X_BY_CHUNK`) or the group's x first
            let by_chunk = S::FP4_X_BY_CHUNK && R >= 2;
            let p = Fp4Loop {
                q: qp,
                rb,
                scale: sp,
                nb,
                tables,
                x: xpp,
                xs,
                groups: cols / 32,
            };
            // SAFETY: rows r0..r0 + R of q and scale, and every token's cols columns of x,
            // were asserted above; `tables` has all 256; acc is R x T.
            let looped = gs == 32 && unsafe { s.fp4_loop(R, p, acc.as_flattened_mut()) };
            for g in 0..if looped { 0 } else { cols / gs } {
                prefetch_next(s, qp.wrapping_add(R * rb), R * gs / 2, g);
                let b = g * gs / 32;
                // SAFETY: `row` is called only with k < R, and b < nb, so the scale byte lies
                // in the rows asserted inside `scale`; row k's bytes gG / 2..(g + 1) G / 2 lie
                // within its cols / 2 bytes, inside q (asserted above). Raw pointers: no
                // bounds check per row.
                let row = |k: usize| unsafe {
                    let t = &tables[*sp.add(k * nb + b) as usize];
                    s.fp4(qp.add(k * rb + g * gs / 2), t)
                };
                if by_chunk {
                    let mut ws = [[s.splat(0.0); 4]; R];
                    for (k, wk) in ws.iter_mut().enumerate() {
                        *wk = row(k);
                    }
                    for c in 0..gc {
                        // SAFETY: g < cols / G, so columns gG..gG + G lie in every token's
                        // row.
                        let xc = unsafe { x_chunks::<S, T>(s, xpp, xs, (g * gc + c) * l) };
                        for (wk, ak) in ws.iter().zip(acc.iter_mut()) {
                            fma_tokens(s, wk[c], &xc, ak);
                        }
                    }
                } else {
                    let mut xv = [[s.splat(0.0); T]; 4];
                    for (c, x) in xv.iter_mut().enumerate().take(gc) {
                        // SAFETY: as above.
                        *x = unsafe { x_chunks::<S, T>(s, xpp, xs, (g * gc + c) * l) };
                    }
                    for (k, ak) in acc.iter_mut().enumerate() {
                        let w = row(k);
                        for c in 0..gc {
                            fma_tokens(s, w[c], &xv[c], ak);
                        }
                    }
                }
            }
        }
        Rows::Fp8 { q, scale } => {
            assert!(q.len() >= (r0 + R) * cols && scale.len() >= cols.div_ceil(128));
            let qp = q[r0 * cols..].as_ptr();
            // SAFETY: rows r0..r0 + R of `cols` bytes lie inside q (asserted) and every
            // token's first `full` chunks inside xp (asserted at the top).
            unsafe {
                if S::FP8_BITS && w.fp8_bits {
                    fp8_steps::<S, R, T, true>(s, qp, cols, (xpp, xs), full, &mut acc);
                } else {
                    fp8_steps::<S, R, T, false>(s, qp, cols, (xpp, xs), full, &mut acc);
                }
            }
        }
        Rows::Bf16(d) => {
            assert!(d.len() >= (r0 + R) * cols * 2);
            let dp = d[r0 * cols * 2..].as_ptr();
            for c in 0..full {
                prefetch_next(s, dp.wrapping_add(2 * R * cols), 2 * R * l, c);
                // SAFETY: (c + 1) L <= cols (see above).
                let xv = unsafe { x_chunks::<S, T>(s, xpp, xs, c * l) };
                for k in 0..R {
                    // SAFETY: each row's 2L bytes from 2cL lie inside that row (rows
                    // asserted inside d above).
                    let wv = unsafe { s.bf16(dp.add(2 * (k * cols + c * l))) };
                    fma_tokens(s, wv, &xv, &mut acc[k]);
                }
            }
        }
        Rows::F32(d) => {
            assert!(d.len() >= (r0 + R) * cols);
            let dp = d[r0 * cols..].as_ptr();
            for c in 0..full {
                prefetch_next(s, dp.wrapping_add(R * cols).cast(), 4 * R * l, c);
                // SAFETY: (c + 1) L <= cols (see above).
                let xv = unsafe { x_chunks::<S, T>(s, xpp, xs, c * l) };
                for k in 0..R {
                    // SAFETY: each row's L floats from cL lie inside that row (rows asserted
                    // inside d above).
                    let wv = unsafe { s.load(dp.add(k * cols + c * l)) };
                    fma_tokens(s, wv, &xv, &mut acc[k]);
                }
            }
        }
    }
    if !matches!(w.rows, Rows::Fp4 { .. }) && full * l < cols {
        for k in 0..R {
            let how = if w.fp8_bits {
                Fp8As::Bits
            } else {
                Fp8As::Unscaled
            };
            let wv = chunk(s, w.rows, r0 + k, cols, full, how);
            for t in 0..T {
                acc[k][t] = s.fma(wv, ld(s, xp, t * xs + full * l), acc[k][t]);
            }
        }
    }
    let mut out = [[0f32; T]; R];
    for k in 0..R {
        for t in 0..T {
            out[k][t] = s.hsum(acc[k][t]);
        }
    }
    out
}

/// out[r * os + t] = dot(row r, xp[t]) for every row of `w` and the T tokens of xp (`xs`
/// apart), R rows at a time: the fused path for few tokens (`driver::matmul`), one
/// token included (T = 1).
#[inline(always)]
pub(crate) fn dot_xt<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: &RowsView,
    x: (&[f32], usize),
    (out, os): (&mut [f32], usize),
) {
    assert!(os >= T && (w.nrows == 0 || out.len() >= (w.nrows - 1) * os + T));
    // The FP4 table of every possible scale up front (the same tables `fp4_group` forms),
    // so the inner loop only loads the block's table.
    let mut tables = [s.splat(0.0); 256];
    if let Rows::Fp4 { .. } = w.rows {
        for (b, t) in tables.iter_mut().enumerate() {
            *t = s.fp4_scaled_table(b as u8);
        }
    }
    let mut r = 0;
    while r + R <= w.nrows {
        let v = rows_xt::<S, R, T>(s, w, r, x, &tables);
        for k in 0..R {
            out[(r + k) * os..][..T].copy_from_slice(&v[k]);
        }
        r += R;
    }
    while r < w.nrows {
        out[r * os..][..T].copy_from_slice(&rows_xt::<S, 1, T>(s, w, r, x, &tables)[0]);
        r += 1;
    }
}

/// Row stride of the prefill path's decoded panel for rows of `nch` chunks of `lanes`, in
/// panels of `panel` columns (`Simd::GEMM_PANEL`): the panel's width plus 64 bytes, so that
/// its rows do not all map to the same L1 sets.
pub(crate) fn panel_stride(nch: usize, lanes: usize, panel: usize) -> usize {
    (nch * lanes).min(panel) + 16
}

/// pbuf[r * ps..][..(c1 - c0) L] = chunks c0..c1 of row r, decoded in the column
/// layout (FP8 times its block scales; the last chunk zero padded). FP4: c0 and c1
/// multiples of G / L (whole groups).
#[inline(always)]
fn decode_panel<S: Simd>(
    s: S,
    w: &RowsView,
    (c0, c1): (usize, usize),
    (pbuf, ps): (&mut [f32], usize),
) {
    let (l, cols) = (S::LANES, w.cols);
    assert!(pbuf.len() >= w.nrows * ps && (c1 - c0) * l <= ps);
    for r in 0..w.nrows {
        let row = &mut pbuf[r * ps..(r + 1) * ps];
        match w.rows {
            Rows::Fp4 { q, scale } => {
                let gc = S::FP4_GROUP / l;
                for g in c0 / gc..c1 / gc {
                    let w = fp4_group(s, q, scale, r, cols, g);
                    for c in 0..gc {
                        st(s, row, (g * gc + c - c0) * l, w[c]);
                    }
                }
            }
            Rows::Fp8 { q, scale } => {
                // whole chunks two at a time (a pair never straddles a 128-column scale
                // block: 128 / L is even), the same values `chunk` gives; then the rest
                let qr = &q[r * cols..(r + 1) * cols];
                let full = (cols / l).min(c1);
                let mut c = c0;
                while c + 2 <= full {
                    let sv = s.splat(e8m0_to_f32(scale[c * l / 128]));
                    // SAFETY: (c + 2) L <= cols, so the 2L bytes from cL lie inside the row.
                    let (a, b) = unsafe { s.fp8_pair(qr.as_ptr().add(c * l)) };
                    st(s, row, (c - c0) * l, s.mul(a, sv));
                    st(s, row, (c + 1 - c0) * l, s.mul(b, sv));
                    c += 2;
                }
                for c in c..c1 {
                    st(
                        s,
                        row,
                        (c - c0) * l,
                        chunk(s, w.rows, r, cols, c, Fp8As::Scaled),
                    );
                }
            }
            Rows::Bf16(d) => {
                // whole chunks straight from the row (what `chunk` gives them, without its
                // per-chunk slicing and tail buffer); then the rest
                let dr = &d[r * cols * 2..(r + 1) * cols * 2];
                let full = (cols / l).min(c1);
                for c in c0..full {
                    // SAFETY: (c + 1) L <= cols, so the 2L bytes from 2cL lie inside the row.
                    let v = unsafe { s.bf16(dr.as_ptr().add(2 * c * l)) };
                    st(s, row, (c - c0) * l, v);
                }
                for c in full.max(c0)..c1 {
                    st(
                        s,
                        row,
                        (c - c0) * l,
                        chunk(s, w.rows, r, cols, c, Fp8As::Scaled),
                    );
                }
            }
            Rows::F32(_) => {
                for c in c0..c1 {
                    st(
                        s,
                        row,
                        (c - c0) * l,
                        chunk(s, w.rows, r, cols, c, Fp8As::Scaled),
                    );
                }
            }
        }
    }
}

/// R rows x T tokens over the nc chunks of one panel: w holds the panel's decoded rows
/// (`ps` apart), x the tokens' same columns (`xs` apart). Each (row, token) keeps its
/// accumulator vector in `accs` ([rows, n, L]) between panels, so its FMA chain is the same
/// as in `rows_xt`; the first panel starts from zero instead of `accs`. With `AHEAD`, each
/// chunk step also prefetches the same columns of the two x rows at `ahead` (tokens of the
/// next tile; any address: a prefetch never faults).
#[inline(always)]
fn tile<S: Simd, const R: usize, const T: usize, const AHEAD: bool>(
    s: S,
    (w, r0, ps): (&[f32], usize, usize),
    (x, xs, t0, n): (&[f32], usize, usize, usize),
    (nc, first): (usize, bool),
    accs: &mut [f32],
    ahead: [*const f32; 2],
) {
    let l = S::LANES;
    assert!(t0 + T <= n && nc * l <= ps && nc * l <= xs);
    assert!(w.len() >= (r0 + R - 1) * ps + nc * l && x.len() >= (t0 + T - 1) * xs + nc * l);
    assert!(accs.len() >= (r0 + R) * n * l);
    let (wp, xpp, ap) = (w.as_ptr(), x.as_ptr(), accs.as_mut_ptr());
    let mut acc = [[s.splat(0.0); T]; R];
    // SAFETY: rows r0..r0 + R and tokens t0..t0 + T exist (asserted), chunk indices are below
    // nc within each row / token (asserted), and accs holds [rows, n, L] f32.
    unsafe {
        if !first {
            for k in 0..R {
                for t in 0..T {
                    acc[k][t] = s.load(ap.add(((r0 + k) * n + t0 + t) * l));
                }
            }
        }
        for c in 0..nc {
            if AHEAD {
                for a in ahead {
                    s.prefetch_x(a.wrapping_add(c * l).cast());
                }
            }
            let mut xv = [s.splat(0.0); T];
            for t in 0..T {
                xv[t] = s.load(xpp.add((t0 + t) * xs + c * l));
            }
            for k in 0..R {
                let wv = s.load(wp.add((r0 + k) * ps + c * l));
                for t in 0..T {
                    acc[k][t] = s.fma(wv, xv[t], acc[k][t]);
                }
            }
        }
        for k in 0..R {
            for t in 0..T {
                s.store(ap.add(((r0 + k) * n + t0 + t) * l), acc[k][t]);
            }
        }
    }
}

/// `tile` of R rows x `tt` tokens, tt <= T <= 8 (monomorphised for every width).
#[inline(always)]
fn tiles<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: (&[f32], usize, usize),
    x: (&[f32], usize, usize, usize),
    nc: (usize, bool),
    accs: &mut [f32],
    tt: usize,
) {
    assert!(tt >= 1 && tt <= T && T <= 8);
    let no = [std::ptr::null(); 2];
    match tt {
        t if t == T => tile::<S, R, T, false>(s, w, x, nc, accs, no),
        1 => tile::<S, R, 1, false>(s, w, x, nc, accs, no),
        2 => tile::<S, R, 2, false>(s, w, x, nc, accs, no),
        3 => tile::<S, R, 3, false>(s, w, x, nc, accs, no),
        4 => tile::<S, R, 4, false>(s, w, x, nc, accs, no),
        5 => tile::<S, R, 5, false>(s, w, x, nc, accs, no),
        6 => tile::<S, R, 6, false>(s, w, x, nc, accs, no),
        _ => tile::<S, R, 7, false>(s, w, x, nc, accs, no),
    }
}

/// out[r, t] = row r of `w` · xp[t] for its rows (at most GROUP) and n tokens (`xs` apart
/// in xp, in the column layout). Panel by panel: `Simd::GEMM_PANEL` columns of the rows
/// are decoded into `pbuf` ([GROUP, panel_stride]), then every token passes over them in
/// R x T register tiles (R x (n % T) for the last tokens), the accumulators kept in `accs`
/// (scratch of at least nrows * n * L f32) between panels.
#[inline(always)]
pub(crate) fn gemm<S: Simd, const R: usize, const T: usize>(
    s: S,
    w: &RowsView,
    (xp, xs, n): (&[f32], usize, usize),
    out: &mut [f32],
    accs: &mut [f32],
    pbuf: &mut [f32],
) {
    let (l, nrows) = (S::LANES, w.nrows);
    let nch = w.cols.div_ceil(l);
    let panel = S::GEMM_PANEL;
    const { assert!(S::GEMM_PANEL.is_multiple_of(32)) };
    let ps = panel_stride(nch, l, panel);
    let ahead = s.gemm_x_ahead();
    assert!(
        accs.len() >= nrows * n * l && out.len() >= nrows * n && pbuf.len() >= nrows * ps,
        "gemm: accs must hold [nrows, n, L], out [nrows, n] and pbuf [nrows, panel_stride]"
    );
    // panel -> token tile -> row tile: the x tile is reused across the row tiles and the
    // panel of decoded rows (in L2) across token tiles.
    let mut c0 = 0;
    while c0 < nch {
        let c1 = (c0 + panel / l).min(nch);
        decode_panel(s, w, (c0, c1), (pbuf, ps));
        let (wp, x) = (&pbuf[..], &xp[c0 * l..]);
        let nc = (c1 - c0, c0 == 0);
        let mut t = 0;
        while t < n {
            // full T-token tiles, then one tile of the n % T tokens left
            let tt = T.min(n - t);
            let mut r = 0;
            while r + R <= nrows {
                if ahead && tt == T && t + T < n {
                    // row tile i brings tokens 2i and 2i + 1 of the next tile into L1 (its
                    // x comes from L2 or L3 otherwise: a token block of 4,096 columns is
                    // 2 MiB), so the next tile finds its x there; past the next tile's
                    // last token, its own (already in L1)
                    let i = r / R;
                    let at = |j: usize| {
                        let k = t + T + 2 * i + j;
                        let k = if 2 * i + j < T && k < n { k } else { t };
                        x.as_ptr().wrapping_add(k * xs)
                    };
                    let w = (wp, r, ps);
                    tile::<S, R, T, true>(s, w, (x, xs, t, n), nc, accs, [at(0), at(1)]);
                } else {
                    tiles::<S, R, T>(s, (wp, r, ps), (x, xs, t, n), nc, accs, tt);
                }
                r += R;
            }
            while r < nrows {
                tiles::<S, 1, T>(s, (wp, r, ps), (x, xs, t, n), nc, accs, tt);
                r += 1;
            }
            t += tt;
        }
        c0 = c1;
    }
    for (o, a) in out.iter_mut().zip(accs.chunks_exact(l)) {
        *o = s.hsum(ld(s, a, 0));
    }
}

// ---- attention: query heads against their shared keys ----
//
// `dot` is one FMA chain over L-lane chunks in order, then the fixed-tree `hsum`, then the
// tail columns added in order: the same value for a pair of vectors wherever it is computed.
// `attend` takes, per head, the dots of its query with each key (that same chain), a softmax
// over them and the sink, and the probability-weighted sum of the keys, each output column
// summed over the keys in order. How heads and keys are grouped around those chains (four
// heads sharing each key load, or one head alone) never changes a head's result.

/// a · b over min(len) columns.
#[inline(always)]
pub(crate) fn dot<S: Simd>(s: S, a: &[f32], b: &[f32]) -> f32 {
    let d = a.len().min(b.len());
    let (a, b) = (&a[..d], &b[..d]);
    let full = d / S::LANES * S::LANES;
    let mut acc = s.splat(0.0);
    let mut c = 0;
    while c < full {
        acc = s.fma(ld(s, a, c), ld(s, b, c), acc);
        c += S::LANES;
    }
    dot_finish(s, acc, a, b, full)
}

/// Attention of h heads of one query against the same keys (one KV head, as in V4):
/// q [h, d], sinks [h], out [h, d]; each head's out = Σ_j p_j · keys[j] with
/// p = softmax([q_h · keys[j] · scale]_j ++ [sink_h]) (the sink only takes part in the
/// normaliser). Every key holds at least d values. Heads go four at a time (each key chunk
/// loaded once for the four), the rest one by one (`attend_heads` with H = 4, then 1); a
/// head's result is the same either way, bit for bit (section comment above).
#[inline(always)]
pub(crate) fn attend<S: Simd>(
    s: S,
    q: &[f32],
    keys: &[&[f32]],
    scale: f32,
    sinks: &[f32],
    out: &mut [f32],
) {
    let h = sinks.len();
    assert!(h > 0 && q.len() == out.len() && q.len().is_multiple_of(h));
    let d = q.len() / h;
    let mut hb = 0;
    while hb + 4 <= h {
        let qs = [0, 1, 2, 3].map(|i| &q[(hb + i) * d..(hb + i + 1) * d]);
        let sk = [0, 1, 2, 3].map(|i| sinks[hb + i]);
        attend_heads::<S, 4>(s, qs, keys, scale, sk, &mut out[hb * d..(hb + 4) * d]);
        hb += 4;
    }
    for i in hb..h {
        let o = &mut out[i * d..(i + 1) * d];
        attend_heads::<S, 1>(s, [&q[i * d..(i + 1) * d]], keys, scale, [sinks[i]], o);
    }
}

/// H heads of `attend` (q: their queries, [d] each; out [H, d]). The dots go two keys at a
/// time for the H heads, the weighted sums two chunks at a time for the H heads; each
/// (head, key) dot is `dot`'s chain and each (head, chunk) sum runs over the keys in order,
/// whatever H.
#[inline(always)]
fn attend_heads<S: Simd, const H: usize>(
    s: S,
    q: [&[f32]; H],
    keys: &[&[f32]],
    scale: f32,
    sinks: [f32; H],
    out: &mut [f32],
) {
    let (l, d, nk) = (S::LANES, q[0].len(), keys.len());
    assert!(q.iter().all(|v| v.len() == d) && out.len() == H * d);
    assert!(keys.iter().all(|k| k.len() >= d));
    let full = d / l * l;
    let qp = q.map(|v| v.as_ptr());
    let zero = s.splat(0.0);
    let mut p: [Vec<f32>; H] = std::array::from_fn(|_| Vec::with_capacity(nk + 1));
    let mut pairs = keys.chunks_exact(2);
    for kk in &mut pairs {
        let (kp0, kp1) = (kk[0].as_ptr(), kk[1].as_ptr());
        let (mut a0, mut a1) = ([zero; H], [zero; H]);
        let mut c = 0;
        while c < full {
            // SAFETY: c + L <= full <= d, and every query and key holds at least d values
            // (asserted above).
            unsafe {
                let (k0, k1) = (s.load(kp0.add(c)), s.load(kp1.add(c)));
                for h in 0..H {
                    let qv = s.load(qp[h].add(c));
                    a0[h] = s.fma(qv, k0, a0[h]);
                    a1[h] = s.fma(qv, k1, a1[h]);
                }
            }
            c += l;
        }
        for h in 0..H {
            p[h].push(dot_finish(s, a0[h], q[h], kk[0], full) * scale);
            p[h].push(dot_finish(s, a1[h], q[h], kk[1], full) * scale);
        }
    }
    if let [k] = pairs.remainder() {
        let kp = k.as_ptr();
        let mut a = [zero; H];
        let mut c = 0;
        while c < full {
            // SAFETY: as above.
            unsafe {
                let kv = s.load(kp.add(c));
                for h in 0..H {
                    a[h] = s.fma(s.load(qp[h].add(c)), kv, a[h]);
                }
            }
            c += l;
        }
        for h in 0..H {
            p[h].push(dot_finish(s, a[h], q[h], k, full) * scale);
        }
    }
    for h in 0..H {
        p[h].push(sinks[h]);
        super::ops::softmax(&mut p[h]);
    }
    // p[h] holds nk + 1 values (the keys', then the sink's)
    let pp: [*const f32; H] = std::array::from_fn(|h| p[h].as_ptr());
    let op = out.as_mut_ptr();
    let mut c = 0;
    while c + 2 * l <= full {
        let (mut a0, mut a1) = ([zero; H], [zero; H]);
        for (j, k) in keys.iter().enumerate() {
            let kp = k.as_ptr();
            // SAFETY: c + 2L <= full <= d <= k.len() (asserted above); j < nk < p[h].len().
            unsafe {
                let (k0, k1) = (s.load(kp.add(c)), s.load(kp.add(c + l)));
                for h in 0..H {
                    let pv = s.splat(*pp[h].add(j));
                    a0[h] = s.fma(pv, k0, a0[h]);
                    a1[h] = s.fma(pv, k1, a1[h]);
                }
            }
        }
        for h in 0..H {
            // SAFETY: out holds [H, d] (asserted) and c + 2L <= d.
            unsafe {
                s.store(op.add(h * d + c), a0[h]);
                s.store(op.add(h * d + c + l), a1[h]);
            }
        }
        c += 2 * l;
    }
    if c < full {
        let mut a = [zero; H];
        for (j, k) in keys.iter().enumerate() {
            let kp = k.as_ptr();
            // SAFETY: as above, with c + L <= full.
            unsafe {
                let kv = s.load(kp.add(c));
                for h in 0..H {
                    a[h] = s.fma(s.splat(*pp[h].add(j)), kv, a[h]);
                }
            }
        }
        for h in 0..H {
            // SAFETY: out holds [H, d] and c + L <= d.
            unsafe { s.store(op.add(h * d + c), a[h]) };
        }
    }
    for h in 0..H {
        for i in full..d {
            let mut v = 0f32;
            for (k, &pj) in keys.iter().zip(&p[h]) {
                v += pj * k[i];
            }
            out[h * d + i] = v;
        }
    }
}

/// The dot of q and k from its chain over the first `full` columns: hsum, then the tail
/// columns in order (as `dot`).
#[inline(always)]
fn dot_finish<S: Simd>(s: S, acc: S::V, q: &[f32], k: &[f32], full: usize) -> f32 {
    let mut r = s.hsum(acc);
    for i in full..q.len() {
        r += q[i] * k[i];
    }
    r
}

/// Register-only FMA loop for the benchmark's peak: C independent chains.
#[inline(always)]
pub(crate) fn fma_probe<S: Simd, const C: usize>(s: S, iters: usize) -> f32 {
    let mut acc = [s.splat(1.0); C];
    let (a, b) = (s.splat(0.999_999), s.splat(1e-7));
    for _ in 0..iters {
        for v in acc.iter_mut() {
            *v = s.fma(*v, a, b);
        }
    }
    let mut t = s.splat(0.0);
    for v in acc {
        t = s.add(t, v);
    }
    s.hsum(t)
}

// ---- fast numerics: FP4 weights x int8 activations (see `quant`) ----
//
// Every (row, token) output is one FMA chain over the 32-column blocks in order,
// `acc = fma(dot_i8(w_b, x_b), splat(ws_b * d_b), acc)`, then `hsum`, in both the one-token
// path (`dot_fp4_i8` on the packed bytes) and the prefill path (`decode_q8` + `gemm_q8`);
// the tier guarantees `dot_fp4_i8(p, x)` has the lanes of `dot_i8(fp4_i8(p), x)`, so each
// token's result is bit-identical to computing it alone.

/// The scale of the int8 weights `2 * E2M1` of a block with scale byte `b`: 2^(b - 127) / 2.
#[inline(always)]
fn half_scale(b: u8) -> f32 {
    e8m0_to_f32(b) * 0.5
}

/// R FP4 rows from r0, one token of int8 activations (xq [cols] in block order, xd
/// [cols / 32] steps).
#[inline(always)]
fn rows_q8_x1<S: Simd, const R: usize>(
    s: S,
    w: &RowsView,
    r0: usize,
    xq: &[i8],
    xd: &[f32],
) -> [f32; R] {
    let Rows::Fp4 { q, scale } = w.rows else {
        unreachable!("the int8 path is only for FP4 rows")
    };
    let (cols, nb) = (w.cols, w.cols / 32);
    assert!(r0 + R <= w.nrows && q.len() >= (r0 + R) * cols / 2 && scale.len() >= (r0 + R) * nb);
    assert!(xq.len() >= cols && xd.len() >= nb);
    let (qp, xp) = (q[r0 * cols / 2..].as_ptr(), xq.as_ptr());
    let sc = &scale[r0 * nb..(r0 + R) * nb];
    let mut acc = [s.splat(0.0); R];
    for b in 0..nb {
        prefetch_next(s, qp.wrapping_add(R * cols / 2), 16 * R, b);
        for k in 0..R {
            let f = s.splat(half_scale(sc[k * nb + b]) * xd[b]);
            // SAFETY: row k's block b is bytes 16b..16b + 16 of its cols / 2 (rows asserted
            // inside q), and x's block b is xq[32b..32b + 32] (xq.len() >= cols).
            let v = unsafe { s.dot_fp4_i8(qp.add(k * cols / 2 + 16 * b), xp.add(32 * b)) };
            acc[k] = s.fma(v, f, acc[k]);
        }
    }
    let mut out = [0f32; R];
    for k in 0..R {
        out[k] = s.hsum(acc[k]);
    }
    out
}

/// out[r] = row r · x for every FP4 row of `w`, int8 activations, R rows at a time.
#[inline(always)]
pub(crate) fn dot_q8_x1<S: Simd, const R: usize>(
    s: S,
    w: &RowsView,
    xq: &[i8],
    xd: &[f32],
    out: &mut [f32],
) {
    let mut r = 0;
    while r + R <= w.nrows {
        out[r..r + R].copy_from_slice(&rows_q8_x1::<S, R>(s, w, r, xq, xd));
        r += R;
    }
    while r < w.nrows {
        out[r] = rows_q8_x1::<S, 1>(s, w, r, xq, xd)[0];
        r += 1;
    }
}

/// wq[r * cols..][..cols] = FP4 row r as int8 weights in block order; ws[r * cols / 32 + b] =
/// its block scales (`half_scale`).
#[inline(always)]
pub(crate) fn decode_q8<S: Simd>(s: S, w: &RowsView, wq: &mut [i8], ws: &mut [f32]) {
    let Rows::Fp4 { q, scale } = w.rows else {
        unreachable!("the int8 path is only for FP4 rows")
    };
    let (cols, nb) = (w.cols, w.cols / 32);
    assert!(wq.len() >= w.nrows * cols && ws.len() >= w.nrows * nb);
    assert!(q.len() >= w.nrows * cols / 2 && scale.len() >= w.nrows * nb);
    for r in 0..w.nrows {
        for b in 0..nb {
            let src = &q[r * cols / 2 + 16 * b..][..16];
            let dst = &mut wq[r * cols + 32 * b..][..32];
            // SAFETY: `src` holds 16 bytes and `dst` 32.
            unsafe { s.fp4_i8(src.as_ptr(), dst.as_mut_ptr()) };
            ws[r * nb + b] = half_scale(scale[r * nb + b]);
        }
    }
}

/// Blocks per panel of the int8 prefill path: 16 rows x 512 int8 = 8 KiB of weights stay
/// in L1 while every token tile passes over them.
const PANEL_BLOCKS: usize = 16;

/// R rows x T tokens over blocks b0..b1 of the int8 prefill product; accumulators live in
/// `accs` ([rows, n, L]) between panels, so each chain is the one of `rows_q8_x1`.
#[inline(always)]
fn tile_q8<S: Simd, const R: usize, const T: usize>(
    s: S,
    (wq, ws): (&[i8], &[f32]),
    r0: usize,
    cols: usize,
    (xq, xd): (&[i8], &[f32]),
    (t0, n): (usize, usize),
    (b0, b1): (usize, usize),
    accs: &mut [f32],
) {
    let (l, nb) = (S::LANES, cols / 32);
    assert!(t0 + T <= n && b1 <= nb);
    assert!(wq.len() >= (r0 + R) * cols && ws.len() >= (r0 + R) * nb);
    assert!(xq.len() >= (t0 + T) * cols && xd.len() >= (t0 + T) * nb);
    assert!(accs.len() >= (r0 + R) * n * l);
    let (wp, xp, ap) = (wq.as_ptr(), xq.as_ptr(), accs.as_mut_ptr());
    let mut acc = [[s.splat(0.0); T]; R];
    // SAFETY: rows r0..r0 + R and tokens t0..t0 + T exist (asserted), block indices are
    // below nb so each 32-byte block lies inside its row / token, and accs holds
    // [rows, n, L] f32.
    unsafe {
        if b0 > 0 {
            for k in 0..R {
                for t in 0..T {
                    acc[k][t] = s.load(ap.add(((r0 + k) * n + t0 + t) * l));
                }
            }
        }
        for b in b0..b1 {
            for k in 0..R {
                let wb = wp.add((r0 + k) * cols + 32 * b);
                let sw = ws[(r0 + k) * nb + b];
                for t in 0..T {
                    let v = s.dot_i8(wb, xp.add((t0 + t) * cols + 32 * b));
                    let f = s.splat(sw * xd[(t0 + t) * nb + b]);
                    acc[k][t] = s.fma(v, f, acc[k][t]);
                }
            }
        }
        for k in 0..R {
            for t in 0..T {
                s.store(ap.add(((r0 + k) * n + t0 + t) * l), acc[k][t]);
            }
        }
    }
}

/// out[r, t] = wq[r] · xq[t] (int8, per-block scales) for r < nrows, t < n.
#[inline(always)]
pub(crate) fn gemm_q8<S: Simd, const R: usize>(
    s: S,
    (wq, ws): (&[i8], &[f32]),
    nrows: usize,
    cols: usize,
    (xq, xd): (&[i8], &[f32]),
    n: usize,
    out: &mut [f32],
    accs: &mut [f32],
) {
    let (l, nb) = (S::LANES, cols / 32);
    assert!(
        accs.len() >= nrows * n * l,
        "gemm_q8: accs must hold [nrows, n, L]"
    );
    let mut b0 = 0;
    while b0 < nb {
        let bs = (b0, (b0 + PANEL_BLOCKS).min(nb));
        let mut t = 0;
        while t < n {
            // three-token tiles, then one tile of the tokens left
            let tt = (n - t).min(3);
            let x = (xq, xd);
            let mut r = 0;
            while r + R <= nrows {
                match tt {
                    1 => tile_q8::<S, R, 1>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    2 => tile_q8::<S, R, 2>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    _ => tile_q8::<S, R, 3>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                }
                r += R;
            }
            while r < nrows {
                match tt {
                    1 => tile_q8::<S, 1, 1>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    2 => tile_q8::<S, 1, 2>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                    _ => tile_q8::<S, 1, 3>(s, (wq, ws), r, cols, x, (t, n), bs, accs),
                }
                r += 1;
            }
            t += tt;
        }
        b0 = bs.1;
    }
    for (o, a) in out.iter_mut().zip(accs.chunks_exact(l)) {
        *o = s.hsum(ld(s, a, 0));
    }
}
