"""Runtime robustness: bad arguments, concurrent use of one session, a shard that shrinks or is
replaced while a model is loaded, Ctrl-C during prefill and decode, and the guarantee that
checkpoint files are opened read-only and never modified."""

import hashlib
import math
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import v4flash
from conftest import FIXTURES, copy_fixture, model_for

S1 = "model-00001-of-00002.safetensors"
S2 = "model-00002-of-00002.safetensors"


# ------------------------------------------------------------------------- runtime inputs


def test_empty_prompt_is_rejected_everywhere():
    m = model_for("tiny-a")
    with pytest.raises(ValueError, match="ids is empty"):
        m.generate([])
    with pytest.raises(ValueError, match="ids is empty"):
        m.session().feed([])
    with pytest.raises(ValueError, match="ids is empty"):
        list(m.stream([]))
    # a fresh session with nothing fed has nothing to condition on
    s = m.session()
    with pytest.raises(ValueError, match="prompt is empty"):
        s.generate([], max_new_tokens=3)
    assert s.position == 0
    # after a prompt, generate() with no new ids continues the sequence
    s.feed([0, 5, 6])
    assert len(s.generate([], max_new_tokens=2, stop_ids=[])) == 2


@pytest.mark.parametrize(
    "ids, words",
    [
        ([0, 512], "token id 512 is out of the vocabulary (0..511)"),
        ([0, 2**32 + 1], "out of the vocabulary"),
        ([0, -1], "negative token id (-1)"),
        ("hello", "not text"),
        ([0, 1.5, None], "integer token ids"),
    ],
)
def test_bad_token_ids_are_value_errors(ids, words):
    m = model_for("tiny-a")
    s = m.session()
    s.feed([0, 7])
    for call in (m.logits, s.feed, lambda i: s.generate(i, max_new_tokens=1)):
        with pytest.raises(ValueError) as ei:
            call(ids)
        assert words in str(ei.value)
    with pytest.raises(ValueError, match="stop_ids"):
        m.generate([0], stop_ids=[-5])
    assert s.position == 2  # nothing was fed by the failed calls


def test_prompt_longer_than_ctx_in_one_call(tmp_path):
    m = v4flash.load(FIXTURES / "tiny-a", ctx=8)
    with pytest.raises(ValueError, match="more than the context of 8 tokens"):
        m.logits(list(range(9)))
    s = m.session()
    with pytest.raises(ValueError, match="more than the context of 8 tokens"):
        s.generate(list(range(12)), max_new_tokens=1)
    assert s.position == 0
    # a full session refuses more input with a clear error; reset recovers
    s.feed(list(range(8)))
    with pytest.raises(ValueError, match="context of 8 tokens"):
        s.feed([1])
    s.reset()
    assert s.position == 0 and len(s.generate([0], max_new_tokens=3, stop_ids=[])) == 3


def test_generation_stops_at_the_context_limit_and_returns_its_tokens():
    m = v4flash.load(FIXTURES / "tiny-a", ctx=8)
    s = m.session()
    s.feed(list(range(6)))
    out = s.generate([], max_new_tokens=10, stop_ids=[])
    assert 1 <= len(out) <= 3
    assert s.tokens == list(range(6)) + out


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 1"),
        (dict(max_new_tokens=2.5), ValueError, "max_new_tokens must be an integer"),
        (dict(max_new_tokens=True), ValueError, "max_new_tokens must be an integer"),
        (dict(temperature=float("nan")), ValueError, "temperature"),
        (dict(temperature=float("inf")), ValueError, "temperature"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(top_k=-1), ValueError, "top_k must be >= 0"),
        (dict(seed=-1), ValueError, "seed must be >= 0"),
    ],
)
def test_bad_generation_arguments(kw, exc, words):
    m = model_for("tiny-a")
    with pytest.raises(exc) as ei:
        m.generate([0, 3], **kw)
    assert words in str(ei.value)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(threads=0), "threads must be >= 1"),
        (dict(threads=-2), "threads must be >= 1"),
        (dict(threads=1.5), "threads must be an integer"),
        (dict(ctx=0), "ctx must be >= 1"),
        (dict(ctx=(1 << 20) + 1), "exceeds the model's max_position_embeddings"),
        (dict(ram_gb=0), "ram_gb must be a positive number"),
        (dict(ram_gb=-4), "ram_gb must be a positive number"),
        (dict(ram_gb=float("nan")), "ram_gb must be a positive number"),
        (dict(ram_gb=float("inf")), "ram_gb must be a positive number"),
        (dict(ram_gb="24"), "ram_gb must be a number"),
        (dict(expert_cache_mb=0), "expert_cache_mb must be a positive number"),
        (dict(expert_cache_mb=-1), "expert_cache_mb must be a positive number"),
        (dict(expert_cache_mb=float("nan")), "expert_cache_mb must be a positive number"),
    ],
)
def test_bad_load_arguments(kw, words):
    with pytest.raises(ValueError) as ei:
        v4flash.load(FIXTURES / "tiny-a", **kw)
    assert words in str(ei.value)


