"""Structured output (issue 47): answers generated under a grammar always hold.

On the bundled demo model, which writes prose when left to itself: JSON Schemas of the kinds
applications send, each answer parsed and validated with ``jsonschema`` at several
temperatures and seeds; json_object, regular expressions and Lark grammars; tool calls
generated under the tools' schemas; thinking mode; the server's dialects and their SDKs; bad
grammars as 400s; a grammar that allows every token changes nothing.
"""

from __future__ import annotations

import json
import re

import anthropic
import httpx
import jsonschema
import pytest

import v4flash
from conftest import main_  # noqa: E402
from test_server import HELLO, TIMEOUT, Running, ScriptedModel  # noqa: E402
from v4flash.demo import demo_path
from v4flash.textapi import collect_chat, prepare_chat
from v4flash.textapi.constraints import compile_grammar, token_words

S = "string"
I = "integer"  # noqa: E741


def obj(props, required=None, **kw):
    """An object schema: every property required unless said, no other property."""
    req = list(props) if required is None else required
    return {"type": "object", "properties": props, "required": req, **kw} | (
        {} if "additionalProperties" in kw else {"additionalProperties": False}
    )


def text(n):
    return {"type": S, "maxLength": n}


def integer(lo, hi):
    return {"type": I, "minimum": lo, "maximum": hi}


