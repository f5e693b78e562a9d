"""The text-level API (python/v4flash/textapi/) on the demo checkpoint: chat / chat_stream /
complete, stop strings (also spanning tokens), the streaming reasoning/content/DSML split
against parse_completion, and the prompt cache (cached output == cold output)."""

from __future__ import annotations

import json
import random

import pytest

import v4flash
from conftest import FIXTURES, model_for
from v4flash.encoding import encode_messages, parse_completion
from v4flash.textapi.cache import PromptCache
from v4flash.textapi.prompts import ContextLengthError
from v4flash.textapi.stream import Splitter, StopMatcher
from v4flash.tokenizer import V4Tokenizer, encode_prompt_ids

D = "｜DSML｜"
EOS = "<｜end▁of▁sentence｜>"
HELLO = [{"role": "user", "content": "Hello"}]
SYS = {"role": "system", "content": "Be brief."}


@pytest.fixture(scope="module")
def m():
    return model_for("tiny-a")


def fresh_cache(m, **kw):
    return PromptCache(m, **kw)


# --- stop strings ------------------------------------------------------------------------------


def test_stop_matcher_holds_back_possible_starts_and_cuts_exactly():
    sm = StopMatcher(["STOP", "xy"])
    assert sm.push("abcS") == "abc"  # "S" may start STOP
    assert sm.push("T") == ""  # "ST" still may
    assert sm.push("Oz") == "STOz"  # "STOz" cannot: released
    assert sm.push("..ST") == ".."
    assert sm.push("OP and more") == ""
    assert sm.stopped == "STOP"
    assert sm.push("later") == "" and sm.flush() == ""


def test_stop_matcher_earliest_stop_wins_and_flush_returns_the_tail():
    sm = StopMatcher(["bcd", "cd", "zz"])
    assert sm.push("abcdef") == "a" and sm.stopped == "bcd"
    sm = StopMatcher(["xyz"])
    assert sm.push("abxy") == "ab"
    assert sm.flush() == "xy"  # never completed: it is text
    assert StopMatcher([]).push("anything") == "anything"


def test_stop_matcher_streamed_equals_whole_text():
    rng = random.Random(3)
    text = "the cat sat on the mat; the dog sat on the log" * 3
    for stops in (["sat on the l"], ["dog", "mat;"], ["nope"], ["t", "the"]):
        whole = StopMatcher(stops)
        want = whole.push(text) + whole.flush()
        sm, out, i = StopMatcher(stops), [], 0
        while i < len(text):
            n = rng.randint(1, 5)
            out.append(sm.push(text[i : i + n]))
            i += n
        out.append(sm.flush())
        assert "".join(out) == want
        hits = [text.find(s) for s in stops if s in text]
        assert want == (text[: min(hits)] if hits else text)


def _greedy_pieces(m, msgs, n=48):
    r = m.chat(msgs, max_new_tokens=n, temperature=0, cache=False)
    dec = m.tokenizer.stream_decoder()
    return r, [dec.push(t) for t in r.ids]


