"""Whole-run benchmark: load, prefill, greedy decode, and the machine's own limits.

    v4flash bench --model DIR --ram 16 --prompt 16 --gen 4 [--json]   (or benches/bench.py)
    v4flash bench --predict [--mem-gbs 50]

Besides the engine's speed it measures, in the same run, the streaming memory-read bandwidth
and the disk's direct (uncached) sequential read bandwidth on the checkpoint's own shards, and
from them the decode speed this checkpoint could reach at the observed expert hit rate:

    t_token >= dense_bytes / mem_bw + layers * k * (1 - hit_rate) * expert_bytes / disk_bw

``dense_bytes`` is every non-expert tensor a decode step reads (attention, shared expert,
router, compressors, indexer, hyper-connections, norms, the head) plus one embedding row.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import SPECULATE, _core
from .limits import (  # noqa: F401  (bench's names since before limits.py)
    DISK_READERS,
    GB,
    ITEMSIZE,
    _limit,
    disk_probe,
    disk_read_gbs,
    fma_peak_gflops,
    limit_tok_s,
    mem_read_gbs,
    predict_table,
    published_config,
    real_model_bytes,
    zipf_hit_rate,
)
from .units import plural

PROMPT_TEXT = (
    "DeepSeek V4 Flash is a mixture-of-experts language model. Each token is routed to six of "
    "two hundred and fifty-six experts per layer, plus one shared expert, so most of the "
    "weights sit idle for any given token. Running it on an ordinary computer means keeping "
    "the dense part in memory and streaming the experts from the disk through a cache. "
)


# --------------------------------------------------------------------------------------------
# Checkpoint accounting (the core's, from the shard headers: no weights read)
# --------------------------------------------------------------------------------------------
def read_headers(model_dir: Path) -> Dict[str, Tuple[str, List[int], int]]:
    """name -> (dtype, shape, nbytes) over all shards, as the core reads the headers
    (``_core.inspect_checkpoint``)."""
    found = _core.inspect_checkpoint(str(model_dir))["tensors"]
    return {name: (dtype, list(shape), nbytes) for name, dtype, shape, nbytes, _ in found}


def account(headers: Dict[str, Tuple[str, List[int], int]], cfg: Any) -> Dict[str, float]:
    """Bytes and parameters a decode step touches: the core's accounting of the tensor table
    (``_core.table_bytes``, ``rust/checkpoint/sizes.rs``).

    Among them dense_bytes_per_token (everything but the routed experts, the embedding table
    (one row only), the hash tables (one row) and the drafter), expert_bytes (one routed
    expert's w1+w2+w3 with scales), n_experts, and active_params_per_token (matmul weights a
    token multiplies: dense matrices, shared and k routed experts; the head is counted once
    per token) and prefill_params_per_token (the same without the head)."""
    rows = [(name, dtype, list(shape), nbytes) for name, (dtype, shape, nbytes) in headers.items()]
    return {k: float(v) for k, v in _core.table_bytes(cfg.to_json(), rows).items()}


# --------------------------------------------------------------------------------------------
# This process
# --------------------------------------------------------------------------------------------
def peak_rss_gb() -> float:
    """Peak resident set size of this process in GB (NaN where the OS does not say)."""
    try:
        import resource
    except ImportError:  # Windows
        return float("nan")
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / GB if sys.platform == "darwin" else r * 1024 / GB


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def make_prompt(model_dir: Path, n: int, vocab: int, seed: int = 0) -> Tuple[List[int], str]:
    """n prompt ids from the checkpoint's tokenizer (repeated English text), else random ids."""
    tj = Path(model_dir) / "tokenizer.json"
    if tj.exists():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tj))
            ids = tok.encode(PROMPT_TEXT).ids
            if ids and max(ids) < vocab:
                reps = -(-n // len(ids))
                return (ids * reps)[:n], "tokenizer text"
        except Exception:  # noqa: BLE001 - any tokenizer trouble: fall back to random ids
            pass
    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(2, vocab, size=n)], "random ids"


