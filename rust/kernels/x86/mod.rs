//! x86_64 tiers: each supplies its intrinsics as a `Simd` implementation on a zero-sized
//! proof that its CPU features were detected; the loops are in `generic`.

mod avx2;
mod avx512;
mod bf16;
mod dot16;
mod int8;

pub(crate) use avx2::Avx2;
pub(crate) use avx512::Avx512;
pub(crate) use bf16::matmul as matmul_bf16;
pub(crate) use bf16::Bf16;
pub(crate) use dot16::{dot16_avx2, dot16_avx512};

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

/// Where the AVX-512 tier's one-token read-ahead of the next block of rows goes
/// (`generic::prefetch_next`): into L1 (`prefetcht0`) on AMD Zen 5 and later (CPU family
/// 0x1A+), into L2 only (`prefetcht1`) everywhere else. A fixed rule on the CPU, decided
/// once; a prefetch never changes a result. Measured (benches/README.md): on a Sapphire
/// Rapids class Xeon, `t1` read the BF16 head 13-23 % faster than `t0` (FP8 and FP4, bound
/// by their decode there, moved by neither) and whole runs decoded 4-11 % faster; on Zen 4
/// (32 KiB L1d: the 8 rows streaming through L1 evict an 8,192-column x) `t1` read FP8
/// `wo_b` at 80-82 % of the streaming read against 50-56 % and the BF16 head at 90-91 %
/// against 69-76 %, and whole runs decoded 14-17 % faster; `t0` is what Zen 5 (48 KiB L1d)
/// was tuned with. The AVX2 tier keeps `t0`: there `t1` made whole runs decode 3-4 % slower
/// on the Xeon.
#[derive(Clone, Copy)]
pub(crate) struct Prefetch {
    l2: bool,
}

impl Prefetch {
    pub(crate) fn detect() -> Self {
        static L2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let l2 = *L2.get_or_init(|| !(cpu_vendor() == *b"AuthenticAMD" && cpu_family() >= 0x1A));
        Prefetch { l2 }
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
