//! The AVX2 tier's FP4 passes over 4 rows x 1 token (the one-token pass), 2 rows x 4 or 3
//! tokens and 3 rows x 2 tokens (`generic::rows_xt` through `Simd::fp4_loop`) as whole
//! loops in inline assembly.
//!
//! Why assembly: with 16 vector registers these shapes need nearly every one (the
//! accumulators, each row's decoded group as two halves of 16-bit words, the decode's
//! temporaries and one chunk of x), and LLVM does not fit them. In a 2 x 4 pass it kept the
//! four decoded chunks of each row, spilled an accumulator to the stack (so one FMA chain
//! waited on a store and a reload every group) and copied the other accumulators between
//! registers at the loop's back edge. The loop overhead (scale lookups, pointer arithmetic,
//! the read-ahead's index) was also about a fifth of a group's instructions, and a group is
//! bound by how fast the core takes instructions in as much as by the FMA pipes. Here a
//! group costs its decode, its FMAs, one load per chunk of x and token, and a few pointer
//! and counter instructions.
//!
//! Measured on Zen 4 (`kernels_ab`, one thread; benches/README.md, "FP4 passes as assembly
//! loops"): share of the FMA peak, compiled -> assembly, 2 tokens 53 -> 56-57 %, 3 tokens
//! 63-64 -> 64-66 %, 4 tokens 58-59 -> 72-73 %; one token 10.9-11.2 -> 12.0-12.1 GB/s.
//!
//! Every instruction below does what `Avx2::fp4` and `rows_xt`'s chunk-by-chunk path do,
//! in the same order per (row, token) chain: chunks 0 to 3 of each group, groups in order.
//! So every output bit is the same as the compiled path's (the kernel tests compare every
//! tier with the portable one, and n tokens with one at a time).

use super::super::generic::Fp4Loop;
use std::arch::asm;
use std::arch::x86_64::__m256;

/// The decode's constants, 32 bytes each: the nibble shifts (low nibbles in the low 128-bit
/// half, high nibbles in the high one), the nibble mask, the mask that keeps an odd 16-bit
/// word at the top of its 32-bit lane.
#[repr(C, align(32))]
struct Consts([u32; 24]);

static K: Consts = Consts([
    0,
    0,
    0,
    0,
    4,
    4,
    4,
    4,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0x0F0F_0F0F,
    0xFFFF_0000,
    0xFFFF_0000,
    0xFFFF_0000,
    0xFFFF_0000,
    0xFFFF_0000,
    0xFFFF_0000,
    0xFFFF_0000,
    0xFFFF_0000,
]);

/// One row's group: the scale byte at `$s` picks its table (`{tab}` + 32 x byte, the high
/// bytes then the low bytes of the 16 scaled E2M1 values), the 16 packed bytes at `$q`
/// become nibble indices, `vpshufb` looks up both bytes, and the bytes interleaved give
/// the group's two halves of 16-bit words (`Avx2::fp4` before its last step) in `$lo`, `$hi`.
macro_rules! decode {
    ($q:literal, $s:literal, $lo:literal, $hi:literal) => {
        concat!(
            "movzx {ta:e}, byte ptr [",
            $s,
            "]\n",
            "shl {ta:e}, 5\n",
            "add {ta}, {tab}\n",
            "vbroadcasti128 {a}, xmmword ptr [",
            $q,
            "]\n",
            "vpsrlvd {a}, {a}, ymmword ptr [rip + {k}]\n",
            "vpand {a}, {a}, ymmword ptr [rip + {k} + 32]\n",
            "vbroadcasti128 {b}, xmmword ptr [{ta}]\n",
            "vpshufb {b}, {b}, {a}\n",
            "vbroadcasti128 {c}, xmmword ptr [{ta} + 16]\n",
            "vpshufb {c}, {c}, {a}\n",
            "vpunpcklbw {",
            $lo,
            "}, {c}, {b}\n",
            "vpunpckhbw {",
            $hi,
            "}, {c}, {b}\n",
        )
    };
}

/// An even chunk (0 or 2) from its half: the even words moved to the top of each lane.
macro_rules! even {
    ($w:literal, $half:literal) => {
        concat!("vpslld {", $w, "}, {", $half, "}, 16\n")
    };
}

/// An odd chunk (1 or 3) from its half: the odd words, already at the top, kept.
macro_rules! odd {
    ($w:literal, $half:literal) => {
        concat!(
            "vpand {",
            $w,
            "}, {",
            $half,
            "}, ymmword ptr [rip + {k} + 64]\n"
        )
    };
}

/// One token's chunk of x at `[$x + $off]` loaded once and multiplied into each row's
/// accumulator for that token: `$( $acc += $w * x )`.
macro_rules! token {
    ($x:literal, $off:literal $(, $acc:literal, $w:literal)+) => {
        concat!(
            "vmovups {c}, ymmword ptr [", $x, " + ", $off, "]\n",
            $("vfmadd231ps {", $acc, "}, {", $w, "}, {c}\n",)+
        )
    };
}

