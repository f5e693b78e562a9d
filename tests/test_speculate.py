"""Speculative decoding from Python (docs/model.md §9): whichever drafter and whatever it
drafts, a generation's tokens, log-probabilities and final state are plain decoding's. The
core's own tests (rust/model/tests_journal.rs) force verifies of every size; here the
benchmark-only oracle drafter (right with a chosen probability) makes verifies happen on the
tiny fixtures through the public stream."""

from __future__ import annotations

import json

import numpy as np
import pytest

import v4flash
from conftest import FIXTURES, main_, model_for
from v4flash import _core
from v4flash.demo import demo_path

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]


def _plain(m, prompt, n, **kw):
    return m.session().generate(prompt, max_new_tokens=n, speculate="off", **kw)


def _oracle_run(m, prompt, n, truth, right, k=4, **kw):
    """A generation whose drafter is right with probability ``right``, verifying ``k`` drafts
    at every step (the cost model bypassed: the tiny fixtures' timings decide nothing)."""
    s = m.session()
    g = s._generation(prompt, max_new_tokens=n, _oracle=(truth, right, 7), _force_drafts=k, **kw)
    return s, g, g.collect()


def test_the_modes_are_the_cores():
    assert v4flash.SPECULATE == _core.SPECULATE == ("off", "lookup", "dspark", "auto")


@pytest.mark.parametrize("name", ["tiny-a", "tiny-b"])
@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.9, 5)])
def test_every_mode_gives_plain_decodings_tokens(name, temperature, seed):
    m = model_for(name)
    # a prompt that repeats itself, so that prompt lookup finds something to draft
    first = _plain(m, PROMPT, 24)
    prompt = PROMPT + first + PROMPT
    want = _plain(m, prompt, 40, temperature=temperature, seed=seed)
    for mode in ("lookup", "auto"):
        s = m.session()
        g = s._generation(
            prompt, max_new_tokens=40, temperature=temperature, seed=seed, speculate=mode
        )
        assert g.collect() == want, mode
        sp = g.speculation()
        assert sp["verifies"] + sp["plain_steps"] > 0
        assert s.tokens == prompt + want


@pytest.mark.parametrize("right", [1.0, 0.6, 0.0])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_verified_drafts_keep_tokens_state_and_logprobs(right, temperature):
    m = model_for("tiny-b")
    n = 60
    ref = m.session()
    want = list(
        ref.stream_logprobs(
            PROMPT,
            max_new_tokens=n,
            top_logprobs=3,
            temperature=temperature,
            seed=2,
            speculate="off",
        )
    )
    truth = [t for t, _, _ in want]
    s = m.session()
    g = s._generation(
        PROMPT,
        max_new_tokens=n,
        logprobs=3,
        temperature=temperature,
        seed=2,
        _oracle=(truth, right, 3),
        _force_drafts=5,
    )
    got = []
    for t in g:
        lp, top = g.logprobs()
        got.append((t, lp, top))
    assert [t for t, _, _ in got] == truth
    for (_, a, ta), (_, b, tb) in zip(got, want):
        assert a == b and ta == tb
    sp = g.speculation()
    assert sp["verifies"] > 0
    if right == 1.0:
        assert sp["accepted"] == sp["drafted"] > 0 and sp["plain_steps"] == 0
    if right == 0.0:
        assert sp["accepted"] == 0
    # the state is plain decoding's: the same tokens, the same logits after feeding on
    assert s.tokens == ref.tokens
    s.feed([3])
    ref.feed([3])
    assert np.array_equal(s.last_logits(), ref.last_logits())


def test_the_model_counts_speculation():
    m = v4flash.load(FIXTURES / "tiny-a")
    truth = _plain(m, PROMPT, 30)
    before = m.stats().get("speculation") or {"verifies": 0, "drafted": 0, "accepted": 0}
    _, g, got = _oracle_run(m, PROMPT, 30, truth, 1.0)
    assert got == truth
    after = m.stats()["speculation"]
    sp = g.speculation()
    assert after["verifies"] - before["verifies"] == sp["verifies"] > 0
    assert after["accepted"] - before["accepted"] == sp["accepted"]


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_max_new_tokens_is_kept_inside_a_verify(n):
    m = model_for("tiny-a")
    truth = _plain(m, PROMPT, 40)
    want = _plain(m, PROMPT, n)
    for k in (1, 2, 6):
        s, _, got = _oracle_run(m, PROMPT, n, truth, 1.0, k=k)
        assert got == want
    assert s.tokens == PROMPT + want


