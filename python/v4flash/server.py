"""``v4flash serve``: an OpenAI-compatible HTTP server on the text-level API.

Endpoints: ``POST /v1/chat/completions`` (JSON or SSE stream; tools, tool_choice, reasoning,
stop strings, seed), ``POST /v1/completions``, ``GET /v1/models``, ``GET /health``.

Built on the standard library (``http.server.ThreadingHTTPServer``): no runtime dependency,
SSE is a few lines of chunked writes, and the engine runs one request at a time anyway (see
:class:`FifoLock`), so an async stack would buy nothing. Each connection gets a thread that
parses and checks its request (errors are answered with a 4xx at once, queued or not), then
waits its turn for the engine.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import re
import select
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

from . import __version__
from .model import sample_params
from .textapi.api import collect_chat, collect_completion
from .textapi.attached import tokenizer_for
from .textapi.cache import PromptCache
from .textapi.prompts import ContextLengthError, prepare_chat, prepare_completion
from .textapi.results import Usage
from .textapi.run import run_job

MAX_BODY = 32 << 20  # bytes of JSON per request
MAX_STOP = 16  # stop strings per request
KEEPALIVE_S = 15.0  # SSE comment while a streamed request waits in the queue
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
# OpenAI documents temperature "between 0 and 2": the dialect's own limit (the engine takes any
# temperature >= 0, as its own rule says)
TEMPERATURE_RANGE = (0, 2)
EFFORTS = {  # OpenAI's reasoning_effort words -> the DeepSeek V4 encoder's
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: Optional[str] = None,
        *,
        code: Optional[str] = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> Dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


# --------------------------------------------------------------------------------------------
# The engine: one request at a time, first come first served
# --------------------------------------------------------------------------------------------


class FifoLock:
    """A lock granted in arrival order; a waiter can give up (its client left).

    Why one request at a time: every request uses all compute threads and the whole expert
    cache, so two at once would only share the cores and evict each other's experts (both
    slower, and the first to arrive no longer finishes first); the prompt cache's sessions
    are also touched by one request at a time. ``threading.Lock`` makes no fairness promise,
    hence the explicit queue.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque = deque()
        self._held = False

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._held

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
                    if self._held or self._queue[0] is not me:
                        self._cond.wait(poll)
                    if not self._held and self._queue[0] is me:
                        self._queue.popleft()
                        self._held = True
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
            self._held = False
            self._cond.notify_all()


