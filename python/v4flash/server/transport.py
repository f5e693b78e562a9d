"""The HTTP/1.1 transport of ``v4flash serve``: one asyncio event loop owns every connection;
request handlers run on a bounded pool of threads (they wait on the engine).

Why not the standard library's ``ThreadingHTTPServer`` (a thread per connection, a timeout
that restarts with every byte) or uvicorn (no deadline for receiving a request: its keep-alive
timeout is reset by every byte, the slowloris hole its tracker has carried since 2018): this
server sits next to a model that was given a RAM budget, on a machine whose cores the model
uses, and must stay up while some clients are slow, abusive or gone. So every resource a client
can hold is bounded here:

- **connections**: at most ``max_connections``; when full, a new connection evicts the one that
  has waited longest for its request to arrive (a slow client), else it is refused;
- **time**: a request's line, headers and body must arrive within ``header_timeout`` /
  ``body_timeout`` of its first byte (a deadline, not an idle timer); an idle keep-alive
  connection is closed after ``idle_timeout``; a response the client does not read for
  ``write_timeout`` ends the request (the client counts as gone);
- **size**: the request head at most ``max_header_bytes``, the body ``max_body_bytes``
  (413 before a byte of it is read), bytes a client sends while its request runs
  ``max_pending_bytes``;
- **work**: handlers run on ``workers`` threads; a request beyond them waits in a queue of
  ``max_queue``, beyond which it gets a 503 at once.

The handler sees a ``Request`` (its body read in full, nothing else left to parse) and answers
through a ``Responder`` (whole responses, or a stream: chunked for HTTP/1.1, close-delimited for
HTTP/1.0). ``Request.gone`` is set as soon as the peer closes its side, whatever it sent before
(a stray CRLF or a pipelined request no longer hides a departure), so the engine stops working
for nobody. A ``precheck`` runs on the head alone, before the body is read: that is where the
app refuses unauthorised, cross-origin or non-JSON requests without reading their bodies.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional, Tuple

REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


@dataclass
class Limits:
    max_connections: int = 512
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    idle_timeout: float = 60.0
    write_timeout: float = 60.0
    max_header_bytes: int = 64 << 10
    max_body_bytes: int = 8 << 20
    max_pending_bytes: int = 64 << 10
    workers: int = 32
    max_queue: int = 64


@dataclass
class Request:
    method: str
    target: str  # as sent: path and query
    path: str
    query: str
    version: str  # "HTTP/1.1" | "HTTP/1.0"
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    peer: tuple[str, int]
    body: bytes = b""
    gone: threading.Event = field(default_factory=threading.Event)

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)


class Gone(Exception):
    """The client left (or stopped reading): nothing more can be sent."""


def _status_line(version: str, status: int) -> bytes:
    return f"{version} {status} {REASONS.get(status, 'Unknown')}\r\n".encode()


def _head(version: str, status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [_status_line(version, status)]
    for k, v in headers:
        lines.append(f"{k}: {v}\r\n".encode("latin-1", "replace"))
    lines.append(b"\r\n")
    return b"".join(lines)


class Responder:
    """Answers one request from a handler thread. Thread-safe towards the loop: every write is
    handed to the event loop and waited for (so a client that stops reading ends the request
    after ``write_timeout`` instead of growing a buffer)."""

    def __init__(self, conn: _Conn, req: Request, extra_headers: list[tuple[str, str]]):
        self._conn = conn
        self._req = req
        self._extra = extra_headers
        self.status: int | None = None
        self.sent_bytes = 0
        self._streaming = False
        self._chunked = False
        self._ended = False

    @property
    def started(self) -> bool:
        return self.status is not None

    def close_after(self) -> None:
        """The connection ends after this response (``Connection: close``)."""
        self._conn.close_after = True

    def _headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        out = list(headers) + list(self._extra)
        if self._conn.close_after:
            out.append(("Connection", "close"))
        return out

    def send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """A whole response."""
        if self.started:
            raise RuntimeError("response already started")
        self.status = status
        hs = [("Content-Type", content_type)] if body or status not in (204, 304) else []
        hs.append(("Content-Length", str(len(body))))
        hs += headers or []
        head = _head(self._req.version, status, self._headers(hs))
        payload = head if self._req.method == "HEAD" else head + body
        self._conn.write_from_thread(payload)
        self.sent_bytes += len(body)
        self._ended = True

    def start_stream(
        self,
        status: int = 200,
        content_type: str = "text/event-stream",
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """Starts a streamed response (chunked on HTTP/1.1; on HTTP/1.0 the body ends when the
        connection closes, as RFC 9112 requires: no chunked coding for 1.0 clients)."""
        if self.started:
            raise RuntimeError("response already started")
        self.status = status
        self._streaming = True
        hs = [("Content-Type", content_type), ("Cache-Control", "no-cache")]
        if self._req.version == "HTTP/1.1":
            self._chunked = True
            hs.append(("Transfer-Encoding", "chunked"))
        else:
            self._conn.close_after = True
        hs += headers or []
        self._conn.write_from_thread(_head(self._req.version, status, self._headers(hs)))

    def write(self, data: bytes) -> None:
        """Part of a streamed response. Raises ``Gone`` when the client left or stopped
        reading."""
        if not self._streaming or self._ended:
            raise RuntimeError("no stream started")
        if not data:
            return
        if self._req.gone.is_set():
            raise Gone()
        frame = b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data
        self._conn.write_from_thread(frame)
        self.sent_bytes += len(data)

    def end(self) -> None:
        if self._streaming and not self._ended:
            self._ended = True
            if self._chunked:
                try:
                    self._conn.write_from_thread(b"0\r\n\r\n")
                except Gone:
                    pass


class _Conn:
    """One connection, owned by the loop."""

    def __init__(self, server: HttpServer, reader, writer):
        self.server = server
        self.reader: asyncio.StreamReader = reader
        self.writer: asyncio.StreamWriter = writer
        peer = writer.get_extra_info("peername") or ("?", 0)
        self.peer = (str(peer[0]), int(peer[1]))
        self.waiting_since: float | None = time.monotonic()  # waiting for a request
        self.close_after = False
        self.current: Request | None = None
        self.closed = False
        self.pending = bytearray()  # bytes read, not consumed yet

    # --- writes from handler threads ------------------------------------------------------
    def write_from_thread(self, data: bytes) -> None:
        loop = self.server.loop
        if self.closed or loop is None:
            raise Gone()
        fut = asyncio.run_coroutine_threadsafe(self._write(data), loop)
        try:
            ok = fut.result(self.server.limits.write_timeout + 5)
        except Exception:  # noqa: BLE001 - any failure to write means the client is gone
            ok = False
        if not ok:
            if self.current is not None:
                self.current.gone.set()
            raise Gone()

    async def _write(self, data: bytes) -> bool:
        if self.closed or self.writer.is_closing():
            return False
        try:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), self.server.limits.write_timeout)
            return True
        except (TimeoutError, OSError, ConnectionError):
            self.abort()
            return False

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            if self.current is not None:
                self.current.gone.set()
            try:
                self.writer.transport.abort()
            except Exception:  # noqa: BLE001
                pass

    # --- reading (every byte goes through ``pending``) --------------------------------------
    async def _fill(self) -> bool:
        """Reads what the socket has into ``pending``; False at EOF."""
        data = await self.reader.read(65536)
        if not data:
            return False
        self.pending += data
        return True

    async def _until(self, sep: bytes, limit: int) -> bytes | None:
        """Bytes up to and including ``sep`` (None at EOF); ``_BadRequest(431)`` past ``limit``."""
        start = 0
        while True:
            i = self.pending.find(sep, start)
            if i >= 0:
                out = bytes(self.pending[: i + len(sep)])
                del self.pending[: i + len(sep)]
                return out
            if len(self.pending) > limit:
                raise _BadRequest(431, "the request head is too large")
            start = max(0, len(self.pending) - len(sep) + 1)
            if not await self._fill():
                return None

    async def _exactly(self, n: int) -> bytes | None:
        while len(self.pending) < n:
            if not await self._fill():
                return None
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    # --- the request loop (on the event loop) -------------------------------------------------
    async def serve(self) -> None:
        lim = self.server.limits
        try:
            while not self.closed:
                self.waiting_since = time.monotonic()
                if not self.pending:
                    try:
                        if not await asyncio.wait_for(self._fill(), lim.idle_timeout):
                            return
                    except TimeoutError:
                        return
                try:
                    req = await asyncio.wait_for(self._read_head(), lim.header_timeout)
                except TimeoutError:
                    await self._refuse(408, "the request headers did not arrive in time")
                    return
                except _BadRequest as e:
                    await self._refuse(e.status, e.message)
                    return
                if req is None:
                    return
                self.waiting_since = None
                if not await self._run(req):
                    return
                if self.close_after or self.closed:
                    return
        except (ConnectionError, OSError):
            pass
        finally:
            self.abort()
            self.server.forget(self)

    async def _read_head(self) -> Request | None:
        lim = self.server.limits
        # leading blank lines before a request line are allowed (RFC 9112 2.2)
        while True:
            while not self.pending:
                if not await self._fill():
                    return None
            if self.pending.startswith(b"\r\n"):
                del self.pending[:2]
            elif self.pending.startswith(b"\n"):
                del self.pending[:1]
            else:
                break
        raw = await self._until(b"\r\n\r\n", lim.max_header_bytes)
        if raw is None:
            return None
        lines = raw[:-4].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3:
            raise _BadRequest(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise _BadRequest(505, "only HTTP/1.0 and HTTP/1.1 are served")
        if not method.isalpha() or not method.isupper():
            raise _BadRequest(400, "malformed method")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line or line[0] in " \t":
                raise _BadRequest(400, "malformed header line (folding is not accepted)")
            name, sep_, value = line.partition(":")
            if not sep_ or not name or name != name.strip():
                raise _BadRequest(400, "malformed header line")
            k = name.lower()
            v = value.strip()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        path, _, query = target.partition("?")
        req = Request(method, target, path, query, version, headers, self.peer)
        conn_hdr = headers.get("connection", "").lower()
        if version == "HTTP/1.0" and "keep-alive" not in conn_hdr:
            self.close_after = True
        if "close" in conn_hdr:
            self.close_after = True
        return req

    async def _read_body(self, req: Request) -> int | None:
        """Reads the body into ``req.body`` within ``body_timeout``; a status to refuse with,
        or None."""
        lim = self.server.limits
        te = req.header("transfer-encoding").lower()
        cl = req.header("content-length")
        if te and te != "chunked":
            return 501
        if te and cl:
            return 400  # ambiguous framing (request smuggling)
        if te == "chunked":
            return await asyncio.wait_for(self._chunked(req), lim.body_timeout)
        if not cl:
            return None if req.method in ("GET", "HEAD", "OPTIONS", "DELETE") else 411
        if not cl.isdigit():
            return 400
        n = int(cl)
        if n > lim.max_body_bytes:
            return 413
        body = await asyncio.wait_for(self._exactly(n), lim.body_timeout)
        if body is None:
            raise ConnectionError("the client left while sending its body")
        req.body = body
        return None

    async def _chunked(self, req: Request) -> int | None:
        lim = self.server.limits
        body = bytearray()
        while True:
            line = await self._until(b"\r\n", 1024)
            if line is None:
                raise ConnectionError("the client left while sending its body")
            try:
                n = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                return 400
            if n < 0 or len(body) + n > lim.max_body_bytes:
                return 413
            if n == 0:
                while True:  # trailers, up to the blank line
                    t = await self._until(b"\r\n", 8192)
                    if t is None or t == b"\r\n":
                        break
                req.body = bytes(body)
                return None
            chunk = await self._exactly(n + 2)
            if chunk is None:
                raise ConnectionError("the client left while sending its body")
            body += chunk[:-2]

    async def _refuse(self, status: int, message: str, req: Request | None = None) -> None:
        body = self.server.error_body(status, message, req)
        version = req.version if req else "HTTP/1.1"
        head = _head(
            version,
            status,
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
            ]
            + (self.server.cors_headers(req) if req else [])
            + ([("WWW-Authenticate", "Bearer")] if status == 401 else []),
        )
        self.close_after = True
        try:
            self.writer.write(head + (b"" if req and req.method == "HEAD" else body))
            await asyncio.wait_for(self.writer.drain(), 5)
        except (TimeoutError, OSError, ConnectionError):
            pass
        self.server.log_refusal(self.peer, req, status)

    def _framing(self, req: Request) -> Optional[Tuple[int, str]]:
        """The body's framing, checked before anything else looks at the request."""
        te = req.header("transfer-encoding").lower()
        cl = req.header("content-length")
        if te and te != "chunked":
            return 501, "only the chunked transfer coding is accepted"
        if te and cl:
            return 400, "both Content-Length and Transfer-Encoding (ambiguous framing)"
        if cl and not cl.isdigit():
            return 400, f"bad Content-Length {cl[:40]!r}"
        if cl and int(cl) > self.server.limits.max_body_bytes:
            return 413, f"the request body is larger than {self.server.limits.max_body_bytes} bytes"
        if not te and not cl and req.method in ("POST", "PUT", "PATCH"):
            return 411, "a request body needs a Content-Length"
        return None

    async def _run(self, req: Request) -> bool:
        """Prechecks, reads the body, runs the handler; whether the connection may go on."""
        srv = self.server
        early = self._framing(req) or srv.precheck(req)
        if early is not None:
            status, message = early
            await self._refuse(status, message, req)
            return False
        if req.header("expect").lower() == "100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            refused = await self._read_body(req)
        except TimeoutError:
            refused = 408
        except _BadRequest:
            refused = 400
        if refused is not None:
            msgs = {
                408: "the request body did not arrive in time",
                411: "a request body needs a Content-Length",
                413: f"the request body is larger than {srv.limits.max_body_bytes} bytes",
                501: "only the chunked transfer coding is accepted",
                400: "malformed request framing",
            }
            await self._refuse(refused, msgs.get(refused, "bad request"), req)
            return False
        if not srv.admit():
            await self._refuse(503, "the server is at its queue limit; retry later", req)
            return False
        self.current = req
        watcher = asyncio.ensure_future(self._watch(req))
        try:
            fut = srv.loop.run_in_executor(srv.pool, srv.run_handler, self, req)  # type: ignore[union-attr]
            await fut
        finally:
            srv.release()
            watcher.cancel()
            self.current = None
        return not req.gone.is_set()

    async def _watch(self, req: Request) -> None:
        """While the handler runs: EOF or a reset means the client left, whatever it sent
        before; bytes it sends (a pipelined request) are kept for later, up to
        ``max_pending_bytes``."""
        lim = self.server.limits
        try:
            while True:
                if not await self._fill():
                    req.gone.set()
                    return
                if len(self.pending) > lim.max_pending_bytes:
                    req.gone.set()
                    self.close_after = True
                    return
        except (ConnectionError, OSError):
            req.gone.set()
        except asyncio.CancelledError:
            pass


