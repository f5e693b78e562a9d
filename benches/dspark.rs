//! What a DSpark draft costs next to the target's decode step, on a 0731-shaped checkpoint
//! (`fixtures/tiny-b`, or `benches/make_synthetic.py --release 0731`):
//!
//! ```text
//! cargo bench --bench dspark -- DIR [PROMPT_TOKENS] [ROUNDS] [RAM_GB]
//! ```
//!
//! Loads DIR with the drafter, feeds a prompt of PROMPT_TOKENS (64) pseudo-random ids through
//! the target with the drafter's capture (`forward_observe`), then for k = 1 .. block_size:
//! the first draft (its experts read from disk into the drafter's cache), then ROUNDS (5)
//! more from the same state (the median), with the drafter's expert reads; and the target's
//! decode step and one observed row for comparison. Prints one table. Measures only.

use _core::model::{LoadOptions, Model, Want};
use std::sync::atomic::Ordering;
use std::time::Instant;

const USAGE: &str = "cargo bench --bench dspark -- DIR [PROMPT_TOKENS] [ROUNDS] [RAM_GB]";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo test --all-targets` runs bench targets too; only `cargo bench` measures.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    if !std::env::args().any(|a| a == "--bench") || args.is_empty() {
        println!("{USAGE}");
        return;
    }
    let num = |i: usize, d: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (n_prompt, rounds) = (num(1, 64.0) as usize, num(2, 5.0).max(1.0) as usize);
    let opts = LoadOptions {
        drafter: true,
        ram_bytes: args
            .get(3)
            .and_then(|s| s.parse::<f64>().ok())
            .map(|g| (g * 1e9) as u64),
        ..LoadOptions::default()
    };
    let t0 = Instant::now();
    let m = match Model::load(std::path::Path::new(&args[0]), &opts) {
        Ok(m) => m,
        Err(e) => {
            println!("cannot load {}: {e}", args[0]);
            return;
        }
    };
    let Ok(d) = m.drafter() else {
        println!("{}: no DSpark drafter", args[0]);
        return;
    };
    // the caches' background pre-fault first: while it runs, waves use only the warm slots
    // (`ExpertStore::max_batch`) and a draft's experts can evict each other
    let t = Instant::now();
    while m.experts.prefault_running() || d.experts.prefault_running() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    println!(
        "pre-fault done after {:.1} s more",
        t.elapsed().as_secs_f64()
    );
    let p = &m.plan;
    println!(
        "loaded in {:.1} s: {} threads; drafter resident {:.2} GB, its expert cache {} slots \
         ({:.2} GB); the model's {} slots",
        t0.elapsed().as_secs_f64(),
        m.threads,
        p.drafter_resident_bytes as f64 / 1e9,
        p.drafter_slots,
        p.drafter_cache_bytes as f64 / 1e9,
        p.slots
    );
    let v = m.cfg.vocab_size as u64;
    let prompt: Vec<u32> = (0..n_prompt as u64)
        .map(|i| (3 + (i * 7919 + 13) % (v - 3)) as u32)
        .collect();
    let never = || false;
    let (mut st, mut ds) = (m.new_state(), m.drafter_state().expect("a drafter state"));
    let t = Instant::now();
    let lg = m
        .forward_observe(&mut st, &mut ds, &prompt, Want::Last, &never)
        .expect("the prompt runs");
    println!(
        "prompt of {n_prompt} tokens with the capture: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let last = (0..lg.len()).fold(0, |b, i| if lg[i] > lg[b] { i } else { b }) as u32;
    let reads = || d.experts.counters().misses.load(Ordering::Relaxed);
    println!("| k | first draft ms | median of {rounds} ms | expert reads per draft |");
    println!("|---|---|---|---|");
    for k in 1..=d.block_size() {
        let (r0, t) = (reads(), Instant::now());
        m.draft(&ds, last, k).expect("a draft");
        let first = t.elapsed().as_secs_f64() * 1e3;
        let r1 = reads();
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = Instant::now();
            m.draft(&ds, last, k).expect("a draft");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let per = (reads() - r1) as f64 / rounds as f64;
        println!(
            "| {k} | {first:.1} ({} reads) | {:.1} | {per:.1} |",
            r1 - r0,
            median(times)
        );
    }
    // the target's decode step and one observed row, for scale
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let snap = st.snapshot();
        let t = Instant::now();
        m.forward(&mut st, &[last], Want::Last, &never)
            .expect("a decode step");
        times.push(t.elapsed().as_secs_f64() * 1e3);
        st.rollback(&snap).expect("rollback");
    }
    println!("target decode step: median {:.1} ms", median(times));
    let layers = d.target_layers().to_vec();
    let (_, rows) = m
        .forward_capture(&mut st, &[last], Want::None, &layers, &never)
        .expect("a captured step");
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let mut ds2 = ds.clone();
        let t = Instant::now();
        m.drafter_observe(&mut ds2, &rows, ds.len())
            .expect("an observed row");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!("observe one row: median {:.2} ms", median(times));
}