def peer_closed(sock: socket.socket) -> bool:
    """True when the client has closed its side (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class Engine:
    """What the handlers share: the model, its tokenizer, the prompt cache and the lock."""

    def __init__(
        self,
        model: Any,
        *,
        name: str,
        api_key: Optional[str] = None,
        max_tokens: int = 4096,
        cache_sessions: int = 4,
        log: Optional[Callable[[str], None]] = None,
    ):
        self.model = model
        self.tok = tokenizer_for(model)
        self.name = name
        self.api_key = api_key
        self.max_tokens = max_tokens
        self.cache = PromptCache(model, max_sessions=cache_sessions)
        self.lock = FifoLock()
        self.stopping = threading.Event()
        self.created = int(time.time())
        self._log = log or _stderr_log
        self._active = 0
        self._active_cond = threading.Condition()
        self.requests = 0

    def log(self, line: str) -> None:
        self._log(line)

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


# --------------------------------------------------------------------------------------------
# Request checking (OpenAI fields -> text API arguments)
# --------------------------------------------------------------------------------------------


def _opt(body: Dict[str, Any], key: str, types: Tuple[type, ...], what: str) -> Any:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in types:
        raise ApiError(400, f"'{key}' must be {what}, got {json.dumps(v)}", param=key)
    if not isinstance(v, types):
        raise ApiError(400, f"'{key}' must be {what}, got {json.dumps(v)[:80]}", param=key)
    return v


def _sampling_args(body: Dict[str, Any], engine: Engine, default_max: int) -> Dict[str, Any]:
    ctx = int(engine.model.ctx)
    out: Dict[str, Any] = {}
    n = _opt(body, "n", (int,), "1 (only one choice is supported)")
    if n is not None and n != 1:
        raise ApiError(400, f"'n' must be 1 (one choice per request), got {n}", param="n")
    max_tokens = None
    for key in ("max_completion_tokens", "max_tokens"):
        v = _opt(body, key, (int,), "a positive integer")
        if v is not None:
            if v < 1:
                raise ApiError(400, f"'{key}' must be >= 1, got {v}", param=key)
            if v > ctx:
                raise ApiError(
                    400,
                    f"'{key}' = {v} exceeds the model's context of {ctx} tokens",
                    param=key,
                    code="context_length_exceeded",
                )
            max_tokens = v if max_tokens is None else max_tokens
    out["max_new_tokens"] = max_tokens if max_tokens is not None else default_max
    t = _opt(body, "temperature", (int, float), "a number between 0 and 2")
    if t is not None and not TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1]:
        raise ApiError(400, f"'temperature' must be between 0 and 2, got {t}", "temperature")
    p = _opt(body, "top_p", (int, float), "a number in (0, 1]")
    k = _opt(body, "top_k", (int,), "an integer >= 0")
    seed = _opt(body, "seed", (int,), "an integer")
    if seed is not None:
        seed %= 1 << 64  # OpenAI takes any integer; the engine's seeds are 64-bit
    try:  # the engine's rule (its message names the parameter first)
        s = sample_params(t, p, k, seed)
    except ValueError as e:
        name, _, rest = str(e).partition(" ")
        raise ApiError(400, f"'{name}' {rest}", param=name) from None
    out.update(s._asdict())
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise ApiError(400, "'stop' must be a non-empty string or a list of them", "stop")
        if len(stops) > MAX_STOP:
            raise ApiError(400, f"'stop' has {len(stops)} strings; at most {MAX_STOP}", "stop")
        out["stop"] = stops
    for key in ("frequency_penalty", "presence_penalty"):
        v = _opt(body, key, (int, float), "a number")
        if v:
            raise ApiError(400, f"'{key}' is not supported (only 0)", param=key)
    if body.get("logit_bias"):
        raise ApiError(400, "'logit_bias' is not supported", param="logit_bias")
    return out


def _stream_args(body: Dict[str, Any]) -> Tuple[bool, bool]:
    stream = _opt(body, "stream", (bool,), "true or false") or False
    opts = _opt(body, "stream_options", (dict,), "an object")
    include_usage = False
    if opts is not None:
        v = opts.get("include_usage", False)
        if not isinstance(v, bool):
            raise ApiError(400, "'stream_options.include_usage' must be a boolean")
        include_usage = v
    return stream, include_usage


def _thinking(body: Dict[str, Any]) -> Tuple[bool, Optional[str]]:
    """(thinking on?, encoder reasoning_effort) from DeepSeek's ``thinking`` (an object
    ``{"type": "enabled"|"disabled"}`` or a boolean), vLLM's ``chat_template_kwargs``
    and OpenAI's ``reasoning_effort`` (which turns thinking on unless it is "none")."""
    thinking: Optional[bool] = None
    t = body.get("thinking")
    if isinstance(t, bool):
        thinking = t
    elif isinstance(t, dict) and t.get("type") in ("enabled", "disabled"):
        thinking = t["type"] == "enabled"
    elif t is not None:
        raise ApiError(
            400,
            '\'thinking\' must be {"type": "enabled"} / {"type": "disabled"} or a boolean',
            param="thinking",
        )
    kw = body.get("chat_template_kwargs")
    if kw is not None:
        if not isinstance(kw, dict):
            raise ApiError(400, "'chat_template_kwargs' must be an object")
        for key in ("thinking", "enable_thinking"):
            if key in kw:
                if not isinstance(kw[key], bool):
                    raise ApiError(400, f"'chat_template_kwargs.{key}' must be a boolean")
                thinking = kw[key] if thinking is None else thinking
    effort = body.get("reasoning_effort")
    if effort is None:
        return bool(thinking), None
    if not isinstance(effort, str) or (effort != "none" and effort not in EFFORTS):
        raise ApiError(
            400,
            f"'reasoning_effort' must be one of none, {', '.join(EFFORTS)}; got "
            f"{json.dumps(effort)[:40]}",
            param="reasoning_effort",
        )
    if effort == "none":
        return bool(thinking), None
    return (True if thinking is None else thinking), EFFORTS[effort]


