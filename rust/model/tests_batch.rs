//! The batched forward pass (`Model::forward_batch`) against single sequences, on the
//! fixtures, in every numerics mode: each sequence's logits and state after a batch are the
//! same bits as after a `forward` of it alone, whatever the batch's composition (decode
//! steps beside a several-token verify and a prefill chunk), order, positions (around the
//! window and the compression ratios), chunking and thread count; a failed or cancelled
//! batch leaves every state as it was.

use super::session::State;
use super::{Model, Seq, Want};
use crate::error::Error;
use crate::kernels::Numerics;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::test_util::{bits, ids, load_fixture, StateBits, NO};

fn load(name: &str, numerics: Numerics, threads: usize) -> Model {
    load_fixture(name, numerics, Some(threads))
}

/// A state of `m` that has been fed `prefix`.
fn state(m: &Model, prefix: &[u32]) -> State {
    let mut st = m.new_state();
    m.forward(&mut st, prefix, Want::None, &NO).unwrap();
    st
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A state's tokens and every f32 of it as bits (`bits`).
/// A sequence's logits and state after a call.
type Outcome = (Vec<f32>, StateBits);

/// One sequence of a scenario: the tokens already in its state, the tokens the batch feeds,
/// and the logits it wants.
struct Case {
    prefix: Vec<u32>,
    feed: Vec<u32>,
    want: Want,
}

/// Sequences at positions around tiny-a's window (8) and ratios (4, 8) and tiny-b's (16; 4,
/// 16): decode steps, a verify of 5 drafts, a 12-token prefill chunk, an empty one, a fresh
/// one; 37 tokens in all, past the kernels' fused paths (8 and 16 tokens).
fn cases(m: &Model) -> Vec<Case> {
    let plan: [(usize, usize, Want); 9] = [
        (7, 1, Want::Last),
        (3, 5, Want::All),
        (8, 1, Want::All),
        (15, 12, Want::All),
        (16, 1, Want::Last),
        (23, 0, Want::Last),
        (31, 1, Want::None),
        (0, 4, Want::Last),
        (33, 12, Want::Last),
    ];
    plan.iter()
        .enumerate()
        .map(|(i, &(p, k, want))| {
            let all = ids(m, i as u64 + 1, p + k);
            Case {
                prefix: all[..p].to_vec(),
                feed: all[p..].to_vec(),
                want,
            }
        })
        .collect()
}

/// Each case alone: its logits and its state afterwards.
fn alone(m: &Model, cs: &[Case]) -> Vec<Outcome> {
    cs.iter()
        .map(|c| {
            let mut st = state(m, &c.prefix);
            let lg = m.forward(&mut st, &c.feed, c.want, &NO).unwrap();
            (lg, bits(&st))
        })
        .collect()
}

/// The cases in the given order as one batch: each one's logits and state afterwards, in
/// the cases' order.
fn batched(m: &Model, cs: &[Case], order: &[usize]) -> Vec<Outcome> {
    let mut sts: Vec<State> = order.iter().map(|&i| state(m, &cs[i].prefix)).collect();
    let mut seqs: Vec<Seq> = sts
        .iter_mut()
        .zip(order)
        .map(|(st, &i)| Seq {
            st,
            ids: &cs[i].feed,
            want: cs[i].want,
        })
        .collect();
    let out = m.forward_batch(&mut seqs, &NO).unwrap();
    drop(seqs);
    let mut got: Vec<Option<_>> = (0..cs.len()).map(|_| None).collect();
    for ((lg, st), &i) in out.into_iter().zip(&sts).zip(order) {
        got[i] = Some((lg, bits(st)));
    }
    got.into_iter().map(|g| g.unwrap()).collect()
}

fn check(name: &str, what: &str, m: &Model, cs: &[Case], want: &[Outcome], got: &[Outcome]) {
    let v = m.cfg.vocab_size;
    for (i, ((wl, ws), (gl, gs))) in want.iter().zip(got).enumerate() {
        let rows = match cs[i].want {
            Want::None => 0,
            Want::Last => usize::from(!cs[i].feed.is_empty()),
            Want::All => cs[i].feed.len(),
        };
        assert_eq!(gl.len(), rows * v, "{name} {what}: sequence {i}'s logits");
        assert!(
            same_bits(wl, gl),
            "{name} {what}: sequence {i}'s logits differ"
        );
        assert!(ws == gs, "{name} {what}: sequence {i}'s state differs");
    }
}

#[test]
fn a_batch_gives_each_sequence_the_bits_it_gets_alone_in_every_numerics_mode() {
    for name in ["tiny-a", "tiny-b"] {
        for numerics in Numerics::ALL {
            let tag = format!("{name}/{}", numerics.name());
            // the reference: each sequence alone on one thread
            let one = load(name, numerics, 1);
            let cs = cases(&one);
            let want = alone(&one, &cs);
            let n = cs.len();
            let fwd: Vec<usize> = (0..n).collect();
            let rev: Vec<usize> = (0..n).rev().collect();
            let mixed: Vec<usize> = (0..n).map(|i| (i * 4 + 3) % n).collect();
            for threads in [1, 2] {
                let m = load(name, numerics, threads);
                for (what, order) in [("in order", &fwd), ("reversed", &rev), ("mixed", &mixed)] {
                    let got = batched(&m, &cs, order);
                    check(
                        &tag,
                        &format!("{what}, {threads} threads"),
                        &m,
                        &cs,
                        &want,
                        &got,
                    );
                }
            }
            // spans and chunks cut across the sequences: 5-token chunks in 11-token spans
            let mut m = load(name, numerics, 2);
            m.plan.prefill_chunk = 5;
            m.plan.prefill_span = 11;
            let got = batched(&m, &cs, &mixed);
            check(&tag, "in spans of 11 and chunks of 5", &m, &cs, &want, &got);
        }
    }
}

#[test]
fn batched_decode_steps_across_the_boundaries_equal_each_sequence_alone() {
    for name in ["tiny-a", "tiny-b"] {
        let m = load(name, Numerics::Exact, 2);
        let v = m.cfg.vocab_size;
        let argmax =
            |row: &[f32]| (0..v).fold(0, |b, i| if row[i] > row[b] { i } else { b }) as u32;
        // four sequences at positions 5..8 (and one prefilling as they decode), 20 greedy
        // steps: they cross the window and every compression boundary, each at its own time
        let starts = [5usize, 6, 7, 8];
        let prompts: Vec<Vec<u32>> = starts.iter().map(|&p| ids(&m, 100 + p as u64, p)).collect();
        let steps = 20;
        let mut want = Vec::new();
        for p in &prompts {
            let mut st = m.new_state();
            let mut lg = m.forward(&mut st, p, Want::Last, &NO).unwrap();
            let mut toks = Vec::new();
            for _ in 0..steps {
                let t = argmax(&lg);
                toks.push(t);
                lg = m.forward(&mut st, &[t], Want::Last, &NO).unwrap();
            }
            want.push((toks, lg, bits(&st)));
        }
        let mut sts: Vec<State> = prompts.iter().map(|_| m.new_state()).collect();
        let mut seqs: Vec<Seq> = sts
            .iter_mut()
            .zip(&prompts)
            .map(|(st, p)| Seq {
                st,
                ids: p,
                want: Want::Last,
            })
            .collect();
        let mut lgs = m.forward_batch(&mut seqs, &NO).unwrap();
        drop(seqs);
        let mut toks = vec![Vec::new(); prompts.len()];
        for _ in 0..steps {
            let next: Vec<[u32; 1]> = lgs.iter().map(|lg| [argmax(lg)]).collect();
            for (t, n) in toks.iter_mut().zip(&next) {
                t.push(n[0]);
            }
            let mut seqs: Vec<Seq> = sts
                .iter_mut()
                .zip(&next)
                .map(|(st, n)| Seq {
                    st,
                    ids: n,
                    want: Want::Last,
                })
                .collect();
            lgs = m.forward_batch(&mut seqs, &NO).unwrap();
        }
        for (i, (wt, wl, ws)) in want.iter().enumerate() {
            assert_eq!(&toks[i], wt, "{name}: sequence {i}'s greedy tokens");
            assert!(same_bits(wl, &lgs[i]), "{name}: sequence {i}'s last logits");
            assert!(*ws == bits(&sts[i]), "{name}: sequence {i}'s state");
        }
    }
}

#[test]
fn a_failed_or_cancelled_batch_leaves_every_state_as_it_was() {
    let m = load("tiny-a", Numerics::Exact, 2);
    let cs = cases(&m);
    let mut sts: Vec<State> = cs.iter().map(|c| state(&m, &c.prefix)).collect();
    let before: Vec<_> = sts.iter().map(bits).collect();
    let unchanged = |sts: &[State]| sts.iter().map(bits).collect::<Vec<_>>() == before;

    // an id out of the vocabulary in one sequence: refused, naming it
    let bad = [1, m.cfg.vocab_size as u32];
    let mut seqs: Vec<Seq> = sts
        .iter_mut()
        .zip(&cs)
        .enumerate()
        .map(|(i, (st, c))| Seq {
            st,
            ids: if i == 4 { &bad } else { &c.feed },
            want: c.want,
        })
        .collect();
    match m.forward_batch(&mut seqs, &NO) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(
                msg.starts_with("sequence 4 of the batch: token id"),
                "{msg}"
            )
        }
        other => panic!("expected InvalidArgument, got {:?}", other.map(|v| v.len())),
    }
    drop(seqs);
    assert!(unchanged(&sts));

    // cancelled after some layers: every state back as it was, at every point
    let layers = m.cfg.num_layers;
    for stop_at in [1, layers, layers + 3] {
        let polls = AtomicUsize::new(0);
        let cancel = || polls.fetch_add(1, Ordering::Relaxed) >= stop_at;
        let mut seqs: Vec<Seq> = sts
            .iter_mut()
            .zip(&cs)
            .map(|(st, c)| Seq {
                st,
                ids: &c.feed,
                want: c.want,
            })
            .collect();
        assert!(matches!(
            m.forward_batch(&mut seqs, &cancel),
            Err(Error::Cancelled)
        ));
        drop(seqs);
        assert!(unchanged(&sts), "cancelled at poll {stop_at}");
    }

    // ... and the same batch then runs as if nothing had happened
    let want = alone(&m, &cs);
    let order: Vec<usize> = (0..cs.len()).collect();
    check(
        "tiny-a",
        "after the failures",
        &m,
        &cs,
        &want,
        &batched(&m, &cs, &order),
    );

    // a state of another model is refused, and nothing changes
    let other = load("tiny-a", Numerics::Exact, 1);
    let mut foreign = other.new_state();
    let mut seqs = vec![
        Seq {
            st: &mut sts[0],
            ids: &cs[0].feed,
            want: Want::Last,
        },
        Seq {
            st: &mut foreign,
            ids: &cs[1].feed,
            want: Want::Last,
        },
    ];
    let e = m.forward_batch(&mut seqs, &NO).unwrap_err();
    assert!(e.to_string().contains("sequence 1 of the batch"), "{e}");
    drop(seqs);
    assert!(unchanged(&sts));
}

