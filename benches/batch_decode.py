"""Aggregate decode speed of B sequences stepped together (``_core.step_batch``, one forward
pass per step for all of them) against one sequence at a time.

    python3 benches/batch_decode.py --model synth4 --ram 20 --all-experts
        [--batch 1,2,4,8] [--prompt 32] [--steps 12] [--rounds 3] [--threads N] [--json]

One load, then ``--rounds`` rounds; each round runs every B of ``--batch`` (in order on even
rounds, reversed on odd ones, so a drift of the machine does not favour one B): B fresh
sequences, each prefilled with its own random ``--prompt`` ids (not timed), then ``--steps``
greedy decode steps of all B together, each step timed alone (the first is dropped: its
experts are the prompt's last ones). A run's aggregate rate is B / its median step; the
table shows, per B, the median of the rounds' rates, its spread, and the ratio to B = 1.

With the whole expert set in the cache (``slots >= experts``: ``--all-experts`` claims it
before the plan sizes the prefill chunk, which would otherwise take a part of it at
``--ram 20``), every expert is read once
before the first round, so the steps measure compute and memory bandwidth; otherwise the
cache is whatever the steps leave (``--ram 6``: most experts come from disk). Per step it
also reports where the time goes, from ``Model.stats()`` deltas: attention (compressors and
indexer included), MoE (expert waits included), the waits alone, the head, and the rest
(embedding, hyper-connections, snapshots, Python), the experts a step used (summed over
the layers), how many were read, and the bytes read (prefetches included). Without the
whole set cached, one untimed run of the largest B first leaves the cache as steps do.

Nothing is asserted (a measurement tool, not part of the package).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

import numpy as np

import v4flash
from v4flash import _core

KEYS = (
    "attn_s",
    "moe_s",
    "expert_wait_s",
    "head_s",
    "expert_bytes_read",
    "expert_requests",
    "expert_misses",
)


def wait_prefault(core: Any) -> float:
    t0 = time.perf_counter()
    while core.stats()["prefault_running"]:
        time.sleep(0.2)
    return time.perf_counter() - t0


def one_run(core: Any, vocab: int, b: int, prompt: int, steps: int, seed: int) -> Dict[str, Any]:
    """B sequences prefilled, then `steps` decode steps of all of them together."""
    rng = np.random.default_rng(seed)
    seqs = [_core.BatchSession(core) for _ in range(b)]
    prompts = [[int(t) for t in rng.integers(2, vocab, size=prompt)] for _ in range(b)]
    last = _core.step_batch([(s, p, "last") for s, p in zip(seqs, prompts)])
    times: List[float] = []
    parts = {k: 0.0 for k in KEYS}
    for i in range(steps):
        toks = [[int(np.argmax(lg))] for lg in last]
        s0 = core.stats()
        t0 = time.perf_counter()
        last = _core.step_batch([(s, t, "last") for s, t in zip(seqs, toks)])
        dt = time.perf_counter() - t0
        s1 = core.stats()
        if i == 0:
            continue
        times.append(dt)
        for k in KEYS:
            parts[k] += s1[k] - s0[k]
    n = len(times)
    step = statistics.median(times)
    return {
        "b": b,
        "step_s": step,
        "tok_s": b / step,
        "per_step": {k: v / n for k, v in parts.items()},
        "wall_s": sum(times) / n,
    }


def main(argv: List[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram", type=float, required=True, help="RAM budget, GB")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--numerics", default="exact")
    ap.add_argument(
        "--all-experts",
        action="store_true",
        help="claim a cache for every expert (expert_cache_mb), the prefill chunk from the rest",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    batches = [int(x) for x in a.batch.split(",")]
    opts: Dict[str, Any] = dict(ram_gb=a.ram, threads=a.threads, numerics=a.numerics)
    if a.all_experts:
        p = v4flash.plan(a.model, **opts)
        opts["expert_cache_mb"] = p["slot_bytes"] * p["total_experts"] / 2**20
    t0 = time.perf_counter()
    m = v4flash.load(a.model, **opts)
    core, vocab = m._core, m.config.vocab_size
    load_s = time.perf_counter() - t0
    plan = core.plan()
    prefault_s = wait_prefault(core)
    all_in = plan["slots"] >= plan["total_experts"]
    warm_s = 0.0
    if all_in:
        t0 = time.perf_counter()
        for layer in range(m.config.num_hidden_layers):
            core.read_experts(layer, list(range(m.config.n_routed_experts)))
        warm_s = time.perf_counter() - t0
    else:
        # the cache as the steps leave it, not as the prefault left it: one untimed run
        one_run(core, vocab, max(batches), a.prompt, a.steps, seed=999)
    runs: Dict[int, List[Dict[str, Any]]] = {b: [] for b in batches}
    for r in range(a.rounds):
        order = batches if r % 2 == 0 else batches[::-1]
        for b in order:
            runs[b].append(one_run(core, vocab, b, a.prompt, a.steps, seed=1000 * r + b))
            print(f"round {r} B={b}: {runs[b][-1]['tok_s']:.3f} tok/s", file=sys.stderr)
    base = statistics.median(x["tok_s"] for x in runs[batches[0]])
    rows = []
    for b in batches:
        rates = [x["tok_s"] for x in runs[b]]
        per = {k: statistics.median(x["per_step"][k] for x in runs[b]) for k in KEYS}
        rows.append(
            {
                "b": b,
                "tok_s": statistics.median(rates),
                "tok_s_min": min(rates),
                "tok_s_max": max(rates),
                "ratio": statistics.median(rates) / base,
                "step_ms": 1e3 * statistics.median(x["step_s"] for x in runs[b]),
                "wall_ms": 1e3 * statistics.median(x["wall_s"] for x in runs[b]),
                **{("mb_read" if k == "expert_bytes_read" else k): per[k] for k in KEYS},
            }
        )
    for r in rows:
        r["mb_read"] = r["mb_read"] / 1e6
    res = {
        "model": os.path.basename(os.path.normpath(a.model)),
        "ram_gb": a.ram,
        "numerics": a.numerics,
        "threads": core.threads,
        "kernels": _core.kernel_tier(),
        "slots": plan["slots"],
        "total_experts": plan["total_experts"],
        "all_experts_in_ram": all_in,
        "load_s": load_s,
        "prefault_wait_s": prefault_s,
        "warm_read_s": warm_s,
        "prompt": a.prompt,
        "steps": a.steps,
        "rounds": a.rounds,
        "loadavg": os.getloadavg(),
        "rows": rows,
    }
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    print(
        f"{res['model']} --ram {a.ram:g}: {plan['slots']}/{plan['total_experts']} experts cached, "
        f"{res['kernels']}, {res['threads']} threads, {a.numerics}; prompt {a.prompt}, "
        f"{a.steps - 1} timed steps x {a.rounds} rounds; load average {res['loadavg'][0]:.2f}"
    )
    head = (
        "   B   tok/s (min-max)         x B=1   step ms   attn   moe  (wait)  head  rest"
        "   experts  misses  MB read"
    )
    print(head)
    for r in rows:
        ms = {k: 1e3 * r[k] for k in ("attn_s", "moe_s", "expert_wait_s", "head_s")}
        rest = r["wall_ms"] - ms["attn_s"] - ms["moe_s"] - ms["head_s"]
        print(
            f"{r['b']:4d} {r['tok_s']:7.2f} ({r['tok_s_min']:.2f}-{r['tok_s_max']:.2f})"
            f"  {r['ratio']:5.2f}x  {r['step_ms']:8.1f} {ms['attn_s']:6.1f} {ms['moe_s']:5.1f}"
            f" ({ms['expert_wait_s']:5.1f}) {ms['head_s']:5.1f} {rest:5.1f}"
            f" {r['expert_requests']:9.1f} {r['expert_misses']:7.1f} {r['mb_read']:8.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
