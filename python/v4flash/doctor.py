"""Checkpoint inspection for ``info`` / ``doctor`` (headers and the index only: no tensor
data is read) and the memory plan (the engine's planner) in the words the CLI prints."""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import _core, kernel_tier, limits
from .config import Config
from .units import GB, gb, plural

# --------------------------------------------------------------------------------------------
# Checkpoint inspection (no tensor data is read: headers and the index only)
# --------------------------------------------------------------------------------------------


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: List[int]
    nbytes: int
    shard: str


@dataclass
class Inspection:
    """What ``info`` and ``doctor`` found; ``problems`` empty means the checkpoint is usable.
    The core inspects (``_core.inspect_checkpoint``: ``rust/checkpoint/inspect.rs``); this
    adds the tokenizer's row."""

    path: Path
    checks: List[Tuple[str, str, str]] = field(default_factory=list)  # (status, what, detail)
    config: Any = None
    tensors: Dict[str, TensorEntry] = field(default_factory=dict)
    shard_sizes: Dict[str, int] = field(default_factory=dict)
    # bytes of the tensors found: dense (resident), experts, drafter
    sizes: Dict[str, int] = field(default_factory=dict)
    # None, or {kind, blocks, bytes, usable, summary, problems}
    drafter: Optional[Dict[str, Any]] = None
    tokenizer: Any = None

    def add(self, status: str, what: str, detail: str = "") -> None:
        self.checks.append((status, what, detail))

    @property
    def problems(self) -> List[Tuple[str, str, str]]:
        return [c for c in self.checks if c[0] == "fail"]

    @property
    def ok(self) -> bool:
        return not self.problems


# The engine's own test of "is this a routed expert" (its tensor table, which the loader checks
# before reading any weight, is ``expected_tensors``): one definition each, in the core.
is_routed_expert = _core.is_routed_expert


def inspect_checkpoint(path: os.PathLike, tokenizer: bool = True) -> Inspection:
    """Validates a checkpoint without reading any tensor data: config.json, the index, every
    shard's header and size, every tensor's presence, dtype and shape, the drafter (the core's
    ``inspect``), then the tokenizer."""
    root = Path(path)
    found = _core.inspect_checkpoint(str(root))
    ins = Inspection(root)
    ins.checks = [tuple(r) for r in found["rows"]]
    if found["config"] is not None:
        ins.config = Config(**found["config"])
    ins.shard_sizes = dict(found["shards"])
    ins.tensors = {
        name: TensorEntry(name, dtype, list(shape), nbytes, shard)
        for name, dtype, shape, nbytes, shard in found["tensors"]
    }
    ins.sizes = dict(found["sizes"])
    ins.drafter = found["drafter"]
    if ins.config is None or not tokenizer:
        return ins
    try:
        from .tokenizer import load_tokenizer

        tok = load_tokenizer(root)
        if tok.vocab_size > ins.config.vocab_size:
            ins.add(
                "fail",
                "tokenizer.json",
                f"{tok.vocab_size} ids but config vocab_size is {ins.config.vocab_size}",
            )
        else:
            ins.tokenizer = tok
            ins.add("ok", "tokenizer.json", f"{tok.vocab_size} ids, chat special tokens found")
    except (OSError, ValueError) as e:
        ins.add("fail", "tokenizer.json", str(e))
    return ins


# --------------------------------------------------------------------------------------------
# Memory plan
# --------------------------------------------------------------------------------------------


def plan_summary(
    model_dir: os.PathLike,
    ram_gb: Optional[float] = None,
    *,
    ctx: Optional[int] = None,
    expert_cache_mb: Optional[float] = None,
) -> Dict[str, Any]:
    """The engine's memory plan for ``ram_gb`` (``_core.plan``, no weights loaded): resident
    dense weights, session state, scratch, overhead and the expert cache that fits in the
    rest. Raises ``MemoryError`` (with the size that would work) when the budget cannot."""
    from . import model

    return model.plan(model_dir, ram_gb, ctx=ctx, expert_cache_mb=expert_cache_mb)


