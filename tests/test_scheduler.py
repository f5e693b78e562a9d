"""Continuous batching (rust/schedule.rs, rust/model/generate/together.rs): a model loaded
for several sessions steps the generations and feeds that callers on several threads ask
for together, one forward pass per round, long prompts fed in parts. Every caller gets
exactly what it gets alone, whatever runs beside it; a caller that gives up loses nothing."""

import threading

import numpy as np
import pytest

from conftest import FIXTURE_NAMES, model_for


def _ids(seed: int, n: int, vocab: int) -> list:
    return [int(i) for i in np.random.default_rng(seed).integers(2, vocab, size=n)]


# (prompt length, generation keywords): greedy and sampled, a prompt longer than a round's
# prefill budget (512) so that it is fed in parts while the others decode
JOBS = [
    (9, dict(max_new_tokens=20, temperature=0.0)),
    (700, dict(max_new_tokens=12, temperature=0.8, seed=3)),
    (3, dict(max_new_tokens=25, temperature=1.0, top_k=20, seed=11)),
    (40, dict(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=5)),
    (1100, dict(max_new_tokens=8, temperature=0.0)),
    (1, dict(max_new_tokens=30, temperature=1.2, seed=7)),
]


def _together(fns):
    """Runs the callables on threads started at once; their results in order (an exception
    is re-raised)."""
    out = [None] * len(fns)
    go = threading.Barrier(len(fns))

    def work(i):
        go.wait()
        try:
            out[i] = ("ok", fns[i]())
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            out[i] = ("err", e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    for kind, v in out:
        if kind == "err":
            raise v
    return [v for _, v in out]


def _logprob_run(m, prompt, kw):
    s = m.session()
    return [(t, lp, top) for t, lp, top in s.stream_logprobs(prompt, top_logprobs=3, **kw)]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_concurrent_generations_each_equal_running_alone(name):
    alone, many = model_for(name), model_for(name, sessions=4)
    assert alone.stats()["batching"] is None
    vocab = alone.config.vocab_size
    prompts = [_ids(i, n, vocab) for i, (n, _) in enumerate(JOBS)]
    want = [_logprob_run(alone, p, kw) for p, (_, kw) in zip(prompts, JOBS)]
    before = many.stats()["batching"]
    got = _together(
        [lambda p=p, kw=kw: _logprob_run(many, p, kw) for p, (_, kw) in zip(prompts, JOBS)]
    )
    for i, (g, w) in enumerate(zip(got, want)):
        assert [t for t, _, _ in g] == [t for t, _, _ in w], (name, i)
        # the log-probabilities are the same bits too
        assert g == w, (name, i)
    after = many.stats()["batching"]
    assert after["widest"] >= 2, after  # the streams did run together
    assert after["rounds"] - before["rounds"] < sum(len(w) for w in want), after
    # the long prompts went in parts: 700 + 1100 tokens, at most 512 a round
    assert after["prefill_parts"] - before["prefill_parts"] >= 512, after


def test_a_long_feed_goes_in_parts_and_equals_one_pass():
    alone, many = model_for("tiny-a"), model_for("tiny-a", sessions=2)
    ids = _ids(1, 1300, alone.config.vocab_size)
    one = alone.session()
    one.feed(ids)
    seen = []
    s = many.session()
    s.feed(ids, progress=lambda done, total: seen.append((done, total)))
    assert np.array_equal(s.last_logits(), one.last_logits())
    assert s.tokens == ids
    # progress after each part, growing, ending at the whole prompt
    assert len(seen) >= 3 and seen[-1] == (1300, 1300), seen
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_feed_given_up_after_some_parts_leaves_the_session_as_it_was():
    alone, many = model_for("tiny-b"), model_for("tiny-b", sessions=2)
    vocab = alone.config.vocab_size
    head, tail = _ids(2, 20, vocab), _ids(3, 1500, vocab)
    s = many.session()
    s.feed(head)
    before = s.last_logits()

    class Stop(Exception):
        pass

    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 2:  # after the second part: two parts are in the state by now
            raise Stop

    with pytest.raises(Stop):
        s.feed(tail, progress=progress)
    assert calls[-1] < 1500
    assert s.tokens == head and s.position == 20
    assert np.array_equal(s.last_logits(), before)
    # and it goes on as if nothing had happened
    s.feed(tail)
    ref = alone.session()
    ref.feed(head + tail)
    assert np.array_equal(s.last_logits(), ref.last_logits())
    got = s.generate([], max_new_tokens=6, temperature=0.9, seed=4)
    assert got == ref.generate([], max_new_tokens=6, temperature=0.9, seed=4)


def test_one_callers_error_is_its_own():
    """A prompt beyond the context fails for its caller only; the others run on."""
    many = model_for("tiny-a", sessions=3, ctx=256)
    alone = model_for("tiny-a", ctx=256)
    vocab = alone.config.vocab_size
    good = [_ids(5, 30, vocab), _ids(6, 7, vocab)]
    bad = _ids(7, 300, vocab)
    want = [alone.session().generate(p, max_new_tokens=10) for p in good]

    def too_long():
        with pytest.raises(ValueError, match="context of 256 tokens"):
            many.session().generate(bad, max_new_tokens=10)
        return "refused"

    got = _together(
        [lambda p=p: many.session().generate(p, max_new_tokens=10) for p in good] + [too_long]
    )
    assert got == want + ["refused"]


def test_a_stream_left_early_changes_nothing_for_the_others():
    alone, many = model_for("tiny-b"), model_for("tiny-b", sessions=4)
    vocab = alone.config.vocab_size
    a, b = _ids(8, 12, vocab), _ids(9, 50, vocab)
    kw = dict(max_new_tokens=24, temperature=0.9, seed=21)
    want_b = alone.session().generate(b, **kw)
    ref = alone.session()
    want_a = ref.generate(a, **{**kw, "max_new_tokens": 3})
    after_a = ref.generate([], max_new_tokens=5)

    def leave_early():
        s = many.session()
        st = s.stream(a, **kw)
        got = [next(st) for _ in range(3)]
        st.close()
        # the session continues from the three tokens it was handed
        return got, s.generate([], max_new_tokens=5)

    got = _together([leave_early, lambda: many.session().generate(b, **kw)])
    assert got == [(want_a, after_a), want_b]


def test_concurrent_chats_equal_each_alone():
    """The text API (prompt cache, prefill then stream) gets the batching without a change."""
    alone = model_for("tiny-a")
    many = model_for("tiny-a", sessions=3)
    asks = [
        [{"role": "user", "content": "hello there"}],
        [{"role": "system", "content": "be brief " * 40}, {"role": "user", "content": "why?"}],
        [{"role": "user", "content": "count: one two three"}],
    ]
    kw = dict(max_new_tokens=14, temperature=0.8, seed=9, cache=False)
    want = [alone.chat(m, **kw).content for m in asks]
    got = _together([lambda m=m: many.chat(m, **kw).content for m in asks])
    assert got == want


def test_dspark_sessions_stepped_together_equal_each_alone():
    """Sessions that keep a DSpark drafter state (rust/model/generate/draft.rs) in rounds of
    several (plain steps, their feeds observed) and alone (speculative): the tokens and
    logprobs of plain decoding, and the drafter state still in step afterwards."""
    plain = model_for("tiny-b")
    many = model_for("tiny-b", drafter=True, speculate="dspark", sessions=3)
    vocab = plain.config.vocab_size
    prompts = [_ids(40 + i, n, vocab) for i, n in enumerate([7, 600, 20])]
    kw = [
        dict(max_new_tokens=16, temperature=0.0),
        dict(max_new_tokens=10, temperature=0.9, seed=2),
        dict(max_new_tokens=14, temperature=0.8, seed=6),
    ]
    want = [_logprob_run(plain, p, k) for p, k in zip(prompts, kw)]
    got = _together([lambda p=p, k=k: _logprob_run(many, p, k) for p, k in zip(prompts, kw)])
    assert got == want
    # alone afterwards (a round of one speculates): still plain decoding's tokens
    s = many.session()
    s.feed(prompts[0])
    ref = plain.session()
    ref.feed(prompts[0])
    more = dict(max_new_tokens=12, temperature=0.7, seed=1)
    assert s.generate([], **more) == ref.generate([], **more)


def test_a_read_of_the_session_while_its_step_waits_does_not_fail_the_step():
    """The scheduler tries a session another call holds again next round (it does not fail
    the step): a thread reading the session's tokens in a loop beside its generation."""
    alone, many = model_for("tiny-a"), model_for("tiny-a", sessions=2)
    p = _ids(77, 30, alone.config.vocab_size)
    kw = dict(max_new_tokens=40, temperature=0.9, seed=8)
    want = alone.session().generate(p, **kw)
    s = many.session()
    done = threading.Event()
    reads = []

    def read():
        while not done.is_set():
            try:
                reads.append(len(s.tokens))
            except RuntimeError:  # busy while a round holds it: the reader's own problem
                pass

    t = threading.Thread(target=read)
    t.start()
    try:
        got = s.generate(p, **kw)
    finally:
        done.set()
        t.join(10)
    assert got == want and reads
