"""The dialects agents speak, through their official SDKs against the real server: Anthropic's
Messages (Claude Code) and OpenAI's Responses (Codex), on the same engine and prompt cache as
chat completions; and the operations side (metrics, tokenize). Answers on the demo model are
compared across dialects (same prompt, temperature 0); tool round trips use the scripted model
of test_server."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from conftest import model_for  # noqa: E402
from helpers import CLOCK, WEATHER  # noqa: E402
from test_server import CALLS, HELLO, TIMEOUT, Running, ScriptedModel, _dsml_answer  # noqa: E402
from v4flash.tokenizer import encode_prompt_ids  # noqa: E402

A_WEATHER = {
    "name": "get_weather",
    "description": WEATHER["function"]["description"],
    "input_schema": WEATHER["function"]["parameters"],
}
A_CLOCK = {"name": "now", "input_schema": {"type": "object"}}
# Anthropic's SDK no longer has sampling parameters; the server still takes them (every dialect
# accepts temperature, top_p and top_k), so the tests send them as extra fields
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def m():
    return model_for("tiny-a")


@pytest.fixture(scope="module")
def server(m):
    s = Running(m, name="demo", max_tokens=64)
    yield s
    s.close()


@contextlib.contextmanager
def scripted(text):
    """A server on the scripted model that answers ``text``: (the model, the server)."""
    fake = ScriptedModel(text)
    s = Running(fake, name="scripted")
    try:
        yield fake, s
    finally:
        s.close()


def claude(server, key="none"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, timeout=TIMEOUT, max_retries=0)


def codex(server, key="none"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, timeout=TIMEOUT, max_retries=0)


# --- Anthropic Messages -----------------------------------------------------------------------


def test_messages_answer_as_chat_completions_do(server, m):
    c = claude(server)
    r = c.messages.create(
        model="claude-x", max_tokens=8, system="Be brief.", messages=HELLO, extra_body=GREEDY
    )
    want = m.chat(
        [{"role": "system", "content": "Be brief."}] + HELLO,
        max_new_tokens=8,
        temperature=0,
        cache=False,
    )
    assert r.type == "message" and r.role == "assistant" and r.model == "claude-x"
    assert [b.type for b in r.content] == ["text"]
    assert r.content[0].text == want.content
    assert r.stop_reason == ("max_tokens" if want.finish_reason == "length" else "end_turn")
    # usage: the engine's own counts; input + cache read = the prompt tokens chat reports
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == want.usage.prompt_tokens
    assert r.usage.output_tokens == want.usage.completion_tokens
    n = c.messages.count_tokens(model="claude-x", system="Be brief.", messages=HELLO)
    assert n.input_tokens == want.usage.prompt_tokens


def test_messages_stream_equals_the_json_answer(server):
    c = claude(server)
    kw = dict(model="x", max_tokens=12, messages=HELLO, extra_body=GREEDY)
    whole = c.messages.create(**kw)
    kinds, text = [], ""
    with c.messages.stream(**kw) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
                text += ev.delta.text
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert text == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_messages_stop_sequences(server, m):
    c = claude(server)
    full = c.messages.create(model="x", max_tokens=16, messages=HELLO, extra_body=GREEDY)
    text = full.content[0].text
    stop = text.strip()[2:5] if len(text.strip()) > 5 else None
    if not stop:
        pytest.skip("the demo's answer is too short to cut")
    r = c.messages.create(
        model="x", max_tokens=16, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY
    )
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == stop
    assert r.content[0].text == text[: text.index(stop)]


def test_messages_errors_in_anthropics_shape(server):
    c = claude(server)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model="x",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "image" in e.value.body["error"]["message"]
    r = httpx.post(server.url + "/v1/messages", json={"messages": HELLO}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["message"] == "'max_tokens' is required"
    # accepted and ignored: cache_control, metadata
    ok = c.messages.create(
        model="x",
        max_tokens=2,
        metadata={"user_id": "u1"},
        system=[{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        messages=HELLO,
    )
    assert ok.usage.output_tokens >= 1


def test_messages_tool_round_trip():
    with scripted(_dsml_answer("chat", content="Let me check.")) as (fake, s):
        c = claude(s)
        r = c.messages.create(model="x", max_tokens=200, messages=HELLO, tools=[A_WEATHER, A_CLOCK])
        # the tools reach the model exactly as chat completions render them
        assert fake.prompts[-1] == encode_prompt_ids(
            fake.tok, HELLO, tools=[WEATHER, CLOCK], thinking_mode="chat"
        )
        assert r.stop_reason == "tool_use"
        assert r.content[0].type == "text" and r.content[0].text == "Let me check."
        uses = [b for b in r.content if b.type == "tool_use"]
        assert [(u.name, u.input) for u in uses] == [(x["name"], x["arguments"]) for x in CALLS]
        # streamed: input_json_delta per call
        with c.messages.stream(
            model="x", max_tokens=200, messages=HELLO, tools=[A_WEATHER, A_CLOCK]
        ) as st:
            final = st.get_final_message()
        assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
            (x["name"], x["arguments"]) for x in CALLS
        ]
        # the results go back as tool_result blocks, matched by id
        history = HELLO + [{"role": "assistant", "content": [b.model_dump() for b in r.content]}]
        results = {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": uses[1].id, "content": "12:00"},
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": '{"temp": 21}'},
            ],
        }
        c.messages.create(
            model="x", max_tokens=200, messages=history + [results], tools=[A_WEATHER]
        )
        text = fake.tok.decode(fake.prompts[-1])
        assert '<tool_result>{"temp": 21}</tool_result>\n\n<tool_result>12:00</tool_result>' in text


def test_messages_thinking_and_its_budget():
    with scripted("one two three four five six seven eight</think>The answer.") as (fake, s):
        c = claude(s)
        r = c.messages.create(
            model="x",
            max_tokens=100,
            messages=HELLO,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
        # DeepSeek thinking mode, no effort prefix
        assert fake.tok.decode(fake.prompts[-1]).endswith("<｜Assistant｜><think>")
        assert [b.type for b in r.content] == ["thinking", "text"]
        assert r.content[0].thinking.startswith("one two three")
        assert r.content[1].text == "The answer."
        # a budget of 3 tokens: the reasoning is closed after 3, and the answer follows
        r = c.messages.create(
            model="x",
            max_tokens=100,
            messages=HELLO,
            thinking={"type": "enabled", "budget_tokens": 3},
        )
        script = fake.script
        assert r.content[0].thinking == fake.tok.decode(script[:3])
        # the engine fed </think> after the 3rd token, then went on with the answer
        assert fake.prompts[-1][-4:] == script[:3] + [fake.tok.end_think_id]
        assert r.content[1].type == "text"


def test_x_api_key_and_bearer(m):
    s = Running(m, name="demo", api_key="sekret")
    try:
        with pytest.raises(anthropic.AuthenticationError) as e:
            claude(s, "wrong").messages.create(model="x", max_tokens=1, messages=HELLO)
        assert e.value.body["error"]["type"] == "authentication_error"
        r = claude(s, "sekret").messages.create(model="x", max_tokens=1, messages=HELLO)
        assert r.usage.output_tokens == 1
        assert codex(s, "sekret").models.list().data[0].id == "demo"
    finally:
        s.close()


# --- OpenAI Responses -------------------------------------------------------------------------


def test_responses_answer_as_chat_completions_do(server, m):
    c = codex(server)
    r = c.responses.create(
        model="demo", instructions="Be brief.", input="Hello", max_output_tokens=8, temperature=0
    )
    want = m.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        max_new_tokens=8,
        temperature=0,
        cache=False,
    )
    assert r.object == "response" and r.output_text == want.content
    assert r.usage.input_tokens == want.usage.prompt_tokens
    assert r.status == ("incomplete" if want.finish_reason == "length" else "completed")
    # streamed: the same text, the documented events in order
    kinds, text = [], ""
    for ev in c.responses.create(
        model="demo",
        instructions="Be brief.",
        input="Hello",
        max_output_tokens=8,
        temperature=0,
        stream=True,
    ):
        kinds.append(ev.type)
        if ev.type == "response.output_text.delta":
            text += ev.delta
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    assert "response.output_item.added" in kinds and text == want.content
    # previous_response_id continues a kept response; store=false keeps nothing
    # (instructions are not carried over from the previous response: they are sent again)
    again = c.responses.create(
        model="demo",
        instructions="Be brief.",
        previous_response_id=r.id,
        input="More",
        max_output_tokens=2,
        temperature=0,
    )
    assert again.usage.input_tokens > r.usage.input_tokens
    assert again.usage.input_tokens_details.cached_tokens > 0  # the same conversation's prefix
    gone = c.responses.create(model="demo", input="x", max_output_tokens=1, store=False)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(gone.id)
    assert c.responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="demo", previous_response_id="resp_nope", input="x")


def test_responses_function_call_round_trip():
    with scripted(_dsml_answer("chat", content="")) as (fake, s):
        c = codex(s)
        fn = WEATHER["function"]
        tools = [
            {"type": "function", "name": "get_weather", "description": fn["description"]},
            {"type": "function", "name": "now", "parameters": {"type": "object"}},
            {"type": "web_search"},  # Codex sends hosted tools: accepted, left out
        ]
        tools[0]["parameters"] = fn["parameters"]
        r = c.responses.create(model="x", input="Hello", tools=tools)
        assert fake.prompts[-1] == encode_prompt_ids(
            fake.tok, HELLO, tools=[WEATHER, CLOCK], thinking_mode="chat"
        )
        calls = [o for o in r.output if o.type == "function_call"]
        assert [(o.name, json.loads(o.arguments)) for o in calls] == [
            (x["name"], x["arguments"]) for x in CALLS
        ]
        outputs = [
            {"type": "function_call_output", "call_id": calls[1].call_id, "output": "12:00"},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"t": 1}'},
        ]
        c.responses.create(model="x", previous_response_id=r.id, input=outputs, tools=tools)
        text = fake.tok.decode(fake.prompts[-1])
        assert '<tool_result>{"t": 1}</tool_result>\n\n<tool_result>12:00</tool_result>' in text


# --- operations ---------------------------------------------------------------------------------


def test_tokenize_detokenize_in_both_shapes(server, m):
    http = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    ids = m.tokenizer.encode("Hello there")
    r = http.post("/tokenize", json={"prompt": "Hello there"}).json()  # vLLM
    assert r["tokens"] == ids and r["count"] == len(ids)
    r = http.post("/tokenize", json={"content": "Hello there", "with_pieces": True}).json()
    assert [t["id"] for t in r["tokens"]] == ids  # llama.cpp
    r = http.post("/v1/tokenize", json={"messages": HELLO}).json()
    assert r["count"] == len(encode_prompt_ids(m.tokenizer, HELLO, thinking_mode="chat"))
    r = http.post("/detokenize", json={"tokens": ids}).json()
    assert r["prompt"] == r["content"] == "Hello there"
    assert http.post("/detokenize", json={"tokens": [10**9]}).status_code == 400


def test_metrics_are_prometheus_text(server):
    codex(server).chat.completions.create(model="demo", messages=HELLO, max_tokens=2)
    r = httpx.get(server.url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? \S+$')
    values = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) \S+ .+$", line), line
            continue
        assert sample.match(line), line
        name, value = line.rsplit(" ", 1)
        values[name] = float(value)
    assert values["v4flash_generation_tokens_total"] >= 2
    assert values["v4flash_prompt_tokens_total"] >= 1
    assert values['v4flash_requests_total{endpoint="/chat/completions",status="200"}'] >= 1
    assert "v4flash_time_to_first_token_seconds_count" in values
    assert "v4flash_expert_bytes_read_total" in values


# --- log-probabilities ---------------------------------------------------------------------------


def test_logprobs_are_the_models_own(server, m):
    import numpy as np

    from v4flash.tokenizer import encode_prompt_ids as ids_of

    c = codex(server)
    r = c.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    gen = m.tokenizer.encode(r.choices[0].message.content)
    assert len(content) == r.usage.completion_tokens
    # the text API gives the same entries, with the ids; each is the log-softmax of the
    # model's logits at that step (teacher-forced)
    api = m.chat(HELLO, max_new_tokens=5, temperature=0, logprobs=3, cache=False).logprobs
    assert [e["logprob"] for e in api] == [e.logprob for e in content]
    assert [m.tokenizer.token_bytes(e["id"]) for e in api] == [bytes(e.bytes) for e in content]
    prompt = ids_of(m.tokenizer, HELLO, thinking_mode="chat")
    out = [e["id"] for e in api]
    steps = m.logits(prompt + out[:-1])[len(prompt) - 1 :]
    for lp, row in zip(api, steps):
        row = row.astype(np.float64)
        ls = row - (row.max() + np.log(np.exp(row - row.max()).sum()))
        top = np.argsort(-ls, kind="stable")[:3]
        assert [i for i, _ in lp["top"]] == list(top)
        assert [v for _, v in lp["top"]] == pytest.approx(ls[top], abs=1e-4)
        assert lp["logprob"] == pytest.approx(ls[lp["id"]], abs=1e-4)
    assert gen  # the answer's text is there too
    # streamed: the same entries, spread over the chunks
    chunks = list(
        c.chat.completions.create(
            model="demo", messages=HELLO, max_tokens=5, temperature=0, logprobs=True,
            top_logprobs=3, stream=True,
        )
    )  # fmt: skip
    streamed = [e for ch in chunks if ch.choices for e in (ch.choices[0].logprobs.content or [])]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    # legacy completions: tokens, token_logprobs, top_logprobs, text_offset
    r = c.completions.create(model="demo", prompt="Once upon", max_tokens=4, temperature=0,
                             logprobs=2)  # fmt: skip
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
