"""The engine side of the server: up to ``parallel`` requests at a time, first come first
served.

Why a bound: the requests that run are stepped together by the core's scheduler (one
forward pass per round for all of them: each read of the weights serves every running
answer, rust/schedule.rs), up to the sessions the model was loaded for; beyond that a request
waits its turn. With ``parallel`` 1 (a model loaded for one session) they run one at a time,
each with all compute threads and the whole expert cache. :class:`FifoLock` grants the
engine's places in arrival order; a waiter gives up when its client leaves or the server
stops, and a running answer is cancelled between tokens for the same reasons
(:meth:`Engine.turn`). Nothing here knows HTTP: the transport (``http``) maps :class:`Gone`
and :class:`ShuttingDown` to its own answers.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

from ..textapi.attached import tokenizer_for
from ..textapi.cache import PromptCache
from ..textapi.disk import DiskOptions

KEEPALIVE_S = 15.0  # a waiting streamed request hears from the server this often


class Gone(Exception):
    """The client went away."""


class ShuttingDown(Exception):
    """The server stops: a queued request is refused, a running one ended at its next token."""


class FifoLock:
    """A lock of ``places`` holders, granted in arrival order; a waiter can give up (its
    client left). ``threading.Semaphore`` makes no fairness promise, hence the explicit
    queue."""

    def __init__(self, places: int = 1) -> None:
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._held = 0
        self.places = max(1, int(places))

    @property
    def running(self) -> int:
        with self._cond:
            return self._held

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._held > 0

    def acquire(
        self,
        give_up: Callable[[], bool] = lambda: False,
        poll: float = 0.25,
        tick: Optional[Callable[[], None]] = None,
        tick_every: float = KEEPALIVE_S,
    ) -> bool:
        """Waits for the lock; False (not held) once ``give_up()`` is true. ``tick`` runs
        every ``tick_every`` seconds while waiting (outside the internal lock)."""
        me = object()
        last_tick = time.monotonic()
        with self._cond:
            self._queue.append(me)
        try:
            while True:
                with self._cond:
                    if self._held >= self.places or self._queue[0] is not me:
                        self._cond.wait(poll)
                    if self._held < self.places and self._queue[0] is me:
                        self._queue.popleft()
                        self._held += 1
                        # the next in line may fit too
                        self._cond.notify_all()
                        return True
                if give_up():
                    return False
                if tick is not None and time.monotonic() - last_tick >= tick_every:
                    last_tick = time.monotonic()
                    tick()
        finally:
            with self._cond:
                if me in self._queue:  # gave up (or tick failed): let the next one go
                    self._queue.remove(me)
                    self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._held = max(0, self._held - 1)
            self._cond.notify_all()


class Engine:
    """What every request shares: the model, its tokenizer, the prompt cache, the FIFO lock
    that gives the engine to ``parallel`` requests at a time (the sessions the model was
    loaded for, unless told), and the server's state (stopping, the requests in flight)."""

    def __init__(
        self,
        model: Any,
        *,
        name: str,
        max_tokens: int = 4096,
        cache_sessions: int = 4,
        cache_disk: Optional[DiskOptions] = None,
        log: Optional[Callable[[str], None]] = None,
        parallel: Optional[int] = None,
    ):
        self.name = name
        self.max_tokens = max_tokens
        self.cache_sessions = cache_sessions
        self.cache_disk = cache_disk
        self._log = log or _stderr_log
        self.model: Any = None
        self.tok: Any = None
        self.cache: Any = None
        self.ready = threading.Event()
        self.responses: Any = None  # responses kept for previous_response_id (make_server)
        self.parallel = parallel
        self.lock = FifoLock(parallel or 1)
        if model is not None:
            self.set_model(model)
        self.stopping = threading.Event()
        self.created = int(time.time())
        self._active = 0
        self._active_cond = threading.Condition()
        self.requests = 0

    def set_model(self, model: Any) -> None:
        """The model is loaded: requests may use it (until then they get a 503, "loading")."""
        self.model = model
        if self.parallel is None:  # as many as the model steps together
            plan = getattr(model, "plan", None)
            self.lock.places = max(1, int(plan().get("sessions", 1))) if plan else 1
        self.tok = tokenizer_for(model)
        cache = PromptCache(model, max_sessions=self.cache_sessions)
        d = self.cache_disk
        if d is not None:
            cache.use_disk(d.directory, d.max_bytes, d.min_tokens, log=self.log)
        self.cache = cache
        self.ready.set()

    def log(self, line: str) -> None:
        self._log(line)

    def turn(
        self,
        body: Callable[[Callable[[], bool]], Any],
        gone: Callable[[], bool],
        tick: Optional[Callable[[], None]] = None,
    ) -> Any:
        """Waits for the engine in arrival order, then runs ``body(cancel)`` holding it.
        ``cancel()`` (polled by the run between tokens) is true once the client is ``gone()``
        or the server stops; either ends the wait too (:class:`Gone`, :class:`ShuttingDown`).
        ``tick`` runs every ``KEEPALIVE_S`` while the request waits."""
        ok = self.lock.acquire(give_up=lambda: gone() or self.stopping.is_set(), tick=tick)
        if not ok:
            raise ShuttingDown() if self.stopping.is_set() else Gone()
        try:
            return body(lambda: self.stopping.is_set() or gone())
        finally:
            self.lock.release()

    def cancelled(self) -> Exception:
        """Why a run ended "cancelled": the server stops, or the client left."""
        return ShuttingDown() if self.stopping.is_set() else Gone()

    @contextlib.contextmanager
    def active(self):
        with self._active_cond:
            self._active += 1
            self.requests += 1
        try:
            yield
        finally:
            with self._active_cond:
                self._active -= 1
                self._active_cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._active_cond:
            while self._active:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._active_cond.wait(left)
        return True


_log_lock = threading.Lock()


def _stderr_log(line: str) -> None:
    with _log_lock:
        print(f"{time.strftime('%H:%M:%S')} {line}", file=sys.stderr, flush=True)
