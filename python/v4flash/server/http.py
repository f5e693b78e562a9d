"""The glue between the transport (``transport``: connections, limits, deadlines) and the
dialects (``openai``, ``anthropic``, ``responses``, ``ops``): routing, the checks made on a
request's head (``guard``: API key, Host, Origin, content type), CORS preflights, JSON and
server-sent events, keep-alive pings, the request log and the metrics.

A dialect's endpoint is a function of an :class:`Exchange` listed in a route table; it reads
and writes only through it (:meth:`Exchange.read_json`, :meth:`send_json`, :meth:`start_sse` /
:meth:`event` / :meth:`chunk` / :meth:`end_chunks`, :meth:`turn` for the engine), and raises
``ApiError`` for anything wrong, which is answered in the route's own error shape.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from .. import __version__
from .engine import Engine, Gone, ShuttingDown
from .errors import ApiError
from .guard import Guard
from .metrics import Metrics
from .transport import Gone as TransportGone
from .transport import HttpServer, Limits, Request, Responder, safe

ErrorBody = Callable[[ApiError], Dict[str, Any]]
PING_S = 10.0  # a quiet stream gets a keep-alive ping this often (--sse-ping)


class Route(NamedTuple):
    """An endpoint: ``endpoint(exchange)`` answers and returns the status; errors are written
    as ``error_body`` makes them (the dialect's shape). ``open``: no API key needed, and no
    line in the log (a health check, the web page)."""

    endpoint: Callable[[Exchange], int]
    error_body: ErrorBody
    open: bool = False


def as_api_error(exc: BaseException, engine: Engine, where: str) -> ApiError:
    """An engine outcome or a bug as the error to answer (a bug is logged with its trace)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ShuttingDown):
        return ApiError(503, "the server is shutting down", kind="server_error")
    engine.log(f"{where}:\n{traceback.format_exc()}")
    return ApiError(500, f"internal error: {exc}", kind="server_error")


def normalize(path: str) -> str:
    """A request path as the route tables name it: ``/v1/x`` → ``/x``, no trailing slash."""
    if len(path) > 1:
        path = path.rstrip("/")
    return path[3:] if path.startswith("/v1/") else path


class Exchange:
    """One request, as an endpoint sees it; ``info`` is what its log line tells."""

    def __init__(self, app: App, req: Request, resp: Responder):
        self.app = app
        self.engine = app.engine
        self.req = req
        self.resp = resp
        self.path = req.target
        self.route = normalize(req.path)
        self.method = "GET" if req.method == "HEAD" else req.method
        self.info: Dict[str, Any] = {}
        self.ping_frame = b": ping\n\n"
        self.last_write = time.monotonic()
        self._write_lock = threading.Lock()

    # --- reading -------------------------------------------------------------------------
    def header(self, name: str) -> str:
        return self.req.header(name)

    def query(self) -> Dict[str, str]:
        from urllib.parse import parse_qsl

        return dict(parse_qsl(self.req.query))

    def read_json(self) -> Dict[str, Any]:
        """The body as a JSON object; the raw bytes are let go at once (a queued request
        keeps only what it needs)."""
        raw, self.req.body = self.req.body, b""
        if not raw:
            raise ApiError(400, "a JSON body is required")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ApiError(400, f"the body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the body must be a JSON object")
        return body

    def gone(self) -> bool:
        return self.req.gone.is_set()

    # --- writing -------------------------------------------------------------------------
    def send_json(self, status: int, doc: Any, headers: Optional[Dict[str, str]] = None) -> None:
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
        self.send(status, data, "application/json; charset=utf-8", headers)

    def send(
        self,
        status: int,
        data: bytes,
        ctype: str,
        headers: Optional[Dict[str, str]] = None,
    ) -> None:
        try:
            self.resp.send(status, data, ctype, list((headers or {}).items()))
        except TransportGone:
            raise Gone() from None

    def start_sse(self, ping: Optional[bytes] = None) -> None:
        """Starts a stream of server-sent events; while it is quiet for ``--sse-ping``
        seconds (a long prefill, a wait in the queue), ``ping`` is sent (an SSE comment by
        default; Anthropic's stream has its own ``ping`` event)."""
        if ping is not None:
            self.ping_frame = ping
        try:
            self.resp.start_stream(200, "text/event-stream; charset=utf-8")
        except TransportGone:
            raise Gone() from None
        self.app.pinger.add(self)

    def chunk(self, data: bytes) -> None:
        """Part of a stream. Once the client is gone nothing is written; the run notices it
        between tokens (its ``cancel``) and ends there, so the log still tells how far the
        answer got."""
        with self._write_lock:
            if self.gone():
                return
            try:
                self.resp.write(data)
            except TransportGone:
                self.req.gone.set()
                return
            self.last_write = time.monotonic()

    def event(self, doc: Any, name: Optional[str] = None) -> None:
        """One event holding ``doc`` as JSON (``data:``), of type ``name`` if given."""
        head = b"event: %s\n" % name.encode("utf-8") if name else b""
        data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
        self.chunk(head + b"data: " + data + b"\n\n")

    def ping_if_quiet(self, every: float) -> None:
        if time.monotonic() - self.last_write >= every and not self.gone():
            with contextlib.suppress(Gone):
                self.chunk(self.ping_frame)

    def end_chunks(self) -> None:
        """The end of a streamed body."""
        self.app.pinger.remove(self)
        with self._write_lock:
            with contextlib.suppress(TransportGone):
                self.resp.end()

    # --- the engine turn -----------------------------------------------------------------
    def turn(self, param: str, stream: bool, body: Callable[[Callable[[], bool]], Any]) -> Any:
        """Runs ``body(cancel)`` holding the engine (``Engine.turn``). The engine's refusal of
        the input (``ValueError``, e.g. a token id out of the vocabulary) is a 400 about
        ``param``."""
        q0 = time.perf_counter()

        def timed(cancel: Callable[[], bool]) -> Any:
            self.info["queue_s"] = time.perf_counter() - q0
            try:
                return body(cancel)
            except ValueError as err:
                raise ApiError(400, str(err), param=param) from None

        try:
            return self.engine.turn(timed, self.gone)
        finally:
            self.info.setdefault("queue_s", time.perf_counter() - q0)

    def finished(self, end: Dict[str, Any], stream: bool) -> None:
        """Notes a run's end for the log; a cancelled run raises why it was cancelled."""
        self.info.update(
            usage=end["usage"], timings=end["timings"], finish=end["finish_reason"], stream=stream
        )
        if end["finish_reason"] == "cancelled":
            raise self.engine.cancelled()


