"""Constrained answers: a model's vocabulary as the core's grammar engine sees it (made once
per model, :func:`vocabulary_for`) and the grammars a request compiles (:func:`constrain`,
:func:`tool_constraint`), each compiled once per model and content by the core's cache.

A grammar that cannot be compiled is a ``ValueError`` naming the problem (the server answers
it with a 400), never an unconstrained answer.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from .. import _core
from ..grammars import COMPACT_JSON, Structure, tool_call_grammar
from .attached import _attached, tokenizer_for


class GrammarError(ValueError):
    """A grammar that cannot be compiled; ``param`` names the request field it came from."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def token_words(tok: Any, size: int) -> List[bytes]:
    """Each id's bytes as the grammar engine expects them: an added token (``<｜User｜>``,
    ``｜DSML｜``, …) is b"\\xff" then its text, so only a grammar that names it (``<[id]>``)
    lets the model write it; ids the tokenizer does not know are empty (never allowed)."""
    added = {i: t for t, i in tok.added_tokens.items()}
    words = []
    for i in range(size):
        if i in added:
            words.append(b"\xff" + added[i].encode("utf-8"))
        elif tok.id_to_token(i) is None:
            words.append(b"")
        else:
            words.append(tok.token_bytes(i))
    return words


def _make_vocabulary(model: Any) -> Any:
    tok = tokenizer_for(model)
    size = int(model.config.vocab_size)
    return _core.Vocabulary(token_words(tok, size), tok.eos_id)


def vocabulary_for(model: Any) -> Any:
    """The model's ``_core.Vocabulary`` (its grammar engine and compiled grammars), made on
    first use."""
    return _attached(model, "_text_vocabulary", _make_vocabulary)


def compile_grammar(model: Any, kind: str, source: str, param: str = "response_format") -> Any:
    """A ``_core.Grammar`` for ``model`` (:class:`GrammarError` naming what is wrong)."""
    try:
        return vocabulary_for(model).compile(kind, source)
    except ValueError as e:
        raise GrammarError(str(e), param) from None


def constrain(model: Any, s: Optional[Structure]) -> Any:
    """The compiled grammar of a response format, or None."""
    return None if s is None else compile_grammar(model, s.kind, s.source)


def _inline(s: Structure) -> str:
    """A JSON response format as a Lark expression (``%json``)."""
    schema: Any = {"type": "object"} if s.kind == "json_object" else json.loads(s.source)
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError("a response format's schema must be an object to go with tool calls")
    schema = dict(schema)
    schema.setdefault("x-guidance", COMPACT_JSON)
    return "%json " + json.dumps(schema, ensure_ascii=False)


def tool_constraint(
    model: Any,
    tools: List[Dict[str, Any]],
    names: Optional[List[str]],
    forced: bool,
    answer: Optional[Structure],
) -> Any:
    """The compiled grammar of the model's tool calls: a block of calls to ``names`` (None:
    any tool) when ``forced``; else the answer (``answer``'s JSON, or text) or a block."""
    tok = tokenizer_for(model)
    dsml = tok.token_to_id("｜DSML｜")
    if dsml is None:
        raise ValueError("this tokenizer has no ｜DSML｜ token: tool calls cannot be constrained")
    inline = None
    if not forced and answer is not None:
        if answer.kind not in ("json_schema", "json_object"):
            raise ValueError(
                f"a {answer.kind} response format cannot go with strict tools: use JSON"
            )
        inline = _inline(answer)
    grammar = tool_call_grammar(
        tools,
        f"<[{dsml}]>",
        names=names,
        text_first=not forced and inline is None,
        answer=inline,
    )
    return compile_grammar(model, "lark", grammar, "tools")
