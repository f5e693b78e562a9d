"""The public functions (also ``Model`` methods): :func:`chat` / :func:`chat_stream` and
:func:`complete` / :func:`complete_stream`, each a prepared job (``prompts``) run to the end or
streamed (``run``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from .prompts import Job, prepare_chat, prepare_completion
from .results import ChatDelta, ChatResult, CompletionDelta, CompletionResult
from .run import Cancel, run_job

_END = ("finish_reason", "usage", "timings")  # what the last delta carries


def _deltas(
    job: Job, cancel: Optional[Cancel], delta: Callable[..., Any], fields: Dict[str, Callable]
) -> Iterator[Any]:
    """``run_job``'s events as ``delta`` objects: ``fields[kind](value)`` gives an event's
    fields (other kinds are not shown); the end event gives finish_reason, usage, timings."""
    for kind, value in run_job(job, cancel):
        if kind == "end":
            yield delta(**{k: value[k] for k in _END})
        elif kind in fields:
            yield delta(**fields[kind](value))


def _collect(job: Job, cancel: Optional[Cancel]) -> Tuple[Dict[str, List[Any]], Dict[str, Any]]:
    """Runs a job to the end: (the values of each kind of event, the end event)."""
    events: Dict[str, List[Any]] = {}
    end: Dict[str, Any] = {}
    for kind, value in run_job(job, cancel):
        if kind == "end":
            end = value
        else:
            events.setdefault(kind, []).append(value)
    return events, end


_CHAT_FIELDS: Dict[str, Callable] = {
    "reasoning": lambda v: {"reasoning": v},
    "content": lambda v: {"content": v},
    "tool_call": lambda v: {"tool_calls": [v]},
}


def chat_stream(model: Any, messages: List[Dict[str, Any]], **kw: Any) -> Iterator[ChatDelta]:
    """Streams an answer to ``messages`` as :class:`ChatDelta` pieces (see :func:`chat`).

    Arguments are checked at once (``ValueError`` before the first ``next``); the text is
    UTF-8 safe and never contains part of a stop string."""
    cancel = kw.pop("cancel", None)
    job = prepare_chat(model, messages, **kw)
    return _deltas(job, cancel, ChatDelta, _CHAT_FIELDS)


def chat(model: Any, messages: List[Dict[str, Any]], **kw: Any) -> ChatResult:
    """Answers ``messages`` (OpenAI-style dicts, DeepSeek V4 chat format).

    Keyword arguments: ``tools`` (OpenAI tools), ``tool_choice`` ("auto", "none",
    "required" or a named function), ``response_format`` (a JSON schema), ``thinking``
    (reasoning first), ``reasoning_effort``, ``max_new_tokens`` (1024), ``temperature``
    (1.0), ``top_p`` (1.0), ``top_k`` (0 = off), ``seed`` (random), ``stop`` (strings),
    ``cache`` (True: the model's prompt cache; False; or a :class:`PromptCache`),
    ``cancel`` (a callable polled between tokens; True ends the answer)."""
    cancel = kw.pop("cancel", None)
    return collect_chat(prepare_chat(model, messages, **kw), cancel)


def collect_chat(job: Job, cancel: Optional[Cancel] = None) -> ChatResult:
    """Runs a chat job to the end (what :func:`chat` returns)."""
    events, end = _collect(job, cancel)
    calls = [{k: v for k, v in c.items() if k != "index"} for c in events.get("tool_call", [])]
    return ChatResult(
        content="".join(events.get("content", [])),
        reasoning="".join(events.get("reasoning", [])),
        tool_calls=calls,
        logprobs=events.get("logprob"),
        **{k: end[k] for k in _END + ("text", "ids", "stop_string")},
    )


def complete_stream(model: Any, prompt: Union[str, Sequence[int]], **kw: Any):
    """Streams a raw completion as :class:`CompletionDelta` pieces (see :func:`complete`)."""
    cancel = kw.pop("cancel", None)
    job = prepare_completion(model, prompt, **kw)
    return _deltas(job, cancel, CompletionDelta, {"text": lambda v: {"text": v}})


def complete(model: Any, prompt: Union[str, Sequence[int]], **kw: Any) -> CompletionResult:
    """Continues raw text (no chat template; special-token text in it becomes those tokens;
    no BOS is added) or a list of token ids. Keywords: ``max_new_tokens`` (256),
    ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``cache``, ``cancel`` as for
    :func:`chat`."""
    cancel = kw.pop("cancel", None)
    return collect_completion(prepare_completion(model, prompt, **kw), cancel)


def collect_completion(job: Job, cancel: Optional[Cancel] = None) -> CompletionResult:
    """Runs a raw completion job to the end (what :func:`complete` returns)."""
    events, end = _collect(job, cancel)
    return CompletionResult(
        logprobs=events.get("logprob"), **{k: end[k] for k in _END + ("text", "ids", "stop_string")}
    )
