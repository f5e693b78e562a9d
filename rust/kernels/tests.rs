//! Every tier against the portable twin and an f64 reference on the dequantized weights,
//! plus the determinism contract and exhaustive decode tables.
//!
//! Error budget: |y - ref| <= (cols / 4 + 16) * 2^-24 * sum|w * x| + 1e-37, the standard
//! bound for an f32 sum of that many rounded steps (one FMA chain of cols / lanes steps per
//! lane, a 4-step horizontal sum; the portable tier rounds twice per step).

use super::*;
use crate::dtype::{e4m3_to_f32, e8m0_to_f32, E2M1_LUT};

pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(super) fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub(super) fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    F32,
    Bf16,
    Fp8,
    Fp4,
}
const KINDS: [Kind; 4] = [Kind::F32, Kind::Bf16, Kind::Fp8, Kind::Fp4];

/// Owned test matrix with its f64 dequantization.
pub(super) struct Mat {
    pub(super) rows: usize,
    pub(super) cols: usize,
    kind: Kind,
    f: Vec<f32>,
    pub(super) q: Vec<u8>,
    pub(super) s: Vec<u8>,
    pub(super) deq: Vec<f64>, // [rows, cols]
}

impl Mat {
    pub(super) fn new(kind: Kind, rows: usize, cols: usize, seed: u64) -> Mat {
        let mut g = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) + 1);
        let mut m = Mat {
            rows,
            cols,
            kind,
            f: vec![],
            q: vec![],
            s: vec![],
            deq: vec![0.0; rows * cols],
        };
        match kind {
            Kind::F32 => {
                m.f = (0..rows * cols).map(|_| g.f32()).collect();
                for (d, &v) in m.deq.iter_mut().zip(&m.f) {
                    *d = v as f64;
                }
            }
            Kind::Bf16 => {
                for i in 0..rows * cols {
                    let b = (g.f32() * 4.0).to_bits() >> 16;
                    m.q.extend_from_slice(&(b as u16).to_le_bytes());
                    m.deq[i] = f32::from_bits(b << 16) as f64;
                }
            }
            Kind::Fp8 => {
                // every byte but the NaN codes, including subnormals
                m.q = (0..rows * cols)
                    .map(|_| loop {
                        let b = g.byte();
                        if b & 0x7F != 0x7F {
                            break b;
                        }
                    })
                    .collect();
                let sc = cols.div_ceil(128);
                m.s = (0..rows.div_ceil(128) * sc)
                    .map(|_| 118 + g.byte() % 16)
                    .collect();
                for r in 0..rows {
                    for c in 0..cols {
                        m.deq[r * cols + c] = e4m3_to_f32(m.q[r * cols + c]) as f64
                            * e8m0_to_f32(m.s[(r / 128) * sc + c / 128]) as f64;
                    }
                }
            }
            Kind::Fp4 => {
                m.q = (0..rows * cols / 2).map(|_| g.byte()).collect();
                m.s = (0..rows * cols / 32).map(|_| 120 + g.byte() % 12).collect();
                for r in 0..rows {
                    for c in 0..cols {
                        let b = m.q[(r * cols + c) / 2];
                        let nib = if c % 2 == 0 { b & 15 } else { b >> 4 };
                        m.deq[r * cols + c] = E2M1_LUT[nib as usize] as f64
                            * e8m0_to_f32(m.s[r * cols / 32 + c / 32]) as f64;
                    }
                }
            }
        }
        m
    }

    pub(super) fn mat_ref(&self) -> MatRef<'_> {
        let (q, scale) = (&self.q[..], &self.s[..]);
        let w = match self.kind {
            Kind::F32 => Weights::F32(&self.f),
            Kind::Bf16 => Weights::Bf16(q),
            Kind::Fp8 => Weights::Fp8 { q, scale },
            Kind::Fp4 => Weights::Fp4 { q, scale },
        };
        MatRef::new(self.rows, self.cols, w).unwrap()
    }

    /// (reference, budget) for y[t, r] over the row range.
    fn reference(&self, rows: Range<usize>, x: &[f32], n: usize) -> (Vec<f64>, Vec<f64>) {
        let nr = rows.len();
        let (mut y, mut b) = (vec![0.0; n * nr], vec![0.0; n * nr]);
        for t in 0..n {
            for (i, r) in rows.clone().enumerate() {
                let (mut s, mut a) = (0f64, 0f64);
                for c in 0..self.cols {
                    let p = self.deq[r * self.cols + c] * x[t * self.cols + c] as f64;
                    s += p;
                    a += p.abs();
                }
                y[t * nr + i] = s;
                b[t * nr + i] = (self.cols as f64 / 4.0 + 16.0) * 2f64.powi(-24) * a + 1e-37;
            }
        }
        (y, b)
    }
}

