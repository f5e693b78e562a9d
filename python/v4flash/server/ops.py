"""The operations side: ``GET /health`` (no key; 503 "loading" until the model is ready, as
llama-server answers), ``GET /metrics`` (Prometheus text), ``POST /tokenize`` and
``/detokenize`` in both vLLM's shape (``prompt`` or ``messages`` → ``tokens``, ``count``;
``tokens`` → ``prompt``) and llama.cpp's (``content`` → ``tokens``, ``with_pieces``; ``tokens``
→ ``content``)."""

from __future__ import annotations

from typing import Any, Dict, List

from ..textapi.prompts import ContextLengthError, prepare_chat
from . import openai_fields as fields
from .errors import ApiError
from .http import Exchange, Route
from .openai import error_body


def health(x: Exchange) -> int:
    e = x.engine
    if not e.ready.is_set():
        x.send_json(503, {"status": "loading", "model": e.name})
        return 503
    doc = {
        "status": "stopping" if e.stopping.is_set() else "ok",
        "model": e.name,
        "busy": e.lock.busy,
        "running": e.lock.running,
        "parallel": e.lock.places,
        "queued": e.lock.waiting,
        "requests": e.requests,
        "prompt_cache": e.cache.stats(),
    }
    x.send_json(200, doc)
    return 200


def metrics(x: Exchange) -> int:
    e = x.engine
    stats = e.model.stats() if e.model is not None else None
    text = x.app.metrics.render(e.lock.running, e.lock.waiting, stats)
    x.send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
    x.info["note"] = "metrics"
    return 200


def _ids(body: Dict[str, Any], key: str) -> List[int]:
    v = body.get(key)
    if not isinstance(v, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in v
    ):
        raise ApiError(400, f"'{key}' must be a list of token ids", param=key)
    return v


def tokenize(x: Exchange) -> int:
    e = x.engine
    body = x.read_json()
    if "messages" in body:
        messages = fields.messages(body)
        try:
            job = prepare_chat(e.model, messages, max_new_tokens=1, cache=False)
        except ContextLengthError as err:
            raise ApiError(400, str(err), param="messages") from None
        except ValueError as err:
            raise ApiError(400, str(err), param="messages") from None
        ids = job.prompt
    else:
        key = "prompt" if "prompt" in body else "content"
        text = body.get(key)
        if not isinstance(text, str):
            raise ApiError(400, "'prompt' (or 'content') must be a string", param=key)
        ids = e.tok.encode(text)
    doc: Dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": int(e.model.ctx)}
    if body.get("with_pieces") is True:
        doc["tokens"] = [{"id": i, "piece": e.tok.decode([i])} for i in ids]
    x.send_json(200, doc)
    x.info["note"] = f"{len(ids)} tokens"
    return 200


def detokenize(x: Exchange) -> int:
    e = x.engine
    ids = _ids(x.read_json(), "tokens")
    vocab = e.model.config.vocab_size
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise ApiError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", "tokens")
    text = e.tok.decode(ids)
    x.send_json(200, {"prompt": text, "content": text})
    return 200


ROUTES = {
    ("GET", "/health"): Route(health, error_body, True),
    ("GET", "/metrics"): Route(metrics, error_body),
    ("POST", "/tokenize"): Route(tokenize, error_body),
    ("POST", "/detokenize"): Route(detokenize, error_body),
}
