"""``v4flash serve``: the real server on 127.0.0.1 (a free port) driven by the official
``openai`` client and ``httpx``. The demo checkpoint answers noise, so answers are compared
with the text-level API (same seed) rather than read; tool calls use a scripted model that
"generates" an exact DSML completion through the real tokenizer."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

import v4flash  # noqa: E402
from conftest import FIXTURES, model_for  # noqa: E402
from helpers import CLOCK, WEATHER, serving  # noqa: E402
from v4flash.encoding import encode_messages  # noqa: E402
from v4flash.server import make_server, stop  # noqa: E402
from v4flash.server.engine import FifoLock  # noqa: E402
from v4flash.tokenizer import encode_prompt_ids, load_tokenizer  # noqa: E402

TIMEOUT = 30
HELLO = [{"role": "user", "content": "Hello"}]
D = "｜DSML｜"


class Running:
    def __init__(self, model, **kw):
        self.logs: list = []
        self.srv = make_server(model, "127.0.0.1", 0, log=self.logs.append, **kw)
        self.url = self.srv.url
        self.thread = threading.Thread(
            target=self.srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, timeout=TIMEOUT, max_retries=0)

    def close(self):
        stopped = stop(self.srv, grace=10)
        self.thread.join(TIMEOUT)
        assert stopped and not self.thread.is_alive()


@pytest.fixture(scope="module")
def m():
    return model_for("tiny-a")


@pytest.fixture(scope="module")
def server(m):
    s = Running(m, name="demo", max_tokens=64)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as c:
        yield c


# --- basics ------------------------------------------------------------------------------------


def test_models_and_health(client, http, m):
    models = client.models.list()
    assert [x.id for x in models.data] == ["demo"]
    assert http.get("/v1/models/demo").json()["context_length"] == m.ctx
    assert http.get("/v1/models/other").status_code == 404
    h = http.get("/health").json()
    assert h["status"] == "ok" and h["model"] == "demo" and "prompt_cache" in h


def test_chat_matches_the_text_api(client, m):
    r = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=12, temperature=1.0, seed=3
    )
    want = m.chat(HELLO, max_new_tokens=12, temperature=1.0, seed=3, cache=False)
    choice = r.choices[0]
    assert choice.message.content == want.content
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert r.object == "chat.completion" and r.model == "demo"
    assert r.usage.prompt_tokens == want.usage.prompt_tokens
    assert r.usage.completion_tokens == 12 and r.usage.total_tokens == r.usage.prompt_tokens + 12
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_joins_to_the_answer(client, m):
    kw = dict(model="demo", messages=HELLO, max_tokens=16, temperature=1.0, seed=9)
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_completions(client, m):
    r = client.completions.create(model="demo", prompt="Once upon a time", max_tokens=10, seed=4)
    want = m.complete("Once upon a time", max_new_tokens=10, seed=4, cache=False)
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 10
    chunks = list(
        client.completions.create(
            model="demo", prompt="Once upon a time", max_tokens=10, seed=4, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"
    echo = client.completions.create(model="demo", prompt="Hi", max_tokens=3, seed=1, echo=True)
    assert echo.choices[0].text.startswith("Hi")
    default = client.completions.create(model="demo", prompt="Once upon a time", temperature=0)
    greedy = m.complete("Once upon a time", max_new_tokens=100, temperature=0, cache=False)
    assert len(greedy.ids) > 16 and default.choices[0].finish_reason == "length"
    assert default.usage.completion_tokens == 16  # OpenAI's default for completions


def test_seed_reproducibility(client):
    def ask(seed):
        r = client.chat.completions.create(
            model="demo", messages=HELLO, max_tokens=12, temperature=1.0, seed=seed
        )
        return r.choices[0].message.content

    assert ask(21) == ask(21)
    assert len({ask(s) for s in (1, 2, 3)}) > 1


def _spanning_stop(pieces):
    full, pos = "".join(pieces), 0
    for i in range(len(pieces) - 1):
        a, b = pieces[i], pieces[i + 1]
        pos += len(a)
        if not a or not b or "\ufffd" in a[-2:] + b[:2]:
            continue
        stop, start = a[-2:] + b[:2], pos - len(a[-2:])
        if start >= 3 and full.find(stop) == start:
            return stop, start
    raise AssertionError("no spanning stop string")


def test_stop_strings(client, m):
    greedy = m.chat(HELLO, max_new_tokens=40, temperature=0, cache=False)
    dec = m.tokenizer.stream_decoder()
    pieces = [dec.push(t) for t in greedy.ids]
    stop, start = _spanning_stop(pieces)
    kw = dict(model="demo", messages=HELLO, max_tokens=40, temperature=0, stop=[stop, "@@@"])
    r = client.chat.completions.create(**kw)
    assert r.choices[0].message.content == greedy.content[:start]
    assert r.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(**kw, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == greedy.content[:start]
    assert chunks[-1].choices[0].finish_reason == "stop"


# --- thinking ----------------------------------------------------------------------------------


def test_thinking_forms(client, m):
    tok = m.tokenizer
    think = len(encode_prompt_ids(tok, HELLO, thinking_mode="thinking"))
    high = len(encode_prompt_ids(tok, HELLO, thinking_mode="thinking", reasoning_effort="high"))
    chat = len(encode_prompt_ids(tok, HELLO))
    want = m.chat(HELLO, thinking=True, max_new_tokens=8, temperature=0, cache=False)
    assert want.reasoning and not want.content  # the demo does not close its reasoning in 8
    cases = [
        ({"extra_body": {"thinking": {"type": "enabled"}}}, True, think),
        ({"extra_body": {"thinking": True}}, True, think),
        ({"extra_body": {"thinking": {"type": "disabled"}}}, False, chat),
        ({"reasoning_effort": "high"}, True, high),
        ({"reasoning_effort": "none"}, False, chat),
        ({"reasoning_effort": "low", "extra_body": {"thinking": False}}, False, chat),
        ({"extra_body": {"chat_template_kwargs": {"thinking": True}}}, True, think),
    ]
    for kw, thinking, prompt_tokens in cases:
        r = client.chat.completions.create(
            model="demo", messages=HELLO, max_tokens=8, temperature=0, **kw
        )
        assert r.usage.prompt_tokens == prompt_tokens, kw
        msg = r.choices[0].message
        if thinking:
            assert isinstance(msg.reasoning_content, str) and msg.reasoning_content, kw
            assert msg.content == ""
            if prompt_tokens == think:
                assert msg.reasoning_content == want.reasoning
        else:
            assert getattr(msg, "reasoning_content", None) is None, kw
            assert msg.content
    chunks = list(
        client.chat.completions.create(
            model="demo",
            messages=HELLO,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"thinking": {"type": "enabled"}},
        )
    )
    streamed = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert streamed == m.chat(HELLO, thinking=True, max_new_tokens=8, temperature=0).reasoning
    with pytest.raises(openai.BadRequestError, match="encoder_path"):
        client.chat.completions.create(
            model="demo", messages=HELLO, max_tokens=4, reasoning_effort="xhigh"
        )


# --- the prompt cache --------------------------------------------------------------------------


def test_prompt_cache_hit_gives_the_cold_output(client, m):
    msgs = [{"role": "system", "content": "Cache test."}, {"role": "user", "content": "One"}]
    kw = dict(model="demo", max_tokens=10, temperature=1.0, seed=17)
    r1 = client.chat.completions.create(messages=msgs, **kw)
    p1 = encode_prompt_ids(m.tokenizer, msgs)
    msgs2 = msgs + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "Two"},
    ]
    r2 = client.chat.completions.create(messages=msgs2, **kw)
    cold = m.chat(msgs2, max_new_tokens=10, temperature=1.0, seed=17, cache=False)
    assert r2.choices[0].message.content == cold.content
    assert r2.usage.prompt_tokens_details.cached_tokens >= len(p1) - 1
    again = client.chat.completions.create(messages=msgs2, **kw)  # resent as is
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert again.choices[0].message.content == cold.content
    streamed = client.chat.completions.create(
        messages=msgs2, stream=True, stream_options={"include_usage": True}, **kw
    )
    chunks = list(streamed)
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == cold.content


def test_thinking_history_reuses_the_common_prefix(client, m):
    msgs = [{"role": "user", "content": "Think about cache."}]
    kw = dict(model="demo", max_tokens=6, temperature=0, extra_body={"thinking": True})
    r1 = client.chat.completions.create(messages=msgs, **kw)
    p1 = encode_prompt_ids(m.tokenizer, msgs, thinking_mode="thinking")
    msgs2 = msgs + [
        {
            "role": "assistant",
            "content": "ok",
            "reasoning_content": r1.choices[0].message.reasoning_content,
        },
        {"role": "user", "content": "More."},
    ]
    r2 = client.chat.completions.create(messages=msgs2, **kw)
    # earlier reasoning is dropped from the history: reuse stops at the old <｜Assistant｜>
    assert r2.usage.prompt_tokens_details.cached_tokens == len(p1) - 1
    cold = m.chat(msgs2, thinking=True, max_new_tokens=6, temperature=0, cache=False)
    assert r2.choices[0].message.reasoning_content == cold.reasoning


# --- concurrency, disconnects, shutdown --------------------------------------------------------


def test_two_concurrent_clients(server, m):
    jobs = {
        "a": [dict(seed=s, stream=False) for s in (1, 2, 3)],
        "b": [dict(seed=s, stream=True) for s in (4, 5, 6)],
    }
    results: dict = {}
    errors: list = []

    def run(name):
        c = server.client()
        try:
            out = []
            for j in jobs[name]:
                msgs = [{"role": "user", "content": f"client {name}"}]
                kw = dict(model="demo", messages=msgs, max_tokens=24, temperature=1.0)
                if j["stream"]:
                    chunks = c.chat.completions.create(**kw, seed=j["seed"], stream=True)
                    out.append("".join(x.choices[0].delta.content or "" for x in chunks))
                else:
                    r = c.chat.completions.create(**kw, seed=j["seed"])
                    out.append(r.choices[0].message.content)
            results[name] = out
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * TIMEOUT)
    assert not errors, errors
    for name, js in jobs.items():
        msgs = [{"role": "user", "content": f"client {name}"}]
        want = [
            m.chat(msgs, max_new_tokens=24, temperature=1.0, seed=j["seed"], cache=False).content
            for j in js
        ]
        assert results[name] == want


def _eventually(cond, seconds=10):
    end = time.time() + seconds
    while not cond():
        if time.time() > end:
            return False
        time.sleep(0.02)
    return True


def _wait_idle(http, seconds=10):
    end = time.time() + seconds
    while time.time() < end:
        h = http.get("/health").json()
        if not h["busy"] and not h["queued"]:
            return True
        time.sleep(0.05)
    return False


def test_disconnect_mid_stream_cancels_and_the_server_goes_on(server, http, client, m):
    # greedy: the demo's answer to HELLO runs ~2000 tokens before its EOS
    body = {"messages": HELLO, "max_tokens": 60000, "stream": True, "temperature": 0}
    before = len(server.logs)
    with httpx.Client(timeout=TIMEOUT) as c:
        with c.stream("POST", server.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(x.startswith("data: ") for x in got)
    t0 = time.time()
    assert _wait_idle(http), "the generation went on after the client left"
    assert time.time() - t0 < 5
    # the next request works, from the cached state, and answers as a cold run does (seeded:
    # an unseeded request may sample the end of the answer within 3 tokens)
    r = client.chat.completions.create(
        model="demo", messages=HELLO, max_tokens=3, temperature=1.0, seed=11
    )
    want = m.chat(HELLO, max_new_tokens=3, temperature=1.0, seed=11, cache=False)
    assert r.usage.completion_tokens == want.usage.completion_tokens
    assert r.choices[0].message.content == want.content
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    assert _eventually(lambda: any(" 499 " in x for x in server.logs[before:]))
    line = next(x for x in server.logs[before:] if " 499 " in x)
    assert "stream cancelled" in line  # stopped between tokens, not at the end


@pytest.fixture()
def endless():
    s = Running(ScriptedModel("la ", endless=True, delay=0.002), name="endless")
    yield s
    s.close()


def test_a_client_leaving_the_queue_is_skipped(endless):
    server = endless
    http = httpx.Client(base_url=server.url, timeout=TIMEOUT)
    body = {"messages": HELLO, "max_tokens": 100000, "stream": True}
    with httpx.Client(timeout=TIMEOUT) as c1:
        with c1.stream("POST", server.url + "/v1/chat/completions", json=body) as r1:
            lines = r1.iter_lines()  # (a dropped iterator would close the response)
            next(lines)  # the first request holds the engine
            # a second one queues behind it, then gives up
            s = socket.create_connection(("127.0.0.1", server.srv.http.port))
            payload = json.dumps({"messages": HELLO, "max_tokens": 5}).encode()
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
            )
            end = time.time() + 10
            while http.get("/health").json()["queued"] != 1 and time.time() < end:
                time.sleep(0.02)
            assert http.get("/health").json()["queued"] == 1
            s.close()
            end = time.time() + 10
            while http.get("/health").json()["queued"] and time.time() < end:
                time.sleep(0.05)
            assert http.get("/health").json()["queued"] == 0
    assert _wait_idle(http)
    r = server.client().chat.completions.create(model="endless", messages=HELLO, max_tokens=2)
    assert r.usage.completion_tokens == 2
    # both left; neither was answered (the log line follows the engine's release)
    assert _eventually(lambda: sum(" 499 " in x for x in server.logs) == 2), server.logs


def test_fifo_lock_serves_in_arrival_order():
    lock = FifoLock()
    assert lock.acquire()
    order, threads = [], []
    for k in range(4):
        t = threading.Thread(target=lambda k=k: (lock.acquire(), order.append(k), lock.release()))
        t.start()
        threads.append(t)
        while lock.waiting < k + 1:
            time.sleep(0.001)
    quitter = threading.Event()
    gave_up = []
    t = threading.Thread(target=lambda: gave_up.append(lock.acquire(give_up=quitter.is_set)))
    t.start()
    while lock.waiting < 5:
        time.sleep(0.001)
    quitter.set()
    t.join(5)
    assert gave_up == [False] and lock.waiting == 4
    lock.release()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3] and not lock.busy


def test_shutdown_stops_a_running_stream():
    s = Running(ScriptedModel("la ", endless=True, delay=0.002), name="endless")
    body = {"messages": HELLO, "max_tokens": 100000, "stream": True}
    with httpx.Client(timeout=TIMEOUT) as c:
        with c.stream("POST", s.url + "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            t0 = time.time()
            s.close()  # asserts every request finished within the grace period
            rest = list(lines)
    assert time.time() - t0 < 5
    errors = [json.loads(x[6:]) for x in rest if x.startswith('data: {"error"')]
    assert errors and "shutting down" in errors[0]["error"]["message"]
    assert [x for x in rest if x][-1] == "data: [DONE]"


# --- bad requests ------------------------------------------------------------------------------

BAD = [
    ({"messages": "hi"}, 400, "'messages' must be a non-empty list"),
    ({"messages": []}, 400, "non-empty list"),
    ({"messages": [{"content": "x"}]}, 400, "'role'"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "robot"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "image_url"),
    ({"messages": HELLO, "temperature": "hot"}, 400, "'temperature' must be"),
    ({"messages": HELLO, "temperature": 7}, 400, "between 0 and 2"),
    ({"messages": HELLO, "top_p": 0}, 400, "top_p"),
    ({"messages": HELLO, "max_tokens": 0}, 400, "'max_tokens' must be >= 1"),
    ({"messages": HELLO, "max_tokens": 1.5}, 400, "max_tokens"),
    ({"messages": HELLO, "max_tokens": True}, 400, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 10**15}, 400, "exceeds the model's context"),
    ({"messages": HELLO, "max_completion_tokens": -3}, 400, "max_completion_tokens"),
    ({"messages": HELLO, "n": 2}, 400, "'n' must be 1"),
    ({"messages": HELLO, "seed": "x"}, 400, "seed"),
    ({"messages": HELLO, "stop": [""]}, 400, "stop"),
    ({"messages": HELLO, "stop": ["a"] * 50}, 400, "at most"),
    ({"messages": HELLO, "stream": "yes"}, 400, "'stream' must be true or false"),
    ({"messages": HELLO, "tools": {"x": 1}}, 400, "'tools' must be a list"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {}}]}, 400, "name"),
    ({"messages": HELLO, "tool_choice": "always"}, 400, "tool_choice"),
    (
        {
            "messages": HELLO,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        400,
        "not among the tools",
    ),
    ({"messages": HELLO, "thinking": "on"}, 400, "thinking"),
    ({"messages": HELLO, "reasoning_effort": "extreme"}, 400, "reasoning_effort"),
    ({"messages": HELLO, "presence_penalty": 1.0}, 400, "not supported"),
    ({"messages": HELLO, "response_format": {"type": "xml"}}, 400, "not supported"),
    ({"messages": HELLO, "model": 5}, 400, "'model' must be a string"),
]


@pytest.mark.parametrize("body, status, fragment", BAD)
def test_bad_chat_requests(http, body, status, fragment):
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error"


def test_sampling_errors_name_their_param(http):
    # the engine's rule checks them (model.sample_params); the dialect adds OpenAI's range for
    # temperature and takes any integer seed
    for key, value, message in [
        ("temperature", 7, "'temperature' must be between 0 and 2, got 7"),
        ("temperature", -1, "'temperature' must be between 0 and 2, got -1"),
        ("top_p", 0, "'top_p' must be in (0, 1], got 0"),
        ("top_p", 1.5, "'top_p' must be in (0, 1], got 1.5"),
        ("top_k", -1, "'top_k' must be >= 0, got -1"),
    ]:
        r = http.post("/v1/chat/completions", json={"messages": HELLO, key: value})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == message and r.json()["error"]["param"] == key
    body = {"messages": HELLO, "seed": -5, "max_tokens": 2, "temperature": 1.0}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_a_repo_id_is_a_model_id_and_health_is_not_logged(m):
    s = Running(m, name="deepseek-ai/DeepSeek-V4-Flash")
    try:
        with httpx.Client(base_url=s.url, timeout=TIMEOUT) as http:
            r = http.get("/v1/models/deepseek-ai/DeepSeek-V4-Flash")
            assert r.status_code == 200 and r.json()["id"] == "deepseek-ai/DeepSeek-V4-Flash"
            assert http.get("/v1/models/deepseek-ai").status_code == 404
            assert http.get("/health").json()["model"] == "deepseek-ai/DeepSeek-V4-Flash"
            assert http.post("/health", json={}).status_code == 405
    finally:
        s.close()
    assert not any("/health" in line for line in s.logs), s.logs
    assert any("GET /v1/models/deepseek-ai 404" in line for line in s.logs), s.logs


def test_another_dialect_is_a_table_of_routes(m):
    # what the next API needs from the transport: its routes, its error shape, named events
    from v4flash.server.errors import ApiError
    from v4flash.server.http import Route

    def shape(e):
        return {"type": "error", "error": {"type": e.kind, "message": e.message}}

    def messages(x):
        body = x.read_json()
        if "max_tokens" not in body:
            raise ApiError(400, "max_tokens: Field required")
        x.start_sse()
        x.event({"type": "message_start"}, "message_start")
        x.end_chunks()
        return 200

    s = Running(m, name="demo")
    s.srv.app.routes[("POST", "/plugged")] = Route(messages, shape)
    try:
        with httpx.Client(base_url=s.url, timeout=TIMEOUT) as http:
            r = http.post("/v1/plugged", json={})
            assert r.status_code == 400
            assert r.json() == {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
            }
            r = http.post("/v1/plugged", json={"max_tokens": 5})
            assert r.text == 'event: message_start\ndata: {"type": "message_start"}\n\n'
    finally:
        s.close()


def test_a_token_id_out_of_the_vocabulary_is_a_400(http, m):
    # the engine's own check (the prefill refuses the id) answers, about 'prompt'
    v = m.config.vocab_size
    r = http.post("/v1/completions", json={"prompt": [0, v], "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert f"token id {v} is out of the vocabulary" in err["message"]
    assert err["param"] == "prompt" and err["type"] == "invalid_request_error"
    body = {"prompt": [0, v], "max_tokens": 2, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = [x for x in r.iter_lines() if x]
    assert "out of the vocabulary" in json.loads(lines[0][6:])["error"]["message"]
    assert lines[-1] == "data: [DONE]"
    ok = http.post("/v1/completions", json={"prompt": [0, v - 1], "max_tokens": 2})
    assert ok.status_code == 200  # the server goes on


def test_bad_requests_at_the_http_level(server, http):
    for path, content, fragment in [
        ("/v1/chat/completions", b"{bad json", "not valid JSON"),
        ("/v1/chat/completions", b"[1, 2]", "JSON object"),
        ("/v1/chat/completions", b"\xff\xfe\x00", "not valid JSON"),
        ("/v1/chat/completions", b"[" * 100000, "not valid JSON"),
        ("/v1/completions", b'{"prompt": 5}', "'prompt' must be"),
        ("/v1/completions", b'{"prompt": "x", "logprobs": 9}', "'logprobs' must be from 0 to 5"),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}',
            "needs 'logprobs'",
        ),
    ]:
        r = http.post(path, content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and fragment in r.json()["error"]["message"], r.text
    assert http.get("/v1/nothing").status_code == 404
    assert http.get("/v1/chat/completions").status_code == 405
    port = server.srv.http.port
    h = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for raw, status in [
        (h + b"\r\n", 411),
        (
            h + b"Content-Length: 1e99\r\n\r\n",
            400,
        ),
        (
            h + b"Content-Length: -5\r\n\r\n",
            400,
        ),
        (
            h + b"Content-Length: 99999999999\r\n\r\n",
            413,
        ),
        (b"GARBAGE / x HTTP/1.1\r\n\r\n", 400),
        (b"DELETE /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 405),
    ]:
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as s:
            s.sendall(raw)
            head = b"".join(iter(lambda: s.recv(4096), b"")).decode("latin-1")  # till closed
            assert head.split(" ")[1] == str(status), head
            assert '{"error": {"message": ' in head
    assert http.get("/health").json()["status"] == "ok"


def test_context_too_long_is_a_400():
    small = v4flash.load(FIXTURES / "tiny-a", ctx=48)
    s = Running(small, name="small")
    try:
        c = s.client()
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(
                model="small", messages=[{"role": "user", "content": "word " * 80}]
            )
        assert e.value.status_code == 400 and "context holds 48" in str(e.value)
        assert e.value.body["code"] == "context_length_exceeded"
        r = c.chat.completions.create(model="small", messages=HELLO, max_tokens=48, temperature=0)
        assert r.choices[0].finish_reason == "length"  # clamped to the room left
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 48
    finally:
        s.close()


def test_api_key(m):
    s = Running(m, name="demo", api_key="sekret")
    try:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        assert s.client("sekret").models.list().data[0].id == "demo"
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": HELLO}, timeout=TIMEOUT)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert httpx.get(s.url + "/health", timeout=TIMEOUT).status_code == 200
    finally:
        s.close()


# --- tool calls: OpenAI tools JSON <-> DSML, exactly -----------------------------------------

CALLS = [
    {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}},
    {"name": "now", "arguments": {}},
]


class ScriptedSession:
    """A session whose every answer is the model's script (token ids); records prompts."""

    def __init__(self, model):
        self.model, self._tokens = model, []

    def feed(self, ids, progress=None):
        self._tokens += list(ids)
        if progress is not None:
            progress(len(ids), len(ids))

    def snapshot(self):
        return len(self._tokens)

    def rollback(self, snap):
        del self._tokens[snap:]

    @property
    def tokens(self):
        return list(self._tokens)

    def stream(self, ids, max_new_tokens, temperature, top_p, top_k, seed, stop_ids, **kw):
        self._tokens += list(ids)
        self.model.prompts.append(list(self._tokens))
        self.model.constraints.append(kw.get("constraint"))  # a script follows no grammar
        script = self.model.script
        for k in range(max_new_tokens):
            if k >= len(script) and not self.model.endless:
                return
            t = script[k % len(script)]
            time.sleep(self.model.delay)
            self._tokens.append(t)
            yield t
            if t in stop_ids:
                return


