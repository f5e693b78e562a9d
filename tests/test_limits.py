"""Absurd sizes give clear errors instead of wrapping arithmetic or aborting the process: a
context too large for any budget, a ctx outside the model's range in plan(), and machine
probes asked for more memory or threads than any machine has."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import v4flash
from conftest import FIXTURES, copy_fixture
from v4flash import _core

TINY = FIXTURES / "tiny-a"


def _max_ctx(d: Path) -> int:
    return json.loads((d / "config.json").read_text())["max_position_embeddings"]


def _run_child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter, so that an abort or a hang fails the test instead
    of taking pytest down."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------- the planner


@pytest.fixture
def huge_max(tmp_path) -> Path:
    d = copy_fixture(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = 2**62
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_plan_context_too_large_for_any_budget(huge_max):
    with pytest.raises(MemoryError, match=r"ctx 288230376151711744 .*more than 2\^64 bytes"):
        _core.plan(str(huge_max), ram_gb=2, ctx=2**58)
    # without a budget too (sized from available memory)
    with pytest.raises(MemoryError, match="more than 2\\^64 bytes"):
        _core.plan(str(huge_max), ctx=2**58)
    with pytest.raises(MemoryError, match="too large for any memory budget"):
        v4flash.plan(huge_max, 2, ctx=2**58)
    # the largest context the config allows must not wrap either
    with pytest.raises(MemoryError, match="too large for any memory budget"):
        _core.plan(str(huge_max), ram_gb=2, ctx=2**62)


def test_plan_large_but_representable_context_needs_its_size(huge_max):
    # 2^40 tokens do not overflow: the plan refuses the budget with the size needed
    with pytest.raises(MemoryError, match="cannot run this model: it needs at least"):
        _core.plan(str(huge_max), ram_gb=2, ctx=2**40)


def test_plan_ctx_above_the_model_maximum_is_refused_like_load():
    mx = _max_ctx(TINY)
    words = f"ctx {mx + 1} exceeds the model's max_position_embeddings ({mx})"
    with pytest.raises(ValueError) as from_plan:
        _core.plan(str(TINY), ram_gb=2, ctx=mx + 1)
    assert str(from_plan.value) == words
    with pytest.raises(ValueError) as from_load:
        v4flash.load(TINY, ram_gb=2, ctx=mx + 1)
    assert str(from_load.value) == words
    with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
        v4flash.plan(TINY, 2, ctx=mx + 1)


def test_plan_ctx_zero_is_refused():
    with pytest.raises(ValueError, match="ctx must be >= 1, got 0"):
        _core.plan(str(TINY), ram_gb=2, ctx=0)
    with pytest.raises(ValueError, match="ctx"):
        v4flash.plan(TINY, 2, ctx=0)


def test_plan_ctx_default_and_maximum_agree_with_load():
    mx = _max_ctx(TINY)
    assert _core.plan(str(TINY), ram_gb=2)["ctx"] == min(mx, 65536)
    assert _core.plan(str(TINY), ram_gb=2, ctx=mx)["ctx"] == mx


# ---------------------------------------------------------------------------- machine probes


def test_mem_read_of_an_impossible_size_is_a_memory_error():
    r = _run_child(
        """
        from v4flash import _core
        try:
            _core.mem_read_gbs(1 << 62, threads=1, reps=1)
        except MemoryError as e:
            print("MemoryError:", e)
        else:
            raise SystemExit("no MemoryError")
        """
    )
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "MemoryError:" in r.stdout and "bytes" in r.stdout


@pytest.mark.parametrize(
    "call",
    [
        "_core.mem_read_gbs(1 << 20, threads=1 << 40, reps=1)",
        "_core.fma_peak_gflops(threads=1 << 40)",
        "_core.mem_read_gbs(1 << 20, threads=0, reps=1)",
        "_core.fma_peak_gflops(threads=0)",
    ],
)
def test_probe_absurd_threads_is_a_value_error(call):
    r = _run_child(
        f"""
        from v4flash import _core
        try:
            {call}
        except ValueError as e:
            print("ValueError:", e)
        else:
            raise SystemExit("no ValueError")
        """,
        timeout=60,
    )
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "threads" in r.stdout


def test_mem_read_reps_and_nbytes_bounds():
    with pytest.raises(ValueError, match="reps"):
        _core.mem_read_gbs(1 << 20, threads=1, reps=0)
    with pytest.raises(ValueError, match="reps"):
        _core.mem_read_gbs(1 << 20, threads=1, reps=1 << 40)
    with pytest.raises(ValueError, match="nbytes"):
        _core.mem_read_gbs(0, threads=1, reps=1)
    # a small size is measured over the probe's minimum buffer and gives a number
    gbs = _core.mem_read_gbs(1, threads=1, reps=1)
    assert gbs > 0


def test_disk_read_is_bounded_by_the_file(tmp_path):
    shard = next(TINY.glob("*.safetensors"))
    gbs, _direct = _core.disk_read_gbs(str(shard), 1 << 62)
    assert gbs >= 0
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    gbs, _direct = _core.disk_read_gbs(str(empty), 1 << 62)
    assert gbs == 0


def test_disk_read_with_readers_in_flight(tmp_path):
    shard = next(TINY.glob("*.safetensors"))
    gbs, _direct = _core.disk_read_gbs(str(shard), 1 << 30, 8)
    assert gbs > 0
    for readers in (0, 65):
        with pytest.raises(ValueError, match="readers must be between 1 and 64"):
            _core.disk_read_gbs(str(shard), 1 << 30, readers)


def test_bench_keeps_the_better_disk_figure(monkeypatch):
    from v4flash import bench

    calls = []

    def fake(path, nbytes, readers=1):
        calls.append(readers)
        return (1.5 if readers == 1 else 2.5, True)

    monkeypatch.setattr(_core, "disk_read_gbs", fake)
    gbs, how, both = bench.disk_read_gbs(TINY, 1 << 20)
    assert calls == [1, bench.DISK_READERS]
    assert gbs == 2.5 and both == {"one_reader": 1.5, "parallel": 2.5}
    assert "1.50 GB/s one at a time" in how and f"2.50 GB/s {bench.DISK_READERS} in flight" in how
    monkeypatch.setattr(_core, "disk_read_gbs", lambda p, n, r=1: (3.0 if r == 1 else 0.5, False))
    gbs, how, _ = bench.disk_read_gbs(TINY, 1 << 20)
    assert gbs == 3.0 and "direct I/O refused" in how
