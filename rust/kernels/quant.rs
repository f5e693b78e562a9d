//! Fast numerics: int8 activations for the FP4 expert products.
//!
//! In `Numerics::Fast` an FP4 matrix is multiplied by activations quantized per 32-column
//! block (the FP4 scale block): `x ≈ d * q` with `d = amax / 127` and `q` an int8 in
//! -127..=127 (round half to even). Weights become the integers `2 * E2M1` (-12..=12), so
//! a block's dot product is an exact integer and one block contributes
//! `dot * (2^(scale - 127) / 2) * d` to the row's f32 sum. Everything else (FP8, BF16 and
//! f32 matrices, attention, norms) stays exact.
//!
//! The quantized block order matches the FP4 bytes: [16 even columns, 16 odd columns]
//! (`fp4_i8`), so `quantize` permutes x the same way once per token.

/// `2 * E2M1` for each nibble: the FP4 value as a small integer (sign bit 3).
pub(crate) const I8_OF_E2M1: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// One token's activations for fast FP4 products: q [cols] int8 in the FP4 block order,
/// d [cols / 32] the per-block steps.
pub(crate) struct QuantX {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
}

/// Quantizes x [n, cols] (cols % 32 == 0) per 32-column block; token t's blocks are
/// `q[t * cols..]`, `d[t * cols / 32..]`.
pub(crate) fn quantize(x: &[f32], cols: usize) -> QuantX {
    debug_assert!(cols % 32 == 0 && x.len() % cols == 0);
    let nb = x.len() / 32;
    let mut q = vec![0i8; x.len()];
    let mut d = vec![0f32; nb];
    for (b, (xb, qb)) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).enumerate() {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 || !amax.is_finite() {
            // Zero block: q stays 0. A non-finite block has no int8 form; its NaN step
            // makes the products NaN, as the exact path would.
            d[b] = if amax == 0.0 { 0.0 } else { f32::NAN };
            continue;
        }
        let step = amax / 127.0;
        let inv = 127.0 / amax;
        d[b] = step;
        for i in 0..16 {
            qb[i] = (xb[2 * i] * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
            qb[16 + i] = (xb[2 * i + 1] * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
    }
    QuantX { q, d }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::E2M1_LUT;

    #[test]
    fn int8_weights_are_twice_the_e2m1_values() {
        for n in 0..16 {
            assert_eq!(I8_OF_E2M1[n] as f32, 2.0 * E2M1_LUT[n], "nibble {n}");
        }
    }

    #[test]
    fn quantize_permutes_into_the_fp4_block_order_and_bounds_the_error() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.3)
            .collect();
        let qx = quantize(&x, 64);
        for b in 0..2 {
            let d = qx.d[b];
            let amax = x[32 * b..32 * b + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(d, amax / 127.0);
            for i in 0..16 {
                for (k, col) in [(i, 2 * i), (16 + i, 2 * i + 1)] {
                    let v = x[32 * b + col];
                    let got = qx.q[32 * b + k] as f32 * d;
                    assert!((got - v).abs() <= d * 0.5 + 1e-6, "block {b} col {col}");
                }
            }
        }
        assert_eq!(qx.q.iter().map(|&v| v.unsigned_abs()).max(), Some(127));
    }

    #[test]
    fn zero_and_non_finite_blocks() {
        let mut x = vec![0f32; 64];
        x[40] = f32::INFINITY;
        let qx = quantize(&x, 64);
        assert_eq!(qx.d[0], 0.0);
        assert!(qx.q[..32].iter().all(|&v| v == 0));
        assert!(qx.d[1].is_nan());
    }
}
