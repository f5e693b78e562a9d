"""Who may use the server, decided on a request's head alone (before its body is read):

* **API key**: ``Authorization: Bearer KEY`` (OpenAI clients) or ``x-api-key: KEY`` (Anthropic
  clients), compared in constant time; ``/health`` and the web page need none.
* **Host** (DNS rebinding): bound to a loopback address, the server answers only requests whose
  ``Host`` names a loopback host (``localhost``, ``127.0.0.1``, ``[::1]``), so a web page whose
  domain was re-pointed at 127.0.0.1 cannot read the answers.
* **Origin** (cross-site requests): a browser's request from another origin is refused unless
  that origin is listed with ``--cors``; the server's own page (same origin) is always let in.
  A CORS preflight (``OPTIONS``) is answered for listed origins only.
* **Content type**: a request with a body must say ``application/json``: a page on another site
  cannot send one without a preflight (a ``text/plain`` form post is refused).
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

from .transport import Request

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether a bind address or a Host name is a loopback one."""
    h = host.strip("[]").lower()
    if h in LOOPBACK_NAMES or h.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host part of a ``Host`` header (without the port)."""
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    def __init__(self, bind_host: str, api_key: Optional[str], cors: Sequence[str] = ()):
        self.api_key = api_key or None
        self.check_host = is_loopback(bind_host)
        self.cors = [o.rstrip("/") for o in cors]

    # --- the checks ------------------------------------------------------------------------
    def authorized(self, req: Request) -> bool:
        if not self.api_key:
            return True
        want = self.api_key.encode()
        scheme, _, token = req.header("authorization").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), want):
            return True
        key = req.header("x-api-key")
        return bool(key) and hmac.compare_digest(key.strip().encode(), want)

    def host_allowed(self, req: Request) -> bool:
        if not self.check_host:
            return True
        host = req.header("host")
        return bool(host) and is_loopback(host_name(host))

    def same_origin(self, req: Request, origin: str) -> bool:
        parts = urlsplit(origin)
        return bool(parts.netloc) and parts.netloc.lower() == req.header("host").lower()

    def origin_allowed(self, req: Request) -> bool:
        """No ``Origin`` (not a browser), the server's own page, or a ``--cors`` origin."""
        origin = req.header("origin")
        if not origin:
            return True
        if self.same_origin(req, origin):
            return True
        return "*" in self.cors or origin.rstrip("/") in self.cors

    def cors_headers(self, req: Optional[Request]) -> List[Tuple[str, str]]:
        """The CORS headers of a response to a listed origin (none for the others)."""
        if req is None:
            return []
        origin = req.header("origin")
        if not origin or self.same_origin(req, origin):
            return []
        if "*" in self.cors or origin.rstrip("/") in self.cors:
            return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]
        return []

    def preflight_headers(self, req: Request) -> List[Tuple[str, str]]:
        asked = req.header("access-control-request-headers")
        return [  # the response adds Access-Control-Allow-Origin (cors_headers) itself
            ("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS"),
            ("Access-Control-Allow-Headers", asked or "authorization, content-type, x-api-key"),
            ("Access-Control-Max-Age", "600"),
        ]

    def refusal(self, req: Request, open_route: bool) -> Optional[Tuple[int, str]]:
        """(status, message) for a request refused on its head, else None."""
        if not self.host_allowed(req):
            return 403, (
                f"the Host header {req.header('host')!r} is not a loopback name: this server is "
                "bound to a loopback address and answers only requests for it"
            )
        if not self.origin_allowed(req):
            return 403, (
                f"requests from the origin {req.header('origin')!r} are not allowed (serve "
                "--cors ORIGIN lets a web page of that origin in)"
            )
        if req.method == "OPTIONS":
            return None
        if not open_route and not self.authorized(req):
            return 401, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)"
        if req.method in ("POST", "PUT", "PATCH") and has_body(req):
            ctype = req.header("content-type").split(";")[0].strip().lower()
            if ctype != "application/json":
                return 415, f"the body must be application/json, got {ctype or 'no Content-Type'}"
        return None


def has_body(req: Request) -> bool:
    cl = req.header("content-length")
    return bool(req.header("transfer-encoding")) or (cl not in ("", "0"))