#[test]
fn an_empty_batch_and_empty_sequences_do_nothing() {
    let m = load("tiny-a", Numerics::Exact, 1);
    assert!(m.forward_batch(&mut [], &NO).unwrap().is_empty());
    let mut a = state(&m, &[3, 4, 5]);
    let before = bits(&a);
    let mut seqs = [Seq {
        st: &mut a,
        ids: &[],
        want: Want::All,
    }];
    assert_eq!(
        m.forward_batch(&mut seqs, &NO).unwrap(),
        vec![Vec::<f32>::new()]
    );
    assert!(bits(&a) == before);
}

#[test]
fn sessions_fed_together_continue_as_each_fed_alone() {
    use super::generate::{BatchFeed, Generation, Session};
    use super::sample::SampleParams;
    use std::sync::Arc;
    let m = Arc::new(load("tiny-a", Numerics::Exact, 2));
    let greedy = SampleParams {
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 0,
    };
    let (pa, pb, pc) = (ids(&m, 7, 6), ids(&m, 8, 9), ids(&m, 9, 3));
    let (xa, xb) = (ids(&m, 10, 2), ids(&m, 11, 1));
    // a: three tokens generated (the last one pending), b: fed, c: fresh
    let sessions = || {
        let mut a = Session::new(m.clone());
        let mut g = Generation::new(pa.clone(), 3, greedy.clone(), vec![]).unwrap();
        a.generate(&mut g, &NO).unwrap();
        let mut b = Session::new(m.clone());
        b.feed(&pb, &NO).unwrap();
        (a, b, Session::new(m.clone()))
    };
    let (mut a, mut b, mut c) = sessions();
    let (mut a1, mut b1, mut c1) = sessions();
    let a_tokens = a.tokens();
    let out = Session::feed_batch(
        &mut [
            BatchFeed {
                session: &mut a,
                ids: &xa,
                want: Want::All,
            },
            BatchFeed {
                session: &mut b,
                ids: &xb,
                want: Want::Last,
            },
            BatchFeed {
                session: &mut c,
                ids: &pc,
                want: Want::None,
            },
        ],
        &NO,
    )
    .unwrap();
    a1.feed(&xa, &NO).unwrap();
    b1.feed(&xb, &NO).unwrap();
    c1.feed(&pc, &NO).unwrap();
    let v = m.cfg.vocab_size;
    // a's rows: after its pending token, then after each of xa
    let all = [&a_tokens[..], &xa].concat();
    let want_a = m.forward(&mut m.new_state(), &all, Want::All, &NO).unwrap();
    assert!(same_bits(&out[0], &want_a[(all.len() - 3) * v..]));
    assert!(same_bits(&out[1], b1.last_logits().unwrap()));
    assert!(out[2].is_empty());
    for (s, s1) in [(&mut a, &mut a1), (&mut b, &mut b1), (&mut c, &mut c1)] {
        assert_eq!(s.tokens(), s1.tokens());
        assert!(same_bits(
            s.last_logits().unwrap(),
            s1.last_logits().unwrap()
        ));
        let mut g = Generation::new(vec![], 4, greedy.clone(), vec![]).unwrap();
        let mut g1 = Generation::new(vec![], 4, greedy.clone(), vec![]).unwrap();
        assert_eq!(
            s.generate(&mut g, &NO).unwrap(),
            s1.generate(&mut g1, &NO).unwrap()
        );
    }
    // sessions of two models are refused, and neither changes
    let other = Arc::new(load("tiny-a", Numerics::Exact, 1));
    let mut d = Session::new(other);
    let before = a.tokens();
    let e = Session::feed_batch(
        &mut [
            BatchFeed {
                session: &mut a,
                ids: &xb,
                want: Want::Last,
            },
            BatchFeed {
                session: &mut d,
                ids: &xb,
                want: Want::Last,
            },
        ],
        &NO,
    )
    .unwrap_err();
    assert!(e.to_string().contains("one model"), "{e}");
    assert_eq!((a.tokens(), d.position()), (before, 0));
    assert!(Session::feed_batch(&mut [], &NO).unwrap().is_empty());
}
