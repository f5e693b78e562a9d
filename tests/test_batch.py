"""Sequences fed together in one forward pass through the binding (``_core.step_batch``,
rust/python/batch.rs): each sequence's logits are the bits it gets alone, in every numerics
mode, whatever the batch; a refused batch changes no sequence. The core's own tests are
rust/model/tests_batch.rs."""

import numpy as np
import pytest

import v4flash
from conftest import FIXTURE_NAMES, FIXTURES, model_for
from v4flash import _core


def _ids(seed: int, n: int, vocab: int) -> list:
    return [int(i) for i in np.random.default_rng(seed).integers(2, vocab, size=n)]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
@pytest.mark.parametrize("numerics", _core.NUMERICS)
def test_a_batch_gives_each_sequence_its_own_logits_bit_for_bit(name, numerics):
    m = model_for(name, numerics=numerics)
    core, vocab = m._core, m.config.vocab_size
    # prompts of 9, 3, 16 and 1 tokens, then a mixed batch: two decode steps, a verify of
    # four drafts, a prefill chunk of 12 (23 tokens, past the kernels' fused paths), then
    # eight decode steps in a row, all four together (they cross the window and the ratios)
    prompts = [_ids(s, n, vocab) for s, n in enumerate([9, 3, 16, 1])]
    feeds = [_ids(10 + s, n, vocab) for s, n in enumerate([1, 4, 1, 12])]
    seqs = [_core.BatchSession(core) for _ in prompts]
    out = _core.step_batch([(s, p, "none") for s, p in zip(seqs, prompts)])
    assert out == [None] * 4
    wants = ["last", "all", "last", "all"]
    order = [2, 0, 3, 1]
    out = _core.step_batch([(seqs[i], feeds[i], wants[i]) for i in order])
    got = {i: o for i, o in zip(order, out)}
    steps = []
    for _ in range(8):
        step = [[int(np.argmax(s.last_logits()))] for s in seqs]
        steps.append(step)
        last = _core.step_batch([(s, t, "last") for s, t in zip(seqs, step)])
        for s, lg in zip(seqs, last):
            np.testing.assert_array_equal(lg, s.last_logits())
    for i in range(4):
        full = prompts[i] + feeds[i] + [t for step in steps for t in step[i]]
        assert seqs[i].tokens == full and seqs[i].position == len(full)
        # alone: teacher-forced logits of the whole sequence from a fresh state
        alone = core.logits(full)
        p, f = len(prompts[i]), len(feeds[i])
        if wants[i] == "all":
            assert got[i].shape == (f, vocab) and got[i].dtype == np.float32
            assert np.array_equal(got[i], alone[p : p + f]), (name, numerics, i)
        else:
            assert got[i].shape == (vocab,)
            assert np.array_equal(got[i], alone[p + f - 1]), (name, numerics, i)
        assert np.array_equal(seqs[i].last_logits(), alone[-1]), (name, numerics, i)


def test_a_refused_batch_changes_no_sequence():
    m = model_for("tiny-a")
    core, vocab = m._core, m.config.vocab_size
    a, b = _core.BatchSession(core), _core.BatchSession(core)
    _core.step_batch([(a, [3, 4, 5], "last"), (b, [6], "last")])
    before = (a.tokens, b.tokens, a.last_logits(), b.last_logits())

    def unchanged():
        assert (a.tokens, b.tokens) == before[:2]
        np.testing.assert_array_equal(a.last_logits(), before[2])
        np.testing.assert_array_equal(b.last_logits(), before[3])

    with pytest.raises(ValueError, match=rf"item 1: token id {vocab} is out of the vocabulary"):
        _core.step_batch([(a, [7], "last"), (b, [1, vocab], "last")])
    unchanged()
    with pytest.raises(ValueError, match="the same session is item 0 and item 1"):
        _core.step_batch([(a, [7], "last"), (a, [8], "last")])
    unchanged()
    with pytest.raises(ValueError, match='want must be "none", "last" or "all"'):
        _core.step_batch([(a, [7], "first")])
    unchanged()
    small = model_for("tiny-a", ctx=4)
    c = _core.BatchSession(small._core)
    with pytest.raises(ValueError, match="one model"):
        _core.step_batch([(a, [7], "last"), (c, [7], "last")])
    unchanged()
    with pytest.raises(ValueError, match="sequence 1 of the batch: the sequence would reach 5"):
        _core.step_batch([(c, [7], "last"), (_core.BatchSession(small._core), [1] * 5, "last")])
    assert c.position == 0
    # nothing to feed: nothing changes, "last" gives None and "all" no rows
    out = _core.step_batch([(a, [], "last"), (b, [], "all")])
    assert out[0] is None and out[1].shape == (0, vocab)
    unchanged()
    assert _core.step_batch([]) == []
    a.reset()
    assert (a.position, a.tokens, a.last_logits()) == (0, [], None)


def test_the_plan_holds_the_sessions_asked_for_and_says_how_many_fit():
    tiny = FIXTURES / "tiny-a"
    one = v4flash.plan(tiny, ram_gb=3, ctx=1 << 20)
    assert (one["sessions"], one["max_sessions"]) == (1, one["max_sessions"])
    n = one["max_sessions"]
    assert n > 2
    p = v4flash.plan(tiny, ram_gb=3, ctx=1 << 20, sessions=n)
    assert (p["sessions"], p["max_sessions"]) == (n, n)
    assert p["state_bytes"] == n * one["state_bytes"]
    assert p["slots"] <= one["slots"] and p["total_bytes"] <= 3e9
    with pytest.raises(MemoryError, match=f"{n + 1} sessions x"):
        v4flash.plan(tiny, ram_gb=3, ctx=1 << 20, sessions=n + 1)
    with pytest.raises(ValueError, match="sessions must be >= 1"):
        v4flash.plan(tiny, ram_gb=3, sessions=0)
    m = v4flash.load(tiny, ram_gb=3, ctx=1 << 20, sessions=2)
    assert m.plan() == v4flash.plan(tiny, ram_gb=3, ctx=1 << 20, sessions=2)
