//! The kernel loops, written once for every tier over the `Simd` vector operations.
//!
//! A tier supplies only its intrinsics: a zero-sized proof type (created by the tier's
//! `detect`, so holding one means the CPU has the features) implements `Simd`, and
//! `simd_kernel!` turns it into a `Kernel` whose methods each enter one `#[target_feature]`
//! function. The loops here and the tier's
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
//!
//! The files, by concern:
//! - `simd`: the `Simd` trait (a tier's operations, its constants, the `unsafe` contract);
//! - `kernel`: the `Kernel` trait the driver calls, and `simd_kernel!`, which implements it;
//! - `decode`: what the row loops share (one chunk of a row decoded, the read-ahead);
//! - `fused`: few tokens, each weight decoded once into registers (`dot_xt`);
//! - `gemm`: the prefill path, decoded panels and register tiles (`gemm`);
//! - `attend`: the f32 dot products and the attention heads;
//! - `q8`: fast numerics' int8 FP4 products.

mod attend;
mod decode;
mod fused;
mod gemm;
mod kernel;
mod q8;
mod simd;

pub use attend::softmax;
pub(crate) use attend::{attend, dot, dot16, fma_probe};
// only the x86 tiers use these outside `generic` (`x86::bf16`, `x86::fp4_loops`, ...)
#[cfg(target_arch = "x86_64")]
pub(crate) use decode::prefetch_next;
pub(crate) use fused::dot_xt;
pub(crate) use gemm::{gemm, panel_stride};
pub(crate) use kernel::{entry, simd_kernel, Int8, Kernel, Tokens};
pub(crate) use q8::{decode_q8, dot_q8_x1, gemm_q8};
pub(crate) use simd::Simd;
#[cfg(target_arch = "x86_64")]
pub(crate) use simd::{Fp4Loop, Fp8Loop};