# what applications send: extraction, classification, nested objects, arrays with bounds,
# numeric bounds, anyOf / oneOf, $defs / $ref, patterns, maxLength, optional fields
SCHEMAS = {
    "extract_person": obj({"name": text(24), "age": integer(0, 120), "email": text(30)}),
    "classify": obj({"label": {"enum": ["spam", "ham", "unsure"]}, "score": integer(0, 100)}),
    "sentiment": {"enum": ["positive", "negative", "neutral"]},
    "address": obj(
        {
            "street": text(30),
            "city": text(20),
            "zip": {"type": S, "pattern": "^[0-9]{5}$"},
        }
    ),
    "nested": obj(
        {"user": obj({"id": integer(1, 999), "handle": text(12)}), "active": {"type": "boolean"}}
    ),
    "tags": obj(
        {
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 3,
            }
        }
    ),
    "line_items": obj(
        {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": obj(
                    {"sku": {"type": S, "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "qty": integer(1, 9)}
                ),
            }
        }
    ),
    "weather": obj({"temperature": integer(-50, 50), "humidity": integer(0, 100)}),
    "exclusive": obj(
        {
            "n": {"type": I, "exclusiveMinimum": 0, "exclusiveMaximum": 10},
            "m": {"type": I, "multipleOf": 5, "minimum": 0, "maximum": 100},
        }
    ),
    "any_of": obj({"value": {"anyOf": [integer(0, 9), {"enum": ["none", "many"]}]}}),
    "one_of": {
        "oneOf": [
            obj({"kind": {"const": "circle"}, "r": integer(1, 9)}),
            obj({"kind": {"const": "square"}, "side": integer(1, 9)}),
        ]
    },
    "defs_ref": {
        "$defs": {
            "name": text(16),
            "pet": obj({"name": {"$ref": "#/$defs/name"}, "legs": integer(0, 8)}),
        },
        **obj({"owner": {"$ref": "#/$defs/name"}, "pet": {"$ref": "#/$defs/pet"}}),
    },
    "optional": obj(
        {"title": text(20), "subtitle": text(20), "year": integer(1900, 2100)}, required=["title"]
    ),
    "booleans": obj({"done": {"type": "boolean"}, "urgent": {"type": "boolean"}}),
    "const": obj({"version": {"const": 2}, "ok": {"type": "boolean"}}),
    "min_max_length": obj({"title": {"type": S, "minLength": 3, "maxLength": 12}}),
    "date": obj({"date": {"type": S, "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}}),
    "mixed_enum": obj({"v": {"enum": [1, "two", None, True]}}),
    "nullable": obj({"note": {"type": [S, "null"], "maxLength": 10}}),
    "tuple": {
        "type": "array",
        "prefixItems": [integer(0, 9), {"enum": ["a", "b"]}],
        "items": False,
        "minItems": 2,
    },
    "top_string": {"type": S, "maxLength": 15},
    "open_object": {
        "type": "object",
        "properties": {"a": {"enum": [1, 2]}},
        "required": ["a"],
        "maxProperties": 1,
    },
    "ids": obj({"ids": {"type": "array", "items": integer(0, 99), "minItems": 2, "maxItems": 4}}),
    "lang_code": obj({"lang": {"type": S, "pattern": "^[a-z]{2}(-[A-Z]{2})?$"}}),
}
SETTINGS = [
    dict(temperature=0.0, seed=0),
    dict(temperature=0.8, seed=1),
    dict(temperature=1.5, seed=2),
]
ASK = [{"role": "user", "content": "Answer in JSON."}]


def rf_of(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


@pytest.fixture(scope="module")
def m():
    return v4flash.load(demo_path())


def test_the_suite_is_at_least_twenty_schemas_of_real_kinds():
    assert len(SCHEMAS) >= 20
    for schema in SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_answer_validates(m, name):
    schema = SCHEMAS[name]
    for s in SETTINGS:
        r = m.chat(ASK, response_format=rf_of(schema, name), max_new_tokens=160, **s)
        assert r.finish_reason == "stop", (name, s, r.text)
        value = json.loads(r.content)
        jsonschema.validate(value, schema)
        # compact: no whitespace that JSON makes optional
        assert r.content == json.dumps(value, ensure_ascii=False, separators=(",", ":")), r.content


def test_the_demo_writes_prose_without_a_constraint(m):
    r = m.chat(ASK, max_new_tokens=40, temperature=0.8, seed=1)
    with pytest.raises(ValueError):
        json.loads(r.content)


@pytest.mark.parametrize("name", ["extract_person", "one_of", "defs_ref", "tags"])
def test_thinking_answers_validate(m, name):
    schema = SCHEMAS[name]
    for s in SETTINGS:
        r = answer(m, True, response_format=rf_of(schema), **s)
        assert r.finish_reason == "stop", r.text
        assert r.reasoning and r.content, "never an empty answer"
        jsonschema.validate(json.loads(r.content), schema)


def test_eos_in_the_reasoning_becomes_its_end(m):
    # the demo often ends its reasoning with EOS: while the answer's grammar waits, that EOS
    # becomes </think> and the constrained answer follows
    tok = m.tokenizer
    ends = 0
    for seed in range(8):
        r = m.chat(ASK, thinking=True, response_format=rf_of(SCHEMAS["sentiment"]), seed=seed)
        assert r.finish_reason == "stop" and r.content, r.text
        assert json.loads(r.content) in SCHEMAS["sentiment"]["enum"]
        assert r.ids.count(tok.eos_id) == 1 and r.ids[-1] == tok.eos_id
        ends += tok.end_think_id in r.ids
    assert ends == 8


def test_streaming_equals_the_whole_answer(m):
    for name in ("address", "line_items"):
        for s in SETTINGS:
            kw = dict(response_format=rf_of(SCHEMAS[name]), max_new_tokens=160, **s)
            whole = m.chat(ASK, **kw)
            parts = list(m.chat_stream(ASK, **kw))
            assert "".join(p.content for p in parts) == whole.content
            assert parts[-1].finish_reason == whole.finish_reason == "stop"


def test_json_object_gives_an_object(m):
    for s in SETTINGS:
        r = m.chat(ASK, response_format={"type": "json_object"}, max_new_tokens=400, **s)
        if r.finish_reason == "stop":
            assert isinstance(json.loads(r.content), dict)
        else:  # a long object cut by the limit is still the start of one
            assert r.finish_reason == "length" and r.content.startswith("{")


def test_a_bare_schema_is_taken_as_before(m):
    schema = SCHEMAS["classify"]
    r = m.chat(ASK, response_format=schema, max_new_tokens=80, seed=3)
    jsonschema.validate(json.loads(r.content), schema)
    # the prompt shows the schema as DeepSeek's encoder renders it, whichever form is given
    a = m.chat(ASK, response_format=schema, max_new_tokens=1, seed=3)
    b = m.chat(ASK, response_format=rf_of(schema), max_new_tokens=1, seed=3)
    assert a.usage.prompt_tokens == b.usage.prompt_tokens


def test_regex_and_lark_are_obeyed(m):
    rx = "[a-z]{3}-[0-9]{2}"
    lark = 'start: greeting " " NAME "!"\ngreeting: "hello" | "bye"\nNAME: /[A-Z][a-z]{1,6}/\n'
    for s in SETTINGS:
        r = m.complete("Code:", response_format={"type": "regex", "regex": rx}, **s)
        assert re.fullmatch(rx, r.text), r.text
        r = m.complete("Say:", grammar=lark, max_new_tokens=40, **s)
        assert re.fullmatch(r"(hello|bye) [A-Z][a-z]{1,6}!", r.text), r.text
        c = m.chat(ASK, response_format={"type": "grammar", "grammar": lark}, **s)
        assert re.fullmatch(r"(hello|bye) [A-Z][a-z]{1,6}!", c.content), c.content


def test_a_grammar_allowing_every_token_changes_nothing(m):
    every = "start: <[*]>*"
    for s in SETTINGS + [dict(temperature=1.0, top_p=0.9, top_k=40, seed=5)]:
        free = m.complete("Once upon a time", max_new_tokens=40, **s)
        held = m.complete("Once upon a time", max_new_tokens=40, grammar=every, **s)
        assert held.ids == free.ids
        free = m.chat(ASK, max_new_tokens=30, **s)
        held = m.chat(
            ASK, max_new_tokens=30, response_format={"type": "grammar", "grammar": every}, **s
        )
        assert held.ids == free.ids


def test_the_limit_inside_the_structure_is_length(m):
    r = m.chat(ASK, response_format=rf_of(SCHEMAS["extract_person"]), max_new_tokens=3, seed=1)
    assert r.finish_reason == "length" and r.content.startswith("{")


@pytest.mark.parametrize(
    "rf, fragment",
    [
        (rf_of({"type": "strin"}), "strin"),
        (rf_of({"$ref": "#/$defs/missing"}), "missing"),
        (rf_of({"type": "integer", "minimum": 3, "maximum": 1}), "minimum"),
        (rf_of({"type": "object", "uniqueItems": True, "properties": {"a": {"not": {}}}}), "not"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
        ({"type": "grammar", "grammar": "start: foo"}, "foo"),
        ({"type": "grammar", "grammar": 'root ::= "a"'}, "GBNF"),
        ({"type": "regex", "regex": "(ab"}, "regular expression"),
        ([1], "must be an object"),
    ],
)
def test_bad_grammars_are_value_errors(m, rf, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        m.chat(ASK, response_format=rf, max_new_tokens=4)


def test_grammars_compile_once_per_model(m):
    g1 = compile_grammar(m, "regex", "[0-9]{4}")
    before = m._text_vocabulary.cache_stats()
    g2 = compile_grammar(m, "regex", "[0-9]{4}")
    after = m._text_vocabulary.cache_stats()
    assert (after[1], after[2]) == (before[1] + 1, before[2]) and g1.kind == g2.kind == "regex"
    # the vocabulary: added tokens marked, every id of the model present
    words = token_words(m.tokenizer, m.config.vocab_size)
    assert len(words) == m.config.vocab_size
    assert words[m.tokenizer.eos_id] == b"\xff" + "<｜end▁of▁sentence｜>".encode()


# --- tool calls ------------------------------------------------------------------------------

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": obj(
            {
                "city": text(12),
                "unit": {"enum": ["c", "f"]},
                "days": integer(1, 7),
                "from": {"type": S, "format": "date"},  # not raw text: a JSON string
            },
            required=["city", "from"],
        ),
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": obj(
            {
                "query": {"type": S, "minLength": 1, "maxLength": 10},
                "limit": integer(1, 20),
                "filters": obj({"lang": {"enum": ["en", "fr"]}}),
            },
            required=["query", "filters"],
        ),
    },
}
TOOLS = [WEATHER, SEARCH]
SCHEMA_OF = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check_calls(calls, names=None):
    assert calls
    for c in calls:
        fn = (
            c["function"]
            if isinstance(c, dict)
            else {"name": c.function.name, "arguments": c.function.arguments}
        )
        assert fn["name"] in (names or SCHEMA_OF)
        args = json.loads(fn["arguments"])
        jsonschema.validate(args, SCHEMA_OF[fn["name"]], format_checker=jsonschema.FormatChecker())


def answer(m, thinking, **kw):
    """A chat answer; in thinking mode with a reasoning budget (greedy reasoning can loop)."""
    job = prepare_chat(m, ASK, thinking=thinking, max_new_tokens=300, **kw)
    job.reasoning_budget = 120 if thinking else None
    return collect_chat(job)


def test_forced_tool_calls_validate(m):
    named = {"type": "function", "function": {"name": "search"}}
    for s in SETTINGS:
        for thinking in (False, True):
            r = answer(m, thinking, tools=TOOLS, tool_choice="required", **s)
            assert r.finish_reason == "tool_calls", r.text
            check_calls(r.tool_calls)
            r = answer(m, thinking, tools=TOOLS, tool_choice=named, **s)
            assert r.finish_reason == "tool_calls", r.text
            check_calls(r.tool_calls, ["search"])


def test_forced_tool_choice_is_generated_under_a_grammar():
    d = "｜DSML｜"
    block = f'\n\n<{d}tool_calls>\n<{d}invoke name="get_weather">\n\n</{d}invoke>\n</{d}tool_calls>'
    fake = ScriptedModel(block)
    s = Running(fake, name="scripted")
    try:
        r = s.client().chat.completions.create(
            model="scripted", messages=HELLO, tools=TOOLS, tool_choice="required"
        )
        # no opening is fed any more: the whole block is generated under the tools' grammar
        assert fake.tok.decode(fake.prompts[-1]).endswith("</think>")
        assert fake.constraints[-1].kind == "lark"
        calls = r.choices[0].message.tool_calls
        assert [(t.function.name, t.function.arguments) for t in calls] == [("get_weather", "{}")]
    finally:
        s.close()


def test_strict_tools_in_auto_mode(m):
    strict = [dict(t, function=dict(t["function"], strict=True)) for t in TOOLS]
    for seed in range(4):
        r = m.chat(ASK, tools=strict, max_new_tokens=200, seed=seed)
        if r.tool_calls:
            check_calls(r.tool_calls)
        assert "｜DSML｜" not in r.content
        # with a response format: the JSON answer or calls
        r = m.chat(ASK, tools=strict, response_format=rf_of(SCHEMAS["classify"]), seed=seed)
        if r.tool_calls:
            check_calls(r.tool_calls)
        else:
            jsonschema.validate(json.loads(r.content), SCHEMAS["classify"])


def test_the_tool_grammar_holds_what_the_encoder_writes(m):
    # blocks the official renderer writes for valid arguments are in the grammar (token by
    # token, as the tokenizer splits them) and parse back to those arguments
    from v4flash.encoding import encode_messages, parse_completion
    from v4flash.grammars import tool_call_grammar

    tok = m.tokenizer
    g = compile_grammar(m, "lark", tool_call_grammar(TOOLS, f"<[{tok.token_to_id('｜DSML｜')}]>"))
    calls = [
        [("get_weather", {"city": "Paris", "from": "2024-05-01"})],
        [("get_weather", {"city": "Oslo", "unit": "c", "days": 3, "from": "2025-01-31"})],
        [
            ("search", {"query": "cats", "filters": {"lang": "fr"}}),
            ("search", {"query": "x", "limit": 2, "filters": {"lang": "en"}}),
        ],
    ]
    for group in calls:
        tcs = [
            {"type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for n, a in group
        ]
        msgs = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": "", "tool_calls": tcs},
        ]
        text = encode_messages(msgs)
        block = text[text.index("\n\n<｜DSML｜tool_calls>") : text.rindex("<｜end▁of▁sentence｜>")]
        # the format-holding string goes as JSON (string="false"): what our grammar writes
        block = re.sub(r'(name="from" string=)"true">([^<]*)<', r'\1"false">"\2"<', block)
        parsed = parse_completion(block, thinking_mode="chat")
        assert [json.loads(c["function"]["arguments"]) for c in parsed["tool_calls"]] == [
            a for _, a in group
        ]
        ids = tok.encode(block) + [tok.eos_id]
        assert len(m._text_vocabulary._mask_times(g, ids)) == len(ids)
    with pytest.raises(ValueError, match="not allowed"):
        bad = '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="nope">'
        m._text_vocabulary._mask_times(g, tok.encode(bad))


# --- the server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(m):
    s = Running(m, name="demo", max_tokens=300)
    yield s
    s.close()


def test_openai_sdk_json_schema_and_strict_tools(server):
    c = server.client()
    schema = SCHEMAS["line_items"]
    for seed in (1, 2):
        r = c.chat.completions.create(
            model="demo", messages=ASK, response_format=rf_of(schema), seed=seed
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
        strict = [dict(t, function=dict(t["function"], strict=True)) for t in TOOLS]
        r = c.chat.completions.create(
            model="demo", messages=ASK, tools=strict, tool_choice="required", seed=seed
        )
        assert r.choices[0].finish_reason == "tool_calls"
        check_calls(r.choices[0].message.tool_calls)
    # streamed: the same answer
    kw = dict(model="demo", messages=ASK, response_format=rf_of(schema), seed=4, temperature=0.9)
    whole = c.chat.completions.create(**kw).choices[0].message.content
    parts = c.chat.completions.create(stream=True, **kw)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == whole


def test_completions_with_vllm_and_llama_cpp_fields(server):
    c = server.client()
    r = c.completions.create(
        model="demo", prompt="Code:", extra_body={"guided_regex": "[A-Z]{2}[0-9]"}
    )
    assert re.fullmatch("[A-Z]{2}[0-9]", r.choices[0].text)
    r = c.completions.create(
        model="demo", prompt="x", extra_body={"guided_grammar": 'start: "a" | "b"'}
    )
    assert r.choices[0].text in ("a", "b")
    r = c.completions.create(
        model="demo", prompt="x", max_tokens=100, extra_body={"guided_json": SCHEMAS["weather"]}
    )
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS["weather"])


def test_responses_text_format(server):
    schema = SCHEMAS["classify"]
    fmt = {"type": "json_schema", "name": "c", "schema": schema, "strict": True}
    r = server.client().responses.create(model="demo", input="Classify.", text={"format": fmt})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_anthropic_sdk_output_config(server):
    schema = SCHEMAS["extract_person"]
    c = anthropic.Anthropic(base_url=server.url, api_key="none", timeout=TIMEOUT, max_retries=0)
    r = c.messages.create(
        model="demo",
        max_tokens=300,
        messages=[{"role": "user", "content": "Who?"}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.content[0].text), schema)
    tool = {"name": "search", "input_schema": SCHEMA_OF["search"], "strict": True}
    r = c.messages.create(
        model="demo",
        max_tokens=300,
        messages=[{"role": "user", "content": "Find."}],
        tools=[tool],
        tool_choice={"type": "any"},
    )
    uses = [b for b in r.content if b.type == "tool_use"]
    assert uses and r.stop_reason == "tool_use"
    for u in uses:
        jsonschema.validate(u.input, SCHEMA_OF["search"])


@pytest.mark.parametrize(
    "body, param, fragment",
    [
        ({"response_format": rf_of({"type": "strin"})}, "response_format", "strin"),
        (
            {"response_format": {"type": "grammar", "grammar": "start: ("}},
            "response_format",
            "Lark",
        ),
        (
            {"response_format": {"type": "regex", "regex": "[a-"}},
            "response_format",
            "regular expression",
        ),
        ({"guided_grammar": "root ::= [a-z]+"}, "guided_grammar", "GBNF"),
        ({"grammar": "start: x"}, "response_format", "unknown name"),
        ({"response_format": {"type": "grammar"}}, "response_format", "a Lark grammar"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "tools",
            "nope",
        ),
    ],
)
def test_bad_grammars_are_400s_naming_the_problem(server, body, param, fragment):
    r = httpx.post(
        server.url + "/v1/chat/completions", json={"messages": ASK, **body}, timeout=TIMEOUT
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["param"] == param, err


def test_cli_json_schema_and_grammar(capsys, tmp_path):
    schema = SCHEMAS["classify"]
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "g.lark").write_text('start: "yes" | "no"\n')
    r = main_(capsys, "run", "Spam?", "--json-schema", tmp_path / "s.json", "--seed", "1", "-q")
    assert r.returncode == 0, r.stderr
    jsonschema.validate(json.loads(r.stdout), schema)
    r = main_(capsys, "run", "Ok?", "--grammar", tmp_path / "g.lark", "--json", "-q")
    assert r.returncode == 0 and json.loads(r.stdout)["content"] in ("yes", "no")
    (tmp_path / "bad.json").write_text('{"type": "strin"}')
    r = main_(capsys, "run", "x", "--json-schema", tmp_path / "bad.json", "-q")
    assert r.returncode == 2 and "strin" in r.stderr


def test_a_grammar_compiles_on_a_model_nothing_else_touched():
    """The vocabulary needs the tokenizer: making both on first use must not deadlock."""
    import threading

    fresh = v4flash.load(demo_path())
    out = []
    t = threading.Thread(target=lambda: out.append(compile_grammar(fresh, "regex", "[0-9]+")))
    t.daemon = True
    t.start()
    t.join(timeout=60)
    assert out and out[0].kind == "regex"
