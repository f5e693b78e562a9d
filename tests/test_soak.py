"""Soak: many threads, sessions, read paths and cache sizes at once, under a signal storm.

One child interpreter (so a hang fails by timeout instead of blocking the run) does, for each
configuration (tiny-a and tiny-b; expert caches from one slot to the default; every io
mode):

1. writes a random script per Python thread (seeded ``random.Random``): feed, generate (greedy
   or sampled with a seed), snapshot, rollback, and model-level logits on 2-3 sessions;
2. replays every script single-threaded on a reference model (``threads=1``, every expert
   cached, no signals) and keeps every result;
3. then, with a thread sending SIGUSR1 (a no-op Python handler: no SA_RESTART) to every thread
   of the process every 2 ms, loads the configuration and runs the scripts on 2-4 threads at
   once, comparing every result bit for bit with the reference.

Bounded to about 20 s on two cores when the engine is healthy."""

import os
import platform
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import FIXTURES

SYS_TGKILL = {"x86_64": 234, "amd64": 234, "aarch64": 131, "arm64": 131}.get(platform.machine())
TIMEOUT_S = 120

_SOAK = textwrap.dedent(
    """
    import ctypes, os, random, signal, sys, threading, time, traceback
    import numpy as np
    import v4flash

    fixtures, seed, sys_tgkill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    IO = ["direct", "buffered", "mmap"]
    CACHES = [1e-6, 0.06, 0.5, None]  # one slot (the planner's minimum) ... the default
    CTX = 1024
    configs = [(name, cache, io) for name in ("tiny-a", "tiny-b") for cache in CACHES for io in IO]

    # ------------------------------------------------------------------ the scripts
    def make_script(rng, vocab, n_sessions, n_ops):
        def ids(lo, hi):
            return [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]

        can_continue = [False] * n_sessions  # generate([]) needs logits or a pending token
        n_snaps = [0] * n_sessions
        ops = []
        for _ in range(n_ops):
            k = rng.randrange(n_sessions)
            r = rng.random()
            if r < 0.15:
                ops.append(("logits", ids(1, 12)))
            elif r < 0.40:
                ops.append(("feed", k, ids(1, 10)))
                can_continue[k] = True
            elif r < 0.70:
                new = ids(0 if can_continue[k] else 1, 6)
                temp = rng.choice([0.0, 0.8])
                ops.append(("generate", k, new, rng.randint(1, 5), temp,
                            rng.choice([0, 0, 20]), rng.randrange(1 << 32)))
                can_continue[k] = True
            elif r < 0.85 or n_snaps[k] == 0:
                ops.append(("snapshot", k))
                n_snaps[k] += 1
            else:
                i = rng.randrange(n_snaps[k])
                ops.append(("rollback", k, i))
                n_snaps[k] = i + 1  # later snapshots may no longer be a prefix
                # (after a rollback, generate always gets new ids: a known open defect)
                can_continue[k] = False
        return ops

    def run_script(m, script, n_sessions, count=None):
        sessions = [m.session() for _ in range(n_sessions)]
        snaps = [[] for _ in range(n_sessions)]
        out = []
        for op in script:
            kind = op[0]
            if kind == "logits":
                out.append(m.logits(op[1]))
            else:
                s = sessions[op[1]]
                if kind == "feed":
                    s.feed(op[2])
                    out.append((s.position, s.last_logits()))
                elif kind == "generate":
                    _, _, new, n, temp, top_k, sd = op
                    out.append(s.generate(new, max_new_tokens=n, temperature=temp, top_k=top_k,
                                          seed=sd, stop_ids=[]))
                elif kind == "snapshot":
                    snaps[op[1]].append(s.snapshot())
                    out.append(s.position)
                else:
                    s.rollback(snaps[op[1]][op[2]])
                    del snaps[op[1]][op[2] + 1:]
                    out.append((s.position, s.tokens))
            if count is not None:
                count[0] += 1
        out.append([s.tokens for s in sessions])
        return out

    def same(a, b):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                    and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())
        if isinstance(a, (list, tuple)):
            return (isinstance(b, (list, tuple)) and len(a) == len(b)
                    and all(same(x, y) for x, y in zip(a, b)))
        return a == b

    rng = random.Random(seed)
    plans = []
    for name, cache, io in configs:
        vocab = 512 if name == "tiny-a" else 600
        n_threads = rng.randint(2, 4)
        n_sessions = rng.randint(2, 3)
        scripts = [make_script(rng, vocab, n_sessions, 10) for _ in range(n_threads)]
        plans.append((name, cache, io, n_sessions, scripts))

    # --------------------------------------------- the reference: one thread, no signals
    t0 = time.monotonic()
    refs = {name: v4flash.load(f"{fixtures}/{name}", threads=1, expert_cache_mb=100, ctx=CTX)
            for name in ("tiny-a", "tiny-b")}
    want = [[run_script(refs[name], sc, n_sessions) for sc in scripts]
            for name, _, _, n_sessions, scripts in plans]
    del refs
    print("reference done in", round(time.monotonic() - t0, 1), "s", flush=True)

    # ----------------------------------------------------------- the storm of signals
    signal.signal(signal.SIGUSR1, lambda *a: None)  # CPython: no SA_RESTART
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()
    sent = [0]

    def signaller():
        me, pid = threading.get_native_id(), os.getpid()
        while not stop.is_set():
            for t in os.listdir("/proc/self/task"):
                if int(t) != me and libc.syscall(sys_tgkill, pid, int(t), signal.SIGUSR1) == 0:
                    sent[0] += 1
            time.sleep(0.002)

    sig = threading.Thread(target=signaller, daemon=True)
    sig.start()

    # -------------------------------------------------------------- the concurrent runs
    ops_done, mismatches, errors, interrupts = [0], [], [], 0
    for ci, ((name, cache, io, n_sessions, scripts), wants) in enumerate(zip(plans, want)):
        m = v4flash.load(f"{fixtures}/{name}", expert_cache_mb=cache, io=io, threads=2, ctx=CTX)
        engine = m.stats()["io_engine"]
        got = [None] * len(scripts)

        def work(i):
            try:
                got[i] = run_script(m, scripts[i], n_sessions, ops_done)
            except BaseException:
                errors.append((ci, i, traceback.format_exc()))

        ts = [threading.Thread(target=work, args=(i,)) for i in range(len(scripts))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i, (g, w) in enumerate(zip(got, wants)):
            if g is not None:
                for j, (a, b) in enumerate(zip(g, w)):
                    if not same(a, b):
                        mismatches.append((ci, i, j, scripts[i][j] if j < len(scripts[i]) else
                                           "final tokens"))
        after = m.stats()["io_engine"]
        interrupts += m.stats().get("io_uring_interrupts", 0)
        if after != engine:
            errors.append((ci, "io engine changed", engine, after))
        print(f"config {ci}: {name} cache_mb={cache} io={io} engine={engine} slots="
              f"{m.plan()['slots']} threads={len(scripts)} sessions={n_sessions} "
              f"ops={ops_done[0]} signals={sent[0]}", flush=True)
        del m

    stop.set()
    sig.join()
    for e in errors:
        print("ERROR", *e, sep="\\n")
    for mm in mismatches[:20]:
        print("MISMATCH config/thread/op", mm)
    print(f"SOAK configs={len(plans)} ops={ops_done[0]} "
          f"expected={sum(len(s) for p in plans for s in p[4])} signals={sent[0]} "
          f"io_uring_interrupts={interrupts} mismatches={len(mismatches)} errors={len(errors)}")
    """
)


