"""How `v4flash serve` holds up: short requests side by side, and a healthy client while slow
connections are held open.

    python3 benches/serve_load.py [--model DIR] [--concurrent 10] [--slow 200] [--reps 3]

Starts the server (the demo by default) on a free port of 127.0.0.1 and measures:

1. ``--concurrent`` clients at once, each sending one short chat completion (greedy, 8 new
   tokens), ``--reps`` rounds: requests/s of the whole round and the p50/p95 latency of the
   requests (the server runs them one at a time, so latency grows with the queue).
2. ``--slow`` connections that send part of a request's headers, one byte every few seconds,
   and never finish (slowloris), then a healthy client sending a short request every second:
   its p50/p95 latency, how many of its requests failed, and the server's threads and open
   descriptors (``/proc/PID``) while the slow connections are held.

Nothing is asserted: it prints one JSON object (``--json``) or a table.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import httpx

BODY = {
    "messages": [{"role": "user", "content": "Say something short."}],
    "max_tokens": 8,
    "temperature": 0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: Optional[str], port: int, extra: List[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "v4flash", "serve", "--port", str(port)] + extra
    if model:
        cmd += ["--model", model]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return p
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            raise SystemExit(f"the server exited with {p.returncode}")
        time.sleep(0.1)
    p.kill()
    raise SystemExit("the server did not come up in 120 s")


def pct(xs: List[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def one(url: str, timeout: float) -> float:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=timeout)
    r.raise_for_status()
    return time.perf_counter() - t0


def concurrent_round(url: str, n: int) -> Dict[str, object]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as ex:
        lat = list(ex.map(lambda _: one(url, 120), range(n)))
    wall = time.perf_counter() - t0
    return {"requests_per_s": n / wall, "latencies": lat}


def proc_counts(pid: int) -> Dict[str, int]:
    threads = fds = -1
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return {"threads": threads, "fds": fds}


def hold_slow(port: int, n: int, stop: threading.Event, opened: List[socket.socket]) -> None:
    """Opens n connections that trickle header bytes forever (one byte a socket every ~5 s)."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
            opened.append(s)
        except OSError:
            break
    while not stop.wait(5.0):
        for s in list(opened):
            try:
                s.send(b"a")
            except OSError:
                opened.remove(s)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="checkpoint folder (default: the bundled demo)")
    ap.add_argument("--concurrent", type=int, default=10)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--healthy", type=int, default=20, help="healthy requests while slow ones wait")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("serve_args", nargs="*", help="more `serve` options (after --)")
    a = ap.parse_args(argv)
    port = free_port()
    p = start(a.model, port, a.serve_args)
    url = f"http://127.0.0.1:{port}"
    out: Dict[str, object] = {}
    try:
        one(url, 120)  # warm the cache
        rounds = [concurrent_round(url, a.concurrent) for _ in range(a.reps)]
        lat = [x for r in rounds for x in r["latencies"]]  # type: ignore[union-attr]
        out["concurrent"] = {
            "clients": a.concurrent,
            "requests_per_s": [round(float(r["requests_per_s"]), 2) for r in rounds],
            "p50_s": round(pct(lat, 0.5), 3),
            "p95_s": round(pct(lat, 0.95), 3),
        }
        out["idle"] = proc_counts(p.pid)
        stop, opened = threading.Event(), []  # type: ignore[var-annotated]
        holder = threading.Thread(target=hold_slow, args=(port, a.slow, stop, opened))
        holder.start()
        time.sleep(3)
        healthy, failed = [], 0
        for _ in range(a.healthy):
            try:
                healthy.append(one(url, 30))
            except (httpx.HTTPError, OSError):
                failed += 1
            time.sleep(1)
        counts = proc_counts(p.pid)
        still = len(opened)
        stop.set()
        holder.join()
        for s in opened:
            s.close()
        out["slow"] = {
            "slow_connections_opened": a.slow,
            "slow_connections_still_open": still,
            "healthy_requests": a.healthy,
            "healthy_failed": failed,
            "healthy_p50_s": round(pct(healthy, 0.5), 3) if healthy else None,
            "healthy_p95_s": round(pct(healthy, 0.95), 3) if healthy else None,
            **counts,
        }
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {json.dumps(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
