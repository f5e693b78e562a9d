//! Fast numerics (int8 activations x FP4 weights): every tier against an independent f64
//! model of the same quantization, the determinism contract, the exact integer products
//! at the extremes, and the bound on how far it may move a result from exact mode.

use super::tests::{
    assert_threads_agree, assert_tokens_and_ranges_agree, make_x, run_tier, tiers, Kind, Mat, Rng,
};
use super::*;
use crate::dtype::{e8m0_to_f32, E2M1_LUT};

fn run_q8(t: Tier, m: &MatRef, rows: Range<usize>, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * rows.len()];
    matmul_q8_tier(t, m, rows, x, n, &mut y).unwrap();
    y
}

/// Independent model: x rounded per 32-block to multiples of amax / 127 (ties to even), then
/// the f64 dot with the dequantized weights. Returns (value, budget) per [t, r].
fn reference(m: &Mat, rows: Range<usize>, x: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
    let (cols, nr) = (m.cols, rows.len());
    let (mut y, mut b) = (vec![0.0; n * nr], vec![0.0; n * nr]);
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let xq: Vec<f64> = xt
            .chunks(32)
            .flat_map(|blk| {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                blk.iter().map(move |&v| {
                    if amax == 0.0 {
                        0.0
                    } else {
                        (v * (127.0 / amax)).round_ties_even() as f64 * d as f64
                    }
                })
            })
            .collect();
        for (i, r) in rows.clone().enumerate() {
            let (mut s, mut a) = (0f64, 0f64);
            for c in 0..cols {
                let p = m.deq[r * cols + c] * xq[c];
                s += p;
                a += p.abs();
            }
            y[t * nr + i] = s;
            // one product (dot * step) and one FMA add per block and lane, a short hsum,
            // and the step itself rounded once
            b[t * nr + i] = (cols as f64 / 32.0 + 20.0) * 2f64.powi(-23) * a + 1e-37;
        }
    }
    (y, b)
}

const SHAPES: [(usize, usize); 6] = [
    (1, 32),
    (3, 64),
    (130, 96),
    (259, 160),
    (5, 544),
    (19, 1056),
];

#[test]
fn fast_matches_its_f64_model_on_every_tier() {
    for tier in tiers() {
        for (rows, cols) in SHAPES {
            let m = Mat::new(Kind::Fp4, rows, cols, rows as u64 * 7 + cols as u64);
            let mr = m.mat_ref();
            for n in [1, 4] {
                let xb = make_x(n, cols, 3 + n as u64);
                let x = &xb[1..];
                let (want, budget) = reference(&m, 0..rows, x, n);
                let got = run_q8(tier, &mr, 0..rows, x, n);
                for i in 0..n * rows {
                    let err = (got[i] as f64 - want[i]).abs();
                    assert!(
                        err <= budget[i],
                        "{} [{rows}, {cols}] n {n} out {i}: {} vs {} (budget {})",
                        tier.name(),
                        got[i],
                        want[i],
                        budget[i]
                    );
                }
            }
        }
    }
}

#[test]
fn fast_stays_within_the_quantization_bound_of_exact() {
    // |x - d q| <= d / 2 per element, so |y_fast - y_exact| <= sum_c |w_c| d_b / 2 (+ f32).
    let (rows, cols) = (64, 256);
    let m = Mat::new(Kind::Fp4, rows, cols, 21);
    let mr = m.mat_ref();
    let xb = make_x(1, cols, 5);
    let x = &xb[1..];
    let tier = active_tier();
    let exact = run_tier(tier, &mr, 0..rows, x, 1);
    let fast = run_q8(tier, &mr, 0..rows, x, 1);
    let mut moved = 0;
    for r in 0..rows {
        let mut bound = 0f64;
        for (b, blk) in x.chunks(32).enumerate() {
            let d = blk.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 127.0;
            for c in 0..32 {
                bound += m.deq[r * cols + 32 * b + c].abs() * d / 2.0;
            }
        }
        let diff = (fast[r] as f64 - exact[r] as f64).abs();
        assert!(
            diff <= bound * 1.001 + 1e-6,
            "row {r}: moved {diff} > {bound}"
        );
        moved += (fast[r] != exact[r]) as usize;
    }
    assert!(moved > 0, "fast numerics must actually quantize x");
}