def _text(b) -> str:
    if b is None:
        return ""
    return b.decode(errors="replace") if isinstance(b, bytes) else b


@pytest.mark.skipif(
    sys.platform != "linux" or SYS_TGKILL is None,
    reason="needs Linux (/proc/self/task, tgkill) on x86_64 or aarch64",
)
def test_soak_threads_sessions_io_modes_and_cache_sizes_under_signals():
    watchdog = (
        f"import faulthandler; faulthandler.dump_traceback_later({TIMEOUT_S - 5}, exit=True)\n"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-u", "-c", watchdog + _SOAK, str(FIXTURES), "20240601"]
            + [str(SYS_TGKILL)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=dict(os.environ),
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"soak still running after {TIMEOUT_S} s (hung):\n{_text(e.stdout)}")
    out = f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
    if r.returncode < 0:
        pytest.fail(f"soak killed by {signal.Signals(-r.returncode).name}\n{out}")
    assert r.returncode == 0, out
    summary = [line for line in r.stdout.splitlines() if line.startswith("SOAK ")]
    assert summary, out
    fields = dict(kv.split("=") for kv in summary[0].split()[1:])
    assert fields["errors"] == "0" and fields["mismatches"] == "0", out
    assert fields["ops"] == fields["expected"] and int(fields["ops"]) > 0, out
    assert int(fields["signals"]) > 0, out
