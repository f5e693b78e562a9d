//! What both kernel benchmarks need: random matrices in the checkpoint's weight formats.
//! (A folder with `mod.rs`, so cargo does not take it for a bench target of its own.)

use _core::kernels::{MatRef, Weights};

struct Rng(u64);
impl Rng {
    fn byte(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u8
    }
}

/// A weight format of the checkpoint.
#[derive(Clone, Copy, PartialEq)]
pub enum Kind {
    Fp8,
    Fp4,
    Bf16,
}

/// One matrix's storage: q (or bf16 bytes) and scale.
pub struct Owned {
    pub q: Vec<u8>,
    pub s: Vec<u8>,
}

/// A random [rows, cols] matrix in `kind`'s storage (FP8 never 0x7F/0xFF, scales 2^-7..2^0).
pub fn make(kind: Kind, rows: usize, cols: usize, seed: u64) -> Owned {
    let mut g = Rng(seed | 1);
    match kind {
        Kind::Fp8 => Owned {
            q: (0..rows * cols).map(|_| g.byte() & 0xF7).collect(),
            s: (0..rows.div_ceil(128) * cols.div_ceil(128))
                .map(|_| 120 + g.byte() % 8)
                .collect(),
        },
        Kind::Fp4 => Owned {
            q: (0..rows * cols / 2).map(|_| g.byte()).collect(),
            s: (0..rows * cols / 32).map(|_| 120 + g.byte() % 8).collect(),
        },
        Kind::Bf16 => Owned {
            // small normal values: sign, exponent 120..127, random mantissa
            q: (0..rows * cols)
                .flat_map(|_| {
                    let hi = (g.byte() & 0x80) | 0x3C | (g.byte() & 1);
                    [g.byte(), hi]
                })
                .collect(),
            s: vec![],
        },
    }
}

/// `o` as a matrix of `kind`.
pub fn mat<'a>(kind: Kind, rows: usize, cols: usize, o: &'a Owned) -> MatRef<'a> {
    let (q, scale) = (&o.q[..], &o.s[..]);
    let w = match kind {
        Kind::Fp8 => Weights::Fp8 { q, scale },
        Kind::Fp4 => Weights::Fp4 { q, scale },
        Kind::Bf16 => Weights::Bf16(q),
    };
    MatRef::new(rows, cols, w).unwrap()
}

/// Copies of one random matrix (seed 1), enough for `total` bytes (at least one): a kernel
/// cycling through them reads its weights from DRAM, as in real decode, not from the cache.
pub fn ring(kind: Kind, rows: usize, cols: usize, total: usize) -> Vec<Owned> {
    let first = make(kind, rows, cols, 1);
    let copies = total.div_ceil(mat(kind, rows, cols, &first).bytes()).max(1);
    (0..copies)
        .map(|_| Owned {
            q: first.q.clone(),
            s: first.s.clone(),
        })
        .collect()
}
