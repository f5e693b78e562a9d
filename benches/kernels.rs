//! Kernel throughput next to the machine's own limits, in one short run:
//!
//! - `stream/*`: the engine's memory probe (`probe::mem_read_gbs`, a plain sum over a 2 GiB
//!   f32 buffer, as `kernels_ab` runs it): the measured read bandwidth every decode kernel
//!   should be compared with;
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
use _core::probe::mem_read_gbs;
use common::{make, mat, ring, Kind};
use criterion::measurement::WallTime;
use criterion::{
    criterion_group, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode, Throughput,
};
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

/// One thread, and all of them.
fn thread_counts() -> Vec<usize> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![1];
    if all > 1 {
        v.push(all);
    }
    v
}

fn pools() -> Vec<(usize, rayon::ThreadPool)> {
    thread_counts()
        .into_iter()
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
    let bytes: usize = 2 << 30;
    let mut g = c.benchmark_group("stream");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Bytes(bytes as u64));
    for t in thread_counts() {
        g.bench_function(BenchmarkId::new("sum_f32_2GiB", format!("{t}t")), |b| {
            // the probe reads the buffer `iters` times (after filling it once) and reports
            // its best pass: that pass's time, `iters` times
            b.iter_custom(|iters| {
                let gbs = mem_read_gbs(bytes, t, iters as usize).expect("the memory probe ran");
                Duration::from_secs_f64(bytes as f64 / (gbs * 1e9) * iters as f64)
            })
        });
    }
}

/// `product` once per iteration on `pool`, in `g` as `id` (its tier was checked before).
fn bench_on(
    g: &mut BenchmarkGroup<WallTime>,
    id: BenchmarkId,
    pool: &rayon::ThreadPool,
    mut product: impl FnMut() -> Result<(), String> + Send,
) {
    g.bench_function(id, |b| {
        b.iter(|| pool.install(&mut product).expect("the tier was checked"))
    });
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
        // the next matrix of the ring at each iteration
        let mut i = 0;
        let mut next = || {
            i = (i + 1) % mats.len();
            &mats[i]
        };
        for tier in tiers() {
            for (t, pool) in &pools {
                let id = BenchmarkId::new(name, format!("{}/{t}t", tier.name()));
                bench_on(&mut g, id, pool, || {
                    matmul_tier(tier, next(), 0..rows, &x, 1, black_box(&mut y))
                });
                if kind == Kind::Fp4 {
                    // fast numerics: int8 activations
                    let id = BenchmarkId::new(name, format!("{}-fast/{t}t", tier.name()));
                    bench_on(&mut g, id, pool, || {
                        matmul_q8_tier(tier, next(), 0..rows, &x, 1, black_box(&mut y))
                    });
                }
            }
        }
        if kind != Kind::Bf16 && has_bf16() {
            for (t, pool) in &pools {
                let id = BenchmarkId::new(name, format!("bf16/{t}t"));
                bench_on(&mut g, id, pool, || {
                    matmul_bf16(next(), 0..rows, &x, 1, black_box(&mut y))
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
            let shape = format!("{kname}_{rows}x{cols}_n{n}");
            g.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
            for tier in tiers() {
                if tier == Tier::Portable && n > 64 {
                    continue;
                }
                for (t, pool) in &pools {
                    let id = BenchmarkId::new(&shape, format!("{}/{t}t", tier.name()));
                    bench_on(&mut g, id, pool, || {
                        matmul_tier(tier, &m, 0..rows, &x, n, black_box(&mut y))
                    });
                    if kind == Kind::Fp4 {
                        let id = BenchmarkId::new(&shape, format!("{}-fast/{t}t", tier.name()));
                        bench_on(&mut g, id, pool, || {
                            matmul_q8_tier(tier, &m, 0..rows, &x, n, black_box(&mut y))
                        });
                    }
                }
            }
            if has_bf16() {
                for (t, pool) in &pools {
                    let id = BenchmarkId::new(&shape, format!("bf16/{t}t"));
                    bench_on(&mut g, id, pool, || {
                        matmul_bf16(&m, 0..rows, &x, n, black_box(&mut y))
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
