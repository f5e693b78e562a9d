//! The drafter against the torch reference in `fixtures/tiny-b.dspark.json`
//! (`fixtures/fixgen/dspark.py`): the drafted tokens exactly, the confidence scores and the
//! last stage's logits within float error, the captured target rows; and the state's rules
//! (truncate + observe is a fresh run), the errors.

use super::super::{LoadOptions, Model, Want};
use super::UNDO_POSITIONS;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// × the largest |reference logit| of the draft (the main references' tolerance is 1e-3).
const TOL: f64 = 1e-4;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

fn load(name: &str, drafter: bool) -> crate::error::Result<Model> {
    let opts = LoadOptions {
        threads: std::num::NonZeroUsize::new(2),
        drafter,
        ..LoadOptions::default()
    };
    Model::load(&root().join(name), &opts)
}

fn reference() -> Value {
    let text = std::fs::read_to_string(root().join("tiny-b.dspark.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

fn never() -> bool {
    false
}

#[test]
fn drafts_match_the_torch_reference() {
    let m = load("tiny-b", true).unwrap();
    let d = m.drafter().unwrap();
    assert_eq!(d.block_size(), 5);
    assert_eq!(d.target_layers(), &[2, 3, 4]);
    let v = m.cfg.vocab_size;
    let r = reference();
    let mut checked = 0;
    for case in r["cases"].as_array().unwrap() {
        let cn = case["name"].as_str().unwrap();
        let prompt = ids(&case["ids"]);
        let (mut st, mut ds) = (m.new_state(), m.drafter_state().unwrap());
        for dr in case["drafts"].as_array().unwrap() {
            let p = dr["pos"].as_u64().unwrap() as usize;
            // the target fed up to position p (in one chunk from where it stands)
            let from = st.pos();
            let lg = m
                .forward_observe(&mut st, &mut ds, &prompt[from..=p], Want::Last, &never)
                .unwrap();
            let last = dr["last"].as_u64().unwrap() as u32;
            let best = (0..v).fold(0, |b, i| if lg[i] > lg[b] { i } else { b });
            assert_eq!(best as u32, last, "{cn} p={p}: the target's greedy token");
            let got = m.draft_full(&ds, last, 5).unwrap();
            let want = ids(&dr["tokens"]);
            let toks: Vec<u32> = got.tokens.iter().map(|t| t.0).collect();
            assert_eq!(toks, want, "{cn} p={p}: drafted tokens");
            let tol = TOL * dr["max_abs_logit"].as_f64().unwrap();
            for (i, s) in dr["scores"].as_array().unwrap().iter().enumerate() {
                let s = s.as_f64().unwrap();
                let g = got.scores[i] as f64;
                assert!(
                    (g - s).abs() <= 1e-4 * s.abs().max(1.0),
                    "{cn} p={p} score {i}: {g} vs {s}"
                );
                let prob = 1.0 / (1.0 + (-s).exp());
                assert!(
                    (got.tokens[i].1 as f64 - prob).abs() <= 1e-4,
                    "{cn} p={p} confidence {i}"
                );
            }
            for (i, (kid, klg)) in dr["topk_ids"]
                .as_array()
                .unwrap()
                .iter()
                .zip(dr["topk_logits"].as_array().unwrap())
                .enumerate()
            {
                for (t, want) in ids(kid).into_iter().zip(klg.as_array().unwrap()) {
                    let (g, w) = (
                        got.logits[i * v + t as usize] as f64,
                        want.as_f64().unwrap(),
                    );
                    assert!(
                        (g - w).abs() <= tol,
                        "{cn} p={p} row {i} id {t}: {g} vs {w}"
                    );
                }
            }
            // a shorter draft is the longer one's start (the block is the same)
            for k in 1..5 {
                let short = m.draft(&ds, last, k).unwrap();
                assert_eq!(short[..], got.tokens[..k], "{cn} p={p}: draft of {k}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} drafts checked");
}

#[test]
fn drafts_do_not_depend_on_the_threads_and_run_in_every_numerics_mode() {
    let r = reference();
    let case = &r["cases"][1];
    let prompt = ids(&case["ids"]);
    let dr = &case["drafts"][2];
    let (p, last) = (
        dr["pos"].as_u64().unwrap() as usize,
        dr["last"].as_u64().unwrap() as u32,
    );
    let run = |threads: usize, numerics: crate::kernels::Numerics| {
        let opts = LoadOptions {
            threads: std::num::NonZeroUsize::new(threads),
            numerics,
            drafter: true,
            ..LoadOptions::default()
        };
        let m = Model::load(&root().join("tiny-b"), &opts).unwrap();
        let (_, ds) = observed(&m, &prompt, p + 1);
        m.draft_full(&ds, last, 5).unwrap()
    };
    for numerics in crate::kernels::Numerics::ALL {
        let (a, b) = (run(1, numerics), run(3, numerics));
        assert_eq!(a.tokens, b.tokens, "{numerics:?}");
        assert!(a
            .logits
            .iter()
            .zip(&b.logits)
            .all(|(x, y)| x.to_bits() == y.to_bits()));
        assert!(a.logits.iter().all(|x| x.is_finite()), "{numerics:?}");
        if numerics == crate::kernels::Numerics::Exact {
            assert_eq!(
                a.tokens.iter().map(|t| t.0).collect::<Vec<_>>(),
                ids(&dr["tokens"])
            );
        }
    }
}

#[test]
fn capture_leaves_the_logits_bitwise_and_matches_the_reference() {
    let m = load("tiny-b", true).unwrap();
    let r = reference();
    let case = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == r["capture_case"])
        .unwrap();
    let prompt = ids(&case["ids"]);
    let layers = m.drafter().unwrap().target_layers().to_vec();
    let mut a = m.new_state();
    let plain = m.forward(&mut a, &prompt, Want::All, &never).unwrap();
    let mut b = m.new_state();
    let (lg, rows) = m
        .forward_capture(&mut b, &prompt, Want::All, &layers, &never)
        .unwrap();
    assert!(plain
        .iter()
        .zip(&lg)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(plain.len(), lg.len());
    let w = layers.len() * m.cfg.hidden_size;
    assert_eq!(rows.len(), prompt.len() * w);
    // the capture in chunks is the same rows
    let mut c = m.new_state();
    let mut chunked = Vec::new();
    for part in prompt.chunks(7) {
        let (_, r) = m
            .forward_capture(&mut c, part, Want::None, &layers, &never)
            .unwrap();
        chunked.extend(r);
    }
    assert!(rows
        .iter()
        .zip(&chunked)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    for (t, want) in case["captured_rows"].as_object().unwrap() {
        let t: usize = t.parse().unwrap();
        let want = want.as_array().unwrap();
        let scale = want
            .iter()
            .fold(0f64, |a, v| a.max(v.as_f64().unwrap().abs()));
        for (j, wv) in want.iter().enumerate() {
            let (g, wv) = (rows[t * w + j] as f64, wv.as_f64().unwrap());
            assert!(
                (g - wv).abs() <= 1e-5 * scale.max(1.0),
                "row {t} col {j}: {g} vs {wv}"
            );
        }
    }
    assert!(m
        .forward_capture(&mut b, &[1], Want::None, &[9], &never)
        .is_err());
}

/// Observes the first `n` prompt positions into a fresh state through the target.
fn observed(
    m: &Model,
    prompt: &[u32],
    n: usize,
) -> (super::super::session::State, super::DraftState) {
    let (mut st, mut ds) = (m.new_state(), m.drafter_state().unwrap());
    m.forward_observe(&mut st, &mut ds, &prompt[..n], Want::None, &never)
        .unwrap();
    (st, ds)
}

#[test]
fn truncate_then_observe_equals_a_fresh_run() {
    let m = load("tiny-b", true).unwrap();
    let layers = m.drafter().unwrap().target_layers().to_vec();
    let prompt: Vec<u32> = (0..120u32).map(|i| 3 + (i * 37 + 11) % 580).collect();
    let (last, k) = (prompt[60], 5);
    // the reference: positions 0..60 observed in one go
    let (_, fresh) = observed(&m, &prompt, 60);
    let want = m.draft_full(&fresh, last, k).unwrap();
    // observe 0..56, then 8 more (a verify that fed other tokens), undo to 56, observe the
    // right 4
    let (mut st, mut ds) = observed(&m, &prompt, 56);
    let snap = st.snapshot();
    let mut wrong = prompt[56..64].to_vec();
    wrong.iter_mut().for_each(|t| *t = (*t + 101) % 580 + 3);
    m.forward_observe(&mut st, &mut ds, &wrong, Want::None, &never)
        .unwrap();
    assert_eq!(ds.len(), 64);
    ds.truncate(56).unwrap();
    st.rollback(&snap).unwrap();
    m.forward_observe(&mut st, &mut ds, &prompt[56..60], Want::None, &never)
        .unwrap();
    let got = m.draft_full(&ds, last, k).unwrap();
    assert_eq!(got.tokens, want.tokens);
    assert!(got
        .logits
        .iter()
        .zip(&want.logits)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(got
        .scores
        .iter()
        .zip(&want.scores)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    // observing rows captured elsewhere (by position) is the same as observing them here
    let mut st2 = m.new_state();
    let (_, rows) = m
        .forward_capture(&mut st2, &prompt[..60], Want::None, &layers, &never)
        .unwrap();
    let mut ds2 = m.drafter_state().unwrap();
    let w = rows.len() / 60;
    m.drafter_observe(&mut ds2, &rows[..25 * w], 0).unwrap();
    m.drafter_observe(&mut ds2, &rows[25 * w..], 25).unwrap();
    let again = m.draft_full(&ds2, last, k).unwrap();
    assert!(again
        .logits
        .iter()
        .zip(&want.logits)
        .all(|(a, b)| a.to_bits() == b.to_bits()));

    // truncation is bounded: the window plus UNDO_POSITIONS back, never forward
    let window = m.cfg.sliding_window;
    let (_, mut long) = observed(&m, &prompt, 120);
    let earliest = 120 - UNDO_POSITIONS;
    assert_eq!(long.earliest(), earliest);
    let e = long.truncate(earliest - 1).unwrap_err().to_string();
    assert!(e.contains("can go back to position"), "{e}");
    assert!(long.truncate(121).is_err());
    assert_eq!(long.len(), 120, "a failed truncate changes nothing");
    long.truncate(earliest).unwrap();
    let (_, fresh) = observed(&m, &prompt, earliest);
    let a = m.draft_full(&long, prompt[earliest], 3).unwrap();
    let b = m.draft_full(&fresh, prompt[earliest], 3).unwrap();
    assert!(a
        .logits
        .iter()
        .zip(&b.logits)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert!(window > 0);
}

#[test]
fn bad_requests_are_errors_not_panics() {
    let m = load("tiny-b", true).unwrap();
    let layers = m.drafter().unwrap().target_layers().to_vec();
    let mut ds = m.drafter_state().unwrap();
    let e = m.draft(&ds, 5, 3).unwrap_err().to_string();
    assert!(e.contains("observed no position"), "{e}");
    let w = layers.len() * m.cfg.hidden_size;
    // rows of the wrong width, at the wrong position, not finite
    assert!(m.drafter_observe(&mut ds, &vec![0.0; w + 1], 0).is_err());
    assert!(m.drafter_observe(&mut ds, &vec![0.0; w], 1).is_err());
    let mut nan = vec![0.5; 2 * w];
    nan[w + 3] = f32::NAN;
    let e = m.drafter_observe(&mut ds, &nan, 0).unwrap_err().to_string();
    assert!(e.contains("non-finite"), "{e}");
    assert_eq!(ds.len(), 0);
    m.drafter_observe(&mut ds, &vec![0.25; w], 0).unwrap();
    assert!(m.drafter_observe(&mut ds, &[], 1).is_ok());
    for k in [0, 6] {
        assert!(m.draft(&ds, 5, k).is_err(), "k = {k}");
    }
    let e = m.draft(&ds, 600, 2).unwrap_err().to_string();
    assert!(e.contains("out of the vocabulary"), "{e}");
    assert_eq!(m.draft(&ds, 5, 2).unwrap().len(), 2);
    // a state of another model is refused
    let other = load("tiny-b", true).unwrap();
    assert!(other.draft(&ds, 5, 2).is_err());
    // the session and the drafter state must stand at the same position
    let mut st = m.new_state();
    assert!(m
        .forward_observe(&mut st, &mut ds, &[3, 4], Want::None, &never)
        .is_err());
}

#[test]
fn a_checkpoint_without_a_dspark_drafter_says_so() {
    let e = load("tiny-a", true)
        .err()
        .expect("tiny-a has no DSpark drafter")
        .to_string();
    assert!(
        e.contains("no DSpark drafter") && e.contains("MTP block"),
        "{e}"
    );
    let plain = load("tiny-b", false).unwrap();
    assert!(plain.drafter.is_none());
    let e = plain.drafter_state().err().expect("not loaded").to_string();
    assert!(
        e.contains("not loaded") && e.contains("drafter=true"),
        "{e}"
    );
    let a = load("tiny-a", false).unwrap();
    let e = a.drafter_state().err().expect("no drafter").to_string();
    assert!(e.contains("no DSpark drafter"), "{e}");
}

#[test]
fn the_plan_counts_the_drafter_and_drafting_leaves_the_models_experts_alone() {
    let with = load("tiny-b", true).unwrap();
    let without = load("tiny-b", false).unwrap();
    let (p, q) = (&with.plan, &without.plan);
    assert_eq!(q.drafter_resident_bytes + q.drafter_cache_bytes, 0);
    assert_eq!(q.drafter_slots, 0);
    let d = with.drafter().unwrap();
    assert!(p.drafter_resident_bytes > 0 && p.drafter_slots > 0);
    assert_eq!(p.drafter_slots, d.experts.n_slots);
    assert!(p.drafter_resident_bytes <= p.drafter_bytes);
    // the loader's bytes: the checkpoint's, plus the norms and heads widened to f32
    assert!(d.resident_bytes as u64 >= p.drafter_resident_bytes);
    assert!((d.resident_bytes as u64) < p.drafter_resident_bytes + (1 << 16));
    assert_eq!(
        p.total_bytes() - q.total_bytes(),
        p.drafter_resident_bytes + p.drafter_cache_bytes
    );
    // a draft reads the drafter's experts only
    let prompt: Vec<u32> = (3..30).collect();
    let (_, ds) = observed(&with, &prompt, prompt.len());
    let before = with
        .experts
        .counters()
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    with.draft(&ds, 7, 5).unwrap();
    let after = with
        .experts
        .counters()
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(before, after);
    assert!(
        d.experts
            .counters()
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
}
