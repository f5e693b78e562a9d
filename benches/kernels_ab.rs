//! One kernel, one tier, measured against the machine in the same process, round after
//! round: for A/B comparisons on a noisy machine (run the same command on two builds,
//! alternating, and compare the medians of the ratios).
//!
//! ```text
//! cargo bench --bench kernels_ab -- decode  fp4|fp8|bf16 ROWS COLS TIER [ROUNDS]
//! cargo bench --bench kernels_ab -- prefill fp4|fp8|bf16 ROWS COLS TIER TOKENS [ROUNDS]
//! ```
//!
//! - `decode`: a one-token matvec over a ring of copies of the matrix (>= 2 GiB in all, so
//!   the weights come from DRAM as in real decode), each round next to a plain 2 GiB f32 sum
//!   on all threads (the streaming read). Prints GiB/s and the median of the per-round
//!   ratios to the stream.
//! - `prefill`: the TOKENS-token product of one matrix (cache-resident when it fits), each
//!   round next to the register-only FMA loop on all threads. Prints GFLOP/s and the median
//!   of the per-round ratios to that peak.
//!
//! Weights are random bytes in the checkpoint's formats (as `kernels.rs` makes them).

use _core::kernels::{fma_probe, matmul_tier, MatRef, Tier, Weights};
use rayon::prelude::*;
use std::time::Instant;

struct Rng(u64);
impl Rng {
    fn byte(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u8
    }
}

/// (q or bf16 bytes, scale bytes) of a random [rows, cols] matrix.
fn make(kind: &str, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut g = Rng(12345);
    match kind {
        "fp8" => (
            (0..rows * cols).map(|_| g.byte() & 0xF7).collect(),
            (0..rows.div_ceil(128) * cols.div_ceil(128))
                .map(|_| 120 + g.byte() % 8)
                .collect(),
        ),
        "fp4" => (
            (0..rows * cols / 2).map(|_| g.byte()).collect(),
            (0..rows * cols / 32).map(|_| 120 + g.byte() % 8).collect(),
        ),
        _ => (
            (0..rows * cols)
                .flat_map(|_| {
                    let hi = (g.byte() & 0x80) | 0x3C | (g.byte() & 1);
                    [g.byte(), hi]
                })
                .collect(),
            vec![],
        ),
    }
}

