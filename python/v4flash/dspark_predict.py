"""What drafting with DSpark is predicted to give the full 43-layer 0731 model: the DSpark
columns of ``bench --predict`` (docs/model.md §9, "DSpark: what to expect").

The same bandwidth bound as ``limits.predict_table`` (a pass costs the bytes it reads from
memory at memory bandwidth plus the experts it misses at disk speed; arithmetic, attention
and the sampler are left out: a decode step of V4 Flash is bound by its reads), applied to
a verify pass and to a draft:

- **a pass of m tokens** reads the dense weights once and, per layer, every expert at least
  one of its tokens routes to, once (the MoE groups a pass's tokens by expert). Expert e is
  picked by one token with probability ``q_e = min(1, top-k · w_e / Σw)`` (Zipf(``zipf``)
  popularity, the synthetic checkpoint's routing and the table's hit-rate assumption), so by
  one of m tokens with ``1 − (1 − q_e)^m``; the cache holds each layer's most popular ones,
  the others come from disk. Tokens are taken as independent: if consecutive tokens of the
  real model share more experts than that, passes cost less and the gains are higher.
- **with the drafter loaded** its resident tensors and its expert cache (90 slots) come out of
  the RAM budget (fewer of the model's experts cached), and every pass also reads what
  observing its tokens needs (``main_proj`` and the stages' ``wkv``).
- **a draft** reads the three stages' dense tensors, the target's head (k rows), the Markov
  bias matrix once per drafted token and, per stage, the experts its 5 block rows route to
  (the same Zipf picks); its cache holds the previous draft's experts, so an expert is read
  from disk unless the previous draft used it too. ``draft_ms`` replaces that estimate with a
  measured draft time (``cargo bench --bench dspark`` on a ``make_synthetic.py --release
  0731`` checkpoint: its drafter has the real widths).
- **the gain** at acceptance a (each draft right with probability a, independently):
  verifying k drafts yields ``1 + a + … + a^k`` tokens per ``t(k + 1) + d(k)``; k is chosen
  as the cost model chooses it (the best predicted gain over a plain step of the session with
  the drafter, if it beats that step by 3 %, else a plain step), and the gain is reported
  against plain decoding *without* the drafter loaded: below 1.0 where loading the drafter
  costs more than drafting gives.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

import numpy as np

from . import _core
from .limits import GB, ITEMSIZE, real_model_bytes

#: Acceptances the table is given at.
ACCEPTANCES = (0.5, 0.7, 0.9)
#: The cost model's margin (``speculate::cost``): drafting must be predicted to beat a plain
#: step by this much.
MARGIN = 0.03


def drafter_sizes() -> Dict[str, float]:
    """Bytes of the published 0731 drafter, by what reads them: ``draft`` (the stages' dense
    tensors a draft reads once), ``observe`` (read once per pass that feeds observed tokens),
    ``markov`` (the Markov bias matrix, read once per drafted token), ``resident`` (all its
    non-expert tensors) and ``stages``, ``block`` (tokens per draft)."""
    from .config import drafter_tensors, validate

    cfg = _core.published_config("0731")
    out = {"draft": 0.0, "observe": 0.0, "markov": 0.0, "resident": 0.0}
    for name, (dtypes, shape) in drafter_tensors(validate(cfg)).items():
        if ".experts." in name:
            continue
        b = float(np.prod(shape)) * ITEMSIZE[dtypes[0]]
        out["resident"] += b
        if "main_proj" in name or "attn.wkv." in name:
            out["observe"] += b
        elif "markov_w2" in name:
            out["markov"] += b
        elif "markov_w1" not in name:  # one row per drafted token
            out["draft"] += b
    out["stages"] = float(len(cfg["compress_ratios"]) - cfg["num_hidden_layers"])
    out["block"] = float(cfg["dspark_block_size"])
    return out


def selection_probs(n_experts: int, topk: int, zipf: float) -> np.ndarray:
    """Per expert, most popular first: the probability that one token routes to it."""
    w = np.arange(1, n_experts + 1, dtype=np.float64) ** -zipf
    return np.minimum(1.0, topk * w / w.sum())


def expected_tokens(a: float, k: int) -> float:
    """Tokens a verify of k drafts yields at acceptance a (``speculate::cost``)."""
    return float(sum(a**i for i in range(k + 1)))


def dspark_row(
    ram_gb: float,
    disk_gbs: float,
    mem_gbs: float,
    overhead_gb: float = 1.5,
    zipf: float = 1.0,
    draft_ms: Optional[float] = None,
    acceptances: Iterable[float] = ACCEPTANCES,
) -> Dict[str, Any]:
    """The DSpark prediction at one RAM budget and disk speed (the module's assumptions)."""
    m = real_model_bytes()
    d = drafter_sizes()
    layers, eb = int(m["layers"]), m["expert_bytes"]
    q = selection_probs(int(m["experts"]), int(m["topk"]), zipf)
    mem, disk = mem_gbs * GB, disk_gbs * GB

    def cached(extra: float) -> int:
        cache = max(0.0, ram_gb * GB - m["dense_resident_bytes"] - overhead_gb * GB - extra)
        return min(len(q), int(cache / eb / layers))

    def pass_s(tokens: int, c: int, observe: float) -> float:
        u = 1 - (1 - q) ** tokens
        return (
            (m["dense_bytes_per_token"] + observe) / mem
            + layers * u.sum() * eb / mem
            + layers * u[c:].sum() * eb / disk
        )

    t1 = pass_s(1, cached(0.0), 0.0)  # plain decoding, no drafter loaded
    bs = int(d["block"])
    c_d = cached(d["resident"] + d["stages"] * bs * m["topk"] * eb)
    t = {n: pass_s(n, c_d, d["observe"]) for n in range(1, bs + 2)}
    u = 1 - (1 - q) ** bs
    head = m["embed_bytes"]  # the head is the embedding's size: [V, H] BF16

    def draft_s(k: int) -> float:
        if draft_ms is not None:
            return draft_ms / 1e3
        reads = d["draft"] + head + k * d["markov"] + d["stages"] * u.sum() * eb
        missed = d["stages"] * (u * (1 - u)).sum() * eb
        return reads / mem + missed / disk

    gains = {}
    for a in acceptances:
        best = (1.0 + MARGIN, 0)
        for k in range(1, bs + 1):
            g = expected_tokens(a, k) * t[1] / (t[k + 1] + draft_s(k))
            if g > best[0]:
                best = (g, k)
        k = best[1]
        secs = t[1] if k == 0 else (t[k + 1] + draft_s(k)) / expected_tokens(a, k)
        gains[f"{a:g}"] = {"k": k, "speed_up": t1 / secs}
    return {
        "plain_tok_s": 1 / t1,
        "with_drafter_plain_tok_s": 1 / t[1],
        "pass_steps": {str(k): t[k + 1] / t[1] for k in range(1, bs + 1)},
        "draft_ms": {str(k): 1e3 * draft_s(k) for k in range(1, bs + 1)},
        "draft_measured": draft_ms is not None,
        "gain": gains,
    }


def add_dspark(
    rows: List[Dict[str, Any]],
    overhead_gb: float = 1.5,
    zipf: float = 1.0,
    draft_ms: Optional[float] = None,
) -> List[Dict[str, Any]]:
    """``limits.predict_table``'s rows, each with its ``dspark`` prediction."""
    for r in rows:
        r["dspark"] = dspark_row(
            r["ram_gb"], r["disk_gbs"], r["mem_gbs"], overhead_gb, zipf, draft_ms
        )
    return rows


def print_dspark(rows: List[Dict[str, Any]]) -> None:
    """The DSpark columns as a table (after ``bench``'s ``print_predict``)."""
    d0 = rows[0]["dspark"]
    how = "measured (--draft-ms)" if d0["draft_measured"] else "estimated from its reads"
    print()
    print(
        "DSpark (0731 drafter, k = 1..5 drafts per verify): a verify pass of k+1 tokens in "
        "plain steps of the session with the drafter; the draft's time "
        f"({how}); the speed-up over plain decoding without the drafter at acceptance "
        + " / ".join(f"{a:g}" for a in ACCEPTANCES)
        + ", k chosen as the cost model would (k = 0: plain steps). Assumes independent "
        "tokens with Zipf expert picks, bandwidth-bound passes (python/v4flash/dspark_predict.py)."
    )
    accs = list(d0["gain"])
    print(
        "| RAM | disk | plain tok/s | pass k=1..5 (steps) | draft ms (k=5) | "
        + " | ".join(f"a = {a}" for a in accs)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(accs))
    for r in rows:
        d = r["dspark"]
        passes = " ".join(f"{v:.2f}" for v in d["pass_steps"].values())
        cells = " | ".join(f"{g['speed_up']:.2f}× (k={g['k']})" for g in d["gain"].values())
        print(
            f"| {r['ram_gb']:g} GB | {r['disk_gbs']:g} GB/s | {d['plain_tok_s']:.2f} | {passes} "
            f"| {d['draft_ms']['5']:.0f} | {cells} |"
        )
