//! `Simd`: the vector operations a tier supplies, and its contract.

use super::super::quant::I8_OF_E2M1;
use crate::dtype::e8m0_to_f32;

/// One tier's vector operations on `V` (L f32 lanes), and the constants that shape its
/// loops. Implemented by the tier's proof type.
///
/// # Safety
///
/// The contract of every method, stated once here (as memchr's `Vector` trait does):
/// - A value of an implementing type exists only where the CPU has every target feature the
///   tier's operations use: the tier's `detect` is its only constructor. Holding `self`
///   therefore makes the operations safe to call (they are compiled for those features and
///   inline into `simd_kernel!`'s `#[target_feature]` functions), and it is what those
///   functions' callers rely on.
/// - The `unsafe` methods are the ones that take raw pointers; each one's `# Safety` line says
///   how many bytes or values the caller guarantees readable (or writable) there, at any
///   alignment. Nothing else is asked of the caller.
pub(crate) trait Simd: Copy {
    type V: Copy;
    const LANES: usize;

    // ---- register tiles of the loops (`simd_kernel!` instantiates the loops with them) ----

    /// Rows per fused pass of 1, 2, 3 and 4 tokens (`fused::dot_xt`; the rows share each load
    /// of x, and R x T accumulators stay in registers); `ROWS_XT[0]` also for the int8
    /// one-token path.
    const ROWS_XT: [usize; 4];
    /// Rows of the one-token pass for FP4 (`ROWS_XT[0]` is for the other formats).
    const FP4_ROWS_X1: usize = Self::ROWS_XT[0];
    /// Rows x tokens of the prefill micro-kernel (`gemm::gemm`).
    const GEMM_TILE: (usize, usize);
    /// Rows of the int8 prefill micro-kernel (`q8::gemm_q8`, x 3 tokens).
    const Q8_ROWS: usize;
    /// Independent FMA chains of the arithmetic peak probe (`attend::fma_probe`).
    const CHAINS: usize;

    // ---- the vector operations ----

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
    /// tier may decide per CPU (`x86::cpu::fp8_bits`).
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
            out[i] = I8_OF_E2M1[(p[i] & 15) as usize];
            out[16 + i] = I8_OF_E2M1[(p[i] >> 4) as usize];
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

/// `Simd::fp8` gives e4m3 / 2^8 and `Simd::fp8_bits` e4m3 / 2^120: the ratio.
const FP8_BITS_FROM_F16: f32 = 1.0 / (1u128 << 112) as f32;

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
