"""The session's generation logic as the Python API sees it (the rules themselves live in
rust/model/generate.rs and have cargo tests there): generation after a rollback, streaming
as the core's own steps, logits as numpy arrays, and the typed stub of ``v4flash._core``."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

import v4flash
from conftest import FIXTURES, model_for

SAMPLING = dict(temperature=1.0, top_p=0.9, top_k=50, seed=7, stop_ids=[])


def test_generate_right_after_rollback_continues_as_the_original():
    m = model_for("tiny-a")
    s = m.session()
    s.feed([0, 7, 9, 11, 3])
    at = s.last_logits()
    snap = s.snapshot()
    first = s.generate([], max_new_tokens=8, **SAMPLING)
    s.rollback(snap)
    # the snapshot keeps the logits after its last token: nothing to re-feed
    np.testing.assert_array_equal(s.last_logits(), at)
    assert s.generate([], max_new_tokens=8, **SAMPLING) == first
    s.rollback(snap)
    assert list(s.stream([], max_new_tokens=8, **SAMPLING)) == first
    # a snapshot taken while a sampled token was pending (the snapshot feeds it)
    s.rollback(snap)
    head = s.generate([], max_new_tokens=3, **SAMPLING)
    snap = s.snapshot()
    tail = s.generate([], max_new_tokens=4, **SAMPLING)
    s.rollback(snap)
    assert s.tokens == [0, 7, 9, 11, 3] + head
    assert s.generate([], max_new_tokens=4, **SAMPLING) == tail


def test_rollback_to_the_start_still_has_nothing_to_sample_from():
    m = model_for("tiny-a")
    s = m.session()
    empty = s.snapshot()
    s.feed([0, 5, 6])
    s.rollback(empty)
    assert s.last_logits() is None
    try:
        s.generate([], max_new_tokens=2)
    except ValueError as e:
        assert "prompt is empty" in str(e)
    else:
        raise AssertionError("generate from an empty session must fail")


def test_stream_is_the_same_steps_as_generate_and_stops_like_it():
    m = model_for("tiny-a")
    want = m.generate([0, 3, 4], max_new_tokens=12, **SAMPLING)
    it = m.session().stream([0, 3, 4], max_new_tokens=12, **SAMPLING)
    assert list(it) == want
    # a stop id ends the stream after it, as in generate
    stop = want[5]
    cut = want[: want.index(stop) + 1]
    kw = dict(SAMPLING, stop_ids=[stop])
    assert m.generate([0, 3, 4], max_new_tokens=12, **kw) == cut
    assert list(m.stream([0, 3, 4], max_new_tokens=12, **kw)) == cut
    # a full context ends it too, returning the last sampled token (no error)
    small = v4flash.load(FIXTURES / "tiny-a", ctx=8)
    a, b = small.session(), small.session()
    a.feed(list(range(6)))
    b.feed(list(range(6)))
    got = a.generate([], max_new_tokens=10, stop_ids=[])
    assert len(got) == 3
    assert list(b.stream([], max_new_tokens=10, stop_ids=[])) == got
    assert a.tokens == b.tokens == list(range(6)) + got


def test_logits_are_float32_arrays():
    m = model_for("tiny-a")
    v = m.config.vocab_size
    x = m.logits([0, 5, 6])
    assert isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == (3, v)
    assert x.flags.c_contiguous and x.flags.writeable
    s = m.session()
    assert s.last_logits() is None
    s.feed([0, 5, 6])
    y = s.last_logits()
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (v,)
    np.testing.assert_array_equal(y, x[-1])
    y[:] = 0  # a copy: the session's logits are untouched
    np.testing.assert_array_equal(s.last_logits(), x[-1])


def test_the_core_stub_ships_with_the_package():
    pkg = Path(v4flash.__file__).parent
    assert (pkg / "_core.pyi").is_file()
    assert (pkg / "py.typed").is_file()


def test_a_finished_core_call_is_noticed_at_once():
    """The waiting thread wakes when the worker finishes; it polls for Ctrl-C (every 20 ms)
    only while the work runs. Before, every call slept 20 ms first: 25 calls took >= 0.5 s."""
    s = model_for("tiny-a").session()
    t0 = time.monotonic()
    for _ in range(25):
        s.snapshot()  # runs on a worker thread like every core call, and does ~nothing
    assert time.monotonic() - t0 < 0.4


_STREAM_SIGINT = textwrap.dedent(
    """
    import os, signal, sys, threading
    import v4flash

    m = v4flash.load(sys.argv[1])
    s = m.session()
    s.feed([0, 11, 12])
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    seen = []
    try:
        for t in s.stream([], max_new_tokens=100000, stop_ids=[]):
            seen.append(t)
        print("NOT INTERRUPTED")
    except KeyboardInterrupt:
        pass
    out = s.tokens[3:]
    assert 0 < len(out) < 100000 and out[: len(seen)] == seen, (len(out), len(seen))
    assert out == m.generate([0, 11, 12], max_new_tokens=len(out), stop_ids=[])
    assert list(s.stream([], max_new_tokens=3, stop_ids=[])) == m.generate(
        [0, 11, 12] + out, max_new_tokens=3, stop_ids=[]
    )
    print("OK")
    """
)


def test_ctrl_c_stops_a_stream_and_the_session_goes_on(tmp_path):
    script = tmp_path / "stream_sigint.py"
    script.write_text(_STREAM_SIGINT)
    r = subprocess.run(
        [sys.executable, str(script), str(FIXTURES / "tiny-b")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout and "NOT INTERRUPTED" not in r.stdout, r.stdout
