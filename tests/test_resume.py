"""python/v4flash/resume.py: the rule the prompt cache and the chat share for resuming a prompt
from a session's history or a snapshot (a stand-in session: only the bookkeeping is tested
here; test_textapi.py and test_cli.py check that resumed output equals a cold run)."""

from __future__ import annotations

import random

from v4flash.resume import History, common_prefix, turn_boundary

A = 9  # the <｜Assistant｜> id of these tests


class FakeSession:
    def __init__(self):
        self.tokens = []
        self.calls = []

    def feed(self, ids):
        self.tokens += list(ids)

    def snapshot(self):
        return len(self.tokens)

    def rollback(self, snap):
        self.calls.append(("rollback", snap))
        del self.tokens[snap:]

    def reset(self):
        self.calls.append(("reset",))
        self.tokens = []


def history(tokens, snaps=()):
    h = History(FakeSession())
    h.session.feed(tokens)
    for pos in snaps:
        h.add_snapshot(pos, pos)
    h.sync()
    return h


def test_common_prefix():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(12))]
        b = a[: rng.randrange(len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(5))]
        want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == want


def test_append_rollback_reset_new():
    h = history([1, 2, A, 3, 4], snaps=[3])
    assert h.match([1, 2, A, 3, 4, 5]) == (5, None)
    assert h.resume([1, 2, A, 3, 4, 5]) == (5, "append") and h.session.calls == []
    # the whole history is no strict prefix: the snapshot inside the common part
    assert h.resume([1, 2, A, 7]) == (3, "rollback")
    assert h.session.calls == [("rollback", 3)] and h.tokens == [1, 2, A]
    # strict: a prompt equal to the history rolls back rather than feeding nothing
    h = history([1, 2, A, 3], snaps=[3])
    assert h.resume([1, 2, A, 3]) == (3, "rollback")
    h = history([1, 2, A], snaps=[3])
    assert h.resume([5, 6]) == (0, "reset") and h.snaps == [] and h.session.tokens == []
    assert h.resume([5, 6]) == (0, "new")


def test_the_longest_snapshot_wins_and_later_ones_go():
    h = history([1, A, 2, A, 3, A, 4], snaps=[2, 4, 6])
    assert h.match([1, A, 2, A, 3, 8]) == (4, 4)
    h.take(4, 4)
    assert [p for p, _ in h.snaps] == [2, 4]


def test_snapshots_are_bounded_and_one_per_position():
    h = History(FakeSession(), max_snapshots=3)
    for pos in (1, 2, 2, 3, 4):
        h.add_snapshot(pos, f"s{pos}")
    assert h.snaps == [(2, "s2"), (3, "s3"), (4, "s4")]
    h.session.feed([0, 0, 0])
    h.sync()  # a snapshot past the history goes
    assert [p for p, _ in h.snaps] == [2, 3]


def test_turn_boundary():
    assert turn_boundary([1, 2, A, 3], 0, A) == 3  # after the last <｜Assistant｜>
    assert turn_boundary([1, A, 2, A, 3], 0, A) == 4
    assert turn_boundary([1, 2, 3, 4], 0, A) == 3  # none: all but the last token
    assert turn_boundary([1, A, 2, 3], 2, A) == 3  # only from `start` on
    assert turn_boundary([1, 2, A, 3], 3, A) == 3  # never before `start`
