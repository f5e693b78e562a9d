//! The x86 tiers' rules on this CPU: its vendor and family (read once), and what they decide
//! (where the one-token read-ahead goes, whether the FP8 loops take the weights as their bits,
//! whether the prefill tile reads the next tile's x ahead). A rule never changes a result,
//! only the speed.

use crate::tuning::Tuning;
use std::arch::x86_64::__cpuid;

/// The CPU's vendor string (CPUID leaf 0: EBX, EDX, ECX), read once per process: the
/// kernels build their tier's proof on every call (`with_kernel!`), and CPUID is slow (a VM
/// exit under a hypervisor: read per call it took 98 % of an 8,192-token prefill's samples,
/// in the attention's `dot`).
pub(crate) fn cpu_vendor() -> [u8; 12] {
    static VENDOR: std::sync::OnceLock<[u8; 12]> = std::sync::OnceLock::new();
    *VENDOR.get_or_init(|| {
        // SAFETY: CPUID leaf 0 exists on every x86_64 CPU and only reads identification
        // registers (the intrinsic is a safe fn on newer toolchains, hence the allow).
        #[allow(unused_unsafe)]
        let r = unsafe { __cpuid(0) };
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        v
    })
}

/// The CPU's family (CPUID leaf 1: the base family, plus the extended family where the base
/// is 0xF), read once per process (see `cpu_vendor`).
pub(crate) fn cpu_family() -> u32 {
    static FAMILY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *FAMILY.get_or_init(|| {
        // SAFETY: as in `cpu_vendor`; leaf 1 exists on every x86_64 CPU.
        #[allow(unused_unsafe)]
        let eax = unsafe { __cpuid(1) }.eax;
        let base = (eax >> 8) & 0xF;
        if base == 0xF {
            base + ((eax >> 20) & 0xFF)
        } else {
            base
        }
    })
}

/// Whether the one-token and fused FP8 loops take the weights as their bits
/// (`Simd::fp8_bits`: e4m3 * 2^-120, so e4m3 subnormals become f32 denormals) rather than
/// through f16 (`Simd::fp8`, no denormals); either route gives the same products, hence the
/// same bits. A fixed rule on the CPU, decided once; `Tuning::fp8_bits` (`V4FLASH_FP8_BITS`)
/// overrides it (to measure, and to test both routes on one machine). Measured
/// (benches/README.md):
/// - AMD (Zen 3, Zen 4) multiplies denormals at full speed, and the bits route is the
///   faster decode (Zen 4, one core, FP8 1024x4096, one token: 25 -> 29-31 GFLOP/s).
/// - An Emerald Rapids Xeon takes a microcode assist for every multiply with a denormal
///   input: a one-token FP8 matvec over weights with subnormals (one in 16 bytes) read
///   0.5-0.7 GB/s with the bits against 10-14 GB/s through f16.
///
/// Hence the bits on AMD only; other vendors are untested and take the f16 route, which is
/// never slow.
pub(crate) fn fp8_bits() -> bool {
    static B: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *B.get_or_init(|| Tuning::process().fp8_bits.unwrap_or_else(amd))
}

/// Whether the prefill micro-kernel (`generic::gemm`) prefetches the next token tile's x
/// into L1 while it computes the current one (`Simd::gemm_x_ahead`). A fixed rule on the
/// CPU, decided once; `Tuning::gemm_x_ahead` (`V4FLASH_GEMM_X_AHEAD`) overrides it. A prefetch never
/// changes a result. Measured (benches/README.md): on an Emerald Rapids Xeon (2 MiB L2, a
/// mesh L3) the x of a 128-token block of 4,096 or 8,192 columns comes from L3, and the tile
/// waits on it. Whole 2,048-token prefills there, off -> on in alternating pairs: AVX-512
/// kernels 4.5 % faster (median of 8 pairs; 6 faster), prefill 37.3 -> 39.6 tok/s; AVX2
/// kernels 81 -> 85 GFLOP/s (3 pairs, all faster). On Zen 4 (1 MiB L2, 32 MiB L3) it tied:
/// `kernels_ab prefill` FP8 4096x4096 at 256 tokens and FP4 2048x4096 at 128, 3 alternating
/// pairs each within the noise; so AMD keeps the loop without it.
pub(crate) fn gemm_x_ahead() -> bool {
    static B: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *B.get_or_init(|| Tuning::process().gemm_x_ahead.unwrap_or_else(|| !amd()))
}

/// Brings the line at `p` into L1 (`prefetcht0`).
///
/// # Safety
/// As `Prefetch::line`: SSE (baseline on x86_64); any address, never a fault.
#[inline(always)]
pub(crate) unsafe fn prefetch_l1(p: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: the caller's contract.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast()) }
}

