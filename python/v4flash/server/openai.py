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
from typing import Any, Callable, Dict, Optional, Tuple

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


# --- POST /v1/chat/completions ------------------------------------------------------------


def chat_completions(x: Exchange) -> int:
    e = x.engine
    body = x.read_json()
    fields.model_field(body)
    messages = fields.messages(body)
    stream, include_usage = fields.stream_args(body)
    kw = fields.generation(body, int(e.model.ctx), e.max_tokens)
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
        raise ApiError(400, str(err)) from None
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
        choice = {"index": 0, "message": msg, "finish_reason": r.finish_reason, "logprobs": None}
        doc = dict(head, object="chat.completion", choices=[choice], usage=usage_json(r.usage))
        x.send_json(200, doc)
        return 200

    x.start_sse()
    head["object"] = "chat.completion.chunk"

    def chunk(delta: Dict[str, Any], finish: Optional[str] = None) -> None:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        x.event(dict(head, choices=[choice]))

    delta_of = {
        "reasoning": lambda v: {"reasoning_content": v},
        "content": lambda v: {"content": v},
        "tool_call": lambda v: {"tool_calls": [v]},
    }
    end, status = _streamed(
        x,
        "messages",
        job,
        lambda: chunk({"role": "assistant", "content": ""}),
        lambda kind, value: chunk(delta_of[kind](value)) if kind in delta_of else None,
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
    if body.get("logprobs") is not None:
        raise ApiError(400, "'logprobs' is not supported", param="logprobs")
    best_of = body.get("best_of")
    if best_of not in (None, 1):
        raise ApiError(400, "'best_of' must be 1", param="best_of")
    echo = fields.field(body, "echo", (bool,), "true or false") or False
    try:
        job = _prepare("prompt", lambda: prepare_completion(e.model, prompt, cache=e.cache, **kw))
    except ValueError as err:
        raise ApiError(400, str(err), param="prompt") from None
    echoed = ""
    if echo:
        echoed = prompt if isinstance(prompt, str) else e.tok.decode(job.prompt)
    rid = "cmpl-" + uuid.uuid4().hex
    head = {"id": rid, "object": "text_completion", "created": int(time.time())}
    head["model"] = e.name

    def choice(text: str, finish: Optional[str]) -> Dict[str, Any]:
        return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}

    if not stream:
        r = collected(x, "prompt", collect_completion, job)
        doc = dict(
            head, choices=[choice(echoed + r.text, r.finish_reason)], usage=usage_json(r.usage)
        )
        x.send_json(200, doc)
        return 200

    x.start_sse()

    def text(kind: str, value: Any) -> None:
        if kind == "text":
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