def plan_line(plan: Dict[str, Any], threads: Optional[int], numerics: str = "exact") -> str:
    budget = plan.get("budget_bytes")
    frac = plan["slots"] / plan["total_experts"] if plan.get("total_experts") else 0
    avail = plan.get("available_bytes")
    n_threads = plural(threads or os.cpu_count() or 1, "thread")
    if budget:
        ram = gb(budget)
    else:
        ram = f"none (available {gb(avail)})" if avail else "none"
    drafter = plan.get("drafter_bytes")
    loaded = plan.get("drafter_resident_bytes", 0) + plan.get("drafter_cache_bytes", 0)
    if loaded:
        drafter_note = f"drafter {gb(loaded)} loaded ({plan['drafter_slots']} expert slots) · "
    elif drafter:
        drafter_note = f"drafter {gb(drafter)} not loaded · "
    else:
        drafter_note = ""
    return (
        f"plan: RAM budget {ram} · resident "
        f"{gb(plan['dense_bytes'])} · expert cache {gb(plan['cache_bytes'])} "
        f"({plan['slots']}/{plan['total_experts']} experts, {frac:.0%}) · "
        + drafter_note
        + f"kernels {kernel_tier()} · {numerics} numerics{_products(numerics)} · {n_threads}"
    )


def _products(numerics: str) -> str:
    """How fast and official numerics multiply on this CPU: bf16 products where it has them at
    full rate; fast otherwise takes the exact kernels on x86 (the fastest there) or int8 FP4
    products (ARM, portable)."""
    if numerics in ("fast", "official") and _core.bf16_products():
        return " (bf16 products)"
    if numerics == "fast":
        return {
            "int8": " (int8 FP4 products)",
            "f32": " (= exact: f32 products are the fastest here)",
        }.get(_core.fast_products(), "")
    return ""


def plan_table(plan: Dict[str, Any]) -> List[Tuple[str, str]]:
    rows = [
        ("RAM budget", gb(plan["budget_bytes"]) if plan.get("budget_bytes") else "not set"),
        ("resident weights", gb(plan["dense_bytes"])),
    ]
    if plan.get("state_bytes"):
        rows.append((f"session state (ctx {plan['ctx']:,})", gb(plan["state_bytes"])))
    if plan.get("scratch_bytes"):
        chunk = f" (prefill chunk {plan['prefill_chunk']:,})" if plan.get("prefill_chunk") else ""
        rows.append((f"scratch{chunk}", gb(plan["scratch_bytes"])))
    if plan.get("span_bytes"):
        rows.append((f"prefill span ({plan['prefill_span']:,} tokens)", gb(plan["span_bytes"])))
    rows += [
        ("overhead", gb(plan["overhead_bytes"])),
        (
            "expert cache",
            f"{gb(plan['cache_bytes'])} = {plan['slots']} of {plan['total_experts']} experts "
            f"x {gb(plan['slot_bytes'])}",
        ),
        ("total", gb(plan["total_bytes"])),
    ]
    return rows


# --------------------------------------------------------------------------------------------
# The machine (doctor): what the engine depends on
# --------------------------------------------------------------------------------------------

MEM_PROBE_BYTES = 256 << 20  # well past any last-level cache, and quick
DISK_PROBE_BYTES = 1 << 30  # as bench measures it


def _cgroup_cpu_quota(
    root: str = "/sys/fs/cgroup", proc: str = "/proc/self/cgroup"
) -> Optional[float]:
    """CPUs a cgroup v2 ``cpu.max`` quota allows this process (the tightest on its path), or
    None when there is none."""
    try:
        rel = next(
            line.split("::", 1)[1].strip()
            for line in Path(proc).read_text().splitlines()
            if line.startswith("0::")
        )
    except (OSError, StopIteration):
        return None
    best = None
    d = Path(root) / rel.lstrip("/")
    while True:
        try:
            quota, period = (Path(d) / "cpu.max").read_text().split()[:2]
            if quota != "max":
                q = int(quota) / int(period)
                best = q if best is None else min(best, q)
        except (OSError, ValueError):
            pass
        if d == Path(root) or d == d.parent:
            return best
        d = d.parent


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (what the
    engine's default thread count, Rust's ``available_parallelism``, sees)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    q = _cgroup_cpu_quota()
    if q:
        n = max(1, min(n, math.ceil(q)))
    return n


def thread_warning(threads: Optional[int], cores: Optional[int] = None) -> Optional[str]:
    """The warning for ``--threads`` above the cores this process can use (the compute pool's
    threads then wait for each other at every step: 999 threads on 2 cores ran 13x slower)."""
    cores = usable_cores() if cores is None else cores
    if threads is None or threads <= cores:
        return None
    return (
        f"--threads {threads} is more than the {plural(cores, 'core')} this process can use: the "
        f"extra threads only wait for each other and every step gets slower (measured: 999 "
        f"threads on 2 cores ran 13x slower); leave -t out to use all {cores} or pass -t {cores}"
    )


