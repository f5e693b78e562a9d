"""What speculative decoding gives per drafter acceptance and draft length (docs/model.md §9).

The synthetic checkpoints' random weights accept no real drafter, so the benchmark-only
oracle drafter stands in: it knows the plain greedy continuation and proposes each token right
with probability P. A prompt of random ids is prefilled once (not timed); from that snapshot
the same ``--gen`` greedy tokens are decoded plainly (``speculate="off"``), with ``k`` drafts
verified at every step (the cost model bypassed: what a pass of ``k + 1`` tokens is worth), and
with the cost model choosing (``auto``), plus prompt lookup (``speculate="auto"``, which finds
nothing the random model accepts). Every run's tokens are checked equal to the plain ones.
Rates are medians over ``--rounds`` rounds; the table gives them against ``off`` of the same
rounds.

    python3 benches/speculate_passes.py --model synth4 --ram 20 --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import v4flash


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram", type=float, required=True, help="RAM budget, GB")
    ap.add_argument("--prompt", type=int, default=196, help="prompt tokens (random ids)")
    ap.add_argument("--gen", type=int, default=48, help="tokens decoded per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--p", default="1.0,0.7,0.4", help="oracle acceptances, comma-separated")
    ap.add_argument("--only-auto", action="store_true", help="only off and prompt lookup")
    ap.add_argument("--k", default="1,2,4", help="forced draft lengths, comma-separated")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="the prompt is a block of random ids repeated this many times (prompt lookup then "
        "drafts, and the random model rejects)",
    )
    a = ap.parse_args()
    ps = [float(x) for x in a.p.split(",")]
    ks = [int(x) for x in a.k.split(",")]

    m = v4flash.load(a.model, ram_gb=a.ram)
    rng = np.random.default_rng(0)
    block = max(1, a.prompt // max(1, a.repeat))
    ids = rng.integers(1000, min(100000, m.config.vocab_size), block)
    prompt = ([int(x) for x in ids] * a.repeat)[: a.prompt]
    s = m.session()
    s.feed(prompt)
    snap = s.snapshot()

    def run(**kw):
        s.rollback(snap)
        g = s._generation([], max_new_tokens=a.gen, temperature=0.0, stop_ids=[], **kw)
        t = time.perf_counter()
        out = g.collect()
        return out, time.perf_counter() - t, g.speculation()

    plain, _, _ = run(speculate="off")
    cases = [("off", {"speculate": "off"})]
    for p in [] if a.only_auto else ps:
        cases += [(f"P={p} k={k}", {"_oracle": (plain, p, 0), "_force_drafts": k}) for k in ks]
        cases.append((f"P={p} cost model", {"_oracle": (plain, p, 0)}))
    if not a.only_auto:
        cases.append(("P=0 cost model", {"_oracle": (plain, 0.0, 0)}))
    cases.append(("lookup (auto)", {"speculate": "auto"}))
    rates: dict = {}
    stats: dict = {}
    for r in range(a.rounds):
        order = cases if r % 2 == 0 else cases[::-1]
        for name, kw in order:
            if "_oracle" in kw:
                kw = {**kw, "_oracle": (plain, kw["_oracle"][1], r)}
            out, dt, sp = run(**kw)
            if out != plain:
                raise SystemExit(f"{name}: the tokens differ from plain decoding")
            rates.setdefault(name, []).append(a.gen / dt)
            stats.setdefault(name, sp)
    off = statistics.median(rates["off"])
    print(
        f"{a.model} --ram {a.ram} --repeat {a.repeat}: off {off:.2f} tok/s (median of {a.rounds})"
    )
    print("| run | tok/s | x off | verifies | accepted / drafted |")
    print("|---|---|---|---|---|")
    for name, _ in cases:
        med = statistics.median(rates[name])
        sp = stats[name] or {}
        acc = f"{sp['accepted']}/{sp['drafted']}" if sp else ""
        print(f"| {name} | {med:.2f} | {med / off:.2f} | {sp.get('verifies', '')} | {acc} |")


if __name__ == "__main__":
    main()