def _delta(a: Dict[str, Any], b: Dict[str, Any], key: str) -> float:
    return float(b.get(key, 0) or 0) - float(a.get(key, 0) or 0)


def run_bench(
    model_dir: str,
    ram_gb: Optional[float] = None,
    prompt_len: int = 16,
    gen_tokens: int = 4,
    threads: Optional[int] = None,
    json_out: bool = False,
    *,
    expert_cache_mb: Optional[float] = None,
    measure_machine: bool = True,
    measure_fma: bool = True,
    mem_bytes: int = 1 << 30,
    disk_bytes: int = 1 << 30,
    load_kw: Optional[Dict[str, Any]] = None,
    quiet: bool = False,
    cold: bool = False,
    speculate: Optional[str] = None,
) -> Dict[str, Any]:
    """Runs the benchmark; prints the table (or JSON with ``json_out``) unless ``quiet``, and
    returns the results dict. ``cold`` sends the prompt right after ``load``, without waiting
    for the expert cache's pre-fault: the time to first token of a fresh process.

    The decode is measured without speculation; with ``speculate`` (a mode other than
    ``off``, or ``oracle:P``: the benchmark-only drafter that proposes the recorded greedy
    continuation, each token right with probability P), the same continuation is generated
    again from the same prefilled state with it, and both are reported side by side
    (``speculation``): tokens/s over the whole decode, the ratio, acceptance, and whether the
    tokens were the same (they must be)."""
    from . import load, load_config

    if prompt_len < 1 or gen_tokens < 1:
        raise ValueError("prompt_len and gen_tokens must be >= 1")
    path = Path(model_dir)
    cfg = load_config(path)
    notes: List[str] = []

    kw = dict(load_kw or {})
    if expert_cache_mb is not None:
        kw["expert_cache_mb"] = expert_cache_mb
    t0 = time.perf_counter()
    model = load(path, ram_gb=ram_gb, threads=threads, **kw)  # validates the checkpoint
    load_s = time.perf_counter() - t0
    acc = account(read_headers(path), cfg)
    rss_after_load = peak_rss_gb()

    # The expert cache's slots are pre-faulted in the background at idle priority (first-touch
    # zeroing costs ~1 s per GB on some VMs). Unless the run is cold, wait for it to end (it
    # may not run at all: V4FLASH_PREFAULT=0) so the prefill below measures the engine, and
    # report the wait separately.
    prompt, prompt_kind = make_prompt(path, prompt_len, cfg.vocab_size)
    if prompt_kind == "random ids":
        notes.append(
            "no usable tokenizer.json: the prompt is random token ids, which route to more "
            "distinct experts than text does (a 196-token prompt on the 4-layer synthetic "
            "checkpoint: 10.0 GB of expert reads against 6.5 GB), so prefill reads more"
        )
    t = time.perf_counter()
    while not cold and model.stats().get("prefault_running"):
        if time.perf_counter() - t > 600:
            notes.append("cache pre-fault did not finish within 600 s")
            break
        time.sleep(0.05)
    prefault_s = time.perf_counter() - t

    sess = model.session()
    s0 = model.stats()
    t = time.perf_counter()
    sess.feed(prompt)
    prefill_s = time.perf_counter() - t
    s1 = model.stats()

    # The first streamed token is sampled from the prefill's logits (no forward pass); each
    # later one costs one decode step, so ask for gen_tokens + 1.
    per_token: List[Dict[str, float]] = []
    after_prefill = sess.snapshot() if speculate and speculate != "off" else None
    it = sess.stream(
        [], max_new_tokens=gen_tokens + 1, temperature=0.0, stop_ids=[], speculate="off"
    )
    first = next(it)
    ttft_s = time.perf_counter() - t
    prev = model.stats()
    t = time.perf_counter()
    out_ids: List[int] = []
    for tok in it:
        now = time.perf_counter()
        st = model.stats()
        req = _delta(prev, st, "expert_requests")
        wall = now - t
        wait = _delta(prev, st, "expert_wait_s")
        per_token.append(
            {
                "ms": wall * 1e3,
                "disk_bytes": _delta(prev, st, "expert_bytes_read"),
                "hit_rate": _delta(prev, st, "expert_hits") / req if req else float("nan"),
                "wait_ms": wait * 1e3,
                "compute_ms": max(0.0, wall - wait) * 1e3,
            }
        )
        out_ids.append(int(tok))
        prev, t = st, time.perf_counter()
    s2 = prev
    spec = None
    if after_prefill is not None:
        spec = _speculative_decode(model, sess, after_prefill, speculate, [int(first), *out_ids])
    rss = peak_rss_gb()

    dec_req = _delta(s1, s2, "expert_requests")
    hit_rate = _delta(s1, s2, "expert_hits") / dec_req if dec_req else 1.0
    pre_req = _delta(s0, s1, "expert_requests")
    n_dec = len(per_token)
    decode_tok_s = 1e3 / statistics.median(p["ms"] for p in per_token)
    prefill_tok_s = prompt_len / prefill_s
    disk_per_tok = _delta(s1, s2, "expert_bytes_read") / n_dec

    res: Dict[str, Any] = {
        "model": str(path),
        "layers": cfg.num_hidden_layers,
        "kernel_tier": s2.get("kernel_tier"),
        "numerics": s2.get("numerics"),
        "bf16_products": s2.get("bf16_products"),
        "fast_products": s2.get("fast_products"),
        "cache_policy": model.cache_policy,
        "io_engine": s2.get("io_engine"),
        "threads": s2.get("threads"),
        "ram_gb": ram_gb,
        "expert_cache_mb": expert_cache_mb,
        "expert_slots": s2.get("expert_slots"),
        "prompt_tokens": prompt_len,
        "prompt_kind": prompt_kind,
        "decode_tokens": n_dec,
        "load_s": load_s,
        "cold": cold,
        # slots pre-faulted when the prompt was sent (all of them, unless the run is cold or
        # the pre-fault is off)
        "prefaulted_at_prompt": int(s0.get("prefaulted_slots") or 0),
        "ttft_s": ttft_s,
        "prefill_s": prefill_s,
        "prefill_tok_s": prefill_tok_s,
        "prefill_hit_rate": _delta(s0, s1, "expert_hits") / pre_req if pre_req else None,
        "prefill_disk_bytes": _delta(s0, s1, "expert_bytes_read"),
        # the rate the engine's own expert reads reached over the whole prefill, and how long
        # the compute stood waiting for them: a prefill whose reads ran at the disk's rate
        # from start to end is bound by the disk, whatever the kernels do
        "prefill_read_gbs": _delta(s0, s1, "expert_bytes_read") / prefill_s / 1e9,
        "prefill_wait_s": _delta(s0, s1, "expert_wait_s"),
        "decode_tok_s": decode_tok_s,
        "decode_tok_s_mean": n_dec / sum(p["ms"] for p in per_token) * 1e3,
        "hit_rate": hit_rate,
        "disk_bytes_per_token": disk_per_tok,
        "wait_ms_per_token": statistics.median(p["wait_ms"] for p in per_token),
        "compute_ms_per_token": statistics.median(p["compute_ms"] for p in per_token),
        "per_token": per_token,
        "output_ids": out_ids,
        "peak_rss_gb": rss,
        "peak_rss_after_load_gb": rss_after_load,
        "dense_bytes_per_token": acc["dense_bytes_per_token"],
        "expert_bytes": acc["expert_bytes"],
        "active_params_per_token": acc["active_params_per_token"],
    }
    flops = 2 * acc["prefill_params_per_token"] * prompt_len / prefill_s
    res["prefill_gflops"] = flops / 1e9
    res["prefault_wait_s"] = prefault_s
    kern_s = _delta(s0, s1, "kernel_s")
    res["prefill_kernel_gflops"] = _delta(s0, s1, "kernel_gflop") / kern_s if kern_s else None
    res["prefill_kernel_s"] = kern_s
    del sess, model  # free the model before the bandwidth probes (peak RSS already taken)

    if measure_machine:
        mem, mem_how = mem_read_gbs(mem_bytes, threads or os.cpu_count())
        disk, disk_how, disk_both = disk_read_gbs(path, disk_bytes)
        fma = fma_peak_gflops(threads) if measure_fma else None
    else:
        mem, mem_how, disk, disk_how, fma = float("nan"), "skipped", float("nan"), "skipped", None
        disk_both = {"one_reader": float("nan"), "parallel": float("nan")}
    res.update(
        {
            "mem_read_gbs": mem,
            "mem_read_how": mem_how,
            "disk_read_gbs": disk,
            "disk_read_how": disk_how,
            "disk_read_gbs_one_reader": disk_both["one_reader"],
            "disk_read_gbs_parallel": disk_both["parallel"],
            "fma_peak_gflops": fma,
            "prefill_fraction_of_fma_peak": (res["prefill_gflops"] / fma) if fma else None,
            "prefill_kernel_fraction_of_fma_peak": (
                res["prefill_kernel_gflops"] / fma if fma and res["prefill_kernel_gflops"] else None
            ),
        }
    )
    k = cfg.num_experts_per_tok
    bound = (acc["dense_bytes_per_token"], mem, cfg.num_hidden_layers, k, hit_rate)
    bound += (acc["expert_bytes"], disk)
    lim = limit_tok_s(*bound)
    res["limit_decode_tok_s"] = lim
    res["limit_decode_tok_s_dense_only"] = _limit(*bound, False)
    res["fraction_of_limit"] = decode_tok_s / lim if lim and math.isfinite(lim) else None
    res["speculation"] = spec
    res["notes"] = notes
    if not quiet:
        if json_out:
            print(to_json(res))
        else:
            print_table(res)
    return res


