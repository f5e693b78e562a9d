//! x86_64 tiers: each supplies its intrinsics as a `Simd` implementation on a zero-sized
//! proof that its CPU features were detected; the loops are in `generic`.

mod avx2;
mod avx512;
mod bf16;
mod cpu;
mod fp4_loops;
mod fp8_loops;
mod int8;
mod lanes;

pub(crate) use avx2::Avx2;
pub(crate) use avx512::Avx512;
pub(crate) use bf16::matmul as matmul_bf16;
pub(crate) use bf16::Bf16;
