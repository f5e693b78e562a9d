//! aarch64 tiers: NEON (every aarch64 CPU) and NEON + `dotprod` (the `sdot` instruction for
//! the int8 path of fast numerics). Both are the same `Simd` implementation (`neon`),
//! differing only in the int8 block dot product (`int8`); the loops are in `generic`.

mod int8;
mod neon;

pub(crate) use neon::{Neon, NeonDot};
