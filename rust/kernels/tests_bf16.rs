//! The `vdpbf16ps` path of official numerics: bit for bit against a scalar twin of the
//! instruction's definition (two FMA steps per lane, element 2j + 1 then 2j), within the
//! f32 error budget of the f64 reference, the determinism contract, and the dispatch of
//! fast and official numerics. On a CPU without avx512_bf16 the tests check that the path
//! refuses and both modes keep their other kernels.

use super::quant::fp8_act_qdq;
use super::tests::{assert_threads_agree, assert_tokens_and_ranges_agree, make_x, Kind, Mat};
use super::*;
use crate::dtype::{e4m3_to_f32, e8m0_to_f32, E2M1_LUT};

/// f32 rounded to bf16 to nearest even, back as f32 (independent of the kernel's `half`).
fn bf16_round(v: f32) -> f32 {
    let b = v.to_bits();
    let r = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000;
    f32::from_bits(r)
}

/// Denormals read as / flushed to zero, as `vdpbf16ps` does.
fn ftz(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0 * v.signum()
    } else {
        v
    }
}

/// Row r of the matrix in the path's chunk layout (32 columns per chunk; FP4 blocks as [16
/// even, 16 odd]; FP8 as e4m3 / 256 times the scale, zero padded), and the same for x.
fn layout(m: &Mat, fp8: bool, r: usize, x: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let cols = m.cols;
    let nch = cols.div_ceil(32);
    let (mut w, mut xl) = (vec![0f32; nch * 32], vec![0f32; nch * 32]);
    let order = |c: usize| -> usize {
        // position of column c in its chunk
        if !fp8 {
            let k = c % 32;
            c - k + if k % 2 == 0 { k / 2 } else { 16 + k / 2 }
        } else {
            c
        }
    };
    for c in 0..cols {
        let wv = if !fp8 {
            let b = m.q[(r * cols + c) / 2];
            let nib = if c % 2 == 0 { b & 15 } else { b >> 4 };
            E2M1_LUT[nib as usize] * e8m0_to_f32(m.s[r * cols / 32 + c / 32])
        } else {
            let sc = cols.div_ceil(128);
            e4m3_to_f32(m.q[r * cols + c]) / 256.0 * e8m0_to_f32(m.s[(r / 128) * sc + c / 128])
        };
        w[order(c)] = wv;
        xl[order(c)] = bf16_round(x[c]);
    }
    (w, xl)
}

/// The instruction's definition, chunk by chunk, then the AVX-512 lane-sum tree.
fn twin(m: &Mat, rows: Range<usize>, x: &[f32], n: usize, fp8: bool) -> Vec<f32> {
    let (cols, nr) = (m.cols, rows.len());
    let mut y = vec![0f32; n * nr];
    for t in 0..n {
        for (i, r) in rows.clone().enumerate() {
            let (w, xl) = layout(m, fp8, r, &x[t * cols..(t + 1) * cols]);
            let mut acc = [0f32; 16];
            for (wc, xc) in w.chunks_exact(32).zip(xl.chunks_exact(32)) {
                for j in 0..16 {
                    let (w1, x1) = (ftz(wc[2 * j + 1]), ftz(xc[2 * j + 1]));
                    let (w0, x0) = (ftz(wc[2 * j]), ftz(xc[2 * j]));
                    acc[j] = ftz(w1.mul_add(x1, acc[j]));
                    acc[j] = ftz(w0.mul_add(x0, acc[j]));
                }
            }
            let mut h = 8;
            while h > 0 {
                for j in 0..h {
                    acc[j] += acc[j + h];
                }
                h /= 2;
            }
            y[t * nr + i] = if fp8 { acc[0] * 256.0 } else { acc[0] };
        }
    }
    y
}

fn run_bf16(m: &MatRef, rows: Range<usize>, x: &[f32], n: usize) -> Result<Vec<f32>, String> {
    let mut y = vec![f32::NAN; n * rows.len()];
    matmul_bf16(m, rows, x, n, &mut y)?;
    Ok(y)
}

fn has_bf16() -> bool {
    cfg!(target_arch = "x86_64") && {
        let m = Mat::new(Kind::Fp4, 1, 32, 0);
        run_bf16(&m.mat_ref(), 0..1, &[0.0; 32], 1).is_ok()
    }
}

/// `f(kind, m)` for every case (kind, rows, cols), m = `Mat::new(kind, rows, cols, seed)`;
/// where this CPU lacks avx512_bf16, the line `skip` instead.
fn for_each_case(
    skip: &str,
    cases: &[(Kind, usize, usize)],
    seed: u64,
    mut f: impl FnMut(Kind, &Mat),
) {
    if !has_bf16() {
        println!("{skip}");
        return;
    }
    for &(kind, rows, cols) in cases {
        f(kind, &Mat::new(kind, rows, cols, seed));
    }
}

