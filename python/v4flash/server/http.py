"""The transport: HTTP/1.1 on the standard library's ``ThreadingHTTPServer``, one thread per
connection.

It parses requests and enforces the limits (a JSON body with a Content-Length, at most
``MAX_BODY`` bytes), checks the API key, routes a request to its dialect's endpoint, writes
JSON answers and server-sent events (chunked), notices a client that went away (between
tokens and while queued), answers every error in the shape of the dialect that owns the
route, and logs one line per request. It knows no API: the dialects (``openai``, …) are
functions of an :class:`Exchange` (this handler) listed in a route table. Why the standard
library: no runtime dependency, SSE is a few lines of chunked writes, and the engine runs one
request at a time anyway (``engine``), so an async stack would buy nothing.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import select
import socket
import sys
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple
from urllib.parse import urlsplit

from .. import __version__
from .engine import Engine, Gone, ShuttingDown
from .errors import ApiError

MAX_BODY = 32 << 20  # bytes of JSON per request

ErrorBody = Callable[[ApiError], Dict[str, Any]]


class Route(NamedTuple):
    """An endpoint: ``endpoint(exchange)`` answers and returns the status; errors are written
    as ``error_body`` makes them (the dialect's shape). ``open``: no API key needed, and no
    line in the log (a health check)."""

    endpoint: Callable[[Exchange], int]
    error_body: ErrorBody
    open: bool = False


def peer_closed(sock: socket.socket) -> bool:
    """True when the client has closed its side (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def as_api_error(exc: BaseException, engine: Engine, where: str) -> ApiError:
    """An engine outcome or a bug as the error to answer (a bug is logged with its trace)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ShuttingDown):
        return ApiError(503, "the server is shutting down", kind="server_error")
    engine.log(f"{where}:\n{traceback.format_exc()}")
    return ApiError(500, f"internal error: {exc}", kind="server_error")


class Exchange(BaseHTTPRequestHandler):
    """One connection's requests; what an endpoint reads and writes through.

    For endpoints: :meth:`read_json`, :meth:`send_json`, :meth:`start_sse` / :meth:`event` /
    :meth:`chunk` / :meth:`end_chunks`, :meth:`turn` (the engine, in arrival order),
    :meth:`finished` (a run's end, for the log), ``engine``, ``route`` and ``info`` (what the
    request's log line tells)."""

    protocol_version = "HTTP/1.1"
    server_version = f"v4flash/{__version__}"
    timeout = 120  # seconds a connection may stay silent (idle keep-alive, slow client)
    disable_nagle_algorithm = True  # small SSE writes go out at once (no ~40 ms ACK waits)
    # set on the subclass that make_server builds
    engine: Engine
    routes: Dict[Tuple[str, str], Route]
    error_body: ErrorBody  # for errors outside any route (bad request line, 404, …)

    # --- writing -------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib name)
        pass  # one line per request comes from _log_request instead

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        self.engine.log(f"{self.address_string()} {format % args}")

    def send_error(self, code: int, message: Optional[str] = None, explain: Any = None) -> None:
        """Protocol-level errors (bad request line, unknown method, …) as JSON too."""
        short = self.responses.get(code, ("error", ""))[0]
        self.close_connection = True
        with contextlib.suppress(Gone):
            self.send_json(code, self.error_body(ApiError(code, message or short)))

    def send_json(self, status: int, doc: Any, headers: Optional[Dict[str, str]] = None) -> None:
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
            raise Gone() from None

    def _error(self, e: ApiError, render: ErrorBody) -> None:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        self.send_json(e.status, render(e), headers)

    # --- server-sent events ----------------------------------------------------------------

    def start_sse(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self._write(b"%x\r\n%s\r\n" % (len(data), data))

    def event(self, doc: Any, name: Optional[str] = None) -> None:
        """One event holding ``doc`` as JSON (``data:``), of type ``name`` if given
        (``event:``; OpenAI's streams name none)."""
        head = b"event: %s\n" % name.encode("utf-8") if name else b""
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
        self.chunk(head + b"data: " + data + b"\n\n")

    def end_chunks(self) -> None:
        """The end of a streamed body."""
        self._write(b"0\r\n\r\n")

    # --- reading -------------------------------------------------------------------------

    def gone(self) -> bool:
        return peer_closed(self.connection)

    def read_json(self) -> Dict[str, Any]:
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
            raise Gone()
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

    def _find(self, method: str) -> Route:
        """The route of this request: exact, else a ``/prefix/*`` one; 405 / 404 else."""
        r = self.routes.get((method, self.route))
        if r is None:  # /models/{id}: an id may hold slashes (a repo id)
            r = next(
                (
                    v
                    for (m, p), v in self.routes.items()
                    if m == method and p.endswith("/*") and self.route.startswith(p[:-1])
                ),
                None,
            )
        if r is None:
            other = "POST" if method == "GET" else "GET"
            if (other, self.route) in self.routes:
                raise ApiError(405, f"use {other} for {self.path}")
            raise ApiError(404, f"no such endpoint: {method} {self.path}")
        return r

    # --- dispatch ------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        t0 = time.perf_counter()
        self.route = self._route()
        self.info: Dict[str, Any] = {}
        self._body_read = False
        status, render = 200, self.error_body
        # a health check is not logged (nor is a wrong method on its path)
        logged = not any(r.open and p == self.route for (_, p), r in self.routes.items())
        try:
            with self.engine.active():
                r = self._find(method)
                render = r.error_body
                if not r.open and not self._authorized():
                    raise ApiError(
                        401, "missing or wrong API key (Authorization: Bearer KEY)", code="auth"
                    )
                status = r.endpoint(self) or 200
        except (Gone, ConnectionError):
            status = 499  # nginx's "client closed request"
            self.close_connection = True
        except Exception as exc:  # ApiError, ShuttingDown, or a bug: say so, keep serving
            e = as_api_error(exc, self.engine, f"internal error on {method} {self.path}")
            status = e.status
            if isinstance(exc, (ApiError, ShuttingDown)):
                self.info.setdefault("error", e.message)
            else:
                self.close_connection = True
            if method == "POST" and not self._body_read:
                self.close_connection = True  # the unread body would be taken for a request
            with contextlib.suppress(Gone):
                self._error(e, render)
        if logged:
            self._log_request(method, status, time.perf_counter() - t0)

    # --- the engine turn -----------------------------------------------------------------

    def turn(self, param: str, stream: bool, body: Callable[[Callable[[], bool]], Any]) -> Any:
        """Runs ``body(cancel)`` holding the engine (``Engine.turn``), a streamed request
        keeping its connection alive while it waits. The engine's refusal of the input
        (``ValueError``, e.g. a token id out of the vocabulary) is a 400 about ``param``."""
        q0 = time.perf_counter()
        tick = (lambda: self.chunk(b": queued\n\n")) if stream else None

        def timed(cancel: Callable[[], bool]) -> Any:
            self.info["queue_s"] = time.perf_counter() - q0
            try:
                return body(cancel)
            except ValueError as err:
                raise ApiError(400, str(err), param=param) from None

        try:
            return self.engine.turn(timed, self.gone, tick)
        finally:
            self.info.setdefault("queue_s", time.perf_counter() - q0)

    def finished(self, end: Dict[str, Any], stream: bool) -> None:
        """Notes a run's end for the log; a cancelled run raises why it was cancelled."""
        self.info.update(
            usage=end["usage"], timings=end["timings"], finish=end["finish_reason"], stream=stream
        )
        if end["finish_reason"] == "cancelled":
            raise self.engine.cancelled()

    def _log_request(self, method: str, status: int, total: float) -> None:
        i = self.info
        parts = [f"{method} {self.path} {status}"]
        if "usage" in i:
            u = i["usage"]
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


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never blocks exit
    allow_reuse_address = True
    engine: Engine

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, Gone)):
            return  # a client that went away between requests
        self.engine.log(f"error on a connection from {client_address}:\n{traceback.format_exc()}")

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = f"[{host}]" if ":" in str(host) else host
        return f"http://{host}:{port}"


class Server6(Server):
    address_family = socket.AF_INET6
