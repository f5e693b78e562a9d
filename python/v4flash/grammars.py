"""What a constrained answer must be, as grammars the core compiles (``_core.Vocabulary``):
a request's ``response_format`` (:func:`response_structure`) and the chat format's tool-call
block (:func:`tool_call_grammar`, built from ``encoding``'s markup, so what it allows is what
``encoding.parse_completion`` reads back).

Grammars are llguidance's: JSON Schema, its Lark dialect (``%json`` for JSON inside) and
regular expressions. JSON is generated compactly (no optional whitespace).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .encoding import _INVOKE_CLOSE, _INVOKE_OPEN, _TC_CLOSE, _TC_OPEN, DSML, _tool_functions

# llguidance's JSON options: no optional whitespace, the separators alone
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
# a tool call's JSON parameters as the official encoder writes them (json.dumps' separators)
ENCODER_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
KINDS = ("json_schema", "json_object", "lark", "regex")
FLAGS = ("true", "false")  # a parameter's string="…": raw text, or JSON
# what a raw (string="true") parameter keeps of its schema; other keywords make it JSON
RAW_KEYS = {"type", "enum", "const", "minLength", "maxLength", "pattern", "description", "title"}
RAW_KEYS |= {"default", "examples", "$comment"}


@dataclass(frozen=True)
class Structure:
    """A response format: the grammar (``kind``, ``source``) and what the prompt shows of it
    (``prompt``: the schema DeepSeek's encoder renders, or None)."""

    kind: str
    source: str
    prompt: Optional[Dict[str, Any]]


def _schema_text(schema: Any, where: str) -> str:
    if not isinstance(schema, (dict, bool)):
        raise ValueError(f"{where} must be a JSON Schema object")
    try:
        return json.dumps(schema, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where} is not JSON: {e}") from None


def _gbnf(text: str) -> bool:
    return "::=" in text


def response_structure(rf: Any) -> Optional[Structure]:
    """The constraint a ``response_format`` asks for (None: free text). Accepted: OpenAI's
    ``{"type": "text"}``, ``{"type": "json_object"}``, ``{"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}}``; ``{"type": "grammar", "grammar": LARK}``
    and ``{"type": "regex", "regex": ...}``; or a bare JSON Schema (what the text API took
    before: any other object). ``ValueError`` for anything else."""
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise ValueError("response_format must be an object")
    t = rf.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return Structure("json_object", "", {"type": "object"})
    if t == "json_schema" and "json_schema" in rf:
        js = rf["json_schema"]
        schema = js.get("schema") if isinstance(js, dict) else None
        if schema is None:
            raise ValueError("response_format.json_schema.schema must be a JSON Schema object")
        return Structure(
            "json_schema", _schema_text(schema, "response_format.json_schema.schema"), schema
        )
    if t == "grammar":
        g = rf.get("grammar")
        if not isinstance(g, str) or not g.strip():
            raise ValueError("response_format.grammar must be a Lark grammar (a string)")
        if _gbnf(g):
            raise ValueError(
                "response_format.grammar looks like GBNF (llama.cpp's '::='): a Lark grammar "
                "is expected (llguidance's dialect: 'start: ...')"
            )
        return Structure("lark", g, None)
    if t == "regex":
        r = rf.get("regex", rf.get("pattern"))
        if not isinstance(r, str):
            raise ValueError("response_format.regex must be a regular expression (a string)")
        return Structure("regex", r, None)
    if isinstance(t, str) and t in ("json_schema", "grammar", "regex", "lark"):
        raise ValueError(f"response_format of type {t!r} is missing its {t!r} field")
    # a bare JSON Schema (the text API's older form)
    return Structure("json_schema", _schema_text(rf, "response_format"), rf)


def guided_format(body: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """vLLM's guided decoding fields (``guided_json``, ``guided_regex``, ``guided_grammar``)
    and llama.cpp's ``grammar``, at a request's top level, as a response format (the first
    one given; None when there is none)."""
    if body.get("guided_json") is not None:
        return {"type": "json_schema", "json_schema": {"schema": body["guided_json"]}}
    if body.get("guided_regex") is not None:
        return {"type": "regex", "regex": body["guided_regex"]}
    for key in ("guided_grammar", "grammar"):
        if body.get(key) is not None:
            return {"type": "grammar", "grammar": body[key]}
    return None


def _lit(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # llguidance reads a Lark literal as JSON


def _marked(text: str, dsml: str) -> str:
    """``text`` of the markup as Lark: literals, and ``dsml`` (``<[id]>``: the token) for
    each ``｜DSML｜`` in it."""
    parts = text.split(DSML)
    out = []
    for k, p in enumerate(parts):
        if k:
            out.append(dsml)
        if p:
            out.append(_lit(p))
    return " ".join(out)


def _string_kind(s: Any) -> Optional[bool]:
    """True: only strings validate (written raw, ``string="true"``); False: no string does
    (JSON, ``string="false"``); None: either may."""
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return isinstance(s["const"], str)
    if isinstance(s.get("enum"), list) and s["enum"]:
        kinds = {isinstance(v, str) for v in s["enum"]}
        return kinds.pop() if len(kinds) == 1 else None
    t = s.get("type")
    if isinstance(t, str):
        return t == "string"
    if isinstance(t, list) and t:
        return None if "string" in t else False
    return None


def _raw_string(s: Dict[str, Any], term: str, close: str) -> str:
    """A terminal: a string parameter's raw text (``enum``, ``const``, ``minLength``,
    ``maxLength``, ``pattern`` kept) and ``close``, the markup's ``</`` after it (a value ends
    where the markup goes on)."""
    values = [s["const"]] if "const" in s else s.get("enum")
    if isinstance(values, list) and all(isinstance(v, str) for v in values):
        return f"{term}: ({' | '.join(_lit(v) for v in values)}) {_lit(close)}"
    parts = []
    lo, hi = s.get("minLength"), s.get("maxLength")
    if isinstance(lo, int) or isinstance(hi, int):
        lo = lo if isinstance(lo, int) and lo > 0 else 0
        top = str(hi) if isinstance(hi, int) and hi >= lo else ""
        parts.append(f"/(?s:.{{{lo},{top}}})/")
    pattern = s.get("pattern")
    if isinstance(pattern, str):
        # a JSON Schema pattern searches; a lexeme matches whole: unanchored ends grow .*
        p = pattern[1:] if pattern.startswith("^") else "(?s:.*)" + pattern
        p = p[:-1] if p.endswith("$") and not p.endswith("\\$") else p + "(?s:.*)"
        parts.append("/" + p.replace("/", "\\/") + "/")
    body = "(" + " & ".join(parts) + ")" if parts else "/(?s:.*)/"
    return f"{term}: {body} {_lit(close)}"


def _invoke(k: int, fn: Dict[str, Any], d: str, rules: List[str]) -> str:
    """Rules of one function's invoke (named ``i_k``), as ``_render_tool_calls`` writes it,
    with the ``\n`` before it. Each stretch of markup between two ``｜DSML｜`` tokens is one
    literal: llguidance's lexer is greedy, so a literal never ends where a longer one that
    shares its start could go on (``"\n" "<"`` against ``"\n</"``)."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = (
        set(params.get("required") or []) if isinstance(params.get("required"), list) else set()
    )
    close = f"</{DSML}parameter>"
    items: List[Tuple[str, bool]] = []
    for j, (key, schema) in enumerate(props.items()):
        head = {v: _marked(f'\n<{DSML}parameter name="{key}" string="{v}">', d) for v in FLAGS}
        alts = []
        kind = _string_kind(schema)
        if kind is True and isinstance(schema, dict) and set(schema) - RAW_KEYS:
            kind = False  # a keyword raw text cannot hold (format, …): a JSON string instead
        if kind is not False:
            term = f"SV_{k}_{j}"
            rules.append(_raw_string(schema if isinstance(schema, dict) else {}, term, close[:2]))
            alts.append(f"{head['true']} {term} {_marked(close[2:], d)}")
        if kind is not True:
            js = dict(schema) if isinstance(schema, dict) else {}
            js["x-guidance"] = ENCODER_JSON
            rules.append(f"pj_{k}_{j}: %json {json.dumps(js)}")
            alts.append(f"{head['false']} pj_{k}_{j} {_marked(close, d)}")
        rules.append(f"p_{k}_{j}: " + " | ".join(alts))
        items.append((f"p_{k}_{j}", key in required))
    # r_k_i: a non-empty run of the parameters from i on (each with its "\n" before it), a
    # required one never left out
    for i in range(len(items) - 1, -1, -1):
        p, req = items[i]
        alts = [p]
        if i + 1 < len(items):
            later_required = any(r for _, r in items[i + 1 :])
            alts = [f"{p} r_{k}_{i + 1}"] + ([] if later_required else [p])
            if not req:
                alts.append(f"r_{k}_{i + 1}")
        rules.append(f"r_{k}_{i}: " + " | ".join(alts))
    opening = _marked(f'\n{_INVOKE_OPEN} name="{fn["name"]}">', d)
    closing = _marked(f"\n{_INVOKE_CLOSE}>", d)
    empty = _marked(f"\n\n{_INVOKE_CLOSE}>", d)  # no arguments: a blank line
    if not items:
        body = empty
    elif any(r for _, r in items):
        body = f"r_{k}_0 {closing}"
    else:
        body = f"(r_{k}_0 {closing} | {empty})"
    rules.append(f"i_{k}: {opening} {body}")
    return f"i_{k}"


def tool_call_grammar(
    tools: List[Dict[str, Any]],
    dsml_token: str,
    names: Optional[List[str]] = None,
    text_first: bool = False,
    answer: Optional[str] = None,
) -> str:
    """A Lark grammar of the tool-call block (docs/chat-format.md §6), as
    ``encoding._render_tool_calls`` renders it: one or more invokes of the functions
    ``names`` (default: every tool), each with the parameters of its ``parameters`` schema
    in the schema's order (the required ones always), string values raw (``string="true"``),
    others JSON the schema validates, with the encoder's separators (``string="false"``).
    ``dsml_token``: how the grammar names the ``｜DSML｜`` token (``<[id]>``).
    ``text_first``: text (never holding the markup) may come first, and the block may be left
    out; ``answer``: a Lark expression the answer may be instead of the block (a response
    format)."""
    d = dsml_token
    rules: List[str] = []
    invokes = [
        _invoke(k, fn, d, rules)
        for k, fn in enumerate(_tool_functions(tools, "tools"))
        if isinstance(fn.get("name"), str) and (names is None or fn["name"] in names)
    ]
    if not invokes:
        raise ValueError("no tool to call: the tools named are not among the tools given")
    rules.append("invoke: " + " | ".join(invokes))
    calls = f"invoke+ {_marked(chr(10) + _TC_CLOSE, d)}"
    opening = "\n\n" + _TC_OPEN
    if text_first:
        # text that never holds the markup, or text that ends where a block begins
        rules.append(f"TEXT: /(?s:.*)/ & ~/(?s:.*){DSML}(?s:.*)/")
        head, tail = opening.split(DSML, 1)
        rules.append(f"CALL_TEXT: /(?s:.*){json.dumps(head)[1:-1]}/ & ~/(?s:.*){DSML}(?s:.*)/")
        start = f"TEXT | CALL_TEXT {d} {_lit(tail)} {calls}"
    else:
        start = f"{_marked(opening, d)} {calls}"
    if answer is not None:
        start = f"{answer} | {start}"
    return "\n".join([f"start: {start}"] + rules) + "\n"
