"""What every chat dialect's request becomes, and how it runs: a :class:`ChatRequest`
(OpenAI-shaped messages and tools, thinking, sampling, stop strings) turned into one text API
job (:func:`prepare`), run to the end (:func:`collected`) or streamed (:func:`streamed`) in its
turn for the engine. OpenAI chat completions, OpenAI Responses and Anthropic Messages all go
through here, so the same request gives the same prompt, the same cache hit and the same
answer whatever the dialect.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..sampling import sample_params
from ..textapi.prompts import ContextLengthError, Job, prepare_chat
from ..textapi.run import run_job
from .engine import Gone
from .errors import ApiError
from .http import Exchange, as_api_error


@dataclass
class ChatRequest:
    messages: List[Dict[str, Any]]
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Any = None
    thinking: bool = False
    reasoning_effort: Optional[str] = None
    reasoning_budget: Optional[int] = None
    max_new_tokens: Optional[int] = None
    sampling: Dict[str, Any] = field(default_factory=dict)  # temperature, top_p, top_k, seed
    stop: List[str] = field(default_factory=list)
    stream: bool = False
    response_format: Any = None


def prepare(x: Exchange, req: ChatRequest, param: str = "messages") -> Job:
    """The request as a text API job. Its length is clamped to the context; the sampling
    parameters are the engine's to check (``sampling.sample_params``); the refusal of anything
    is a 400 about ``param`` (or the sampling field)."""
    e = x.engine
    ctx = int(e.model.ctx)
    n = req.max_new_tokens if req.max_new_tokens is not None else e.max_tokens
    s = req.sampling
    try:
        sample_params(
            s.get("temperature", 1.0), s.get("top_p", 1.0), s.get("top_k", 0), s.get("seed")
        )
    except ValueError as err:
        raise ApiError(400, str(err), param=str(err).split(" ", 1)[0]) from None
    try:
        job = prepare_chat(
            e.model,
            req.messages,
            tools=req.tools,
            tool_choice=req.tool_choice,
            response_format=req.response_format,
            thinking=req.thinking,
            reasoning_effort=req.reasoning_effort,
            max_new_tokens=max(1, min(n, ctx)),
            stop=req.stop or None,
            cache=e.cache,
            **s,
        )
    except ContextLengthError as err:
        raise ApiError(400, str(err), param=param, code="context_length_exceeded") from None
    except ValueError as err:
        raise ApiError(400, str(err), param=getattr(err, "param", param)) from None
    job.reasoning_budget = req.reasoning_budget
    return job


def collected(x: Exchange, param: str, collect: Callable[[Job, Any], Any], job: Job) -> Any:
    """Runs a job to the end in its turn (a JSON answer): the result."""
    r = x.turn(param, False, lambda cancel: collect(job, cancel))
    end = {"usage": r.usage, "timings": r.timings, "finish_reason": r.finish_reason}
    x.finished(end, False)
    return r


def streamed(
    x: Exchange,
    param: str,
    job: Job,
    before: Callable[[], None],
    on: Callable[[str, Any], None],
    error_event: Callable[[ApiError], None],
    progress: Optional[Callable[[int, int, int], None]] = None,
) -> Tuple[Optional[Dict[str, Any]], int]:
    """Runs a streamed job in its turn: ``before()`` first, then ``on(kind, value)`` for each
    event but the end (``progress(done, total, cached)`` during the prefill, if given). The
    headers are out, so an error becomes ``error_event(error)`` that ends the stream:
    ``(end, 200)`` or ``(None, status)``."""

    def run(cancel: Callable[[], bool]) -> Dict[str, Any]:
        before()
        end: Dict[str, Any] = {}
        with contextlib.closing(run_job(job, cancel, progress)) as events:
            for kind, value in events:
                if kind == "end":
                    end = value
                else:
                    on(kind, value)
        return end

    try:
        end = x.turn(param, True, run)
        x.finished(end, True)
        return end, 200
    except Gone:
        raise
    except Exception as exc:  # an engine failure (e.g. a read error) too: say it, go on
        error = as_api_error(exc, x.engine, f"error during {x.path}")
    x.info["error"] = error.message
    error_event(error)
    return None, error.status