/// More rows' FMAs with the chunk of x `token!` loaded last (in `{c}`).
macro_rules! fma {
    ($($acc:literal, $w:literal),+) => {
        concat!($("vfmadd231ps {", $acc, "}, {", $w, "}, {c}\n",)+)
    };
}

/// One chunk of a 4 x 1 loop: `$op` (`even!` or `odd!`) forms each row's chunk from its
/// half (`$h0`..`$h3`), and the chunk of x at `$off` goes into the 4 rows' accumulators.
macro_rules! chunk_4x1 {
    ($op:ident, $h0:literal, $h1:literal, $h2:literal, $h3:literal, $off:literal) => {
        concat!(
            $op!("a", $h0),
            $op!("b", $h1),
            token!("{x}", $off, "s00", "a", "s10", "b"),
            $op!("a", $h2),
            $op!("b", $h3),
            fma!("s20", "a", "s30", "b"),
        )
    };
}

/// One chunk of a 2-row loop: the 2 rows' chunks from their halves, then each token's chunk
/// of x (at `$x` + `$off`) into both rows' accumulators for that token (`$a0`, `$a1`).
macro_rules! chunk_2rows {
    ($op:ident, $h0:literal, $h1:literal, $off:literal, $([$x:literal, $a0:literal, $a1:literal]),+) => {
        concat!(
            $op!("a", $h0),
            $op!("b", $h1),
            $(token!($x, $off, $a0, "a", $a1, "b"),)+
        )
    };
}

/// One chunk of a 3 x 2 loop (as `chunk_2rows`, 3 rows and 2 tokens).
macro_rules! chunk_3x2 {
    ($op:ident, $h0:literal, $h1:literal, $h2:literal, $off:literal) => {
        concat!(
            $op!("a", $h0),
            $op!("b", $h1),
            $op!("w", $h2),
            token!("{x}", $off, "s00", "a", "s10", "b", "s20", "w"),
            token!("{x} + {xs}", $off, "s01", "a", "s11", "b", "s21", "w"),
        )
    };
}

/// One group of a 2-row loop: both rows decoded (halves `h`, `g`), its four chunks
/// (`chunk_2rows!` with the tokens' x and accumulators `$t`), then `next_group!`.
macro_rules! group_2rows {
    ($($t:tt),+) => {
        concat!(
            decode!("{q}", "{s}", "h0", "g0"),
            decode!("{q} + {rb}", "{s} + {nb}", "h1", "g1"),
            chunk_2rows!(even, "h0", "h1", "0", $($t),+),
            chunk_2rows!(odd, "h0", "h1", "32", $($t),+),
            chunk_2rows!(even, "g0", "g1", "64", $($t),+),
            chunk_2rows!(odd, "g0", "g1", "96", $($t),+),
            next_group!("2"),
        )
    };
}

/// The loop's tail: every pointer moves one group on, the read-ahead one group of the R
/// rows after these.
macro_rules! next_group {
    ($rows:literal) => {
        concat!(
            "add {q}, 16\n",
            "add {s}, 1\n",
            "add {pn}, ",
            $rows,
            " * 16\n",
            "add {x}, 128\n",
        )
    };
}

/// One loop's `asm!`: the read-ahead hint `$pf` on `{pn}` (the group `$rows` rows on), the
/// loop body `$body` (decode, chunks, `next_group!`), the count down, and the operands every
/// loop shares (`Fp4Loop` `$p`'s pointers and strides, the scratch registers `a`, `b`, `c`
/// and rows 0 and 1's halves) before the loop's own (`$own`: more rows' halves, the
/// accumulators, extra pointers).
macro_rules! fp4_asm {
    ($pf:literal, $p:ident, $rows:literal, [$($body:expr),+ $(,)?], $($own:tt)*) => {
        asm!(
            "2:",
            concat!($pf, " [{pn}]"),
            $($body,)+
            "dec {n}",
            "jnz 2b",
            q = inout(reg) $p.q => _,
            rb = in(reg) $p.rb,
            s = inout(reg) $p.scale => _,
            nb = in(reg) $p.nb,
            tab = in(reg) $p.tables,
            x = inout(reg) $p.x => _,
            pn = inout(reg) $p.q.wrapping_add($rows * $p.rb) => _,
            n = inout(reg) $p.groups => _,
            ta = out(reg) _,
            k = sym K,
            a = out(ymm_reg) _,
            b = out(ymm_reg) _,
            c = out(ymm_reg) _,
            h0 = out(ymm_reg) _,
            g0 = out(ymm_reg) _,
            h1 = out(ymm_reg) _,
            g1 = out(ymm_reg) _,
            $($own)*
            options(nostack, readonly),
        )
    };
}

