"""Continuous batching through ``v4flash serve --parallel N`` (rust/schedule.rs), end to end
over HTTP, against ``--parallel 1`` (one request at a time) in the same run.

    python3 benches/parallel.py --model DIR --ram 20 [--parallel 1,2] [--long 4096]
        [--arrivals 0.1,0.25,0.4,0.55,0.7] [--decode 1,2,4] [--tokens 48] [--round-prefill N]

1. **TTFT behind a long prefill.** Per ``--parallel`` P, a server (``--prompt-cache 0``)
   gets a long request (about ``--long`` prompt tokens of words, streamed, greedy, 4 new
   tokens); a short request (a dozen tokens, 8 new) is sent at each fraction of
   ``--arrivals`` of the long prefill's time (measured alone first) after it, one pair per
   fraction. Reported: the short request's time to first token from its sending (p50, p95
   = the largest of 5) when it was sent before the long one's first token (later ones are
   listed apart), and the long one's.
2. **Aggregate decode.** Per B of ``--decode``, a server with ``--parallel B`` gets B
   concurrent streamed requests (distinct short prompts, greedy, ``--tokens`` new tokens);
   the aggregate rate is the tokens after each request's first, summed, over the time from
   the first request's first token to the last request's end; the ratio is to B = 1.

Nothing is asserted (a measurement tool, not part of the package).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any, Dict, List, Optional

import httpx
import serve_ttft
from serve_ttft import WORDS, stop


def start(model: str, ram: str, parallel: int, round_prefill: Optional[int]):
    more = ["--parallel", str(parallel)]
    if round_prefill:
        more += ["--round-prefill", str(round_prefill)]
    return serve_ttft.start(model, ram, 0, more=more)


def request(url: str, text: str, max_tokens: int, out: Dict[str, Any]) -> None:
    body = {
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    t0 = time.perf_counter()
    out["sent"] = t0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                out["usage"] = ev["usage"]
            for ch in ev.get("choices", []):
                if ch.get("delta", {}).get("content") and "first" not in out:
                    out["first"] = time.perf_counter()
    out["end"] = time.perf_counter()
    out.setdefault("first", out["end"])


def words(n: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt * 13 + i // 20) % len(WORDS)] for i in range(n))


def ttft_behind(url: str, long_words: int, arrivals: List[float]) -> Dict[str, Any]:
    alone: Dict[str, Any] = {}
    request(url, "Remember: " + words(long_words, 0), 4, alone)
    prefill = alone["first"] - alone["sent"]
    shorts: List[float] = []
    longs: List[float] = []
    late: List[float] = []
    for k, frac in enumerate(arrivals):
        lo: Dict[str, Any] = {}
        sh: Dict[str, Any] = {}
        t = threading.Thread(
            target=request, args=(url, "Remember: " + words(long_words, k + 1), 4, lo)
        )
        t.start()
        time.sleep(frac * prefill)
        request(url, f"Say hello to number {k}, please.", 8, sh)
        t.join()
        # only a short request sent before the long one's first token arrived during its
        # prefill (the alone time is noisy: a late fraction may come after it)
        if sh["sent"] < lo["first"]:
            shorts.append(sh["first"] - sh["sent"])
        else:
            late.append(round(sh["first"] - sh["sent"], 3))
        longs.append(lo["first"] - lo["sent"])
    return {
        "long_prompt_tokens": alone.get("usage", {}).get("prompt_tokens"),
        "long_alone_ttft_s": round(prefill, 3),
        "short_ttft_s": [round(x, 3) for x in shorts],
        "short_p50_s": round(statistics.median(shorts), 3) if shorts else None,
        "short_p95_s": round(max(shorts), 3) if shorts else None,
        "short_after_the_prefill_s": late,
        "long_ttft_s": [round(x, 3) for x in longs],
    }


def decode(url: str, b: int, tokens: int) -> Dict[str, Any]:
    outs: List[Dict[str, Any]] = [{} for _ in range(b)]
    ts = [
        threading.Thread(
            target=request, args=(url, f"Tell story {i}: " + words(8, 50 + i), tokens, outs[i])
        )
        for i in range(b)
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    n = sum(max(0, o.get("usage", {}).get("completion_tokens", 0) - 1) for o in outs)
    span = max(o["end"] for o in outs) - min(o["first"] for o in outs)
    return {"tokens": n, "seconds": round(span, 3), "tok_s": round(n / span, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram", default="20")
    ap.add_argument("--parallel", default="1,2")
    ap.add_argument("--long", type=int, default=4096, help="words of the long prompt (~tokens)")
    ap.add_argument("--arrivals", default="0.1,0.25,0.4,0.55,0.7")
    ap.add_argument("--decode", default="1,2,4", help="B values ('' to skip)")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="decode runs per B")
    ap.add_argument("--round-prefill", type=int)
    ap.add_argument("--skip-ttft", action="store_true")
    a = ap.parse_args()
    result: Dict[str, Any] = {"ttft": {}, "decode": {}}
    if not a.skip_ttft:
        arrivals = [float(x) for x in a.arrivals.split(",")]
        for p in [int(x) for x in a.parallel.split(",")]:
            proc, url = start(a.model, a.ram, p, a.round_prefill)
            try:
                request(url, "warm up", 4, {})
                r = ttft_behind(url, a.long, arrivals)
            finally:
                stop(proc)
            result["ttft"][p] = r
            print(f"--parallel {p}: {json.dumps(r)}", flush=True)
    for b in [int(x) for x in a.decode.split(",") if x]:
        proc, url = start(a.model, a.ram, b, a.round_prefill)
        try:
            decode(url, b, 8)  # warm up: the experts into the cache
            runs = [decode(url, b, a.tokens) for _ in range(a.rounds)]
        finally:
            stop(proc)
        rate = statistics.median(r["tok_s"] for r in runs)
        result["decode"][b] = {"runs": runs, "median_tok_s": rate}
        base = result["decode"].get(1, {}).get("median_tok_s")
        ratio = f" ({rate / base:.2f}x B=1)" if base else ""
        print(
            f"decode B={b}: {rate:.2f} tok/s{ratio} (runs {[r['tok_s'] for r in runs]})", flush=True
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