def test_a_stop_id_inside_the_drafts_ends_there():
    m = model_for("tiny-a")
    truth = _plain(m, PROMPT, 30, stop_ids=[])
    stop = truth[12]
    want = _plain(m, PROMPT, 30, stop_ids=[stop])
    assert want[-1] == stop and len(want) <= 13
    s = m.session()
    g = s._generation(
        PROMPT, max_new_tokens=30, stop_ids=[stop], _oracle=(truth, 1.0, 1), _force_drafts=6
    )
    assert g.collect() == want
    assert s.tokens == PROMPT + want


def test_the_context_end_is_kept_inside_a_verify():
    m = v4flash.load(FIXTURES / "tiny-a", ctx=40)
    prompt = list(range(3, 30))
    ref = m.session()
    want = ref.generate(prompt, max_new_tokens=100, speculate="off")
    assert len(prompt) + len(want) == 41  # the last token sampled cannot be fed
    truth = want
    s = m.session()
    g = s._generation(prompt, max_new_tokens=100, _oracle=(truth, 1.0, 1), _force_drafts=5)
    assert g.collect() == want
    assert g.speculation()["verifies"] > 0
    assert s.tokens == ref.tokens


def test_a_constrained_generation_steps_plainly():
    from v4flash.textapi.constraints import compile_grammar

    m = v4flash.load(demo_path())
    grammar = compile_grammar(m, "regex", "[0-9]{6}")
    prompt = m.tokenizer.encode("The numbers are 123456 and 123456 and 1")
    want = m.session().generate(prompt, max_new_tokens=8, constraint=grammar, speculate="off")
    s = m.session()
    g = s._generation(
        prompt, max_new_tokens=8, constraint=grammar, _oracle=(want, 1.0, 1), _force_drafts=4
    )
    assert g.collect() == want
    assert g.speculation()["verifies"] == 0


def test_snapshots_and_saved_sessions_after_speculation(tmp_path):
    m = model_for("tiny-b")
    truth = _plain(m, PROMPT, 30)
    s, _, got = _oracle_run(m, PROMPT, 30, truth, 0.7)
    assert got == truth
    snap = s.snapshot()
    more = s.generate([4, 4], max_new_tokens=5, speculate="off")
    s.rollback(snap)
    assert s.generate([4, 4], max_new_tokens=5, speculate="off") == more
    s.rollback(snap)
    s.save(tmp_path / "s.v4s")
    back = m.load_session(tmp_path / "s.v4s")
    assert back.tokens == s.tokens
    assert back.generate([4, 4], max_new_tokens=5, speculate="off") == more


def test_unknown_modes_are_refused_by_name():
    m = model_for("tiny-a")
    with pytest.raises(ValueError, match="speculate"):
        m.session().generate(PROMPT, max_new_tokens=2, speculate="fast")
    with pytest.raises(ValueError, match="speculate"):
        v4flash.load(FIXTURES / "tiny-a", speculate="always")


def test_dspark_without_its_drafter_names_what_to_use():
    m = model_for("tiny-a")
    with pytest.raises(ValueError, match="lookup"):
        m.session().generate(PROMPT, max_new_tokens=2, speculate="dspark")


def test_the_command_line_flag(capsys):
    r = main_(
        capsys,
        "run",
        "-m",
        FIXTURES / "tiny-a",
        "--raw",
        "--speculate",
        "lookup",
        "-n",
        "5",
        "--seed",
        "3",
        "hello",
    )
    assert r.returncode == 0, r.stderr
    off = main_(
        capsys,
        "run",
        "-m",
        FIXTURES / "tiny-a",
        "--raw",
        "--speculate",
        "off",
        "-n",
        "5",
        "--seed",
        "3",
        "hello",
    )
    assert r.stdout == off.stdout
    with pytest.raises(SystemExit) as e:
        main_(capsys, "run", "-m", FIXTURES / "tiny-a", "--speculate", "maybe", "hi")
    assert e.value.code == 2 and "--speculate" in capsys.readouterr().err


