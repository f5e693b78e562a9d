"""The forward pass against the transformers reference (fixtures/), and the engine's own
invariants: chunking, decoding, threads, cache state and snapshots never change results."""

import threading
import time

import numpy as np
import pytest

import v4flash
from conftest import model_for

TOL = 1e-3  # × the largest |reference logit| (the bound); observed ~3e-6


def _rel_err(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_teacher_forced_logits_match_reference(ref):
    m = model_for(ref.name)
    for case in ref.cases:
        got = m.logits(case["ids"])
        want = ref.logits(case)
        assert got.shape == want.shape
        err = _rel_err(got, want)
        assert err < TOL, f"{ref.name}/{case['name']}: rel err {err:.2e}"
        np.testing.assert_array_equal(got.argmax(-1), np.array(case["top1"]))


def test_greedy_continuations_match_reference(ref):
    m = model_for(ref.name)
    for case in ref.cases:
        new = m.generate(case["ids"], max_new_tokens=len(case["greedy_new"]), stop_ids=[])
        assert new == case["greedy_new"], f"{ref.name}/{case['name']}"


def test_token_by_token_decode_matches_reference(ref):
    m = model_for(ref.name)
    case = max(ref.cases, key=lambda c: len(c["ids"]))
    want = ref.logits(case)
    s = m.session()
    rows = []
    for t in case["ids"]:
        s.feed([t])
        rows.append(s.last_logits())
    got = np.stack(rows)
    assert _rel_err(got, want) < TOL
    # decode and one-shot prefill run the same per-token arithmetic: bit-identical
    np.testing.assert_array_equal(got, m.logits(case["ids"]))


def test_chunked_prefill_is_bit_identical_to_one_shot(ref):
    m = model_for(ref.name)
    for case in ref.cases:
        ids = case["ids"]
        chunks = case["agreement"]["chunks"]
        full = m.logits(ids)
        s = m.session()
        at = 0
        for size in chunks:
            s.feed(ids[at : at + size])
            at += size
            np.testing.assert_array_equal(s.last_logits(), full[at - 1])
        assert at == len(ids) and s.position == len(ids)


def test_greedy_steps_logits_match_reference(ref):
    m = model_for(ref.name)
    for case in ref.cases:
        seq = case["ids"] + case["greedy_new"][:-1]
        got = m.logits(seq)[len(case["ids"]) - 1 :]
        want = ref.greedy_logits(case)
        assert _rel_err(got, want) < TOL


def test_thread_count_does_not_change_logits(ref):
    case = max(ref.cases, key=lambda c: len(c["ids"]))
    one = model_for(ref.name, threads=1).logits(case["ids"])
    two = model_for(ref.name, threads=2).logits(case["ids"])
    three = model_for(ref.name, threads=3).logits(case["ids"])
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, three)


def test_tiny_expert_cache_evicts_and_matches_unlimited(ref):
    case = max(ref.cases, key=lambda c: len(c["ids"]))
    big = model_for(ref.name)
    small = v4flash.load(ref.path, expert_cache_mb=1e-6)  # one expert at a time
    a = small.logits(case["ids"])
    np.testing.assert_array_equal(a, big.logits(case["ids"]))
    st = small.stats()
    assert st["expert_misses"] > st["expert_requests"] // 2, st
    b = small.generate(case["ids"], max_new_tokens=len(case["greedy_new"]), stop_ids=[])
    assert b == case["greedy_new"]


def test_snapshot_rollback_replays_identically():
    m = model_for("tiny-a")
    s = m.session()
    s.feed([0, 7, 9, 11, 3])
    snap = s.snapshot()
    assert snap.position == 5
    first = s.generate([5, 6], max_new_tokens=12, stop_ids=[])
    after = s.position
    assert after == 5 + 2 + 12
    s.rollback(snap)
    assert s.position == 5
    again = s.generate([5, 6], max_new_tokens=12, stop_ids=[])
    assert again == first
    fresh = m.generate([0, 7, 9, 11, 3, 5, 6], max_new_tokens=12, stop_ids=[])
    assert fresh == first


def test_rollback_rejects_foreign_snapshot():
    m = model_for("tiny-a")
    a, b = m.session(), m.session()
    a.feed([1, 2, 3])
    snap = a.snapshot()
    b.feed([4, 5, 6, 7])
    with pytest.raises(ValueError, match="does not belong"):
        b.rollback(snap)


def test_sampling_is_seeded_and_stream_equals_generate():
    m = model_for("tiny-a")
    kw = dict(max_new_tokens=10, temperature=1.0, top_p=0.9, top_k=50, stop_ids=[])
    a = m.generate([0, 3, 4], seed=11, **kw)
    assert a == m.generate([0, 3, 4], seed=11, **kw)
    assert a == list(m.stream([0, 3, 4], seed=11, **kw))
    assert a != m.generate([0, 3, 4], seed=12, **kw)


def _busy(m, ids, seconds):
    """Calls into the engine repeatedly for at least ``seconds`` (so the test does not depend
    on how fast one call is); returns each call's (start, end)."""
    t0 = time.perf_counter()
    spans = []
    while not spans or time.perf_counter() - t0 < seconds:
        a = time.perf_counter()
        m.logits(ids)
        spans.append((a, time.perf_counter()))
    return spans


def test_gil_is_released_during_compute():
    m = model_for("tiny-b")
    ids = list(range(3, 70)) * 3
    counter = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            counter[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = counter[0]
        _busy(m, ids, 0.3)
        during = counter[0] - before
    finally:
        stop.set()
        t.join()
    # a held GIL would freeze the spinning thread for the whole call
    assert during > 1000, during


def test_two_threads_overlap_in_time():
    m = model_for("tiny-b")
    ids = list(range(3, 70)) * 2
    spans = []
    start = threading.Barrier(2)

    def run():
        start.wait()
        spans.append(_busy(m, ids, 0.5))

    ts = [threading.Thread(target=run) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    # with the GIL held for a whole call, no call of one thread could overlap a call of the other
    overlapping = [(a, b) for a in spans[0] for b in spans[1] if max(a[0], b[0]) < min(a[1], b[1])]
    assert overlapping, "no two calls ran at the same time"


def test_bad_runtime_arguments_are_value_errors():
    m = model_for("tiny-a")
    with pytest.raises(ValueError, match="empty"):
        m.logits([])
    with pytest.raises(ValueError, match="out of the vocabulary"):
        m.logits([0, 512])
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate([0], max_new_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        m.generate([0], max_new_tokens=-3)
    with pytest.raises(ValueError, match="temperature"):
        m.generate([0], temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        m.generate([0], top_p=0)
    with pytest.raises(ValueError, match="threads"):
        v4flash.load(m.path, threads=0)


def test_prompt_longer_than_context_is_rejected_and_session_survives():
    m = v4flash.load(model_for("tiny-a").path, ctx=16)
    s = m.session()
    s.feed(list(range(10)))
    with pytest.raises(ValueError, match="context of 16 tokens"):
        s.feed(list(range(10)))
    assert s.position == 10
    s.feed(list(range(6)))
    assert s.position == 16
