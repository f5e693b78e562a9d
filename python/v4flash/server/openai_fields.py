"""The OpenAI dialect's request fields, checked and turned into text API arguments: JSON
types (a string where a number belongs is a 400 naming the field), OpenAI's own limits and
words (``n``, ``max_tokens`` against the context, ``stop`` lists, ``reasoning_effort``,
``thinking`` as DeepSeek and vLLM spell it, tools, ``response_format``). The sampling
parameters' rules are the engine's (``sampling.sample_params``); its message, which starts with
the parameter's name, becomes the 400's.
"""

from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Optional, Tuple

from ..grammars import guided_format, response_structure
from ..sampling import sample_params
from .errors import ApiError

MAX_STOP = 16  # stop strings per request
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
# OpenAI documents temperature "between 0 and 2": the dialect's own limit (the engine takes any
# temperature >= 0, as its own rule says)
TEMPERATURE_RANGE = (0, 2)
EFFORTS = {  # OpenAI's reasoning_effort words -> the DeepSeek V4 encoder's
    "minimal": "low",
    "low": "low",
    "medium": "high",
    "high": "high",
    "xhigh": "max",
    "max": "max",
}


def field(body: Dict[str, Any], key: str, types: Tuple[type, ...], what: str) -> Any:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) and bool not in types:
        raise ApiError(400, f"'{key}' must be {what}, got {json.dumps(v)}", param=key)
    if not isinstance(v, types):
        raise ApiError(400, f"'{key}' must be {what}, got {json.dumps(v)[:80]}", param=key)
    return v


def generation(body: Dict[str, Any], ctx: int, default_max: int) -> Dict[str, Any]:
    """The answer's length, sampling and stop strings: OpenAI's fields (``n`` must be 1,
    ``max_tokens`` within the context, ``stop`` a string or a list, no penalties or
    ``logit_bias``) checked here; the sampling parameters by the engine's rule."""
    out: Dict[str, Any] = {}
    n = field(body, "n", (int,), "1 (only one choice is supported)")
    if n is not None and n != 1:
        raise ApiError(400, f"'n' must be 1 (one choice per request), got {n}", param="n")
    max_tokens = None
    for key in ("max_completion_tokens", "max_tokens"):
        v = field(body, key, (int,), "a positive integer")
        if v is not None:
            if v < 1:
                raise ApiError(400, f"'{key}' must be >= 1, got {v}", param=key)
            if v > ctx:
                raise ApiError(
                    400,
                    f"'{key}' = {v} exceeds the model's context of {ctx} tokens",
                    param=key,
                    code="context_length_exceeded",
                )
            max_tokens = v if max_tokens is None else max_tokens
    out["max_new_tokens"] = max_tokens if max_tokens is not None else default_max
    t = field(body, "temperature", (int, float), "a number between 0 and 2")
    if t is not None and not TEMPERATURE_RANGE[0] <= t <= TEMPERATURE_RANGE[1]:
        raise ApiError(400, f"'temperature' must be between 0 and 2, got {t}", "temperature")
    p = field(body, "top_p", (int, float), "a number in (0, 1]")
    k = field(body, "top_k", (int,), "an integer >= 0")
    seed = field(body, "seed", (int,), "an integer")
    if seed is not None:
        seed %= 1 << 64  # OpenAI takes any integer; the engine's seeds are 64-bit
    try:  # the engine's rule (its message names the parameter first)
        s = sample_params(t, p, k, seed)
    except ValueError as e:
        name, _, rest = str(e).partition(" ")
        raise ApiError(400, f"'{name}' {rest}", param=name) from None
    out.update(s._asdict())
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise ApiError(400, "'stop' must be a non-empty string or a list of them", "stop")
        if len(stops) > MAX_STOP:
            raise ApiError(400, f"'stop' has {len(stops)} strings; at most {MAX_STOP}", "stop")
        out["stop"] = stops
    for key in ("frequency_penalty", "presence_penalty"):
        v = field(body, key, (int, float), "a number")
        if v:
            raise ApiError(400, f"'{key}' is not supported (only 0)", param=key)
    if body.get("logit_bias"):
        raise ApiError(400, "'logit_bias' is not supported", param="logit_bias")
    return out


def chat_logprobs(body: Dict[str, Any]) -> Optional[int]:
    """Chat's ``logprobs`` (true: each token's log-probability) and ``top_logprobs`` (0..20
    alternatives): None when not asked for, else how many alternatives."""
    on = field(body, "logprobs", (bool,), "true or false")
    top = field(body, "top_logprobs", (int,), "an integer from 0 to 20")
    if top is not None and not 0 <= top <= 20:
        raise ApiError(400, f"'top_logprobs' must be from 0 to 20, got {top}", "top_logprobs")
    if top is not None and not on:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if on else None


def completion_logprobs(body: Dict[str, Any]) -> Optional[int]:
    """The legacy completions' ``logprobs``: how many alternatives (0..5), or None."""
    n = field(body, "logprobs", (int,), "an integer from 0 to 5")
    if n is not None and not 0 <= n <= 5:
        raise ApiError(400, f"'logprobs' must be from 0 to 5, got {n}", param="logprobs")
    return n