/// FP8 shapes with partial chunks and several row blocks; FP4 with cols % 32 == 0.
const SHAPES: [(Kind, usize, usize); 8] = [
    (Kind::Fp8, 1, 32),
    (Kind::Fp8, 5, 100),
    (Kind::Fp8, 130, 200),
    (Kind::Fp8, 259, 1024),
    (Kind::Fp4, 1, 32),
    (Kind::Fp4, 3, 96),
    (Kind::Fp4, 130, 544),
    (Kind::Fp4, 37, 2048),
];

#[test]
fn bf16_matches_the_instruction_twin_bit_for_bit() {
    let skip = "SKIP bf16 twin: this CPU lacks avx512_bf16 (checked by the dispatch test)";
    for_each_case(skip, &SHAPES, 7, |kind, m| {
        let (mr, rows, cols) = (m.mat_ref(), m.rows, m.cols);
        // 1 to 16 tokens take the fused path (in passes above 8), more `gemm` with each
        // remainder tile (19 to 23 tokens), in token blocks of 128 (one whole block, a
        // block and one token, two blocks and a remainder tile)
        for n in [1, 2, 3, 5, 7, 13, 16, 19, 20, 21, 22, 23, 128, 129, 262] {
            let xb = make_x(n, cols, 3 + n as u64);
            let x = &xb[1..];
            let y = run_bf16(&mr, 0..rows, x, n).unwrap();
            let want = twin(m, 0..rows, x, n, kind == Kind::Fp8);
            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits(),
                    "{kind:?} [{rows}, {cols}] n {n} at {i}: kernel {a:e}, twin {b:e}"
                );
            }
        }
    });
}

#[test]
fn bf16_on_rounded_activations_stays_within_the_f32_budget() {
    let skip = "SKIP bf16 budget: this CPU lacks avx512_bf16 (checked by the dispatch test)";
    for_each_case(skip, &SHAPES, 11, |kind, m| {
        let (mr, rows, cols) = (m.mat_ref(), m.rows, m.cols);
        let n = 5;
        let xb = make_x(n, cols, 5);
        let mut xq = xb[1..].to_vec();
        fp8_act_qdq(&mut xq, cols);
        let y = run_bf16(&mr, 0..rows, &xq, n).unwrap();
        let mut f = vec![0f32; n * rows];
        matmul(&mr, 0..rows, &xq, n, &mut f);
        for t in 0..n {
            for r in 0..rows {
                let (mut s, mut a) = (0f64, 0f64);
                for c in 0..cols {
                    // the rounded activations are bf16 values: the kernel sees them exactly
                    let xv = xq[t * cols + c];
                    assert_eq!(
                        bf16_round(xv),
                        xv,
                        "E4M3-rounded activations are bf16 values"
                    );
                    let p = m.deq[r * cols + c] * xv as f64;
                    s += p;
                    a += p.abs();
                }
                // one FMA per pair of columns, a 4-step lane sum
                let budget = (cols as f64 / 32.0 + 8.0) * 2f64.powi(-23) * a + 1e-37;
                let (yb, yf) = (y[t * rows + r] as f64, f[t * rows + r] as f64);
                assert!(
                    (yb - s).abs() <= budget && (yf - s).abs() <= budget,
                    "{kind:?} [{rows}, {cols}] t {t} r {r}: bf16 {yb:e}, f32 {yf:e}, f64 {s:e}"
                );
            }
        }
    });
}

#[test]
fn bf16_is_bit_identical_across_threads_tokens_and_row_ranges() {
    let skip = "SKIP bf16 determinism: this CPU lacks avx512_bf16";
    let cases = [(Kind::Fp8, 261, 200), (Kind::Fp4, 19, 1056)];
    for_each_case(skip, &cases, 13, |kind, m| {
        let (mr, rows, cols) = (m.mat_ref(), m.rows, m.cols);
        for n in [2, 7, 40, 140] {
            let xb = make_x(n, cols, 40 + n as u64);
            let x = &xb[1..];
            let run = |rg: Range<usize>, x: &[f32], n| run_bf16(&mr, rg, x, n).unwrap();
            let full = run(0..rows, x, n);
            let what = format!("{kind:?} n {n}");
            assert_threads_agree(&full, &[1, 3], || run(0..rows, x, n), &what);
            assert_tokens_and_ranges_agree(
                run,
                (&full, rows, cols),
                &[3..rows, rows / 2..rows / 2 + 2, rows - 6..rows],
                (x, n),
                &what,
            );
        }
    });
}

