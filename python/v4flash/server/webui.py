"""``GET /``: the chat page (``python/v4flash/web/index.html``), one self-contained file: its
script and style inline, no request to any other host, no build step. It talks to the server
it came from (``/v1/chat/completions``, streamed), so it needs no ``--cors``; it asks for the
API key when a request gets 401. ``serve --no-webui`` leaves ``/`` a 404."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .http import Exchange, Route
from .openai import error_body

PAGE = Path(__file__).resolve().parent.parent / "web" / "index.html"


@lru_cache(maxsize=1)
def page() -> bytes:
    return PAGE.read_bytes()


def index(x: Exchange) -> int:
    x.send(
        200,
        page(),
        "text/html; charset=utf-8",
        {
            # the page's own script and style; it talks to this server only (eval stays
            # allowed: browser automation evaluates its checks through it)
            "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline' "
            "'unsafe-eval'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'",
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )
    x.info["note"] = "web page"
    return 200


ROUTES = {("GET", "/"): Route(index, error_body, True)}
