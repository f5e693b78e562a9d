"""What this machine and the full model allow: the core's probes of the memory and the disk
(measured the way the engine reads), the decode-speed bound they give, and the published
model's sizes and predicted speeds (``bench --predict``, ``doctor``'s expected decode).

``bench`` and ``doctor`` both use these; neither imports the other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import _core

GB = 1e9
#: Bytes per element of each dtype a checkpoint may hold (the core's ``DType::size``).
ITEMSIZE: Dict[str, int] = dict(_core.DTYPE_SIZES)


# --------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------
def mem_read_gbs(nbytes: int = 1 << 30, threads: Optional[int] = None) -> Tuple[float, str]:
    """Streaming read bandwidth in GB/s (best of 3) and how it was measured."""
    t = threads or os.cpu_count() or 1
    return float(_core.mem_read_gbs(nbytes, t)), f"_core.mem_read_gbs, {t} thread(s)"


#: Reads the parallel disk probe keeps in flight: as many as the engine's pread workers
#: (its io_uring path keeps up to 32; 8 are enough to show whether the disk needs a queue
#: to reach its speed).
DISK_READERS = 8


def disk_probe(shard: Path, nbytes: int = 1 << 30) -> Tuple[float, float, bool]:
    """Read bandwidth (GB/s) of the first ``nbytes`` of ``shard`` in 8 MiB reads, bypassing
    the page cache where the OS allows it, measured twice: one read at a time, then
    ``DISK_READERS`` in flight (how the engine streams experts; an SSD may need a queue to
    reach its speed). Returns (one at a time, in flight, whether direct I/O was used)."""
    one, direct = _core.disk_read_gbs(str(shard), nbytes, 1)
    many, direct_many = _core.disk_read_gbs(str(shard), nbytes, DISK_READERS)
    return float(one), float(many), bool(direct and direct_many)


def disk_read_gbs(model_dir: Path, nbytes: int = 1 << 30) -> Tuple[float, str, Dict[str, float]]:
    """``disk_probe`` on the checkpoint's largest shard. Returns the better of its two figures
    (the disk's speed as the engine can use it), how it was measured, and both figures."""
    shards = sorted(Path(model_dir).glob("*.safetensors"), key=lambda p: p.stat().st_size)
    if not shards:
        raise FileNotFoundError(f"{model_dir}: no .safetensors files")
    path = shards[-1]
    one, many, direct = disk_probe(path, nbytes)
    how = "direct I/O" if direct else "buffered (direct I/O refused; may hit the page cache)"
    return (
        max(one, many),
        f"_core.disk_read_gbs, {how}, 8 MiB reads: {one:.2f} GB/s one at a time, "
        f"{many:.2f} GB/s {DISK_READERS} in flight, {path.name}",
        {"one_reader": one, "parallel": many},
    )


def fma_peak_gflops(threads: Optional[int]) -> float:
    return float(_core.fma_peak_gflops(threads or os.cpu_count() or 1))


# --------------------------------------------------------------------------------------------
# The bound and the full model
# --------------------------------------------------------------------------------------------
def limit_tok_s(
    dense_bytes: float,
    mem_gbs: float,
    layers: int,
    k: int,
    hit_rate: float,
    expert_bytes: float,
    disk_gbs: float,
) -> float:
    """Decode-speed bound: the bytes a token reads from memory at memory bandwidth plus the
    missed experts at disk speed.

    The bytes read from memory are the dense weights (incl. the head) AND the token's active
    routed experts (``layers × k × expert_bytes``): a cached expert is still streamed from RAM
    by the kernels, and a missed one is read from disk into RAM first, then streamed. (With
    ``count_experts_in_memory=False`` this is the narrower "dense / memory + missed / disk"
    form, which ignores those reads and is not attainable; reported alongside for reference.)
    """
    return _limit(dense_bytes, mem_gbs, layers, k, hit_rate, expert_bytes, disk_gbs, True)


def _limit(dense_bytes, mem_gbs, layers, k, hit_rate, expert_bytes, disk_gbs, experts_in_mem):
    mem_bytes = dense_bytes + (layers * k * expert_bytes if experts_in_mem else 0.0)
    t = mem_bytes / (mem_gbs * GB) + layers * k * (1 - hit_rate) * expert_bytes / (disk_gbs * GB)
    return 1.0 / t if t > 0 else float("inf")


def published_config(n_layers: int = 43) -> Dict[str, Any]:
    """The published DeepSeek V4 Flash config.json (``_core.PUBLISHED_CONFIG``), cut to its
    first ``n_layers`` layers (43 is the whole model)."""
    d: Dict[str, Any] = json.loads(_core.PUBLISHED_CONFIG)
    layers = d["num_hidden_layers"]
    if not 1 <= n_layers <= layers:
        raise ValueError(f"n_layers must be in 1..{layers}, got {n_layers}")
    d["num_hidden_layers"] = n_layers
    d["compress_ratios"] = d["compress_ratios"][:n_layers]
    d["num_hash_layers"] = min(d["num_hash_layers"], n_layers)
    return d


def real_model_bytes(n_layers: int = 43) -> Dict[str, float]:
    """Dense and expert sizes of the published checkpoint (its first ``n_layers`` layers; 43 is
    the whole model): the core's accounting (``_core.table_bytes``) of its tensor table for
    the published config, each tensor in the dtype the release stores it in (the table's
    first).

    ``dense_resident_bytes`` is what the engine keeps in memory and its planner counts as
    dense: every tensor but the routed experts, the embedding and the head included.
    ``dense_bytes_per_token`` is what a decode step reads of it: the same with one row of the
    embedding and of each ``tid2eid``."""
    d = published_config(n_layers)
    t = _core.table_bytes(d)
    return {
        "dense_bytes_per_token": float(t["dense_bytes_per_token"]),
        "dense_resident_bytes": float(t["dense_bytes"]),
        "embed_bytes": float(t["embed_bytes"]),
        "expert_bytes": float(t["expert_bytes"]),
        "layers": float(n_layers),
        "experts": float(d["n_routed_experts"]),
        "topk": float(d["num_experts_per_tok"]),
    }


def zipf_hit_rate(slots_per_layer: float, n_experts: int = 256, s: float = 1.0) -> float:
    """Hit rate of a cache holding the `slots` most popular experts of each layer when
    selections follow Zipf(s) (the synthetic checkpoint's distribution): H_s(c) / H_s(E)."""
    c = max(0, min(n_experts, int(slots_per_layer)))
    w = np.arange(1, n_experts + 1, dtype=np.float64) ** -s
    return float(w[:c].sum() / w.sum())


def predict_table(
    ram_gbs: Iterable[float] = (16, 24, 32, 64),
    disk_gbss: Iterable[float] = (1.5, 3.5, 7.0),
    mem_gbs: float = 50.0,
    overhead_gb: float = 1.5,
    zipf: float = 1.0,
) -> List[Dict[str, float]]:
    """Predicted decode tok/s of the full 43-layer model per RAM budget and disk speed.

    The dense part stays resident, the embedding and the head included, as the engine keeps
    them (a decode step reads one row of the embedding); what the budget leaves after
    ``overhead_gb`` (KV cache, activations, runtime) holds experts; the
    cache is assumed to keep each layer's most popular experts under Zipf(``zipf``)
    popularity; the bound is the limit formula above at memory bandwidth ``mem_gbs``."""
    m = real_model_bytes()
    rows = []
    for ram in ram_gbs:
        cache = max(0.0, ram * GB - m["dense_resident_bytes"] - overhead_gb * GB)
        slots = cache / m["expert_bytes"]
        hit = zipf_hit_rate(slots / m["layers"], int(m["experts"]), zipf)
        for disk in disk_gbss:
            tok_s = limit_tok_s(
                m["dense_bytes_per_token"],
                mem_gbs,
                int(m["layers"]),
                int(m["topk"]),
                hit,
                m["expert_bytes"],
                disk,
            )
            rows.append(
                {
                    "ram_gb": float(ram),
                    "disk_gbs": float(disk),
                    "mem_gbs": float(mem_gbs),
                    "cached_experts": float(int(slots)),
                    "hit_rate": hit,
                    "disk_gb_per_token": m["layers"]
                    * m["topk"]
                    * (1 - hit)
                    * m["expert_bytes"]
                    / GB,
                    "limit_tok_s": tok_s,
                }
            )
    return rows
