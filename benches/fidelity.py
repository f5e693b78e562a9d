#!/usr/bin/env python3
"""How far each numerics mode moves the model's output from ``exact``.

``python3 benches/fidelity.py --model DIR`` loads the checkpoint once per numerics mode and
reports, against ``exact`` on the same prompts:

- ``kl_mean`` / ``kl_max``: KL(p_exact || p_mode) of the next-token distribution, in nats,
  over every teacher-forced position of every prompt;
- ``top1``: the fraction of those positions where both modes put the same token first;
- ``greedy_match``: over the prompts, the mean fraction of a greedy continuation of
  ``--gen`` tokens that equals exact's before the first difference (1.0 = identical);
- ``logit_err_rel``: the largest |logit difference| over the largest |exact logit|.

``fp8-act`` (DeepSeek's own FP8 activation round trip, the quantization the model was trained
with) is the yardstick: on random-weight checkpoints every activation quantization looks far
worse than on a trained model, so a mode is judged next to it, on the same prompts.
``official`` adds DeepSeek's KV and indexer round trips; ``benches/official.py`` measures it
on prompts long enough for the indexer to drop entries. A measurement tool, not part of the
package: tests/test_numerics.py and benches/official.py load it from here.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from v4flash import NUMERICS, load, load_config
from v4flash.tokenizer import load_tokenizer


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    z = np.asarray(z, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def kl_rows(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(other)) per row, in nats."""
    lp, lq = log_softmax(ref), log_softmax(other)
    return (np.exp(lp) * (lp - lq)).sum(axis=-1)


def make_prompts(vocab: int, n: int, length: int, seed: int = 0) -> List[List[int]]:
    """n prompts of `length` ids drawn uniformly from [2, vocab) (ids 0 and 1 are bos/eos)."""
    rng = np.random.default_rng(seed)
    return [[int(i) for i in rng.integers(2, vocab, size=length)] for _ in range(n)]


def text_prompts(tokenizer: Any, text: str, n: int, length: int) -> List[List[int]]:
    """n prompts of `length` ids: consecutive windows of `text` tokenized (a trained model is
    judged on the kind of text it models, not on random ids)."""
    ids = tokenizer.encode_plain(text)
    if len(ids) < n * length:
        raise ValueError(
            f"the text has {len(ids)} tokens; {n} prompts of {length} need {n * length}"
        )
    return [ids[i * length : (i + 1) * length] for i in range(n)]


def _prefix_match(a: Sequence[int], b: Sequence[int]) -> float:
    k = 0
    for x, y in zip(a, b):
        if x != y:
            break
        k += 1
    return k / max(len(a), 1)


def outputs(model: Any, prompts: List[List[int]], gen: int) -> Dict[str, Any]:
    """Teacher-forced logits of every prompt and a greedy continuation of each."""
    logits = [np.asarray(model.logits(p)) for p in prompts]
    greedy = [
        list(model.generate(p, max_new_tokens=gen, temperature=0.0, stop_ids=[])) for p in prompts
    ]
    return {"logits": logits, "greedy": greedy}


def compare(ref: Dict[str, Any], out: Dict[str, Any]) -> Dict[str, float]:
    """The fidelity numbers of `out` against `ref` (both from `outputs`)."""
    kl = np.concatenate([kl_rows(a, b) for a, b in zip(ref["logits"], out["logits"])])
    top1 = np.concatenate(
        [a.argmax(-1) == b.argmax(-1) for a, b in zip(ref["logits"], out["logits"])]
    )
    scale = max(float(np.abs(a).max()) for a in ref["logits"])
    err = max(float(np.abs(a - b).max()) for a, b in zip(ref["logits"], out["logits"]))
    greedy = [_prefix_match(a, b) for a, b in zip(ref["greedy"], out["greedy"])]
    return {
        "positions": int(kl.size),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "top1": float(top1.mean()),
        "greedy_match": float(np.mean(greedy)),
        "logit_err_rel": err / scale if scale else float("nan"),
    }


def measure(
    model_dir: str,
    modes: Sequence[str] = NUMERICS,
    *,
    prompts: int = 4,
    length: int = 48,
    gen: int = 16,
    seed: int = 0,
    text: Optional[str] = None,
    load_kw: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Loads `model_dir` once per mode (exact first) and compares each mode with exact.
    Prompts are random ids, or windows of `text` when it is given."""
    cfg = load_config(Path(model_dir))
    if text is None:
        ps = make_prompts(cfg.vocab_size, prompts, length, seed)
    else:
        ps = text_prompts(load_tokenizer(model_dir), text, prompts, length)
    res: Dict[str, Any] = {
        "model": str(model_dir),
        "prompt_source": "random ids" if text is None else "text",
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "prompts": prompts,
        "prompt_len": length,
        "gen": gen,
        "modes": {},
    }
    ref = None
    for mode in ["exact"] + [m for m in modes if m != "exact"]:
        model = load(model_dir, numerics=mode, **(load_kw or {}))
        out = outputs(model, ps, gen)
        del model
        gc.collect()
        if ref is None:
            ref = out
            continue
        res["modes"][mode] = compare(ref, out)
    return res


def _table(r: Dict[str, Any]) -> str:
    lines = [
        f"{r['model']} ({r['layers']} layers, hidden {r['hidden']}): {r['prompts']} prompts x "
        f"{r['prompt_len']} tokens ({r['prompt_source']}), greedy {r['gen']}",
        f"{'mode':<8} {'KL mean':>10} {'KL max':>10} {'top-1':>7} {'greedy':>7} {'max err':>8}",
    ]
    for mode, m in r["modes"].items():
        lines.append(
            f"{mode:<8} {m['kl_mean']:>10.3e} {m['kl_max']:>10.3e} {m['top1']:>7.1%} "
            f"{m['greedy_match']:>7.1%} {m['logit_err_rel']:>8.3f}"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 benches/fidelity.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--model", action="append", required=True, help="checkpoint (repeatable)")
    p.add_argument("--modes", default=",".join(NUMERICS), help="comma-separated")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=48)
    p.add_argument("--gen", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", type=Path, help="prompts from this text file instead of random ids")
    p.add_argument("--ram", type=float, default=None, help="RAM budget in GB per load")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in NUMERICS]
    if bad:
        print(f"unknown numerics mode(s) {bad}; choose from {list(NUMERICS)}", file=sys.stderr)
        return 2
    kw = {"ram_gb": a.ram} if a.ram else {}
    text = a.text.read_text(encoding="utf-8") if a.text else None
    try:
        results = [
            measure(
                m,
                modes,
                prompts=a.prompts,
                length=a.prompt_len,
                gen=a.gen,
                seed=a.seed,
                text=text,
                load_kw=kw,
            )
            for m in a.model
        ]
    except ValueError as e:
        print(f"fidelity: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(results, indent=1))
    else:
        print("\n\n".join(_table(r) for r in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
