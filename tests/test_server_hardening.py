"""A server that holds up and lets no one in: slow and abusive clients while a healthy one is
served, bounded bodies, departed clients noticed whatever they sent, cross-site requests and
DNS rebinding refused, HTTP/1.0 streams without chunked coding, keep-alive pings during a long
prefill, a port that is taken reported before the model loads. Each of these failed against
the standard library server this replaces."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")

import v4flash  # noqa: E402
from conftest import FIXTURES, model_for  # noqa: E402
from helpers import cli  # noqa: E402
from test_server import HELLO, TIMEOUT, Running, ScriptedModel, ScriptedSession  # noqa: E402
from v4flash.server import make_server, stop  # noqa: E402
from v4flash.server.transport import Limits  # noqa: E402

BODY = json.dumps({"messages": HELLO, "max_tokens": 3}).encode()


def request(path=b"/v1/chat/completions", body=BODY, host=b"127.0.0.1", extra=b"", version=b"1.1"):
    return (
        b"POST " + path + b" HTTP/" + version + b"\r\nHost: " + host + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n"
        % len(body)
        + extra
        + b"\r\n"
        + body
    )


def read_all(s):
    return b"".join(iter(lambda: s.recv(65536), b""))


@pytest.fixture(scope="module")
def m():
    return model_for("tiny-a")


def threads_now():
    return threading.active_count()


def test_slow_clients_are_cut_and_a_healthy_one_is_served(m):
    limits = Limits(header_timeout=1.0, max_connections=64)
    s = Running(m, name="demo", limits=limits)
    try:
        before = threads_now()
        slow = []
        for _ in range(150):  # more than the connection cap: the oldest slow ones are evicted
            c = socket.create_connection(("127.0.0.1", s.srv.http.port))
            c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX: ")
            slow.append(c)
        # connections cost no thread each (one event loop holds them all)
        assert threads_now() - before < 10
        t0 = time.time()
        r = httpx.post(s.url + "/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
        assert r.status_code == 200 and time.time() - t0 < 5
        # a request line and headers get a deadline, not an idle timer: trickling does not help
        c = slow[-1]
        for _ in range(6):
            try:
                c.sendall(b"a")
            except OSError:
                break
            time.sleep(0.3)
        c.settimeout(5)
        got = b""
        try:
            got = c.recv(4096)
        except OSError:
            pass
        assert got == b"" or got.startswith(b"HTTP/1.1 408")
        for c in slow:
            c.close()
    finally:
        s.close()


def test_bodies_are_bounded_and_refused_before_they_are_read(m):
    s = Running(m, name="demo", limits=Limits(max_body_bytes=1 << 20))
    try:
        big = b'{"messages": [' + b"[]," * 700_000 + b"[]]}"
        r = httpx.post(
            s.url + "/v1/chat/completions",
            content=big,
            headers={"Content-Type": "application/json"},
            timeout=TIMEOUT,
        )
        assert r.status_code == 413 and "larger than 1048576" in r.json()["error"]["message"]
        # a Content-Length larger than the body: 408 when the body does not come, no 500
        s2 = Running(m, name="demo", limits=Limits(body_timeout=0.5))
        try:
            with socket.create_connection(("127.0.0.1", s2.srv.http.port), timeout=10) as c:
                c.sendall(request(body=b"{", extra=b"")[:-1].replace(b"Length: 1", b"Length: 50"))
                assert read_all(c).startswith(b"HTTP/1.1 408")
        finally:
            s2.close()
    finally:
        s.close()


def test_cross_site_requests_and_dns_rebinding_are_refused(m):
    s = Running(m, name="demo", cors=["http://app.example"])
    try:
        port = s.srv.http.port
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as c:
            c.sendall(request(host=b"evil.example:%d" % port))
            out = read_all(c)
            assert out.startswith(b"HTTP/1.1 403") and b"loopback" in out
        http = httpx.Client(base_url=s.url, timeout=TIMEOUT)
        # a simple cross-site POST (no preflight) is refused whatever its content type
        r = http.post(
            "/v1/chat/completions",
            content=BODY,
            headers={"Content-Type": "text/plain", "Origin": "http://attacker.example"},
        )
        assert r.status_code == 403
        r = http.post("/v1/chat/completions", content=BODY, headers={"Content-Type": "text/plain"})
        assert r.status_code == 415
        # a listed origin: preflight answered, the request carries CORS headers
        pre = http.options(
            "/v1/chat/completions",
            headers={
                "Origin": "http://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,authorization",
            },
        )
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "http://app.example"
        assert "POST" in pre.headers["access-control-allow-methods"]
        r = http.post(
            "/v1/chat/completions",
            json={"messages": HELLO, "max_tokens": 1},
            headers={"Origin": "http://app.example"},
        )
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://app.example"
        bad = http.options(
            "/v1/chat/completions",
            headers={"Origin": "http://attacker.example", "Access-Control-Request-Method": "POST"},
        )
        assert bad.status_code == 403 and "access-control-allow-origin" not in bad.headers
        # the server's own page (same origin) needs no --cors
        r = http.post(
            "/v1/chat/completions",
            json={"messages": HELLO, "max_tokens": 1},
            headers={"Origin": s.url},
        )
        assert r.status_code == 200
    finally:
        s.close()


def test_a_client_that_leaves_after_stray_bytes_is_noticed():
    fake = ScriptedModel("la ", endless=True, delay=0.005)
    s = Running(fake, name="endless")
    try:
        body = json.dumps({"messages": HELLO, "max_tokens": 100000, "stream": True}).encode()
        c = socket.create_connection(("127.0.0.1", s.srv.http.port))
        # a stray CRLF and a pipelined request after the body: unread bytes wait on the socket
        c.sendall(request(body=body) + b"\r\n" + request())
        c.recv(4096)
        c.close()
        end = time.time() + 10
        while not any(" 499 " in x for x in s.logs) and time.time() < end:
            time.sleep(0.05)
        assert any(" 499 " in x for x in s.logs), s.logs
        r = s.client().chat.completions.create(model="endless", messages=HELLO, max_tokens=2)
        assert r.usage.completion_tokens == 2
    finally:
        s.close()


def test_a_client_that_never_reads_ends_its_request():
    fake = ScriptedModel("la " * 400, endless=True)
    s = Running(fake, name="endless", limits=Limits(write_timeout=1.0))
    try:
        body = json.dumps({"messages": HELLO, "max_tokens": 1_000_000, "stream": True}).encode()
        c = socket.create_connection(("127.0.0.1", s.srv.http.port))
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.sendall(request(body=body))
        end = time.time() + 20
        while not any(" 499 " in x for x in s.logs) and time.time() < end:
            time.sleep(0.1)
        assert any(" 499 " in x for x in s.logs), s.logs
        # the engine is free again
        r = s.client().chat.completions.create(model="endless", messages=HELLO, max_tokens=2)
        assert r.usage.completion_tokens == 2
        c.close()
    finally:
        s.close()


def test_http10_streams_without_chunked_coding_and_head_options(m):
    s = Running(m, name="demo")
    try:
        body = json.dumps({"messages": HELLO, "max_tokens": 3, "stream": True}).encode()
        with socket.create_connection(("127.0.0.1", s.srv.http.port), timeout=TIMEOUT) as c:
            c.sendall(request(body=body, version=b"1.0"))
            out = read_all(c).decode()
        head, _, rest = out.partition("\r\n\r\n")
        assert head.startswith("HTTP/1.0 200") and "chunked" not in head.lower()
        assert rest.rstrip().endswith("data: [DONE]")
        r = httpx.head(s.url + "/health", timeout=TIMEOUT)
        assert r.status_code == 200 and r.content == b""
    finally:
        s.close()


def test_control_characters_in_paths_reach_the_log_escaped(m):
    s = Running(m, name="demo")
    try:
        with socket.create_connection(("127.0.0.1", s.srv.http.port), timeout=TIMEOUT) as c:
            c.sendall(b"GET /v1/\x1b[31mred HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_all(c).startswith(b"HTTP/1.1 404")
        line = next(x for x in s.logs if "red" in x)
        assert "\x1b" not in line and "\\x1b" in line
    finally:
        s.close()


def test_the_queue_is_capped(m):
    fake = ScriptedModel("la ", endless=True, delay=0.01)
    s = Running(fake, name="endless", limits=Limits(workers=2, max_queue=0))
    try:
        body = {"messages": HELLO, "max_tokens": 100000, "stream": True}
        with httpx.Client(timeout=TIMEOUT) as c1, httpx.Client(timeout=TIMEOUT) as c2:
            with c1.stream("POST", s.url + "/v1/chat/completions", json=body) as r1:
                lines = r1.iter_lines()  # (a dropped iterator would close the response)
                next(lines)  # r1 holds the engine, r2 waits for it: the two workers
                with c2.stream("POST", s.url + "/v1/chat/completions", json=body) as r2:
                    assert s.srv.http.in_flight == 2 and r2.status_code == 200
                    r3 = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
                    assert r3.status_code == 503 and "queue limit" in r3.text
    finally:
        s.close()


class SlowPrefill(ScriptedModel):
    def session(self):
        return SlowSession(self)


class SlowSession(ScriptedSession):
    def feed(self, ids, progress=None):
        self._tokens += list(ids)
        for k in range(10):  # a long prefill: ten "layers" of 0.15 s
            time.sleep(0.15)
            if progress is not None:
                progress((k + 1) * len(ids), 10 * len(ids))


def test_keep_alive_pings_and_progress_during_a_long_prefill():
    fake = SlowPrefill("The answer.")
    s = Running(fake, name="slow", ping_every=0.2)
    try:
        body = {"messages": HELLO, "max_tokens": 3, "stream": True}
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=10) as r:
            lines = list(r.iter_lines())
        assert ": ping" in lines  # a comment while nothing else was sent
        body["return_progress"] = True  # llama.cpp's: progress chunks instead
        body["messages"] = [{"role": "user", "content": "Something else"}]  # no cache hit
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=10) as r:
            lines = list(r.iter_lines())
        progress = [
            json.loads(x[6:]) for x in lines if x.startswith("data: {") and "prompt_progress" in x
        ]
        done = [p["prompt_progress"]["processed"] for p in progress]
        assert (
            done and done == sorted(done) and done[-1] == progress[-1]["prompt_progress"]["total"]
        )
        # Anthropic's stream pings with its own event
        msgs = [{"role": "user", "content": "A third thing"}]
        a = {"model": "x", "max_tokens": 3, "messages": msgs, "stream": True}
        with httpx.stream("POST", s.url + "/v1/messages", json=a, timeout=10) as r:
            text = r.read().decode()
        assert "event: ping" in text and "event: message_stop" in text
    finally:
        s.close()


def test_health_is_503_while_loading_then_ok():
    srv = make_server(None, "127.0.0.1", 0, name="late")
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        r = httpx.get(srv.url + "/health", timeout=TIMEOUT)
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": HELLO}, timeout=TIMEOUT)
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        srv.engine.set_model(v4flash.load(FIXTURES / "tiny-a"))
        assert httpx.get(srv.url + "/health", timeout=TIMEOUT).json()["status"] == "ok"
    finally:
        stop(srv)
        t.join(TIMEOUT)


def test_serve_reports_a_taken_port_before_loading_the_model():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        p = cli("serve", "--port", port, timeout=60)
    assert p.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in p.stderr
    assert "plan:" not in p.stderr and "loaded in" not in p.stderr
