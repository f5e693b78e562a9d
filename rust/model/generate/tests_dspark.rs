//! Generation drafting with DSpark on the tiny-b fixture (0731-shaped, with its drafter):
//! the tokens, log-probabilities and states are plain decoding's, bit for bit, whatever the
//! drafts; the session's drafter state stays in step with its model state (a draft from it
//! equals one from a state observed afresh over the same tokens), through verifies, cut
//! backs, stops inside a verify, snapshots and rollbacks.

use super::*;
use crate::model::test_util::{bits, ids, NO};
use crate::model::LoadOptions;
use crate::speculate::lookup::PromptLookup;
use crate::speculate::{Drafter, Mode};
use std::path::Path;
use std::sync::OnceLock;

fn load(drafter: bool, speculate: Mode) -> Arc<Model> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-b");
    let opts = LoadOptions {
        threads: std::num::NonZeroUsize::new(2),
        drafter,
        speculate,
        ..LoadOptions::default()
    };
    Arc::new(Model::load(&dir, &opts).expect("the tiny-b fixture loads"))
}

/// tiny-b with its drafter (sessions keep a drafter state from the start: `auto`).
fn with_drafter() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load(true, Mode::Auto)).clone()
}

/// tiny-b without it: plain decoding's reference (no capture, no observation).
fn without() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load(false, Mode::Off)).clone()
}

fn params(temperature: f32, seed: u64) -> SampleParams {
    SampleParams {
        temperature,
        top_p: 0.9,
        top_k: 0,
        seed,
    }
}

/// (token, log-probability bits, top alternatives) per sampled token.
type Sampled = Vec<(u32, u32, Vec<(u32, u32)>)>;

fn run(s: &mut Session, g: &mut Generation) -> Sampled {
    let mut out = Vec::new();
    while let Some(t) = s.step(g, &NO).unwrap() {
        let lp = g.last_logprobs().unwrap();
        let top = lp.top.iter().map(|&(i, l)| (i, l.to_bits())).collect();
        out.push((t, lp.logprob.to_bits(), top));
    }
    out
}

fn plain(prompt: &[u32], n: usize, p: &SampleParams) -> (Sampled, Session) {
    let mut s = Session::new(without());
    let mut g = Generation::new(prompt.to_vec(), n, p.clone(), vec![])
        .unwrap()
        .with_logprobs(3);
    (run(&mut s, &mut g), s)
}

fn dspark(prompt: &[u32], n: usize, p: &SampleParams, k: usize) -> Generation {
    Generation::new(prompt.to_vec(), n, p.clone(), vec![])
        .unwrap()
        .with_logprobs(3)
        .with_speculation(Drafter::DSpark)
        .forcing_drafts(k)
}

/// The session's drafter state stands where its model state does, and drafts what a state
/// observed afresh over the same tokens drafts, bitwise (logits and confidences).
fn assert_in_step(s: &mut Session, what: &str) {
    s.feed(&[], &NO).unwrap(); // the pending token fed
    let m = s.model.clone();
    let ds =
        s.ds.as_ref()
            .unwrap_or_else(|| panic!("{what}: no drafter state"));
    assert_eq!(ds.len(), s.st.pos(), "{what}");
    let (mut st, mut fresh) = (m.new_state(), m.drafter_state().unwrap());
    m.forward_observe(&mut st, &mut fresh, &s.st.tokens, Want::None, &NO)
        .unwrap();
    let a = m.draft_full(ds, 7, 5).unwrap();
    let b = m.draft_full(&fresh, 7, 5).unwrap();
    assert_eq!(a.tokens, b.tokens, "{what}");
    assert!(
        a.logits
            .iter()
            .zip(&b.logits)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "{what}: the drafts' logits differ"
    );
}

#[test]
fn dspark_generation_is_plain_decoding_bitwise() {
    let m = with_drafter();
    let prompt = ids(&m, 5, 11);
    let mut rejected = 0;
    for (temperature, seed) in [(0.0, 0), (0.9, 3)] {
        let p = params(temperature, seed);
        let (want, ref_s) = plain(&prompt, 30, &p);
        for k in [1, 3, 5] {
            let what = format!("t={temperature} k={k}");
            let mut s = Session::new(m.clone());
            assert!(s.observes_drafter());
            let mut g = dspark(&prompt, 30, &p, k);
            assert_eq!(run(&mut s, &mut g), want, "{what}");
            let st = g.speculation().unwrap().stats();
            assert!(st.verifies > 0, "{what}: nothing verified");
            rejected += st.drafted - st.accepted;
            assert_eq!(s.tokens(), ref_s.tokens(), "{what}");
            assert_eq!(bits(&s.st), bits(&ref_s.st), "{what}: the states differ");
            assert_in_step(&mut s, &what);
        }
    }
    assert!(
        rejected > 0,
        "no draft was ever rejected: the cut back is untested"
    );
}

