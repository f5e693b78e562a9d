"""The hash layers' experts are read ahead from the token ids, and those reads are used; the
learned-routing layers' experts are guessed ahead of their attention (look-ahead), which
changes no result.

(A stronger form of tests/test_streaming.py::test_hash_layer_experts_are_prefetched, which
checks only that prefetches were issued.)"""

import json
import struct
import time

import numpy as np

import v4flash
from conftest import FIXTURES

TINY_A = FIXTURES / "tiny-a"


def _tensor(root, name):
    """One tensor of a checkpoint, read from its shard (numpy dtypes only)."""
    shard = json.loads((root / "model.safetensors.index.json").read_text())["weight_map"][name]
    with open(root / shard, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))[name]
        b, e = meta["data_offsets"]
        f.seek(8 + n + b)
        data = f.read(e - b)
    dtype = {"I64": np.int64, "I32": np.int32}[meta["dtype"]]
    return np.frombuffer(data, dtype=dtype).reshape(meta["shape"])


def _load_warm(path, **kw):
    """A model whose expert cache is pre-faulted: while the pre-fault runs, the store keeps
    to the slots it has touched and a read-ahead never takes an untouched one, so the counts
    below hold for a warm cache (polled with a generous bound; it runs at idle priority)."""
    m = v4flash.load(path, **kw)
    slots = m.stats()["expert_slots"]
    deadline = time.monotonic() + 60
    while m.stats()["warm_slots"] < slots and time.monotonic() < deadline:
        time.sleep(0.02)
    assert m.stats()["warm_slots"] == slots, (m.stats()["warm_slots"], slots)
    return m


def test_hash_layer_prefetches_are_exactly_the_routed_experts_and_all_are_used(monkeypatch):
    monkeypatch.setenv("V4FLASH_LOOKAHEAD", "0")  # only the hash layers read ahead
    cfg = v4flash.load_config(TINY_A)
    tables = [_tensor(TINY_A, f"layers.{i}.ffn.gate.tid2eid") for i in range(cfg.num_hash_layers)]
    m = _load_warm(TINY_A)  # room for every expert: nothing prefetched is evicted
    prompt = [0, 5, 9]
    out = m.generate(prompt, max_new_tokens=4, stop_ids=[])
    forwarded = prompt + out[:-1]  # the last sampled token is never run through the model
    routed = {(i, int(e)) for i, t in enumerate(tables) for tok in forwarded for e in t[tok]}
    s = m.stats()
    # every hash-layer expert is read ahead once (the first time a token routes to it) ...
    assert s["expert_prefetches"] == len(routed) > 0
    # ... and each of those reads is what served its request
    assert s["expert_prefetch_used"] == s["expert_prefetches"]
    assert s["expert_prefetch_used"] <= s["expert_misses"]


def test_prefetches_are_used_under_cache_pressure():
    m = _load_warm(TINY_A, expert_cache_mb=0.2)  # 10 slots for 96 experts
    m.generate([0, 5, 9], max_new_tokens=4, stop_ids=[])
    s = m.stats()
    assert s["expert_prefetches"] > 0
    # read-aheads survive until their request (here: most); none is counted twice
    assert 0 < s["expert_prefetch_used"] <= s["expert_prefetches"]
    assert s["expert_prefetch_used"] <= s["expert_misses"]


def _run(monkeypatch, lookahead, **kw):
    monkeypatch.setenv("V4FLASH_LOOKAHEAD", lookahead)
    m = _load_warm(TINY_A, **kw)
    prompt = [0, 5, 9, 17, 33, 2, 8, 100, 7, 21]
    logits = m.logits(prompt)
    out = m.generate(prompt, max_new_tokens=6, stop_ids=[])
    return m, logits, out


def test_lookahead_guesses_learned_layers_experts_and_changes_no_result(monkeypatch):
    cfg = v4flash.load_config(TINY_A)
    assert cfg.num_hash_layers < cfg.num_hidden_layers, "tiny-a must have learned-routing layers"
    for kw in ({}, {"expert_cache_mb": 0.2}):
        off, logits_off, out_off = _run(monkeypatch, "0", **kw)
        on, logits_on, out_on = _run(monkeypatch, "1", **kw)
        assert np.array_equal(logits_on, logits_off), kw
        assert out_on == out_off, kw
        s, s0 = on.stats(), off.stats()
        assert s["lookahead"] and not s0["lookahead"]
        assert s0["lookahead_guessed"] == 0 and s0["lookahead_needed"] == 0
        # every forward pass of every learned layer guessed: at least one expert each
        passes = 2 + 6 - 1  # logits, the prompt of generate, then one per new token but the last
        assert s["lookahead_guessed"] >= passes * (cfg.num_hidden_layers - cfg.num_hash_layers)
        assert 0 < s["lookahead_guessed_used"] <= min(s["lookahead_guessed"], s["lookahead_needed"])
        # the guesses were read ahead (beyond the hash layers' reads, which off also makes)
        assert s["expert_prefetches"] > s0["expert_prefetches"], kw


def test_a_long_prompts_hash_layer_prefetches_do_not_evict_each_other(monkeypatch):
    """Every hash layer's experts are known from the ids, but the cache holds only a few: the
    read-aheads share half the cache in layer order, and the rest of a layer's are read while
    the layer before computes its last experts. None is evicted before its request (before
    the shared budget, each layer took half the cache and the later ones evicted the first's)."""
    monkeypatch.setenv("V4FLASH_LOOKAHEAD", "0")  # only the hash layers read ahead
    cfg = v4flash.load_config(TINY_A)
    assert cfg.num_hash_layers >= 2
    m = _load_warm(TINY_A, expert_cache_mb=0.3)  # 15 slots for 96 experts
    m.logits(list(range(3, 60)))  # each hash layer routes these tokens to most of its experts
    s = m.stats()
    # measured before the shared budget: 15 read ahead, 7 used; now 35 of 35
    assert s["expert_prefetch_used"] == s["expert_prefetches"], s
    # more than the cache holds: the later layers' were read while the one before computed
    assert s["expert_prefetches"] > s["expert_slots"], s


def test_a_layer_larger_than_the_cache_reads_its_next_wave_into_the_slots_it_frees(monkeypatch):
    """A learned-routing layer that needs more experts than the cache holds runs in waves.
    Each expert's slot is given back as soon as its output is computed, and the next wave's
    experts are read into it, so the next wave's reads overlap this one's compute. Without
    the look-ahead, only the hash layers would otherwise read ahead: at most their distinct
    experts, counted here from their tables."""
    monkeypatch.setenv("V4FLASH_LOOKAHEAD", "0")
    cfg = v4flash.load_config(TINY_A)
    assert cfg.num_hash_layers < cfg.num_hidden_layers, "tiny-a must have learned-routing layers"
    prompt = list(range(3, 60))
    tables = [_tensor(TINY_A, f"layers.{i}.ffn.gate.tid2eid") for i in range(cfg.num_hash_layers)]
    hash_distinct = sum(len({int(e) for tok in prompt for e in t[tok]}) for t in tables)
    m = _load_warm(TINY_A, expert_cache_mb=0.2)  # 10 slots for 16 experts a layer
    assert m.stats()["expert_slots"] < cfg.n_routed_experts
    logits = m.logits(prompt)
    s = m.stats()
    assert s["expert_prefetches"] > hash_distinct, (s, hash_distinct)
    # every read-ahead served its request: none evicted before its wave came
    assert s["expert_prefetch_used"] == s["expert_prefetches"], s
    # and no result depends on it
    big = _load_warm(TINY_A)
    np.testing.assert_array_equal(logits, big.logits(prompt))