def _tools(body: Dict[str, Any]) -> Tuple[Optional[List[Dict[str, Any]]], Any]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "'tools' must be a list of tool objects", param="tools")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if (
                not isinstance(t, dict)
                or t.get("type", "function") != "function"
                or not isinstance(fn, dict)
            ):
                raise ApiError(
                    400,
                    f'tools[{i}] must be {{"type": "function", "function": {{...}}}}',
                    param="tools",
                )
            name = fn.get("name")
            if not isinstance(name, str) or not TOOL_NAME.match(name):
                raise ApiError(
                    400,
                    f"tools[{i}].function.name must match {TOOL_NAME.pattern}",
                    param="tools",
                )
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise ApiError(400, f"tools[{i}].function.parameters must be an object")
        tools = tools or None
    choice = body.get("tool_choice")
    if choice is not None and not (
        choice in ("none", "auto", "required") or isinstance(choice, dict)
    ):
        raise ApiError(
            400, "'tool_choice' must be none, auto, required or a function", "tool_choice"
        )
    return tools, choice


def _response_format(body: Dict[str, Any]) -> Any:
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ApiError(400, "'response_format' must be an object with a 'type'")
    if rf["type"] == "text":
        return None
    if rf["type"] == "json_object":
        return {"type": "object"}
    if rf["type"] == "json_schema":
        js = rf.get("json_schema")
        schema = js.get("schema") if isinstance(js, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "'response_format.json_schema.schema' must be an object")
        return schema
    raise ApiError(400, f"response_format type {rf['type']!r} is not supported")