def test_bench_reports_the_speculative_decode(capsys):
    r = main_(
        capsys,
        "bench",
        "-m",
        FIXTURES / "tiny-a",
        "-p",
        "16",
        "-n",
        "24",
        "--json",
        "--speculate",
        "oracle:1.0",
    )
    assert r.returncode == 0, r.stderr
    sp = json.loads(r.stdout)["speculation"]
    assert sp["mode"] == "oracle:1.0" and sp["same_tokens"] is True
    # whether verifies pay on a model this small is the cost model's call; what it verified
    # was right
    assert sp["verifies"] + sp["plain_steps"] > 0 and sp["accepted"] == sp["drafted"]
    assert sp["ratio"] > 0


def test_a_requests_speculation_is_the_counters_difference():
    from v4flash.textapi.run import _spec_delta

    before = {"verifies": 3, "drafted": 9, "accepted": 4, "saved_s": 0.5}
    after = {"verifies": 5, "drafted": 15, "accepted": 9, "saved_s": 0.75, "plain_steps": 40}
    assert _spec_delta(before, after) == {
        "verifies": 2,
        "drafted": 6,
        "accepted": 5,
        "saved_s": 0.25,
    }
    # nothing verified: nothing to report (the log line and the timings stay as they were)
    assert _spec_delta(before, dict(before, plain_steps=7)) is None
    assert _spec_delta({}, {}) is None


@pytest.mark.parametrize("taken", [2, 3, 5])
def test_stopping_a_stream_inside_a_verify_leaves_plain_decodings_session(taken):
    """A caller that stops early (a stop string, a budget) and goes on with the session finds
    it as plain decoding left it, although the verify sampled further."""
    m = model_for("tiny-b")
    truth = _plain(m, PROMPT, 30)
    ref = m.session()
    for _, _ in zip(range(taken), ref.stream(PROMPT, max_new_tokens=30, speculate="off")):
        pass
    s = m.session()
    g = s._generation(PROMPT, max_new_tokens=30, _oracle=(truth, 1.0, 1), _force_drafts=6)
    got = [next(g) for _ in range(taken)]
    assert got == truth[:taken] and g.speculation()["verifies"] > 0
    assert s.tokens == ref.tokens
    more = ref.generate([4, 4], max_new_tokens=6, speculate="off")
    assert s.generate([4, 4], max_new_tokens=6, speculate="off") == more
    assert s.tokens == ref.tokens


# --- DSpark (the 0731 drafter; tiny-b carries one) -------------------------------------------


def _dspark_model():
    return model_for("tiny-b", drafter=True)


def _dspark_run(s, prompt, n, k, **kw):
    """A dspark generation verifying ``k`` drafts at every step (the cost model bypassed):
    its (token, logprob, top) per step, and the generation."""
    g = s._generation(
        prompt, max_new_tokens=n, logprobs=3, speculate="dspark", _force_drafts=k, **kw
    )
    out = []
    for t in g:
        lp, top = g.logprobs()
        out.append((t, lp, top))
    return out, g


def _plain_lp(m, prompt, n, **kw):
    s = m.session()
    return list(
        s.stream_logprobs(prompt, max_new_tokens=n, top_logprobs=3, speculate="off", **kw)
    ), s


@pytest.mark.parametrize("temperature,seed", [(0.0, 0), (0.9, 5)])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_dspark_gives_plain_decodings_tokens_logprobs_and_state(temperature, seed, k):
    m = _dspark_model()
    plain_m = model_for("tiny-b")  # no drafter: nothing captured or observed
    want, ref = _plain_lp(plain_m, PROMPT, 40, temperature=temperature, seed=seed)
    s = m.session()
    got, g = _dspark_run(s, PROMPT, 40, k, temperature=temperature, seed=seed)
    assert got == want
    sp = g.speculation()
    assert sp["verifies"] > 0 and sp["drafted"] > 0
    assert s.tokens == ref.tokens
    s.feed([3])
    ref.feed([3])
    assert np.array_equal(s.last_logits(), ref.last_logits())


