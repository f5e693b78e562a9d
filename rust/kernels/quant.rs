//! Activation quantization: int8 blocks for the fast FP4 products, and the quantize-dequantize
//! (QDQ) round trips DeepSeek's reference inference simulates: FP8 E4M3 activations
//! (`fp8_act_qdq`), FP8 KV entries (`fp8_kv_qdq`) and FP4 E2M1 indexer vectors (`fp4_qdq`).
//!
//! ## Fast numerics: int8 activations for the FP4 expert products
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

/// Largest finite E4M3 (e4m3fn) magnitude.
pub(crate) const E4M3_MAX: f32 = 448.0;
/// DeepSeek's activation block (columns per scale) before FP8/FP4 products.
pub(crate) const FP8_ACT_BLOCK: usize = 128;

/// `v` rounded to the nearest E4M3 (e4m3fn) value, ties to even, after clamping to ±448.
/// NaN stays NaN. Normal binades (2^-6..2^8) keep 3 mantissa bits: the f32 bits are rounded
/// at bit 20, ties to even, a carry moving into the next binade as it should. Below 2^-6
/// the subnormal step is 2^-9: adding and removing 1.5 * 2^14 (whose ulp is 2^-9) rounds to
/// that step, ties to even, in f32's default rounding. Both are exact.
#[inline]
pub(crate) fn e4m3_round(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs().min(E4M3_MAX);
    let r = if a >= 1.0 / 64.0 {
        let b = a.to_bits();
        f32::from_bits((b + 0x7_FFFF + ((b >> 20) & 1)) & !0xF_FFFF)
    } else {
        (a + 24576.0) - 24576.0
    };
    r.copysign(v)
}

/// The UE8M0 scale DeepSeek's `act_quant` picks for a block with largest magnitude
/// `amax`: 2^ceil(log2(max(amax, 1e-4) · (1/448))), the smallest power of two that brings
/// the block within ±448. As in DeepSeek's reference kernel (`inference/kernel.py`,
/// `fast_round_scale`), the product is formed in f32 and its ceil(log2) read off the bits.
pub(crate) fn fp8_act_scale(amax: f32) -> f32 {
    pow2_ceil(amax.max(1e-4) * (1.0 / E4M3_MAX))
}

/// 2^ceil(log2(r)) for a positive normal r, read off its bits (the exponent, plus one where any
/// mantissa bit is set), as DeepSeek's `fast_round_scale` does.
fn pow2_ceil(r: f32) -> f32 {
    let bits = r.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32 - 127;
    let e = if bits & 0x7f_ffff != 0 { exp + 1 } else { exp };
    f32::powi(2.0, e)
}

/// DeepSeek's FP8 activation round trip on x [n, cols], in place: each row's blocks of
/// `FP8_ACT_BLOCK` columns (the last one may be shorter) are divided by their
/// `fp8_act_scale`, rounded to E4M3 and multiplied back. A block with a NaN or an infinity
/// becomes NaN (no FP8 form), as the products of the exact path would be.
pub(crate) fn fp8_act_qdq(x: &mut [f32], cols: usize) {
    debug_assert!(cols > 0 && x.len() % cols == 0);
    for row in x.chunks_exact_mut(cols) {
        row.chunks_mut(FP8_ACT_BLOCK).for_each(fp8_qdq_block);
    }
}

/// One block's FP8 round trip with its own UE8M0 scale (non-finite blocks become NaN).
fn fp8_qdq_block(b: &mut [f32]) {
    qdq_block(b, fp8_act_scale, e4m3_round)
}

/// One block's round trip: divided by its power-of-two scale `scale(amax)`, rounded by `round`
/// and multiplied back. A block with a NaN or an infinity becomes NaN (it has no such form).
#[inline]
fn qdq_block(b: &mut [f32], scale: fn(f32) -> f32, round: fn(f32) -> f32) {
    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    if !amax.is_finite() || b.iter().any(|v| v.is_nan()) {
        b.fill(f32::NAN);
        return;
    }
    let s = scale(amax);
    // s is a power of two in 2^-126..2^126 (FP8: 2^-22..2^120), so 1 / s is exact and
    // * (1 / s) equals / s
    let inv = 1.0 / s;
    for v in b.iter_mut() {
        *v = round(*v * inv) * s;
    }
}

/// DeepSeek's KV block (columns per scale) for the FP8 round trip of KV entries.
pub(crate) const FP8_KV_BLOCK: usize = 64;

