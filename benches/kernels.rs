//! Kernel throughput next to the machine's own limits, in one short run:
//!
//! - `stream/*`: a plain sum over a 2 GiB f32 buffer: the measured read bandwidth every
//!   decode kernel should be compared with;
//! - `decode/*`: one-token matvec over the checkpoint's real shapes, `Throughput::Bytes`
//!   = weight + scale bytes; each iteration uses the next of several copies (>= 2 GiB in
//!   all) so weights come from DRAM as in real decode, not from the L3 (up to 260 MiB on
//!   the machine this was written on; its adaptive replacement keeps part of a cyclic
//!   working set a few times larger, hence 2 GiB for both);
//! - `fma_peak/*` and `prefill/*`: a register-only FMA loop and the n-token matmul, both as
//!   `Throughput::Elements` of f32 flops, so elem/s reads as FLOP/s.
//!
//! Every available tier, on 1 thread and on all threads, plus `bf16` (official numerics'
//! `vdpbf16ps` path for FP8/FP4, where the CPU has avx512_bf16). Short by design (10
//! samples).

mod common;

use _core::kernels::{fma_probe, matmul_bf16, matmul_q8_tier, matmul_tier, MatRef, Tier};
use common::{make, mat, ring, Kind};
use criterion::{criterion_group, BenchmarkId, Criterion, SamplingMode, Throughput};
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Duration;

/// True under `cargo bench` (which passes `--bench`).
fn full_size() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn ring_bytes() -> usize {
    if full_size() {
        2 << 30
    } else {
        0
    }
}

fn pools() -> Vec<(usize, rayon::ThreadPool)> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![1];
    if all > 1 {
        v.push(all);
    }
    v.into_iter()
        .map(|t| {
            let p = rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap();
            (t, p)
        })
        .collect()
}

fn tiers() -> Vec<Tier> {
    Tier::ALL.into_iter().filter(|t| t.available()).collect()
}

/// Whether the CPU runs official numerics' `vdpbf16ps` path.
fn has_bf16() -> bool {
    let o = make(Kind::Fp4, 1, 32, 0);
    matmul_bf16(&mat(Kind::Fp4, 1, 32, &o), 0..1, &[0.0; 32], 1, &mut [0.0]).is_ok()
}

fn stream(c: &mut Criterion) {
    let bytes: usize = if full_size() { 2 << 30 } else { 16 << 20 };
    let buf = vec![1f32; bytes / 4];
    let mut g = c.benchmark_group("stream");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Bytes(bytes as u64));
    for (t, pool) in pools() {
        g.bench_function(BenchmarkId::new("sum_f32_2GiB", format!("{t}t")), |b| {
            b.iter(|| {
                pool.install(|| {
                    buf.par_chunks(1 << 20)
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
                        .sum::<f32>()
                })
            })
        });
    }
}

fn decode(c: &mut Criterion) {
    let shapes: [(&str, Kind, usize, usize); 5] = [
        ("fp8_wq_b_32768x1024", Kind::Fp8, 32768, 1024),
        ("fp8_wo_b_4096x8192", Kind::Fp8, 4096, 8192),
        ("fp4_w13_4096x4096", Kind::Fp4, 4096, 4096),
        ("fp4_w2_4096x2048", Kind::Fp4, 4096, 2048),
        ("bf16_head_16384x4096", Kind::Bf16, 16384, 4096),
    ];
    let pools = pools();
    let mut g = c.benchmark_group("decode");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (name, kind, rows, cols) in shapes {
        let ring = ring(kind, rows, cols, ring_bytes());
        let bytes = mat(kind, rows, cols, &ring[0]).bytes();
        let mats: Vec<MatRef> = ring.iter().map(|o| mat(kind, rows, cols, o)).collect();
        let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes(bytes as u64));
        for tier in tiers() {
            for (t, pool) in &pools {
                let id = BenchmarkId::new(name, format!("{}/{t}t", tier.name()));
                let mut i = 0;
                g.bench_function(id, |b| {
                    b.iter(|| {
                        i = (i + 1) % mats.len();
                        pool.install(|| matmul_tier(tier, &mats[i], 0..rows, &x, 1, &mut y))
                            .unwrap();
                        black_box(&y);
                    })
                });
                if kind == Kind::Fp4 {
                    // fast numerics: int8 activations
                    let id = BenchmarkId::new(name, format!("{}-fast/{t}t", tier.name()));
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            i = (i + 1) % mats.len();
                            pool.install(|| matmul_q8_tier(tier, &mats[i], 0..rows, &x, 1, &mut y))
                                .unwrap();
                            black_box(&y);
                        })
                    });
                }
            }
        }
        if kind != Kind::Bf16 && has_bf16() {
            for (t, pool) in &pools {
                let id = BenchmarkId::new(name, format!("bf16/{t}t"));
                let mut i = 0;
                g.bench_function(id, |b| {
                    b.iter(|| {
                        i = (i + 1) % mats.len();
                        pool.install(|| matmul_bf16(&mats[i], 0..rows, &x, 1, &mut y))
                            .unwrap();
                        black_box(&y);
                    })
                });
            }
        }
    }
}