/// x [n, cols] deliberately misaligned (offset by one f32 into its allocation).
pub(super) fn make_x(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut g = Rng(seed + 77);
    (0..n * cols + 1).map(|_| g.f32()).collect()
}

pub(super) fn tiers() -> Vec<Tier> {
    let mut v = Vec::new();
    for t in Tier::ALL {
        if t.available() {
            v.push(t);
        } else {
            let why = match t {
                Tier::Avx2 | Tier::Avx512 if !cfg!(target_arch = "x86_64") => "an x86_64 tier",
                Tier::Neon | Tier::NeonDot if !cfg!(target_arch = "aarch64") => "an aarch64 tier",
                _ => "this CPU lacks it",
            };
            println!("SKIP kernel tier {}: {why}", t.name());
        }
    }
    v
}

pub(super) fn run_tier(t: Tier, m: &MatRef, rows: Range<usize>, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * rows.len()];
    matmul_tier(t, m, rows, x, n, &mut y).unwrap();
    y
}

/// `run()` in pools of each of `threads` threads gives `want`, bit for bit (`what`: the case).
pub(super) fn assert_threads_agree(
    want: &[f32],
    threads: &[usize],
    run: impl Fn() -> Vec<f32> + Send + Sync,
    what: &str,
) {
    for &t in threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap();
        let got = pool.install(&run);
        let same = got
            .iter()
            .zip(want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{what}: {t} threads differ");
    }
}

/// For each row range, `run(rows, x, n)` gives every token, bit for bit, what `run` gives that
/// token alone and what `full` (`run` over all `rows` rows of `cols` columns) holds for it.
pub(super) fn assert_tokens_and_ranges_agree(
    run: impl Fn(Range<usize>, &[f32], usize) -> Vec<f32>,
    (full, rows, cols): (&[f32], usize, usize),
    ranges: &[Range<usize>],
    (x, n): (&[f32], usize),
    what: &str,
) {
    for rg in ranges {
        let nr = rg.len();
        let y = run(rg.clone(), x, n);
        for t in 0..n {
            let y1 = run(rg.clone(), &x[t * cols..(t + 1) * cols], 1);
            for i in 0..nr {
                let (a, b, c) = (y[t * nr + i], y1[i], full[t * rows + rg.start + i]);
                assert!(
                    a.to_bits() == b.to_bits() && a.to_bits() == c.to_bits(),
                    "{what} rows {rg:?} token {t} row {i}: {a} / {b} / {c}"
                );
            }
        }
    }
}

fn shapes(kind: Kind) -> Vec<(usize, usize)> {
    if kind == Kind::Fp4 {
        vec![(1, 32), (3, 64), (130, 96), (259, 160), (5, 544)]
    } else {
        let mut v = Vec::new();
        for cols in 1..=33 {
            v.push((3, cols));
        }
        for cols in [63, 100, 127, 128, 129, 200, 255, 256, 257, 300] {
            v.push((5, cols));
        }
        v.push((130, 129));
        v.push((259, 300));
        v
    }
}