#[test]
fn fast_integer_products_are_exact_at_the_extremes() {
    // One 32-column block per row with every nibble, x = ±127 exactly (step 1): every
    // product is an integer times a power of two, so the result is exact on every tier.
    let rows = 64;
    let mut g = Rng(99);
    let q: Vec<u8> = (0..rows * 16)
        .map(|i| {
            if i < 16 * 16 {
                (i % 256) as u8
            } else {
                g.byte()
            }
        })
        .collect();
    let s: Vec<u8> = (0..rows).map(|r| 110 + (r % 30) as u8).collect();
    let mr = MatRef::new(rows, 32, Weights::Fp4 { q: &q, scale: &s }).unwrap();
    for pattern in 0..4u32 {
        let x: Vec<f32> = (0..32)
            .map(|c| match pattern {
                0 => 127.0,
                1 => -127.0,
                2 => {
                    if c % 3 == 0 {
                        127.0
                    } else {
                        -127.0
                    }
                }
                _ => [127.0, -127.0, 0.0, 1.0][(c * 7 + 1) % 4],
            })
            .collect();
        let want: Vec<f32> = (0..rows)
            .map(|r| {
                let mut acc = 0f64;
                for c in 0..32 {
                    let b = q[r * 16 + c / 2];
                    let nib = if c % 2 == 0 { b & 15 } else { b >> 4 };
                    acc += E2M1_LUT[nib as usize] as f64 * x[c] as f64;
                }
                (acc * e8m0_to_f32(s[r]) as f64) as f32
            })
            .collect();
        for tier in tiers() {
            for n in [1, 3] {
                let xs: Vec<f32> = x.iter().copied().cycle().take(32 * n).collect();
                let got = run_q8(tier, &mr, 0..rows, &xs, n);
                for t in 0..n {
                    for r in 0..rows {
                        assert_eq!(
                            got[t * rows + r].to_bits(),
                            want[r].to_bits(),
                            "{} pattern {pattern} n {n} row {r}",
                            tier.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn fast_is_bit_identical_across_threads_tokens_and_row_ranges() {
    for tier in tiers() {
        for (rows, cols) in [(261, 224), (19, 1056)] {
            let m = Mat::new(Kind::Fp4, rows, cols, 13);
            let mr = m.mat_ref();
            for n in [2, 3, 7, 40] {
                let xb = make_x(n, cols, 40 + n as u64);
                let x = &xb[1..];
                let full = run_q8(tier, &mr, 0..rows, x, n);
                let what = format!("{} n {n}", tier.name());
                assert_threads_agree(&full, &[1, 3], || run_q8(tier, &mr, 0..rows, x, n), &what);
                assert_tokens_and_ranges_agree(
                    |rg, x, n| run_q8(tier, &mr, rg, x, n),
                    (&full, rows, cols),
                    &[3..rows, rows / 2..rows / 2 + 2, rows - 6..rows],
                    (x, n),
                    &what,
                );
            }
        }
    }
}

#[test]
fn fast_falls_back_to_exact_for_other_formats_and_refuses_them_on_the_q8_entry() {
    let m = Mat::new(Kind::Fp8, 5, 300, 1);
    let mr = m.mat_ref();
    let xb = make_x(2, 300, 1);
    let x = &xb[1..];
    let mut a = vec![0f32; 10];
    let mut b = vec![0f32; 10];
    matmul(&mr, 0..5, x, 2, &mut a);
    matmul_in(Numerics::Fast, &mr, 0..5, x, 2, &mut b);
    // with bf16 products fast takes them for FP8 too (tests_bf16 checks that dispatch)
    if !bf16_products() {
        assert_eq!(a, b);
    }
    let mut y = vec![0f32; 10];
    let err = matmul_q8_tier(Tier::Portable, &mr, 0..5, x, 2, &mut y).unwrap_err();
    assert!(err.contains("only for FP4"), "{err}");
    assert_eq!(Numerics::from_name("fast"), Some(Numerics::Fast));
    assert_eq!(Numerics::from_name("exact"), Some(Numerics::Exact));
    assert_eq!(Numerics::from_name("fp8"), None);
}
