"""``serve --parallel N``: up to N requests run side by side, stepped together by the core's
scheduler (tests/test_scheduler.py has the core's side); each answer equals the same request
alone; more requests wait in arrival order."""

import threading
import time

import httpx
import pytest

from conftest import model_for
from v4flash.server import make_server, stop
from v4flash.server.engine import FifoLock

TIMEOUT = 60


@pytest.fixture(scope="module")
def running():
    m = model_for("tiny-a", sessions=3)
    srv = make_server(m, "127.0.0.1", 0, name="demo", max_tokens=64)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv, m
    assert stop(srv, grace=10)
    t.join(TIMEOUT)


def _chat(url, body):
    with httpx.Client(timeout=TIMEOUT) as c:
        if not body.get("stream"):
            r = c.post(url + "/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]
        text = []
        with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    import json

                    for ch in json.loads(line[6:])["choices"]:
                        text.append(ch["delta"].get("content") or "")
        return "".join(text)


def test_requests_run_side_by_side_and_each_equals_running_alone(running):
    srv, m = running
    alone = model_for("tiny-a")
    health = httpx.get(srv.url + "/health", timeout=TIMEOUT).json()
    assert health["parallel"] == 3
    asks = [
        ("say something", 1, False),
        ("tell me a long story " * 30, 2, True),
        ("one two three", 3, True),
        ("four five", 4, False),
        ("six", 5, True),
    ]
    bodies = [
        {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 20,
            "temperature": 0.9,
            "seed": seed,
            "stream": stream,
        }
        for text, seed, stream in asks
    ]
    want = [
        alone.chat(
            b["messages"], max_new_tokens=20, temperature=0.9, seed=b["seed"], cache=False
        ).content
        for b in bodies
    ]
    before = m.stats()["batching"]
    got = [None] * len(bodies)
    go = threading.Barrier(len(bodies))

    def work(i):
        go.wait()
        got[i] = _chat(srv.url, bodies[i])

    ts = [threading.Thread(target=work, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(2 * TIMEOUT)
    assert got == want
    after = m.stats()["batching"]
    # rounds stepped several requests at once
    assert after["stepped"] - before["stepped"] > after["rounds"] - before["rounds"], (
        before,
        after,
    )


def test_the_lock_holds_n_places_in_arrival_order():
    lock = FifoLock(2)
    assert lock.acquire() and lock.acquire()
    assert lock.running == 2
    order = []
    ts = []
    for k in range(3):
        t = threading.Thread(target=lambda k=k: (lock.acquire(), order.append(k)))
        t.start()
        ts.append(t)
        while lock.waiting < k + 1:
            time.sleep(0.001)
    lock.release()  # one place: the first waiter only
    while len(order) < 1:
        time.sleep(0.001)
    time.sleep(0.05)
    assert order == [0] and lock.waiting == 2
    lock.release()
    lock.release()  # two places: the other two, in order
    for t in ts:
        t.join(5)
    assert order == [0, 1, 2] and lock.running == 2
