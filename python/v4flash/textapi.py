"""Text in, text out: ``Model.chat`` / ``chat_stream`` / ``complete`` / ``complete_stream``.

The layer between token ids and people (and the HTTP server). It owns no knowledge of the
chat format: prompts come from :func:`~v4flash.encoding.encode_prompt_ids`, completions are
split with the same rules as :func:`~v4flash.encoding.parse_completion` (tool-call blocks are
handed to it verbatim), so the format lives in ``encoding.py`` only.

Pieces:

* :class:`StopMatcher` cuts streamed text at the first stop string. Text that could be the start
  of a stop string is held back until it is known not to be, so a stop string that spans tokens
  is found exactly and never leaks out; the stop string itself is not returned.
* :class:`_Splitter` splits a completion into reasoning, content and tool calls while it streams:
  it holds back text that could begin ``</think>`` or a DSML tool-call block, and passes each
  complete ``<｜DSML｜tool_calls>`` block to ``parse_completion``.
* :class:`PromptCache` keeps a few idle sessions (LRU) with snapshots at turn boundaries. A new
  prompt resumes from the longest cached state whose tokens are a strict prefix of it (the
  session's whole history, or a snapshot, rolled back to), and prefills only the rest. The
  output is the same as a cold run: the engine gives bit-identical logits however a sequence is
  prefilled, and sampling step ``i`` always uses ``seed + i``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .encoding import (
    END_THINK,
    TOOL_CALLS_END,
    TOOL_CALLS_START,
    parse_completion,
    tool_call_opening,
)
from .model import sample_params
from .resume import History, turn_boundary
from .tokenizer import encode_prompt_ids


class _PrefillCancelled(Exception):
    """Raised from the prefill's progress callback to stop it (the request was cancelled)."""


DEFAULT_SESSIONS = 4  # idle sessions a prompt cache keeps


Cancel = Callable[[], bool]


class ContextLengthError(ValueError):
    """The prompt cannot fit the model's context (it needs at least one token of room)."""


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens resumed from the prompt cache (not prefilled)
    reasoning_tokens: int = 0  # completion tokens up to and including </think>

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> Dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
        }


@dataclass
class ChatDelta:
    """One streamed piece of a chat answer. The last delta carries ``finish_reason``,
    ``usage`` and ``timings`` (and possibly text)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: List[Dict[str, Any]] = field(default_factory=list)  # complete calls
    finish_reason: Optional[str] = None
    usage: Optional[Usage] = None
    timings: Optional[Dict[str, Any]] = None


@dataclass
class ChatResult:
    content: str
    reasoning: str
    tool_calls: List[Dict[str, Any]]  # OpenAI format: {"id", "type", "function": {...}}
    finish_reason: str  # "stop" | "length" | "tool_calls" | "cancelled"
    usage: Usage
    timings: Dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the generated text as decoded (cut at a stop string)
    ids: List[int] = field(default_factory=list)  # the generated token ids

    @property
    def message(self) -> Dict[str, Any]:
        """The answer as an OpenAI assistant message, ready to append to ``messages``."""
        msg: Dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": dict(c["function"])}
                for c in self.tool_calls
            ]
        return msg


@dataclass
class CompletionDelta:
    text: str = ""
    finish_reason: Optional[str] = None
    usage: Optional[Usage] = None
    timings: Optional[Dict[str, Any]] = None


@dataclass
class CompletionResult:
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
    usage: Usage
    timings: Dict[str, Any] = field(default_factory=dict)
    ids: List[int] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Stop strings
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Splitting a streamed completion into reasoning / content / tool calls
# --------------------------------------------------------------------------------------------


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class _Splitter:
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


# --------------------------------------------------------------------------------------------
# The prompt cache
# --------------------------------------------------------------------------------------------


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


_attach_lock = threading.Lock()


def cache_for(model: Any) -> PromptCache:
    """The model's own prompt cache (created on first use)."""
    cache = getattr(model, "_text_prompt_cache", None)
    if cache is None:
        with _attach_lock:
            cache = getattr(model, "_text_prompt_cache", None)
            if cache is None:
                cache = PromptCache(model)
                model._text_prompt_cache = cache
    return cache


