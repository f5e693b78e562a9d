//! The forward pass against the transformers references in `fixtures/` from Rust alone, so
//! every target the core's tests run on (aarch64 under qemu included) checks exact mode on
//! the kernel tier it picks: teacher-forced top-1 and top-k logits, and greedy tokens.
//! `tests/test_model.py` checks the same (and the full logits) through Python.

use super::generate::{Generation, Session};
use super::sample::SampleParams;
use super::{LoadOptions, Model, Want};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// × the largest |reference logit|, as in tests/test_model.py.
const TOL: f64 = 1e-3;

fn fixture(name: &str) -> (Arc<Model>, Vec<Value>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let opts = LoadOptions {
        threads: std::num::NonZeroUsize::new(2),
        ..LoadOptions::default()
    };
    let m = Model::load(&root.join(name), &opts).expect("the fixture loads");
    let text = std::fs::read_to_string(root.join(format!("{name}.ref.json"))).unwrap();
    let meta: Value = serde_json::from_str(&text).unwrap();
    let cases = meta["cases"].as_array().expect("cases").clone();
    assert!(cases.len() >= 4, "{name}: too few cases");
    (Arc::new(m), cases)
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("an id list")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

#[test]
fn fixtures_teacher_forced_top1_and_topk_logits_match_the_reference() {
    for name in ["tiny-a", "tiny-b"] {
        let (m, cases) = fixture(name);
        let vocab = m.cfg.vocab_size;
        for c in &cases {
            let cn = c["name"].as_str().unwrap_or("?");
            let prompt = ids(&c["ids"]);
            let mut st = m.new_state();
            let lg = m.forward(&mut st, &prompt, Want::All, &|| false).unwrap();
            assert_eq!(lg.len(), prompt.len() * vocab);
            let top1 = ids(&c["top1"]);
            let tol = TOL * c["max_abs_logit"].as_f64().unwrap();
            for (p, row) in lg.chunks_exact(vocab).enumerate() {
                let best = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
                assert_eq!(best as u32, top1[p], "{name}/{cn} position {p}: top-1");
                let (kid, klg) = (&c["topk_ids"][p], &c["topk_logits"][p]);
                for (i, want) in ids(kid).into_iter().zip(klg.as_array().unwrap()) {
                    let (got, want) = (row[i as usize] as f64, want.as_f64().unwrap());
                    assert!(
                        (got - want).abs() <= tol,
                        "{name}/{cn} position {p} id {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn fixtures_greedy_continuations_match_the_reference() {
    let greedy = SampleParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
    };
    for name in ["tiny-a", "tiny-b"] {
        let (m, cases) = fixture(name);
        for c in &cases {
            let want = ids(&c["greedy_new"]);
            let mut g = Generation::new(ids(&c["ids"]), want.len(), greedy.clone(), vec![])
                .expect("valid generation");
            let got = Session::new(m.clone()).generate(&mut g, &|| false).unwrap();
            assert_eq!(got, want, "{name}/{}", c["name"]);
        }
    }
    println!("exact mode, kernel tier {}", crate::kernels::tier_name());
}
