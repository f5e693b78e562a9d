"""OpenAI's Responses API (``POST /v1/responses``, ``GET/DELETE /v1/responses/{id}``), the
dialect current Codex speaks, translated onto the same chat request as chat completions (same
DSML tool rendering, same prompt cache, same parsing). This module translates only: a request
body (``instructions``, ``input`` as text or items, function tools, ``reasoning``, ``text``
format) into a :class:`ChatRequest`, and the engine's events into the response object or its
streamed events (``response.created``, ``response.output_item.added``,
``response.output_text.delta``, ``response.function_call_arguments.delta``, …,
``response.completed``).

``previous_response_id`` continues a response the server kept: the kept conversation (its
input items and output) is put before the new input. Responses are kept in RAM, bounded
(``ResponseStore``), unless ``store`` is false. Tools that are not functions (Codex sends
``web_search``, ``image_generation``, ``namespace`` …) are accepted and left out: this model
calls functions only. ``reasoning.effort`` maps through the same table as chat's
``reasoning_effort``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

from ..textapi.api import collect_chat
from .chat_request import ChatRequest, collected, prepare, streamed
from .errors import ApiError
from .http import Exchange, Route


class BadRequest(ValueError):
    """A request this dialect refuses (a 400 in OpenAI's error shape)."""


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise BadRequest(message)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def error_body(e: ApiError) -> Dict[str, Any]:
    return {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.code}}


class ResponseStore:
    """Responses kept for ``previous_response_id``: the conversation each one ends (as chat
    messages) and its JSON; at most ``max_items``, least recently used first out."""

    def __init__(self, max_items: int = 256):
        self.max_items = max_items
        self._items: OrderedDict[str, Tuple[List[Dict[str, Any]], Dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, messages: List[Dict[str, Any]], doc: Dict[str, Any]) -> None:
        if self.max_items <= 0:
            return
        with self._lock:
            self._items[rid] = (messages, doc)
            self._items.move_to_end(rid)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def get(self, rid: str) -> Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]:
        with self._lock:
            hit = self._items.get(rid)
            if hit is not None:
                self._items.move_to_end(rid)
            return hit

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._items.pop(rid, None) is not None


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    _need(isinstance(content, list), f"{where} must be a string or a list of content parts")
    parts = []
    for j, p in enumerate(content):
        _need(isinstance(p, dict), f"{where}[{j}] must be an object")
        t = p.get("type")
        if t in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            _need(isinstance(p.get("text"), str), f"{where}[{j}] needs a string 'text'")
            parts.append(p["text"])
        elif t in ("input_image", "input_file", "input_audio"):
            raise BadRequest(f"{where}[{j}]: {t} is not supported (this model reads text only)")
        elif t == "refusal":
            parts.append(p.get("refusal", ""))
        else:
            raise BadRequest(f"{where}[{j}]: unsupported content type {t!r}")
    return "".join(parts)