class ScriptedModel:
    """Answers ``text`` then EOS; ``endless``: repeats ``text`` (no EOS), ``delay`` s per token."""

    def __init__(self, text, endless=False, delay=0.0):
        self.path = Path(FIXTURES / "tiny-a")
        self.tok = load_tokenizer(self.path)
        self.script = self.tok.encode(text) + ([] if endless else [self.tok.eos_id])
        self.endless, self.delay = endless, delay
        self.ctx = 1 << 20
        self.config = SimpleNamespace(vocab_size=self.tok.vocab_size)
        self.prompts: list = []
        self.constraints: list = []

    def session(self):
        return ScriptedSession(self)

    def plan(self):
        return {"prefill_chunk": 256}

    def stats(self):
        return {}


def _dsml_answer(mode, content="", reasoning=""):
    calls = [
        {
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
        }
        for c in CALLS
    ]
    msgs = HELLO + [
        {
            "role": "assistant",
            "content": content,
            "reasoning_content": reasoning,
            "tool_calls": calls,
        }
    ]
    full = encode_messages(msgs, thinking_mode=mode, drop_thinking=False)
    prefix = encode_messages(HELLO, thinking_mode=mode)
    text = full[len(prefix) :]
    assert text.endswith("<｜end▁of▁sentence｜>")
    return text[: -len("<｜end▁of▁sentence｜>")]  # the EOS is the script's last token