def _messages(body: Dict[str, Any]) -> List[Dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a 'role'", "messages")
        if m["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(
                400,
                f"messages[{i}].role {m['role']!r} is not one of system, developer, user, "
                "assistant, tool",
                param="messages",
            )
    return msgs


def _model_field(body: Dict[str, Any]) -> None:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise ApiError(400, "'model' must be a string", param="model")


def usage_json(u: Usage) -> Dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


class _Gone(Exception):
    """The client went away."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"v4flash/{__version__}"
    timeout = 120  # seconds a connection may stay silent (idle keep-alive, slow client)
    disable_nagle_algorithm = True  # small SSE writes go out at once (no ~40 ms ACK waits)
    engine: Engine  # set on the subclass that make_server builds

    # --- plumbing ------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
        pass  # one line per request comes from _log_request instead

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        self.engine.log(f"{self.address_string()} {format % args}")

    def send_error(self, code: int, message: Optional[str] = None, explain: Any = None) -> None:
        """Protocol-level errors (bad request line, unknown method, …) as OpenAI JSON too."""
        short = self.responses.get(code, ("error", ""))[0]
        self.close_connection = True
        with contextlib.suppress(_Gone):
            self._send_json(code, ApiError(code, message or short).body())

    def _send_json(self, status: int, doc: Any, headers: Optional[Dict[str, str]] = None) -> None:
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self._write(data)

    def _write(self, data: bytes) -> None:
        try:
            self.wfile.write(data)
        except OSError:  # reset, broken pipe, timeout: the client is gone
            self.close_connection = True
            raise _Gone() from None

    def _error(self, e: ApiError) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        self._send_json(e.status, e.body(), headers)

    def _gone(self) -> bool:
        return peer_closed(self.connection)

    def _read_json(self) -> Dict[str, Any]:
        if self.headers.get("Transfer-Encoding", "").lower() not in ("", "identity"):
            self.close_connection = True
            raise ApiError(411, "send the body with a Content-Length (no chunked uploads)")
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise ApiError(411, "a JSON body with a Content-Length header is required")
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, f"bad Content-Length {length!r}") from None
        if n < 0:
            self.close_connection = True
            raise ApiError(400, f"bad Content-Length {length!r}")
        if n > MAX_BODY:
            self.close_connection = True
            raise ApiError(413, f"the body must be at most {MAX_BODY} bytes (got {n})")
        raw = self.rfile.read(n)
        self._body_read = True
        if len(raw) < n:
            self.close_connection = True
            raise _Gone()
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    def _authorized(self) -> bool:
        key = self.engine.api_key
        if not key:
            return True
        got = self.headers.get("Authorization", "")
        scheme, _, token = got.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), key.encode()
        )

    def _route(self) -> str:
        path = urlsplit(self.path).path
        if len(path) > 1:
            path = path.rstrip("/")
        return path[3:] if path.startswith("/v1/") else path

    # --- dispatch ------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        t0 = time.perf_counter()
        route = self._route()
        self._info: Dict[str, Any] = {}
        self._body_read = False
        status = 200
        try:
            with self.engine.active():
                routes = {
                    ("GET", "/health"): self._health,
                    ("GET", "/models"): self._models,
                    ("POST", "/chat/completions"): self._chat,
                    ("POST", "/completions"): self._completions,
                }
                fn = routes.get((method, route))
                if fn is None and method == "GET" and route.startswith("/models/"):
                    fn = self._model
                if fn is None:
                    other = "POST" if method == "GET" else "GET"
                    if (other, route) in routes:
                        raise ApiError(405, f"use {other} for {self.path}")
                    raise ApiError(404, f"no such endpoint: {method} {self.path}")
                if route != "/health" and not self._authorized():
                    raise ApiError(
                        401, "missing or wrong API key (Authorization: Bearer KEY)", code="auth"
                    )
                status = fn() or 200
        except ApiError as e:
            status = e.status
            self._info.setdefault("error", e.message)
            if method == "POST" and not self._body_read:
                self.close_connection = True  # the unread body would be taken for a request
            with contextlib.suppress(_Gone):
                self._error(e)
        except (_Gone, ConnectionError):
            status = 499  # nginx's "client closed request"
            self.close_connection = True
        except Exception as e:  # a bug: say so, keep serving
            status = 500
            self.engine.log(f"internal error on {method} {self.path}:\n{traceback.format_exc()}")
            self.close_connection = True
            with contextlib.suppress(_Gone):
                self._error(ApiError(500, f"internal error: {e}", kind="server_error"))
        if route != "/health":
            self._log_request(method, status, time.perf_counter() - t0)

    def _log_request(self, method: str, status: int, total: float) -> None:
        i = self._info
        parts = [f"{method} {self.path} {status}"]
        if "usage" in i:
            u: Usage = i["usage"]
            t = i.get("timings") or {}
            parts.append(("stream" if i.get("stream") else "json") + f" {i.get('finish')}")
            parts.append(f"prompt {u.prompt_tokens} (cached {u.cached_tokens})")
            parts.append(f"completion {u.completion_tokens}")
            parts.append(f"queue {i.get('queue_s', 0):.2f}s")
            if t.get("ttft_s") is not None:
                parts.append(f"TTFT {i.get('queue_s', 0) + t['ttft_s']:.3f}s")
            if t.get("decode_tok_s") is not None:
                parts.append(f"{t['decode_tok_s']:.1f} tok/s")
        elif i.get("note"):
            parts.append(i["note"])
        if i.get("error") and status >= 400:
            parts.append(str(i["error"])[:200])
        parts.append(f"{total:.2f}s")
        self.engine.log(" · ".join(parts))

    # --- GET -----------------------------------------------------------------------------

    def _health(self) -> int:
        e = self.engine
        self._send_json(
            200,
            {
                "status": "stopping" if e.stopping.is_set() else "ok",
                "model": e.name,
                "busy": e.lock.busy,
                "queued": e.lock.waiting,
                "requests": e.requests,
                "prompt_cache": e.cache.stats(),
            },
        )
        return 200

    def _model_doc(self) -> Dict[str, Any]:
        e = self.engine
        return {
            "id": e.name,
            "object": "model",
            "created": e.created,
            "owned_by": "v4flash",
            "context_length": int(e.model.ctx),
        }

    def _models(self) -> int:
        self._send_json(200, {"object": "list", "data": [self._model_doc()]})
        return 200

    def _model(self) -> int:
        name = self._route()[len("/models/") :]
        if name != self.engine.name:
            raise ApiError(404, f"no model {name!r}; this server runs {self.engine.name!r}")
        self._send_json(200, self._model_doc())
        return 200

    # --- the engine turn -----------------------------------------------------------------

    def _turn(self, param: str, stream: bool, body) -> Any:
        """Waits for the engine (False when the client left or the server stops), runs
        ``body(cancel)`` holding it. The engine's refusal of the input (``ValueError``, e.g. a
        token id out of the vocabulary) is a 400 about ``param``."""
        e = self.engine
        q0 = time.perf_counter()
        tick = None
        if stream:
            tick = lambda: self._chunk(b": queued\n\n")  # noqa: E731
        ok = e.lock.acquire(give_up=lambda: self._gone() or e.stopping.is_set(), tick=tick)
        self._info["queue_s"] = time.perf_counter() - q0
        if not ok:
            if e.stopping.is_set():
                raise ApiError(503, "the server is shutting down", kind="server_error")
            raise _Gone()
        try:
            return body(lambda: e.stopping.is_set() or self._gone())
        except ValueError as err:
            raise ApiError(400, str(err), param=param) from None
        finally:
            e.lock.release()

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(data), data))

    def _event(self, doc: Any) -> None:
        self._chunk(b"data: " + json.dumps(doc, ensure_ascii=False).encode("utf-8") + b"\n\n")

    def _end_sse(self) -> None:
        self._chunk(b"data: [DONE]\n\n")
        self._write(b"0\r\n\r\n")

    def _streamed(self, param: str, run) -> Tuple[Optional[Dict[str, Any]], int]:
        """Runs a streamed request (the headers are out, so errors become an error event
        that ends the stream): ``(end, 200)`` or ``(None, status)``."""
        try:
            end = self._turn(param, True, run)
            self._finished(end, True)
            return end, 200
        except _Gone:
            raise
        except ApiError as err:
            error = err
        except Exception as err:  # an engine failure (e.g. a read error): say it, go on
            self.engine.log(f"error during {self.path}:\n{traceback.format_exc()}")
            error = ApiError(500, f"internal error: {err}", kind="server_error")
        self._info["error"] = error.message
        self._event(error.body())
        self._end_sse()
        return None, error.status

    def _finished(self, end: Dict[str, Any], stream: bool) -> None:
        self._info.update(
            usage=end["usage"], timings=end["timings"], finish=end["finish_reason"], stream=stream
        )
        if end["finish_reason"] == "cancelled":
            if self.engine.stopping.is_set():
                raise ApiError(503, "the server is shutting down", kind="server_error")
            raise _Gone()

    # --- POST /v1/chat/completions -------------------------------------------------------

    def _chat(self) -> int:
        e = self.engine
        body = self._read_json()
        _model_field(body)
        messages = _messages(body)
        stream, include_usage = _stream_args(body)
        kw = _sampling_args(body, e, e.max_tokens)
        tools, tool_choice = _tools(body)
        thinking, effort = _thinking(body)
        try:
            job = prepare_chat(
                e.model,
                messages,
                tools=tools,
                tool_choice=tool_choice,
                response_format=_response_format(body),
                thinking=thinking,
                reasoning_effort=effort,
                cache=e.cache,
                **kw,
            )
        except ContextLengthError as err:
            code = "context_length_exceeded"
            raise ApiError(400, str(err), param="messages", code=code) from None
        except ValueError as err:
            raise ApiError(400, str(err)) from None
        rid = "chatcmpl-" + uuid.uuid4().hex
        head = {"id": rid, "created": int(time.time()), "model": e.name}
        head["system_fingerprint"] = f"v4flash-{__version__}"
        if not stream:
            r = self._turn("messages", False, lambda cancel: collect_chat(job, cancel))
            self._finished(
                {"usage": r.usage, "timings": r.timings, "finish_reason": r.finish_reason}, False
            )
            msg: Dict[str, Any] = {"role": "assistant", "content": r.content}
            if thinking:
                msg["reasoning_content"] = r.reasoning
            if r.tool_calls:
                msg["tool_calls"] = r.tool_calls
                msg["content"] = r.content or None
            doc = dict(
                head,
                object="chat.completion",
                choices=[
                    {
                        "index": 0,
                        "message": msg,
                        "finish_reason": r.finish_reason,
                        "logprobs": None,
                    }
                ],
                usage=usage_json(r.usage),
            )
            self._send_json(200, doc)
            return 200

        self._start_sse()
        head["object"] = "chat.completion.chunk"

        def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> None:
            self._event(
                dict(
                    head,
                    choices=[
                        {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
                    ],
                )
            )

        def run(cancel) -> Dict[str, Any]:
            chunk({"role": "assistant", "content": ""})
            end: Dict[str, Any] = {}
            with contextlib.closing(run_job(job, cancel)) as events:
                for kind, value in events:
                    if kind == "reasoning":
                        chunk({"reasoning_content": value})
                    elif kind == "content":
                        chunk({"content": value})
                    elif kind == "tool_call":
                        chunk({"tool_calls": [value]})
                    elif kind == "end":
                        end = value
            return end

        end, status = self._streamed("messages", run)
        if end is None:
            return status
        chunk({}, end["finish_reason"])
        if include_usage:
            self._event(dict(head, choices=[], usage=usage_json(end["usage"])))
        self._end_sse()
        return 200

    # --- POST /v1/completions ------------------------------------------------------------

    def _completions(self) -> int:
        e = self.engine
        body = self._read_json()
        _model_field(body)
        stream, include_usage = _stream_args(body)
        kw = _sampling_args(body, e, 16)  # OpenAI's default for completions
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        ok_ids = isinstance(prompt, list) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in prompt
        )
        if not isinstance(prompt, str) and not ok_ids:
            raise ApiError(
                400, "'prompt' must be a string or a list of token ids (one prompt)", "prompt"
            )
        if body.get("suffix"):
            raise ApiError(400, "'suffix' is not supported", param="suffix")
        if body.get("logprobs") is not None:
            raise ApiError(400, "'logprobs' is not supported", param="logprobs")
        best_of = body.get("best_of")
        if best_of not in (None, 1):
            raise ApiError(400, "'best_of' must be 1", param="best_of")
        echo = _opt(body, "echo", (bool,), "true or false") or False
        try:
            job = prepare_completion(e.model, prompt, cache=e.cache, **kw)
        except ContextLengthError as err:
            raise ApiError(400, str(err), param="prompt", code="context_length_exceeded") from None
        except ValueError as err:
            raise ApiError(400, str(err), param="prompt") from None
        echoed = ""
        if echo:
            echoed = prompt if isinstance(prompt, str) else e.tok.decode(job.prompt)
        rid = "cmpl-" + uuid.uuid4().hex
        head = {"id": rid, "object": "text_completion", "created": int(time.time())}
        head["model"] = e.name

        def choice(text: str, finish: Optional[str]) -> Dict[str, Any]:
            return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

        if not stream:
            r = self._turn("prompt", False, lambda cancel: collect_completion(job, cancel))
            self._finished(
                {"usage": r.usage, "timings": r.timings, "finish_reason": r.finish_reason}, False
            )
            doc = dict(
                head, choices=[choice(echoed + r.text, r.finish_reason)], usage=usage_json(r.usage)
            )
            self._send_json(200, doc)
            return 200

        self._start_sse()

        def run(cancel) -> Dict[str, Any]:
            if echoed:
                self._event(dict(head, choices=[choice(echoed, None)]))
            end: Dict[str, Any] = {}
            with contextlib.closing(run_job(job, cancel)) as events:
                for kind, value in events:
                    if kind == "text":
                        self._event(dict(head, choices=[choice(value, None)]))
                    elif kind == "end":
                        end = value
            return end

        end, status = self._streamed("prompt", run)
        if end is None:
            return status
        self._event(dict(head, choices=[choice("", end["finish_reason"])]))
        if include_usage:
            self._event(dict(head, choices=[], usage=usage_json(end["usage"])))
        self._end_sse()
        return 200


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never blocks exit
    allow_reuse_address = True
    engine: Engine

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, _Gone)):
            return  # a client that went away between requests
        self.engine.log(f"error on a connection from {client_address}:\n{traceback.format_exc()}")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"


class _Server6(Server):
    address_family = socket.AF_INET6


def make_server(
    model: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    name: Optional[str] = None,
    api_key: Optional[str] = None,
    max_tokens: int = 4096,
    cache_sessions: int = 4,
    log: Optional[Callable[[str], None]] = None,
) -> Server:
    """A bound, not yet serving, server (call ``serve_forever``; ``shutdown`` +
    ``server_close`` to stop). ``port=0`` picks a free port (see ``server.url``)."""
    engine = Engine(
        model,
        name=name or model.path.name,
        api_key=api_key,
        max_tokens=max_tokens,
        cache_sessions=cache_sessions,
        log=log,
    )
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    cls = _Server6 if ":" in host else Server
    srv = cls((host, port), handler)
    srv.engine = engine
    return srv


def stop(srv: Server, grace: float = 10.0) -> bool:
    """Stops a server that runs in another thread: running generations end at their next
    token, queued requests get 503; True when every request finished within ``grace``."""
    srv.engine.stopping.set()
    srv.shutdown()
    srv.server_close()
    return srv.engine.wait_idle(grace)
