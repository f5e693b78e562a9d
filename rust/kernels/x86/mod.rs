//! x86_64 tiers. Each tier type is a zero-sized proof that its CPU features were detected.

mod avx2;
mod avx512;

pub(crate) use avx2::{fma_probe as fma_probe_avx2, Avx2};
pub(crate) use avx512::{fma_probe as fma_probe_avx512, Avx512};