#[test]
fn accepted_drafts_keep_the_drafter_in_step() {
    // DSpark is (almost) never right on the random fixture: its drafts are replaced by an
    // oracle's, right with probability `right`, after DSpark drafted (the same path)
    let m = with_drafter();
    let prompt = ids(&m, 12, 10);
    for (temperature, seed) in [(0.0, 0), (0.9, 2)] {
        let p = params(temperature, seed);
        let (want, ref_s) = plain(&prompt, 40, &p);
        let truth: Vec<u32> = want.iter().map(|w| w.0).collect();
        for (right, k) in [(1.0, 5), (0.6, 5), (0.8, 2)] {
            let what = format!("t={temperature} right={right} k={k}");
            let mut s = Session::new(m.clone());
            let mut g = dspark(&prompt, 40, &p, k);
            let o = crate::speculate::oracle::Oracle::new(
                prompt.len(),
                truth.clone(),
                right,
                5,
                m.cfg.vocab_size as u32,
            );
            if let Some(sp) = g.spec.as_mut() {
                sp.dspark_oracle = Some(o);
            }
            assert_eq!(run(&mut s, &mut g), want, "{what}");
            let st = g.speculation().unwrap().stats();
            assert!(st.accepted > 0, "{what}: nothing accepted");
            if right == 1.0 {
                assert_eq!(st.accepted, st.drafted, "{what}");
            } else {
                assert!(st.accepted < st.drafted, "{what}");
            }
            assert_eq!(bits(&s.st), bits(&ref_s.st), "{what}");
            assert_in_step(&mut s, &what);
        }
    }
}

#[test]
fn auto_drafts_with_dspark_where_lookup_has_nothing() {
    let m = with_drafter();
    let prompt = ids(&m, 9, 10); // no n-gram recurs: lookup drafts nothing
    let p = params(0.0, 0);
    let (want, _) = plain(&prompt, 20, &p);
    let mut s = Session::new(m.clone());
    let mut g = Generation::new(prompt.clone(), 20, p, vec![])
        .unwrap()
        .with_logprobs(3)
        .with_speculation(drafter_for(&m, Mode::Auto).unwrap().unwrap())
        .forcing_drafts(4);
    assert_eq!(run(&mut s, &mut g), want);
    assert!(g.speculation().unwrap().stats().verifies > 0);
    assert_in_step(&mut s, "auto");
}

#[test]
fn stopping_inside_a_verify_then_going_on_is_plain_decoding() {
    let m = with_drafter();
    let prompt = ids(&m, 6, 9);
    let p = params(0.0, 0);
    for taken in [1, 2, 4] {
        let what = format!("taken={taken}");
        let (want, _) = plain(&prompt, 30, &p);
        let mut s = Session::new(m.clone());
        let mut g = dspark(&prompt, 30, &p, 5);
        for w in &want[..taken] {
            assert_eq!(s.step(&mut g, &NO).unwrap(), Some(w.0), "{what}");
        }
        // the caller stops; another dspark generation goes on from there
        let mut r = Session::new(without());
        let mut gr = Generation::new(prompt.clone(), taken, p.clone(), vec![]).unwrap();
        r.generate(&mut gr, &NO).unwrap();
        let more = [3u32, 4];
        let mut gr = Generation::new(more.to_vec(), 12, p.clone(), vec![])
            .unwrap()
            .with_logprobs(3);
        let want_more = run(&mut r, &mut gr);
        let mut g2 = dspark(&more, 12, &p, 3);
        assert_eq!(run(&mut s, &mut g2), want_more, "{what}");
        assert_eq!(bits(&s.st), bits(&r.st), "{what}");
        assert_in_step(&mut s, &what);
    }
}

#[test]
fn snapshots_and_rollbacks_keep_the_drafter_in_step() {
    let m = with_drafter();
    let prompt = ids(&m, 7, 12);
    let p = params(0.8, 4);
    let mut s = Session::new(m.clone());
    s.feed(&prompt, &NO).unwrap();
    let early = s.snapshot(&NO).unwrap();
    assert!(early.draft.is_some());
    let mut g = dspark(&[], 20, &p, 4);
    let first = run(&mut s, &mut g);
    let late = s.snapshot(&NO).unwrap();
    let mut g = dspark(&[5, 6], 15, &p, 5);
    let after = run(&mut s, &mut g);
    // back to the late snapshot: the same continuation, the drafter in step
    s.rollback(&late).unwrap();
    assert_in_step(&mut s, "late");
    let mut g = dspark(&[5, 6], 15, &p, 5);
    assert_eq!(run(&mut s, &mut g), after);
    // back to before the first generation (further than truncation reaches)
    s.rollback(&early).unwrap();
    assert_in_step(&mut s, "early");
    let mut g = dspark(&[], 20, &p, 2);
    assert_eq!(run(&mut s, &mut g), first);
    // a snapshot without the drafter's state (a session that kept none): truncated when
    // within reach
    let mut bare = s.snapshot(&NO).unwrap();
    bare.draft = None;
    let mut g = dspark(&[9], 10, &p, 3);
    run(&mut s, &mut g);
    s.rollback(&bare).unwrap();
    assert_in_step(&mut s, "bare");
    // the model state moved back behind the session's back (a scheduler's `restore` rolls
    // the state itself back): the drafter state is truncated at the next pass
    let mark = s.st.snapshot();
    let mut g = dspark(&[8], 6, &p, 3);
    let ahead = run(&mut s, &mut g);
    s.st.rollback(&mark).unwrap();
    s.pending = None;
    s.last = None;
    let mut g = dspark(&[8], 6, &p, 3);
    assert_eq!(run(&mut s, &mut g), ahead);
    assert!(g.speculation().unwrap().stats().verifies > 0);
    assert_in_step(&mut s, "restored");
    // ... and the same tokens as plain decoding throughout
    let mut r = Session::new(without());
    r.feed(&prompt, &NO).unwrap();
    let mut g = Generation::new(vec![], 20, p.clone(), vec![])
        .unwrap()
        .with_logprobs(3);
    assert_eq!(run(&mut r, &mut g), first);
}

