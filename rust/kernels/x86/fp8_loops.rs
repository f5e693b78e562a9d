//! The AVX2 tier's one-token FP8 pass over 8 rows (`generic::fp8_steps` with the weights as
//! their bits, through `Simd::fp8_bits_loop`) as a whole loop in inline assembly.
//!
//! Why assembly: 8 accumulators, the two chunks of x of a step, two decoded chunks and the
//! mask fit in 16 registers, but the compiled loop kept three of the accumulators on the
//! stack, so each of those FMA chains waited on a store and a reload every step. This is
//! the product of every dense FP8 matrix in a decode step, most of the bytes it reads.
//!
//! Measured on Zen 4 (`kernels_ab decode fp8`; benches/README.md, "FP4 passes as assembly
//! loops"): one thread from a 4 MiB ring, 4096 x 4096, two builds 17.6-18.2 -> 19.1-21.4
//! GB/s and 16.7-19.2 -> 17.2-21.2; two threads from DRAM, medians of four, 31.9 -> 32.7
//! GB/s against a 36-38 GB/s stream (`wq_b`, 32768 x 1024: 28.5 -> 29.5). Two cores are
//! near the memory's speed either way, so a decode step did not change (within the noise).
//!
//! Each step does what `Avx2::fp8_bits_pair` and `fp8_steps` do: per row, two chunks of 8
//! bytes sign-extended to 32 bits, shifted left by 20 and masked (`Avx2::fp8_bits`), then
//! multiplied into the row's accumulator in chunk order. So every output bit is the same
//! as the compiled path's.

use super::super::generic::Fp8Loop;
use std::arch::asm;
use std::arch::x86_64::__m256;

/// The mask that keeps an e4m3 byte's sign (bit 31) and its exponent and mantissa (bits
/// 26-20) once the byte, sign-extended, is shifted left by 20.
static MASK: u32 = 0x87F0_0000;

/// One row's step: the 16 bytes at `$q` as two chunks, each multiplied into `$acc` with its
/// chunk of x (`{x0}`, `{x1}`).
macro_rules! row {
    ($q:literal, $acc:literal) => {
        concat!(
            "vpmovsxbd {t0}, qword ptr [",
            $q,
            "]\n",
            "vpmovsxbd {t1}, qword ptr [",
            $q,
            " + 8]\n",
            "vpslld {t0}, {t0}, 20\n",
            "vpand {t0}, {t0}, {m}\n",
            "vfmadd231ps {",
            $acc,
            "}, {t0}, {x0}\n",
            "vpslld {t1}, {t1}, 20\n",
            "vpand {t1}, {t1}, {m}\n",
            "vfmadd231ps {",
            $acc,
            "}, {t1}, {x1}\n",
        )
    };
}

/// The loop for one read-ahead hint (`$pf`: `prefetcht0` or `prefetcht1`, as
/// `cpu::Prefetch` picks for this CPU).
macro_rules! loop8 {
    ($pf:literal, $name:ident) => {
        /// 8 rows x 1 token, `p.pairs` steps of two chunks; `acc` = the 8 rows'.
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA; `p` holds what `Fp8Loop` says for 8 rows, and
        /// `p.pairs` >= 1.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn $name(p: Fp8Loop, acc: &mut [__m256; 8]) {
            let [mut s0, mut s1, mut s2, mut s3, mut s4, mut s5, mut s6, mut s7] = *acc;
            // SAFETY: the caller's contract: row k's step i reads 16 bytes at q + k cols + 16 i
            // and x's 16 f32 at 16 i, all inside what `Fp8Loop` says is readable; the
            // read-ahead (the next 8 rows, 128 bytes a step) may point anywhere, as a
            // prefetch never faults. The block writes no memory and leaves the stack alone;
            // the loop runs `pairs` >= 1 times.
            unsafe {
                asm!(
                    "vpbroadcastd {m}, dword ptr [rip + {mask}]",
                    "2:",
                    concat!($pf, " [{pn}]"),
                    concat!($pf, " [{pn} + 64]"),
                    "vmovups {x0}, ymmword ptr [{x}]",
                    "vmovups {x1}, ymmword ptr [{x} + 32]",
                    row!("{q}", "r0"),
                    row!("{q} + {c}", "r1"),
                    row!("{q} + {c}*2", "r2"),
                    row!("{q3}", "r3"),
                    row!("{q} + {c}*4", "r4"),
                    row!("{q5}", "r5"),
                    row!("{q5} + {c}", "r6"),
                    row!("{q5} + {c}*2", "r7"),
                    "add {q}, 16",
                    "add {q3}, 16",
                    "add {q5}, 16",
                    "add {x}, 64",
                    "add {pn}, 128",
                    "dec {n}",
                    "jnz 2b",
                    q = inout(reg) p.q => _,
                    q3 = inout(reg) p.q.wrapping_add(3 * p.cols) => _,
                    q5 = inout(reg) p.q.wrapping_add(5 * p.cols) => _,
                    c = in(reg) p.cols,
                    x = inout(reg) p.x => _,
                    pn = inout(reg) p.q.wrapping_add(8 * p.cols) => _,
                    n = inout(reg) p.pairs => _,
                    mask = sym MASK,
                    m = out(ymm_reg) _,
                    t0 = out(ymm_reg) _,
                    t1 = out(ymm_reg) _,
                    x0 = out(ymm_reg) _,
                    x1 = out(ymm_reg) _,
                    r0 = inout(ymm_reg) s0,
                    r1 = inout(ymm_reg) s1,
                    r2 = inout(ymm_reg) s2,
                    r3 = inout(ymm_reg) s3,
                    r4 = inout(ymm_reg) s4,
                    r5 = inout(ymm_reg) s5,
                    r6 = inout(ymm_reg) s6,
                    r7 = inout(ymm_reg) s7,
                    options(nostack, readonly),
                );
            }
            *acc = [s0, s1, s2, s3, s4, s5, s6, s7];
        }
    };
}

loop8!("prefetcht0", r8_l1);
loop8!("prefetcht1", r8_l2);
