//! The speculative verify's journal (`journal.rs`, `State::cut_back`): a pass of n tokens cut
//! back to its first `keep` leaves the state bit for bit as feeding only those would, on both
//! fixtures, in every numerics mode, at positions around the window and the compression
//! ratios; and the session's speculative step gives plain generation's tokens with any
//! drafter, greedy or sampled.

use super::generate::{Generation, Session};
use super::sample::SampleParams;
use super::{Model, Want};
use crate::kernels::Numerics;
use crate::speculate::oracle::Oracle;
use crate::speculate::Drafter;
use std::sync::Arc;

use super::test_util::{bits, ids, load_fixture, NO};

fn load(name: &str, numerics: Numerics) -> Arc<Model> {
    Arc::new(load_fixture(name, numerics, None))
}

#[test]
fn a_cut_back_pass_equals_feeding_what_it_keeps() {
    for name in ["tiny-a", "tiny-b"] {
        for numerics in [Numerics::Exact, Numerics::Official] {
            let m = load(name, numerics);
            let cap = m.journal_capacity();
            assert!(cap >= 2, "{name}: the window holds {cap} rows");
            // prefixes around the window (8) and the ratios (4, 8, 128 on the fixtures)
            for prefix in [0usize, 1, 3, 6, 7, 8, 9, 14, 15, 16, 30] {
                let all = ids(&m, prefix as u64 + 7, prefix + cap);
                let (head, pass) = all.split_at(prefix);
                let n = cap.min(7);
                let pass = &pass[..n];
                let mut base = m.new_state();
                m.forward(&mut base, head, Want::None, &NO).unwrap();
                for keep in 0..=n {
                    let mut st = base.clone();
                    let before = st.journal_begin();
                    m.forward(&mut st, pass, Want::All, &NO).unwrap();
                    m.cut_back(&mut st, &before, keep).unwrap();
                    let mut want = base.clone();
                    m.forward(&mut want, &pass[..keep], Want::None, &NO)
                        .unwrap();
                    assert!(
                        bits(&st) == bits(&want),
                        "{name} {numerics:?}: prefix {prefix}, kept {keep} of {n}"
                    );
                    // and it goes on as the fed state does
                    let next = ids(&m, 99, 3);
                    let a = m.forward(&mut st, &next, Want::All, &NO).unwrap();
                    let b = m.forward(&mut want, &next, Want::All, &NO).unwrap();
                    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
                }
            }
        }
    }
}

#[test]
fn a_cut_back_refuses_what_it_cannot_do_and_changes_nothing() {
    let m = load("tiny-a", Numerics::Exact);
    let cap = m.journal_capacity();
    let mut st = m.new_state();
    m.forward(&mut st, &ids(&m, 1, 5), Want::None, &NO).unwrap();
    // no journal open
    let snap = st.snapshot();
    m.forward(&mut st, &ids(&m, 2, 2), Want::None, &NO).unwrap();
    let was = bits(&st);
    assert!(m.cut_back(&mut st, &snap, 1).is_err());
    assert!(bits(&st) == was);
    // more tokens than the window holds
    let before = st.journal_begin();
    m.forward(&mut st, &ids(&m, 3, cap + 1), Want::None, &NO)
        .unwrap();
    let was = bits(&st);
    assert!(m.cut_back(&mut st, &before, 1).is_err());
    assert!(bits(&st) == was);
    // keeping more than was fed
    st.journal_end();
    let before = st.journal_begin();
    m.forward(&mut st, &ids(&m, 4, 2), Want::None, &NO).unwrap();
    assert!(m.cut_back(&mut st, &before, 3).is_err());
}

fn plain(m: &Arc<Model>, prompt: &[u32], n: usize, p: SampleParams) -> (Vec<u32>, Vec<u32>) {
    let mut s = Session::new(m.clone());
    let mut g = Generation::new(prompt.to_vec(), n, p, vec![]).unwrap();
    let out = s.generate(&mut g, &NO).unwrap();
    (out, s.tokens())
}

fn params(temperature: f32, seed: u64) -> SampleParams {
    SampleParams {
        temperature,
        top_p: 0.9,
        top_k: 0,
        seed,
    }
}

