"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``), the dialect
Claude Code speaks, translated onto the same chat request as OpenAI's chat completions: the
same DSML tool rendering, the same prompt cache, the same answer parsing. This module only
translates: a request body into a :class:`ChatRequest` (OpenAI-shaped messages and tools), and
the engine's events into Anthropic's response object or its SSE event sequence.

Conventions (so that every dialect answers a request the same way): a tool's ``input_schema``
is its ``parameters``; ``thinking: {"type": "enabled"}`` is DeepSeek's thinking mode with no
effort prefix and ``budget_tokens`` caps the reasoning (the engine then closes it with
``</think>``); usage counts are the engine's (``input_tokens`` + ``cache_read_input_tokens`` =
the prompt tokens chat completions reports); ``cache_control`` and ``metadata`` are accepted
and ignored (the prompt cache is automatic); images and documents are refused with a 400.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Dict, List, Optional, Tuple

from ..textapi.api import collect_chat
from .chat_request import ChatRequest, collected, prepare, streamed
from .errors import ApiError
from .http import Exchange, Route

# --------------------------------------------------------------------------------------------
# Errors in Anthropic's shape
# --------------------------------------------------------------------------------------------
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_json(status: int, message: str) -> Dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
    }


def error_body(e: ApiError) -> Dict[str, Any]:
    return error_json(e.status, e.message)


class BadRequest(ValueError):
    """A request this dialect refuses (a 400 in Anthropic's error shape)."""


# --------------------------------------------------------------------------------------------
# Request → chat request
# --------------------------------------------------------------------------------------------
def _need(cond: bool, message: str) -> None:
    if not cond:
        raise BadRequest(message)


def _block_text(b: Any, where: str) -> Optional[str]:
    """A text block's text; None for another kind of block. Images and documents are refused
    (this model reads text only)."""
    _need(isinstance(b, dict), f"{where} must be an object")
    t = b.get("type")
    if t in ("image", "document"):
        raise BadRequest(f"{where}: {t} blocks are not supported (this model reads text only)")
    if t != "text":
        return None
    _need(isinstance(b.get("text"), str), f"{where}: a text block needs a string 'text'")
    return b["text"]


def _text_of(content: Any, where: str) -> str:
    """A ``tool_result``'s or a system prompt's content: a string, or text blocks."""
    if isinstance(content, str):
        return content
    _need(isinstance(content, list), f"{where} must be a string or a list of text blocks")
    parts = []
    for j, b in enumerate(content):
        text = _block_text(b, f"{where}[{j}]")
        if text is None:
            raise BadRequest(f"{where}[{j}]: unsupported block type {b.get('type')!r}")
        parts.append(text)
    return "\n".join(parts)


