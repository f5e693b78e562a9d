//! One kernel, one tier, measured against the machine in the same process, round after
//! round: for A/B comparisons on a noisy machine (run the same command on two builds,
//! alternating, and compare the medians of the ratios).
//!
//! ```text
//! cargo bench --bench kernels_ab -- decode  fp4|fp8|bf16|fp4-fast|fp8-bf16|fp4-bf16 ROWS COLS TIER [ROUNDS] [RING_MIB]
//! cargo bench --bench kernels_ab -- prefill fp4|fp8|bf16|fp4-fast|fp8-bf16|fp4-bf16 ROWS COLS TIER TOKENS [ROUNDS]
//! cargo bench --bench kernels_ab -- expert  fp4|fp8|bf16 INTER HIDDEN TIER [ROUNDS]
//! cargo bench --bench kernels_ab -- wave    fp4|fp8|bf16 INTER HIDDEN TIER EXPERTS [ROUNDS]
//! cargo bench --bench kernels_ab -- attend  KEYS DIM TIER HEADS [ROUNDS]
//! cargo bench --bench kernels_ab -- dot     LEN [ROUNDS]
//! ```
//!
//! `fp4-fast`: the FP4 product of fast numerics without bf16 products (int8 activations,
//! `matmul_q8_tier`); `fp8-bf16`, `fp4-bf16`: the `vdpbf16ps` products of fast and official
//! numerics (`matmul_bf16`, CPUs with avx512_bf16; TIER is then only the FMA probe's); the
//! others run the exact kernels.
//!
//! - `decode`: a one-token matvec over a ring of copies of the matrix (>= RING_MIB in all,
//!   2048 by default, so the weights come from DRAM as in real decode; a ring within L2
//!   measures the kernel's arithmetic instead), >= 2 GiB of weights per round, each round
//!   next to the engine's memory probe (`probe::mem_read_gbs`: a plain sum over 2 GiB on all
//!   threads, the streaming read). Prints GB/s and the median of the per-round ratios.
//! - `decode` and `prefill` time their products inside one `install` on a pool, as the
//!   engine runs them from its workers.
//! - `prefill`: the TOKENS-token product of one matrix (cache-resident when it fits), each
//!   round next to the register-only FMA loop of the same tier on all threads
//!   (`kernels::fma_probe`). Prints GFLOP/s and the median of the per-round ratios to that
//!   peak.
//! - `expert`: one token through a ring of experts, w1 and w3 one after the other against
//!   side by side (`expert` below).
//! - `attend`: HEADS heads of one query against KEYS shared keys of DIM columns, one head per
//!   call against all in one call (`attend` below), on one thread.
//! - `dot`: the two f32 dot products of LEN columns (from L1) on one thread, on the active tier
//!   (`V4FLASH_KERNELS` picks it): `ops::dot` (the RMSNorms' and hyper-connection mixes', 16
//!   fixed lanes) and `kernels::dot` (the indexer's, the tier's FMA lanes). Prints GFLOP/s.
//! - `wave`: one token through the same ring, each expert in its own `install` against
//!   EXPERTS experts at a time in one (`wave` below), next to the streaming read.

mod common;

use _core::kernels::{
    attend_tier, fma_probe, matmul_bf16, matmul_q8_tier, matmul_tier, ops, tier_name, MatRef, Tier,
};
use _core::probe::mem_read_gbs;
use common::{make, mat, ring, Kind, Owned};
use rayon::prelude::*;
use std::time::Instant;

/// `copies` experts (w1, w3 [inter, hidden], w2 [hidden, inter]) of >= 2 GiB in all, so
/// the weights come from DRAM; and the bytes of one.
fn expert_ring(kind: Kind, inter: usize, hidden: usize) -> (Vec<[Owned; 3]>, usize) {
    let (w13, w2) = (make(kind, inter, hidden, 1), make(kind, hidden, inter, 2));
    let one = 2 * mat(kind, inter, hidden, &w13).bytes() + mat(kind, hidden, inter, &w2).bytes();
    let copies = (2usize << 30).div_ceil(one);
    let c = |o: &Owned| Owned {
        q: o.q.clone(),
        s: o.s.clone(),
    };
    let ring = (0..copies).map(|_| [c(&w13), c(&w13), c(&w2)]).collect();
    (ring, one)
}