@pytest.mark.parametrize("thinking", [False, True])
def test_tool_calls_round_trip(thinking):
    mode = "thinking" if thinking else "chat"
    answer = _dsml_answer(mode, content="Let me check.", reasoning="Need the weather.")
    fake = ScriptedModel(answer)
    s = Running(fake, name="scripted")
    try:
        c = s.client()
        extra = {"extra_body": {"thinking": thinking}}
        tools = [WEATHER, CLOCK]
        r = c.chat.completions.create(model="scripted", messages=HELLO, tools=tools, **extra)
        # the prompt the model saw: tools rendered exactly as the official encoding does
        assert fake.prompts[-1] == encode_prompt_ids(
            fake.tok, HELLO, tools=tools, thinking_mode=mode
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        msg = choice.message
        assert msg.content == "Let me check."
        if thinking:
            assert msg.reasoning_content == "Need the weather."
        got = [(t.function.name, json.loads(t.function.arguments)) for t in msg.tool_calls]
        assert got == [(x["name"], x["arguments"]) for x in CALLS]
        assert all(t.id.startswith("call_") and t.type == "function" for t in msg.tool_calls)

        # streamed: one delta per call (index, id, name, arguments)
        chunks = list(
            c.chat.completions.create(
                model="scripted", messages=HELLO, tools=tools, stream=True, **extra
            )
        )
        deltas = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
        assert [d.index for d in deltas] == [0, 1]
        assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == got
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        assert content == "Let me check." and chunks[-1].choices[0].finish_reason == "tool_calls"

        # the results go back through the tool role; the history renders the same DSML
        history = HELLO + [msg.model_dump(exclude_none=True)]
        ids = [t.id for t in msg.tool_calls]
        results = [
            {"role": "tool", "tool_call_id": ids[1], "content": "12:00"},
            {"role": "tool", "tool_call_id": ids[0], "content": '{"temp": 21}'},
        ]
        c.chat.completions.create(
            model="scripted", messages=history + results, tools=tools, **extra
        )
        want = encode_prompt_ids(fake.tok, history + results, tools=tools, thinking_mode=mode)
        assert fake.prompts[-1] == want
        text = fake.tok.decode(fake.prompts[-1])
        block = answer[answer.index(f"\n\n<{D}tool_calls>") :]
        assert block + "<｜end▁of▁sentence｜>" in text  # byte for byte what the model wrote
        # results sorted into the call order (matched by id)
        assert '<tool_result>{"temp": 21}</tool_result>\n\n<tool_result>12:00</tool_result>' in text
    finally:
        s.close()


# --- the command ---------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGINT")
def test_serve_command_answers_and_stops_on_ctrl_c():
    with serving("--max-tokens", "4") as (p, err, url):
        line = next(x for x in err if "serving" in x)
        plan = next(i for i, x in enumerate(err) if x.startswith("plan:"))
        assert plan < err.index(line)  # the plan line comes before it listens
        assert url.startswith("http://127.0.0.1:")
        r = httpx.post(url + "/chat/completions", json={"messages": HELLO}, timeout=TIMEOUT)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=TIMEOUT) == 0
    text = "".join(err)
    assert "server stopped" in text and "Traceback" not in text
    assert "POST /v1/chat/completions 200" in text and "TTFT" in text