def _spanning_stop(pieces):
    """A stop string made of the end of one generated token and the start of the next, whose
    first occurrence in the text is exactly there: (stop, text position, token index)."""
    full = "".join(pieces)
    pos = 0
    for i in range(len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        pos += len(a)
        if len(a) < 1 or len(b) < 1 or "\ufffd" in a[-2:] + b[:2]:
            continue
        stop = a[-2:] + b[:2]
        start = pos - len(a[-2:])
        if start >= 3 and full.find(stop) == start:  # some text before it, found there first
            return stop, start, i + 1
    raise AssertionError("no token boundary to build a spanning stop string from")


def test_chat_stop_string_spanning_two_tokens(m):
    r, pieces = _greedy_pieces(m, HELLO)
    full = "".join(pieces)
    assert r.content == full
    stop, start, last = _spanning_stop(pieces)
    cut = m.chat(HELLO, max_new_tokens=48, temperature=0, stop=[stop], cache=False)
    assert cut.content == full[:start]  # cut at the stop; the stop itself is not returned
    assert cut.finish_reason == "stop"
    assert cut.ids == r.ids[: last + 1]  # stopped at the token that completed the stop
    assert cut.usage.completion_tokens == last + 1
    deltas = list(m.chat_stream(HELLO, max_new_tokens=48, temperature=0, stop=stop))
    assert "".join(d.content for d in deltas) == full[:start]
    assert deltas[-1].finish_reason == "stop"


def test_complete_stop_string_spanning_two_tokens(m):
    r = m.complete("Once upon a time", max_new_tokens=48, temperature=0, cache=False)
    dec = m.tokenizer.stream_decoder()
    pieces = [dec.push(t) for t in r.ids]
    assert r.text == "".join(pieces)
    stop, start, last = _spanning_stop(pieces)
    cut = m.complete("Once upon a time", max_new_tokens=48, temperature=0, stop=stop)
    assert cut.text == r.text[:start] and cut.finish_reason == "stop"
    assert cut.usage.completion_tokens == last + 1
    streamed = list(
        m.complete_stream("Once upon a time", max_new_tokens=48, temperature=0, stop=stop)
    )
    assert "".join(d.text for d in streamed) == r.text[:start]


# --- chat, chat_stream, complete -----------------------------------------------------------------


def test_tokenizer_property(m):
    assert isinstance(m.tokenizer, V4Tokenizer)
    assert m.tokenizer is m.tokenizer  # loaded once


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_equals_the_token_level_api(m, thinking):
    msgs = [SYS] + HELLO
    r = m.chat(msgs, thinking=thinking, max_new_tokens=20, temperature=1.0, seed=7, cache=False)
    prompt = encode_prompt_ids(m.tokenizer, msgs, thinking_mode="thinking" if thinking else "chat")
    want = m.generate(prompt, max_new_tokens=20, temperature=1.0, seed=7)
    assert r.ids == want
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(want)
    assert r.usage.cached_tokens == 0
    text = m.tokenizer.decode(want[:-1] if want[-1] == m.tokenizer.eos_id else want)
    assert r.text == text
    parsed = parse_completion(text, thinking_mode="thinking" if thinking else "chat")
    assert (r.reasoning, r.content) == (parsed["reasoning_content"], parsed["content"])
    if thinking and m.tokenizer.end_think_id not in want:
        assert r.usage.reasoning_tokens == len(want) and r.content == ""


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_stream_deltas_join_to_chat(m, thinking):
    kw = dict(thinking=thinking, max_new_tokens=24, temperature=1.0, seed=11)
    r = m.chat(HELLO, **kw)
    deltas = list(m.chat_stream(HELLO, **kw))
    assert all(d.finish_reason is None for d in deltas[:-1])
    last = deltas[-1]
    assert last.finish_reason == r.finish_reason
    assert "".join(d.content for d in deltas) == r.content
    assert "".join(d.reasoning for d in deltas) == r.reasoning
    assert [c for d in deltas for c in d.tool_calls] == []
    u, v = last.usage, r.usage
    assert (u.prompt_tokens, u.completion_tokens) == (v.prompt_tokens, v.completion_tokens)


def test_chat_message_round_trips_into_the_next_turn(m):
    r = m.chat(HELLO, max_new_tokens=6, temperature=0)
    assert r.message == {"role": "assistant", "content": r.content}
    r2 = m.chat(HELLO + [r.message, {"role": "user", "content": "And?"}], max_new_tokens=4)
    assert r2.usage.completion_tokens == 4 and r2.finish_reason == "length"


def test_complete_is_raw_text(m):
    r = m.complete("Hi<｜User｜>x", max_new_tokens=5, temperature=0, cache=False)
    ids = m.tokenizer.encode("Hi<｜User｜>x")
    assert m.tokenizer.user_id in ids  # special-token text becomes the token (raw mode)
    assert r.ids == m.generate(ids, max_new_tokens=5, temperature=0.0)
    assert r.usage.prompt_tokens == len(ids)
    r2 = m.complete(ids, max_new_tokens=5, temperature=0, cache=False)
    assert r2.ids == r.ids
    v = m.config.vocab_size
    with pytest.raises(ValueError, match=f"token id {v} is out of the vocabulary"):
        m.complete([0, v], max_new_tokens=2, cache=False)  # the engine's check


def test_bad_arguments_raise_value_error_before_any_work(m):
    bad = [
        dict(temperature=-1),
        dict(temperature=float("nan")),
        dict(top_p=0),
        dict(top_k=-2),
        dict(max_new_tokens=0),
        dict(seed=-1),
        dict(stop=[""]),
        dict(stop=[3]),
        dict(thinking="yes"),
        dict(tool_choice="always"),
        dict(tool_choice="required"),  # no tools
        dict(tools={"type": "function"}),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            m.chat(HELLO, **kw)
        with pytest.raises(ValueError):
            m.chat_stream(HELLO, **kw)  # checked at call time, not at the first next()
    for msgs in (
        [],
        "hello",
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": 5}],
    ):
        with pytest.raises(ValueError):
            m.chat(msgs)
    with pytest.raises(ValueError):
        m.complete("")
    with pytest.raises(ValueError):
        m.complete([1, -2])


def test_context_limit():
    small = v4flash.load(FIXTURES / "tiny-a", ctx=40)
    long_msgs = [{"role": "user", "content": "word " * 60}]
    with pytest.raises(ContextLengthError, match="context holds 40"):
        small.chat(long_msgs)
    with pytest.raises(ContextLengthError):
        small.complete([5] * 40)
    r = small.complete([5] * 30, max_new_tokens=100, temperature=0)
    assert r.usage.completion_tokens == 10 and r.finish_reason == "length"  # clamped


def test_cancel_between_tokens(m):
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 5

    r = m.chat(HELLO, max_new_tokens=200, temperature=0, cancel=cancel)
    assert r.finish_reason == "cancelled" and 0 < r.usage.completion_tokens < 10
    r = m.chat(HELLO, max_new_tokens=3, temperature=0)  # the model (and cache) carry on
    assert r.usage.completion_tokens == 3


def test_closing_a_stream_early_returns_the_session(m):
    pc = fresh_cache(m)
    it = m.chat_stream(HELLO, max_new_tokens=100, temperature=0, cache=pc)
    next(it)
    it.close()
    assert pc.stats()["sessions"] == 1
    r = m.chat(HELLO, max_new_tokens=5, temperature=0, cache=pc)
    assert r.usage.cached_tokens > 0


# --- the prompt cache ----------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [False, True])
def test_second_turn_resumes_from_the_cache_with_the_cold_output(m, thinking):
    pc = fresh_cache(m)
    mode = "thinking" if thinking else "chat"
    msgs = [SYS] + HELLO
    kw = dict(thinking=thinking, max_new_tokens=12, temperature=1.0, seed=5)
    r1 = m.chat(msgs, cache=pc, **kw)
    p1 = encode_prompt_ids(m.tokenizer, msgs, thinking_mode=mode)
    msgs2 = msgs + [
        {"role": "assistant", "content": r1.content or "ok", "reasoning_content": "R"},
        {"role": "user", "content": "Tell me more."},
    ]
    warm = m.chat(msgs2, cache=pc, **kw)
    cold = m.chat(msgs2, cache=False, **kw)
    assert warm.ids == cold.ids and warm.content == cold.content
    assert cold.usage.cached_tokens == 0
    # at least the previous prompt up to its <｜Assistant｜> (thinking mode drops the earlier
    # reasoning, so the history differs from there on)
    assert warm.usage.cached_tokens >= len(p1) - 1
    assert warm.usage.prompt_tokens == cold.usage.prompt_tokens
    st = pc.stats()
    assert st["hits"] == 1 and st["misses"] == 1


def test_resent_conversation_reuses_all_but_the_last_token(m):
    pc = fresh_cache(m)
    msgs = [SYS] + HELLO
    a = m.chat(msgs, cache=pc, max_new_tokens=8, temperature=1.0, seed=1)
    b = m.chat(msgs, cache=pc, max_new_tokens=8, temperature=1.0, seed=1)
    assert a.usage.cached_tokens == 0
    assert b.usage.cached_tokens == b.usage.prompt_tokens - 1
    assert a.ids == b.ids


def test_completion_appends_to_the_cached_history(m):
    pc = fresh_cache(m)
    a = m.complete("The quick brown fox", max_new_tokens=6, temperature=0, cache=pc)
    ids = m.tokenizer.encode("The quick brown fox") + a.ids + m.tokenizer.encode(" and")
    b = m.complete(ids, max_new_tokens=6, temperature=0, cache=pc)
    cold = m.complete(ids, max_new_tokens=6, temperature=0, cache=False)
    assert b.usage.cached_tokens == len(ids) - len(m.tokenizer.encode(" and"))  # whole history
    assert b.ids == cold.ids


def test_cache_is_bounded_lru(m):
    convs = [[{"role": "user", "content": f"Conversation {k}"}] for k in range(3)]
    pc = fresh_cache(m, max_sessions=2)
    for c in convs:
        m.chat(c, cache=pc, max_new_tokens=3, temperature=0)
    assert pc.stats()["sessions"] == 2
    first = m.chat(convs[0], cache=pc, max_new_tokens=3, temperature=0)  # evicted (LRU)
    assert first.usage.cached_tokens == 0
    last = m.chat(convs[2], cache=pc, max_new_tokens=3, temperature=0)
    assert last.usage.cached_tokens > 0
    small = fresh_cache(m, max_tokens=20)
    for c in convs:
        m.chat(c, cache=small, max_new_tokens=3, temperature=0)
    assert small.stats()["tokens"] <= 20
    off = fresh_cache(m, max_sessions=0)
    for _ in range(2):
        assert m.chat(convs[0], cache=off, max_new_tokens=3).usage.cached_tokens == 0
    assert off.stats()["sessions"] == 0
    with pytest.raises(ValueError):
        PromptCache(m, max_sessions=-1)


# --- streaming split of reasoning / content / DSML tool calls ------------------------------------


def call(name, args, call_id=None):
    tc = {"type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    if call_id:
        tc["id"] = call_id
    return tc


ARGS_CASES = [
    {"city": "Paris", "days": 3},
    {"q": 'multi\nline <b>text</b> 引号"', "n": 3, "x": 1.5, "flag": False, "none": None},
    {"items": [1, "two", {"three": 3}], "obj": {"a": {"b": []}}},
    {},
]


def _completion_text(mode, content, calls, reasoning="hmm"):
    msgs = HELLO + [
        {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": calls,
        }
    ]
    prompt = encode_messages(msgs, thinking_mode=mode)
    prefix = encode_messages(HELLO, thinking_mode=mode)
    return prompt[len(prefix) :]


def _split(text, thinking, tools=True, seed=0):
    rng = random.Random(seed)
    sp = Splitter(thinking, tools)
    events, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += sp.push(text[i : i + n])
        i += n
    events += sp.finish()
    return events


def _joined(events):
    out = {"reasoning": "", "content": "", "tool_calls": []}
    for kind, v in events:
        if kind == "tool_call":
            out["tool_calls"].append(v)
        else:
            out[kind] += v
    return out


@pytest.mark.parametrize("mode", ["chat", "thinking"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_split_equals_parse_completion_on_dsml(mode, seed):
    calls = [call(f"tool_{k}", args) for k, args in enumerate(ARGS_CASES)]
    text = _completion_text(mode, "Let me check.", calls)
    assert text.endswith(EOS)
    body = text[: -len(EOS)]  # generation stops at the EOS token: it never reaches the text
    want = parse_completion(text, thinking_mode=mode, strict=True)
    got = _joined(_split(body, mode == "thinking", seed=seed))
    assert got["content"] == want["content"] == "Let me check."
    assert got["reasoning"] == want["reasoning_content"]
    assert [c["function"] for c in got["tool_calls"]] == [c["function"] for c in want["tool_calls"]]
    for k, c in enumerate(got["tool_calls"]):
        assert c["index"] == k and c["type"] == "function" and c["id"].startswith("call_")
        assert json.loads(c["function"]["arguments"]) == ARGS_CASES[k]


@pytest.mark.parametrize(
    "text, thinking, want",
    [
        # plain content with look-alikes of the markers
        ("a </thin b \n\n<｜DSML｜tool", False, {"content": "a </thin b \n\n<｜DSML｜tool"}),
        ("R1</think>C1", True, {"reasoning": "R1", "content": "C1"}),
        ("no close yet", True, {"reasoning": "no close yet"}),
        # an unfinished block (cut by max_tokens) stays text instead of being lost
        (
            f'Hi\n\n<{D}tool_calls>\n<{D}invoke name="f">\n',
            False,
            {"content": f'Hi\n\n<{D}tool_calls>\n<{D}invoke name="f">\n'},
        ),
        # a malformed block too
        (
            f"x\n\n<{D}tool_calls>\nnonsense</{D}tool_calls>",
            False,
            {"content": f"x\n\n<{D}tool_calls>\nnonsense</{D}tool_calls>"},
        ),
    ],
)
def test_streamed_split_edge_cases(text, thinking, want):
    for seed in range(3):
        got = _joined(_split(text, thinking, seed=seed))
        assert got["content"] == want.get("content", "")
        assert got["reasoning"] == want.get("reasoning", "")
        assert got["tool_calls"] == []


def test_tool_calls_not_parsed_when_tool_choice_is_none():
    calls = [call("now", {})]
    body = _completion_text("chat", "", calls)[: -len(EOS)]
    got = _joined(_split(body, False, tools=False))
    assert got["tool_calls"] == [] and got["content"] == body


def test_tools_reach_the_prompt_and_forced_tool_choice(m):
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    r = m.chat(HELLO, tools=tools, max_new_tokens=4, temperature=0, cache=False)
    want = encode_prompt_ids(m.tokenizer, HELLO, tools=tools)
    assert r.usage.prompt_tokens == len(want)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    forced = m.chat(
        HELLO, tools=tools, tool_choice=choice, max_new_tokens=64, temperature=0, cache=False
    )
    # the whole block is generated under the tools' grammar (nothing is fed after the prompt)
    opening = f'\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
    assert forced.text.startswith(opening), forced.text
    assert forced.usage.prompt_tokens == len(want)
    assert forced.finish_reason == "tool_calls"
    assert [c["function"] for c in forced.tool_calls] == [
        {"name": "get_weather", "arguments": "{}"}
    ]
    none = m.chat(HELLO, tools=tools, tool_choice="none", max_new_tokens=4, cache=False)
    assert none.usage.prompt_tokens == len(encode_prompt_ids(m.tokenizer, HELLO))
    with pytest.raises(ValueError, match="not among the tools"):
        m.chat(HELLO, tools=tools, tool_choice={"type": "function", "function": {"name": "x"}})
