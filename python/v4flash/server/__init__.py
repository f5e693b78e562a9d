"""``v4flash serve``: an HTTP server on the text-level API for the clients people run: OpenAI's
chat completions, completions and Responses, Anthropic's Messages, and the operations side
(health, metrics, tokenize).

Layers, each its own module, so that another API (another dialect) or another HTTP stack is a
new module rather than a change everywhere:

* the **transport** (``transport``): an asyncio HTTP/1.1 server on one thread that bounds every
  resource a client can hold (connections, the time a request may take to arrive, body size,
  unread output, queued work) and notices a client that left whatever it sent before;
* the **glue** (``http``): routing, the checks made on a request's head (``guard``: API key,
  Host, Origin, content type), CORS, JSON and server-sent events, keep-alive pings, the log
  and the metrics (``metrics``);
* the **engine** (``engine``): the model, its prompt cache and a FIFO lock that gives the
  engine to one request at a time, in arrival order; cancellation; no HTTP in it;
* the **dialects**: ``openai`` (chat completions, completions, models; its fields in
  ``openai_fields``), ``responses`` (OpenAI Responses), ``anthropic`` (Messages), ``ops``
  (health, metrics, tokenize); each a table of routes, errors in its own shape. The chat
  dialects share one request form and one runner (``chat_request``).

The server binds its port before the model loads (``make_server(None, …)`` then
``engine.set_model``): a taken port is reported at once, and ``/health`` answers 503
"loading" until the model is ready.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..textapi.disk import DiskOptions
from . import anthropic, openai, ops, responses
from . import webui as webui_module
from .engine import Engine
from .guard import Guard
from .http import PING_S, App, Route, Server
from .transport import Limits

DIALECTS = (openai, responses, anthropic, ops)  # openai's error shape answers the rest


def make_server(
    model: Any,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    name: Optional[str] = None,
    api_key: Optional[str] = None,
    max_tokens: int = 4096,
    cache_sessions: int = 4,
    cache_disk: Optional[DiskOptions] = None,
    cors: Sequence[str] = (),
    ping_every: float = PING_S,
    limits: Optional[Limits] = None,
    responses_kept: int = 256,
    webui: bool = True,
    log: Optional[Callable[[str], None]] = None,
    parallel: Optional[int] = None,
) -> Server:
    """A bound, not yet serving, server (``serve_forever()`` or ``start()``; ``stop`` ends
    it). ``port=0`` picks a free port (see ``server.url``). ``model`` may be None while it
    loads: set it with ``server.engine.set_model``. ``cache_disk``: the prompt cache keeps
    states on disk too (``textapi.disk``). ``parallel``: requests answered side by side
    (default: the sessions the model was loaded for, ``load(..., sessions=N)``, whose
    scheduler steps them together)."""
    engine = Engine(
        model,
        name=name or (model.path.name if model is not None else "model"),
        max_tokens=max_tokens,
        cache_sessions=cache_sessions,
        cache_disk=cache_disk,
        log=log,
        parallel=parallel,
    )
    engine.responses = responses.ResponseStore(responses_kept)
    routes: Dict[Tuple[str, str], Route] = {}
    for dialect in DIALECTS:
        routes.update(dialect.ROUTES)
    if webui:  # the chat page at / (serve --no-webui leaves it a 404)
        routes.update(webui_module.ROUTES)
    app = App(engine, routes, openai.error_body, Guard(host, api_key, cors), ping_every)
    return Server(app, host, port, limits or Limits())


def stop(srv: Server, grace: float = 10.0) -> bool:
    """Stops a server: running generations end at their next token, queued requests get 503;
    True when every request finished within ``grace``."""
    return srv.shutdown(grace)