def test_dspark_drafts_are_rejected_and_accepted_on_tiny_b():
    """Mechanics only (random weights): both happen, so the cut back after a rejection is
    exercised by the tests above."""
    m = _dspark_model()
    s = m.session()
    _, g = _dspark_run(s, PROMPT, 60, 5)
    sp = g.speculation()
    assert sp["drafted"] > sp["accepted"], sp


@pytest.mark.parametrize("taken", [1, 2, 4])
def test_stopping_a_dspark_stream_inside_a_verify_then_going_on(taken):
    m = _dspark_model()
    truth = _plain(m, PROMPT, 30)
    ref = m.session()
    for _ in zip(range(taken), ref.stream(PROMPT, max_new_tokens=30, speculate="off")):
        pass
    s = m.session()
    g = s._generation(PROMPT, max_new_tokens=30, speculate="dspark", _force_drafts=5)
    assert [next(g) for _ in range(taken)] == truth[:taken]
    assert s.tokens == ref.tokens
    more = ref.generate([4, 4], max_new_tokens=12, speculate="off")
    got, g2 = _dspark_run(s, [4, 4], 12, 4)
    assert [t for t, _, _ in got] == more
    assert s.tokens == ref.tokens


def test_snapshots_and_rollbacks_after_dspark_generation(tmp_path):
    m = _dspark_model()
    s = m.session()
    s.feed(PROMPT)
    early = s.snapshot()
    first, _ = _dspark_run(s, [], 20, 4, temperature=0.8, seed=3)
    late = s.snapshot()
    after, _ = _dspark_run(s, [5, 6], 15, 5, temperature=0.8, seed=4)
    s.rollback(late)
    again, g = _dspark_run(s, [5, 6], 15, 5, temperature=0.8, seed=4)
    assert again == after and g.speculation()["verifies"] > 0
    s.rollback(early)
    again, g = _dspark_run(s, [], 20, 2, temperature=0.8, seed=3)
    assert again == first and g.speculation()["verifies"] > 0
    # a saved session goes on as plain decoding does (without DSpark: the file does not hold
    # the drafter's state)
    s.save(tmp_path / "s.v4s")
    back = m.load_session(tmp_path / "s.v4s")
    got, g = _dspark_run(back, [2], 8, 5)
    want, _ = _dspark_run(s, [2], 8, 5)
    assert got == want and g.speculation()["verifies"] == 0


def test_auto_with_the_drafter_gives_plain_decodings_tokens():
    m = _dspark_model()
    want = _plain(m, PROMPT, 30, temperature=0.7, seed=1)
    for forced in (None, 3):
        s = m.session()
        g = s._generation(
            PROMPT,
            max_new_tokens=30,
            temperature=0.7,
            seed=1,
            speculate="auto",
            _force_drafts=forced,
        )
        assert g.collect() == want
        if forced:
            assert g.speculation()["verifies"] > 0  # DSpark drafted (lookup finds nothing here)


def test_dspark_without_the_loaded_drafter_says_how_to_load_it():
    with pytest.raises(ValueError, match="drafter=True"):
        model_for("tiny-b").session().generate(PROMPT, max_new_tokens=2, speculate="dspark")


def test_the_command_line_loads_the_drafter_for_dspark(capsys):
    def run(*flags):
        return main_(
            capsys,
            "run",
            "-m",
            FIXTURES / "tiny-b",
            "--raw",
            *flags,
            "-n",
            "8",
            "--seed",
            "3",
            "hi",
        )

    off = run("--speculate", "off")
    r = run("--drafter", "--speculate", "dspark")
    assert r.returncode == 0, r.stderr
    assert r.stdout == off.stdout
    r = run("--speculate", "dspark")
    assert r.returncode != 0 and "--drafter" in r.stderr
