//! Matrix kernels over the checkpoint's own weight formats, and the small vector helpers.
//!
//! The engine is memory-bound in decode: every generated token streams the dense weights
//! once, so these kernels decode FP8/FP4/BF16 on the fly from the checkpoint layout and
//! accumulate in f32. A kernel tier (AVX-512, AVX2+FMA on x86_64; NEON+dotprod, NEON on
//! aarch64; portable everywhere) is chosen once at run time.
//!
//! Determinism contract (tests rely on it):
//! - output rows are independent; threads split rows, so any thread count gives
//!   bit-identical results;
//! - `matmul` with n tokens gives, for every token, bit-identical results to `matmul` with
//!   that token alone (the per-row accumulation order does not depend on n; FP8: as long as
//!   no activation times its block scale is an f32 subnormal, see `driver`);
//! - tiers may differ from each other at rounding level only (except fast numerics, whose
//!   activation rounding is bf16 with bf16 products and int8 per 32 columns without).
//!
//! Tier selection: the best tier the CPU supports, decided once.
//! `V4FLASH_KERNELS=portable|neon|neon-dotprod|avx2|avx512` forces a tier; asking for one
//! the CPU lacks (or an unknown name) prints a one-time warning on stderr and uses the best
//! available tier instead. `tier_name()` reports the choice (`tier`).
//!
//! Fast and official numerics multiply FP8/FP4 matrices with `vdpbf16ps` on AVX-512 CPUs
//! that have avx512_bf16 (`V4FLASH_BF16=off` turns it off; see `x86::bf16` and `matmul_in`).
//!
//! FP8 bytes 0x7F / 0xFF (NaN in e4m3fn, never present in a valid checkpoint) decode to
//! ±480 in every tier rather than NaN: the f16 route has no NaN encoding for them.
//!
//! Layout: this file is the entry points; each module below uses only modules further down
//! the list (`ops` → `tier` → the tiers → `driver` → `generic` → `rows` → `matrix`):
//! - `ops`: the forward pass's vector helpers (RMSNorm, the fixed-lane `dot`, softmax, rope);
//! - `tier`: the tiers, the choice of one, `with_kernel!` (the only place that picks one);
//! - `portable`, `x86`, `aarch64`: the tiers, each a `Simd` implementation (`x86` also has
//!   the `vdpbf16ps` products, which use `driver`'s task split, and assembly loops);
//! - `driver`: the tier-independent half of `matmul` (tasks, x, fused or panel path);
//! - `generic`: the loops, written once over `Simd`, and the `Kernel` entry points;
//! - `rows`: the rows of a matrix one kernel call takes; `matrix`: `MatRef`, `Weights`;
//! - `quant`, `hadamard`: activation quantization and the Hadamard rotation (leaves).

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod driver;
mod generic;
pub(crate) mod hadamard;
mod matrix;
pub mod ops;
mod portable;
pub(crate) mod quant;
mod rows;
mod tier;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use matrix::{MatRef, Weights};
pub use tier::{active_tier, Tier};

use crate::tuning::Tuning;
use driver::Product;
use generic::Kernel;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;
use tier::with_kernel;

/// y[n, rows.len()] = x[n, cols] · W[rows]ᵀ, parallel over rows in the current rayon pool.
pub fn matmul(m: &MatRef, rows: Range<usize>, x: &[f32], n: usize, y: &mut [f32]) {
    let p = check_args(m, rows, x, n, y);
    counted(&p, || run(Path::F32(active_tier()), p.clone(), y));
}

