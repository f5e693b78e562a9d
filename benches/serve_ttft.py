"""Time to first token of the second turn of a conversation through `v4flash serve`, with
and without the prompt cache, in one run.

    python3 benches/serve_ttft.py --model DIR --ram 8 [--words 900] [--reps 3]

Starts the server twice (``--prompt-cache 4`` and ``--prompt-cache 0``) on a free port of
127.0.0.1, sends turn 1 (a long user message, streamed, greedy, a few tokens), then turn 2
(the whole conversation resent plus a short new question) and reports, per server, the
prompt tokens, ``cached_tokens`` and the TTFT of turn 2 (median of ``--reps``
conversations, each with a different long message so no run reuses another's state).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx

WORDS = (
    "river stone lamp orchard copper violet harbor meadow lantern quiet signal thunder "
    "marble winter saddle pepper candle falcon garden mirror"
).split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: str, ram: str, cache: int):
    port = free_port()
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
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
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


def conversation(url: str, words: int, rep: int):
    long = " ".join(WORDS[(i * 7 + rep * 3) % len(WORDS)] for i in range(words))
    msgs = [{"role": "user", "content": f"Remember this list: {long}"}]
    _, answer, _ = turn(url, msgs, 4)
    msgs += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Which word came first?"},
    ]
    ttft, _, usage = turn(url, msgs, 2)
    details = usage.get("prompt_tokens_details") or {}
    return ttft, usage.get("prompt_tokens"), details.get("cached_tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram", default="8")
    ap.add_argument("--words", type=int, default=900)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    for cache in (4, 0):
        p, url = start(a.model, a.ram, cache)
        try:
            runs = [conversation(url, a.words, r) for r in range(a.reps)]
        finally:
            p.terminate()
            p.wait(60)
        ttfts = [r[0] for r in runs]
        print(
            f"prompt cache {'on ' if cache else 'off'}: turn-2 prompt {runs[0][1]} tokens, "
            f"cached {[r[2] for r in runs]}, TTFT median {statistics.median(ttfts):.2f} s "
            f"(runs {', '.join(f'{t:.2f}' for t in ttfts)})"
        )


if __name__ == "__main__":
    main()
