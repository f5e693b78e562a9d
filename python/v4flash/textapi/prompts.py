"""Requests checked and turned into prompts: :func:`prepare_chat` (messages, tools, tool
choice, thinking) and :func:`prepare_completion` (raw text or ids) build a :class:`Job`, the
prompt ids and how to generate, before any work is done: every argument error is a
``ValueError`` here, so the server can answer it at once, queued or not.

The prompt text is the chat format's (``encoding``, ids by ``tokenizer.encode_prompt_ids``);
the sampling parameters are the core's rule (``sampling.sample_params``); the token ids are
checked by the engine when it reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from ..encoding import encoder_file
from ..grammars import response_structure
from ..sampling import sample_params
from ..tokenizer import encode_prompt_ids
from .attached import tokenizer_for
from .constraints import constrain, tool_constraint
from .stream import normalize_stop


class ContextLengthError(ValueError):
    """The prompt cannot fit the model's context (it needs at least one token of room)."""


def _integer(v: Any, name: str, minimum: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    return v


@dataclass
class Job:
    """A checked request: the prompt ids and how to generate. Built by :func:`prepare_chat`
    or :func:`prepare_completion`; run with :func:`run_job`."""

    model: Any
    prompt: List[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stops: List[str]
    mode: str  # "chat" | "thinking" | "raw"
    parse_tools: bool = True
    # a compiled grammar the answer follows (``_core.Grammar``; in thinking mode from
    # ``</think>`` on), or None
    constraint: Any = None
    cache: Any = True  # True: the model's cache; False: none; or a PromptCache
    reasoning_budget: Optional[int] = None  # thinking mode: at most this many reasoning tokens
    logprobs: Optional[int] = None  # each token's log-probability and this many alternatives


def _generation(
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: Optional[int] = None,
    stop: Union[None, str, Sequence[str]] = None,
    cache: Any = True,
    logprobs: Optional[int] = None,
) -> Dict[str, Any]:
    """The :class:`Job` fields every request has: the sampling parameters, checked (and a
    seed drawn when None) by the core's one rule, the answer's length, stop strings, cache,
    and ``logprobs`` (None: off; k: each token's log-probability and the k most likely)."""
    kw: Dict[str, Any] = sample_params(temperature, top_p, top_k, seed)._asdict()
    kw["max_new_tokens"] = _integer(max_new_tokens, "max_new_tokens", 1)
    kw["stops"] = normalize_stop(stop)
    kw["cache"] = cache
    if logprobs is not None:
        kw["logprobs"] = _integer(logprobs, "logprobs", 0)
    return kw


def _check_context(model: Any, prompt: List[int], extra: int = 0) -> None:
    ctx = int(model.ctx)
    if len(prompt) + extra >= ctx:
        raise ContextLengthError(
            f"the prompt has {len(prompt) + extra} tokens but the context holds {ctx} "
            f"(prompt and answer together); shorten the conversation or raise --ctx"
        )


def prepare_chat(
    model: Any,
    messages: List[Dict[str, Any]],
    *,
    tools: Optional[List[Dict[str, Any]]] = None,
    tool_choice: Any = None,
    response_format: Any = None,
    thinking: bool = False,
    reasoning_effort: Optional[str] = None,
    max_new_tokens: int = 1024,
    **generation: Any,
) -> Job:
    """Encodes and checks a chat request (``ValueError`` for anything wrong, before any work;
    :class:`ContextLengthError` when the prompt cannot fit; a grammar that cannot be compiled
    names its problem). ``response_format``: OpenAI's (text, json_object, json_schema), a
    Lark grammar ``{"type": "grammar", "grammar": ...}``, a regex ``{"type": "regex",
    "regex": ...}`` or a bare JSON Schema; the answer (after the reasoning in thinking mode)
    is generated under it. ``tool_choice`` "required" or a named function, or a tool with
    ``strict: true``, generates the tool-call block under a grammar of the tools' schemas.
    ``generation``: ``temperature``,
    ``top_p``, ``top_k``, ``seed``, ``stop``, ``cache`` (see :func:`~v4flash.textapi.chat`)."""
    tok = tokenizer_for(model)
    kw = _generation(max_new_tokens, **generation)
    if not isinstance(thinking, bool):
        raise ValueError(f"thinking must be True or False, got {thinking!r}")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of message dicts")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools must be a list of OpenAI tool objects")
    structure = response_structure(response_format)
    parse_tools = True
    names: Optional[List[str]] = None
    forced = False
    if tool_choice in (None, "auto"):
        pass
    elif tool_choice == "none":
        tools, parse_tools = None, False
    else:
        names = [
            t["function"].get("name")
            for t in tools or []
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        if not names:
            raise ValueError("tool_choice asks for a tool call but no tools are given")
        forced = True
        if tool_choice == "required":
            pass
        elif (
            isinstance(tool_choice, dict)
            and tool_choice.get("type") == "function"
            and isinstance(tool_choice.get("function"), dict)
            and isinstance(tool_choice["function"].get("name"), str)
        ):
            name = tool_choice["function"]["name"]
            if name not in names:
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
            names = [name]
        else:
            raise ValueError(
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function", "function": {"name": ...}}'
            )
    mode = "thinking" if thinking else "chat"
    try:
        prompt = encode_prompt_ids(
            tok,
            messages,
            thinking_mode=mode,
            reasoning_effort=reasoning_effort,
            tools=tools or None,
            response_format=structure.prompt if structure is not None else None,
            encoder_path=encoder_file(getattr(model, "path", ".")),
        )
    except (TypeError, KeyError, AttributeError) as e:  # odd shapes the encoder did not expect
        raise ValueError(f"messages could not be encoded: {e}") from None
    # the prompt ends "<｜Assistant｜><think>" (thinking) or "<｜Assistant｜></think>" (chat)
    thinks = thinking and bool(prompt) and prompt[-1] == tok.think_id
    _check_context(model, prompt)
    # the answer's grammar: the tool calls when they are forced or a tool is strict (the
    # response format then one of the answers), else the response format's
    strict = any(
        isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("strict")
        for t in tools or []
    )
    if forced or strict:
        constraint = tool_constraint(model, tools or [], names, forced, structure)
    else:
        constraint = constrain(model, structure)
    return Job(
        model=model,
        prompt=prompt,
        mode="thinking" if thinks else "chat",
        parse_tools=parse_tools,
        constraint=constraint,
        **kw,
    )


def prepare_completion(
    model: Any,
    prompt: Union[str, Sequence[int]],
    *,
    max_new_tokens: int = 256,
    grammar: Optional[str] = None,
    response_format: Any = None,
    **generation: Any,
) -> Job:
    """Checks a raw completion: ``prompt`` is text (tokenized as is, special-token text
    included, no BOS added) or a list of token ids; ``grammar`` (a Lark grammar) or
    ``response_format`` (as for :func:`prepare_chat`) constrains the text; ``generation`` as
    for :func:`prepare_chat`."""
    tok = tokenizer_for(model)
    kw = _generation(max_new_tokens, **generation)
    if grammar is not None and response_format is not None:
        raise ValueError("give grammar or response_format, not both")
    if grammar is not None:
        response_format = {"type": "grammar", "grammar": grammar}
    structure = response_structure(response_format)
    if isinstance(prompt, str):
        ids = tok.encode(prompt)
    elif isinstance(prompt, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in prompt
    ):
        ids = list(prompt)
    else:
        raise ValueError("prompt must be a string or a list of token ids")
    if not ids:
        raise ValueError("the prompt is empty")
    _check_context(model, ids)
    return Job(model=model, prompt=ids, mode="raw", constraint=constrain(model, structure), **kw)