/// Runs `f` (the product `p`), adding its flops to the process-wide kernel counters, and its
/// wall time where no other product was running already: products that run side by side (an
/// expert's w1 and w3) count their shared time once.
fn counted(p: &Product, f: impl FnOnce()) {
    /// Leaves the busy spell when dropped (also if `f` unwinds).
    struct Spell;
    impl Drop for Spell {
        fn drop(&mut self) {
            let mut b = KERNEL_BUSY.lock().unwrap_or_else(|p| p.into_inner());
            b.active -= 1;
            if b.active == 0 {
                if let Some(t0) = b.since.take() {
                    b.ns += t0.elapsed().as_nanos() as u64;
                }
            }
        }
    }
    {
        let mut b = KERNEL_BUSY.lock().unwrap_or_else(|p| p.into_inner());
        if b.active == 0 {
            b.since = Some(std::time::Instant::now());
        }
        b.active += 1;
    }
    let spell = Spell;
    f();
    drop(spell);
    let flops = 2 * p.rows.len() * p.m.cols * p.n;
    KERNEL_FLOPS.fetch_add(flops as u64, Ordering::Relaxed);
}

/// How activations meet the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// f32 activations everywhere (the mode the transformers oracle checks).
    #[default]
    Exact,
    /// Reduced-precision activations for the FP8/FP4 products where the CPU has kernels
    /// for them that outrun the f32 ones (`fast_products`): rounded to bf16 for
    /// `vdpbf16ps` where `bf16_products()` (relative error 2^-9 per activation); int8 per
    /// 32-column block for the FP4 expert products (see `quant`) on the NEON and portable
    /// tiers; on the x86 tiers without full-rate bf16 products, where both lose to the f32
    /// kernels, nothing: there fast computes what `Exact` does. Everything else as `Exact`.
    Fast,
    /// A measurement mode: DeepSeek's FP8 E4M3 activation round trip (blocks of 128,
    /// UE8M0 scale, `quant::fp8_act_qdq`) on the input of every FP8/FP4 product the model
    /// routes through `matmul_in`, then the exact kernels. It shows how far the activation
    /// quantization the model was trained with moves the output, the yardstick for `Fast`.
    Fp8Act,
    /// What DeepSeek's own reference inference computes (its quantization-aware-training
    /// numerics): `Fp8Act`'s activation round trip before every FP8/FP4 product, plus an
    /// FP8 round trip of the non-rope dims of every window and compressed KV entry
    /// (`quant::fp8_kv_qdq`) and a Hadamard rotation then FP4 round trip of the lightning
    /// indexer's query and keys (`hadamard::rotate`, `quant::fp4_qdq`). `wo_a`, the router,
    /// the head and the compressor projections stay unquantized, as in the reference. Its
    /// FP8/FP4 products run as `vdpbf16ps` where `bf16_products()`, exactly (`x86::bf16`).
    Official,
}

impl Numerics {
    pub const ALL: [Numerics; 4] = [
        Numerics::Exact,
        Numerics::Fast,
        Numerics::Fp8Act,
        Numerics::Official,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Numerics::Exact => "exact",
            Numerics::Fast => "fast",
            Numerics::Fp8Act => "fp8-act",
            Numerics::Official => "official",
        }
    }

    /// Whether DeepSeek's reference steps beyond the activation round trip apply
    /// (`Official`): the KV and indexer round trips, and each routed expert's weight applied
    /// before its down projection (so the round trip sees the weighted activation).
    pub fn official(self) -> bool {
        self == Numerics::Official
    }

    pub fn from_name(s: &str) -> Option<Numerics> {
        Numerics::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The names, for messages ("exact, fast or fp8-act").
    pub fn names() -> String {
        let v: Vec<&str> = Numerics::ALL.iter().map(|m| m.name()).collect();
        format!("{} or {}", v[..v.len() - 1].join(", "), v[v.len() - 1])
    }
}