def stream_args(body: Dict[str, Any]) -> Tuple[bool, bool]:
    stream = field(body, "stream", (bool,), "true or false") or False
    opts = field(body, "stream_options", (dict,), "an object")
    include_usage = False
    if opts is not None:
        v = opts.get("include_usage", False)
        if not isinstance(v, bool):
            raise ApiError(400, "'stream_options.include_usage' must be a boolean")
        include_usage = v
    return stream, include_usage


def thinking(body: Dict[str, Any]) -> Tuple[bool, Optional[str]]:
    """(thinking on?, encoder reasoning_effort) from DeepSeek's ``thinking`` (an object
    ``{"type": "enabled"|"disabled"}`` or a boolean), vLLM's ``chat_template_kwargs``
    and OpenAI's ``reasoning_effort`` (which turns thinking on unless it is "none")."""
    thinking: Optional[bool] = None
    t = body.get("thinking")
    if isinstance(t, bool):
        thinking = t
    elif isinstance(t, dict) and t.get("type") in ("enabled", "disabled"):
        thinking = t["type"] == "enabled"
    elif t is not None:
        raise ApiError(
            400,
            '\'thinking\' must be {"type": "enabled"} / {"type": "disabled"} or a boolean',
            param="thinking",
        )
    kw = body.get("chat_template_kwargs")
    if kw is not None:
        if not isinstance(kw, dict):
            raise ApiError(400, "'chat_template_kwargs' must be an object")
        for key in ("thinking", "enable_thinking"):
            if key in kw:
                if not isinstance(kw[key], bool):
                    raise ApiError(400, f"'chat_template_kwargs.{key}' must be a boolean")
                thinking = kw[key] if thinking is None else thinking
    effort = body.get("reasoning_effort")
    if effort is None:
        return bool(thinking), None
    if not isinstance(effort, str) or (effort != "none" and effort not in EFFORTS):
        raise ApiError(
            400,
            f"'reasoning_effort' must be one of none, {', '.join(EFFORTS)}; got "
            f"{json.dumps(effort)[:40]}",
            param="reasoning_effort",
        )
    if effort == "none":
        return bool(thinking), None
    return (True if thinking is None else thinking), EFFORTS[effort]


def tools(body: Dict[str, Any]) -> Tuple[Optional[List[Dict[str, Any]]], Any]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise ApiError(400, "'tools' must be a list of tool objects", param="tools")
        for i, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if (
                not isinstance(t, dict)
                or t.get("type", "function") != "function"
                or not isinstance(fn, dict)
            ):
                raise ApiError(
                    400,
                    f'tools[{i}] must be {{"type": "function", "function": {{...}}}}',
                    param="tools",
                )
            name = fn.get("name")
            if not isinstance(name, str) or not TOOL_NAME.match(name):
                raise ApiError(
                    400,
                    f"tools[{i}].function.name must match {TOOL_NAME.pattern}",
                    param="tools",
                )
            if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
                raise ApiError(400, f"tools[{i}].function.parameters must be an object")
        tools = tools or None
    choice = body.get("tool_choice")
    if choice is not None and not (
        choice in ("none", "auto", "required") or isinstance(choice, dict)
    ):
        raise ApiError(
            400, "'tool_choice' must be none, auto, required or a function", "tool_choice"
        )
    return tools, choice


def response_format(body: Dict[str, Any]) -> Any:
    """The request's ``response_format`` (OpenAI's text, json_object, json_schema; ours:
    grammar, regex) or vLLM's ``guided_json`` / ``guided_regex`` / ``guided_grammar`` and
    llama.cpp's ``grammar`` (Lark only), checked; the text API compiles it."""
    rf = body.get("response_format")
    guided = [k for k in GUIDED if body.get(k) is not None]
    if rf is not None and guided:
        raise ApiError(400, f"give 'response_format' or '{guided[0]}', not both", guided[0])
    if len(guided) > 1:
        raise ApiError(400, f"give one of {', '.join(guided)}", guided[1])
    try:
        if guided:
            rf = guided_format(body)
        if rf is not None and (not isinstance(rf, dict) or not isinstance(rf.get("type"), str)):
            raise ValueError("'response_format' must be an object with a 'type'")
        if rf is not None and rf["type"] not in FORMATS:
            raise ValueError(
                f"response_format type {rf['type']!r} is not supported (one of "
                f"{', '.join(FORMATS)})"
            )
        response_structure(rf)
    except ValueError as e:
        raise ApiError(400, str(e), param=guided[0] if guided else "response_format") from None
    return rf


GUIDED = ("guided_json", "guided_regex", "guided_grammar", "grammar")
FORMATS = ("text", "json_object", "json_schema", "grammar", "regex")


def messages(body: Dict[str, Any]) -> List[Dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a 'role'", "messages")
        if m["role"] not in ("system", "developer", "user", "assistant", "tool"):
            raise ApiError(
                400,
                f"messages[{i}].role {m['role']!r} is not one of system, developer, user, "
                "assistant, tool",
                param="messages",
            )
    return msgs


def model_field(body: Dict[str, Any]) -> None:
    m = body.get("model")
    if m is not None and not isinstance(m, str):
        raise ApiError(400, "'model' must be a string", param="model")