def io_uring_status() -> Tuple[Optional[bool], str]:
    """(io_uring usable by the engine?, why): the core asks for a ring as the engine does and
    lets it go (``_core.io_uring_probe``), unless ``V4FLASH_IO_URING=0`` turned it off. None
    where it cannot be asked."""
    return _core.io_uring_probe()


def transparent_hugepages(
    path: str = "/sys/kernel/mm/transparent_hugepage/enabled",
) -> Optional[str]:
    """The transparent huge page mode (``always``, ``madvise``, ``never``), None if unknown."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else None


def memory_bytes() -> Tuple[Optional[int], Optional[int]]:
    """(total, available) memory as the planner reads it (``_core.memory_info``: Linux
    ``MemTotal``/``MemAvailable``), None where the OS does not say."""
    return _core.memory_info()


def filesystem_of(path: os.PathLike, mounts: str = "/proc/self/mounts") -> Optional[str]:
    """``device (fstype)`` of the mount that holds ``path`` (Linux), else None."""
    try:
        real = os.path.realpath(path)
        best: Optional[Tuple[str, str, str]] = None
        for line in Path(mounts).read_text().splitlines():
            parts = line.split()
            if len(parts) < 3:
                continue
            dev, mnt, fstype = (
                re.sub(r"\\(\d{3})", lambda m: chr(int(m[1], 8)), x) for x in parts[:3]
            )
            inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
            if inside and (best is None or len(mnt) > len(best[1])):
                best = (dev, mnt, fstype)
    except OSError:
        return None
    return f"{best[0]} ({best[2]}, mounted at {best[1]})" if best else None


def _read_engine(ring: Optional[bool], direct: Optional[bool]) -> str:
    how = "direct I/O" if direct else "buffered reads (page cache)"
    if direct is None:
        how = "direct I/O if the file system takes it"
    return f"{'io_uring' if ring else 'a pread pool'}, {how}"


def machine_checks(
    shard: Optional[Path],
    ram_gb: Optional[float],
    threads: Optional[int],
    room_bytes: Optional[int] = None,
) -> List[Tuple[str, str, str]]:
    """What the engine depends on, measured here, as (status, what, detail) rows: kernels,
    cores vs ``--threads``, memory vs ``--ram``, huge pages, the direct-read speed of the
    checkpoint's own disk (on ``shard``, its largest file), io_uring and O_DIRECT, memory
    bandwidth, and the decode speed ``bench --predict``'s formula expects for the full model at
    this ``--ram`` (else ``room_bytes``, the room the planner would take) on this machine, a
    warning when the rows it rests on warned (threads, memory, disk)."""
    rows: List[Tuple[str, str, str]] = []
    cores = usable_cores()
    rows.append(("ok", "kernels", f"{kernel_tier()} (cpus {os.cpu_count()})"))
    warn = thread_warning(threads, cores)
    online = os.cpu_count() or cores
    cores_text = f"{cores} usable by this process" + (
        f" ({online} online)" if online != cores else ""
    )
    rows.append(
        (
            "warn" if warn else "ok",
            "cores",
            f"{cores_text}; compute threads: "
            + (f"{threads}" if threads else f"all {cores}")
            + (f". {warn}" if warn else ""),
        )
    )

    total, avail = memory_bytes()
    if total:
        text = f"{gb(total)} total" + (f", {gb(avail)} available" if avail else "")
        status = "ok"
        if ram_gb and avail and ram_gb * GB > avail:
            status = "warn"
            text += (
                f"; --ram {ram_gb:g} is more than is available now: the expert cache would be "
                "swapped out or the process killed (close other programs or lower --ram)"
            )
        rows.append((status, "memory", text))

    if sys.platform.startswith("linux"):
        thp = transparent_hugepages()
        if thp == "never":
            rows.append(
                (
                    "warn",
                    "huge pages",
                    "transparent huge pages are off (never): the expert cache gets 4 KiB pages "
                    "(more TLB misses, slower first touch); to allow them: echo madvise | sudo "
                    "tee /sys/kernel/mm/transparent_hugepage/enabled",
                )
            )
        elif thp:
            rows.append(
                (
                    "ok",
                    "huge pages",
                    f"transparent huge pages: {thp} (the expert cache asks for them with "
                    "MADV_HUGEPAGE)",
                )
            )

    ring, ring_why = io_uring_status()
    disk = direct = None
    if shard is None:
        rows.append(("warn", "disk", "no shard to read: the disk speed is not measured"))
    else:
        try:
            one, many, direct = limits.disk_probe(shard, DISK_PROBE_BYTES)
            disk = max(one, many)
            size = os.stat(shard).st_size
            read = min(size, DISK_PROBE_BYTES)
            fs = filesystem_of(shard)
            text = (
                f"{'direct' if direct else 'buffered'} reads at {disk:.2f} GB/s "
                f"({shard.name}, {gb(read)} in 8 MiB reads: {one:.2f} GB/s one at a time, "
                f"{many:.2f} GB/s {limits.DISK_READERS} in flight)"
                + (f" on {fs}" if fs else "")
                + (" (a small file: a rough figure)" if size < (256 << 20) else "")
            )
            if direct:
                rows.append(("ok", "disk", text))
            else:
                rows.append(
                    (
                        "warn",
                        "disk",
                        text + "; this file system refuses O_DIRECT, so expert reads go through "
                        "the page cache (which may also flatter this figure)",
                    )
                )
        except (OSError, ValueError, RuntimeError) as e:
            rows.append(("warn", "disk", f"cannot measure on {shard}: {e}"))
    rows.append(
        (
            "ok" if ring and direct is not False else "warn",
            "expert reads",
            f"io_uring: {ring_why}; O_DIRECT: "
            + ("not known" if direct is None else "yes" if direct else "no")
            + f"; --io direct will use {_read_engine(ring, direct)}",
        )
    )

    t = threads or cores
    mem = None
    try:
        mem, _ = limits.mem_read_gbs(MEM_PROBE_BYTES, t)
        text = f"{mem:.1f} GB/s streaming reads ({plural(t, 'thread')})"
        if warn:  # the threads wait for each other: the figure is the overcommit's, not memory's
            text += (
                f": measured with more threads than the {plural(cores, 'core')}, so it is "
                "the oversubscription's figure, not the memory's"
            )
        rows.append(("warn" if warn else "ok", "memory bandwidth", text))
    except (MemoryError, ValueError, RuntimeError) as e:
        rows.append(("warn", "memory bandwidth", f"not measured: {e}"))

    ram = ram_gb if ram_gb else (room_bytes / GB if room_bytes else None)
    if mem and disk and ram:
        distorted = [what for status, what, _ in rows if status == "warn" and what in DISTORTING]
        rows.append(_expected_row(ram, bool(ram_gb), mem, disk, distorted))
    return rows


# the machine checks whose warning makes the expected speed unreliable
DISTORTING = ("cores", "memory", "memory bandwidth", "disk")


def _expected_row(
    ram: float, given: bool, mem: float, disk: float, distorted: Sequence[str] = ()
) -> Tuple[str, str, str]:
    m = limits.real_model_bytes()
    r = limits.predict_table(ram_gbs=[ram], disk_gbss=[disk], mem_gbs=mem)[0]
    at = f"--ram {ram:g}" if given else f"{ram:.1f} GB (no --ram: the room the planner takes)"
    text = (
        f"{r['limit_tok_s']:.2f} tok/s at most for the full DeepSeek V4 Flash at {at} on this "
        f"machine: {int(r['cached_experts']):,} experts cached, {r['hit_rate']:.0%} hit rate, "
        f"{r['disk_gb_per_token']:.2f} GB/token from disk at {disk:.2f} GB/s, memory at "
        f"{mem:.1f} GB/s (the `bench --predict` formula)"
    )
    floor = m["dense_resident_bytes"] + 1.5 * GB
    notes = []
    if ram * GB <= floor:
        notes.append(
            f"{ram:g} GB leaves no expert cache (the full model's resident part and "
            f"overhead take {gb(floor)})"
        )
    if distorted:
        notes.append(
            f"distorted by the warnings above ({', '.join(distorted)}): fix them for "
            "a figure to rely on"
        )
    if notes:
        return ("warn", "expected decode", "; ".join([text, *notes]))
    return ("ok", "expected decode", text)
