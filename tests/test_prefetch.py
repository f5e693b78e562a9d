"""The hash layers' experts are read ahead from the token ids, and those reads are used.

(A stronger form of tests/test_streaming.py::test_hash_layer_experts_are_prefetched, which
checks only that prefetches were issued.)"""

import json
import struct

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


def test_hash_layer_prefetches_are_exactly_the_routed_experts_and_all_are_used():
    cfg = v4flash.load_config(TINY_A)
    tables = [_tensor(TINY_A, f"layers.{i}.ffn.gate.tid2eid") for i in range(cfg.num_hash_layers)]
    m = v4flash.load(TINY_A)  # room for every expert: nothing prefetched is evicted
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
    m = v4flash.load(TINY_A, expert_cache_mb=0.2)  # 10 slots for 96 experts
    m.generate([0, 5, 9], max_new_tokens=4, stop_ids=[])
    s = m.stats()
    assert s["expert_prefetches"] > 0
    # read-aheads survive until their request (here: most); none is counted twice
    assert 0 < s["expert_prefetch_used"] <= s["expert_prefetches"]
    assert s["expert_prefetch_used"] <= s["expert_misses"]
