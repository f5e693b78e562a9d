"""Regression tests for the expert store's reliability defects: two callers deadlocking on one
model, io_uring waits interrupted by signals, the pre-fault lagging behind the cache, mmap on a
truncated shard or a NaN scale, and snapshots restored into another model's session.

Anything that can hang or kill the process (a deadlock, SIGBUS) runs in a child interpreter
with a timeout: a regression fails the test instead of blocking or crashing the test run. The
child also arms a faulthandler watchdog a little before the timeout, so a hang prints every
Python thread's stack."""

import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import v4flash
from conftest import FIXTURES, copy_fixture, model_for
from make_bad_checkpoints import CASES, make

S2 = "model-00002-of-00002.safetensors"
IO_MODES = ["direct", "buffered", "mmap"]
# tgkill(2) has no libc wrapper in older glibc: call it by number
SYS_TGKILL = {"x86_64": 234, "amd64": 234, "aarch64": 131, "arm64": 131}.get(platform.machine())
LINUX_ONLY = pytest.mark.skipif(
    sys.platform != "linux" or SYS_TGKILL is None,
    reason="needs Linux (/proc/self/task, tgkill) on x86_64 or aarch64",
)


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


def run_child(script: str, *args, timeout: float, env=None) -> subprocess.CompletedProcess:
    """Runs ``script`` in a fresh interpreter with ``args`` as sys.argv[1:].

    A faulthandler watchdog dumps every thread's stack and exits shortly before ``timeout``;
    if even that does not end the child, the timeout kills it. Either way the test fails with
    the output so far, and a hang never blocks the test run."""
    watchdog = f"import faulthandler; faulthandler.dump_traceback_later({timeout - 5}, exit=True)\n"
    try:
        return subprocess.run(
            [sys.executable, "-u", "-c", watchdog + script, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ, **(env or {})),
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"child still running after {timeout} s (hung); output so far:\n"
            + _text(e.stdout)
            + _text(e.stderr)
        )


def describe(r: subprocess.CompletedProcess) -> str:
    how = f"exit code {r.returncode}"
    if r.returncode < 0:
        how = f"killed by {signal.Signals(-r.returncode).name}"
    elif r.returncode == 1 and "Timeout (" in r.stderr:
        how = "hung (the watchdog dumped the stacks below and ended it)"
    return f"child {how}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


# ------------------------------------------------------------- 1. two callers on one model

_CONCURRENT = textwrap.dedent(
    """
    import random, sys, threading
    import numpy as np
    import v4flash

    path, mode, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
    m = v4flash.load(path, expert_cache_mb=0.06, threads=2)
    print("slots", m.plan()["slots"])
    rng = random.Random(7)
    V = m.config.vocab_size
    prompts = [[0] + [rng.randrange(2, V) for _ in range(7)] for _ in range(10)]

    def by_logits(i):
        return m.logits(prompts[i])

    sessions = {}

    def by_session(i):
        s = sessions.setdefault(threading.get_ident(), m.session())
        s.reset()
        s.feed(prompts[i])
        last = s.last_logits()
        new = s.generate([prompts[(i + 3) % 10][1]], max_new_tokens=4, stop_ids=[])
        return last, new, s.tokens

    work = {"logits": (by_logits, by_logits), "sessions": (by_session, by_session),
            "mixed": (by_logits, by_session)}[mode]

    # the single-caller results, from the same model
    want = {(w, i): w(i) for w in set(work) for i in range(10)}

    def same(a, b):
        if isinstance(a, np.ndarray):
            return a.dtype == b.dtype and np.array_equal(a, b)
        if isinstance(a, tuple):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    done, bad, errs = [0, 0], [], []

    def run(t):
        try:
            for n in range(iters):
                i = (n * 3 + t * 5) % 10 if t == 0 else (9 * n + 4) % 10
                got = work[t](i)
                if not same(got, want[(work[t], i)]):
                    bad.append((t, n, i))
                done[t] += 1
        except BaseException as e:
            errs.append(repr(e))

    ts = [threading.Thread(target=run, args=(t,)) for t in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    assert not bad, ("results differ from the single-caller ones", bad)
    print("DONE", sum(done))
    """
)


@pytest.mark.parametrize("name", ["tiny-b", "tiny-a"])
@pytest.mark.parametrize("mode", ["logits", "sessions", "mixed"])
def test_two_callers_on_one_model_finish_with_identical_results(name, mode):
    """Two Python threads calling one model (a small cache: 3 slots) all finish, and every
    result equals the single-caller one. A deadlock fails by the timeout."""
    iters = 150 if mode == "logits" else 40
    r = run_child(_CONCURRENT, FIXTURES / name, mode, iters, timeout=90)
    assert r.returncode == 0, describe(r)
    assert f"DONE {2 * iters}" in r.stdout, describe(r)