/// Where a tier's one-token read-ahead of the next block of rows goes
/// (`generic::prefetch_next`): into L1 (`prefetcht0`) or into L2 only (`prefetcht1`). A fixed
/// rule on the CPU, decided once; a prefetch never changes a result. Measured
/// (benches/README.md):
/// - On Zen 4 (32 KiB L1d: the 8 rows streaming through L1 evict a long x), `t1` wins on
///   both tiers. AVX-512: FP8 `wo_b` at 80-82 % of the streaming read against 50-56 %, the
///   BF16 head at 90-91 % against 69-76 %, whole runs decoding 14-17 % faster. AVX2 (quiet
///   hour, session 28): decode compute per token 80 -> 58 ms, lower in every round.
/// - On a Sapphire Rapids class Xeon, `t1` read the BF16 head 13-23 % faster on AVX-512
///   (whole runs decoding 4-11 % faster), but made AVX2 whole runs decode 3-4 % slower.
/// - Zen 5 (48 KiB L1d) was tuned with `t0`; `t1` was never measured there.
///
/// Hence AVX-512 takes `t1` everywhere except AMD family 0x1A and later, and AVX2 takes `t1`
/// on AMD before family 0x1A (Zen 1-4, all with 32 KiB L1d; Zen 1-3 unmeasured) and `t0`
/// elsewhere.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch {
    /// `prefetcht1` (else `prefetcht0`)
    pub(super) l2: bool,
}

/// Whether the CPU is AMD's (the vendor is read once per process, `cpu_vendor`).
pub(crate) fn amd() -> bool {
    cpu_vendor() == *b"AuthenticAMD"
}

/// Whether the CPU is AMD Zen 5 or later (family 0x1A+).
fn amd_zen5_or_later() -> bool {
    amd() && cpu_family() >= 0x1A
}

impl Prefetch {
    /// The AVX-512 tier's rule: L2 except on AMD Zen 5 and later.
    pub(crate) fn avx512() -> Self {
        Prefetch {
            l2: !amd_zen5_or_later(),
        }
    }

    /// The AVX2 tier's rule: L2 on AMD before Zen 5, L1 elsewhere.
    pub(crate) fn avx2() -> Self {
        Prefetch {
            l2: amd() && !amd_zen5_or_later(),
        }
    }

    /// The hint for the line at `p`.
    ///
    /// # Safety
    /// The CPU has SSE (every x86_64 CPU does); any address is allowed: a prefetch reads
    /// nothing architecturally and never faults.
    #[inline(always)]
    pub(crate) unsafe fn line(self, p: *const u8) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        // SAFETY: the caller's contract (SSE is baseline on x86_64).
        unsafe {
            if self.l2 {
                _mm_prefetch::<_MM_HINT_T1>(p.cast());
            } else {
                _mm_prefetch::<_MM_HINT_T0>(p.cast());
            }
        }
    }
}

/// The rules an x86 tier follows on this CPU, decided once (its `detect` reads them): where the
/// one-token read-ahead goes, whether the FP8 loops take the weights as their bits
/// (`fp8_bits`), whether `gemm` reads the next token tile's x ahead (`gemm_x_ahead`).
#[derive(Clone, Copy)]
pub(crate) struct Rules {
    pub(super) pf: Prefetch,
    pub(super) fp8_bits: bool,
    pub(super) x_ahead: bool,
}

impl Rules {
    /// The rules of a tier whose read-ahead goes where `pf` says.
    pub(crate) fn new(pf: Prefetch) -> Rules {
        Rules {
            pf,
            fp8_bits: fp8_bits(),
            x_ahead: gemm_x_ahead(),
        }
    }
}

/// The `Simd` methods an x86 tier (a proof type whose field 0 is its `Rules`) answers from its
/// rules, written once for both tiers: inside their `impl Simd`.
macro_rules! rules_methods {
    () => {
        /// Only where `cpu::fp8_bits` says so.
        #[inline(always)]
        fn fp8_bits_on(self) -> bool {
            self.0.fp8_bits
        }

        #[inline(always)]
        fn prefetch(self, p: *const u8) {
            // SAFETY: see the impl; a prefetch reads nothing architecturally and never
            // faults, whatever the address (`Prefetch::line` picks the level).
            unsafe { self.0.pf.line(p) }
        }

        #[inline(always)]
        fn gemm_x_ahead(self) -> bool {
            self.0.x_ahead
        }

        #[inline(always)]
        fn prefetch_x(self, p: *const u8) {
            // SAFETY: see the impl; any address (`prefetch_l1`).
            unsafe { $crate::kernels::x86::cpu::prefetch_l1(p) }
        }
    };
}
pub(crate) use rules_methods;
