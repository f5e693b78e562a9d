"""DeepSeek V4 chat encoding: messages -> prompt text, and completion text -> message.

DeepSeek ships no Jinja template for V4; each checkpoint carries a Python encoder
(``encoding/encoding_dsv4.py``). This module re-implements its rules (see
``docs/chat-format.md``) so the engine never executes code from a checkpoint. Where the
checkpoint's encoder holds release-specific prompt texts (the reasoning-effort prefixes), they
can be read from that file with :func:`load_encoder_constants`, which parses it with ``ast``.

Behaviour mirrored from the official encoder:

* consecutive ``user`` / ``tool`` messages (no assistant between them) form ONE user turn, their
  parts joined by ``"\\n\\n"``; tool results are ``<tool_result>…</tool_result>`` parts, sorted
  into the call order of the preceding assistant's ``tool_calls`` (matched by id);
* thinking mode with ``drop_thinking`` removes the reasoning of assistant turns before the last
  user/developer message and drops *developer* messages before it; if any message carries
  ``tools`` nothing is dropped (and every user turn then opens with ``<think>``);
* a ``latest_reminder`` role renders as ``<｜latest_reminder｜>`` + content.

Choices of ours (the official encoder asserts or misbehaves here):

* input is validated with :class:`ValueError` (unknown role, bad thinking mode, effort not valid
  for the release, tools on a user/assistant message, tools given twice, internal ``task``
  messages, empty developer message, non-text content parts);
* ``tools=`` / ``response_format=`` arguments attach to the first message when it is a system
  message; otherwise an empty system message is inserted at the front (the prompt then starts
  with BOS + ``"\\n\\n## Tools"``);
* ``content`` may be a list of OpenAI text parts (joined with ``""``); tool-call ``arguments``
  may be a dict as well as a JSON string, and an empty string means no arguments.

Literal special-token text: :func:`encode_messages` returns the prompt *string* and cannot mark
which ``<｜User｜>`` came from the template and which was typed by a user; tokenizing that
string naively turns typed text into control tokens. Like DeepSeek's API, we treat text that
comes from messages (contents, reasoning, tool names/arguments/schemas, tool results) as plain
text: :func:`v4flash.tokenizer.encode_prompt_ids` tokenizes such text without matching added
tokens, so control
tokens come only from the template. For ordinary input its ids equal
``tokenizer.encode(encode_messages(...))`` exactly.
"""

from __future__ import annotations

import ast
import copy
import json
import os
import re
from functools import lru_cache
from typing import Any, Dict, List, Optional, Tuple, Union

# The control tokens, spelled once (docs/chat-format.md §2): the tokenizer looks their ids up by
# these strings (tokenizer.V4Tokenizer), never by number.
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK = "<think>"
END_THINK = "</think>"
DSML = "｜DSML｜"
LATEST_REMINDER = "<｜latest_reminder｜>"
# those the engine needs the ids of, by the name V4Tokenizer gives them (``eos_id``, …)
CONTROL_TOKENS = {
    "bos": BOS,
    "eos": EOS,
    "user": USER,
    "assistant": ASSISTANT,
    "think": THINK,
    "end_think": END_THINK,
}

THINKING_MODES = ("chat", "thinking")
RELEASES = ("preview", "0731")
ROLES = ("system", "user", "developer", "assistant", "tool", "latest_reminder")

# First release "max" == 0731 release "high".
REASONING_EFFORT_ABSOLUTE_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

TOOLS_TEMPLATE = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools "
    'by writing a "<{dsml}tool_calls>" block like the following:\n\n'
    "<{dsml}tool_calls>\n"
    '<{dsml}invoke name="$TOOL_NAME">\n'
    '<{dsml}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
    "</{dsml}parameter>\n"
    "...\n"
    "</{dsml}invoke>\n"
    '<{dsml}invoke name="$TOOL_NAME2">\n'
    "...\n"
    "</{dsml}invoke>\n"
    "</{dsml}tool_calls>\n\n"
    'String parameters should be specified as is and set `string="true"`. For all other types '
    '(numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.'
    "\n\n"
    "If thinking_mode is enabled (triggered by {think}), you MUST output your complete reasoning "
    "inside {think}...{end_think} BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after {end_think} with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{tool_schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool "
    "calls.\n"
)
RESPONSE_FORMAT_HEADER = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
)

