"""The OpenAI dialect: ``POST /v1/chat/completions`` (JSON or SSE; tools, tool_choice,
reasoning, stop strings, seed), ``POST /v1/completions``, ``GET /v1/models`` and
``/v1/models/{id}``, with OpenAI's error shape.

Each endpoint checks its request (``openai_fields``) and prepares a text API job before it
waits for the engine, so a bad request is answered at once, queued or not; then it runs the job
in its turn (``Exchange.turn``) and writes the answer as OpenAI's JSON or chunks.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import __version__
from ..textapi.api import collect_chat, collect_completion
from ..textapi.prompts import ContextLengthError, Job, prepare_chat, prepare_completion
from ..textapi.results import Usage
from . import openai_fields as fields
from .chat_request import collected, streamed
from .errors import ApiError
from .http import Exchange, Route


def error_body(e: ApiError) -> Dict[str, Any]:
    return {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}}


def usage_json(u: Usage) -> Dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
    }


def _prepare(param: str, prepare: Callable[[], Job]) -> Job:
    """A text API job; its refusal is a 400 about ``param``."""
    try:
        return prepare()
    except ContextLengthError as err:
        raise ApiError(400, str(err), param=param, code="context_length_exceeded") from None


def _streamed(
    x: Exchange,
    param: str,
    job: Job,
    before: Callable[[], None],
    on: Callable[[str, Any], None],
    progress: Optional[Callable[[int, int, int], None]] = None,
) -> Tuple[Optional[Dict[str, Any]], int]:
    """``chat_request.streamed`` with OpenAI's error event (and ``[DONE]``)."""

    def error_event(err: ApiError) -> None:
        x.event(error_body(err))
        _done(x)

    return streamed(x, param, job, before, on, error_event, progress)


def _progress(x: Exchange, head: Dict[str, Any], body: Dict[str, Any]):
    """llama.cpp's ``return_progress``: a chunk with ``prompt_progress`` as the prompt
    prefills (``{total, cache, processed, time_ms}``)."""
    if fields.field(body, "return_progress", (bool,), "true or false") is not True:
        return None
    t0 = time.perf_counter()

    def report(done: int, total: int, cached: int) -> None:
        ms = int((time.perf_counter() - t0) * 1000)
        doc = {"total": total, "cache": cached, "processed": done, "time_ms": ms}
        x.event(dict(head, choices=[], prompt_progress=doc))

    return report


def _done(x: Exchange) -> None:
    x.chunk(b"data: [DONE]\n\n")
    x.end_chunks()


def _close(x: Exchange, head: Dict[str, Any], include_usage: bool, end: Dict[str, Any]) -> int:
    """The usage chunk (when asked for), then the end of the stream."""
    if include_usage:
        x.event(dict(head, choices=[], usage=usage_json(end["usage"])))
    _done(x)
    return 200


# --- log-probabilities -----------------------------------------------------------------------


def _token(tok: Any, i: int) -> Dict[str, Any]:
    b = tok.token_bytes(i)
    return {"token": b.decode("utf-8", "replace"), "bytes": list(b)}


def chat_logprob(tok: Any, e: Dict[str, Any]) -> Dict[str, Any]:
    """One generated token's entry of chat's ``logprobs.content``."""
    top = [dict(_token(tok, i), logprob=lp) for i, lp in e["top"]]
    return dict(_token(tok, e["id"]), logprob=e["logprob"], top_logprobs=top)


def completion_logprobs(tok: Any, entries: List[Dict[str, Any]], offset: int) -> Dict[str, Any]:
    """The legacy completions' ``logprobs`` object for these tokens (text offsets from
    ``offset``)."""
    out: Dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    out["text_offset"] = []
    for e in entries:
        t = _token(tok, e["id"])["token"]
        out["tokens"].append(t)
        out["token_logprobs"].append(e["logprob"])
        out["top_logprobs"].append({_token(tok, i)["token"]: lp for i, lp in e["top"]})
        out["text_offset"].append(offset)
        offset += len(t)
    return out


# --- POST /v1/chat/completions ------------------------------------------------------------