def test_load_options_are_the_cores_one_list():
    """v4flash.load and plan take the core's options (LoadOptions::set): an unknown name is a
    TypeError naming the options, a wrong kind a ValueError naming the option."""
    from v4flash import _core

    assert set(_core.LOAD_OPTIONS) >= {"ram_gb", "threads", "ctx", "io", "prefault"}
    for call in (v4flash.load, v4flash.plan):
        with pytest.raises(TypeError, match='unknown option "ram_bytes"') as ei:
            call(FIXTURES / "tiny-a", ram_bytes=10**9)
        assert all(name in str(ei.value) for name in _core.LOAD_OPTIONS)
        with pytest.raises(ValueError, match="prefault must be True or False, got 1"):
            call(FIXTURES / "tiny-a", prefault=1)
        with pytest.raises(ValueError, match="io_threads must be >= 1, got 0"):
            call(FIXTURES / "tiny-a", io_threads=0)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1, got 0"):
        model_for("tiny-a").generate([0, 3], max_new_tokens=0)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer, got None"):
        model_for("tiny-a").generate([0, 3], max_new_tokens=None)


def test_the_switches_in_force_are_reported(monkeypatch):
    """stats() and plan() report the tuning (kernels, products, the per-model switches); a
    per-model switch given to load wins over the environment."""
    from v4flash import _core

    monkeypatch.setenv("V4FLASH_PREFAULT", "1")
    m = v4flash.load(FIXTURES / "tiny-a", expert_cache_mb=1e-6, prefault=False, lookahead=False)
    st, plan = m.stats(), m.plan()
    assert st["tuning"] == plan["tuning"]
    t = st["tuning"]
    assert (t["prefault"], t["lookahead"], t["io_uring"]) == (False, False, True)
    assert t["kernels"] == _core.kernel_tier() == st["kernel_tier"]
    assert t["bf16_products"] == _core.bf16_products()
    assert t["fast_products"] == _core.fast_products()
    assert st["lookahead"] is False and st["prefaulted_slots"] == 0
    monkeypatch.setenv("V4FLASH_IO_URING", "0")
    assert _core.tuning()["io_uring"] is False
    assert v4flash.plan(FIXTURES / "tiny-a", ram_gb=2)["tuning"]["io_uring"] is False
    assert v4flash.plan(FIXTURES / "tiny-a", ram_gb=2, io_uring=True)["tuning"]["io_uring"]


@pytest.mark.parametrize("ram_gb", [1e-6, 1e9])
def test_ram_budget_too_small_or_absurd(ram_gb):
    with pytest.raises((MemoryError, ValueError)) as ei:
        v4flash.load(FIXTURES / "tiny-a", ram_gb=ram_gb)
    assert "ram" in str(ei.value).lower()


def test_huge_expert_cache_is_capped_not_allocated():
    m = v4flash.load(FIXTURES / "tiny-a", expert_cache_mb=1e12)
    assert m.logits([0, 1, 2]).shape == (3, 512)


# ---------------------------------------------------------------- concurrency on one session


