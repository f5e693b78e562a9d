"""Resuming a prompt from the state a session already holds: the one rule the prompt cache
(``textapi``) and the chat's conversation (``chat``) share.

A :class:`History` is a session, the tokens it holds and snapshots at positions inside them
(taken at turn boundaries: right after a prompt's last ``<｜Assistant｜>``, see
:func:`turn_boundary`). A new prompt resumes from the longest of those states that is a
*strict* prefix of it (at least one prompt token is always fed, so there are logits to sample
from):

* **append**: the whole history is such a prefix; only the rest of the prompt is prefilled;
* **rollback**: a snapshot is; the session rolls back to it (later snapshots go);
* **reset** / **new**: nothing is; the session starts over (it held something / nothing).

The output is the same as a cold run: the engine gives bit-identical logits however a sequence
is prefilled, and sampling step ``i`` always uses ``seed + i``.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

SNAPSHOTS = 4  # snapshots a history keeps (the most recent)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def turn_boundary(prompt: Sequence[int], start: int, assistant_id: int) -> int:
    """Where to stop the prefill of ``prompt`` (held up to ``start``) and start generating:
    right after its last ``<｜Assistant｜>`` from ``start`` on (a turn boundary, where a
    snapshot serves a later conversation that shares this history), else before its last
    token; never before ``start``."""
    cut = len(prompt) - 1
    j = cut - 1
    while j >= start and prompt[j] != assistant_id:
        j -= 1
    if j >= start:
        cut = j + 1
    return max(cut, start)


class History:
    """A session with its token history and snapshots ``(position, snapshot)`` inside it."""

    def __init__(self, session: Any, max_snapshots: int = SNAPSHOTS):
        self.session = session
        self.tokens: List[int] = []  # the session's history as last read (:meth:`sync`)
        self.snaps: List[Tuple[int, Any]] = []
        self.max_snapshots = max_snapshots

    def sync(self) -> None:
        """Reads the session's history (after a prefill or a generation); snapshots beyond it
        go. ``RuntimeError`` while the session is still busy."""
        self.tokens = [int(t) for t in self.session.tokens]
        self.snaps = [s for s in self.snaps if s[0] <= len(self.tokens)]

    def add_snapshot(self, pos: int, snap: Any) -> None:
        """Keeps ``snap`` (taken at ``pos``), replacing one at the same position."""
        self.snaps = [s for s in self.snaps if s[0] != pos] + [(pos, snap)]
        del self.snaps[: -self.max_snapshots]

    def reset(self) -> None:
        """Empties the session."""
        self.session.reset()
        self.tokens, self.snaps = [], []

    def match(self, prompt: Sequence[int]) -> Tuple[int, Optional[Any]]:
        """The longest state held that is a strict prefix of ``prompt``: ``(length, None)``
        for the whole history, ``(position, snapshot)`` for a snapshot, ``(0, None)`` for
        nothing."""
        common = common_prefix(self.tokens, prompt)
        if common == len(self.tokens) and common < len(prompt):
            return common, None
        best: Tuple[int, Optional[Any]] = (0, None)
        for pos, snap in self.snaps:
            if pos <= common and pos < len(prompt) and pos > best[0]:
                best = (pos, snap)
        return best

    def take(self, length: int, snap: Optional[Any]) -> str:
        """Brings the session to a state :meth:`match` found; returns how: ``"append"``,
        ``"rollback"``, ``"reset"`` or ``"new"``."""
        if length == 0:
            if not self.tokens:
                self.snaps = []
                return "new"
            self.reset()
            return "reset"
        if snap is None:
            return "append"
        self.session.rollback(snap)
        self.tokens = self.tokens[:length]
        self.snaps = [s for s in self.snaps if s[0] <= length]
        return "rollback"

    def resume(self, prompt: Sequence[int]) -> Tuple[int, str]:
        """Brings the session to the longest state that is a strict prefix of ``prompt``:
        ``(tokens of the prompt held, how)``."""
        length, snap = self.match(prompt)
        return length, self.take(length, snap)