#[test]
fn a_batched_feed_observes_the_sessions_that_keep_a_drafter_state() {
    let m = with_drafter();
    let (pa, pb) = (ids(&m, 13, 9), ids(&m, 14, 6));
    let p = params(0.7, 9);
    let mut a = Session::new(m.clone());
    let mut b = Session::new(m.clone());
    b.ds = None; // one that keeps none, in the same batch
                 // a pending token too (a's first generation), fed first by the batch
    let mut g = dspark(&pa, 3, &p, 2);
    run(&mut a, &mut g);
    let more = [5u32, 6, 7];
    let mut items = [
        BatchFeed {
            session: &mut a,
            ids: &more,
            want: Want::Last,
        },
        BatchFeed {
            session: &mut b,
            ids: &pb,
            want: Want::All,
        },
    ];
    Session::feed_batch(&mut items, &NO).unwrap();
    assert!(a.observes_drafter() && !b.observes_drafter());
    assert_in_step(&mut a, "batched");
    // and a dspark generation after it drafts, with plain decoding's tokens
    let mut r = Session::new(without());
    r.feed(&[&pa[..], &a.tokens()[pa.len()..]].concat(), &NO)
        .unwrap();
    let mut gr = Generation::new(vec![4], 12, p.clone(), vec![])
        .unwrap()
        .with_logprobs(3);
    let want = run(&mut r, &mut gr);
    let mut g = dspark(&[4], 12, &p, 4);
    assert_eq!(run(&mut a, &mut g), want);
    assert!(g.speculation().unwrap().stats().verifies > 0);
    assert_in_step(&mut a, "after the batch");
}

#[test]
fn a_session_the_drafter_did_not_see_steps_plainly() {
    // a model that does not draft with DSpark by default: its sessions keep no state
    let m = load(true, Mode::Off);
    let prompt = ids(&m, 8, 10);
    let p = params(0.0, 0);
    let (want, _) = plain(&prompt, 16, &p);
    let mut s = Session::new(m.clone());
    assert!(!s.observes_drafter());
    s.feed(&prompt, &NO).unwrap();
    let mut g = dspark(&[], 16, &p, 5);
    assert_eq!(run(&mut s, &mut g), want, "fed before dspark was asked for");
    let st = g.speculation().unwrap().stats();
    assert_eq!((st.verifies, st.plain_steps > 0), (0, true));
    assert!(!s.observes_drafter());
    // a lookup generation on such a model never captures anything
    let mut s = Session::new(m.clone());
    let mut g = Generation::new(prompt.clone(), 8, p.clone(), vec![])
        .unwrap()
        .with_speculation(Drafter::Lookup(PromptLookup::default()));
    s.generate(&mut g, &NO).unwrap();
    assert!(!s.observes_drafter());
    // an empty session starts keeping one for a dspark generation
    let mut s = Session::new(m.clone());
    let mut g = dspark(&prompt, 16, &p, 5);
    assert_eq!(run(&mut s, &mut g), want);
    assert!(g.speculation().unwrap().stats().verifies > 0);
    assert_in_step(&mut s, "started empty");
    // a session loaded from a file: no state; its generations are plain decoding's
    let dir = std::env::temp_dir().join(format!("v4f-dspark-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.v4s");
    s.save(&path, None, None, &NO).unwrap();
    let (mut back, _) = Session::load(m.clone(), &path, &NO).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!back.observes_drafter());
    let mut g = dspark(&[2, 3], 6, &p, 5);
    let mut g2 = dspark(&[2, 3], 6, &p, 5);
    assert_eq!(run(&mut back, &mut g), run(&mut s, &mut g2));
}

#[test]
fn dspark_is_refused_without_the_drafter() {
    let e = drafter_for(&without(), Mode::DSpark)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("drafter=True") && e.contains("lookup"), "{e}");
    let auto = drafter_for(&without(), Mode::Auto).unwrap().unwrap();
    assert!(!auto.uses_dspark());
    assert!(drafter_for(&with_drafter(), Mode::DSpark)
        .unwrap()
        .unwrap()
        .uses_dspark());
    assert!(!Session::new(without()).observes_drafter());
}