class Pinger:
    """One thread for the whole server that pings every quiet event stream."""

    def __init__(self, every: float):
        self.every = every
        self._streams: set[Exchange] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def add(self, x: Exchange) -> None:
        with self._lock:
            self._streams.add(x)
            if self._thread is None and self.every > 0:
                self._thread = threading.Thread(target=self._run, name="v4flash-ping", daemon=True)
                self._thread.start()

    def remove(self, x: Exchange) -> None:
        with self._lock:
            self._streams.discard(x)

    def _run(self) -> None:
        tick = min(1.0, self.every / 4)
        while not self._stop.wait(tick):
            with self._lock:
                streams = list(self._streams)
            for x in streams:
                x.ping_if_quiet(self.every)

    def stop(self) -> None:
        self._stop.set()


class App:
    """Routes requests to the dialects' endpoints; the transport calls :meth:`handle` on a
    worker thread, :meth:`precheck` on the event loop."""

    def __init__(
        self,
        engine: Engine,
        routes: Dict[Tuple[str, str], Route],
        default_error: ErrorBody,
        guard: Guard,
        ping_every: float = PING_S,
    ):
        self.engine = engine
        self.routes = routes
        self.default_error = default_error
        self.guard = guard
        self.metrics = Metrics()
        self.pinger = Pinger(ping_every)

    def find(self, method: str, route: str) -> Route:
        """The route of a request: exact, else a ``/prefix/*`` one; 405 / 404 else."""
        r = self.routes.get((method, route))
        if r is None:  # /models/{id}: an id may hold slashes (a repo id)
            r = next(
                (
                    v
                    for (m, p), v in self.routes.items()
                    if m == method and p.endswith("/*") and route.startswith(p[:-1])
                ),
                None,
            )
        if r is None:
            others = sorted({m for (m, p) in self.routes if p == route})
            if others:
                raise ApiError(405, f"use {' or '.join(others)} for {route}")
            raise ApiError(404, f"no such endpoint: {method} {route}")
        return r

    def _route_of(self, req: Request) -> Optional[Route]:
        method = "GET" if req.method in ("HEAD", "OPTIONS") else req.method
        try:
            return self.find(method, normalize(req.path))
        except ApiError:
            if req.method == "OPTIONS":
                for m in ("POST", "DELETE"):
                    with contextlib.suppress(ApiError):
                        return self.find(m, normalize(req.path))
            return None

    # --- the transport's hooks -----------------------------------------------------------
    def precheck(self, req: Request) -> Optional[Tuple[int, str]]:
        r = self._route_of(req)
        return self.guard.refusal(req, bool(r and r.open))

    def error_bytes(self, status: int, message: str, req: Optional[Request]) -> bytes:
        r = self._route_of(req) if req is not None else None
        render = r.error_body if r is not None else self.default_error
        kind = "server_error" if status >= 500 else "invalid_request_error"
        code = "auth" if status == 401 else None
        doc = render(ApiError(status, message, code=code, kind=kind))
        if req is not None:
            self._log(req, status, {"error": message}, 0.0)
        return json.dumps(doc).encode()

    def cors_headers(self, req: Optional[Request]) -> List[Tuple[str, str]]:
        return self.guard.cors_headers(req)

    def handle(self, req: Request, resp: Responder) -> None:
        t0 = time.perf_counter()
        x = Exchange(self, req, resp)
        # a health check is not logged (nor is a wrong method on its path)
        logged = not any(r.open and p == x.route for (_, p), r in self.routes.items())
        status, render = 200, self.default_error
        try:
            with self.engine.active():
                if req.method == "OPTIONS":
                    status = 204
                    resp.send(204, b"", headers=self.guard.preflight_headers(req))
                    return
                r = self.find(x.method, x.route)
                render = r.error_body
                if not r.open and not self.engine.ready.is_set():
                    raise ApiError(
                        503,
                        "the model is still loading; /health says when it is ready",
                        kind="server_error",
                    )
                status = r.endpoint(x) or 200
        except (Gone, TransportGone, ConnectionError):
            status = 499  # nginx's "client closed request"
            req.gone.set()
        except Exception as exc:  # ApiError, ShuttingDown, or a bug: say so, keep serving
            e = as_api_error(exc, self.engine, f"internal error on {req.method} {safe(x.path)}")
            status = e.status
            x.info.setdefault("error", e.message)
            headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
            if not resp.started:
                resp.close_after()  # an error ends the connection: the client starts afresh
                with contextlib.suppress(Gone, TransportGone):
                    x.send_json(e.status, render(e), headers)
            else:
                req.gone.set()  # a broken stream: end the connection
        finally:
            self.pinger.remove(x)
        if logged:
            self._log(req, status, x.info, time.perf_counter() - t0)

    def _log(self, req: Request, status: int, i: Dict[str, Any], total: float) -> None:
        self.metrics.request(
            normalize(req.path), status, i.get("usage"), dict(i.get("timings") or {}, **_q(i))
        )
        parts = [f"{req.method} {safe(req.target)} {status}"]
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
            sp = t.get("speculation")
            if sp:
                parts.append(
                    f"drafts {sp['accepted']}/{sp['drafted']} in {sp['verifies']} verifies "
                    f"({sp['saved_s']:+.2f}s)"
                )
        elif i.get("note"):
            parts.append(i["note"])
        if i.get("error") and status >= 400:
            parts.append(safe(str(i["error"]), 200))
        parts.append(f"{total:.2f}s")
        self.engine.log(" · ".join(parts))


