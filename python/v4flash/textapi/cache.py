"""The prompt cache: a few idle sessions (LRU) with snapshots at turn boundaries, so that a
conversation's next request, or another one sharing its start, prefills only what is new.

Which state a prompt resumes from is ``resume.History``'s rule (the chat uses the same): the
longest cached history or snapshot that is a strict prefix of the prompt. The output is the
same as a cold run.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..resume import History
from .disk import DEFAULT_MIN_TOKENS, DiskCache

DEFAULT_SESSIONS = 4  # idle sessions a prompt cache keeps


class Lease:
    """A session checked out of a :class:`PromptCache` for one request."""

    def __init__(self, entry: History, cached: int, how: str):
        self.entry = entry
        self.cached = cached  # tokens of the prompt already in the session
        self.how = how  # "new" | "append" | "rollback" | "reset" | "disk"

    @property
    def session(self) -> Any:
        return self.entry.session


class PromptCache:
    """Idle sessions with snapshots at turn boundaries, least recently used evicted first;
    optionally backed by session files on disk (:meth:`use_disk`, ``textapi.disk``).

    :meth:`checkout` gives a session that already holds the longest cached strict prefix of a
    prompt (strict: at least one prompt token is always fed, so there are logits to sample
    from), from RAM or, when longer, from disk; :meth:`checkin` returns it with its new
    history (and has its last turn-boundary state written to disk, in the background). A
    checked-out session belongs to one caller, so any number of callers can use one cache.
    Bounds: ``max_sessions`` idle sessions and ``max_tokens`` tokens of history across them
    (default: the model's context, which is the session state the memory plan reserves);
    ``max_sessions=0`` keeps no session in RAM.
    """

    def __init__(self, model: Any, max_sessions: int = DEFAULT_SESSIONS, max_tokens: int = 0):
        self.model = model
        self._lock = threading.Lock()
        self._idle: OrderedDict[int, History] = OrderedDict()
        self._writing: Dict[int, threading.Event] = {}  # id(entry) -> its file is written
        self.disk: Optional[DiskCache] = None
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

    def use_disk(
        self,
        directory: Any,
        max_bytes: int,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        log: Optional[Callable[[str], None]] = None,
    ) -> DiskCache:
        """Keeps states of at least ``min_tokens`` tokens as session files in ``directory``
        too (at most ``max_bytes``, least recently used removed first); they are found again
        after a restart. ``ValueError`` for a directory that cannot be used."""
        self.disk = DiskCache(self.model, directory, max_bytes, min_tokens, log)
        return self.disk

    def _evict(self) -> None:
        total = sum(len(e.tokens) for e in self._idle.values())
        while self._idle and (len(self._idle) > self.max_sessions or total > self.max_tokens):
            _, e = self._idle.popitem(last=False)
            total -= len(e.tokens)

    def clear(self) -> None:
        with self._lock:
            self._idle.clear()

    def flush(self) -> None:
        """Waits until the files asked for are written (no-op without a disk)."""
        if self.disk is not None:
            self.disk.flush()

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            out: Dict[str, Any] = {
                "sessions": len(self._idle),
                "max_sessions": self.max_sessions,
                "tokens": sum(len(e.tokens) for e in self._idle.values()),
                "max_tokens": self.max_tokens,
                "hits": self.hits,
                "misses": self.misses,
                "cached_tokens": self.cached_tokens,
            }
        if self.disk is not None:
            out["disk"] = self.disk.stats()
        return out

    def _best(self, prompt: List[int]) -> Tuple[int, Optional[int], Any]:
        """(length, key, snap or None) of the idle session that holds the most of ``prompt``
        (lock held)."""
        best: Tuple[int, Optional[int], Any] = (0, None, None)
        for key, e in self._idle.items():  # oldest first: ties go to the most recent
            length, snap = e.match(prompt)
            if length > 0 and length >= best[0]:
                best = (length, key, snap)
        return best

    def _from_disk(self, prompt: List[int], longer_than: int) -> Optional[Lease]:
        """A session read from the longest file that holds more of ``prompt`` than
        ``longer_than`` tokens, if any can be read."""
        disk = self.disk
        if disk is None:
            return None
        length, name = disk.find(prompt, longer_than)
        while name is not None:
            s = disk.load(name, prompt)
            if s is not None:
                e = History(s)
                e.tokens = list(prompt[:length])
                e.add_snapshot(length, s.snapshot())
                with self._lock:
                    self.hits += 1
                    self.cached_tokens += length
                return Lease(e, length, "disk")
            length, name = disk.find(prompt[:length], longer_than)  # a shorter one
        return None

    def checkout(self, prompt: Sequence[int]) -> Lease:
        prompt = list(prompt)
        if self.disk is not None:
            with self._lock:
                in_ram = self._best(prompt)[0]
            lease = self._from_disk(prompt, in_ram)
            if lease is not None:
                return lease
        with self._lock:
            length, key, snap = self._best(prompt)
            entry = self._idle.pop(key) if key is not None else None
            writing = self._writing.get(key) if key is not None else None
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self.cached_tokens += length
        if entry is None:
            return Lease(History(self.model.session()), 0, "new")
        if writing is not None:  # its file is being written from it: wait for the end
            writing.wait()
        try:
            how = entry.take(length, snap)
        except (ValueError, RuntimeError):  # cannot happen by construction; stay correct
            return Lease(History(self.model.session()), 0, "new")
        return Lease(entry, length, how)

    def _write(self, e: History) -> None:
        """Has ``e``'s last turn-boundary state written to disk (in the background), unless
        it is short or already there; ``e`` is not lent out again before that ends."""
        disk = self.disk
        if disk is None:
            return
        at = [(pos, snap) for pos, snap in e.snaps if disk.min_tokens <= pos <= len(e.tokens)]
        if not at:
            return
        pos, snap = max(at, key=lambda ps: ps[0])
        tokens = e.tokens[:pos]
        if disk.has(tokens):
            return
        key = id(e)

        def forget() -> None:
            with self._lock:
                self._writing.pop(key, None)

        with self._lock:  # before the writer can finish
            self._writing[key] = disk.write_later(e.session, snap, tokens, forget)

    def checkin(self, lease: Lease, keep: bool = True) -> None:
        """Returns a session; its history is read from the session itself."""
        e = lease.entry
        try:
            e.sync()
        except RuntimeError:  # still busy (an interrupted call): do not keep it
            return
        if not keep or not e.tokens:
            return
        self._write(e)
        if self.max_sessions == 0:
            return
        with self._lock:
            self._idle[id(e)] = e
            self._idle.move_to_end(id(e))
            self._evict()