def _speculative_decode(
    model: Any, sess: Any, snap: Any, speculate: str, plain: List[int], rounds: int = 3
) -> Dict[str, Any]:
    """The decode again from the prefilled state ``snap``, plainly and with speculation
    ``speculate`` (a mode, or ``oracle:P``), alternating for ``rounds`` rounds after the plain
    decode that warmed the expert cache; ``plain`` is the first token and that decode's
    tokens. Rates are medians over the rounds; the counters are the speculative runs'."""
    oracle_p: Optional[float] = None
    mode: Optional[str] = speculate
    if speculate.startswith("oracle:"):
        oracle_p = float(speculate.split(":", 1)[1])
        mode = None
    before = model.stats().get("speculation") or {}
    rates: Dict[str, List[float]] = {"off": [], "spec": []}
    same = True
    stats: Dict[str, float] = {}
    for r in range(rounds):
        for which in ("off", "spec") if r % 2 == 0 else ("spec", "off"):
            sess.rollback(snap)
            kw: Dict[str, Any] = {"speculate": "off"}
            if which == "spec":
                kw = {"speculate": mode, "_oracle": None}
                if oracle_p is not None:
                    kw["_oracle"] = (plain, oracle_p, r)
            it = sess._generation([], max_new_tokens=len(plain), temperature=0.0, stop_ids=[], **kw)
            first = next(it)
            t = time.perf_counter()
            ids = [int(x) for x in it]
            total = time.perf_counter() - t
            same = same and [int(first), *ids] == plain
            rates[which].append(len(ids) / total if total > 0 else float("nan"))
            if which == "spec":
                for k, v in (it.speculation() or {}).items():
                    if k != "acceptance":
                        stats[k] = stats.get(k, 0) + v
    after = model.stats().get("speculation") or {}
    off = statistics.median(rates["off"])
    spec = statistics.median(rates["spec"])
    n = (len(plain) - 1) * rounds
    return {
        "mode": speculate,
        "same_tokens": same,
        "tokens": len(plain) - 1,
        "rounds": rounds,
        "decode_tok_s": spec,
        "off_decode_tok_s": off,
        "ratio": spec / off if off > 0 else None,
        "verifies": int(stats.get("verifies", 0)),
        "drafted": int(stats.get("drafted", 0)),
        "accepted": int(stats.get("accepted", 0)),
        "plain_steps": int(stats.get("plain_steps", 0)),
        "acceptance": (stats["accepted"] / stats["drafted"]) if stats.get("drafted") else None,
        "tokens_per_verify": (
            (n - stats.get("plain_steps", 0)) / stats["verifies"] if stats.get("verifies") else None
        ),
        "saved_s": (after.get("saved_s", 0.0) - before.get("saved_s", 0.0)),
    }


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o).__name__)


