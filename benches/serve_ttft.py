"""Time to first token of the second turn of a conversation through `v4flash serve`, with
and without the prompt cache, in one run.

    python3 benches/serve_ttft.py --model DIR --ram 8 [--words 900] [--reps 3] [--restart]

Starts the server twice (``--prompt-cache 4`` and ``--prompt-cache 0``) on a free port of
127.0.0.1, sends turn 1 (a long user message, streamed, greedy, a few tokens), then turn 2
(the whole conversation resent plus a short new question) and reports, per server, the
prompt tokens, ``cached_tokens`` and the TTFT of turn 2 (median of ``--reps``
conversations, each with a different long message so no run reuses another's state).

With ``--restart``: the prompt cache on disk instead. Per conversation, a server with
``--prompt-cache-dir`` (a new temporary directory) answers turn 1 and stops; a new server on
the same directory gets turn 2 (the TTFT after a restart), and a server without the directory
gets the same turn 2 (cold).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import httpx

WORDS = (
    "river stone lamp orchard copper violet harbor meadow lantern quiet signal thunder "
    "marble winter saddle pepper candle falcon garden mirror"
).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, ram: str, cache: int, cache_dir: Optional[str] = None, more=()):
    """A ``v4flash serve`` on a free port, once its /health answers: (process, url).
    ``more``: further arguments."""
    port = free_port()
    extra = ["--prompt-cache-dir", cache_dir] if cache_dir else []
    extra += list(more)
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "v4flash",
            "serve",
            "--model",
            model,
            "--ram",
            ram,
            "--port",
            str(port),
            "--prompt-cache",
            str(cache),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    p.kill()
    raise SystemExit("the server did not come up")


def turn(url: str, messages, max_tokens: int):
    body = {
        "model": "m",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    t0 = time.perf_counter()
    ttft = None
    text, usage = "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                d = ch.get("delta", {}).get("content") or ""
                if d and ttft is None:
                    ttft = time.perf_counter() - t0
                text += d
    if ttft is None:
        ttft = time.perf_counter() - t0
    return ttft, text, usage or {}


def first_turn(url: str, words: int, rep: int):
    """Turn 1 of conversation ``rep``; returns turn 2's messages."""
    long = " ".join(WORDS[(i * 7 + rep * 3) % len(WORDS)] for i in range(words))
    msgs = [{"role": "user", "content": f"Remember this list: {long}"}]
    _, answer, _ = turn(url, msgs, 4)
    return msgs + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Which word came first?"},
    ]


def second_turn(url: str, msgs):
    ttft, _, usage = turn(url, msgs, 2)
    details = usage.get("prompt_tokens_details") or {}
    return ttft, usage.get("prompt_tokens"), details.get("cached_tokens")


def conversation(url: str, words: int, rep: int):
    return second_turn(url, first_turn(url, words, rep))


def stop(p) -> None:
    p.terminate()  # SIGTERM: the server stops like on Ctrl-C (pending cache files written)
    p.wait(120)


def report(label: str, runs) -> None:
    ttfts = [r[0] for r in runs]
    print(
        f"{label}: turn-2 prompt {runs[0][1]} tokens, cached {[r[2] for r in runs]}, "
        f"TTFT median {statistics.median(ttfts):.2f} s "
        f"(runs {', '.join(f'{t:.2f}' for t in ttfts)})"
    )


def restarts(a) -> None:
    disk, cold = [], []
    for rep in range(a.reps):
        with tempfile.TemporaryDirectory() as d:
            p, url = start(a.model, a.ram, 4, d)
            try:
                msgs = first_turn(url, a.words, rep)
            finally:
                stop(p)
            p, url = start(a.model, a.ram, 4, d)
            try:
                disk.append(second_turn(url, msgs))
            finally:
                stop(p)
        p, url = start(a.model, a.ram, 4)
        try:
            cold.append(second_turn(url, msgs))
        finally:
            stop(p)
    report("after a restart, prompt cache on disk", disk)
    report("after a restart, RAM cache only (cold)", cold)
    ratio = statistics.median(r[0] for r in cold) / statistics.median(r[0] for r in disk)
    print(f"ratio cold/disk TTFT: {ratio:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram", default="8")
    ap.add_argument("--words", type=int, default=900)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--restart", action="store_true", help="the prompt cache on disk")
    a = ap.parse_args()
    if a.restart:
        restarts(a)
        return
    for cache in (4, 0):
        p, url = start(a.model, a.ram, cache)
        try:
            runs = [conversation(url, a.words, r) for r in range(a.reps)]
        finally:
            stop(p)
        report(f"prompt cache {'on ' if cache else 'off'}", runs)


if __name__ == "__main__":
    main()
