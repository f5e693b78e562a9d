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
//! decode step and one observed row for comparison; a verify pass of k + 1 tokens (with the
//! capture and observation a DSpark session runs) for k = 1 .. block_size, and from those
//! numbers the gain drafting would give this model at acceptance 0.5 / 0.7 / 0.9; then a
//! generation of GEN_TOKENS (64) greedy tokens with `speculate=dspark` verifying every draft
//! (the accepted-length distribution: what the drafter gets right on this model), and one
//! with the cost model choosing, against plain decoding (the same tokens; the time).
//! Measures only.
//!
//! ```text
//! cargo bench --bench dspark -- DIR [PROMPT_TOKENS] [ROUNDS] [RAM_GB] [GEN_TOKENS]
//! ```

use _core::model::generate::{Generation, Session};
use _core::model::sample::SampleParams;
use _core::model::{LoadOptions, Model, Want};
use _core::speculate::cost::expected_tokens;
use _core::speculate::Drafter;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

const USAGE: &str =
    "cargo bench --bench dspark -- DIR [PROMPT_TOKENS] [ROUNDS] [RAM_GB] [GEN_TOKENS]";

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
        Ok(m) => Arc::new(m),
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
    let mut draft_ms = vec![0.0; d.block_size() + 1];
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
        draft_ms[k] = median(times.clone());
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
    let step_ms = median(times);
    println!("target decode step: median {step_ms:.1} ms");
    let (st0, ds0) = (st.clone(), ds.clone()); // where the verify passes start
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
    passes(&m, &st0, &ds0, last, rounds, step_ms, &draft_ms);
    let n_gen = num(4, 64.0).max(1.0) as usize;
    generations(&m, &prompt, n_gen);
}

/// A verify pass of k + 1 tokens as a DSpark session runs it (capture and observation), for
/// k = 1 .. block_size, from the state after the prompt (restored after each); then what
/// drafting would gain on this model at acceptance 0.5 / 0.7 / 0.9 (the cost model's
/// arithmetic: the best k, if it beats a plain step).
fn passes(
    m: &Model,
    st: &_core::model::session::State,
    ds: &_core::model::dspark::DraftState,
    last: u32,
    rounds: usize,
    step_ms: f64,
    draft_ms: &[f64],
) {
    let never = || false;
    let bs = draft_ms.len() - 1;
    let mut pass_ms = vec![0.0; bs + 2];
    println!("| k | verify pass of k+1 tokens, observed: median ms | in plain decode steps |");
    println!("|---|---|---|");
    for (k, slot) in pass_ms.iter_mut().enumerate().skip(1).take(bs) {
        let ids: Vec<u32> = (0..=k as u32)
            .map(|i| last.wrapping_add(i) % 5 + 3)
            .collect();
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let (mut st2, mut ds2) = (st.clone(), ds.clone());
            let t = Instant::now();
            m.forward_observe(&mut st2, &mut ds2, &ids, Want::All, &never)
                .expect("a verify pass");
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        *slot = median(times);
        println!("| {k} | {:.1} | {:.2} |", *slot, *slot / step_ms);
    }
    println!(
        "predicted gain on this model (pass and draft times above, a plain step {step_ms:.1} ms):"
    );
    println!("| acceptance | best k | speed-up |");
    println!("|---|---|---|");
    for a in [0.5, 0.7, 0.9] {
        let mut best = (1.0, 0);
        for k in 1..=bs {
            let g = expected_tokens(a, k) * step_ms / (pass_ms[k] + draft_ms[k]);
            if g > best.0 {
                best = (g, k);
            }
        }
        println!("| {a} | {} | {:.2}x |", best.1, best.0);
    }
}

/// Greedy generations of `n` tokens after `prompt`: plain, `dspark` verifying every draft
/// (the accepted lengths), and `dspark` with the cost model choosing.
fn generations(m: &Arc<Model>, prompt: &[u32], n: usize) {
    let never = || false;
    let p = SampleParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
    };
    let run = |force: Option<usize>, dspark: bool| {
        let mut s = Session::new(m.clone());
        s.feed(prompt, &never).expect("the prompt");
        let mut g = Generation::new(Vec::new(), n, p.clone(), Vec::new()).expect("a generation");
        if dspark {
            g = g.with_speculation(Drafter::DSpark);
            if let Some(k) = force {
                g = g.forcing_drafts(k);
            }
        }
        let (mut toks, mut accepted) = (Vec::new(), Vec::new());
        let mut before = (0, 0);
        let t = Instant::now();
        while let Some(tok) = s.step(&mut g, &never).expect("a step") {
            toks.push(tok);
            if let Some(sp) = g.speculation() {
                let st = sp.stats();
                if st.verifies > before.0 {
                    accepted.push((st.accepted - before.1) as usize);
                }
                before = (st.verifies, st.accepted);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        (toks, accepted, secs, g.speculation().map(|s| s.stats()))
    };
    let (want, _, plain_s, _) = run(None, false);
    let bs = m.drafter().map(|d| d.block_size()).unwrap_or(0);
    let (got, acc, forced_s, _) = run(Some(bs), true);
    assert_eq!(got, want, "dspark changed the tokens");
    let mut hist = vec![0usize; bs + 1];
    for &a in &acc {
        hist[a.min(bs)] += 1;
    }
    let mean = acc.iter().sum::<usize>() as f64 / acc.len().max(1) as f64;
    println!(
        "{n} greedy tokens, every step verifying {bs} DSpark drafts: {} verifies, accepted \
         drafts per verify (0..{bs}): {hist:?}, mean {mean:.2}; {:.2} s against plain {:.2} s",
        acc.len(),
        forced_s,
        plain_s
    );
    let (got, _, auto_s, st) = run(None, true);
    assert_eq!(got, want, "dspark changed the tokens");
    if let Some(st) = st {
        println!(
            "with the cost model choosing: {} verifies ({}/{} drafts right), {} plain steps; \
             {:.2} s against plain {:.2} s ({:.2}x)",
            st.verifies,
            st.accepted,
            st.drafted,
            st.plain_steps,
            auto_s,
            plain_s,
            plain_s / auto_s
        );
    }
}