# -------------------------------------------------------- 2. io_uring waits and signals

_EINTR = textwrap.dedent(
    """
    import ctypes, os, random, signal, sys, threading, time
    import numpy as np
    import v4flash

    path, fixture, sys_tgkill = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ref = v4flash.load(fixture, expert_cache_mb=100)

    def tasks():
        out = {}
        for t in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{t}/comm") as f:
                    out[int(t)] = f.read().strip()
            except OSError:
                pass  # the thread ended meanwhile
        return out

    before = set(tasks())
    m = v4flash.load(path, io="direct", expert_cache_mb=1e-6)  # one slot: every layer reads
    engine = m.stats()["io_engine"]
    if engine != "io_uring":
        print("SKIP: the io engine at load is", repr(engine), "(io_uring refused here?)")
        sys.exit(0)
    rng = random.Random(3)
    prompts = [[0] + [rng.randrange(2, 512) for _ in range(7)] for _ in range(10)]
    want = [ref.logits(p) for p in prompts]
    np.testing.assert_array_equal(m.logits(prompts[0]), want[0])  # the ring is running
    uring = [t for t, c in tasks().items() if t not in before and c == "v4flash-uring"]
    assert uring, ("no new thread named v4flash-uring", tasks())
    print("uring threads", uring)

    # CPython installs the handler without SA_RESTART: a blocked syscall returns EINTR
    signal.signal(signal.SIGUSR1, lambda *a: None)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()
    sent = [0]

    def signaller():
        while not stop.is_set():
            for _ in range(20):  # a burst, then a breath for the reading threads
                for t in uring:
                    if libc.syscall(sys_tgkill, os.getpid(), t, signal.SIGUSR1) == 0:
                        sent[0] += 1
            time.sleep(0.0002)

    th = threading.Thread(target=signaller, daemon=True)
    th.start()
    assert "io_uring_interrupts" in m.stats(), sorted(m.stats())
    rounds, t0 = 0, time.monotonic()
    try:
        # at least 3 rounds; then until a wait was interrupted, up to a bound
        while rounds < 3 or (
            m.stats()["io_uring_interrupts"] == 0 and rounds < 200 and time.monotonic() - t0 < 60
        ):
            for p, w in zip(prompts, want):
                np.testing.assert_array_equal(m.logits(p), w)
            rounds += 1
    finally:
        stop.set()
        th.join()
    st = m.stats()
    print("rounds", rounds, "signals", sent[0], "engine", st["io_engine"],
          "interrupts", st["io_uring_interrupts"])
    assert sent[0] > 0
    assert st["io_engine"] == "io_uring", st["io_engine"]
    assert st["io_uring_interrupts"] > 0, "no io_uring wait was interrupted by the signals"
    for p, w in zip(prompts, want):  # and still right with the signals stopped
        np.testing.assert_array_equal(m.logits(p), w)
    print("OK")
    """
)


@LINUX_ONLY
def test_signals_to_the_io_uring_thread_are_retried_not_fatal(tmp_path):
    """SIGUSR1 (a Python handler, so no SA_RESTART) sent to the io_uring thread while it waits:
    the waits are retried and counted, the engine stays io_uring, every result is right."""
    d = copy_fixture(tmp_path)
    r = run_child(_EINTR, d, FIXTURES / "tiny-a", SYS_TGKILL, timeout=120)
    if r.returncode == 0 and "SKIP:" in r.stdout:
        pytest.skip(r.stdout.split("SKIP:", 1)[1].strip())
    assert r.returncode == 0, describe(r)
    assert "OK" in r.stdout, describe(r)


def test_stats_report_the_io_engine_that_runs():
    seen = {io: v4flash.load(FIXTURES / "tiny-a", io=io).stats()["io_engine"] for io in IO_MODES}
    assert seen["direct"] == "io_uring" or seen["direct"].startswith("pread-pool"), seen
    assert seen["buffered"] == "pread-pool", seen
    assert seen["mmap"] == "mmap", seen
    assert isinstance(model_for("tiny-a").stats()["io_uring_interrupts"], int)


# -------------------------------------------------------------- 3. pre-fault switched off

