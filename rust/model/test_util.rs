//! What the model's test files share: a fixture loaded in a numerics mode, and deterministic
//! token ids.

use super::session::State;
use super::{LoadOptions, Model};
use crate::kernels::Numerics;
use std::path::Path;

/// Never cancels.
pub const NO: fn() -> bool = || false;

/// Fixture `name` (`fixtures/<name>`) in `numerics`, on `threads` threads (None: the default).
pub fn load_fixture(name: &str, numerics: Numerics, threads: Option<usize>) -> Model {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(name);
    let opts = LoadOptions {
        threads: threads.and_then(std::num::NonZeroUsize::new),
        numerics,
        ..LoadOptions::default()
    };
    Model::load(&dir, &opts).expect("the fixture loads")
}

/// Deterministic ids in 2..vocab for sequence `seed` (xorshift).
pub fn ids(m: &Model, seed: u64, n: usize) -> Vec<u32> {
    let v = m.cfg.vocab_size as u64 - 2;
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (2 + s % v) as u32
        })
        .collect()
}

/// A state's tokens, and every f32 of it (windows, compressor and indexer buffers and
/// entries) as bits.
pub type StateBits = (Vec<u32>, Vec<Vec<u32>>);

/// `StateBits` of `st`.
pub fn bits(st: &State) -> StateBits {
    let v = st.view();
    let arrays = v
        .layers
        .iter()
        .flat_map(|l| l.arrays())
        .map(|a| a.iter().map(|x| x.to_bits()).collect())
        .collect();
    (v.tokens.to_vec(), arrays)
}