def test_second_concurrent_call_on_a_session_is_rejected_as_busy():
    """One call at a time per session: a second call from another thread raises RuntimeError
    "busy" at once (it does not wait and does not corrupt the running call)."""
    m = model_for("tiny-b")
    prompt = [0, 11, 12, 13]
    want = m.generate(prompt, max_new_tokens=80, stop_ids=[])
    s = m.session()
    out, errs = [], []

    def run():
        try:
            out.append(s.generate(prompt, max_new_tokens=80, stop_ids=[]))
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)

    t = threading.Thread(target=run)
    t.start()
    busy = []
    deadline = time.monotonic() + 30
    # wait (with a read-only call) until the generation holds the session
    while t.is_alive() and time.monotonic() < deadline and not busy:
        try:
            _ = s.position
        except RuntimeError as e:
            busy.append(str(e))
        time.sleep(0.001)
    if busy:  # now every other call, mutating or not, is refused at once
        for call in (
            lambda: s.generate([5], max_new_tokens=1),
            lambda: s.feed([5]),
            lambda: s.tokens,  # property read
            s.snapshot,
            s.reset,
        ):
            # a call that waited for the lock would succeed instead of raising "busy"
            with pytest.raises(RuntimeError, match="busy") as ei:
                call()
            busy.append(str(ei.value))
    t.join()
    assert not errs, errs
    assert busy, "no call overlapped the running generation"
    assert all("busy" in b for b in busy), busy
    # the running call was not disturbed and the session is usable afterwards
    assert out == [want]
    assert s.position == len(prompt) + 80


def test_separate_sessions_run_concurrently_with_the_same_results():
    m = model_for("tiny-a")
    prompts = [[0, 3, 4, 5], [0, 9, 8], [0, 100, 200, 300, 7]]
    want = [m.generate(p, max_new_tokens=8, stop_ids=[]) for p in prompts]
    got = [None] * len(prompts)

    def run(i):
        got[i] = m.session().generate(prompts[i], max_new_tokens=8, stop_ids=[])

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == want


# ------------------------------------------------------------- faults on disk after load


def test_shard_truncated_after_load_then_restored_in_place(tmp_path):
    d = copy_fixture(tmp_path)
    case_ids = [0, 17, 42, 99, 3, 250, 7]
    good = model_for("tiny-a")
    want_logits = good.logits(case_ids)
    want_new = good.generate(case_ids, max_new_tokens=6, stop_ids=[])

    m = v4flash.load(d, expert_cache_mb=1e-6)  # one expert cached: every layer reads from disk
    s = m.session()
    s.feed(case_ids[:3])
    shard = d / S2
    orig = shard.read_bytes()
    os.truncate(shard, 100_000)
    try:
        with pytest.raises(OSError) as ei:
            s.generate(case_ids[3:], max_new_tokens=6, stop_ids=[])
        assert type(ei.value) is OSError
        msg = str(ei.value)
        assert S2 in msg and "at offset" in msg and "truncated" in msg, msg
        with pytest.raises(OSError, match=S2):
            m.logits(case_ids)
        assert s.position == 3  # the failed call left the session where it was
    finally:
        with open(shard, "r+b") as f:  # restore the same file (same inode)
            f.write(orig)
    assert shard.read_bytes() == orig
    np.testing.assert_array_equal(m.logits(case_ids), want_logits)
    assert s.generate(case_ids[3:], max_new_tokens=6, stop_ids=[]) == want_new


def test_shard_replaced_by_a_new_copy_after_a_fault(tmp_path):
    """Restoring by copying the file back (a new inode) also works: the reader reopens the
    path, checks that it is the same shard (size and header) and retries."""
    d = copy_fixture(tmp_path)
    ids = [0, 17, 42, 99, 3]
    want = model_for("tiny-a").logits(ids)
    m = v4flash.load(d, expert_cache_mb=1e-6)
    shard = d / S2
    backup = tmp_path / "backup.safetensors"
    shutil.copy(shard, backup)
    os.truncate(shard, 4096)
    with pytest.raises(OSError, match="offset"):
        m.logits(ids)
    shard.unlink()
    with pytest.raises(OSError, match=S2):  # still gone: the old handle is truncated
        m.logits(ids)
    shutil.copy(backup, shard)
    np.testing.assert_array_equal(m.logits(ids), want)


def test_a_different_file_at_the_shard_path_is_not_used(tmp_path):
    """After a fault the reader only switches to a file that is the same shard: a different
    file (here: the other shard renamed) is refused and the original error stays."""
    d = copy_fixture(tmp_path)
    m = v4flash.load(d, expert_cache_mb=1e-6)
    os.truncate(d / S2, 4096)
    (d / S2).unlink()
    shutil.copy(d / S1, d / S2)
    with pytest.raises(OSError, match="offset"):
        m.logits([0, 1, 2, 3])