#[test]
fn speculative_steps_give_plain_generations_tokens() {
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name, Numerics::Exact);
        let prompt = ids(&m, 5, 9);
        for (temperature, seed) in [(0.0, 0), (0.9, 3)] {
            let p = params(temperature, seed);
            let (want, want_seq) = plain(&m, &prompt, 24, p.clone());
            for (right, k) in [(1.0, 6), (0.0, 3), (0.5, 4), (0.8, 1)] {
                let mut s = Session::new(m.clone());
                let vocab = m.cfg.vocab_size as u32;
                let o = Oracle::new(prompt.len(), want.clone(), right, 11, vocab);
                let mut g = Generation::new(prompt.clone(), 24, p.clone(), vec![])
                    .unwrap()
                    .with_speculation(Drafter::Oracle(o))
                    .forcing_drafts(k);
                let got = s.generate(&mut g, &NO).unwrap();
                let what = format!("{name} t={temperature} right={right} k={k}");
                assert_eq!(got, want, "{what}");
                assert_eq!(s.tokens(), want_seq, "{what}");
                let st = g.speculation().unwrap().stats();
                assert!(st.verifies > 0, "{what}: nothing was verified");
                if right == 1.0 {
                    assert_eq!(st.accepted, st.drafted, "{what}");
                }
                if right == 0.0 {
                    assert_eq!(st.accepted, 0, "{what}");
                }
                // the session goes on as a plainly generated one does
                let mut fresh = Session::new(m.clone());
                fresh.feed(&want_seq, &NO).unwrap();
                s.feed(&[], &NO).unwrap();
                let (a, b) = (s.last_logits().unwrap(), fresh.last_logits().unwrap());
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
            }
        }
    }
}

#[test]
fn a_stop_id_inside_accepted_drafts_ends_the_generation_there() {
    let m = load("tiny-a", Numerics::Exact);
    let prompt = ids(&m, 8, 6);
    let p = params(0.0, 0);
    let (all, _) = plain(&m, &prompt, 20, p.clone());
    let stop = all[7];
    let first = all.iter().position(|&t| t == stop).unwrap();
    let mut s0 = Session::new(m.clone());
    let mut g0 = Generation::new(prompt.clone(), 20, p.clone(), vec![stop]).unwrap();
    let want = s0.generate(&mut g0, &NO).unwrap();
    assert_eq!(want.len(), first + 1);
    let mut s = Session::new(m.clone());
    let o = Oracle::new(prompt.len(), all.clone(), 1.0, 1, m.cfg.vocab_size as u32);
    let mut g = Generation::new(prompt, 20, p, vec![stop])
        .unwrap()
        .with_speculation(Drafter::Oracle(o))
        .forcing_drafts(6);
    assert_eq!(s.generate(&mut g, &NO).unwrap(), want);
    assert_eq!(s.tokens(), s0.tokens());
    assert!(g.finished());
}

#[test]
fn a_caller_stopping_inside_a_verify_finds_plain_decodings_state() {
    // a verify samples several tokens at once; a caller that takes fewer (a stop string, a
    // budget) and goes on with the session must find it as plain decoding left it
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name, Numerics::Exact);
        let prompt = ids(&m, 5, 9);
        let p = params(0.9, 4);
        let (want, _) = plain(&m, &prompt, 24, p.clone());
        let vocab = m.cfg.vocab_size as u32;
        for taken in [2, 3, 4, 6, 9] {
            for next in ["generate", "feed", "snapshot"] {
                let what = format!("{name} taken={taken} then {next}");
                let mut s0 = Session::new(m.clone());
                let mut g0 = Generation::new(prompt.clone(), 24, p.clone(), vec![]).unwrap();
                let mut s = Session::new(m.clone());
                let o = Oracle::new(prompt.len(), want.clone(), 1.0, 1, vocab);
                let mut g = Generation::new(prompt.clone(), 24, p.clone(), vec![])
                    .unwrap()
                    .with_speculation(Drafter::Oracle(o))
                    .forcing_drafts(6);
                for _ in 0..taken {
                    let a = s0.step(&mut g0, &NO).unwrap();
                    let b = s.step(&mut g, &NO).unwrap();
                    assert_eq!(a, b, "{what}");
                }
                assert!(g.speculation().unwrap().stats().verifies > 0, "{what}");
                assert_eq!(s.position(), s0.position(), "{what}");
                assert_eq!(s.tokens(), s0.tokens(), "{what}");
                assert_eq!(s.last_logits().is_some(), s0.last_logits().is_some());
                let extra = ids(&m, 77, 3);
                match next {
                    "generate" => {
                        let mut g1 = Generation::new(extra.clone(), 6, p.clone(), vec![]).unwrap();
                        let mut g2 = Generation::new(extra.clone(), 6, p.clone(), vec![]).unwrap();
                        let a = s0.generate(&mut g1, &NO).unwrap();
                        assert_eq!(s.generate(&mut g2, &NO).unwrap(), a, "{what}");
                    }
                    "feed" => {
                        s0.feed(&extra, &NO).unwrap();
                        s.feed(&extra, &NO).unwrap();
                    }
                    _ => {
                        let a = s0.snapshot(&NO).unwrap();
                        let b = s.snapshot(&NO).unwrap();
                        assert_eq!(a.tokens, b.tokens, "{what}");
                    }
                }
                assert_eq!(s.tokens(), s0.tokens(), "{what}");
                s0.feed(&[], &NO).unwrap();
                s.feed(&[], &NO).unwrap();
                let (x, y) = (s.last_logits().unwrap(), s0.last_logits().unwrap());
                assert!(
                    x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}"
                );
                assert_eq!(bits(s.state()), bits(s0.state()), "{what}");
            }
        }
    }
}