def tokenizer_for(model: Any) -> Any:
    """The model's tokenizer (``tokenizer.json`` next to the weights), loaded on first use."""
    tok = getattr(model, "_text_tokenizer", None)
    if tok is None:
        from .tokenizer import load_tokenizer

        with _attach_lock:
            tok = getattr(model, "_text_tokenizer", None)
            if tok is None:
                tok = load_tokenizer(model.path)
                model._text_tokenizer = tok
    return tok


def use_tokenizer(model: Any, tokenizer: Any) -> None:
    """Attaches an already loaded tokenizer (the CLI loads one next to the model)."""
    model._text_tokenizer = tokenizer


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


def _integer(v: Any, name: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


@dataclass
class Job:
    """A checked request: the prompt ids and how to generate. Built by :func:`prepare_chat`
    or :func:`prepare_completion`; run with :func:`run_job`."""

    model: Any
    prompt: List[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stops: List[str]
    mode: str  # "chat" | "thinking" | "raw"
    parse_tools: bool = True
    forced_ids: List[int] = field(default_factory=list)  # a tool-call opening to feed
    forced_text: str = ""
    forced_after_think: bool = False  # thinking mode: feed forced_ids after </think>
    cache: Any = True  # True: the model's cache; False: none; or a PromptCache


def _sampling(job_kw: Dict[str, Any], temperature, top_p, top_k, seed, max_new_tokens) -> None:
    """The sampling parameters, checked (and a seed drawn when None) by the core's one rule."""
    job_kw.update(sample_params(temperature, top_p, top_k, seed)._asdict())
    job_kw["max_new_tokens"] = _integer(max_new_tokens, "max_new_tokens", 1)


def _check_context(model: Any, prompt: List[int], extra: int = 0) -> None:
    ctx = int(model.ctx)
    if len(prompt) + extra >= ctx:
        raise ContextLengthError(
            f"the prompt has {len(prompt) + extra} tokens but the context holds {ctx} "
            f"(prompt and answer together); shorten the conversation or raise --ctx"
        )


def _encoder_path(model: Any) -> Optional[Path]:
    enc = Path(getattr(model, "path", ".")) / "encoding" / "encoding_dsv4.py"
    return enc if enc.is_file() else None


def prepare_chat(
    model: Any,
    messages: List[Dict[str, Any]],
    *,
    tools: Optional[List[Dict[str, Any]]] = None,
    tool_choice: Any = None,
    response_format: Any = None,
    thinking: bool = False,
    reasoning_effort: Optional[str] = None,
    max_new_tokens: int = 1024,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: Optional[int] = None,
    stop: Union[None, str, Sequence[str]] = None,
    cache: Any = True,
) -> Job:
    """Encodes and checks a chat request (``ValueError`` for anything wrong, before any work;
    :class:`ContextLengthError` when the prompt cannot fit)."""
    tok = tokenizer_for(model)
    kw: Dict[str, Any] = {}
    _sampling(kw, temperature, top_p, top_k, seed, max_new_tokens)
    if not isinstance(thinking, bool):
        raise ValueError(f"thinking must be True or False, got {thinking!r}")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of message dicts")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools must be a list of OpenAI tool objects")
    forced_text, parse_tools = "", True
    if tool_choice in (None, "auto"):
        pass
    elif tool_choice == "none":
        tools, parse_tools = None, False
    else:
        names = [
            t["function"].get("name")
            for t in tools or []
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        if not names:
            raise ValueError("tool_choice asks for a tool call but no tools are given")
        if tool_choice == "required":
            forced_text = tool_call_opening()
        elif (
            isinstance(tool_choice, dict)
            and tool_choice.get("type") == "function"
            and isinstance(tool_choice.get("function"), dict)
            and isinstance(tool_choice["function"].get("name"), str)
        ):
            name = tool_choice["function"]["name"]
            if name not in names:
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
            forced_text = tool_call_opening(name)
        else:
            raise ValueError(
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}'
            )
    mode = "thinking" if thinking else "chat"
    try:
        prompt = encode_prompt_ids(
            tok,
            messages,
            thinking_mode=mode,
            reasoning_effort=reasoning_effort,
            tools=tools or None,
            response_format=response_format,
            encoder_path=_encoder_path(model),
        )
    except (TypeError, KeyError, AttributeError) as e:  # odd shapes the encoder did not expect
        raise ValueError(f"messages could not be encoded: {e}") from None
    forced_ids = tok.encode(forced_text) if forced_text else []
    # the prompt ends "<｜Assistant｜><think>" (thinking) or "<｜Assistant｜></think>" (chat)
    thinks = thinking and bool(prompt) and prompt[-1] == tok.think_id
    after_think = bool(forced_ids) and thinks
    if forced_ids and not after_think:
        prompt = prompt + forced_ids
    _check_context(model, prompt, len(forced_ids) if after_think else 0)
    return Job(
        model=model,
        prompt=prompt,
        stops=normalize_stop(stop),
        mode="thinking" if thinks else "chat",
        parse_tools=parse_tools,
        forced_ids=forced_ids,
        forced_text=forced_text,
        forced_after_think=after_think,
        cache=cache,
        **kw,
    )


def prepare_completion(
    model: Any,
    prompt: Union[str, Sequence[int]],
    *,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: Optional[int] = None,
    stop: Union[None, str, Sequence[str]] = None,
    cache: Any = True,
) -> Job:
    """Checks a raw completion: ``prompt`` is text (tokenized as is, special-token text
    included, no BOS added) or a list of token ids."""
    tok = tokenizer_for(model)
    kw: Dict[str, Any] = {}
    _sampling(kw, temperature, top_p, top_k, seed, max_new_tokens)
    if isinstance(prompt, str):
        ids = tok.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt
    ):
        ids = list(prompt)
    else:
        raise ValueError("prompt must be a string or a list of token ids")
    if not ids:
        raise ValueError("the prompt is empty")
    _check_context(model, ids)
    return Job(model=model, prompt=ids, stops=normalize_stop(stop), mode="raw", cache=cache, **kw)