/// The FP8 round trip official numerics applies to attention KV entries x [n, width], in
/// place: the leading `width - rope_dim` (non-rope) dims of each row, in blocks of
/// `FP8_KV_BLOCK` (the last one may be shorter), each with its own UE8M0 scale exactly as
/// `fp8_act_qdq` (E4M3 ties to even after clamping to ±448, amax floored at 1e-4); the
/// trailing rope dims stay f32. DeepSeek's reference inference does this to the window kv
/// after `kv_norm` and rope (`Attention.forward`) and to each compressed entry after its
/// norm and rope (`Compressor.forward`, non-rotating compressors): `act_quant(kv[..., :-rd],
/// 64, scale_fmt, ..., inplace=True)` in deepseek-ai's `inference/model.py` (Hugging Face
/// revision 60d8d70, mirrored in supermy/ds4rs `third/ds4/model.py`).
pub(crate) fn fp8_kv_qdq(x: &mut [f32], width: usize, rope_dim: usize) {
    debug_assert!(width > rope_dim && x.len() % width == 0);
    for row in x.chunks_exact_mut(width) {
        row[..width - rope_dim]
            .chunks_mut(FP8_KV_BLOCK)
            .for_each(fp8_qdq_block);
    }
}

/// Largest E2M1 magnitude.
pub(crate) const E2M1_MAX: f32 = 6.0;
/// DeepSeek's FP4 block (columns per scale) for the indexer's query and keys.
pub(crate) const FP4_BLOCK: usize = 32;

/// `v` rounded to the nearest E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to even (the
/// code with mantissa bit 0), after clamping to ±6. NaN stays NaN.
pub(crate) fn e2m1_round(v: f32) -> f32 {
    if v.is_nan() {
        return v;
    }
    let a = v.abs().min(E2M1_MAX);
    // binades 2^0..2^2 have 1 mantissa bit (step 2^(e-1)); below 1 the subnormal step is
    // 0.5. Within a binade the even codes are the even multiples of the step.
    let e = ((a.to_bits() >> 23) & 0xff) as i32 - 127;
    let step = f32::powi(2.0, e.max(0) - 1);
    ((a / step).round_ties_even() * step).copysign(v)
}

/// The UE8M0 scale of an FP4 block with largest magnitude `amax`: 2^ceil(log2(amax · (1/6)))
/// with amax floored at 6·2^-126 (so a zero block gets 2^-126 and stays zero), the product
/// formed in f32 and its ceil(log2) read off the bits, as DeepSeek's `fp4_quant_kernel`
/// does (`inference/kernel.py`, `fast_round_scale`; 2026-04-24 release in
/// Mockingjay1316/deepseek-v4-flash-spark).
pub(crate) fn fp4_scale(amax: f32) -> f32 {
    pow2_ceil(amax.max(E2M1_MAX * f32::powi(2.0, -126)) * (1.0 / E2M1_MAX))
}