#[test]
fn kernels_match_f64_reference_and_portable() {
    for tier in tiers() {
        for kind in KINDS {
            for (si, (rows, cols)) in shapes(kind).into_iter().enumerate() {
                let m = Mat::new(kind, rows, cols, si as u64);
                let mr = m.mat_ref();
                let mut ranges: Vec<Range<usize>> = Vec::new();
                ranges.push(0..rows);
                if rows > 100 {
                    ranges.push(100..rows);
                    ranges.push(127..130);
                }
                for n in [1, 2, 3, 4, 5, 6, 7, 8, 9, 20] {
                    if rows * cols > 10_000 && n > 4 && n != 9 {
                        continue;
                    }
                    let xb = make_x(n, cols, (si * 31 + n) as u64);
                    let x = &xb[1..];
                    for rg in &ranges {
                        let y = run_tier(tier, &mr, rg.clone(), x, n);
                        let yp = run_tier(Tier::Portable, &mr, rg.clone(), x, n);
                        let (yr, bud) = m.reference(rg.clone(), x, n);
                        for i in 0..y.len() {
                            let ctx = || {
                                format!(
                                    "{} {kind:?} [{rows}x{cols}] rows {rg:?} n {n} i {i}",
                                    tier.name()
                                )
                            };
                            assert!(
                                (y[i] as f64 - yr[i]).abs() <= bud[i],
                                "{}: {} vs ref {} (budget {})",
                                ctx(),
                                y[i],
                                yr[i],
                                bud[i]
                            );
                            assert!(
                                ((y[i] - yp[i]) as f64).abs() <= 2.0 * bud[i],
                                "{}: {} vs portable {}",
                                ctx(),
                                y[i],
                                yp[i]
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn kernels_thread_count_bit_identical() {
    for tier in tiers() {
        for kind in KINDS {
            let (rows, cols) = if kind == Kind::Fp4 {
                (700, 256)
            } else {
                (700, 300)
            };
            let m = Mat::new(kind, rows, cols, 5);
            let mr = m.mat_ref();
            for n in [1, 5] {
                let xb = make_x(n, cols, 9);
                let x = &xb[1..];
                let run = || run_tier(tier, &mr, 3..rows, x, n);
                let what = format!("{} {kind:?} n {n}", tier.name());
                assert_threads_agree(&run(), &[1, 2, 3], run, &what);
            }
        }
    }
}

#[test]
fn kernels_n_tokens_and_row_ranges_bit_identical_to_single() {
    for tier in tiers() {
        for (kind, rows, cols) in KINDS.into_iter().flat_map(|k| {
            // the second shape spans several 512-column prefill panels, the third several
            // 4,096-column ones (`Simd::GEMM_PANEL` of the AVX-512 tier)
            let c = if k == Kind::Fp4 {
                [224, 1056, 8224]
            } else {
                [211, 1100, 8300]
            };
            [(k, 261, c[0]), (k, 19, c[1]), (k, 19, c[2])]
        }) {
            let m = Mat::new(kind, rows, cols, 11);
            let mr = m.mat_ref();
            // 13: FP4 fused passes where the tier goes past 8 (`FP4_FUSED_MAX`), 17: past
            // 16; 300: more than two of the prefill path's token blocks, and a partial one
            for n in [2, 3, 4, 7, 9, 13, 17, 40, 300] {
                let xb = make_x(n, cols, n as u64);
                let x = &xb[1..];
                let full = run_tier(tier, &mr, 0..rows, x, n);
                assert_tokens_and_ranges_agree(
                    |rg, x, n| run_tier(tier, &mr, rg, x, n),
                    (&full, rows, cols),
                    &[0..rows, 3..rows, rows / 2..rows / 2 + 2, rows - 6..rows],
                    (x, n),
                    &format!("{} {kind:?} n {n}", tier.name()),
                );
            }
        }
    }
}

/// y = W e_c for every column c, through both the one-token and the prefill path.
fn unit_responses(tier: Tier, m: &MatRef) -> (Vec<f32>, Vec<f32>) {
    let cols = m.cols;
    let mut eye = vec![0f32; cols * cols];
    for c in 0..cols {
        eye[c * cols + c] = 1.0;
    }
    let many = run_tier(tier, m, 0..1, &eye, cols);
    let one: Vec<f32> = (0..cols)
        .map(|c| run_tier(tier, m, 0..1, &eye[c * cols..(c + 1) * cols], 1)[0])
        .collect();
    (one, many)
}

#[test]
fn kernels_fp8_all_256_codes_exact() {
    let q: Vec<u8> = (0..=255).collect();
    let scale = [127u8, 127];
    let (q, scale) = (&q[..], &scale[..]);
    let m = MatRef::new(1, 256, Weights::Fp8 { q, scale }).unwrap();
    for tier in tiers() {
        let (one, many) = unit_responses(tier, &m);
        for b in 0..256usize {
            let want = if b & 0x7F == 0x7F {
                if b & 0x80 != 0 {
                    -480.0
                } else {
                    480.0
                }
            } else {
                e4m3_to_f32(b as u8)
            };
            assert_eq!(one[b], want, "{} byte {b:#x}", tier.name());
            assert_eq!(many[b], want, "{} byte {b:#x} (n > 1)", tier.name());
        }
    }
}

#[test]
fn kernels_fp4_all_16_codes_exact() {
    // byte k holds nibble k (even column 2k) and nibble 15 - k (odd column 2k + 1)
    let q: Vec<u8> = (0..16u8).map(|k| k | ((15 - k) << 4)).collect();
    let scale = [127u8];
    let (q, scale) = (&q[..], &scale[..]);
    let m = MatRef::new(1, 32, Weights::Fp4 { q, scale }).unwrap();
    for tier in tiers() {
        let (one, many) = unit_responses(tier, &m);
        for c in 0..32 {
            let nib = if c % 2 == 0 { c / 2 } else { 15 - c / 2 };
            assert_eq!(one[c], E2M1_LUT[nib], "{} col {c}", tier.name());
            assert_eq!(many[c], E2M1_LUT[nib], "{} col {c} (n > 1)", tier.name());
        }
    }
}

/// Every E2M1 code at every scale byte that keeps 6 * 2^(s - 127) finite (0..=252, subnormal
/// results included; from 253 the block's ±6 overflows and inf * 0 makes the whole row NaN),
/// alone in its column, on the one-token and the many-token paths: each tier's FP4 tables
/// (scaled in f32, or AVX2's per-scale byte tables) must give the exact product.
#[test]
fn kernels_fp4_every_code_at_every_scale_exact() {
    let rows = 253;
    // each row: byte k holds nibble k (even column 2k) and nibble 15 - k (odd column 2k + 1)
    let q: Vec<u8> = (0..rows)
        .flat_map(|_| (0..16u8).map(|k| k | ((15 - k) << 4)))
        .collect();
    let scale: Vec<u8> = (0..rows as u8).collect();
    let (q, scale) = (&q[..], &scale[..]);
    let m = MatRef::new(rows, 32, Weights::Fp4 { q, scale }).unwrap();
    let mut eye = vec![0f32; 32 * 32];
    for c in 0..32 {
        eye[c * 32 + c] = 1.0;
    }
    for tier in tiers() {
        let many = run_tier(tier, &m, 0..rows, &eye, 32);
        for c in 0..32 {
            let one = run_tier(tier, &m, 0..rows, &eye[c * 32..(c + 1) * 32], 1);
            let nib = if c % 2 == 0 { c / 2 } else { 15 - c / 2 };
            for (r, &s) in scale.iter().enumerate() {
                let want = E2M1_LUT[nib] as f64 * 2f64.powi(s as i32 - 127);
                let name = tier.name();
                assert_eq!(one[r] as f64, want, "{name} col {c} scale byte {s}");
                assert_eq!(
                    many[c * rows + r] as f64,
                    want,
                    "{name} col {c} scale {s} (n > 1)"
                );
            }
        }
    }
}

#[test]
fn kernels_e8m0_all_exponents_exact() {
    for tier in tiers() {
        for s in 0u8..255 {
            let want = 2f64.powi(s as i32 - 127);
            let q8 = [0x38u8]; // 1.0
            let sc = [s];
            let m = MatRef::new(1, 1, Weights::Fp8 { q: &q8, scale: &sc }).unwrap();
            let y = run_tier(tier, &m, 0..1, &[1.0], 1)[0];
            assert_eq!(y as f64, want, "{} fp8 scale byte {s}", tier.name());
            let mut q4 = [0u8; 16];
            q4[0] = 2; // 1.0 in column 0
            let m = MatRef::new(1, 32, Weights::Fp4 { q: &q4, scale: &sc }).unwrap();
            let mut x = [0f32; 32];
            x[0] = 1.0;
            let y = run_tier(tier, &m, 0..1, &x, 1)[0];
            assert_eq!(y as f64, want, "{} fp4 scale byte {s}", tier.name());
        }
    }
}

/// The fused FP8 path scales x by its block scales times 2^112 where a tier decodes the
/// weights as their bits (`Simd::fp8_bits`); an x that this would overflow (here 2^100)
/// must take the f16 route instead and give the same exact values as the panel path.
#[test]
fn kernels_fp8_huge_x_stays_finite_and_exact() {
    let (rows, cols) = (3, 256);
    // row r: 1.0 (0x38) everywhere, times 2^r through its bytes' exponent (0x38 + 8r)
    let q: Vec<u8> = (0..rows).flat_map(|r| [0x38 + 8 * r as u8; 256]).collect();
    let scale = [127u8, 127];
    let (q, scale) = (&q[..], &scale[..]);
    let m = MatRef::new(rows, cols, Weights::Fp8 { q, scale }).unwrap();
    let big = 2f32.powi(100);
    let mut x = vec![0f32; cols];
    x[5] = big;
    x[200] = -3.0;
    let xs: Vec<f32> = (0..9).flat_map(|_| x.iter().copied()).collect();
    for tier in tiers() {
        let one = run_tier(tier, &m, 0..rows, &x, 1);
        let many = run_tier(tier, &m, 0..rows, &xs, 9);
        for r in 0..rows {
            // 2^(100 + r) - 3 * 2^r rounds to 2^(100 + r) in f32
            let want = big * 2f32.powi(r as i32);
            assert_eq!(one[r], want, "{} row {r}", tier.name());
            for t in 0..9 {
                assert_eq!(
                    many[t * rows + r],
                    want,
                    "{} row {r} token {t}",
                    tier.name()
                );
            }
        }
    }
}

#[test]
fn kernels_bf16_unaligned_weights() {
    // bf16 bytes starting at an odd address
    let m = Mat::new(Kind::Bf16, 9, 37, 3);
    let mut buf = vec![0u8; 1];
    buf.extend_from_slice(&m.q);
    let mr = MatRef::new(9, 37, Weights::Bf16(&buf[1..])).unwrap();
    let xb = make_x(2, 37, 1);
    let (yr, bud) = m.reference(0..9, &xb[1..], 2);
    for tier in tiers() {
        let y = run_tier(tier, &mr, 0..9, &xb[1..], 2);
        for i in 0..y.len() {
            assert!(
                (y[i] as f64 - yr[i]).abs() <= bud[i],
                "{} i {i}",
                tier.name()
            );
        }
    }
}

#[test]
fn kernels_tier_selection() {
    for t in Tier::ALL {
        assert_eq!(Tier::from_name(t.name()), Some(t));
    }
    assert!(Tier::Portable.available());
    assert!(Tier::best().available());
    let active = active_tier();
    assert_eq!(tier_name(), active.name());
    match std::env::var("V4FLASH_KERNELS")
        .ok()
        .and_then(|s| Tier::from_name(&s))
    {
        Some(t) if t.available() => assert_eq!(active, t),
        _ => assert_eq!(active, Tier::best()),
    }
    println!("active kernel tier: {}", active.name());
    // CI runs the suite on several CPUs (qemu models) and says which tier each must pick
    if let Ok(want) = std::env::var("V4FLASH_EXPECT_BEST_TIER") {
        assert_eq!(
            Tier::best().name(),
            want,
            "run-time detection picked another tier"
        );
    }
    #[cfg(target_arch = "aarch64")]
    assert!(Tier::Neon.available(), "NEON is part of every aarch64 CPU");
    #[cfg(target_arch = "aarch64")]
    assert_eq!(
        Tier::NeonDot.available(),
        std::arch::is_aarch64_feature_detected!("dotprod")
    );
}

#[test]
fn kernels_matref_rejects_bad_lengths() {
    assert!(MatRef::new(2, 3, Weights::F32(&[0.0; 5])).is_err());
    // cols not a multiple of 32
    let (q, scale) = (&[0u8; 30][..], &[0u8; 2][..]);
    assert!(MatRef::new(2, 30, Weights::Fp4 { q, scale }).is_err());
    // 129 rows need two rows of block scales
    let (q, scale) = (&[0u8; 129][..], &[0u8; 1][..]);
    assert!(MatRef::new(129, 1, Weights::Fp8 { q, scale }).is_err());
}

/// FNV-1a over the output bits of every tier for every format, one-token and prefill paths,
/// odd shapes and row ranges: pins each tier's exact results (refactors must keep them).
fn golden_hash(tier: Tier) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for kind in KINDS {
        let shapes: &[(usize, usize)] = if kind == Kind::Fp4 {
            &[(1, 32), (7, 96), (133, 544), (20, 1056)]
        } else {
            &[(3, 1), (5, 17), (9, 127), (133, 300), (20, 1100)]
        };
        for (si, &(rows, cols)) in shapes.iter().enumerate() {
            let m = Mat::new(kind, rows, cols, 100 + si as u64);
            let mr = m.mat_ref();
            for n in [1, 2, 5, 13] {
                let xb = make_x(n, cols, (si * 7 + n) as u64);
                for rg in [0..rows, rows / 3..rows] {
                    for v in run_tier(tier, &mr, rg, &xb[1..], n) {
                        for b in v.to_bits().to_le_bytes() {
                            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
                        }
                    }
                }
            }
        }
    }
    h
}

#[test]
fn kernels_golden_outputs() {
    let want = [
        (Tier::Avx512, 0x9cfc_797a_ea5c_81ec),
        (Tier::Avx2, 0x95b9_5bb9_e2f4_563a),
        // 8 fused lanes with the default FP4 column order and AVX2's lane sum: the bits
        // AVX2 gave before its FP4 decode moved to whole-block byte shuffles
        (Tier::NeonDot, 0x02e0_1f0e_dda2_2755),
        (Tier::Neon, 0x02e0_1f0e_dda2_2755),
        (Tier::Portable, 0x41c8_960d_aa14_df4c),
    ];
    let mut bad = Vec::new();
    for (tier, h) in want {
        if tier.available() {
            let got = golden_hash(tier);
            println!("{} {got:#018x}", tier.name());
            if got != h {
                bad.push(tier.name());
            }
        }
    }
    assert!(bad.is_empty(), "outputs changed: {bad:?}");
}

/// The attention head against an f64 reference on every tier: probabilities from the dots,
/// the softmax with the sink, the weighted key sum; odd widths and key counts included.
#[test]
fn kernels_attend_matches_f64_reference() {
    let mut rng = Rng(0x5eed_a77e);
    for tier in Tier::ALL.into_iter().filter(|t| t.available()) {
        for &d in &[1usize, 8, 16, 50, 64, 128, 512] {
            for &nk in &[1usize, 3, 4, 5, 9, 130] {
                let q: Vec<f32> = (0..d).map(|_| rng.f32()).collect();
                let keys: Vec<Vec<f32>> = (0..nk)
                    .map(|_| (0..d + 3).map(|_| rng.f32() * 2.0).collect())
                    .collect();
                let kr: Vec<&[f32]> = keys.iter().map(|k| &k[..]).collect();
                let (scale, sink) = (0.7f32, 0.3f32);
                let mut out = vec![f32::NAN; d];
                attend_tier(tier, &q, &kr, scale, &[sink], &mut out).unwrap();
                // f64 reference
                let mut lg: Vec<f64> = kr
                    .iter()
                    .map(|k| (0..d).map(|i| q[i] as f64 * k[i] as f64).sum::<f64>() * scale as f64)
                    .collect();
                lg.push(sink as f64);
                let m = lg.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = lg.iter().map(|v| (v - m).exp()).sum();
                for i in 0..d {
                    let want: f64 = kr
                        .iter()
                        .zip(&lg)
                        .map(|(k, l)| (l - m).exp() / z * k[i] as f64)
                        .sum();
                    let tol = 1e-5 * (1.0 + want.abs()) * (d as f64).sqrt();
                    assert!(
                        (out[i] as f64 - want).abs() <= tol,
                        "{} d={d} keys={nk} col {i}: {} vs {want}",
                        tier.name(),
                        out[i]
                    );
                }
            }
        }
    }
}

/// Heads attended together (four at a time, the rest alone) give every head, bit for bit,
/// what it gets alone, on every tier: odd widths, key counts and head counts included.
#[test]
fn kernels_attend_heads_together_equal_each_head_alone() {
    let mut rng = Rng(0x4ead5);
    for tier in Tier::ALL.into_iter().filter(|t| t.available()) {
        for &d in &[1usize, 8, 16, 50, 64, 512] {
            for &nk in &[1usize, 2, 3, 5, 130] {
                for &h in &[1usize, 3, 4, 6, 8, 9] {
                    let q: Vec<f32> = (0..h * d).map(|_| rng.f32()).collect();
                    let keys: Vec<Vec<f32>> = (0..nk)
                        .map(|_| (0..d + 3).map(|_| rng.f32() * 2.0).collect())
                        .collect();
                    let kr: Vec<&[f32]> = keys.iter().map(|k| &k[..]).collect();
                    let sinks: Vec<f32> = (0..h).map(|_| rng.f32()).collect();
                    let mut all = vec![f32::NAN; h * d];
                    attend_tier(tier, &q, &kr, 0.3, &sinks, &mut all).unwrap();
                    for i in 0..h {
                        let mut one = vec![f32::NAN; d];
                        let qi = &q[i * d..(i + 1) * d];
                        attend_tier(tier, qi, &kr, 0.3, &sinks[i..i + 1], &mut one).unwrap();
                        let got = &all[i * d..(i + 1) * d];
                        assert!(
                            got.iter()
                                .zip(&one)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{} d={d} keys={nk} heads={h}: head {i} differs",
                            tier.name()
                        );
                    }
                }
            }
        }
    }
}

/// One key whose probability is 1 comes back exactly (whatever its place in a group of
/// four), and reordering the keys changes the result at rounding level only.
#[test]
fn kernels_attend_single_key_is_exact_and_key_order_only_rounds() {
    let mut rng = Rng(77);
    let d = 96;
    let q: Vec<f32> = (0..d).map(|_| rng.f32()).collect();
    let keys: Vec<Vec<f32>> = (0..9)
        .map(|_| (0..d).map(|_| rng.f32()).collect())
        .collect();
    let kr: Vec<&[f32]> = keys.iter().map(|k| &k[..]).collect();
    for tier in Tier::ALL.into_iter().filter(|t| t.available()) {
        // one key and a sink of -inf: p = [1], out = that key exactly
        for j in 0..kr.len() {
            let mut out = vec![0f32; d];
            let one = [kr[j]];
            attend_tier(tier, &q, &one, 1.0, &[f32::NEG_INFINITY], &mut out).unwrap();
            assert_eq!(out, keys[j], "{} key {j} alone", tier.name());
        }
        // the same keys in another order: the same dots feed the same softmax terms
        let mut a = vec![0f32; d];
        let mut b = vec![0f32; d];
        attend_tier(tier, &q, &kr, 0.1, &[0.0], &mut a).unwrap();
        let mut kr2 = kr.clone();
        kr2.rotate_left(1);
        attend_tier(tier, &q, &kr2, 0.1, &[0.0], &mut b).unwrap();
        for i in 0..d {
            assert!(
                (a[i] - b[i]).abs() <= 1e-6 * (1.0 + a[i].abs()),
                "{}",
                tier.name()
            );
        }
    }
}

/// `ops::dot` (the RMSNorms' and hyper-connections' dot product, `generic::dot16`) gives the
/// bits of its definition, 16 lanes of separate multiplies and adds reduced in a fixed tree,
/// on every tier this CPU runs and on the active one, at every length and remainder.
#[test]
fn kernels_portable_dot_is_its_16_lane_definition() {
    fn reference(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            acc[i % 16] += x * y;
        }
        for h in [8, 4, 2, 1] {
            for i in 0..h {
                acc[i] += acc[i + h];
            }
        }
        acc[0]
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        // magnitudes from 2^-20 to 2^20, either sign: sums that round at every step
        let m = (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        m * 2f32.powi((seed % 41) as i32 - 20)
    };
    for len in (0..80).chain([1000, 4095, 16384]) {
        let a: Vec<f32> = (0..len).map(|_| next()).collect();
        let b: Vec<f32> = (0..len + 3).map(|_| next()).collect();
        let want = reference(&a, &b[..len]).to_bits();
        assert_eq!(ops::dot(&a, &b).to_bits(), want, "len {len}");
        for tier in tiers() {
            let got = tier::with_kernel!(tier, k => generic::Kernel::dot16(k, &a, &b));
            assert_eq!(got.to_bits(), want, "{} len {len}", tier.name());
        }
    }
}