_TC_OPEN = f"<{DSML}tool_calls>"
_TC_CLOSE = f"</{DSML}tool_calls>"
TOOL_CALLS_START = f"\n\n<{DSML}tool_calls"  # where parse_completion finds a tool-call block
TOOL_CALLS_END = _TC_CLOSE
_INVOKE_OPEN = f"<{DSML}invoke"
_INVOKE_CLOSE = f"</{DSML}invoke"
_PARAM_OPEN = f"<{DSML}parameter"
_PARAM_CLOSE = f"/{DSML}parameter"

Segment = Tuple[str, bool]  # (text, from_template): False = text that came from the messages


def to_json(value: Any) -> str:
    """JSON as the official encoder writes it: ``ensure_ascii=False``, default separators."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"value is not JSON-serialisable: {err}") from None


# --------------------------------------------------------------------------------------------
# Reasoning-effort texts per release, optionally read from a checkpoint's encoder
# --------------------------------------------------------------------------------------------


def _literal(node: ast.AST, env: Dict[str, Any]) -> Any:
    """Evaluate string literals, their ``+`` concatenation, names of earlier constants and
    dicts of those. Anything else raises ``ValueError`` (nothing is executed)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, env), _literal(node.right, env)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k, env): _literal(v, env) for k, v in zip(node.keys, node.values)}
    raise ValueError("not a string constant")


@lru_cache(maxsize=8)
def _load_constants_cached(path: str, mtime: float, size: int) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot parse the checkpoint encoder: {err}") from None
    env: Dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        else:
            continue
        if not isinstance(target, ast.Name):
            continue
        try:
            env[target.id] = _literal(value, env)
        except ValueError:
            continue
    return env


def encoder_file(checkpoint: Union[str, os.PathLike]) -> Optional[str]:
    """The checkpoint's own encoder (``encoding/encoding_dsv4.py`` in its folder), or None
    when it carries none."""
    p = os.path.join(os.fspath(checkpoint), "encoding", "encoding_dsv4.py")
    return p if os.path.isfile(p) else None