def chat_completions(x: Exchange) -> int:
    e = x.engine
    body = x.read_json()
    fields.model_field(body)
    messages = fields.messages(body)
    stream, include_usage = fields.stream_args(body)
    kw = fields.generation(body, int(e.model.ctx), e.max_tokens)
    kw["logprobs"] = fields.chat_logprobs(body)
    tools, tool_choice = fields.tools(body)
    thinking, effort = fields.thinking(body)
    try:
        job = _prepare(
            "messages",
            lambda: prepare_chat(
                e.model,
                messages,
                tools=tools,
                tool_choice=tool_choice,
                response_format=fields.response_format(body),
                thinking=thinking,
                reasoning_effort=effort,
                cache=e.cache,
                **kw,
            ),
        )
    except ValueError as err:
        raise ApiError(400, str(err), param=getattr(err, "param", None)) from None
    rid = "chatcmpl-" + uuid.uuid4().hex
    head = {"id": rid, "created": int(time.time()), "model": e.name}
    head["system_fingerprint"] = f"v4flash-{__version__}"
    if not stream:
        r = collected(x, "messages", collect_chat, job)
        msg: Dict[str, Any] = {"role": "assistant", "content": r.content}
        if thinking:
            msg["reasoning_content"] = r.reasoning
        if r.tool_calls:
            msg["tool_calls"] = r.tool_calls
            msg["content"] = r.content or None
        lps = None
        if r.logprobs is not None:
            lps = {"content": [chat_logprob(e.tok, lp) for lp in r.logprobs], "refusal": None}
        choice = {"index": 0, "message": msg, "finish_reason": r.finish_reason, "logprobs": lps}
        doc = dict(head, object="chat.completion", choices=[choice], usage=usage_json(r.usage))
        x.send_json(200, doc)
        return 200

    x.start_sse()
    head["object"] = "chat.completion.chunk"

    pending: List[Dict[str, Any]] = []  # tokens' logprobs not sent yet (text is held back)

    def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> None:
        lps = None
        if job.logprobs is not None:
            lps = {"content": [chat_logprob(e.tok, lp) for lp in pending], "refusal": None}
            pending.clear()
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": lps}
        x.event(dict(head, choices=[choice]))

    delta_of = {
        "reasoning": lambda v: {"reasoning_content": v},
        "content": lambda v: {"content": v},
        "tool_call": lambda v: {"tool_calls": [v]},
    }

    def on(kind: str, value: Any) -> None:
        if kind == "logprob":
            pending.append(value)
        elif kind in delta_of:
            chunk(delta_of[kind](value))

    end, status = _streamed(
        x,
        "messages",
        job,
        lambda: chunk({"role": "assistant", "content": ""}),
        on,
        _progress(x, head, body),
    )
    if end is None:
        return status
    chunk({}, end["finish_reason"])
    return _close(x, head, include_usage, end)


# --- POST /v1/completions -----------------------------------------------------------------


def completions(x: Exchange) -> int:
    e = x.engine
    body = x.read_json()
    fields.model_field(body)
    stream, include_usage = fields.stream_args(body)
    kw = fields.generation(body, int(e.model.ctx), 16)  # OpenAI's default for completions
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
    kw["logprobs"] = fields.completion_logprobs(body)
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise ApiError(400, "'best_of' must be 1", param="best_of")
    echo = fields.field(body, "echo", (bool,), "true or false") or False
    try:
        job = _prepare(
            "prompt",
            lambda: prepare_completion(
                e.model, prompt, cache=e.cache, response_format=fields.response_format(body), **kw
            ),
        )
    except ValueError as err:
        raise ApiError(400, str(err), param=getattr(err, "param", "prompt")) from None
    echoed = ""
    if echo:
        echoed = prompt if isinstance(prompt, str) else e.tok.decode(job.prompt)
    rid = "cmpl-" + uuid.uuid4().hex
    head = {"id": rid, "object": "text_completion", "created": int(time.time())}
    head["model"] = e.name

    pending: List[Dict[str, Any]] = []
    offset = [len(echoed)]

    def choice(text: str, finish: Optional[str], entries: Any = None) -> Dict[str, Any]:
        lps = None
        if job.logprobs is not None:
            lps = completion_logprobs(e.tok, entries if entries is not None else pending, offset[0])
            offset[0] += len(text)
            pending.clear()
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": lps}

    if not stream:
        r = collected(x, "prompt", collect_completion, job)
        c = choice(echoed + r.text, r.finish_reason, r.logprobs or [])
        doc = dict(head, choices=[c], usage=usage_json(r.usage))
        x.send_json(200, doc)
        return 200

    x.start_sse()

    def text(kind: str, value: Any) -> None:
        if kind == "logprob":
            pending.append(value)
        elif kind == "text":
            x.event(dict(head, choices=[choice(value, None)]))

    end, status = _streamed(
        x, "prompt", job, lambda: text("text", echoed) if echoed else None, text
    )
    if end is None:
        return status
    x.event(dict(head, choices=[choice("", end["finish_reason"])]))
    return _close(x, head, include_usage, end)


# --- GET /v1/models -----------------------------------------------------------------------


def _model_doc(x: Exchange) -> Dict[str, Any]:
    e = x.engine
    return {
        "id": e.name,
        "object": "model",
        "created": e.created,
        "owned_by": "v4flash",
        "context_length": int(e.model.ctx),
    }


def models(x: Exchange) -> int:
    x.send_json(200, {"object": "list", "data": [_model_doc(x)]})
    return 200


def model(x: Exchange) -> int:
    name = x.route[len("/models/") :]
    if name != x.engine.name:
        raise ApiError(404, f"no model {name!r}; this server runs {x.engine.name!r}")
    x.send_json(200, _model_doc(x))
    return 200


ROUTES = {
    ("GET", "/models"): Route(models, error_body),
    ("GET", "/models/*"): Route(model, error_body),
    ("POST", "/chat/completions"): Route(chat_completions, error_body),
    ("POST", "/completions"): Route(completions, error_body),
}