/// DeepSeek's FP4 round trip on x [n, cols], in place: each row's blocks of `FP4_BLOCK`
/// columns (the last one may be shorter) are divided by their `fp4_scale`, rounded to E2M1
/// (clamped to ±6) and multiplied back (`fp4_act_quant(x, 32, inplace=True)` in the
/// reference). A block with a NaN or an infinity becomes NaN.
pub(crate) fn fp4_qdq(x: &mut [f32], cols: usize) {
    debug_assert!(cols > 0 && x.len() % cols == 0);
    for row in x.chunks_exact_mut(cols) {
        for b in row.chunks_mut(FP4_BLOCK) {
            qdq_block(b, fp4_scale, e2m1_round);
        }
    }
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

    /// Every finite E4M3 value, from the checkpoint decoder (an independent definition).
    fn e4m3_values() -> Vec<(f32, u8)> {
        (0u8..=255)
            .map(|b| (crate::dtype::e4m3_to_f32(b), b))
            .filter(|(v, _)| v.is_finite())
            .collect()
    }

    /// Nearest of `values` (value, code) to `v` clamped to ±`max`, by search; ties go to the
    /// even code (mantissa LSB 0); a zero keeps `v`'s sign.
    fn nearest_by_search(v: f32, max: f32, values: &[(f32, u8)]) -> f32 {
        let c = v.clamp(-max, max) as f64;
        let mut best = (f64::INFINITY, 0f32, 0u8);
        for &(w, b) in values {
            let d = (w as f64 - c).abs();
            if d < best.0 || (d == best.0 && b & 1 == 0 && best.2 & 1 == 1) {
                best = (d, w, b);
            }
        }
        if best.1 == 0.0 {
            0f32.copysign(v)
        } else {
            best.1
        }
    }

    /// Nearest E4M3 by search; ties go to the even code (mantissa LSB 0).
    fn e4m3_nearest(v: f32) -> f32 {
        nearest_by_search(v, 448.0, &e4m3_values())
    }

    /// `round` (named `name`) gives `nearest`'s bits at every probe.
    fn assert_rounds_to_nearest(
        round: fn(f32) -> f32,
        nearest: fn(f32) -> f32,
        probes: Vec<f32>,
        name: &str,
    ) {
        for v in probes {
            let (got, want) = (round(v), nearest(v));
            assert!(
                got.to_bits() == want.to_bits(),
                "{name}({v:e}) = {got:e}, nearest is {want:e}"
            );
        }
        assert!(round(f32::NAN).is_nan());
    }

    /// `qdq` (of rows of `2 block` columns) keeps a zero block zero, and turns a block with an
    /// infinity (`bad` at `at`, in the second block) into NaN without touching the first.
    fn assert_zero_and_non_finite_blocks(
        qdq: fn(&mut [f32], usize),
        block: usize,
        (at, bad): (usize, f32),
    ) {
        let mut z = vec![0f32; block];
        qdq(&mut z, block);
        assert!(z.iter().all(|&v| v == 0.0));
        let mut w = vec![1f32; 2 * block];
        w[at] = bad;
        qdq(&mut w, 2 * block);
        assert!(w[..block].iter().all(|&v| v == 1.0));
        assert!(w[block..].iter().all(|v| v.is_nan()));
    }

    /// y is x [2, cols] after a round trip whose blocks are `blocks` (column ranges of a row):
    /// every value is the nearest (`nearest`) of x / s, times s, s = `scale` of its block's
    /// largest magnitude.
    fn assert_blocks_round_trip(
        (x, y, cols): (&[f32], &[f32], usize),
        blocks: &[(usize, usize)],
        scale: fn(f32) -> f32,
        nearest: fn(f32) -> f32,
    ) {
        for r in 0..2 {
            for &(b0, b1) in blocks {
                let blk = &x[r * cols + b0..r * cols + b1];
                let s = scale(blk.iter().fold(0f32, |m, v| m.max(v.abs())));
                for c in b0..b1 {
                    let v = x[r * cols + c];
                    assert_eq!(y[r * cols + c], nearest(v / s) * s, "row {r} col {c}");
                }
            }
        }
    }

    #[test]
    fn e4m3_round_matches_a_search_over_every_value_and_every_tie() {
        let vals = e4m3_values();
        let mut probes = vec![0.0f32, -0.0, 1e-9, 448.0, 449.0, 464.0, 1e6, -1e6];
        for &(a, _) in &vals {
            for &(b, _) in &vals {
                // every value, every midpoint between neighbours (the ties), and just off them
                if a < b && vals.iter().all(|&(w, _)| w <= a || w >= b) {
                    let m = (a + b) / 2.0;
                    probes.extend([a, b, m, m.next_up(), m.next_down()]);
                }
            }
        }
        assert_rounds_to_nearest(e4m3_round, e4m3_nearest, probes, "e4m3_round");
    }

    #[test]
    fn fp8_act_scale_is_the_smallest_power_of_two_within_448() {
        for amax in [1e-4f32, 0.3, 1.0, 447.0, 448.0, 448.1, 896.0, 1e5] {
            let s = fp8_act_scale(amax);
            let r = amax * (1.0 / 448.0);
            assert_eq!(s.log2().fract(), 0.0, "power of two for {amax}");
            assert!(s >= r && s / 2.0 < r, "amax {amax}: scale {s}");
        }
        // the floor: a zero block gets the scale of amax 1e-4 and stays zero
        assert_eq!(fp8_act_scale(0.0), fp8_act_scale(1e-4));
        assert_eq!(fp8_act_scale(448.0), 1.0);
        assert_eq!(fp8_act_scale(448.5), 2.0);
    }

    #[test]
    fn fp8_act_qdq_rounds_each_128_block_with_its_own_scale() {
        // 2 rows of 300 columns: blocks 128, 128 and a partial 44
        let cols = 300;
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * if i % 300 < 128 { 1e-3 } else { 3.7 })
            .collect();
        let mut y = x.clone();
        fp8_act_qdq(&mut y, cols);
        let blocks = [(0, 128), (128, 256), (256, 300)];
        assert_blocks_round_trip((&x, &y, cols), &blocks, fp8_act_scale, e4m3_nearest);
        assert_zero_and_non_finite_blocks(fp8_act_qdq, 128, (200, f32::INFINITY));
    }
    /// Every E2M1 value with its code, from the checkpoint decoder (an independent definition).
    fn e2m1_values() -> Vec<(f32, u8)> {
        (0u8..16).map(|b| (E2M1_LUT[b as usize], b)).collect()
    }

    /// Nearest E2M1 by search; ties go to the even code (mantissa bit 0).
    fn e2m1_nearest(v: f32) -> f32 {
        nearest_by_search(v, 6.0, &e2m1_values())
    }

    #[test]
    fn e2m1_round_matches_a_search_over_every_value_and_every_tie() {
        let mut vals: Vec<f32> = e2m1_values().iter().map(|p| p.0).collect();
        vals.sort_by(f32::total_cmp);
        vals.dedup();
        let mut probes = vec![0.0f32, -0.0, 1e-30, 6.0, 6.5, 7.0, 1e9, -1e9];
        for w in vals.windows(2) {
            let m = (w[0] + w[1]) / 2.0;
            probes.extend([w[0], w[1], m, m.next_up(), m.next_down()]);
        }
        assert_rounds_to_nearest(e2m1_round, e2m1_nearest, probes, "e2m1_round");
        // the ties explicitly: each goes to the value with the even code
        for (v, want) in [
            (0.25, 0.0),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
        ] {
            assert_eq!(e2m1_round(v), want, "tie {v}");
            assert_eq!(e2m1_round(-v), -want, "tie -{v}");
        }
    }

    #[test]
    fn fp4_scale_is_the_smallest_power_of_two_within_6_with_deepseeks_floor() {
        for amax in [1e-30f32, 1e-3, 0.3, 1.0, 5.9, 6.0, 6.01, 12.0, 13.0, 1e5] {
            let s = fp4_scale(amax);
            let r = amax.max(6.0 * 2f32.powi(-126)) * (1.0f32 / 6.0);
            assert_eq!(s.log2().fract(), 0.0, "power of two for {amax}");
            assert!(s >= r && s / 2.0 < r, "amax {amax}: scale {s}");
        }
        assert_eq!(fp4_scale(6.0), 1.0);
        assert_eq!(fp4_scale(3.0), 0.5);
        assert_eq!(fp4_scale(6.000001), 2.0);
        // a zero block: the floor 6·2^-126 gives 2^-126
        assert_eq!(fp4_scale(0.0), 2f32.powi(-126));
    }

    #[test]
    fn fp4_qdq_rounds_each_32_block_with_its_own_scale() {
        // 2 rows of 80 columns: blocks 32, 32 and a partial 16, scales far apart
        let cols = 80;
        let x: Vec<f32> = (0..2 * cols)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * if i % cols < 32 { 1e-3 } else { 0.37 })
            .collect();
        let mut y = x.clone();
        fp4_qdq(&mut y, cols);
        let blocks = [(0, 32), (32, 64), (64, 80)];
        assert_blocks_round_trip((&x, &y, cols), &blocks, fp4_scale, e2m1_nearest);
        // the block's largest magnitude lands in (3, 6]: the scale uses the whole FP4 range
        let amax = y[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
        let s = fp4_scale(x[..32].iter().fold(0f32, |m, v| m.max(v.abs())));
        assert!(amax / s > 3.0 && amax / s <= 6.0);
        assert_zero_and_non_finite_blocks(fp4_qdq, 32, (40, f32::NEG_INFINITY));
    }

    #[test]
    fn fp8_kv_qdq_rounds_only_the_non_rope_dims_in_blocks_of_64() {
        // width 512 with 64 rope dims (the real model): 7 blocks of 64 then 64 untouched;
        // width 128 with 32 rope dims (the fixtures): one block of 64, one of 32
        for (width, rope) in [(512usize, 64usize), (128, 32)] {
            let x: Vec<f32> = (0..2 * width)
                .map(|i| {
                    ((i * 7919 % 1013) as f32 - 506.0)
                        * if i % 64 < 8 { 1e-2 } else { 3.3e-3 }
                        * (1 + i % 3) as f32
                })
                .collect();
            let mut y = x.clone();
            fp8_kv_qdq(&mut y, width, rope);
            let nope = width - rope;
            for r in 0..2 {
                let row = &x[r * width..(r + 1) * width];
                for b0 in (0..nope).step_by(64) {
                    let b1 = (b0 + 64).min(nope);
                    let s = fp8_act_scale(row[b0..b1].iter().fold(0f32, |m, v| m.max(v.abs())));
                    for c in b0..b1 {
                        assert_eq!(
                            y[r * width + c],
                            e4m3_nearest(row[c] / s) * s,
                            "w {width} row {r} col {c}"
                        );
                    }
                }
                assert_eq!(
                    &y[r * width + nope..(r + 1) * width],
                    &row[nope..],
                    "rope dims untouched"
                );
            }
            assert_ne!(x, y);
        }
    }
}
