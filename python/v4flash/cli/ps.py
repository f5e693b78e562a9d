"""``v4flash ps`` (``status``): the servers running on this machine, as ``ollama ps`` shows
its loaded models. Each ``v4flash serve`` registers itself in the state folder while it runs
(``state.register_server``: pid, address, model, start); entries whose process is gone are
dropped. Each live one is asked ``GET /health`` (no key needed): loading, busy or idle, queued
requests, the prompt cache; its memory is the process's resident set (/proc on Linux)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, Optional

from .. import state
from ..units import gb, plural
from .common import columns, duration, terminal_width

HEALTH_TIMEOUT_S = 2.0


def local_url(url: str) -> str:
    """The address to ask a server at: a wildcard bind (0.0.0.0, ::) answers on loopback."""
    return url.replace("//0.0.0.0:", "//127.0.0.1:").replace("//[::]:", "//[::1]:")


def health(url: str, timeout: float = HEALTH_TIMEOUT_S) -> Dict[str, Any]:
    """The server's ``/health`` document (503 while loading included); ``{"status":
    "not answering", "error": …}`` when it cannot be asked."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local address
    try:
        with opener.open(local_url(url) + "/health", timeout=timeout) as r:
            return json.loads(r.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        try:
            return json.loads(e.read().decode("utf-8"))
        except (OSError, ValueError):
            return {"status": "not answering", "error": f"HTTP {e.code}"}
    except (OSError, ValueError) as e:
        return {"status": "not answering", "error": str(getattr(e, "reason", e))}


def _state(h: Dict[str, Any]) -> str:
    status = h.get("status", "?")
    if status != "ok":
        return str(status)
    text = "busy" if h.get("busy") else "idle"
    if h.get("queued"):
        text += f", {h['queued']} queued"
    return text


def _cache(h: Dict[str, Any]) -> str:
    c = h.get("prompt_cache")
    if not isinstance(c, dict):
        return "-"
    return (
        f"{plural(c.get('sessions', 0), 'session')}, "
        f"{plural(c.get('tokens', 0), 'token', grouped=True)}, "
        f"{plural(c.get('hits', 0), 'hit')}"
    )


def servers() -> list:
    """The live servers, each with its ``health``, ``rss`` (bytes or None) and ``uptime_s``."""
    now = time.time()
    out = []
    for s in state.servers():
        s.pop("file", None)
        s["health"] = health(s.get("url", ""))
        s["rss"] = state.process_rss(s["pid"])
        started: Optional[float] = s.get("started")
        s["uptime_s"] = now - started if isinstance(started, (int, float)) else None
        out.append(s)
    return out


def cmd_ps(args: argparse.Namespace) -> int:
    found = servers()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found:
        print("no v4flash server is running on this machine (v4flash serve starts one)")
        return 0
    rows = []
    for s in found:
        h = s["health"]
        rows.append(
            (
                str(s["pid"]),
                f"{s.get('url', '?')}/v1",
                str(h.get("model") or s.get("model") or "?"),
                _state(h),
                _cache(h),
                gb(s["rss"]) if s["rss"] else "unknown",
                duration(s["uptime_s"]) if s["uptime_s"] is not None else "-",
            )
        )
    headers = ("PID", "URL", "MODEL", "STATE", "PROMPT CACHE", "MEMORY", "UP")
    print(columns(headers, rows, terminal_width(sys.stdout)))
    return 0
