"""Streamed text, cut and split as it comes: stop strings (:class:`StopMatcher`) and the
reasoning / content / tool-call split (:class:`Splitter`).

Both hold back a tail that could be the beginning of what they look for (a stop string,
``</think>``, a tool-call block) until the next piece decides, so a marker that spans tokens
is found exactly and never leaks out. The chat format's markers and its tool-call parser come
from ``encoding``: this module knows where they are, not what they are.
"""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..encoding import END_THINK, TOOL_CALLS_END, TOOL_CALLS_START, parse_completion


def normalize_stop(stop: Union[None, str, Sequence[str]]) -> List[str]:
    """``None``, one string or a list of strings -> a list of non-empty strings."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise ValueError(f"stop must be a string or a list of strings, got {type(stop).__name__}")
    out = []
    for s in stop:
        if not isinstance(s, str):
            raise ValueError(f"stop must contain strings only, got {type(s).__name__}")
        if not s:
            raise ValueError("stop strings must not be empty")
        out.append(s)
    return out


class StopMatcher:
    """Cuts a text stream at the first stop string.

    :meth:`push` returns the text that is safe to show: everything except a tail that could be
    the beginning of a stop string (held back until the next push decides). Once a stop string
    is complete, the text before it is returned, ``stopped`` names it, and everything after is
    dropped. :meth:`flush` returns the held-back tail at the end of the stream.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = list(stops)
        self._longest = max((len(s) for s in self.stops), default=0)
        self._held = ""
        self.stopped: Optional[str] = None

    def push(self, text: str) -> str:
        if self.stopped is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        # every earlier occurrence start was held back, so searching buf is exhaustive
        hit: Optional[Tuple[int, str]] = None
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (hit is None or i < hit[0]):
                hit = (i, s)
        if hit is not None:
            self.stopped = hit[1]
            self._held = ""
            return buf[: hit[0]]
        keep = _prefix_tail(buf, self.stops, self._longest)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        out, self._held = self._held, ""
        return "" if self.stopped is not None else out


def _prefix_tail(buf: str, markers: Sequence[str], longest: int) -> int:
    """Length of the longest tail of ``buf`` that is a proper prefix of one of ``markers``."""
    for k in range(min(len(buf), longest - 1), 0, -1):
        tail = buf[-k:]
        if any(m.startswith(tail) for m in markers):
            return k
    return 0


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class Splitter:
    """Streams ``parse_completion``'s split of a completion.

    Events are ``("reasoning", text)``, ``("content", text)`` and ``("tool_call", call)``.
    Joined, they give what ``parse_completion(text, thinking_mode=...)`` gives for the whole
    text when it is well formed (in thinking mode: reasoning up to ``</think>``; a
    ``\\n\\n<｜DSML｜tool_calls`` block, also one that starts before ``</think>``, becomes
    calls). Where ``parse_completion`` would raise (an unfinished or malformed block, text
    after the block), the text is kept as content instead of being lost.
    """

    def __init__(self, thinking: bool, tools: bool):
        self.phase = "reasoning" if thinking else "content"
        self.tools = tools
        self._buf = ""
        self.calls: List[Dict[str, Any]] = []

    def _markers(self) -> List[str]:
        if self.phase == "reasoning":
            return [END_THINK, TOOL_CALLS_START] if self.tools else [END_THINK]
        return [TOOL_CALLS_START] if self.tools else []

    def push(self, text: str) -> List[Tuple[str, Any]]:
        self._buf += text
        out: List[Tuple[str, Any]] = []
        while self._buf:
            if self.phase == "tools":
                end = self._buf.find(TOOL_CALLS_END)
                if end == -1:
                    return out
                end += len(TOOL_CALLS_END)
                block, self._buf = self._buf[:end], self._buf[end:]
                out += self._block(block)
                self.phase = "content"
                continue
            markers = self._markers()
            hit: Optional[Tuple[int, str]] = None
            for m in markers:
                i = self._buf.find(m)
                if i != -1 and (hit is None or i < hit[0]):
                    hit = (i, m)
            if hit is None:
                keep = _prefix_tail(self._buf, markers, max((len(m) for m in markers), default=0))
                cut = len(self._buf) - keep
                if cut:
                    out.append((self.phase, self._buf[:cut]))
                self._buf = self._buf[cut:]
                return out
            i, m = hit
            if i:
                out.append((self.phase, self._buf[:i]))
            if m == END_THINK:
                self._buf = self._buf[i + len(m) :]
                self.phase = "content"
            else:
                self._buf = self._buf[i:]
                self.phase = "tools"
        return out

    def _block(self, block: str) -> List[Tuple[str, Any]]:
        try:
            parsed = parse_completion(block, thinking_mode="chat")
        except ValueError:
            return [("content", block)]  # malformed: keep the text
        out: List[Tuple[str, Any]] = []
        for c in parsed["tool_calls"]:
            call = {
                "index": len(self.calls),
                "id": new_call_id(),
                "type": "function",
                "function": dict(c["function"]),
            }
            self.calls.append(call)
            out.append(("tool_call", call))
        return out

    def finish(self) -> List[Tuple[str, Any]]:
        """End of the completion: whatever is held back, as text."""
        buf, self._buf = self._buf, ""
        if not buf:
            return []
        return [("content" if self.phase == "tools" else self.phase, buf)]
