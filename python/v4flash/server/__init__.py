"""``v4flash serve``: an HTTP server on the text-level API, OpenAI-compatible.

Three layers, each its own module, so that another API (another dialect) or another HTTP
stack is a new module rather than a change everywhere:

* the **engine** (``engine``): the model, its prompt cache and a FIFO lock that gives the
  engine to one request at a time, in arrival order; cancellation when a client leaves or
  the server stops; no HTTP in it;
* the **transport** (``http``): HTTP parsing and limits, the API key, routing, JSON and
  server-sent events, disconnect detection, the request log; no API in it;
* the **dialects**: ``openai`` (chat completions, completions, models; its request fields in
  ``openai_fields``), each a table of routes to endpoints, errors in its own shape
  (``errors.ApiError``).

Each connection gets a thread that parses and checks its request (errors are answered with a
4xx at once, queued or not), then waits its turn for the engine. ``GET /health`` is the
server's own: no API key, no log line.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from . import openai
from .engine import Engine
from .http import Exchange, Route, Server, Server6

DIALECTS = (openai,)  # the first one's error shape answers what no route owns (404, …)


def health(x: Exchange) -> int:
    e = x.engine
    doc = {
        "status": "stopping" if e.stopping.is_set() else "ok",
        "model": e.name,
        "busy": e.lock.busy,
        "queued": e.lock.waiting,
        "requests": e.requests,
        "prompt_cache": e.cache.stats(),
    }
    x.send_json(200, doc)
    return 200


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
    default = DIALECTS[0].error_body
    routes: Dict[Tuple[str, str], Route] = {("GET", "/health"): Route(health, default, True)}
    for dialect in DIALECTS:
        routes.update(dialect.ROUTES)
    bound = {"engine": engine, "routes": routes, "error_body": staticmethod(default)}
    handler = type("BoundExchange", (Exchange,), bound)
    cls = Server6 if ":" in host else Server
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
