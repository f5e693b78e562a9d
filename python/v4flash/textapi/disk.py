"""The prompt cache on disk: states at turn boundaries written as session files, so a long
conversation (an agent's system prompt and tools) is not prefilled again after a restart.

A file holds one state: a prompt's tokens up to a turn boundary, in the session file format
(``Session.save``: versioned, checksummed, refused by the core for another model, config,
numerics mode or kernel tier). Its name is ``<length>-<key>.v4s``, the key a SHA-256 of the
model's identity (``Model.identity``) and the tokens: a lookup hashes the prompt once,
incrementally, and tries only the lengths that files have; another model's files in the same
directory are never read. A file read back must hold exactly the prompt's first tokens, or it
is not used.

Files are written by one background thread after an answer (the session is not lent out
again until its file is written), least recently used removed first beyond the disk budget.
A file that cannot be read (damaged, truncated, from another version) is logged, deleted and
never served: the prompt is then prefilled as if there were no file. The output after a disk
hit is the same as a cold run (the engine's logits do not depend on how a state was reached).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import sys
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

SUFFIX = ".v4s"
DEFAULT_MIN_TOKENS = 256  # shorter prefixes are cheap to prefill again: not written
_NAME = re.compile(r"^(\d{1,9})-([0-9a-f]{32})" + re.escape(SUFFIX) + "$")


def _ids_bytes(ids: Sequence[int]) -> bytes:
    a = array("I", ids)  # uint32 (4 bytes on every platform wheels are built for)
    if sys.byteorder == "big":
        a.byteswap()
    return a.tobytes()


_Job = Tuple[Any, int, Any, str, threading.Event, Optional[Callable[[], None]]]


@dataclass(frozen=True)
class DiskOptions:
    """Where and how much: ``PromptCache.use_disk``'s arguments, as ``serve`` takes them."""

    directory: Path
    max_bytes: int
    min_tokens: int = DEFAULT_MIN_TOKENS

    def prepare(self) -> None:
        """Creates the directory now (``ValueError`` naming it when it cannot be), so that a
        bad path is said before a model loads."""
        _usable_dir(Path(self.directory).expanduser())