fn prefill(c: &mut Criterion) {
    let pools = pools();
    let mut g = c.benchmark_group("fma_peak");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(500));
    let iters = 1 << 20;
    for tier in tiers() {
        let flops = fma_probe(tier, 1).unwrap().1 * iters as u64;
        g.throughput(Throughput::Elements(flops));
        g.bench_function(
            BenchmarkId::new("register_fma", format!("{}/1t", tier.name())),
            |b| b.iter(|| black_box(fma_probe(tier, black_box(iters)))),
        );
    }
    drop(g);

    let mut g = c.benchmark_group("prefill");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sampling_mode(SamplingMode::Flat);
    // 1024x4096 (wq_a-like), 32768x1024 (wq_b: short rows, many row groups)
    for (kname, kind, rows, cols) in [
        ("fp8", Kind::Fp8, 1024, 4096),
        ("fp8", Kind::Fp8, 32768, 1024),
        ("fp4", Kind::Fp4, 1024, 4096),
    ] {
        let o = make(kind, rows, cols, 3);
        let m = mat(kind, rows, cols, &o);
        // n = 6: what one routed expert sees in a ~256-token prefill chunk (6 of 256 experts
        // per token), the batch size that dominates expert compute below thousands of tokens;
        // n = 2048: a dense projection over a whole prefill span (x no longer fits in L2)
        let ns: &[usize] = if rows == 1024 && kind == Kind::Fp8 {
            &[6, 64, 512, 2048]
        } else {
            &[6, 64, 512]
        };
        for &n in ns {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| (i % 11) as f32 * 0.05 - 0.25)
                .collect();
            let mut y = vec![0f32; n * rows];
            g.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
            for tier in tiers() {
                if tier == Tier::Portable && n > 64 {
                    continue;
                }
                for (t, pool) in &pools {
                    let id = BenchmarkId::new(
                        format!("{kname}_{rows}x{cols}_n{n}"),
                        format!("{}/{t}t", tier.name()),
                    );
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            pool.install(|| matmul_tier(tier, &m, 0..rows, &x, n, &mut y))
                                .unwrap();
                            black_box(&y);
                        })
                    });
                    if kind == Kind::Fp4 {
                        let id = BenchmarkId::new(
                            format!("{kname}_{rows}x{cols}_n{n}"),
                            format!("{}-fast/{t}t", tier.name()),
                        );
                        g.bench_function(id, |b| {
                            b.iter(|| {
                                pool.install(|| matmul_q8_tier(tier, &m, 0..rows, &x, n, &mut y))
                                    .unwrap();
                                black_box(&y);
                            })
                        });
                    }
                }
            }
            if has_bf16() {
                for (t, pool) in &pools {
                    let id = BenchmarkId::new(
                        format!("{kname}_{rows}x{cols}_n{n}"),
                        format!("bf16/{t}t"),
                    );
                    g.bench_function(id, |b| {
                        b.iter(|| {
                            pool.install(|| matmul_bf16(&m, 0..rows, &x, n, &mut y))
                                .unwrap();
                            black_box(&y);
                        })
                    });
                }
            }
        }
    }
}

criterion_group!(benches, stream, decode, prefill);

fn main() {
    // `cargo test --all-targets` runs bench targets too, with libtest flags (such as
    // `--test-threads`) that criterion's command line rejects; the kernels are covered by the
    // unit tests, so outside `cargo bench` this only says how to run it.
    if !full_size() {
        println!("kernels bench: run with `cargo bench --bench kernels`");
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