# --------------------------------------------------------------------------------------------
# Running a request
# --------------------------------------------------------------------------------------------


def _cache_of(job: Job) -> Optional[PromptCache]:
    if job.cache is True:
        return cache_for(job.model)
    if job.cache is False or job.cache is None:
        return None
    if isinstance(job.cache, PromptCache):
        return job.cache
    raise ValueError("cache must be True, False or a PromptCache")


def run_job(job: Job, cancel: Optional[Cancel] = None) -> Iterator[Tuple[str, Any]]:
    """Runs a job; yields ``(kind, value)`` events: ``"reasoning"`` / ``"content"`` /
    ``"text"`` (raw mode) with text, ``"tool_call"`` with a call, and finally ``"end"`` with
    ``{"finish_reason", "usage", "timings", "ids", "text"}``.

    ``cancel()`` is polled between prefill chunks and between tokens; when it returns True the
    run ends with ``finish_reason="cancelled"``. Closing the iterator early is fine too: the
    session goes back to the cache either way.
    """
    model, tok = job.model, tokenizer_for(job.model)
    cache = _cache_of(job)
    cancel = cancel or (lambda: False)
    prompt = job.prompt
    t0 = time.perf_counter()
    if cache is not None:
        lease = cache.checkout(prompt)
    else:
        lease = Lease(History(model.session()), 0, "new")
    sess, cached = lease.session, lease.cached
    try:
        # prefill through the last <｜Assistant｜> (snapshot there), else all but the last token
        cut = turn_boundary(prompt, cached, tok.assistant_id)

        # the whole prefill in one call; the engine reports progress as it goes, and a
        # cancellation (client gone) is seen within ~20 ms, between layers
        def check(done: int, total: int) -> None:
            if cancel():
                raise _PrefillCancelled

        if cancel():
            yield "end", _end("cancelled", job, cached, [], 0, 0, t0, None, None, "")
            return
        if cut > cached:
            try:
                sess.feed(prompt[cached:cut], progress=check)
            except _PrefillCancelled:
                yield "end", _end("cancelled", job, cached, [], 0, 0, t0, None, None, "")
                return
        if cut > cached and cache is not None:
            lease.entry.add_snapshot(cut, sess.snapshot())
        t_prefill = time.perf_counter()

        raw = job.mode == "raw"
        splitter = None if raw else _Splitter(job.mode == "thinking", job.parse_tools)
        matcher = StopMatcher(job.stops)
        dec = tok.stream_decoder()
        ids: List[int] = []
        shown: List[str] = []
        reasoning_tokens = 0
        in_reasoning = job.mode == "thinking"
        room = int(model.ctx) - len(prompt)
        budget = min(job.max_new_tokens, room)
        feed = prompt[cut:]
        extra_prompt = 0
        pending_force = job.forced_after_think
        t_first: Optional[float] = None
        finish: Optional[str] = None

        def route(text: str) -> Iterator[Tuple[str, Any]]:
            if not text:
                return
            shown.append(text)
            if raw:
                yield "text", text
            else:
                yield from splitter.push(text)

        if job.forced_text and not job.forced_after_think:
            shown.append(job.forced_text)
            yield from splitter.push(job.forced_text)

        while finish is None:
            inject = False
            stream = sess.stream(
                feed,
                max_new_tokens=budget - len(ids),
                temperature=job.temperature,
                top_p=job.top_p,
                top_k=job.top_k,
                seed=(job.seed + len(ids)) % (1 << 64),
                stop_ids=[tok.eos_id],
            )
            try:
                for t in stream:
                    t = int(t)
                    if t_first is None:
                        t_first = time.perf_counter()
                    ids.append(t)
                    if t == tok.eos_id:
                        finish = "stop"
                        break
                    if in_reasoning and t == tok.end_think_id:
                        in_reasoning = False
                        reasoning_tokens = len(ids)
                        inject = pending_force
                    yield from route(matcher.push(dec.push(t)))
                    if matcher.stopped is not None:
                        finish = "stop"
                        break
                    if cancel():
                        finish = "cancelled"
                        break
                    if inject or len(ids) >= budget:
                        break
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            if finish is None and inject and len(ids) < budget:
                # tool_choice forces a call: after the reasoning, feed the block's opening
                pending_force = False
                yield from route(matcher.push(dec.flush()))
                yield from route(matcher.flush())
                shown.append(job.forced_text)
                yield from splitter.push(job.forced_text)
                feed = list(job.forced_ids)
                extra_prompt = len(feed)
                budget = min(budget, room - len(feed))  # prompt + answer + opening <= ctx
                if budget <= len(ids):
                    finish = "length"
            elif finish is None:
                finish = "length"
        if in_reasoning:
            reasoning_tokens = len(ids)
        if finish != "stop" or matcher.stopped is None:
            yield from route(matcher.push(dec.flush()))
            yield from route(matcher.flush())
        if splitter is not None:
            yield from splitter.finish()
            if splitter.calls and finish != "cancelled":
                finish = "tool_calls"
        yield (
            "end",
            _end(
                finish,
                job,
                cached,
                ids,
                reasoning_tokens,
                extra_prompt,
                t0,
                t_prefill,
                t_first,
                "".join(shown),
            ),
        )
    finally:
        if cache is not None:
            cache.checkin(lease)


