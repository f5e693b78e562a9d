//! Generation's tests: sampling steps, stops, rollbacks and sessions on the fixtures.

use super::*;

#[test]
fn token_logprobs_are_the_log_softmax_of_the_raw_logits() {
    let logits = [1.0f32, 3.0, -2.0, 3.0, 0.5];
    let l = TokenLogprobs::of(&logits, 4, 3);
    let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
    assert!((l.logprob as f64 - (0.5 - z.ln())).abs() < 1e-6);
    // most likely first, ties by id
    assert_eq!(l.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 0]);
    assert_eq!(l.top[0].1, l.top[1].1);
    let total: f64 = (0..5)
        .map(|i| (TokenLogprobs::of(&logits, i, 0).logprob as f64).exp())
        .sum();
    assert!((total - 1.0).abs() < 1e-6);
    assert!(TokenLogprobs::of(&logits, 0, 0).top.is_empty());
    assert_eq!(TokenLogprobs::of(&logits, 0, 99).top.len(), 5);
}
use crate::model::LoadOptions;
use std::path::Path;
use std::sync::OnceLock;

const PROMPT: [u32; 5] = [0, 7, 9, 11, 3];

fn load(ctx: Option<usize>) -> Arc<Model> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/tiny-a");
    let opts = LoadOptions {
        threads: std::num::NonZeroUsize::new(1),
        ctx: ctx.and_then(std::num::NonZeroUsize::new),
        ..LoadOptions::default()
    };
    Arc::new(Model::load(&dir, &opts).expect("the tiny-a fixture loads"))
}

/// One model for the tests that do not need their own context length.
fn model() -> Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| load(None)).clone()
}

fn params(temperature: f32, seed: u64) -> SampleParams {
    SampleParams {
        temperature,
        top_p: 0.9,
        top_k: 50,
        seed,
    }
}

fn gen(prompt: &[u32], max_new: usize, p: SampleParams, stops: &[u32]) -> Generation {
    Generation::new(prompt.to_vec(), max_new, p, stops.to_vec()).unwrap()
}

const NO: fn() -> bool = || false;

#[test]
fn one_call_equals_single_steps_and_the_token_callback() {
    let m = model();
    for p in [params(0.0, 0), params(1.0, 11)] {
        let mut a = Session::new(m.clone());
        let all = a
            .generate(&mut gen(&PROMPT, 10, p.clone(), &[]), &NO)
            .unwrap();
        assert_eq!(all.len(), 10);

        let mut b = Session::new(m.clone());
        let mut g = gen(&PROMPT, 10, p.clone(), &[]);
        let mut steps = Vec::new();
        while let Some(t) = b.step(&mut g, &NO).unwrap() {
            steps.push(t);
            assert_eq!(g.produced(), steps.len());
        }
        assert!(g.finished());
        assert_eq!(
            b.step(&mut g, &NO).unwrap(),
            None,
            "a finished generation stays so"
        );
        assert_eq!(steps, all);

        let mut c = Session::new(m.clone());
        let mut seen = Vec::new();
        let got = c
            .generate_with(&mut gen(&PROMPT, 10, p, &[]), &NO, |t| seen.push(t))
            .unwrap();
        assert_eq!((&got, &seen), (&all, &all));

        for s in [&a, &b, &c] {
            assert_eq!(s.tokens(), [&PROMPT[..], &all].concat());
            assert_eq!(s.position(), PROMPT.len() + 10);
        }
    }
}

#[test]
fn sampling_depends_on_the_seed_and_step_index() {
    let m = model();
    let run = |seed| {
        let mut s = Session::new(m.clone());
        s.generate(&mut gen(&PROMPT, 12, params(1.0, seed), &[]), &NO)
            .unwrap()
    };
    assert_eq!(run(3), run(3));
    assert_ne!(run(3), run(4));
}