def input_messages(body: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``input`` (and ``instructions``) as chat messages."""
    out: List[Dict[str, Any]] = []
    inp = body.get("input", [])
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    _need(isinstance(inp, list), "'input' must be a string or a list of items")
    pending_reasoning: List[str] = []
    for i, item in enumerate(inp):
        where = f"input[{i}]"
        _need(isinstance(item, dict), f"{where} must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            _need(
                role in ("user", "assistant", "system", "developer"),
                f"{where}.role must be user, assistant, system or developer",
            )
            text = _content_text(item.get("content", ""), f"{where}.content")
            msg: Dict[str, Any] = {"role": role, "content": text}
            if role == "assistant" and pending_reasoning:
                msg["reasoning_content"] = "".join(pending_reasoning)
                pending_reasoning = []
            out.append(msg)
        elif kind == "function_call":
            for key in ("call_id", "name"):
                _need(isinstance(item.get(key), str), f"{where} needs a string '{key}'")
            args = item.get("arguments", "{}")
            _need(isinstance(args, str), f"{where}.arguments must be a JSON string")
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": args},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                msg = {"role": "assistant", "content": "", "tool_calls": [call]}
                if pending_reasoning:
                    msg["reasoning_content"] = "".join(pending_reasoning)
                    pending_reasoning = []
                out.append(msg)
        elif kind == "function_call_output":
            _need(isinstance(item.get("call_id"), str), f"{where} needs a string 'call_id'")
            output = item.get("output", "")
            if not isinstance(output, str):
                output = _content_text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind == "reasoning":
            for part in item.get("content") or item.get("summary") or []:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    pending_reasoning.append(part["text"])
        elif kind in ("item_reference",):
            raise BadRequest(f"{where}: item references are not supported")
        else:
            raise BadRequest(f"{where}: unsupported item type {kind!r}")
    return out


EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max", "none")


def parse_request(
    body: Any, store: Optional[ResponseStore] = None
) -> Tuple[ChatRequest, List[Dict[str, Any]], Dict[str, Any]]:
    """A ``/v1/responses`` body: (the chat request, the conversation so far as chat messages
    — what a later ``previous_response_id`` continues —, the request's echo fields)."""
    _need(isinstance(body, dict), "the request body must be a JSON object")
    history: List[Dict[str, Any]] = []
    prev = body.get("previous_response_id")
    if prev is not None:
        _need(isinstance(prev, str), "'previous_response_id' must be a string")
        kept = store.get(prev) if store is not None else None
        if kept is None:
            raise BadRequest(
                f"previous response {prev!r} is not kept by this server (it was not stored, "
                "was evicted, or the server restarted): send the whole input instead"
            )
        history = [dict(m) for m in kept[0]]
    instructions = body.get("instructions")
    messages = [m for m in history if m["role"] != "system"]
    if instructions is not None:
        _need(isinstance(instructions, str), "'instructions' must be a string")
        messages.insert(0, {"role": "system", "content": instructions})
    new = input_messages(body)
    messages += new
    _need(bool(new) or bool(history), "'input' is empty")
    req = ChatRequest(messages=messages)
    tools = body.get("tools")
    if tools is not None:
        _need(isinstance(tools, list), "'tools' must be a list")
        fns = []
        for i, t in enumerate(tools):
            _need(isinstance(t, dict), f"tools[{i}] must be an object")
            if t.get("type") != "function":
                continue  # web_search, image_generation, namespace, …: not available here
            _need(isinstance(t.get("name"), str), f"tools[{i}] needs a string 'name'")
            # {name, description, parameters}: the order chat's tools render in
            fn: Dict[str, Any] = {"name": t["name"]}
            if isinstance(t.get("description"), str):
                fn["description"] = t["description"]
            fn["parameters"] = t.get("parameters") or {"type": "object"}
            if t.get("strict") is True:  # the call generated under the schema's grammar
                fn["strict"] = True
            fns.append({"type": "function", "function": fn})
        req.tools = fns or None
    choice = body.get("tool_choice")
    if choice in (None, "auto", "none", "required"):
        req.tool_choice = choice if (choice != "required" or req.tools) else None
        if choice == "required" and not req.tools:
            raise BadRequest("tool_choice 'required' but no function tools are given")
    elif isinstance(choice, dict) and choice.get("type") == "function":
        _need(isinstance(choice.get("name"), str), "tool_choice of type 'function' needs a 'name'")
        req.tool_choice = {"type": "function", "function": {"name": choice["name"]}}
    elif isinstance(choice, dict):
        req.tool_choice = "auto"  # allowed_tools, hosted tools: let the model choose
    else:
        raise BadRequest("'tool_choice' must be 'auto', 'none', 'required' or an object")
    reasoning = body.get("reasoning")
    if reasoning is not None:
        _need(isinstance(reasoning, dict), "'reasoning' must be an object")
        effort = reasoning.get("effort")
        if effort is not None:
            _need(effort in EFFORTS, f"reasoning.effort must be one of {', '.join(EFFORTS)}")
            req.reasoning_effort = effort
    mx = body.get("max_output_tokens")
    if mx is not None:
        _need(
            isinstance(mx, int) and not isinstance(mx, bool) and mx >= 1,
            "'max_output_tokens' must be a positive integer",
        )
        req.max_new_tokens = mx
    for key in ("temperature", "top_p"):
        v = body.get(key)
        if v is not None:
            _need(
                isinstance(v, (int, float)) and not isinstance(v, bool),
                f"'{key}' must be a number",
            )
            req.sampling[key] = v
    if body.get("top_k") is not None:
        _need(isinstance(body["top_k"], int), "'top_k' must be an integer")
        req.sampling["top_k"] = body["top_k"]
    text = body.get("text")
    if isinstance(text, dict) and isinstance(text.get("format"), dict):
        fmt = text["format"]
        if fmt.get("type") == "json_schema":
            req.response_format = {
                "type": "json_schema",
                "json_schema": {
                    "name": fmt.get("name", "response"),
                    "schema": fmt.get("schema", {}),
                    "strict": fmt.get("strict", False),
                },
            }
        elif fmt.get("type") == "json_object":
            req.response_format = {"type": "json_object"}
    stream = body.get("stream", False)
    _need(isinstance(stream, bool), "'stream' must be true or false")
    req.stream = stream
    echo = {
        "instructions": instructions,
        "previous_response_id": prev,
        "tools": tools or [],
        "tool_choice": choice if choice is not None else "auto",
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "max_output_tokens": mx,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "reasoning": {"effort": reasoning.get("effort") if reasoning else None, "summary": None},
        "text": text if isinstance(text, dict) else {"format": {"type": "text"}},
        "store": body.get("store", True) is not False,
        "metadata": body.get("metadata") or {},
        "truncation": body.get("truncation", "disabled"),
        "user": body.get("user"),
    }
    return req, messages, echo


# --------------------------------------------------------------------------------------------
# Engine events → the response object and its streamed events
# --------------------------------------------------------------------------------------------
def usage_json(usage: Any) -> Dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class ResponseBuilder:
    """Builds one response as the engine's events arrive, both as the final object and as the
    stream of events with their ``sequence_number``."""

    def __init__(self, model: str, echo: Dict[str, Any]):
        self.id = new_id("resp")
        self.model = model
        self.echo = echo
        self.created = int(time.time())
        self.output: List[Dict[str, Any]] = []
        self.seq = 0
        self.open: Optional[Dict[str, Any]] = None  # the reasoning or message item streaming
        self.usage: Optional[Dict[str, Any]] = None
        self.status = "in_progress"
        self.incomplete: Optional[Dict[str, Any]] = None

    def doc(self) -> Dict[str, Any]:
        text = "".join(
            part["text"]
            for item in self.output
            if item["type"] == "message"
            for part in item["content"]
            if part["type"] == "output_text"
        )
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": None,
            "incomplete_details": self.incomplete,
            "model": self.model,
            "output": self.output,
            "output_text": text,
            "usage": self.usage,
            **self.echo,
        }

    def _ev(self, kind: str, **data: Any) -> Dict[str, Any]:
        ev = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return ev

    @staticmethod
    def sse(ev: Dict[str, Any]) -> bytes:
        return f"event: {ev['type']}\ndata: {json.dumps(ev)}\n\n".encode()

    def start(self) -> List[Dict[str, Any]]:
        return [
            self._ev("response.created", response=self.doc()),
            self._ev("response.in_progress", response=self.doc()),
        ]

    def _close_open(self) -> List[Dict[str, Any]]:
        item = self.open
        if item is None:
            return []
        self.open = None
        idx = self.output.index(item)
        part = item["content"][0]
        at = {"item_id": item["id"], "output_index": idx, "content_index": 0}
        message = item["type"] == "message"
        kind = "output_text" if message else "reasoning_text"
        out = [self._ev(f"response.{kind}.done", text=part["text"], **at)]
        if message:
            out.append(self._ev("response.content_part.done", part=part, **at))
        item["status"] = "completed"
        out.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return out

    def _open_item(self, kind: str) -> List[Dict[str, Any]]:
        out = self._close_open()
        if kind == "message":
            item = {
                "type": "message",
                "id": new_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            }
        else:
            item = {
                "type": "reasoning",
                "id": new_id("rs"),
                "status": "in_progress",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
            }
        self.output.append(item)
        self.open = item
        idx = len(self.output) - 1
        out.append(self._ev("response.output_item.added", output_index=idx, item=item))
        if kind == "message":
            out.append(
                self._ev(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=idx,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        return out

    def on(self, kind: str, value: Any) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = []
        if kind in ("reasoning", "content") and value:
            want = "reasoning" if kind == "reasoning" else "message"
            if self.open is None or self.open["type"] != want:
                out += self._open_item(want)
            item = self.open
            assert item is not None
            item["content"][0]["text"] += value
            name = (
                "response.reasoning_text.delta"
                if want == "reasoning"
                else ("response.output_text.delta")
            )
            out.append(
                self._ev(
                    name,
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    content_index=0,
                    delta=value,
                )
            )
        elif kind == "tool_call":
            out += self._close_open()
            item = {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": value["id"],
                "name": value["function"]["name"],
                "arguments": "",
                "status": "in_progress",
            }
            self.output.append(item)
            idx = len(self.output) - 1
            out.append(self._ev("response.output_item.added", output_index=idx, item=dict(item)))
            args = value["function"]["arguments"]
            out.append(
                self._ev(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=idx,
                    delta=args,
                )
            )
            item["arguments"] = args
            out.append(
                self._ev(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=idx,
                    arguments=args,
                )
            )
            item["status"] = "completed"
            out.append(self._ev("response.output_item.done", output_index=idx, item=item))
        return out

    def finish(self, end: Dict[str, Any]) -> List[Dict[str, Any]]:
        out = self._close_open()
        self.usage = usage_json(end["usage"])
        if end["finish_reason"] == "length":
            self.status = "incomplete"
            self.incomplete = {"reason": "max_output_tokens"}
            out.append(self._ev("response.incomplete", response=self.doc()))
        else:
            self.status = "completed"
            out.append(self._ev("response.completed", response=self.doc()))
        return out

    def messages(self) -> List[Dict[str, Any]]:
        """The answer as chat messages (what a later ``previous_response_id`` continues)."""
        reasoning = "".join(
            i["content"][0]["text"] for i in self.output if i["type"] == "reasoning"
        )
        content = "".join(i["content"][0]["text"] for i in self.output if i["type"] == "message")
        msg: Dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = reasoning
        calls = [
            {
                "id": i["call_id"],
                "type": "function",
                "function": {"name": i["name"], "arguments": i["arguments"]},
            }
            for i in self.output
            if i["type"] == "function_call"
        ]
        if calls:
            msg["tool_calls"] = calls
        return [msg]


# --------------------------------------------------------------------------------------------
# Endpoints
# --------------------------------------------------------------------------------------------
def _store(x: Exchange) -> ResponseStore:
    return x.engine.responses


def _request(x: Exchange) -> Tuple[ChatRequest, List[Dict[str, Any]], Dict[str, Any]]:
    """The body, read and translated (``parse_request``); its refusal is a 400."""
    try:
        return parse_request(x.read_json(), _store(x))
    except BadRequest as e:
        raise ApiError(400, str(e)) from None


def create(x: Exchange) -> int:
    """``POST /v1/responses``: JSON, or the event stream with ``stream: true``."""
    req, messages, echo = _request(x)
    job = prepare(x, req, "input")
    b = ResponseBuilder(x.engine.name, echo)
    if not req.stream:
        r = collected(x, "input", collect_chat, job)
        events: List[Any] = [("reasoning", r.reasoning), ("content", r.content)]
        events += [("tool_call", c) for c in r.tool_calls]
        for kind, value in events:
            b.on(kind, value)
        b.finish({"finish_reason": r.finish_reason, "usage": r.usage})
        doc = b.doc()
        if echo["store"]:
            _store(x).put(b.id, messages + b.messages(), doc)
        x.send_json(200, doc)
        return 200
    x.start_sse()

    def send(evs: List[Dict[str, Any]]) -> None:
        for ev in evs:
            x.chunk(ResponseBuilder.sse(ev))

    def error_event(err: ApiError) -> None:
        b.status = "failed"
        doc = dict(b.doc(), error={"code": err.code or "server_error", "message": err.message})
        send([b._ev("response.failed", response=doc)])
        x.end_chunks()

    end, status = streamed(
        x, "input", job, lambda: send(b.start()), lambda k, v: send(b.on(k, v)), error_event
    )
    if end is None:
        return status
    send(b.finish(end))
    if echo["store"]:
        _store(x).put(b.id, messages + b.messages(), b.doc())
    x.end_chunks()
    return 200


def _kept(x: Exchange) -> Tuple[str, Optional[Tuple[List[Dict[str, Any]], Dict[str, Any]]]]:
    rid = x.route[len("/responses/") :]
    return rid, _store(x).get(rid)


def get(x: Exchange) -> int:
    rid, kept = _kept(x)
    if kept is None:
        raise ApiError(404, f"no response {rid!r} is kept by this server", kind="not_found")
    x.send_json(200, kept[1])
    return 200


def delete(x: Exchange) -> int:
    rid = x.route[len("/responses/") :]
    if not _store(x).delete(rid):
        raise ApiError(404, f"no response {rid!r} is kept by this server", kind="not_found")
    x.send_json(200, {"id": rid, "object": "response", "deleted": True})
    return 200


def input_tokens(x: Exchange) -> int:
    """``POST /v1/responses/input_tokens``: the prompt tokens the request would use."""
    req, _, _ = _request(x)
    req.max_new_tokens = 1
    job = prepare(x, req, "input")
    x.send_json(200, {"object": "response.input_tokens", "input_tokens": len(job.prompt)})
    return 200


ROUTES = {
    ("POST", "/responses"): Route(create, error_body),
    ("POST", "/responses/input_tokens"): Route(input_tokens, error_body),
    ("GET", "/responses/*"): Route(get, error_body),
    ("DELETE", "/responses/*"): Route(delete, error_body),
}