def _end(finish, job, cached, ids, reasoning_tokens, extra_prompt, t0, t_prefill, t_first, text):
    t_end = time.perf_counter()
    n = len(ids)
    decode_s = (t_end - t_first) if t_first is not None else None
    timings = {
        "prefill_s": None if t_prefill is None else round(t_prefill - t0, 4),
        "ttft_s": None if t_first is None else round(t_first - t0, 4),
        "total_s": round(t_end - t0, 4),
        "decode_tok_s": round((n - 1) / decode_s, 2) if decode_s and n > 1 else None,
    }
    usage = Usage(
        prompt_tokens=len(job.prompt) + extra_prompt,
        completion_tokens=n,
        cached_tokens=cached,
        reasoning_tokens=reasoning_tokens,
    )
    return {"finish_reason": finish, "usage": usage, "timings": timings, "ids": ids, "text": text}


# --------------------------------------------------------------------------------------------
# The public functions (also Model methods)
# --------------------------------------------------------------------------------------------


def chat_stream(model: Any, messages: List[Dict[str, Any]], **kw: Any) -> Iterator[ChatDelta]:
    """Streams an answer to ``messages`` as :class:`ChatDelta` pieces (see :func:`chat`).

    Arguments are checked at once (``ValueError`` before the first ``next``); the text is
    UTF-8 safe and never contains part of a stop string."""
    cancel = kw.pop("cancel", None)
    job = prepare_chat(model, messages, **kw)
    return _chat_deltas(job, cancel)


