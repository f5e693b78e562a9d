#!/usr/bin/env python3
"""What `official` numerics changes on a prompt long enough for the indexer to drop entries.

    python3 benches/official.py --model DIR [--ram 6] [--prompt-len 2304] [--gen 16] [--json]

On one random prompt (default 2,304 tokens: the lightning indexer keeps `index_topk` of the
`(t+1)//4` visible compressed entries, so from t = 4·index_topk + 3 on it really chooses) it runs
`exact`, `fast` and `official` (each loaded in turn) and reports, for exact vs official and fast
vs official:

- ``sel_diff``: over every CSA layer and every position where the indexer chooses, the mean
  fraction of its `index_topk` picks that differ between the two modes (``sel_rows_any``: the
  fraction of those positions with at least one different pick);
- ``kl_mean`` / ``kl_max``: KL(p_a || p_b) of the next-token distributions, in nats, at those
  positions (teacher-forced);
- ``top1``: the fraction of those positions where both put the same token first;
- ``greedy_match``: the fraction of a greedy continuation of ``--gen`` tokens that agrees
  before the first difference (1.0 = identical).

Each mode's forward pass runs layer by layer through the engine's layer probe (the indexer's
picks are not exposed otherwise), which is bit-identical to the normal forward pass
(tests/test_official.py); the greedy continuation is an ordinary generate call. ``seconds``
is the wall time of each mode's layer-by-layer prefill (on a shared machine, indicative only).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from v4flash import load, load_config

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benches/fidelity.py
from fidelity import _prefix_match, kl_rows, make_prompts  # noqa: E402

MODES = ["exact", "fast", "official"]
PAIRS = [("exact", "official"), ("fast", "official")]


def run_mode(model_dir: str, mode: str, ids: List[int], rows: List[int], gen: int, kw) -> Dict:
    model = load(model_dir, numerics=mode, **kw)
    core = model._core
    t0 = time.perf_counter()
    x, sels = None, {}
    for layer in range(model.config.num_hidden_layers):
        x, sel = core._layer_probe(layer, ids, x)
        if sel is not None:
            sels[layer] = sel
        print(f"  {mode}: layer {layer} done ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    seconds = time.perf_counter() - t0
    logits = np.asarray(core._probe_logits(x, rows))
    del x
    greedy = list(model.generate(ids, max_new_tokens=gen, temperature=0.0, stop_ids=[]))
    del model, core
    gc.collect()
    return {"sels": sels, "logits": logits, "greedy": greedy, "seconds": seconds}


def sel_diff(a: Dict[int, List[List[int]]], b: Dict[int, List[List[int]]], rows, k):
    fr, any_ = [], []
    for layer in sorted(a):
        for t in rows:
            same = len(set(a[layer][t]) & set(b[layer][t]))
            fr.append(1.0 - same / k)
            any_.append(same < k)
    return float(np.mean(fr)), float(np.mean(any_)), len(fr)


def compare(a: Dict, b: Dict, rows, k) -> Dict[str, float]:
    kl = kl_rows(a["logits"], b["logits"])
    d, d_any, n = sel_diff(a["sels"], b["sels"], rows, k)
    return {
        "sel_diff": d,
        "sel_rows_any": d_any,
        "sel_rows": n,
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "top1": float((a["logits"].argmax(-1) == b["logits"].argmax(-1)).mean()),
        "greedy_match": _prefix_match(a["greedy"], b["greedy"]),
    }


def measure(model_dir: str, length: int, gen: int, seed: int, kw) -> Dict[str, Any]:
    cfg = load_config(Path(model_dir))
    k = cfg.index_topk
    first = 4 * k + 3  # the first position with more than k visible entries
    if length <= first:
        raise SystemExit(f"--prompt-len must exceed {first} so the indexer drops entries")
    if "compressed_sparse_attention" not in cfg.layer_types:
        raise SystemExit("the checkpoint has no CSA layer (no indexer)")
    ids = make_prompts(cfg.vocab_size, 1, length, seed)[0]
    rows = list(range(first, length))
    out = {m: run_mode(model_dir, m, ids, rows, gen, kw) for m in MODES}
    return {
        "model": str(model_dir),
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "csa_layers": [
            i for i, t in enumerate(cfg.layer_types) if t == "compressed_sparse_attention"
        ],
        "index_topk": k,
        "prompt_len": length,
        "positions": len(rows),
        "gen": gen,
        "seconds": {m: round(o["seconds"], 1) for m, o in out.items()},
        "pairs": {f"{a} vs {b}": compare(out[a], out[b], rows, k) for a, b in PAIRS},
    }


def _table(r: Dict[str, Any]) -> str:
    lines = [
        f"{r['model']} ({r['layers']} layers, hidden {r['hidden']}, CSA layers {r['csa_layers']}, "
        f"index_topk {r['index_topk']}): prompt {r['prompt_len']} tokens, {r['positions']} "
        f"positions where the indexer chooses, greedy {r['gen']}",
        f"{'pair':<18} {'picks differ':>12} {'rows any':>9} {'KL mean':>10} {'KL max':>9} "
        f"{'top-1':>7} {'greedy':>7}",
    ]
    for pair, m in r["pairs"].items():
        lines.append(
            f"{pair:<18} {m['sel_diff']:>12.2%} {m['sel_rows_any']:>9.1%} {m['kl_mean']:>10.3e} "
            f"{m['kl_max']:>9.3f} {m['top1']:>7.1%} {m['greedy_match']:>7.1%}"
        )
    lines.append(
        "prefill seconds (layer by layer, shared machine): "
        + ", ".join(f"{m} {s}" for m, s in r["seconds"].items())
    )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-len", type=int, default=2304)
    p.add_argument("--gen", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ram", type=float, default=None, help="RAM budget in GB per load")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    kw: Dict[str, Any] = {"ctx": a.prompt_len + a.gen}
    if a.ram:
        kw["ram_gb"] = a.ram
    r = measure(a.model, a.prompt_len, a.gen, a.seed, kw)
    print(json.dumps(r, indent=1) if a.json else _table(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