fn mat<'a>(kind: &str, rows: usize, cols: usize, q: &'a [u8], s: &'a [u8]) -> MatRef<'a> {
    let w = match kind {
        "fp8" => Weights::Fp8 { q, scale: s },
        "fp4" => Weights::Fp4 { q, scale: s },
        _ => Weights::Bf16(q),
    };
    MatRef::new(rows, cols, w).expect("the matrix matches its shape")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// GiB/s of a plain sum over `buf` on all threads.
fn stream(buf: &[f32]) -> f64 {
    let t0 = Instant::now();
    let v: f32 = buf
        .par_chunks(1 << 20)
        .map(|ch| {
            // 64 independent lanes: bound by memory, not by add latency
            let mut acc = [0f32; 64];
            for v in ch.chunks_exact(64) {
                for l in 0..64 {
                    acc[l] += v[l];
                }
            }
            acc.iter().sum::<f32>()
        })
        .sum();
    std::hint::black_box(v);
    (buf.len() * 4) as f64 / t0.elapsed().as_secs_f64() / (1u64 << 30) as f64
}

fn decode(kind: &str, rows: usize, cols: usize, tier: Tier, rounds: usize) {
    let (q, s) = make(kind, rows, cols);
    let bytes = q.len() + s.len();
    let copies = (2usize << 30).div_ceil(bytes).max(2);
    let ring: Vec<Vec<u8>> = (0..copies).map(|_| q.clone()).collect();
    let mats: Vec<MatRef> = ring.iter().map(|q| mat(kind, rows, cols, q, &s)).collect();
    let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let mut y = vec![0f32; rows];
    let sbuf = vec![1f32; (2 << 30) / 4];
    let (mut st, mut k) = (vec![], vec![]);
    for _ in 0..rounds {
        st.push(stream(&sbuf));
        let t0 = Instant::now();
        for m in &mats {
            matmul_tier(tier, m, 0..rows, &x, 1, &mut y).expect("the tier is available");
        }
        std::hint::black_box(&y);
        k.push((bytes * copies) as f64 / t0.elapsed().as_secs_f64() / (1u64 << 30) as f64);
    }
    let ratio: Vec<f64> = k.iter().zip(&st).map(|(a, b)| a / b * 100.0).collect();
    println!(
        "decode {kind} {rows}x{cols} {}: {:.1} GiB/s, stream {:.1} GiB/s, {:.0} % of the stream (medians of {rounds})",
        tier.name(),
        median(k),
        median(st),
        median(ratio)
    );
}

fn prefill(kind: &str, rows: usize, cols: usize, tier: Tier, n: usize, rounds: usize) {
    let (q, s) = make(kind, rows, cols);
    let m = mat(kind, rows, cols, &q, &s);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| (i % 11) as f32 * 0.05 - 0.25)
        .collect();
    let mut y = vec![0f32; n * rows];
    let flops = (2 * rows * cols * n) as f64;
    let reps = ((4e9 / flops) as usize).max(1);
    let threads = rayon::current_num_threads();
    let (mut pk, mut gf) = (vec![], vec![]);
    for _ in 0..rounds {
        let t0 = Instant::now();
        let f: u64 = (0..threads)
            .into_par_iter()
            .map(|_| fma_probe(tier, 1 << 22).map_or(0, |p| p.1))
            .sum();
        pk.push(f as f64 / t0.elapsed().as_secs_f64() / 1e9);
        let t0 = Instant::now();
        for _ in 0..reps {
            matmul_tier(tier, &m, 0..rows, &x, n, &mut y).expect("the tier is available");
        }
        std::hint::black_box(&y);
        gf.push(flops * reps as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    let ratio: Vec<f64> = gf.iter().zip(&pk).map(|(a, b)| a / b * 100.0).collect();
    println!(
        "prefill {kind} {rows}x{cols} n={n} {}: {:.0} GFLOP/s, FMA peak {:.0} GFLOP/s, {:.0} % of the peak (medians of {rounds})",
        tier.name(),
        median(gf),
        median(pk),
        median(ratio)
    );
}

const USAGE: &str = "usage: cargo bench --bench kernels_ab -- decode fp4|fp8|bf16 ROWS COLS TIER [ROUNDS]\n       cargo bench --bench kernels_ab -- prefill fp4|fp8|bf16 ROWS COLS TIER TOKENS [ROUNDS]";

fn main() {
    // `cargo test --all-targets` runs bench targets too; only `cargo bench` (which passes
    // `--bench`) measures.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !std::env::args().any(|a| a == "--bench") || args.len() < 5 {
        println!("{USAGE}");
        return;
    }
    let num = |i: usize, what: &str| -> Option<usize> {
        let v = args.get(i)?.parse().ok();
        if v.is_none() {
            println!("{what} must be a number\n{USAGE}");
        }
        v
    };
    let kind = args[1].as_str();
    let (Some(rows), Some(cols)) = (num(2, "ROWS"), num(3, "COLS")) else {
        return;
    };
    let Some(tier) = Tier::from_name(&args[4]).filter(|t| t.available()) else {
        println!(
            "{} is not a kernel tier this CPU runs ({})",
            args[4],
            Tier::names()
        );
        return;
    };
    if !["fp4", "fp8", "bf16"].contains(&kind) || (kind == "fp4" && cols % 32 != 0) {
        println!("KIND is fp4 (COLS a multiple of 32), fp8 or bf16\n{USAGE}");
        return;
    }
    match args[0].as_str() {
        "decode" => decode(kind, rows, cols, tier, num(5, "ROUNDS").unwrap_or(7)),
        "prefill" => {
            let Some(n) = num(5, "TOKENS") else { return };
            prefill(kind, rows, cols, tier, n, num(6, "ROUNDS").unwrap_or(5))
        }
        _ => println!("{USAGE}"),
    }
}