/// One pass as a function `$name($p)` over R = `$rows` rows and the T tokens of `$acc` (its
/// R x T accumulators, row by row, as `acc`: `[__m256; $n]`): the loop `fp4_asm!` builds from
/// `$body`, with the loop's own operands `$own` (which name `$p`) and then the accumulators.
macro_rules! pass {
    ($(#[$doc:meta])* $name:ident($p:ident), $pf:literal, $rows:literal,
     [$($acc:ident),+; $n:literal], [$($body:expr),+ $(,)?], $($own:tt)*) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has AVX2 and FMA; `p` holds what `Fp4Loop` says for these rows and tokens
        /// (every group's bytes, scale bytes, tables and x readable), and `p.groups` >= 1.
        #[target_feature(enable = "avx2,fma")]
        pub(super) unsafe fn $name($p: Fp4Loop<__m256>, acc: &mut [__m256; $n]) {
            let [$(mut $acc),+] = *acc;
            // SAFETY: the caller's contract: every group's reads lie where `Fp4Loop` says (row
            // r at q + r rb, its scales at s + r nb, the tokens xs apart); the read-ahead may
            // point anywhere (a prefetch never faults). The block writes no memory and leaves
            // the stack alone; the loop runs `groups` >= 1 times.
            unsafe {
                fp4_asm!($pf, $p, $rows, [$($body),+], $($own)* $($acc = inout(ymm_reg) $acc,)+);
            }
            *acc = [$($acc),+];
        }
    };
}

/// The four loops for one read-ahead hint (`$pf`: `prefetcht0` or `prefetcht1`, as
/// `cpu::Prefetch` picks for this CPU).
macro_rules! loops {
    ($pf:literal, $r4t1:ident, $r2t4:ident, $r2t3:ident, $r3t2:ident) => {
        pass!(
            /// 4 rows x 1 token (the one-token pass); rows 2 and 3 at q2 = q + 2 rb and q2 + rb,
            /// their scales at s2 = s + 2 nb and s2 + nb.
            $r4t1(p), $pf, 4, [s00, s10, s20, s30; 4],
            [
                decode!("{q}", "{s}", "h0", "g0"),
                decode!("{q} + {rb}", "{s} + {nb}", "h1", "g1"),
                decode!("{q2}", "{s2}", "h2", "g2"),
                decode!("{q2} + {rb}", "{s2} + {nb}", "h3", "g3"),
                chunk_4x1!(even, "h0", "h1", "h2", "h3", "0"),
                chunk_4x1!(odd, "h0", "h1", "h2", "h3", "32"),
                chunk_4x1!(even, "g0", "g1", "g2", "g3", "64"),
                chunk_4x1!(odd, "g0", "g1", "g2", "g3", "96"),
                next_group!("4"),
                "add {q2}, 16",
                "add {s2}, 1",
            ],
            q2 = inout(reg) p.q.wrapping_add(2 * p.rb) => _,
            s2 = inout(reg) p.scale.wrapping_add(2 * p.nb) => _,
            h2 = out(ymm_reg) _,
            g2 = out(ymm_reg) _,
            h3 = out(ymm_reg) _,
            g3 = out(ymm_reg) _,
        );
        pass!(
            /// 2 rows x 4 tokens.
            $r2t4(p), $pf, 2, [s00, s01, s02, s03, s10, s11, s12, s13; 8],
            [
                group_2rows!(
                    ["{x}", "s00", "s10"],
                    ["{x} + {xs}", "s01", "s11"],
                    ["{x} + {xs}*2", "s02", "s12"],
                    ["{x3}", "s03", "s13"]
                ),
                "add {x3}, 128",
            ],
            x3 = inout(reg) p.x.wrapping_add(3 * p.xs) => _,
            xs = in(reg) p.xs * 4,
        );
        pass!(
            /// 2 rows x 3 tokens.
            $r2t3(p), $pf, 2, [s00, s01, s02, s10, s11, s12; 6],
            [group_2rows!(
                ["{x}", "s00", "s10"],
                ["{x} + {xs}", "s01", "s11"],
                ["{x} + {xs}*2", "s02", "s12"]
            )],
            xs = in(reg) p.xs * 4,
        );
        pass!(
            /// 3 rows x 2 tokens; row 2 at q + 2 rb, its scales at s + 2 nb.
            $r3t2(p), $pf, 3, [s00, s01, s10, s11, s20, s21; 6],
            [
                decode!("{q}", "{s}", "h0", "g0"),
                decode!("{q} + {rb}", "{s} + {nb}", "h1", "g1"),
                decode!("{q} + {rb}*2", "{s} + {nb}*2", "h2", "g2"),
                chunk_3x2!(even, "h0", "h1", "h2", "0"),
                chunk_3x2!(odd, "h0", "h1", "h2", "32"),
                chunk_3x2!(even, "g0", "g1", "g2", "64"),
                chunk_3x2!(odd, "g0", "g1", "g2", "96"),
                next_group!("3"),
            ],
            xs = in(reg) p.xs * 4,
            w = out(ymm_reg) _,
            h2 = out(ymm_reg) _,
            g2 = out(ymm_reg) _,
        );
    };
}

loops!("prefetcht0", r4t1_l1, r2t4_l1, r2t3_l1, r3t2_l1);
loops!("prefetcht1", r4t1_l2, r2t4_l2, r2t3_l2, r3t2_l2);