def test_deleted_shard_keeps_working_through_the_open_handle(tmp_path):
    d = copy_fixture(tmp_path)
    ids = [0, 5, 9]
    m = v4flash.load(d, expert_cache_mb=1e-6)
    (d / S2).unlink()
    np.testing.assert_array_equal(m.logits(ids), model_for("tiny-a").logits(ids))


# --------------------------------------------------------------------------------- Ctrl-C

_SIGINT_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    import v4flash

    m = v4flash.load(sys.argv[1])
    mode = sys.argv[2]
    # long enough that the prefill is still running when the signal comes (about 3 s on
    # the development VM; 1,500 tokens had become too quick after the prefill speed-ups)
    prompt = [0] + [3 + (i * 7) % 590 for i in range(12000)]

    def interrupt_soon(delay):
        t = threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGINT))
        t.start()
        return t

    ref = m.generate([0, 11, 12], max_new_tokens=5, stop_ids=[])
    s = m.session()
    if mode == "prefill":
        t0 = time.monotonic()
        interrupt_soon(0.3)
        try:
            s.feed(prompt)
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            print("interrupted after", round(time.monotonic() - t0, 2), "s")
        assert s.position == 0, s.position  # the half-done prefill was rolled back
    else:
        s.feed([0, 11, 12])
        interrupt_soon(0.5)
        t0 = time.monotonic()
        try:
            s.generate([], max_new_tokens=100000, stop_ids=[])
            print("NOT INTERRUPTED")
        except KeyboardInterrupt:
            pass
        # the tokens produced before Ctrl-C stay in the session
        out = s.tokens[3:]
        dt = time.monotonic() - t0
        print("stopped after", len(out), "tokens in", round(dt, 2), "s")
        assert 0 < len(out) < 100000 and dt < 20, (len(out), dt)
        full = m.generate([0, 11, 12], max_new_tokens=len(out), stop_ids=[])
        assert out == full, "the tokens before Ctrl-C are the uninterrupted ones"
        assert s.position == 3 + len(out)
    # the model and the session are usable afterwards
    again = m.generate([0, 11, 12], max_new_tokens=5, stop_ids=[])
    assert again == ref, (again, ref)
    s.reset()
    assert s.generate([0, 11, 12], max_new_tokens=5, stop_ids=[]) == ref
    print("OK")
    """
)


@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_ctrl_c_stops_cleanly_and_the_model_is_reusable(mode, tmp_path):
    script = tmp_path / "sigint.py"
    script.write_text(_SIGINT_SCRIPT)
    r = subprocess.run(
        [sys.executable, str(script), str(FIXTURES / "tiny-b"), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout and "NOT INTERRUPTED" not in r.stdout, r.stdout
    assert "PanicException" not in r.stderr and "panicked" not in r.stderr, r.stderr


# ------------------------------------------------------------------ files are never written


def _hashes(d: Path):
    return {
        p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(d.iterdir())
    }


def test_checkpoint_files_are_unchanged_after_load_generate_and_errors(tmp_path):
    d = copy_fixture(tmp_path)
    before = _hashes(d)
    for p in d.iterdir():
        p.chmod(0o444)  # a read-only copy must load (nothing asks for write access)
    d.chmod(0o555)
    try:
        m = v4flash.load(d, expert_cache_mb=1e-6)
        s = m.session()
        s.generate([0, 5, 6], max_new_tokens=4, stop_ids=[])
        for bad in ([0, 512], [], [-1]):
            with pytest.raises(ValueError):
                s.feed(bad)
        with pytest.raises(ValueError):
            v4flash.load(d, threads=0)
        m.logits([0, 1, 2, 3])
        del m, s
    finally:
        d.chmod(0o755)
    assert _hashes(d) == before


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="needs Linux /proc")
def test_shards_are_opened_read_only(tmp_path):
    d = copy_fixture(tmp_path)
    m = v4flash.load(d)
    seen = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(d)):
            flags = Path(f"/proc/self/fdinfo/{fd}").read_text().split("flags:")[1].split()[0]
            seen[Path(target).name] = int(flags, 8)
    assert set(seen) == {S1, S2}, seen  # only the shards stay open; config/index were closed
    for name, flags in seen.items():
        assert flags & os.O_ACCMODE == os.O_RDONLY, (name, oct(flags))
    assert m.logits([0, 1]).shape == (2, 512)
    assert all(math.isfinite(x) for x in m.logits([0, 1]).ravel())