def _messages(body: Dict[str, Any]) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_of(system, "'system'")})
    msgs = body.get("messages")
    _need(isinstance(msgs, list) and bool(msgs), "'messages' must be a non-empty list")
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        _need(isinstance(m, dict), f"{where} must be an object")
        role = m.get("role")
        _need(role in ("user", "assistant"), f"{where}.role must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        _need(isinstance(content, list), f"{where}.content must be a string or a list of blocks")
        texts: List[str] = []
        reasoning: List[str] = []
        calls: List[Dict[str, Any]] = []
        results: List[Dict[str, Any]] = []
        for j, b in enumerate(content):
            bw = f"{where}.content[{j}]"
            text = _block_text(b, bw)
            t = b.get("type")
            if text is not None:
                texts.append(text)
            elif t == "tool_use" and role == "assistant":
                _need(isinstance(b.get("id"), str), f"{bw}: tool_use needs a string 'id'")
                _need(isinstance(b.get("name"), str), f"{bw}: tool_use needs a string 'name'")
                args = b.get("input", {})
                _need(isinstance(args, dict), f"{bw}: tool_use 'input' must be an object")
                calls.append(
                    {
                        "id": b["id"],
                        "type": "function",
                        "function": {"name": b["name"], "arguments": json.dumps(args)},
                    }
                )
            elif t == "tool_result" and role == "user":
                _need(
                    isinstance(b.get("tool_use_id"), str),
                    f"{bw}: tool_result needs a string 'tool_use_id'",
                )
                text = _text_of(b.get("content", ""), f"{bw}.content")
                if b.get("is_error"):
                    text = f"Error: {text}"
                results.append({"role": "tool", "tool_call_id": b["tool_use_id"], "content": text})
            elif t in ("thinking", "redacted_thinking") and role == "assistant":
                if isinstance(b.get("thinking"), str):
                    reasoning.append(b["thinking"])
            else:
                raise BadRequest(f"{bw}: unsupported block type {t!r} in a {role} message")
        if role == "user":
            out.extend(results)
            if texts or not results:
                out.append({"role": "user", "content": "\n".join(texts)})
        else:
            msg: Dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if reasoning:
                msg["reasoning_content"] = "".join(reasoning)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    return out


def _tools(body: Dict[str, Any]) -> Tuple[Optional[List[Dict[str, Any]]], Any]:
    tools = body.get("tools")
    if tools is None:
        converted = None
    else:
        _need(isinstance(tools, list), "'tools' must be a list")
        converted = []
        for i, t in enumerate(tools):
            _need(isinstance(t, dict), f"tools[{i}] must be an object")
            kind = t.get("type", "custom")
            if kind not in ("custom", None) and "input_schema" not in t:
                # server tools (web_search, bash, …) are Anthropic's own: not available here
                raise BadRequest(f"tools[{i}]: server tool {kind!r} is not supported")
            _need(isinstance(t.get("name"), str), f"tools[{i}] needs a string 'name'")
            schema = t.get("input_schema", {"type": "object", "properties": {}})
            _need(isinstance(schema, dict), f"tools[{i}].input_schema must be an object")
            # {name, description, parameters}: the order chat's tools render in
            fn: Dict[str, Any] = {"name": t["name"]}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            fn["parameters"] = schema
            if t.get("strict") is True:  # the call generated under the schema's grammar
                fn["strict"] = True
            converted.append({"type": "function", "function": fn})
    choice = body.get("tool_choice")
    if choice is None:
        return converted, None
    _need(isinstance(choice, dict), "'tool_choice' must be an object")
    kind = choice.get("type")
    if kind == "auto":
        return converted, "auto"
    if kind == "any":
        return converted, "required"
    if kind == "none":
        return converted, "none"
    if kind == "tool":
        _need(isinstance(choice.get("name"), str), "tool_choice of type 'tool' needs a 'name'")
        return converted, {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest("tool_choice.type must be 'auto', 'any', 'tool' or 'none'")


def _number(body: Dict[str, Any], key: str) -> Any:
    v = body.get(key)
    if v is None:
        return None
    _need(
        isinstance(v, (int, float)) and not isinstance(v, bool),
        f"'{key}' must be a number, got {json.dumps(v)[:80]}",
    )
    return v


def _integer(body: Dict[str, Any], key: str) -> Any:
    v = body.get(key)
    if v is None:
        return None
    _need(
        isinstance(v, int) and not isinstance(v, bool),
        f"'{key}' must be an integer, got {json.dumps(v)[:80]}",
    )
    return v


def parse_request(body: Any) -> ChatRequest:
    """A ``/v1/messages`` body as a chat request (``BadRequest`` naming the field)."""
    _need(isinstance(body, dict), "the request body must be a JSON object")
    req = ChatRequest(messages=_messages(body))
    req.tools, req.tool_choice = _tools(body)
    max_tokens = _integer(body, "max_tokens")
    _need(max_tokens is not None, "'max_tokens' is required")
    _need(max_tokens >= 1, f"'max_tokens' must be >= 1, got {max_tokens}")
    req.max_new_tokens = max_tokens
    for key in ("temperature", "top_p"):
        v = _number(body, key)
        if v is not None:
            req.sampling[key] = v
    top_k = _integer(body, "top_k")
    if top_k is not None:
        req.sampling["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None:
        _need(
            isinstance(stops, list) and all(isinstance(s, str) and s for s in stops),
            "'stop_sequences' must be a list of non-empty strings",
        )
        req.stop = list(stops)
    thinking = body.get("thinking")
    if thinking is not None:
        _need(isinstance(thinking, dict), "'thinking' must be an object")
        kind = thinking.get("type")
        if kind == "enabled":
            req.thinking = True
            budget = thinking.get("budget_tokens")
            if budget is not None:
                _need(
                    isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1,
                    "thinking.budget_tokens must be a positive integer",
                )
                req.reasoning_budget = budget
        elif kind not in ("disabled", None):
            raise BadRequest("thinking.type must be 'enabled' or 'disabled'")
    req.response_format = _output_format(body)
    stream = body.get("stream", False)
    _need(isinstance(stream, bool), "'stream' must be true or false")
    req.stream = stream
    return req


def _output_format(body: Dict[str, Any]) -> Any:
    """Structured output: ``output_config.format`` (the SDK's ``{"type": "json_schema",
    "schema": ...}``; the beta's ``output_format`` the same), as a response format."""
    oc = body.get("output_config")
    _need(oc is None or isinstance(oc, dict), "'output_config' must be an object")
    fmt = (oc or {}).get("format", body.get("output_format"))
    if fmt is None:
        return None
    _need(
        isinstance(fmt, dict) and fmt.get("type") == "json_schema",
        'output_config.format must be {"type": "json_schema", "schema": {...}}',
    )
    _need(isinstance(fmt.get("schema"), dict), "output_config.format.schema must be an object")
    return {"type": "json_schema", "json_schema": {"schema": fmt["schema"]}}


# --------------------------------------------------------------------------------------------
# Engine events → Anthropic responses
# --------------------------------------------------------------------------------------------
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def usage_json(usage: Any) -> Dict[str, int]:
    """Anthropic usage from the engine's: input_tokens + cache_read_input_tokens = prompt."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": usage.completion_tokens,
    }


def stop_reason(end: Dict[str, Any]) -> Tuple[str, Optional[str]]:
    """(stop_reason, stop_sequence) of a finished run."""
    if end.get("stop_string"):
        return "stop_sequence", end["stop_string"]
    return STOP_REASONS.get(end["finish_reason"], "end_turn"), None


def _tool_use(call: Dict[str, Any]) -> Dict[str, Any]:
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = {"_raw": call["function"]["arguments"]}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args}


def message_json(result: Any, model: str, msg_id: Optional[str] = None) -> Dict[str, Any]:
    """A finished chat result as Anthropic's message object."""
    content: List[Dict[str, Any]] = []
    if result.reasoning:
        content.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if result.content:
        content.append({"type": "text", "text": result.content})
    content += [_tool_use(c) for c in result.tool_calls]
    reason, seq = stop_reason(
        {"finish_reason": result.finish_reason, "stop_string": result.stop_string}
    )
    return {
        "id": msg_id or new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage_json(result.usage),
    }


class StreamWriter:
    """Turns the engine's events into Anthropic's SSE event sequence: ``message_start``, then
    for each content block ``content_block_start`` / ``content_block_delta`` (``thinking_delta``,
    ``text_delta``, ``input_json_delta``) / ``content_block_stop``, then ``message_delta`` with
    ``stop_reason`` and usage, and ``message_stop``. ``ping`` events keep a long prefill alive."""

    def __init__(self, model: str, prompt_tokens: int, cached_tokens: int):
        self.model = model
        self.id = new_message_id()
        self.index = -1
        self.open: Optional[str] = None  # "thinking" | "text"
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens

    @staticmethod
    def event(kind: str, data: Dict[str, Any]) -> bytes:
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    def start(self) -> bytes:
        return self.event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.id,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": self.prompt_tokens - self.cached_tokens,
                        "cache_read_input_tokens": self.cached_tokens,
                        "cache_creation_input_tokens": 0,
                        "output_tokens": 0,
                    },
                },
            },
        )

    def ping(self) -> bytes:
        return self.event("ping", {"type": "ping"})

    def _close(self) -> List[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [
            self.event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        ]

    def _open(self, block: Dict[str, Any]) -> List[bytes]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        out.append(
            self.event(
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def on(self, kind: str, value: Any) -> List[bytes]:
        """The SSE events for one engine event (``reasoning``, ``content``, ``tool_call``)."""
        out: List[bytes] = []
        if kind == "reasoning" and value:
            if self.open != "thinking":
                out += self._open({"type": "thinking", "thinking": ""})
            delta = {"type": "thinking_delta", "thinking": value}
        elif kind == "content" and value:
            if self.open != "text":
                out += self._open({"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": value}
        elif kind == "tool_call":
            use = _tool_use(value)
            out += self._open(
                {"type": "tool_use", "id": use["id"], "name": use["name"], "input": {}}
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}
            out.append(self._delta(delta))
            out += self._close()
            return out
        else:
            return out
        out.append(self._delta(delta))
        return out

    def _delta(self, delta: Dict[str, Any]) -> bytes:
        return self.event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.index, "delta": delta},
        )

    def finish(self, end: Dict[str, Any]) -> List[bytes]:
        out = self._close()
        reason, seq = stop_reason(end)
        usage = end["usage"]
        out.append(
            self.event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": usage_json(usage),
                },
            )
        )
        out.append(self.event("message_stop", {"type": "message_stop"}))
        return out

    def error(self, status: int, message: str) -> bytes:
        return self.event("error", error_json(status, message))