def _chat_deltas(job: Job, cancel: Optional[Cancel]) -> Iterator[ChatDelta]:
    for kind, value in run_job(job, cancel):
        if kind == "reasoning":
            yield ChatDelta(reasoning=value)
        elif kind == "content":
            yield ChatDelta(content=value)
        elif kind == "tool_call":
            yield ChatDelta(tool_calls=[value])
        elif kind == "end":
            yield ChatDelta(
                finish_reason=value["finish_reason"],
                usage=value["usage"],
                timings=value["timings"],
            )


def chat(model: Any, messages: List[Dict[str, Any]], **kw: Any) -> ChatResult:
    """Answers ``messages`` (OpenAI-style dicts, DeepSeek V4 chat format).

    Keyword arguments: ``tools`` (OpenAI tools), ``tool_choice`` ("auto", "none",
    "required" or a named function), ``response_format`` (a JSON schema), ``thinking``
    (reasoning first), ``reasoning_effort``, ``max_new_tokens`` (1024), ``temperature``
    (1.0), ``top_p`` (1.0), ``top_k`` (0 = off), ``seed`` (random), ``stop`` (strings),
    ``cache`` (True: the model's prompt cache; False; or a :class:`PromptCache`),
    ``cancel`` (a callable polled between tokens; True ends the answer)."""
    cancel = kw.pop("cancel", None)
    return collect_chat(prepare_chat(model, messages, **kw), cancel)


def collect_chat(job: Job, cancel: Optional[Cancel] = None) -> ChatResult:
    """Runs a chat job to the end (what :func:`chat` returns)."""
    parts: Dict[str, List[str]] = {"reasoning": [], "content": []}
    calls: List[Dict[str, Any]] = []
    end: Dict[str, Any] = {}
    for kind, value in run_job(job, cancel):
        if kind in parts:
            parts[kind].append(value)
        elif kind == "tool_call":
            calls.append({k: v for k, v in value.items() if k != "index"})
        elif kind == "end":
            end = value
    return ChatResult(
        content="".join(parts["content"]),
        reasoning="".join(parts["reasoning"]),
        tool_calls=calls,
        finish_reason=end["finish_reason"],
        usage=end["usage"],
        timings=end["timings"],
        text=end["text"],
        ids=end["ids"],
    )


def complete_stream(model: Any, prompt: Union[str, Sequence[int]], **kw: Any):
    """Streams a raw completion as :class:`CompletionDelta` pieces (see :func:`complete`)."""
    cancel = kw.pop("cancel", None)
    job = prepare_completion(model, prompt, **kw)
    return _completion_deltas(job, cancel)


def _completion_deltas(job: Job, cancel: Optional[Cancel]) -> Iterator[CompletionDelta]:
    for kind, value in run_job(job, cancel):
        if kind == "text":
            yield CompletionDelta(text=value)
        elif kind == "end":
            yield CompletionDelta(
                finish_reason=value["finish_reason"],
                usage=value["usage"],
                timings=value["timings"],
            )


def complete(model: Any, prompt: Union[str, Sequence[int]], **kw: Any) -> CompletionResult:
    """Continues raw text (no chat template; special-token text in it becomes those tokens;
    no BOS is added) or a list of token ids. Keywords: ``max_new_tokens`` (256),
    ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``cache``, ``cancel`` as for
    :func:`chat`."""
    cancel = kw.pop("cancel", None)
    return collect_completion(prepare_completion(model, prompt, **kw), cancel)


def collect_completion(job: Job, cancel: Optional[Cancel] = None) -> CompletionResult:
    """Runs a raw completion job to the end (what :func:`complete` returns)."""
    end: Dict[str, Any] = {}
    for kind, value in run_job(job, cancel):
        if kind == "end":
            end = value
    return CompletionResult(
        text=end["text"],
        finish_reason=end["finish_reason"],
        usage=end["usage"],
        timings=end["timings"],
        ids=end["ids"],
    )
