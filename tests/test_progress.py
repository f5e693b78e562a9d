"""Prefill progress comes from inside the engine: Session.feed(ids, progress=...) reports as
the prompt goes through the layers, and an exception from the callback stops the prefill
without changing the session."""

import numpy as np
import pytest

from conftest import model_for

IDS = [int(i) for i in np.random.default_rng(11).integers(2, 100, size=300)]


def test_progress_is_reported_after_every_layer_up_to_the_total():
    m = model_for("tiny-a")
    seen = []
    s = m.session()
    s.feed(IDS, progress=lambda done, total: seen.append((done, total)))
    layers = m.config.num_hidden_layers
    spans = -(-len(IDS) // m.plan()["prefill_span"])
    assert len(seen) == layers * spans
    assert all(t == len(IDS) for _, t in seen)
    dones = [d for d, _ in seen]
    assert dones == sorted(dones) and dones[-1] == len(IDS)
    # the logits are those of a feed without a callback
    r = m.session()
    r.feed(IDS)
    assert np.array_equal(s.last_logits(), r.last_logits())


class Stop(Exception):
    pass


def test_an_exception_from_the_callback_stops_the_prefill_and_keeps_the_session():
    m = model_for("tiny-a")
    s = m.session()
    s.feed(IDS[:10])
    before = s.last_logits().copy()

    calls = []

    def boom(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise Stop

    with pytest.raises(Stop):
        s.feed(IDS[10:], progress=boom)
    assert len(calls) == 2  # stopped at the step that raised, not later
    assert s.position == 10
    assert np.array_equal(s.last_logits(), before)
    s.feed(IDS[10:])
    r = m.session()
    r.feed(IDS)
    assert np.array_equal(s.last_logits(), r.last_logits())


def test_an_exception_at_the_last_layer_still_leaves_the_session_unchanged():
    m = model_for("tiny-b")
    s = m.session()
    layers = m.config.num_hidden_layers

    def at_last(done, total):
        if done == total:
            raise Stop

    with pytest.raises(Stop):
        s.feed(IDS[:50], progress=at_last)
    assert s.position == 0 and s.last_logits() is None
    s.feed(IDS[:50], progress=lambda d, t: None)
    assert s.position == 50 and layers > 1