#[test]
fn rollback_then_generate_continues_as_the_original() {
    let m = model();
    for p in [params(0.0, 0), params(1.0, 5)] {
        let mut s = Session::new(m.clone());
        s.feed(&PROMPT, &NO).unwrap();
        let at = s.last_logits().unwrap().to_vec();
        let snap = s.snapshot(&NO).unwrap();
        assert_eq!(snap.pos(), PROMPT.len());
        let first = s.generate(&mut gen(&[], 8, p.clone(), &[]), &NO).unwrap();
        s.rollback(&snap).unwrap();
        assert_eq!(s.position(), PROMPT.len());
        assert_eq!(
            s.last_logits(),
            Some(&at[..]),
            "the snapshot's logits, bit for bit"
        );
        // generate with nothing new to feed: samples from the restored logits
        let again = s.generate(&mut gen(&[], 8, p.clone(), &[]), &NO).unwrap();
        assert_eq!(again, first);

        // a snapshot taken with a sampled token pending (it is fed first)
        let mut t = Session::new(m.clone());
        let head = t
            .generate(&mut gen(&PROMPT, 3, p.clone(), &[]), &NO)
            .unwrap();
        let snap = t.snapshot(&NO).unwrap();
        assert_eq!(snap.pos(), PROMPT.len() + 3);
        let tail = t.generate(&mut gen(&[], 5, p.clone(), &[]), &NO).unwrap();
        t.rollback(&snap).unwrap();
        assert_eq!(t.tokens(), [&PROMPT[..], &head].concat());
        let tail2 = t.generate(&mut gen(&[], 5, p.clone(), &[]), &NO).unwrap();
        assert_eq!(tail2, tail);
        // ... and the same as a fresh session fed the whole sequence
        let mut f = Session::new(m.clone());
        f.feed(&[&PROMPT[..], &head].concat(), &NO).unwrap();
        assert_eq!(f.generate(&mut gen(&[], 5, p, &[]), &NO).unwrap(), tail);
    }
}

#[test]
fn empty_prompt_and_empty_snapshot_have_nothing_to_sample_from() {
    let m = model();
    let mut s = Session::new(m.clone());
    let empty = s.snapshot(&NO).unwrap();
    let e = s
        .generate(&mut gen(&[], 3, params(0.0, 0), &[]), &NO)
        .unwrap_err();
    assert!(e.to_string().contains("prompt is empty"), "{e}");
    s.feed(&PROMPT, &NO).unwrap();
    s.rollback(&empty).unwrap();
    assert_eq!((s.position(), s.last_logits()), (0, None));
    let e = s
        .generate(&mut gen(&[], 3, params(0.0, 0), &[]), &NO)
        .unwrap_err();
    assert!(e.to_string().contains("prompt is empty"), "{e}");
    // a failed rollback changes nothing (the pending token included)
    let mut other = Session::new(m.clone());
    other.feed(&[0, 4, 6], &NO).unwrap();
    let foreign = other.snapshot(&NO).unwrap();
    let out = s
        .generate(&mut gen(&PROMPT, 2, params(0.0, 0), &[]), &NO)
        .unwrap();
    let before = s.tokens();
    assert!(s.rollback(&foreign).is_err());
    assert_eq!(s.tokens(), before);
    assert_eq!(s.position(), PROMPT.len() + out.len());
}

#[test]
fn a_stop_id_ends_the_generation_and_is_returned() {
    let m = model();
    let mut s = Session::new(m.clone());
    let free = s
        .generate(&mut gen(&PROMPT, 12, params(1.0, 9), &[]), &NO)
        .unwrap();
    let k = 4;
    let stop = free[k];
    let first = free.iter().position(|&t| t == stop).unwrap();
    let mut s = Session::new(m.clone());
    let mut g = gen(&PROMPT, 12, params(1.0, 9), &[stop, u32::MAX]);
    let out = s.generate(&mut g, &NO).unwrap();
    assert_eq!(out, free[..=first]);
    assert!(g.finished());
    assert_eq!(s.tokens(), [&PROMPT[..], &out].concat());
}

#[test]
fn a_full_context_stops_and_returns_the_tokens() {
    let small = load(Some(8));
    let mut s = Session::new(small.clone());
    s.feed(&[0, 1, 2, 3, 4, 5], &NO).unwrap();
    let out = s
        .generate(&mut gen(&[], 10, params(0.0, 0), &[]), &NO)
        .unwrap();
    // tokens 7 and 8 are fed; the one sampled at position 8 cannot be, and is returned
    assert_eq!(out.len(), 3);
    let mut big = Session::new(model());
    big.feed(&[0, 1, 2, 3, 4, 5], &NO).unwrap();
    let want = big
        .generate(&mut gen(&[], 3, params(0.0, 0), &[]), &NO)
        .unwrap();
    assert_eq!(out, want);
    assert_eq!(s.tokens(), [&[0, 1, 2, 3, 4, 5][..], &out].concat());
    // at the limit, generation can only fail (nothing can be fed), with the context error
    let e = s
        .generate(&mut gen(&[], 1, params(0.0, 0), &[]), &NO)
        .unwrap_err();
    assert!(e.to_string().contains("context of 8 tokens"), "{e}");
}