/// `matmul` in the given numerics (`linear` in DeepSeek's reference `inference/model.py`
/// for `Fp8Act` and `Official`: `act_quant(x, 128, ...)` before `fp8_gemm`/`fp4_gemm`):
///
/// | numerics | FP8 / FP4 matrices, with bf16 products | without | other formats |
/// |---|---|---|---|
/// | `Exact` | f32 kernels | f32 kernels | f32 kernels |
/// | `Fast` | x rounded to bf16, `vdpbf16ps` | x86 tiers: f32 kernels; NEON, portable: FP4 int8 x per 32, FP8 f32 | f32 kernels |
/// | `Fp8Act` | x through E4M3, f32 kernels | the same | f32 kernels |
/// | `Official` | x through E4M3, `vdpbf16ps` | x through E4M3, f32 kernels | f32 kernels |
///
/// "With bf16 products" is `bf16_products()`; fast's choice is `fast_products()`.
pub fn matmul_in(
    numerics: Numerics,
    m: &MatRef,
    rows: Range<usize>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let quantized = matches!(m.w, Weights::Fp8 { .. } | Weights::Fp4 { .. });
    if !quantized || numerics == Numerics::Exact {
        return matmul(m, rows, x, n, y);
    }
    let p = check_args(m, rows, x, n, y);
    let xq = match numerics {
        Numerics::Fp8Act | Numerics::Official => {
            let mut xq = x.to_vec();
            quant::fp8_act_qdq(&mut xq, m.cols);
            Some(xq)
        }
        _ => None,
    };
    let p = Product {
        x: xq.as_deref().unwrap_or(x),
        ..p
    };
    #[cfg(target_arch = "x86_64")]
    if numerics != Numerics::Fp8Act {
        if let Some(b) = bf16_kernel() {
            return counted(&p, || run(Path::Bf16(b), p.clone(), y));
        }
    }
    let path = match (numerics, m.w) {
        (Numerics::Fast, Weights::Fp4 { .. }) if fast_products() == FastProducts::Int8 => {
            Path::Q8(active_tier())
        }
        _ => Path::F32(active_tier()),
    };
    counted(&p, || run(path, p.clone(), y))
}

/// How fast numerics multiplies FP8/FP4 matrices on this CPU (`fast_products`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastProducts {
    /// x rounded to bf16, `vdpbf16ps` (`bf16_products()`).
    Bf16,
    /// FP4: x quantized to int8 per 32-column block (`quant`); FP8: the f32 kernels.
    Int8,
    /// The f32 kernels: fast computes exactly what exact computes.
    F32,
}

impl FastProducts {
    pub fn name(self) -> &'static str {
        match self {
            FastProducts::Bf16 => "bf16",
            FastProducts::Int8 => "int8",
            FastProducts::F32 => "f32",
        }
    }
}

/// Fast numerics' products here: bf16 where `bf16_products()`; else the f32 kernels on the
/// x86 tiers, where the int8 path never beat them (AVX-512: 0.6-0.85x in prefill and at best
/// a tie in decode on Zen 4, Zen 5 and a Sapphire Rapids class Xeon; AVX2, which has no
/// integer dot product instruction: 0.8x in prefill and a tie in decode on Zen 3;
/// benches/README.md); else int8 (NEON, which has `sdot`, and portable).
/// `Tuning::fast_products` (`V4FLASH_FAST_PRODUCTS=int8` or `f32`) picks between those two
/// where bf16 products are not in use (to measure them, and to test the int8 path on x86).
pub fn fast_products() -> FastProducts {
    let forced = match Tuning::process().fast_products.as_deref() {
        Some("int8") => Some(FastProducts::Int8),
        Some("f32") => Some(FastProducts::F32),
        _ => None,
    };
    if bf16_products() {
        FastProducts::Bf16
    } else if let Some(p) = forced {
        p
    } else if matches!(active_tier(), Tier::Avx512 | Tier::Avx2) {
        FastProducts::F32
    } else {
        FastProducts::Int8
    }
}