def _q(i: Dict[str, Any]) -> Dict[str, Any]:
    return {"queue_s": i.get("queue_s", 0)}


class Server:
    """The bound server: ``serve_forever()`` serves on the calling thread until ``stop``."""

    def __init__(self, app: App, host: str, port: int, limits: Limits):
        self.app = app
        self.engine = app.engine
        self.http = HttpServer(
            app.handle,
            host,
            port,
            limits,
            precheck=app.precheck,
            error_body=app.error_bytes,
            cors_headers=app.cors_headers,
            log=app.engine.log,
        )
        self.url = self.http.url
        self._done = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serves (if ``start`` did not already) and waits until ``shutdown``."""
        self.start()
        while not self._done.wait(poll_interval):
            pass

    def start(self) -> Server:
        """Serves on the transport's own thread (so that the command's main thread can load
        the model meanwhile); at most once."""
        if self.http.loop is None:
            self.http.start()
        return self

    def shutdown(self, grace: float = 10.0) -> bool:
        self.engine.stopping.set()
        self.app.pinger.stop()
        clean = self.http.stop(grace)
        if self.engine.cache is not None:
            self.engine.cache.flush()  # the prompt cache's files asked for are written
        self._done.set()
        return clean and self.engine.wait_idle(0.1)

    @property
    def version(self) -> str:
        return __version__