#[test]
fn a_cancelled_step_changes_nothing_and_can_be_retried() {
    let m = model();
    let p = params(1.0, 21);
    let mut want = Session::new(m.clone());
    let all = want
        .generate(&mut gen(&PROMPT, 6, p.clone(), &[]), &NO)
        .unwrap();

    let mut s = Session::new(m.clone());
    let mut g = gen(&PROMPT, 6, p, &[]);
    let yes = || true;
    assert!(matches!(s.step(&mut g, &yes), Err(Error::Cancelled)));
    assert_eq!((s.position(), g.produced()), (0, 0));
    let mut got = vec![s.step(&mut g, &NO).unwrap().unwrap()];
    assert!(matches!(s.step(&mut g, &yes), Err(Error::Cancelled)));
    assert_eq!(
        s.tokens(),
        [&PROMPT[..], &got].concat(),
        "the sampled token stays"
    );
    while let Some(t) = s.step(&mut g, &NO).unwrap() {
        got.push(t);
    }
    assert_eq!(got, all);
}

/// A vocabulary for the fixture: ids below 256 are the bytes (id 1, EOS, excepted), the
/// others special tokens.
fn byte_vocab(m: &Model) -> (crate::grammar::Vocabulary, u32) {
    let n = m.cfg.vocab_size;
    let words = (0..n)
        .map(|i| match i {
            1 => b"\xFF<eos>".to_vec(),
            0..256 => vec![i as u8],
            _ => [&[0xFF][..], format!("<{i}>").as_bytes()].concat(),
        })
        .collect();
    (crate::grammar::Vocabulary::new(words, 1).unwrap(), 1)
}

#[test]
fn a_constraint_that_allows_every_token_changes_nothing() {
    use crate::grammar::{Constraint, Kind};
    let m = model();
    let (v, eos) = byte_vocab(&m);
    let all = v.compile(Kind::Lark, "start: <[*]>*").unwrap();
    for p in [params(0.0, 0), params(1.0, 3), params(0.7, 8)] {
        let free = Session::new(m.clone())
            .generate(&mut gen(&PROMPT, 12, p.clone(), &[eos]), &NO)
            .unwrap();
        let c = Constraint::new(&v, all.clone(), None).unwrap();
        let mut g = gen(&PROMPT, 12, p, &[eos]).with_constraint(c);
        let mut s = Session::new(m.clone());
        assert_eq!(s.generate(&mut g, &NO).unwrap(), free);
        assert_eq!(g.constraint().unwrap().mask_times().len(), free.len());
    }
}

#[test]
fn a_constrained_generation_follows_its_grammar() {
    use crate::grammar::{Constraint, Kind};
    let m = model();
    let (v, eos) = byte_vocab(&m);
    let g = v.compile(Kind::Regex, "[a-c]{3,5}!").unwrap();
    for (i, p) in [params(0.0, 0), params(1.0, 3), params(1.5, 4)]
        .into_iter()
        .enumerate()
    {
        let mut s = Session::new(m.clone());
        let mut gn = gen(&PROMPT, 20, p, &[eos])
            .with_constraint(Constraint::new(&v, g.clone(), None).unwrap());
        let out = s.generate(&mut gn, &NO).unwrap();
        assert_eq!(out.last(), Some(&eos), "{out:?}");
        let text: Vec<u8> = out[..out.len() - 1].iter().map(|&t| t as u8).collect();
        assert!(
            text.ends_with(b"!") && (4..=6).contains(&text.len()),
            "{i}: {text:?}"
        );
        assert!(text[..text.len() - 1].iter().all(|b| b"abc".contains(b)));
        // cut short by max_new: the tokens so far follow the grammar too
        let mut gn = gen(&PROMPT, 2, params(1.0, 9), &[eos])
            .with_constraint(Constraint::new(&v, g.clone(), None).unwrap());
        let out = Session::new(m.clone()).generate(&mut gn, &NO).unwrap();
        assert!(out.iter().all(|&t| b"abc".contains(&(t as u8))), "{out:?}");
    }
    // waiting for a token: free until it, then the grammar
    let wait = 300;
    let mut gn = gen(&PROMPT, 30, params(1.0, 1), &[eos])
        .with_constraint(Constraint::new(&v, g.clone(), Some(wait)).unwrap());
    let mut s = Session::new(m.clone());
    let out = s.generate(&mut gn, &NO).unwrap();
    if let Some(at) = out.iter().position(|&t| t == wait) {
        let tail: Vec<u8> = out[at + 1..].iter().map(|&t| t as u8).collect();
        assert!(tail.iter().all(|b| b"abc!\x01".contains(b)), "{tail:?}");
    } else {
        assert!(
            !out.contains(&eos),
            "EOS while waiting becomes the awaited token"
        );
    }
}