/// The `vdpbf16ps` kernels fast and official numerics use for FP8/FP4 products: when the
/// active tier is AVX-512, the CPU has avx512_bf16 and runs it at full rate
/// (`x86::Bf16::full_rate`), decided once. `Tuning::bf16` (`V4FLASH_BF16`) `off` turns them
/// off, `on` on wherever the CPU has avx512_bf16 (to measure them, and to test them
/// on CPUs that would not pick them). See `x86::bf16` for why official loses nothing to
/// them.
#[cfg(target_arch = "x86_64")]
fn bf16_kernel() -> Option<x86::Bf16> {
    static B: OnceLock<Option<x86::Bf16>> = OnceLock::new();
    *B.get_or_init(|| {
        let env = Tuning::process().bf16;
        let (off, on) = (env == Some(false), env == Some(true));
        if off || active_tier() != Tier::Avx512 {
            return None;
        }
        x86::Bf16::detect().filter(|b| on || b.full_rate())
    })
}

/// Whether fast and official numerics multiply FP8/FP4 matrices with `vdpbf16ps` (else:
/// fast takes `fast_products()`; official the f32 kernels on its rounded activations).
pub fn bf16_products() -> bool {
    #[cfg(target_arch = "x86_64")]
    return bf16_kernel().is_some();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// The `vdpbf16ps` product of an FP8 or FP4 matrix with x rounded to bf16 (official
/// numerics applies it after the E4M3 round trip, which makes the rounding exact), for
/// tests and benches. Errors if the CPU lacks avx512_bf16 or the matrix is not FP8/FP4.
pub fn matmul_bf16(
    m: &MatRef,
    rows: Range<usize>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), String> {
    if !matches!(m.w, Weights::Fp8 { .. } | Weights::Fp4 { .. }) {
        return Err("the bf16 path is only for FP8 and FP4 matrices".into());
    }
    let p = check_args(m, rows, x, n, y);
    #[cfg(target_arch = "x86_64")]
    if let Some(b) = x86::Bf16::detect() {
        run(Path::Bf16(b), p, y);
        return Ok(());
    }
    let _ = p;
    Err("this CPU lacks avx512_bf16".into())
}

/// The arguments of a product, checked (a failure is a programming error of the caller).
fn check_args<'a>(
    m: &'a MatRef<'a>,
    rows: Range<usize>,
    x: &'a [f32],
    n: usize,
    y: &[f32],
) -> Product<'a> {
    assert!(
        rows.end <= m.rows && rows.start <= rows.end,
        "row range out of bounds"
    );
    assert_eq!(x.len(), n * m.cols, "x must be [n, cols]");
    assert_eq!(y.len(), n * rows.len(), "y must be [n, rows]");
    Product { m, rows, x, n }
}

/// The kernels a product runs on.
#[derive(Clone, Copy)]
enum Path {
    /// a tier's f32 kernels
    F32(Tier),
    /// a tier's int8 kernels of fast numerics (FP4 only)
    Q8(Tier),
    /// the `vdpbf16ps` kernels (FP8 and FP4 only)
    #[cfg(target_arch = "x86_64")]
    Bf16(x86::Bf16),
}

/// y = the product `p` (checked by `check_args`) on `path`.
fn run(path: Path, p: Product, y: &mut [f32]) {
    if p.rows.is_empty() || p.n == 0 {
        return;
    }
    match path {
        Path::F32(t) => with_kernel!(t, k => driver::matmul(k, p, y)),
        Path::Q8(t) => with_kernel!(t, k => driver::matmul_q8(k, p, y)),
        #[cfg(target_arch = "x86_64")]
        Path::Bf16(b) => x86::matmul_bf16(b, p, y),
    }
}

/// The wall time during which at least one product ran (`counted`).
struct KernelBusy {
    /// products running now
    active: u32,
    /// when the current busy spell began
    since: Option<std::time::Instant>,
    /// nanoseconds of the finished spells
    ns: u64,
}

static KERNEL_BUSY: Mutex<KernelBusy> = Mutex::new(KernelBusy {
    active: 0,
    since: None,
    ns: 0,
});
static KERNEL_FLOPS: AtomicU64 = AtomicU64::new(0);

