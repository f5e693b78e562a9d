"""The prompt cache: a few idle sessions (LRU) with snapshots at turn boundaries, so that a
conversation's next request, or another one sharing its start, prefills only what is new.

Which state a prompt resumes from is ``resume.History``'s rule (the chat uses the same): the
longest cached history or snapshot that is a strict prefix of the prompt. The output is the
same as a cold run.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Dict, Optional, Sequence, Tuple

from ..resume import History

DEFAULT_SESSIONS = 4  # idle sessions a prompt cache keeps


class Lease:
    """A session checked out of a :class:`PromptCache` for one request."""

    def __init__(self, entry: History, cached: int, how: str):
        self.entry = entry
        self.cached = cached  # tokens of the prompt already in the session
        self.how = how  # "new" | "append" | "rollback"

    @property
    def session(self) -> Any:
        return self.entry.session


class PromptCache:
    """Idle sessions with snapshots at turn boundaries, least recently used evicted first.

    :meth:`checkout` gives a session that already holds the longest cached strict prefix of a
    prompt (strict: at least one prompt token is always fed, so there are logits to sample
    from); :meth:`checkin` returns it with its new history. A checked-out session belongs to
    one caller, so any number of callers can use one cache. Bounds: ``max_sessions`` idle
    sessions and ``max_tokens`` tokens of history across them (default: the model's context,
    which is the session state the memory plan reserves); ``max_sessions=0`` disables caching.
    """

    def __init__(self, model: Any, max_sessions: int = DEFAULT_SESSIONS, max_tokens: int = 0):
        self.model = model
        self._lock = threading.Lock()
        self._idle: OrderedDict[int, History] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.cached_tokens = 0
        self.configure(max_sessions, max_tokens)

    def configure(self, max_sessions: int, max_tokens: int = 0) -> None:
        if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 0:
            raise ValueError(f"max_sessions must be an integer >= 0, got {max_sessions!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        with self._lock:
            self.max_sessions = max_sessions
            self.max_tokens = max_tokens or int(self.model.ctx)
            self._evict()

    def _evict(self) -> None:
        total = sum(len(e.tokens) for e in self._idle.values())
        while self._idle and (len(self._idle) > self.max_sessions or total > self.max_tokens):
            _, e = self._idle.popitem(last=False)
            total -= len(e.tokens)

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            return {
                "sessions": len(self._idle),
                "max_sessions": self.max_sessions,
                "tokens": sum(len(e.tokens) for e in self._idle.values()),
                "max_tokens": self.max_tokens,
                "hits": self.hits,
                "misses": self.misses,
                "cached_tokens": self.cached_tokens,
            }

    def checkout(self, prompt: Sequence[int]) -> Lease:
        prompt = list(prompt)
        best: Tuple[int, Optional[int], Any] = (0, None, None)  # (length, key, snap or None)
        with self._lock:
            for key, e in self._idle.items():  # oldest first: ties go to the most recent
                length, snap = e.match(prompt)
                if length > 0 and length >= best[0]:
                    best = (length, key, snap)
            length, key, snap = best
            entry = self._idle.pop(key) if key is not None else None
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self.cached_tokens += length
        if entry is None:
            return Lease(History(self.model.session()), 0, "new")
        try:
            how = entry.take(length, snap)
        except (ValueError, RuntimeError):  # cannot happen by construction; stay correct
            return Lease(History(self.model.session()), 0, "new")
        return Lease(entry, length, how)

    def checkin(self, lease: Lease, keep: bool = True) -> None:
        """Returns a session; its history is read from the session itself."""
        e = lease.entry
        try:
            e.sync()
        except RuntimeError:  # still busy (an interrupted call): do not keep it
            return
        if not keep or self.max_sessions == 0 or not e.tokens:
            return
        with self._lock:
            self._idle[id(e)] = e
            self._idle.move_to_end(id(e))
            self._evict()