#[test]
fn zero_new_tokens_feeds_the_prompt_only() {
    let m = model();
    let mut s = Session::new(m);
    let mut g = gen(&PROMPT, 0, params(0.0, 0), &[]);
    assert!(!g.finished());
    assert_eq!(s.generate(&mut g, &NO).unwrap(), Vec::<u32>::new());
    assert!(g.finished());
    assert_eq!(s.tokens(), PROMPT);
    assert!(s.last_logits().is_some());
    let bad = SampleParams {
        top_p: 0.0,
        ..params(1.0, 0)
    };
    assert!(Generation::new(vec![0], 1, bad, vec![]).is_err());
}

/// `step_together`: generations at mixed points (long prompts fed in parts of every size,
/// decoding ones, a stopped one, an error of one's own) each get, step after step, the
/// tokens, logprobs and state of stepping alone.
#[test]
fn stepping_together_equals_stepping_alone() {
    let m = model();
    let prompts: Vec<Vec<u32>> = [(1, 9), (2, 40), (3, 3), (4, 23)]
        .iter()
        .map(|&(s, n)| crate::model::test_util::ids(&m, s, n))
        .collect();
    let mk = |i: usize| {
        let p = params([0.0, 0.8, 1.0, 0.7][i], 30 + i as u64);
        gen(&prompts[i], [12, 9, 15, 6][i], p, &[]).with_logprobs(2)
    };
    // alone
    let mut want = Vec::new();
    for i in 0..4 {
        let mut s = Session::new(m.clone());
        let mut g = mk(i);
        let mut out = Vec::new();
        while let Some(t) = s.step(&mut g, &NO).unwrap() {
            out.push((t, g.last_logprobs().cloned()));
        }
        want.push((out, crate::model::test_util::bits(s.state())));
    }
    // together, prompts fed in parts of 1, 7, 2 and 5 tokens
    let mut ss: Vec<Session> = (0..4).map(|_| Session::new(m.clone())).collect();
    let mut gs: Vec<Generation> = (0..4).map(mk).collect();
    let parts = [1, 7, 2, 5];
    let mut got: Vec<Vec<(u32, Option<TokenLogprobs>)>> = vec![Vec::new(); 4];
    let mut done = [false; 4];
    let mut fed = [0usize; 4];
    while !done.iter().all(|&d| d) {
        let mut turns: Vec<Turn> = ss
            .iter_mut()
            .zip(gs.iter_mut())
            .zip(parts)
            .zip(done)
            .filter(|(_, d)| !d)
            .map(|(((s, g), prefill), _)| Turn {
                session: s,
                gen: g,
                prefill,
            })
            .collect();
        let idx: Vec<usize> = (0..4).filter(|&i| !done[i]).collect();
        let outs = Session::step_together(&mut turns, &NO);
        drop(turns);
        for (i, o) in idx.into_iter().zip(outs) {
            match o.unwrap() {
                Stepped::Fed(n) => {
                    assert!(n <= parts[i]);
                    fed[i] += n;
                }
                Stepped::Token(t) => got[i].push((t, gs[i].last_logprobs().cloned())),
                Stepped::Done => done[i] = true,
            }
        }
    }
    for i in 0..4 {
        assert_eq!(got[i], want[i].0, "generation {i}");
        assert!(
            crate::model::test_util::bits(ss[i].state()) == want[i].1,
            "state {i}"
        );
        // parts of the prompt, then its last part with the first token
        let last = prompts[i].len() - fed[i];
        assert!(
            (1..=parts[i]).contains(&last),
            "generation {i}: {last} fed with the first token"
        );
    }
    // a prompt beyond the context fails alone, its session and generation unchanged
    let small = load(Some(32));
    let mut a = Session::new(small.clone());
    let mut b = Session::new(small.clone());
    let mut ga = gen(&prompts[0], 4, params(0.0, 1), &[]);
    let mut gb = gen(&prompts[1], 4, params(0.0, 1), &[]);
    let mut turns = vec![
        Turn {
            session: &mut a,
            gen: &mut ga,
            prefill: 64,
        },
        Turn {
            session: &mut b,
            gen: &mut gb,
            prefill: 64,
        },
    ];
    let outs = Session::step_together(&mut turns, &NO);
    drop(turns);
    assert!(matches!(outs[0], Ok(Stepped::Token(_))));
    let e = outs[1].as_ref().unwrap_err().to_string();
    assert!(e.contains("context of 32 tokens"), "{e}");
    assert_eq!((b.position(), gb.prompt_left()), (0, 40));
}