/// What `bf16_products()` must be here: the AVX-512 tier on a CPU with avx512_bf16 that runs
/// it at full rate (AMD), or any with avx512_bf16 under `V4FLASH_BF16=on`; never under
/// `V4FLASH_BF16=off`.
fn bf16_products_expected() -> bool {
    let env = std::env::var("V4FLASH_BF16").ok();
    let (off, on) = (
        matches!(env.as_deref(), Some("off" | "0")),
        matches!(env.as_deref(), Some("on" | "1")),
    );
    #[cfg(target_arch = "x86_64")]
    let (has, full) = {
        let has = std::arch::is_x86_feature_detected!("avx512bf16");
        // CPUID leaf 0's vendor, read independently of the kernel's own helper
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 0 exists on every x86_64 CPU and reads identification only.
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let amd = (r.ebx, r.edx, r.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
        (has, amd)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (has, full) = (false, false);
    active_tier() == Tier::Avx512 && has && !off && (on || full)
}

#[test]
fn fast_and_official_dispatch_to_bf16_exactly_when_the_cpu_has_it() {
    let bits = |v: &[f32]| v.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
    for kind in [Kind::Fp4, Kind::Fp8] {
        let m = Mat::new(kind, 40, 256, 2);
        let mr = m.mat_ref();
        let n = 3;
        let xb = make_x(n, 256, 9);
        let x = &xb[1..];
        let mut xq = x.to_vec();
        fp8_act_qdq(&mut xq, 256);
        let run = |mode: Numerics| {
            let mut y = vec![0f32; n * 40];
            matmul_in(mode, &mr, 0..40, x, n, &mut y);
            y
        };
        let f32_on = |v: &[f32]| {
            let mut y = vec![0f32; n * 40];
            matmul(&mr, 0..40, v, n, &mut y);
            y
        };
        // what fast takes without bf16 products: the f32 kernels on the x86 tiers; on the
        // others int8 for FP4 and the f32 kernels for FP8; `V4FLASH_FAST_PRODUCTS` overrides
        assert_eq!(bf16_products(), bf16_products_expected());
        let forced = std::env::var("V4FLASH_FAST_PRODUCTS").ok();
        let want_products = if bf16_products() {
            FastProducts::Bf16
        } else if forced.as_deref() == Some("int8") {
            FastProducts::Int8
        } else if forced.as_deref() == Some("f32")
            || matches!(active_tier(), Tier::Avx512 | Tier::Avx2)
        {
            FastProducts::F32
        } else {
            FastProducts::Int8
        };
        assert_eq!(fast_products(), want_products);
        let fast_without = if kind == Kind::Fp4 && fast_products() == FastProducts::Int8 {
            let mut y = vec![0f32; n * 40];
            matmul_q8_tier(active_tier(), &mr, 0..40, x, n, &mut y).unwrap();
            y
        } else {
            f32_on(x)
        };
        match (run_bf16(&mr, 0..40, &xq, n), run_bf16(&mr, 0..40, x, n)) {
            (Ok(off_b), Ok(fast_b)) => {
                let (off_want, fast_want) = if bf16_products() {
                    (off_b, fast_b)
                } else {
                    (f32_on(&xq), fast_without)
                };
                assert_eq!(
                    bits(&run(Numerics::Official)),
                    bits(&off_want),
                    "{kind:?} official"
                );
                assert_eq!(
                    bits(&run(Numerics::Fast)),
                    bits(&fast_want),
                    "{kind:?} fast"
                );
            }
            (Err(e), _) | (_, Err(e)) => {
                assert!(e.contains("lacks avx512_bf16"), "{e}");
                assert!(!bf16_products());
                assert_eq!(
                    bits(&run(Numerics::Official)),
                    bits(&f32_on(&xq)),
                    "{kind:?}"
                );
                assert_eq!(bits(&run(Numerics::Fast)), bits(&fast_without), "{kind:?}");
            }
        }
        // fp8-act, the measurement mode, always runs the f32 kernels; exact is exact
        assert_eq!(bits(&run(Numerics::Fp8Act)), bits(&f32_on(&xq)));
        assert_eq!(bits(&run(Numerics::Exact)), bits(&f32_on(x)));
    }
    // other formats are refused here, and every mode multiplies them exactly
    let b = Mat::new(Kind::Bf16, 4, 64, 1);
    let mut y = vec![0f32; 4];
    let err = matmul_bf16(&b.mat_ref(), 0..4, &[0.0; 64], 1, &mut y).unwrap_err();
    assert!(err.contains("only for FP8 and FP4"), "{err}");
    let xb = make_x(1, 64, 2);
    let mut e = vec![0f32; 4];
    matmul(&b.mat_ref(), 0..4, &xb[1..], 1, &mut e);
    for mode in Numerics::ALL {
        matmul_in(mode, &b.mat_ref(), 0..4, &xb[1..], 1, &mut y);
        assert_eq!(bits(&y), bits(&e), "{}", mode.name());
    }
}