/// Process-wide (wall nanoseconds during which `matmul` ran, flops it performed): the
/// benchmark's kernel GFLOP/s during prefill.
pub fn kernel_counters() -> (u64, u64) {
    let ns = KERNEL_BUSY.lock().unwrap_or_else(|p| p.into_inner()).ns;
    (ns, KERNEL_FLOPS.load(Ordering::Relaxed))
}

/// Ok where the CPU runs `tier` (the `*_tier` entry points, for tests and benches).
fn need(tier: Tier) -> Result<(), String> {
    if tier.available() {
        Ok(())
    } else {
        Err(format!("this CPU lacks the {} kernel tier", tier.name()))
    }
}

/// `matmul` on a given tier regardless of the override (for tests and benches).
/// Errors if the CPU lacks the tier.
pub fn matmul_tier(
    tier: Tier,
    m: &MatRef,
    rows: Range<usize>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), String> {
    need(tier)?;
    run(Path::F32(tier), check_args(m, rows, x, n, y), y);
    Ok(())
}

/// `matmul_in(Numerics::Fast, ..)` of an FP4 matrix on a given tier (for tests and
/// benches). Errors if the CPU lacks the tier or the matrix is not FP4.
pub fn matmul_q8_tier(
    tier: Tier,
    m: &MatRef,
    rows: Range<usize>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) -> Result<(), String> {
    need(tier)?;
    if !matches!(m.w, Weights::Fp4 { .. }) {
        return Err("the int8 path is only for FP4 matrices".into());
    }
    run(Path::Q8(tier), check_args(m, rows, x, n, y), y);
    Ok(())
}

/// a · b on the active tier, in its FMA lanes (one FMA chain over vector chunks, a
/// fixed-tree lane sum, then the tail): the same value for the same vectors wherever it is
/// computed on one tier (`generic::dot`; `ops::dot` is the one with the same bits on every
/// tier).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    with_kernel!(active_tier(), k => k.dot(a, b))
}

/// Attention of h heads of one query that share their keys, on the active tier: q [h, d],
/// sinks [h], out [h, d]; each head's out = Σ_j p_j · keys[j], with
/// p = softmax([q_h · keys[j] · scale]_j ++ [sink_h]) (the sink only enters the normaliser).
/// Every key holds at least d values. A head's result does not depend on h or on its place
/// among the heads.
pub fn attend(q: &[f32], keys: &[&[f32]], scale: f32, sinks: &[f32], out: &mut [f32]) {
    check_attend(q, sinks, out);
    with_kernel!(active_tier(), k => k.attend(q, keys, scale, sinks, out))
}

/// `attend` on a given tier (tests). Errors if the CPU lacks the tier.
pub fn attend_tier(
    tier: Tier,
    q: &[f32],
    keys: &[&[f32]],
    scale: f32,
    sinks: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    need(tier)?;
    check_attend(q, sinks, out);
    with_kernel!(tier, k => k.attend(q, keys, scale, sinks, out));
    Ok(())
}

fn check_attend(q: &[f32], sinks: &[f32], out: &mut [f32]) {
    assert!(
        !sinks.is_empty() && q.len() == out.len() && q.len().is_multiple_of(sinks.len()),
        "attend: q and out must be [h, d] for h = sinks.len()"
    );
}

/// Benchmark support: runs a register-only multiply-add loop on `tier` and returns
/// (a value to keep the loop alive, f32 flops performed), or None if the CPU lacks the tier.
/// The ratio flops / time is the tier's arithmetic peak on one thread.
pub fn fma_probe(tier: Tier, iters: usize) -> Option<(f32, u64)> {
    need(tier).ok()?;
    Some(with_kernel!(tier, k => k.fma_probe(iters)))
}

/// y[rows] = W x.
pub fn matvec(m: &MatRef, x: &[f32], y: &mut [f32]) {
    matmul(m, 0..m.rows, x, 1, y)
}

/// The kernel tier in use (decided once).
pub fn tier_name() -> &'static str {
    active_tier().name()
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_bf16;
#[cfg(test)]
mod tests_fast;