/// One token through expert `e` ([w1, w3, w2]) as the engine runs it, w1 and w3 one after
/// the other or (`joined`) side by side; the caller is on the pool.
fn expert_token(
    (kind, inter, hidden, tier): (Kind, usize, usize, Tier),
    e: &[Owned; 3],
    x: &[f32],
    joined: bool,
) -> Vec<f32> {
    let (m1, m3) = (
        mat(kind, inter, hidden, &e[0]),
        mat(kind, inter, hidden, &e[1]),
    );
    let m2 = mat(kind, hidden, inter, &e[2]);
    let (mut g, mut u) = (vec![0f32; inter], vec![0f32; inter]);
    let r1 = |g: &mut Vec<f32>| matmul_tier(tier, &m1, 0..inter, x, 1, g);
    let r3 = |u: &mut Vec<f32>| matmul_tier(tier, &m3, 0..inter, x, 1, u);
    let (a, b) = if joined {
        rayon::join(|| r1(&mut g), || r3(&mut u))
    } else {
        (r1(&mut g), r3(&mut u))
    };
    a.and(b).expect("the tier was checked");
    for (a, b) in g.iter_mut().zip(&u) {
        *a = *a / (1.0 + (-*a).exp()) * b;
    }
    let mut y = vec![0f32; hidden];
    matmul_tier(tier, &m2, 0..hidden, &g, 1, &mut y).expect("the tier was checked");
    y
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Which product of a matrix the bench runs.
#[derive(Clone, Copy, PartialEq)]
enum Path {
    /// the exact (f32) kernels of the tier
    Exact,
    /// fast numerics' int8 FP4 path on the tier
    Q8,
    /// the `vdpbf16ps` kernels
    Bf16,
}

/// One product of `m` with n tokens on `tier` by `path`.
fn run(path: Path, tier: Tier, m: &MatRef, x: &[f32], n: usize, y: &mut [f32]) {
    let rows = 0..m.rows;
    let r = match path {
        Path::Exact => matmul_tier(tier, m, rows, x, n, y),
        Path::Q8 => matmul_q8_tier(tier, m, rows, x, n, y),
        Path::Bf16 => matmul_bf16(m, rows, x, n, y),
    };
    r.expect("the checked path is available");
}

fn decode(
    (kind, path, rows, cols, tier): (Kind, Path, usize, usize, Tier),
    rounds: usize,
    ring_mib: usize,
) {
    let ring = ring(kind, rows, cols, ring_mib.max(1) << 20);
    let (bytes, copies) = (mat(kind, rows, cols, &ring[0]).bytes(), ring.len());
    // passes over the ring per round: >= 2 GiB of weights read whatever the ring's size
    let passes = (2usize << 30).div_ceil(bytes * copies);
    let mats: Vec<MatRef> = ring.iter().map(|o| mat(kind, rows, cols, o)).collect();
    let x: Vec<f32> = (0..cols).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let mut y = vec![0f32; rows];
    let Some(pool) = pool() else { return };
    let threads = pool.current_num_threads();
    let (mut st, mut k) = (vec![], vec![]);
    for _ in 0..rounds {
        match mem_read_gbs(2 << 30, threads, 1) {
            Ok(v) => st.push(v),
            Err(e) => return println!("the memory probe failed: {e}"),
        }
        let t0 = Instant::now();
        pool.install(|| {
            for _ in 0..passes {
                for m in &mats {
                    run(path, tier, m, &x, 1, &mut y);
                }
            }
        });
        std::hint::black_box(&y);
        k.push((bytes * copies * passes) as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    let ratio: Vec<f64> = k.iter().zip(&st).map(|(a, b)| a / b * 100.0).collect();
    println!(
        "decode {rows}x{cols} {} (ring {} MiB): {:.1} GB/s, stream {:.1} GB/s, {:.0} % of the stream (medians of {rounds})",
        tier.name(),
        (bytes * copies) >> 20,
        median(k),
        median(st),
        median(ratio)
    );
}

/// The pool the timed products of every mode run on, inside `install` as the engine calls
/// them from its workers (from outside a pool every product would also pay two thread
/// wake-ups, about 100 µs on a VM: a fifth of a 512 x 2048 FP4 product).
fn pool() -> Option<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .build()
        .map_err(|e| println!("no thread pool: {e}"))
        .ok()
}

fn prefill(kind: Kind, path: Path, rows: usize, cols: usize, tier: Tier, n: usize, rounds: usize) {
    let o = make(kind, rows, cols, 3);
    let m = mat(kind, rows, cols, &o);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| (i % 11) as f32 * 0.05 - 0.25)
        .collect();
    let mut y = vec![0f32; n * rows];
    let flops = (2 * rows * cols * n) as f64;
    let reps = ((4e9 / flops) as usize).max(1);
    let Some(pool) = pool() else { return };
    let threads = pool.current_num_threads();
    let (mut pk, mut gf) = (vec![], vec![]);
    for _ in 0..rounds {
        let t0 = Instant::now();
        let f: u64 = pool.install(|| {
            (0..threads)
                .into_par_iter()
                .map(|_| fma_probe(tier, 1 << 24).map_or(0, |p| p.1))
                .sum()
        });
        pk.push(f as f64 / t0.elapsed().as_secs_f64() / 1e9);
        let t0 = Instant::now();
        pool.install(|| {
            for _ in 0..reps {
                run(path, tier, &m, &x, n, &mut y);
            }
        });
        std::hint::black_box(&y);
        gf.push(flops * reps as f64 / t0.elapsed().as_secs_f64() / 1e9);
    }
    let ratio: Vec<f64> = gf.iter().zip(&pk).map(|(a, b)| a / b * 100.0).collect();
    println!(
        "prefill {rows}x{cols} n={n} {}: {:.0} GFLOP/s, FMA peak {:.0} GFLOP/s, {:.0} % of the peak (medians of {rounds})",
        tier.name(),
        median(gf),
        median(pk),
        median(ratio)
    );
}

/// One token through a ring of experts (w1, w3 [inter, hidden], w2 [hidden, inter]; >= 2
/// GiB in all, so from DRAM), each expert in one `install` on a pool as the engine runs it:
/// w1 and w3 one after the other (A) against side by side in a `rayon::join` (B), rounds
/// alternating. Prints GB/s of weights for both and the median of the per-round B/A ratios.
fn expert(kind: Kind, inter: usize, hidden: usize, tier: Tier, rounds: usize) {
    let (ring, one) = expert_ring(kind, inter, hidden);
    let x: Vec<f32> = (0..hidden).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let Some(pool) = pool() else { return };
    let shape = (kind, inter, hidden, tier);
    let run_all = |joined: bool| -> f64 {
        let t0 = Instant::now();
        for e in &ring {
            let y = pool.install(|| expert_token(shape, e, &x, joined));
            std::hint::black_box(&y);
        }
        (one * ring.len()) as f64 / t0.elapsed().as_secs_f64() / 1e9
    };
    let (mut a, mut b) = (vec![], vec![]);
    for _ in 0..rounds {
        a.push(run_all(false));
        b.push(run_all(true));
    }
    let ratio: Vec<f64> = b.iter().zip(&a).map(|(b, a)| b / a).collect();
    println!(
        "expert {inter}x{hidden} {}: w1 then w3 {:.1} GB/s, joined {:.1} GB/s, ratio {:.3} (medians of {rounds})",
        tier.name(),
        median(a),
        median(b),
        median(ratio)
    );
}

/// One token through the ring of experts as a decode step meets them, from a thread outside
/// the pool (as `MoeWeights::forward` runs): each expert in its own `install` (A) against
/// `size` experts at a time in one `install`, spread over the pool (B); rounds alternate,
/// each next to the streaming read. Prints GB/s of weights, their share of the stream, and
/// the median of the per-round B/A ratios.
fn wave(kind: Kind, inter: usize, hidden: usize, tier: Tier, size: usize, rounds: usize) {
    let (ring, one) = expert_ring(kind, inter, hidden);
    let x: Vec<f32> = (0..hidden).map(|i| (i % 7) as f32 * 0.1 - 0.3).collect();
    let Some(pool) = pool() else { return };
    let threads = pool.current_num_threads();
    let shape = (kind, inter, hidden, tier);
    let run_all = |grouped: bool| -> f64 {
        let t0 = Instant::now();
        for group in ring.chunks(size.max(1)) {
            if grouped {
                let ys: Vec<Vec<f32>> = pool.install(|| {
                    group
                        .par_iter()
                        .map(|e| expert_token(shape, e, &x, true))
                        .collect()
                });
                std::hint::black_box(&ys);
            } else {
                for e in group {
                    let y = pool.install(|| expert_token(shape, e, &x, true));
                    std::hint::black_box(&y);
                }
            }
        }
        (one * ring.len()) as f64 / t0.elapsed().as_secs_f64() / 1e9
    };
    let (mut a, mut b, mut st) = (vec![], vec![], vec![]);
    for _ in 0..rounds {
        match mem_read_gbs(2 << 30, threads, 1) {
            Ok(v) => st.push(v),
            Err(e) => return println!("the memory probe failed: {e}"),
        }
        a.push(run_all(false));
        b.push(run_all(true));
    }
    let share = |v: &[f64]| median(v.iter().zip(&st).map(|(g, s)| g / s * 100.0).collect());
    let ratio: Vec<f64> = b.iter().zip(&a).map(|(b, a)| b / a).collect();
    println!(
        "wave {inter}x{hidden} {} by {size}: one install each {:.1} GB/s ({:.0} % of the stream), one per wave {:.1} GB/s ({:.0} %), stream {:.1} GB/s, ratio {:.3} (medians of {rounds})",
        tier.name(),
        median(a.clone()),
        share(&a),
        median(b.clone()),
        share(&b),
        median(st),
        median(ratio)
    );
}

/// HEADS heads of one query against KEYS shared keys of DIM columns on one thread: one call
/// per head (A) against one call for all the heads (B), rounds alternating. Prints GFLOP/s
/// (the dots and the weighted sums) for both and the median of the per-round B/A ratios.
fn attend(nk: usize, d: usize, tier: Tier, heads: usize, rounds: usize) {
    let val = |i: usize| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
    let keys: Vec<Vec<f32>> = (0..nk)
        .map(|j| (0..d).map(|i| val(j * d + i)).collect())
        .collect();
    let kr: Vec<&[f32]> = keys.iter().map(|k| &k[..]).collect();
    let q: Vec<f32> = (0..heads * d).map(|i| val(i + 17) * 0.1).collect();
    let sinks = vec![0.1f32; heads];
    let mut out = vec![0f32; heads * d];
    let flops = (4 * nk * d * heads) as f64;
    let reps = ((2e9 / flops) as usize).max(1);
    let run = |together: bool, out: &mut [f32]| -> f64 {
        let t0 = Instant::now();
        for _ in 0..reps {
            if together {
                attend_tier(tier, &q, &kr, 0.04, &sinks, out).expect("the tier was checked");
            } else {
                for h in 0..heads {
                    let (qh, oh) = (&q[h * d..(h + 1) * d], &mut out[h * d..(h + 1) * d]);
                    attend_tier(tier, qh, &kr, 0.04, &sinks[h..h + 1], oh)
                        .expect("the tier was checked");
                }
            }
        }
        std::hint::black_box(&out);
        flops * reps as f64 / t0.elapsed().as_secs_f64() / 1e9
    };
    let (mut a, mut b) = (vec![], vec![]);
    for _ in 0..rounds {
        a.push(run(false, &mut out));
        b.push(run(true, &mut out));
    }
    let ratio: Vec<f64> = b.iter().zip(&a).map(|(b, a)| b / a).collect();
    println!(
        "attend {nk} keys x {d} {} {heads} heads: one call per head {:.1} GFLOP/s, one for all {:.1} GFLOP/s, ratio {:.3} (medians of {rounds})",
        tier.name(),
        median(a),
        median(b),
        median(ratio)
    );
}

/// `ops::dot` and `kernels::dot` of two LEN-column vectors on the active tier, one thread,
/// rounds alternating. Prints GFLOP/s of each.
fn dot(len: usize, rounds: usize) {
    let val = |i: usize| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
    let (a, b): (Vec<f32>, Vec<f32>) = ((0..len).map(val).collect(), (1..=len).map(val).collect());
    let reps = ((1e9 / (2 * len.max(1)) as f64) as usize).max(1);
    let time = |f: fn(&[f32], &[f32]) -> f32| -> f64 {
        let t0 = Instant::now();
        let mut s = 0f32;
        for _ in 0..reps {
            s += f(std::hint::black_box(&a), std::hint::black_box(&b));
        }
        std::hint::black_box(s);
        (2 * len * reps) as f64 / t0.elapsed().as_secs_f64() / 1e9
    };
    let (mut o, mut k) = (vec![], vec![]);
    for _ in 0..rounds {
        o.push(time(ops::dot));
        k.push(time(_core::kernels::dot));
    }
    println!(
        "dot {len} {}: ops::dot {:.1} GFLOP/s, kernels::dot {:.1} GFLOP/s (medians of {rounds})",
        tier_name(),
        median(o),
        median(k)
    );
}

const USAGE: &str = "usage: cargo bench --bench kernels_ab -- decode fp4|fp8|bf16|fp4-fast|fp8-bf16|fp4-bf16 ROWS COLS TIER [ROUNDS] [RING_MIB]\n       cargo bench --bench kernels_ab -- prefill fp4|fp8|bf16|fp4-fast|fp8-bf16|fp4-bf16 ROWS COLS TIER TOKENS [ROUNDS]\n       cargo bench --bench kernels_ab -- expert fp4|fp8|bf16 INTER HIDDEN TIER [ROUNDS]\n       cargo bench --bench kernels_ab -- wave fp4|fp8|bf16 INTER HIDDEN TIER EXPERTS [ROUNDS]\n       cargo bench --bench kernels_ab -- attend KEYS DIM TIER HEADS [ROUNDS]\n       cargo bench --bench kernels_ab -- dot LEN [ROUNDS]";

fn main() {
    // `cargo test --all-targets` runs bench targets too; only `cargo bench` (which passes
    // `--bench`) measures.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let num = |i: usize, what: &str| -> Option<usize> {
        let v = args.get(i)?.parse().ok();
        if v.is_none() {
            println!("{what} must be a number\n{USAGE}");
        }
        v
    };
    let bench = std::env::args().any(|a| a == "--bench");
    if bench && args.len() >= 2 && args[0] == "dot" {
        let Some(len) = num(1, "LEN") else { return };
        return dot(len, num(2, "ROUNDS").unwrap_or(5));
    }
    if !bench || args.len() < 5 {
        println!("{USAGE}");
        return;
    }
    if args[0] == "attend" {
        let (Some(nk), Some(d), Some(heads)) = (num(1, "KEYS"), num(2, "DIM"), num(4, "HEADS"))
        else {
            return;
        };
        let Some(tier) = Tier::from_name(&args[3]).filter(|t| t.available()) else {
            return println!("{} is not a kernel tier this CPU runs", args[3]);
        };
        return attend(nk, d, tier, heads.max(1), num(5, "ROUNDS").unwrap_or(5));
    }
    let (kind, path) = match args[1].as_str() {
        "fp8" => (Kind::Fp8, Path::Exact),
        "fp4" => (Kind::Fp4, Path::Exact),
        "fp4-fast" => (Kind::Fp4, Path::Q8),
        "fp8-bf16" => (Kind::Fp8, Path::Bf16),
        "fp4-bf16" => (Kind::Fp4, Path::Bf16),
        "bf16" => (Kind::Bf16, Path::Exact),
        _ => {
            return println!(
                "the format is fp4, fp8, bf16, fp4-fast, fp8-bf16 or fp4-bf16\n{USAGE}"
            )
        }
    };
    let (Some(rows), Some(cols)) = (num(2, "ROWS"), num(3, "COLS")) else {
        return;
    };
    if kind == Kind::Fp4 && cols % 32 != 0 {
        return println!("fp4 needs COLS a multiple of 32");
    }
    let Some(tier) = Tier::from_name(&args[4]).filter(|t| t.available()) else {
        return println!(
            "{} is not a kernel tier this CPU runs ({})",
            args[4],
            Tier::names()
        );
    };
    if path == Path::Bf16 {
        // one small product first: a CPU without avx512_bf16 gets a message, not a panic
        let o = make(kind, 1, 128, 0);
        let (x, mut y) = (vec![0f32; 128], vec![0f32; 1]);
        if let Err(e) = matmul_bf16(&mat(kind, 1, 128, &o), 0..1, &x, 1, &mut y) {
            return println!("{e}");
        }
    }
    match args[0].as_str() {
        "decode" => decode(
            (kind, path, rows, cols, tier),
            num(5, "ROUNDS").unwrap_or(7),
            num(6, "RING_MIB").unwrap_or(2048),
        ),
        "expert" | "wave" if path != Path::Exact => {
            println!("{} runs the exact kernels: fp4, fp8 or bf16", args[0])
        }
        "expert" => expert(kind, rows, cols, tier, num(5, "ROUNDS").unwrap_or(7)),
        "wave" => {
            let Some(size) = num(5, "EXPERTS") else {
                return;
            };
            wave(kind, rows, cols, tier, size, num(6, "ROUNDS").unwrap_or(7))
        }
        "prefill" => {
            let Some(n) = num(5, "TOKENS") else { return };
            prefill(
                kind,
                path,
                rows,
                cols,
                tier,
                n,
                num(6, "ROUNDS").unwrap_or(5),
            )
        }
        _ => println!("{USAGE}"),
    }
}