def _finite(o: Any) -> Any:
    """``o`` with every infinite or NaN number as None (JSON has neither)."""
    if isinstance(o, (np.floating, np.integer)):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def to_json(o: Any) -> str:
    """Valid JSON (``null`` where a figure is infinite or not measured, never ``Infinity``
    or ``NaN``)."""
    return json.dumps(_finite(o), indent=2, default=_json_default, allow_nan=False)


def _how(text: str) -> str:
    """How a figure was measured, in words (without the core function's name)."""
    text = re.sub(r"^_core\.\w+(, )?", "", str(text))
    return re.sub(r"\b(\d+) thread\(s\)", lambda m: plural(int(m[1]), "thread"), text)


def _fmt_bytes(b: float) -> str:
    if not math.isfinite(b):
        return "n/a"
    for unit, f in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= f:
            return f"{b / f:.2f} {unit}"
    return f"{b:.0f} B"


def _rows(r: Dict[str, Any]) -> List[Tuple[str, str]]:
    def pct(x):
        return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f} %"

    fma = r.get("fma_peak_gflops")
    ram = "not set" if r["ram_gb"] is None else f"{r['ram_gb']:g} GB"
    numerics = r["numerics"] + (
        " (bf16 products)"
        if r.get("bf16_products")
        else f" ({r['fast_products']} products)"
        if r.get("fast_products")
        else ""
    )
    rows = [
        ("model", f"{r['model']} ({r['layers']} layers)"),
        ("kernels / numerics / threads", f"{r['kernel_tier']} / {numerics} / {r['threads']}"),
        ("RAM budget / expert slots", f"{ram} / {r.get('expert_slots')}"),
        ("load", f"{r['load_s']:.2f} s"),
        (
            "time to first token",
            f"{r['ttft_s']:.2f} s"
            + (
                f" (cold: sent right after load, {r['prefaulted_at_prompt']} of "
                f"{r.get('expert_slots')} cache slots pre-faulted)"
                if r.get("cold")
                else ""
            ),
        ),
        (
            "prefill",
            f"{r['prefill_tok_s']:.2f} tok/s ({r['prompt_tokens']} tokens, {r['prompt_kind']})",
        ),
        (
            "prefill compute",
            f"{r['prefill_gflops']:.1f} GFLOP/s"
            + (f" of {fma:.0f} peak ({pct(r['prefill_fraction_of_fma_peak'])})" if fma else "")
            + ("" if fma else " (FMA peak n/a)"),
        ),
        (
            "  in the matmul kernels",
            (
                f"{r['prefill_kernel_gflops']:.1f} GFLOP/s"
                + (
                    f" ({pct(r['prefill_kernel_fraction_of_fma_peak'])} of peak)"
                    if r.get("prefill_kernel_fraction_of_fma_peak")
                    else ""
                )
                + f", {r['prefill_kernel_s']:.2f} s of {r['prefill_s']:.2f} s"
            )
            if r.get("prefill_kernel_gflops")
            else "n/a",
        ),
        (
            "  expert reads",
            f"{_fmt_bytes(r['prefill_disk_bytes'])} at {r['prefill_read_gbs']:.2f} GB/s, "
            f"waited on for {r['prefill_wait_s']:.2f} s",
        ),
        ("cache pre-fault wait", f"{r['prefault_wait_s']:.2f} s (before the prefill)"),
        ("decode (median)", f"{r['decode_tok_s']:.3f} tok/s over {r['decode_tokens']} tokens"),
        ("  disk read / token", _fmt_bytes(r["disk_bytes_per_token"])),
        ("  expert hit rate", pct(r["hit_rate"])),
        ("  waiting on reads / token", f"{r['wait_ms_per_token']:.1f} ms"),
        ("  computing / token", f"{r['compute_ms_per_token']:.1f} ms"),
        *_speculation_rows(r.get("speculation")),
        ("peak RSS", f"{r['peak_rss_gb']:.2f} GB"),
        (
            "memory read bandwidth",
            f"{r['mem_read_gbs']:.1f} GB/s ({_how(r['mem_read_how']) or 'streaming reads'})",
        ),
        ("disk read bandwidth", f"{r['disk_read_gbs']:.2f} GB/s ({_how(r['disk_read_how'])})"),
        (
            "dense bytes / token",
            f"{_fmt_bytes(r['dense_bytes_per_token'])}; expert {_fmt_bytes(r['expert_bytes'])}",
        ),
        ("decode limit at this hit rate", f"{r['limit_decode_tok_s']:.3f} tok/s"),
        ("achieved fraction of limit", pct(r["fraction_of_limit"])),
    ]
    for i, p in enumerate(r["per_token"]):
        rows.append(
            (
                f"  token {i + 1}",
                f"{p['ms']:.0f} ms: read {_fmt_bytes(p['disk_bytes'])}, hit {pct(p['hit_rate'])}, "
                f"wait {p['wait_ms']:.0f} ms, compute {p['compute_ms']:.0f} ms",
            )
        )
    for n in r.get("notes", []):
        rows.append(("note", n))
    return rows