_NO_PREFAULT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import v4flash

    fixtures, ref_json, ref_npz = sys.argv[1], sys.argv[2], sys.argv[3]
    want = json.load(open(ref_json))
    arrays = np.load(ref_npz)
    for key, w in want.items():
        name, cache = key.split("|")
        m = v4flash.load(f"{fixtures}/{name}", expert_cache_mb=None if cache == "default"
                         else float(cache))
        slots = m.plan()["slots"]
        assert m.stats()["prefaulted_slots"] == 0, m.stats()["prefaulted_slots"]
        for i, p in enumerate(w["prompts"]):
            np.testing.assert_array_equal(m.logits(p), arrays[f"{name}.{i}"])
        assert m.generate(w["prompts"][0], max_new_tokens=8, stop_ids=[]) == w["greedy"]
        s = m.session()
        got = s.generate(w["prompts"][1], max_new_tokens=8, temperature=0.8, seed=5, stop_ids=[])
        assert got == w["sampled"], (got, w["sampled"])
        assert m.stats()["prefaulted_slots"] == 0, m.stats()["prefaulted_slots"]
        # no pre-fault: the reads claimed (touched) the slots they used
        assert 0 < m.stats()["warm_slots"] <= slots, (m.stats()["warm_slots"], slots)
        print(key, "slots", slots, "ok")
    print("DONE")
    """
)


def _prefault_reference(tmp_path: Path):
    want, arrays = {}, {}
    for name in ("tiny-a", "tiny-b"):
        m = model_for(name)  # a normal model (pre-fault on)
        prompts = [[0, 5, 17, 99, 3, 250, 7, 41], [0, 33, 2, 8], list(range(0, 64, 3))]
        for i, p in enumerate(prompts):
            arrays[f"{name}.{i}"] = m.logits(p)
        w = dict(
            prompts=prompts,
            greedy=m.generate(prompts[0], max_new_tokens=8, stop_ids=[]),
            sampled=m.generate(prompts[1], max_new_tokens=8, temperature=0.8, seed=5, stop_ids=[]),
        )
        for cache in ("0.5", "default"):
            want[f"{name}|{cache}"] = w
    (tmp_path / "want.json").write_text(json.dumps(want))
    np.savez(tmp_path / "want.npz", **arrays)
    return tmp_path / "want.json", tmp_path / "want.npz"


def test_prefault_off_faults_slots_on_first_use(tmp_path):
    """V4FLASH_PREFAULT=0: no background pre-fault at all (the counter stays 0), and a layer
    that wants more slots than were ever pre-faulted does not wait for them (a wait would
    hang: the timeout fails it). Results equal a normal model's."""
    ref_json, ref_npz = _prefault_reference(tmp_path)
    r = run_child(
        _NO_PREFAULT, FIXTURES, ref_json, ref_npz, timeout=120, env={"V4FLASH_PREFAULT": "0"}
    )
    assert r.returncode == 0, describe(r)
    assert r.stdout.count(" ok") == 4 and "DONE" in r.stdout, describe(r)


def test_prefault_runs_by_default():
    """The counter the test above expects to stay 0 does count: with the pre-fault on, it
    reaches the number of slots (polled with a generous bound; it runs at idle priority)."""
    m = v4flash.load(FIXTURES / "tiny-b", expert_cache_mb=0.5)
    slots = m.plan()["slots"]
    deadline = time.monotonic() + 60
    while m.stats()["prefaulted_slots"] < slots and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m.stats()["prefaulted_slots"] == slots, (m.stats()["prefaulted_slots"], slots)
    assert m.stats()["warm_slots"] == slots, (m.stats()["warm_slots"], slots)


# ------------------------------------------------------------------------------- 4. mmap