# --------------------------------------------------------------------------------------------
# Endpoints
# --------------------------------------------------------------------------------------------
def _request(x: Exchange) -> Tuple[Dict[str, Any], ChatRequest]:
    body = x.read_json()
    try:
        return body, parse_request(body)
    except BadRequest as e:
        raise ApiError(400, str(e)) from None


def messages(x: Exchange) -> int:
    """``POST /v1/messages``: JSON, or SSE with ``stream: true``."""
    body, req = _request(x)
    job = prepare(x, req)
    model = body["model"] if isinstance(body.get("model"), str) else x.engine.name
    if not req.stream:
        r = collected(x, "messages", collect_chat, job)
        x.send_json(200, message_json(r, model))
        return 200
    x.start_sse(ping=StreamWriter.event("ping", {"type": "ping"}))
    w = StreamWriter(model, len(job.prompt), 0)

    def on(kind: str, value: Any) -> None:
        if kind == "start":
            w.cached_tokens = value["cached_tokens"]
            x.chunk(w.start())
            return
        for frame in w.on(kind, value):
            x.chunk(frame)

    def error_event(err: ApiError) -> None:
        x.chunk(w.error(err.status, err.message))
        x.end_chunks()

    end, status = streamed(x, "messages", job, lambda: None, on, error_event)
    if end is None:
        return status
    for frame in w.finish(end):
        x.chunk(frame)
    x.end_chunks()
    return 200


def count_tokens(x: Exchange) -> int:
    """``POST /v1/messages/count_tokens``: the prompt tokens the request would use (what the
    answer's ``input_tokens`` + ``cache_read_input_tokens`` adds up to)."""
    body = x.read_json()
    body.setdefault("max_tokens", 1)
    try:
        req = parse_request(body)
    except BadRequest as e:
        raise ApiError(400, str(e)) from None
    req.max_new_tokens = 1
    job = prepare(x, req)
    x.send_json(200, {"input_tokens": len(job.prompt)})
    return 200


ROUTES = {
    ("POST", "/messages"): Route(messages, error_body),
    ("POST", "/messages/count_tokens"): Route(count_tokens, error_body),
}