def _usable_dir(d: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{d}: cannot use as the prompt cache directory: {e}") from None
    if not d.is_dir():
        raise ValueError(f"{d}: cannot use as the prompt cache directory: not a directory")


class _File:
    __slots__ = ("length", "size", "used")

    def __init__(self, length: int, size: int, used: float):
        self.length = length
        self.size = size
        self.used = used  # last written or read (LRU order)


class DiskCache:
    """Session files of ``model`` under ``directory``, at most ``max_bytes`` of them; states
    shorter than ``min_tokens`` are not written. ``log`` receives one line per skipped file
    and per failed write."""

    def __init__(
        self,
        model: Any,
        directory: Any,
        max_bytes: int,
        min_tokens: int = DEFAULT_MIN_TOKENS,
        log: Optional[Callable[[str], None]] = None,
    ):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"the disk budget must be a positive byte count, got {max_bytes!r}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 1:
            raise ValueError(f"min_tokens must be an integer >= 1, got {min_tokens!r}")
        self.model = model
        self.dir = Path(directory).expanduser()
        _usable_dir(self.dir)
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._log = log or (lambda line: print(f"v4flash: {line}", file=sys.stderr))
        identity = json.dumps(model.identity, sort_keys=True, separators=(",", ":"))
        self._tag = hashlib.sha256(identity.encode()).digest()
        self._lock = threading.Lock()
        self._files: Dict[str, _File] = {}
        self.hits = 0
        self.writes = 0
        self.skipped = 0  # files that could not be read, deleted
        self.failed = 0  # writes that failed
        self._jobs: queue.Queue[Optional[_Job]] = queue.Queue()
        self._writer: Optional[threading.Thread] = None
        self._scan()

    # --- the index --------------------------------------------------------------------------

    def _scan(self) -> None:
        """Indexes the files already there (a restart finds what the last run wrote)."""
        for p in self.dir.iterdir():
            m = _NAME.match(p.name)
            if not m:
                continue
            try:
                st = p.stat()
            except OSError:
                continue
            self._files[p.name] = _File(int(m.group(1)), st.st_size, st.st_mtime)

    def name(self, ids: Sequence[int]) -> str:
        """The file name of the state holding exactly ``ids``."""
        h = hashlib.sha256(self._tag)
        h.update(_ids_bytes(ids))
        return f"{len(ids)}-{h.hexdigest()[:32]}{SUFFIX}"

    def find(self, prompt: Sequence[int], longer_than: int = 0) -> Tuple[int, Optional[str]]:
        """The longest state on disk that is a strict prefix of ``prompt`` and longer than
        ``longer_than`` tokens: ``(length, file name)``, or ``(0, None)``."""
        with self._lock:
            names = set(self._files)
            lengths = sorted({f.length for f in self._files.values()})
        lengths = [n for n in lengths if longer_than < n < len(prompt)]
        best: Tuple[int, Optional[str]] = (0, None)
        h = hashlib.sha256(self._tag)
        done = 0
        for n in lengths:
            h.update(_ids_bytes(prompt[done:n]))
            done = n
            name = f"{n}-{h.copy().hexdigest()[:32]}{SUFFIX}"
            if name in names:
                best = (n, name)
        return best

    def has(self, ids: Sequence[int]) -> bool:
        with self._lock:
            return self.name(ids) in self._files

    def _drop(self, name: str) -> None:
        with self._lock:
            self._files.pop(name, None)
        try:
            (self.dir / name).unlink()
        except OSError:
            pass

    # --- reading ----------------------------------------------------------------------------

    def load(self, name: str, prompt: Sequence[int]) -> Optional[Any]:
        """The session in file ``name``, which must hold exactly ``prompt``'s first tokens;
        ``None`` (the file logged and deleted) when it cannot be used."""
        path = self.dir / name
        with self._lock:
            f = self._files.get(name)
        if f is None:
            return None
        try:
            s = self.model.load_session(path)
            if list(s.tokens) != list(prompt[: f.length]):
                raise ValueError(f"holds other tokens than its name says ({s.position} tokens)")
        except (ValueError, OSError) as e:
            with self._lock:
                self.skipped += 1
            self._log(f"prompt cache: skipping {path}: {e}")
            self._drop(name)
            return None
        now = time.time()
        try:
            os.utime(path, (now, now))
        except OSError:
            pass
        with self._lock:
            f.used = now
            self.hits += 1
        return s

    # --- writing ----------------------------------------------------------------------------

    def write_later(
        self,
        session: Any,
        snap: Any,
        tokens: Sequence[int],
        on_done: Optional[Callable[[], None]] = None,
    ) -> threading.Event:
        """Writes the state ``snap`` of ``session`` (holding ``tokens``) in the background;
        the event is set (then ``on_done`` called) once the file is written or the write
        failed. The caller must not use the session until then."""
        done = threading.Event()
        name = self.name(tokens)
        with self._lock:
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="v4flash-prompt-cache-writer", daemon=True
                )
                self._writer.start()
        self._jobs.put((session, len(tokens), snap, name, done, on_done))
        return done

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            session, length, snap, name, done, on_done = job
            try:
                self._write(session, length, snap, name)
            finally:
                done.set()
                if on_done is not None:
                    on_done()
                self._jobs.task_done()

    def _write(self, session: Any, length: int, snap: Any, name: str) -> None:
        path = self.dir / name
        with self._lock:
            if name in self._files:  # written meanwhile (another conversation, same prefix)
                self._files[name].used = time.time()
                return
        try:
            size = int(session.save(path, snapshot=snap, metadata={"prompt_cache": length}))
        except (ValueError, OSError, RuntimeError) as e:
            with self._lock:
                self.failed += 1
            self._log(f"prompt cache: cannot write {path}: {e}")
            return
        with self._lock:
            self._files[name] = _File(length, size, time.time())
            self.writes += 1
            gone = self._over_budget()
        for old in gone:
            try:
                (self.dir / old).unlink()
            except OSError:
                pass

    def _over_budget(self) -> List[str]:
        """Drops the least recently used files beyond the budget from the index (lock held);
        returns their names, to delete."""
        total = sum(f.size for f in self._files.values())
        gone = []
        for name, f in sorted(self._files.items(), key=lambda kv: kv[1].used):
            if total <= self.max_bytes:
                break
            total -= f.size
            gone.append(name)
            del self._files[name]
        return gone

    def flush(self) -> None:
        """Waits until every file asked for is written."""
        self._jobs.join()

    def stats(self) -> Dict[str, Any]:
        with self._lock:
            return {
                "dir": str(self.dir),
                "files": len(self._files),
                "bytes": sum(f.size for f in self._files.values()),
                "max_bytes": self.max_bytes,
                "hits": self.hits,
                "writes": self.writes,
                "skipped": self.skipped,
                "failed": self.failed,
            }