def _speculation_rows(sp: Optional[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """The decode with speculation next to the plain one (bench --speculate)."""
    if not sp:
        return []

    def num(x: Any, f: str) -> str:
        return "n/a" if x is None else format(x, f)

    rows = [
        (
            f"decode with --speculate {sp['mode']}",
            f"{num(sp['decode_tok_s'], '.3f')} tok/s against {num(sp['off_decode_tok_s'], '.3f')} "
            f"without ({sp['tokens']} tokens, medians of {sp['rounds']} alternating rounds): "
            f"{num(sp['ratio'], '.2f')}x"
            + ("" if sp["same_tokens"] else " -- THE TOKENS DIFFER (a bug)"),
        ),
        (
            "  verifies / plain steps",
            f"{sp['verifies']} / {sp['plain_steps']}; drafted {sp['drafted']}, accepted "
            f"{sp['accepted']} ({num(sp['acceptance'], '.0%')}), "
            f"{num(sp['tokens_per_verify'], '.2f')} tokens per verify",
        ),
    ]
    return rows


def print_table(r: Dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="v4flash bench", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    for k, v in _rows(r):
        t.add_row(k, v)
    Console().print(t)


# --------------------------------------------------------------------------------------------
# Prediction for the full model
# --------------------------------------------------------------------------------------------
def emulated_cache_mb(full_ram_gb: float, layers: int, overhead_gb: float = 1.5) -> float:
    """Expert cache (MiB) that gives an ``layers``-layer checkpoint the same experts-per-layer
    share as the full 43-layer model would have under a ``full_ram_gb`` budget (so a short
    synthetic checkpoint sees the full model's cache pressure)."""
    m = real_model_bytes()
    cache = max(0.0, full_ram_gb * GB - m["dense_resident_bytes"] - overhead_gb * GB)
    per_layer = cache / m["expert_bytes"] / m["layers"]
    return max(1.0, per_layer * layers * m["expert_bytes"] / (1 << 20))


def print_predict(rows: List[Dict[str, float]]) -> None:
    m = real_model_bytes()
    print(
        f"DeepSeek V4 Flash (43 layers): dense {m['dense_bytes_per_token'] / GB:.2f} GB/token "
        f"(incl. head), resident {m['dense_resident_bytes'] / GB:.2f} GB (embedding "
        f"{m['embed_bytes'] / GB:.2f} GB included), expert {m['expert_bytes'] / 1e6:.2f} MB; "
        f"memory {rows[0]['mem_gbs']:.0f} GB/s; Zipf-popular experts, cache = top per layer"
    )
    disks = sorted({r["disk_gbs"] for r in rows})
    print("| RAM | cached experts | hit rate | " + " | ".join(f"{d:g} GB/s" for d in disks) + " |")
    print("|---|---|---|" + "---|" * len(disks))
    for ram in sorted({r["ram_gb"] for r in rows}):
        rr = [r for r in rows if r["ram_gb"] == ram]
        cells = " | ".join(f"{r['limit_tok_s']:.2f} tok/s" for r in rr)
        print(
            f"| {ram:g} GB | {rr[0]['cached_experts']:.0f} | {100 * rr[0]['hit_rate']:.0f} % "
            f"| {cells} |"
        )


# --------------------------------------------------------------------------------------------
# CLI (the options are defined with the other commands' in cli.py)
# --------------------------------------------------------------------------------------------
def predict(
    mem_gbs: Optional[float],
    mem_gb: float,
    threads: Optional[int],
    json_out: bool,
    draft_ms: Optional[float] = None,
) -> int:
    """``v4flash bench --predict``: the full-model table (memory bandwidth measured here
    unless given), each row with what drafting with DSpark is predicted to give
    (``dspark_predict``; ``draft_ms``: a measured draft time instead of the estimate)."""
    from .dspark_predict import add_dspark, print_dspark

    if mem_gbs is None:
        mem_gbs, _ = mem_read_gbs(int(mem_gb * (1 << 30)), threads or os.cpu_count())
    rows = add_dspark(predict_table(mem_gbs=mem_gbs), draft_ms=draft_ms)
    if json_out:
        print(to_json(rows))
    else:
        print_predict(rows)
        print_dspark(rows)
    return 0


def bench_command(path: Path, a: Any) -> int:
    """``v4flash bench`` on the checkpoint at ``path`` with the parsed options ``a``."""
    cache_mb = a.expert_cache_mb
    if a.emulate_full_ram is not None:
        from .config import load_config

        cache_mb = emulated_cache_mb(a.emulate_full_ram, load_config(path).num_hidden_layers)
    load_kw: Dict[str, Any] = {}
    for opt in ("io", "cache_policy", "numerics", "ctx", "io_threads"):
        if getattr(a, opt, None) is not None:
            load_kw[opt] = getattr(a, opt)
    if a.speculate in SPECULATE:
        load_kw["speculate"] = a.speculate
    if getattr(a, "drafter", False):
        load_kw["drafter"] = True
    run_bench(
        str(path),
        ram_gb=a.ram,
        prompt_len=a.prompt,
        gen_tokens=a.gen,
        threads=a.threads,
        json_out=a.json,
        expert_cache_mb=cache_mb,
        measure_machine=not a.no_machine,
        measure_fma=not a.no_fma,
        mem_bytes=int(a.mem_gb * (1 << 30)),
        disk_bytes=int(a.disk_gb * (1 << 30)),
        load_kw=load_kw,
        cold=a.cold,
        speculate=a.speculate,
    )
    return 0