class _BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


Handler = Callable[[Request, Responder], None]


class HttpServer:
    """Binds at once (so a taken port is reported before anything else happens), serves on its
    own thread."""

    def __init__(
        self,
        handler: Handler,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        precheck: Callable[[Request], tuple[int, str] | None] | None = None,
        error_body: Callable[[int, str, Request | None], bytes] | None = None,
        cors_headers: Callable[[Request | None], list[tuple[str, str]]] | None = None,
        log: Callable[[str], None] = lambda line: None,
    ):
        self.handler = handler
        self.limits = limits or Limits()
        self._precheck = precheck
        self._error_body = error_body
        self._cors = cors_headers
        self.log = log
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(256)
        self.sock.setblocking(False)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix="v4flash-http")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.conns: list[_Conn] = []
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}"

    # --- hooks ---------------------------------------------------------------------------------
    def precheck(self, req: Request) -> tuple[int, str] | None:
        return self._precheck(req) if self._precheck else None

    def error_body(self, status: int, message: str, req: Request | None) -> bytes:
        if self._error_body:
            return self._error_body(status, message, req)
        import json

        return json.dumps({"error": {"message": message, "code": status}}).encode()

    def cors_headers(self, req: Request | None) -> list[tuple[str, str]]:
        return self._cors(req) if self._cors else []

    def log_refusal(self, peer, req: Request | None, status: int) -> None:
        what = f"{req.method} {safe(req.target)}" if req else "(no request)"
        self.log(f"{peer[0]} {what} {status}")

    # --- admission -----------------------------------------------------------------------------
    def admit(self) -> bool:
        with self._busy_lock:
            if self._busy >= self.limits.workers + self.limits.max_queue:
                return False
            self._busy += 1
            return True

    def release(self) -> None:
        with self._busy_lock:
            self._busy -= 1

    @property
    def in_flight(self) -> int:
        return self._busy

    def run_handler(self, conn: _Conn, req: Request) -> None:
        resp = Responder(conn, req, self.cors_headers(req))
        try:
            self.handler(req, resp)
        except Gone:
            req.gone.set()
        except Exception as e:  # noqa: BLE001 - a handler bug is a 500, never a dead server
            import traceback

            self.log(f"error in {req.method} {safe(req.target)}:\n{traceback.format_exc()}")
            if not resp.started:
                try:
                    resp.send(500, self.error_body(500, f"internal error: {type(e).__name__}", req))
                except Gone:
                    pass
            else:
                req.gone.set()  # a broken stream: close the connection
        finally:
            try:
                resp.end()
            except Gone:
                pass
            if resp._streaming and not resp._chunked:
                req.gone.set()

    # --- connections ---------------------------------------------------------------------------
    async def _accept(self, reader, writer) -> None:
        if len(self.conns) >= self.limits.max_connections:
            waiting = [c for c in self.conns if c.waiting_since is not None and c.current is None]
            if waiting:
                oldest = min(waiting, key=lambda c: c.waiting_since or 0.0)
                oldest.abort()
            else:
                writer.transport.abort()
                return
        conn = _Conn(self, reader, writer)
        self.conns.append(conn)
        try:
            await conn.serve()
        except asyncio.CancelledError:
            conn.abort()  # the server stops

    def forget(self, conn: _Conn) -> None:
        if conn in self.conns:
            self.conns.remove(conn)

    def _run_loop(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._quit = asyncio.Event()
        self.loop = loop

        async def main() -> None:
            self._server = await asyncio.start_server(
                self._accept, sock=self.sock, limit=self.limits.max_header_bytes + 4096
            )
            await self._quit.wait()
            self._server.close()
            for c in list(self.conns):
                c.abort()
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            loop.run_until_complete(main())
        finally:
            loop.close()
            self._stopped.set()

    def start(self) -> HttpServer:
        self._thread = threading.Thread(
            target=self._run_loop, name="v4flash-http-loop", daemon=True
        )
        self._thread.start()
        while self.loop is None:
            time.sleep(0.001)
        return self

    def stop(self, grace: float = 10.0) -> bool:
        """Stops accepting, gives running requests ``grace`` seconds, then closes every
        connection. Whether everything ended within the grace."""
        loop = self.loop
        if loop is None:
            return True

        def close_listener() -> None:
            if self._server is not None:
                self._server.close()

        loop.call_soon_threadsafe(close_listener)
        end = time.monotonic() + grace
        while self.in_flight and time.monotonic() < end:
            time.sleep(0.02)
        clean = not self.in_flight

        if self._quit is not None:
            loop.call_soon_threadsafe(self._quit.set)
        self._stopped.wait(5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        return clean


def safe(text: str, limit: int = 200) -> str:
    """Text from a request, fit for a log line: control characters escaped, cut to ``limit``."""
    out = "".join(ch if ch.isprintable() and ch not in "\x1b" else repr(ch)[1:-1] for ch in text)
    return out if len(out) <= limit else out[:limit] + "…"