_MMAP_TRUNCATED = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import v4flash

    d, fixture, shard_name, cut = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ids = [0, 17, 42, 99, 3, 250, 7]
    good = v4flash.load(fixture)
    want_logits = good.logits(ids)
    want_new = good.generate(ids, max_new_tokens=6, stop_ids=[])

    m = v4flash.load(d, io="mmap", expert_cache_mb=1e-6)
    np.testing.assert_array_equal(m.logits(ids), want_logits)  # pages mapped and used once
    s = m.session()
    s.feed(ids[:3])
    shard = os.path.join(d, shard_name)
    orig = open(shard, "rb").read()
    os.truncate(shard, cut)
    try:
        for call in (lambda: s.generate(ids[3:], max_new_tokens=6, stop_ids=[]),
                     lambda: m.logits(ids), lambda: m.logits(ids)):
            try:
                call()
            except OSError as e:
                msg = str(e)
                assert shard_name in msg and "truncated" in msg, msg
                print("OSError:", msg)
            else:
                raise AssertionError("no error from a truncated shard")
        assert s.position == 3, s.position  # the failed call left the session where it was
    finally:
        with open(shard, "r+b") as f:  # restore the same file (same inode)
            f.write(orig)
    np.testing.assert_array_equal(m.logits(ids), want_logits)
    assert s.generate(ids[3:], max_new_tokens=6, stop_ids=[]) == want_new
    print("OK")
    """
)


@pytest.mark.parametrize("cut", [100_000, 4096])
def test_mmap_shard_truncated_after_load_is_an_oserror_then_restored(tmp_path, cut):
    """io="mmap": touching a mapped page past a truncated file's end is SIGBUS; the engine
    checks the size first and raises OSError naming the shard. Restored in place (same inode),
    the results are bit-identical again."""
    d = copy_fixture(tmp_path)
    r = run_child(_MMAP_TRUNCATED, d, FIXTURES / "tiny-a", S2, cut, timeout=90)
    assert r.returncode == 0, describe(r)
    assert r.stdout.count("OSError:") == 3 and "OK" in r.stdout, describe(r)


_E8M0 = next(c for c in CASES if c.name == "e8m0_nan_expert_scale")


@pytest.mark.parametrize("cache_mb", [1e-6, None], ids=["one-slot", "default-cache"])
@pytest.mark.parametrize("io", IO_MODES)
def test_nan_expert_scale_is_an_error_on_every_io_path(tmp_path, io, cache_mb):
    """Every expert of layer 0 has a w1 scale byte 255 (F8_E8M0 NaN): whatever the read path,
    the first forward pass that uses one raises V4FlashError naming the tensor, and so does
    every later one (a bad expert is never served from the cache as numbers)."""
    path = make(_E8M0, tmp_path / "bad")
    m = v4flash.load(path, io=io, expert_cache_mb=cache_mb)
    calls = [
        lambda: m.logits(list(range(40))),
        lambda: m.logits(list(range(40))),
        lambda: m.session().generate([0, 5, 6], max_new_tokens=3, stop_ids=[]),
    ]
    for call in calls:
        with pytest.raises(v4flash.V4FlashError) as ei:
            call()
        msg = str(ei.value)
        for w in ["layers.0.ffn.experts.", ".w1.scale", "is 255", "F8_E8M0 NaN"]:
            assert w in msg, (w, msg)


# ---------------------------------------------------------------------------- 5. snapshots


def _fresh_tokens_after(m, history, ids, n=4):
    s = m.session()
    s.feed(history)
    return s.generate(ids, max_new_tokens=n, stop_ids=[])


@pytest.mark.parametrize("other", ["tiny-b", "tiny-a-loaded-again"])
def test_snapshot_from_another_model_is_refused(other):
    """A snapshot belongs to the model instance whose session took it: another checkpoint, or
    another load of the same folder, refuses it (even the empty snapshot at position 0, whose
    tokens are a prefix of anything), and the refusing session is left as it was."""
    a = model_for("tiny-a")
    b = model_for("tiny-b") if other == "tiny-b" else v4flash.load(FIXTURES / "tiny-a")
    empty = a.session().snapshot()
    sa = a.session()
    sa.feed([0, 5, 6])
    prefix = sa.snapshot()
    for snap in (empty, prefix):
        t = b.session()
        t.feed([0, 5, 6, 7, 8])
        with pytest.raises(ValueError, match="another model"):
            t.rollback(snap)
        assert t.position == 5 and t.tokens == [0, 5, 6, 7, 8]
        assert t.generate([9], max_new_tokens=4, stop_ids=[]) == _fresh_tokens_after(
            b, [0, 5, 6, 7, 8], [9]
        )
    # the snapshots are still good where they belong
    sa.feed([11, 12])
    sa.rollback(prefix)
    assert sa.position == 3
    assert sa.generate([7], max_new_tokens=4, stop_ids=[]) == _fresh_tokens_after(a, [0, 5, 6], [7])


def test_snapshot_from_another_session_of_the_same_model_is_accepted_when_a_prefix():
    m = model_for("tiny-a")
    s1 = m.session()
    s1.feed([0, 5, 6])
    snap = s1.snapshot()
    s2 = m.session()
    s2.feed([0, 5, 6, 9, 10])
    s2.rollback(snap)
    assert s2.position == 3 and s2.tokens == [0, 5, 6]
    s2.feed([7])
    np.testing.assert_array_equal(s2.last_logits(), m.logits([0, 5, 6, 7])[-1])
    # the empty snapshot of a third session restores anything of this model
    s2.rollback(m.session().snapshot())
    assert s2.position == 0
    # a snapshot whose tokens are not a prefix is refused, as before
    s3 = m.session()
    s3.feed([0, 4, 6])
    with pytest.raises(ValueError, match="does not belong"):
        s3.rollback(snap)
    assert s3.tokens == [0, 4, 6]