def load_encoder_constants(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """Module-level string constants (and dicts of strings) of a checkpoint's encoder.

    ``path`` is ``encoding/encoding_dsv4.py`` itself or the checkpoint directory holding it.
    The file is parsed with :mod:`ast`, never executed.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        p = os.path.join(p, "encoding", "encoding_dsv4.py")
    if not os.path.isfile(p):
        raise FileNotFoundError(f"checkpoint encoder not found: {p}")
    st = os.stat(p)
    return dict(_load_constants_cached(os.path.abspath(p), st.st_mtime, st.st_size))


def reasoning_effort_texts(
    release: Optional[str] = None, encoder_path: Union[str, os.PathLike, None] = None
) -> Tuple[str, Dict[Optional[str], Optional[str]]]:
    """``(release, {effort: prefix})`` for a release; a ``None`` prefix means "unknown text".

    ``release=None`` means: the layout of ``encoder_path`` if given, else ``"0731"``. The first
    release ("preview") accepts None/"high"/"max" and only "max" adds a prefix; "0731" accepts
    None(=low)/"low"/"high"/"max" with high = the first release's max text.
    """
    if release is not None and release not in RELEASES:
        raise ValueError(f"unknown release {release!r}: expected one of {RELEASES}")
    file_release = None
    texts: Dict[Optional[str], Optional[str]] = {}
    if encoder_path is not None:
        consts = load_encoder_constants(encoder_path)
        prompts = consts.get("REASONING_EFFORT_PROMPTS")
        if isinstance(prompts, dict) and all(isinstance(v, str) for v in prompts.values()):
            file_release = "0731"
            texts = dict(prompts)
            default = consts.get("DEFAULT_REASONING_EFFORT", "low")
            texts[None] = prompts.get(default, "")
        elif isinstance(consts.get("REASONING_EFFORT_MAX"), str):
            file_release = "preview"
            texts = {None: "", "high": "", "max": consts["REASONING_EFFORT_MAX"]}
        else:
            raise ValueError(
                f"{encoder_path}: no REASONING_EFFORT_PROMPTS or REASONING_EFFORT_MAX constant"
            )
        if release is not None and release != file_release:
            raise ValueError(
                f"release={release!r} but {encoder_path} is a {file_release!r}-release encoder"
            )
        return file_release, texts
    release = release or "0731"
    if release == "preview":
        return release, {None: "", "high": "", "max": REASONING_EFFORT_ABSOLUTE_MAX}
    # 0731: the new "max" text ("Reasoning Effort: Beyond maximum — …") is not known here.
    return release, {None: "", "low": "", "high": REASONING_EFFORT_ABSOLUTE_MAX, "max": None}


def _effort_prefix(release, reasoning_effort, encoder_path, thinking: bool) -> str:
    release, texts = reasoning_effort_texts(release, encoder_path)
    if reasoning_effort not in texts:
        allowed = [k for k in texts if k is not None]
        raise ValueError(
            f"reasoning_effort={reasoning_effort!r} is not valid for release {release!r}: "
            f"expected None or one of {allowed}"
        )
    text = texts[reasoning_effort] if thinking else ""
    if text is None:
        raise ValueError(
            f"the {release} release's reasoning_effort={reasoning_effort!r} prompt text is not "
            "available: pass encoder_path= (the checkpoint's encoding/encoding_dsv4.py or its "
            "directory) so it can be read from the checkpoint's own encoder"
        )
    return text


# --------------------------------------------------------------------------------------------
# Message normalisation (mirrors the official merge / sort / drop steps)
# --------------------------------------------------------------------------------------------


def _text(content: Any, where: str, joiner: str = "") -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                parts.append(part.get("text") or "")
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}: unsupported content part {kind!r} (text only)")
        return joiner.join(parts)
    raise ValueError(f"{where}: content must be a string, a list of text parts or None")


def _tool_functions(tools: Any, where: str) -> List[Dict[str, Any]]:
    if not isinstance(tools, list):
        raise ValueError(f"{where}: tools must be a list of OpenAI tool objects")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise ValueError(f"{where}: tools[{i}] has no 'function' object (OpenAI format)")
        out.append(tool["function"])
    return out


def _call_arguments(tc: Any, where: str) -> Tuple[str, Dict[str, Any]]:
    fn = tc.get("function") if isinstance(tc, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f"{where}: a tool call needs function.name (OpenAI format)")
    args = fn.get("arguments")
    if args is None or (isinstance(args, str) and not args.strip()):
        return fn["name"], {}
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = {"arguments": args}  # the official encoder's fallback for non-JSON text
        args = parsed
    if not isinstance(args, dict):
        raise ValueError(f"{where}: tool call arguments must be a JSON object")
    return fn["name"], args


def _normalise(messages: Any, tools: Any, response_format: Any) -> List[Dict[str, Any]]:
    if not isinstance(messages, list):
        raise ValueError("messages must be a list of dicts")
    msgs = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict")
        role = m.get("role")
        if role not in ROLES:
            raise ValueError(f"messages[{i}]: unknown role {role!r}: expected one of {ROLES}")
        if m.get("task") is not None:
            raise ValueError(f"messages[{i}]: internal 'task' messages are not supported")
        if m.get("tools") and role not in ("system", "developer"):
            raise ValueError(f"messages[{i}]: tools belong on a system or developer message")
        if m.get("response_format") and role not in ("system", "developer"):
            raise ValueError(f"messages[{i}]: response_format belongs on a system message")
        msgs.append(copy.copy(m))
    for key, value in (("tools", tools), ("response_format", response_format)):
        if not value:
            continue
        if any(m.get(key) for m in msgs):
            raise ValueError(f"{key} given both as an argument and on a message")
        if not msgs or msgs[0]["role"] != "system":
            msgs.insert(0, {"role": "system", "content": ""})
        msgs[0][key] = value
    return msgs


def _merge_user_turns(msgs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Tool results and user text with no assistant between them form one user turn."""
    out: List[Dict[str, Any]] = []
    call_order: Dict[str, int] = {}
    for i, m in enumerate(msgs):
        role = m["role"]
        if role == "assistant" and m.get("tool_calls"):
            call_order = {}
            for k, tc in enumerate(m["tool_calls"]):
                fn = tc.get("function") if isinstance(tc, dict) else None
                tc_id = tc.get("id") or (fn or {}).get("id") if isinstance(tc, dict) else None
                if tc_id:
                    call_order[tc_id] = k
        if role == "tool":
            part = ("tool", _text(m.get("content"), f"messages[{i}]", "\n\n"))
            part_id = m.get("tool_call_id") or ""
        elif role == "user":
            part, part_id = ("text", _text(m.get("content"), f"messages[{i}]")), None
        else:
            out.append(m)
            continue
        if out and out[-1]["role"] == "user":
            out[-1]["parts"].append((part, part_id))
        else:
            out.append({"role": "user", "parts": [(part, part_id)], "order": call_order})
    for m in out:
        if m["role"] != "user":
            continue
        order = m.pop("order")
        parts = m.pop("parts")
        tool_parts = [p for p in parts if p[0][0] == "tool"]
        if len(tool_parts) > 1 and order:
            tool_parts.sort(key=lambda p: order.get(p[1], 0))
            it = iter(tool_parts)
            parts = [next(it) if p[0][0] == "tool" else p for p in parts]
        m["parts"] = [p[0] for p in parts]
    return out


def _last_user_index(msgs: List[Dict[str, Any]]) -> int:
    for idx in range(len(msgs) - 1, -1, -1):
        if msgs[idx]["role"] in ("user", "developer"):
            return idx
    return -1


def _drop_thinking(msgs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    last = _last_user_index(msgs)
    out = []
    for idx, m in enumerate(msgs):
        if m["role"] in ("user", "system", "latest_reminder") or idx >= last:
            out.append(m)
        elif m["role"] == "assistant":
            m = dict(m)
            m.pop("reasoning_content", None)
            out.append(m)
        # developer messages before the last user message are dropped (as upstream)
    return out


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _render_tools(functions: List[Dict[str, Any]]) -> List[Segment]:
    head, tail = TOOLS_TEMPLATE.split("{tool_schemas}")
    fmt = {"dsml": DSML, "think": THINK, "end_think": END_THINK}
    schemas = "\n".join(to_json(f) for f in functions)
    return [(head.format(**fmt), True), (schemas, False), (tail, True)]


def _render_system_extras(m: Dict[str, Any], where: str) -> List[Segment]:
    out: List[Segment] = []
    if m.get("tools"):
        out += [("\n\n", True)] + _render_tools(_tool_functions(m["tools"], where))
    if m.get("response_format"):
        out += [("\n\n" + RESPONSE_FORMAT_HEADER, True), (to_json(m["response_format"]), False)]
    return out


def _render_tool_calls(tool_calls: Any, where: str) -> List[Segment]:
    if not isinstance(tool_calls, list):
        raise ValueError(f"{where}: tool_calls must be a list")
    out: List[Segment] = [(f"\n\n{_TC_OPEN}\n", True)]
    for k, tc in enumerate(tool_calls):
        name, args = _call_arguments(tc, where)
        if k:
            out.append(("\n", True))
        out += [(f'{_INVOKE_OPEN} name="', True), (name, False), ('">\n', True)]
        for j, (key, value) in enumerate(args.items()):
            is_str = isinstance(value, str)
            out += [
                ("\n" if j else "", True),
                (f'<{DSML}parameter name="', True),
                (str(key), False),
                (f'" string="{"true" if is_str else "false"}">', True),
                (value if is_str else to_json(value), False),
                (f"</{DSML}parameter>", True),
            ]
        out.append((f"\n{_INVOKE_CLOSE}>", True))
    out.append((f"\n{_TC_CLOSE}", True))
    return out


def _render(msgs, index, last_user, thinking: bool, drop: bool, prefix: str) -> List[Segment]:
    """One message and, after a user turn that ends the prompt or precedes an assistant,
    the ``<｜Assistant｜>`` + ``<think>``/``</think>`` suffix (as upstream)."""
    m = msgs[index]
    role = m["role"]
    where = f"message {index} ({role})"
    out: List[Segment] = []
    if index == 0 and thinking and prefix:
        out.append((prefix, True))
    if role == "system":
        out.append((_text(m.get("content"), where), False))
        out += _render_system_extras(m, where)
    elif role == "developer":
        content = _text(m.get("content"), where)
        if not content:
            raise ValueError(f"{where}: a developer message needs content")
        out += [(USER, True), (content, False)] + _render_system_extras(m, where)
    elif role == "user":
        out.append((USER, True))
        for k, (kind, text) in enumerate(m["parts"]):
            if k:
                out.append(("\n\n", True))
            if kind == "tool":
                out += [("<tool_result>", True), (text, False), ("</tool_result>", True)]
            else:
                out.append((text, False))
    elif role == "latest_reminder":
        out += [(LATEST_REMINDER, True), (_text(m.get("content"), where), False)]
    else:  # assistant
        if thinking and (not drop or index > last_user):
            reasoning = m.get("reasoning_content") or ""
            if not isinstance(reasoning, str):
                raise ValueError(f"{where}: reasoning_content must be a string")
            out += [(reasoning, False), (END_THINK, True)]
        out.append((_text(m.get("content"), where), False))
        if m.get("tool_calls"):
            out += _render_tool_calls(m["tool_calls"], where)
        if not m.get("wo_eos"):
            out.append((EOS, True))
    if index + 1 < len(msgs) and msgs[index + 1]["role"] not in ("assistant", "latest_reminder"):
        return out
    if role in ("user", "developer"):
        opens = thinking and (not drop or index >= last_user)
        out.append((ASSISTANT + (THINK if opens else END_THINK), True))
    return out


def encode_segments(
    messages: List[Dict[str, Any]],
    *,
    thinking_mode: str = "chat",
    drop_thinking: bool = True,
    reasoning_effort: Optional[str] = None,
    release: Optional[str] = None,
    tools: Optional[List[Dict[str, Any]]] = None,
    response_format: Any = None,
    encoder_path: Union[str, os.PathLike, None] = None,
    add_bos: bool = True,
) -> List[Segment]:
    """The prompt as ``(text, from_template)`` pieces; the options are described at
    :func:`encode_messages`."""
    if thinking_mode not in THINKING_MODES:
        raise ValueError(f"thinking_mode={thinking_mode!r}: expected one of {THINKING_MODES}")
    thinking = thinking_mode == "thinking"
    prefix = _effort_prefix(release, reasoning_effort, encoder_path, thinking)
    msgs = _merge_user_turns(_normalise(messages, tools, response_format))
    drop = bool(drop_thinking) and not any(m.get("tools") for m in msgs)
    if thinking and drop:
        msgs = _drop_thinking(msgs)
    out: List[Segment] = [(BOS, True)] if add_bos else []
    last_user = _last_user_index(msgs)
    for index in range(len(msgs)):
        out += _render(msgs, index, last_user, thinking, drop, prefix)
    return [s for s in out if s[0]]


def encode_messages(messages: List[Dict[str, Any]], **options: Any) -> str:
    """Render OpenAI-style messages into the DeepSeek V4 prompt string.

    Args (``messages``, then the keyword-only options :func:`encode_segments` takes):
        messages: dicts with ``role`` in system/user/developer/assistant/tool/latest_reminder;
            assistant messages may carry ``reasoning_content``, ``tool_calls`` (OpenAI format)
            and ``wo_eos`` (no EOS: a partial answer to continue); tool messages
            ``tool_call_id``; system/developer messages ``tools`` and ``response_format``.
        thinking_mode: ``"chat"`` (prompt ends ``<｜Assistant｜></think>``) or ``"thinking"``
            (ends ``<｜Assistant｜><think>``).
        drop_thinking: in thinking mode, drop the reasoning of turns before the last user
            message (ignored when any message carries tools).
        reasoning_effort: thinking mode only (validated in both). See
            :func:`reasoning_effort_texts` for what each release accepts.
        release: ``"preview"`` (first release) or ``"0731"``; None = from ``encoder_path``'s
            layout, else ``"0731"``.
        tools: OpenAI tools, attached to the first system message (one is inserted if absent).
        response_format: JSON schema object, attached like ``tools``.
        encoder_path: the checkpoint's ``encoding/encoding_dsv4.py`` (or its directory) to read
            the release's reasoning-effort texts from; needed for 0731 ``"max"``.
        add_bos: start with BOS (as the official encoder does without a context).
    """
    return "".join(text for text, _ in encode_segments(messages, **options))


# --------------------------------------------------------------------------------------------
# Parsing a completion
# --------------------------------------------------------------------------------------------


def _read_until(text: str, index: int, stops: List[str]) -> Tuple[int, str, Optional[str]]:
    best, found = len(text), None
    for stop in stops:
        pos = text.find(stop, index)
        if pos != -1 and pos < best:
            best, found = pos, stop
    if found is None:
        return len(text), text[index:], None
    return best + len(found), text[index:best], found


_NAME_RE = re.compile(r'\s*name="(.*?)">\n\n?', re.DOTALL)
_PARAM_RE = re.compile(r' name="(.*?)" string="(true|false)">(.*?)<', re.DOTALL)


def _parse_tool_calls(text: str, index: int) -> Tuple[int, List[Dict[str, str]]]:
    """Parse after ``<｜DSML｜tool_calls``; returns the index after ``</｜DSML｜tool_calls>``."""
    calls: List[Dict[str, str]] = []
    while True:
        index, gap, stop = _read_until(text, index, [_INVOKE_OPEN, _TC_CLOSE])
        if gap != ">\n" or stop is None:
            raise ValueError(f"tool-call format error: expected '>\\n' but got {gap[:40]!r}")
        if stop != _INVOKE_OPEN:
            return index, calls
        index, head, stop = _read_until(text, index, [_PARAM_OPEN, _INVOKE_CLOSE])
        m = _NAME_RE.fullmatch(head)
        if m is None or stop is None:
            raise ValueError(f"tool-call format error in invoke header {head[:60]!r}")
        name, args = m.group(1), []
        seen = set()
        while stop == _PARAM_OPEN:
            index, body, stop = _read_until(text, index, [_PARAM_CLOSE])
            pm = _PARAM_RE.fullmatch(body)
            if pm is None or stop is None:
                raise ValueError(f"tool-call parameter format error: {body[:60]!r}")
            key, is_str, value = pm.groups()
            if key in seen:
                raise ValueError(f"duplicate tool-call parameter {key!r}")
            seen.add(key)
            args.append(f"{to_json(key)}: {to_json(value) if is_str == 'true' else value}")
            index, gap, stop = _read_until(text, index, [_PARAM_OPEN, _INVOKE_CLOSE])
            if gap != ">\n" or stop is None:
                raise ValueError(f"tool-call format error: expected '>\\n' but got {gap[:40]!r}")
        calls.append({"name": name, "arguments": "{" + ", ".join(args) + "}"})


def parse_completion(text: str, *, thinking_mode: str, strict: bool = False) -> Dict[str, Any]:
    """Split generated text (everything after the prompt) into an assistant message.

    Returns ``{"role": "assistant", "content", "reasoning_content", "tool_calls"}`` with
    ``tool_calls`` in OpenAI format (``arguments`` a JSON string, built as the official parser
    does: string parameters JSON-quoted, others copied verbatim). In thinking mode the reasoning
    is the text up to ``</think>``; a leading ``<think>`` (the prompt's last token, when the
    caller passes it along) is not part of it. A trailing EOS is stripped.

    ``strict=True`` enforces the official parser's checks (``</think>`` present in thinking
    mode, EOS present, no control-token text left in content or reasoning). The default is
    lenient for output cut short by a token limit: a missing EOS is fine and, in thinking mode,
    a missing ``</think>`` makes all text reasoning. A malformed DSML block always raises
    :class:`ValueError`.
    """
    if thinking_mode not in THINKING_MODES:
        raise ValueError(f"thinking_mode={thinking_mode!r}: expected one of {THINKING_MODES}")
    if not isinstance(text, str):
        raise ValueError("text must be a string")
    tc_start = TOOL_CALLS_START
    reasoning, index, tool_calls = "", 0, []
    if thinking_mode == "thinking":
        start = len(THINK) if text.startswith(THINK) else 0
        index, reasoning, stop = _read_until(text, start, [END_THINK, tc_start])
        if stop != END_THINK:
            if strict:
                raise ValueError("invalid thinking output: missing </think>")
            if stop is None:
                return _message("", reasoning.replace(EOS, ""), [])
            index -= len(stop)  # tool calls without </think>: lenient, parse them below
    index, content, stop = _read_until(text, index, [EOS, tc_start])
    if stop == tc_start:
        index, tool_calls = _parse_tool_calls(text, index)
        index, rest, stop = _read_until(text, index, [EOS])
        if rest:
            raise ValueError(f"unexpected text after the tool calls: {rest[:40]!r}")
    if strict:
        if stop != EOS:
            raise ValueError("invalid output: missing EOS")
        if index != len(text):
            raise ValueError(f"unexpected text after EOS: {text[index:][:40]!r}")
        for tok in (BOS, EOS, THINK, END_THINK, DSML):
            if tok in content or tok in reasoning:
                raise ValueError(f"unexpected control token {tok!r} in the output text")
    elif index != len(text):
        content += text[index:].replace(EOS, "")  # text after an early EOS: keep, don't lose it
    return _message(content, reasoning, tool_calls)


def _message(content: str, reasoning: str, calls: List[Dict[str, str]]) -> Dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [
            {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ],
    }
