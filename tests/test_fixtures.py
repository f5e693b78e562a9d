"""Checks on the committed fixture files themselves (fixtures/README.md).

Only numpy, safetensors, json and tokenizers: CI has no torch.  These tests do not run
the engine; they make sure the checkpoints are shaped exactly like the real
DeepSeek-V4-Flash releases (tiny-a: the first release with its MTP block; tiny-b: the 0731
release with its three-stage DSpark drafter) and that the stored references are
self-consistent.  The rules here are written independently of fixtures/make_fixtures.py.
"""

from __future__ import annotations

import json
import math
import struct
from functools import cache
from pathlib import Path

import numpy as np
import pytest

FIXTURES_DIR = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURES = ["tiny-a", "tiny-b"]
# Which release each fixture is shaped like: "first" (deepseek-ai/DeepSeek-V4-Flash, one MTP
# block) or "0731" (deepseek-ai/DeepSeek-V4-Flash-0731, the DSpark drafter).
RELEASE = {"tiny-a": "first", "tiny-b": "0731"}

# Every key of the published config.json (docs/checkpoint.md §2.1).
REAL_CONFIG_KEYS = {
    "architectures",
    "attention_bias",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "expert_dtype",
    "hc_eps",
    "hc_mult",
    "hc_sinkhorn_iters",
    "head_dim",
    "hidden_act",
    "hidden_size",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
    "initializer_range",
    "max_position_embeddings",
    "model_type",
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "norm_topk_prob",
    "num_attention_heads",
    "num_experts_per_tok",
    "num_hidden_layers",
    "num_hash_layers",
    "num_key_value_heads",
    "num_nextn_predict_layers",
    "o_groups",
    "o_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "quantization_config",
    "rms_norm_eps",
    "rope_scaling",
    "rope_theta",
    "routed_scaling_factor",
    "scoring_func",
    "sliding_window",
    "swiglu_limit",
    "tie_word_embeddings",
    "topk_method",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "vocab_size",
    "compress_rope_theta",
    "compress_ratios",
}
# The keys 0731 adds (every other key keeps the first release's value, except compress_ratios,
# which has one entry per drafter stage instead of the MTP entry).
DSPARK_KEYS = [
    "dspark_block_size",
    "dspark_noise_token_id",
    "dspark_target_layer_ids",
    "dspark_markov_rank",
]
DSPARK_STAGES = 3

DTYPE_SIZE = {"F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "BF16": 2, "F32": 4, "I64": 8}
SPECIAL_LOW = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
SPECIAL_HIGH = [
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜latest_reminder｜>",
]


def _e4m3_table():
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m / 8.0 * 2.0**-6
        else:
            t[b] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


# ------------------------------------------------------------------------------------------
# Loading
# ------------------------------------------------------------------------------------------
@cache
def config(name):
    return json.loads((FIXTURES_DIR / name / "config.json").read_text())


@cache
def index(name):
    return json.loads((FIXTURES_DIR / name / "model.safetensors.index.json").read_text())


@cache
def shard(name, fname):
    """Parse a safetensors file by hand (numpy has no F8 dtypes).

    Returns {tensor: (dtype, shape, bytes)}.
    """
    raw = (FIXTURES_DIR / name / fname).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n :]
    spans = sorted(tuple(v["data_offsets"]) for v in header.values())
    pos = 0
    for a, b in spans:  # contiguous, non-overlapping, covering the whole buffer
        assert a == pos, f"{fname}: gap/overlap at {a}"
        pos = b
    assert pos == len(data), f"{fname}: trailing bytes"
    out = {}
    for k, v in header.items():
        a, b = v["data_offsets"]
        shape = tuple(v["shape"])
        assert b - a == DTYPE_SIZE[v["dtype"]] * math.prod(shape), k
        out[k] = (v["dtype"], shape, data[a:b])
    return out


@cache
def tensors(name):
    out = {}
    for fname in sorted(set(index(name)["weight_map"].values())):
        for k, v in shard(name, fname).items():
            assert k not in out, f"{k} stored twice"
            out[k] = v
    return out


def as_array(t):
    dtype, shape, data = t
    np_dtype = {
        "F8_E4M3": np.uint8,
        "F8_E8M0": np.uint8,
        "I8": np.int8,
        "BF16": np.uint16,
        "F32": np.float32,
        "I64": np.int64,
    }[dtype]
    a = np.frombuffer(data, dtype=np_dtype).reshape(shape)
    if dtype == "BF16":
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a


@cache
def ref(name):
    return json.loads((FIXTURES_DIR / f"{name}.ref.json").read_text())


@cache
def ref_arrays(name):
    with np.load(FIXTURES_DIR / f"{name}.ref.npz") as z:
        return {k: z[k] for k in z.files}


# ------------------------------------------------------------------------------------------
# Expected tensor inventory, derived from config.json the way the real checkpoint is laid out
# ------------------------------------------------------------------------------------------
def is_0731(cfg):
    return "dspark_target_layer_ids" in cfg


def expected_tensors(cfg):
    H, V, NH, D = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"], cfg["head_dim"]
    QL, G, R = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
    E, K, I = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]  # noqa: E741
    HC, IH, ID = cfg["hc_mult"], cfg["index_n_heads"], cfg["index_head_dim"]
    L, ratios = cfg["num_hidden_layers"], cfg["compress_ratios"]
    IS = I * cfg["n_shared_experts"]
    exp = {}

    def fp8(name, out, inn):
        exp[name + ".weight"] = ("F8_E4M3", (out, inn))
        exp[name + ".scale"] = ("F8_E8M0", (math.ceil(out / 128), math.ceil(inn / 128)))

    def fp4(name, out, inn):
        exp[name + ".weight"] = ("I8", (out, inn // 2))
        exp[name + ".scale"] = ("F8_E8M0", (out, inn // 32))

    def hc(prefix, rows, nscale):
        exp[prefix + "_fn"] = ("F32", (rows, HC * H))
        exp[prefix + "_base"] = ("F32", (rows,))
        exp[prefix + "_scale"] = ("F32", (nscale,))

    def block(p, ratio, is_hash):
        exp[p + "attn.attn_sink"] = ("F32", (NH,))
        exp[p + "attn.q_norm.weight"] = ("BF16", (QL,))
        exp[p + "attn.kv_norm.weight"] = ("BF16", (D,))
        fp8(p + "attn.wq_a", QL, H)
        fp8(p + "attn.wq_b", NH * D, QL)
        fp8(p + "attn.wkv", D, H)
        fp8(p + "attn.wo_a", G * R, NH * D // G)
        fp8(p + "attn.wo_b", H, G * R)
        if ratio != 0:
            coff = 2 if ratio == 4 else 1  # CSA windows overlap: two series
            exp[p + "attn.compressor.ape"] = ("F32", (ratio, coff * D))
            exp[p + "attn.compressor.norm.weight"] = ("BF16", (D,))
            exp[p + "attn.compressor.wkv.weight"] = ("BF16", (coff * D, H))
            exp[p + "attn.compressor.wgate.weight"] = ("BF16", (coff * D, H))
        if ratio == 4:
            exp[p + "attn.indexer.compressor.ape"] = ("F32", (4, 2 * ID))
            exp[p + "attn.indexer.compressor.norm.weight"] = ("BF16", (ID,))
            exp[p + "attn.indexer.compressor.wkv.weight"] = ("BF16", (2 * ID, H))
            exp[p + "attn.indexer.compressor.wgate.weight"] = ("BF16", (2 * ID, H))
            exp[p + "attn.indexer.weights_proj.weight"] = ("BF16", (IH, H))
            fp8(p + "attn.indexer.wq_b", IH * ID, QL)
        exp[p + "ffn.gate.weight"] = ("BF16", (E, H))
        if is_hash:
            exp[p + "ffn.gate.tid2eid"] = ("I64", (V, K))
        else:
            exp[p + "ffn.gate.bias"] = ("F32", (E,))
        for e in range(E):
            fp4(p + f"ffn.experts.{e}.w1", I, H)
            fp4(p + f"ffn.experts.{e}.w2", H, I)
            fp4(p + f"ffn.experts.{e}.w3", I, H)
        fp8(p + "ffn.shared_experts.w1", IS, H)
        fp8(p + "ffn.shared_experts.w2", H, IS)
        fp8(p + "ffn.shared_experts.w3", IS, H)
        exp[p + "attn_norm.weight"] = ("BF16", (H,))
        exp[p + "ffn_norm.weight"] = ("BF16", (H,))
        hc(p + "hc_attn", (2 + HC) * HC, 3)
        hc(p + "hc_ffn", (2 + HC) * HC, 3)

    exp["embed.weight"] = ("BF16", (V, H))
    exp["head.weight"] = ("BF16", (V, H))
    exp["norm.weight"] = ("BF16", (H,))
    hc("hc_head", HC, 1)
    for i in range(L):
        block(f"layers.{i}.", ratios[i], i < cfg["num_hash_layers"])
    if is_0731(cfg):
        # DSpark: each stage is a block without compressor or indexer (entry 0), learned routing;
        # mtp.0 takes the target layers' hidden states in, the last stage has the output side.
        MR = cfg["dspark_markov_rank"]
        n = len(ratios) - L
        for s in range(n):
            p = f"mtp.{s}."
            block(p, ratios[L + s], False)
            if s == 0:
                fp8(p + "main_proj", H, len(cfg["dspark_target_layer_ids"]) * H)
                exp[p + "main_norm.weight"] = ("BF16", (H,))
            if s == n - 1:
                exp[p + "norm.weight"] = ("BF16", (H,))
                hc(p + "hc_head", HC, 1)
                exp[p + "markov_head.markov_w1.weight"] = ("BF16", (V, MR))
                exp[p + "markov_head.markov_w2.weight"] = ("BF16", (V, MR))
                exp[p + "confidence_head.proj.weight"] = ("BF16", (1, H + MR))
        return exp
    for m in range(cfg["num_nextn_predict_layers"]):
        p = f"mtp.{m}."
        block(p, ratios[L + m], False)
        fp8(p + "e_proj", H, H)
        fp8(p + "h_proj", H, H)
        for n in ("enorm", "hnorm", "norm"):
            exp[p + n + ".weight"] = ("BF16", (H,))
        hc(p + "hc_head", HC, 1)
    return exp


def drafter_blocks(cfg):
    """mtp.* blocks: the first release's MTP block(s), or 0731's DSpark stages."""
    return len(cfg["compress_ratios"]) - cfg["num_hidden_layers"]


params = pytest.mark.parametrize("name", FIXTURES)


# ------------------------------------------------------------------------------------------
# config.json
# ------------------------------------------------------------------------------------------
@params
def test_config_has_real_keys(name):
    cfg = config(name)
    if RELEASE[name] == "0731":
        assert set(cfg) == REAL_CONFIG_KEYS | set(DSPARK_KEYS)
        assert is_0731(cfg)
    else:
        assert set(cfg) == REAL_CONFIG_KEYS
        assert not any(k.startswith("dspark") for k in cfg)
    assert cfg["model_type"] == "deepseek_v4"
    assert cfg["expert_dtype"] == "fp4"
    assert cfg["quantization_config"] == {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
    }
    assert cfg["rope_scaling"]["type"] == "yarn"
    assert cfg["num_key_value_heads"] == 1 and cfg["num_nextn_predict_layers"] == 1
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (0, 1)
    L = cfg["num_hidden_layers"]
    ratios = cfg["compress_ratios"]
    if RELEASE[name] == "0731":
        assert len(ratios) == L + DSPARK_STAGES, "one entry per layer plus one per drafter stage"
        assert ratios[L:] == [0] * DSPARK_STAGES
    else:
        assert len(ratios) == L + 1, "one entry per layer plus the MTP entry"
        assert ratios[-1] == 0
    assert 0 < cfg["num_hash_layers"] < L
    assert cfg["qk_rope_head_dim"] < cfg["head_dim"]
    assert cfg["qk_rope_head_dim"] < cfg["index_head_dim"]


def test_0731_config_keys():
    """tiny-b's dspark_* keys: the real values scaled down, after the first release's keys."""
    for name in FIXTURES:
        if RELEASE[name] != "0731":
            continue
        cfg = config(name)
        L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
        first = [k for k in config("tiny-a")]  # the first release's key order
        assert list(cfg) == first + DSPARK_KEYS
        assert cfg["num_nextn_predict_layers"] == 1  # unchanged in 0731
        assert cfg["dspark_block_size"] == 5
        assert cfg["dspark_target_layer_ids"] == list(range(L - 3, L)), "the last three layers"
        assert cfg["dspark_markov_rank"] == 16
        noise = cfg["dspark_noise_token_id"]
        assert isinstance(noise, int) and 0 <= noise < V
        assert len(SPECIAL_LOW) <= noise < V - len(SPECIAL_HIGH), "noise id: not a special token"


@params
def test_config_exercises_every_layer_kind(name):
    cfg = config(name)
    ratios = cfg["compress_ratios"][: cfg["num_hidden_layers"]]
    assert 0 in ratios and 4 in ratios
    hca = {r for r in ratios if r not in (0, 4)}
    assert len(hca) == 1
    (m,) = hca
    # HCA windows close inside the longest prompt; CSA has more entries than index_topk.
    longest = max(len(c["ids"]) for c in ref(name)["cases"])
    assert longest // m >= 2
    assert longest // 4 > cfg["index_topk"]
    assert longest > 4 * cfg["sliding_window"]


# ------------------------------------------------------------------------------------------
# Tensors
# ------------------------------------------------------------------------------------------
@params
def test_tensor_inventory_matches_config(name):
    exp = expected_tensors(config(name))
    got = {k: (v[0], v[1]) for k, v in tensors(name).items()}
    assert sorted(set(exp) - set(got)) == []
    assert sorted(set(got) - set(exp)) == []
    for k in exp:
        assert got[k] == exp[k], k


@params
def test_drafter_tensors_and_shards(name):
    """0731: three DSpark stages, each in its own shard at the end, holding only mtp.S.*; no MTP
    tensors.  First release: one MTP block with e_proj/h_proj/enorm/hnorm."""
    cfg = config(name)
    E = cfg["n_routed_experts"]
    wm = index(name)["weight_map"]
    files = sorted(set(wm.values()))
    mtp = [k for k in wm if k.startswith("mtp.")]
    mtp_only = ("e_proj", "h_proj", "enorm", "hnorm")
    if RELEASE[name] != "0731":
        assert {k.split(".")[1] for k in mtp} == {"0"}
        assert all(f"mtp.0.{n}.weight" in wm for n in mtp_only)
        return
    assert not [k for k in mtp if k.split(".")[2] in mtp_only], "no MTP tensors in 0731"
    n = DSPARK_STAGES
    assert len(files) > n
    main_files = set(files[:-n])
    assert all(not k.startswith("mtp.") for k, f in wm.items() if f in main_files)
    for s, f in enumerate(files[-n:]):
        assert {k for k, v in wm.items() if v == f} == {
            k for k in mtp if k.startswith(f"mtp.{s}.")
        }, f"{f} must hold mtp.{s}.* and nothing else"
    # Tensor counts per stage: a block is 29 + 6 E tensors (1,565 with the real 256 experts);
    # mtp.0 adds main_proj (+ scale) and main_norm, the last stage 7 output-side tensors.
    block = 29 + 6 * E
    assert 29 + 6 * 256 == 1565
    counts = [sum(k.startswith(f"mtp.{s}.") for k in mtp) for s in range(n)]
    assert counts == [block + 3, block, block + 7]  # real: 1,568 / 1,565 / 1,572
    t = tensors(name)
    H, V, MR = cfg["hidden_size"], cfg["vocab_size"], cfg["dspark_markov_rank"]
    assert t["mtp.0.main_proj.weight"][:2] == ("F8_E4M3", (H, 3 * H))
    assert t["mtp.0.main_proj.scale"][:2] == ("F8_E8M0", (-(-H // 128), -(-3 * H // 128)))
    assert t["mtp.2.markov_head.markov_w1.weight"][:2] == ("BF16", (V, MR))
    assert t["mtp.2.confidence_head.proj.weight"][:2] == ("BF16", (1, H + MR))
    for s in range(n):  # sliding-window blocks: no compressor, no indexer; learned routing
        assert not [k for k in mtp if k.startswith(f"mtp.{s}.attn.") and "compressor" in k]
        assert not [k for k in mtp if k.startswith(f"mtp.{s}.attn.indexer")]
        assert f"mtp.{s}.ffn.gate.bias" in wm and f"mtp.{s}.ffn.gate.tid2eid" not in wm


@params
def test_index_json_consistent(name):
    idx = index(name)
    wm = idx["weight_map"]
    files = sorted(set(wm.values()))
    n = len(files)
    assert n >= 2
    assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    on_disk = sorted(p.name for p in (FIXTURES_DIR / name).glob("*.safetensors"))
    assert on_disk == files
    total = 0
    for f in files:
        stored = shard(name, f)
        assert {k for k, v in wm.items() if v == f} == set(stored)
        total += sum(len(v[2]) for v in stored.values())
    assert idx["metadata"]["total_size"] == total


@params
def test_safetensors_library_reads_headers(name):
    from safetensors import safe_open

    for f in sorted(set(index(name)["weight_map"].values())):
        with safe_open(str(FIXTURES_DIR / name / f), framework="numpy") as st:
            assert set(st.keys()) == set(shard(name, f))
            assert st.metadata() == {"format": "pt"}


@params
def test_scales_are_valid_e8m0(name):
    for k, t in tensors(name).items():
        if t[0] == "F8_E8M0":
            s = as_array(t)
            assert not (s == 255).any(), f"{k}: E8M0 byte 255 is NaN"
            assert s.min() > 80 and s.max() < 150, f"{k}: implausible exponent"


@params
def test_fp8_weights_and_block_scales(name):
    partial = varied = 0
    for k, t in tensors(name).items():
        if t[0] != "F8_E4M3":
            continue
        q = as_array(t)
        s = as_array(tensors(name)[k[: -len("weight")] + "scale"])
        out, inn = q.shape
        assert s.shape == (math.ceil(out / 128), math.ceil(inn / 128))
        w = E4M3[q]
        assert np.isfinite(w).all(), f"{k}: E4M3 NaN byte"
        partial += (out % 128 != 0) + (inn % 128 != 0)
        # Each 128x128 block (partial at the edges) uses the tightest power-of-two scale.
        for i in range(s.shape[0]):
            for j in range(s.shape[1]):
                blk = np.abs(w[i * 128 : (i + 1) * 128, j * 128 : (j + 1) * 128]).max()
                assert 224 <= blk <= 448, (k, i, j, blk)
        varied += len(np.unique(s)) > 1
    assert partial > 0, "no FP8 tensor has a partial edge block"
    assert varied > 0, "no FP8 tensor has blocks with different scales"


@params
def test_fp4_expert_packing(name):
    cfg = config(name)
    n = 0
    for k, t in tensors(name).items():
        if ".experts." not in k or not k.endswith(".weight"):
            continue
        assert t[0] == "I8"
        p = as_array(t).view(np.uint8)
        s = as_array(tensors(name)[k[: -len("weight")] + "scale"])
        rows, half = p.shape
        assert s.shape == (rows, 2 * half // 32)
        codes = np.empty((rows, 2 * half), dtype=np.uint8)
        codes[:, 0::2], codes[:, 1::2] = p & 0xF, p >> 4  # low nibble = even column
        w = E2M1[codes] * np.repeat(np.exp2(s.astype(np.float64) - 127), 32, axis=1)
        blocks = np.abs(w).reshape(rows, -1, 32).max(axis=2) / np.exp2(s.astype(float) - 127)
        assert (blocks >= 3).all() and (blocks <= 6).all(), k  # tightest power-of-two scale
        n += 1
    assert n == 3 * cfg["n_routed_experts"] * (cfg["num_hidden_layers"] + drafter_blocks(cfg))


@params
def test_float_tensors_are_sane(name):
    t = tensors(name)
    for k, v in t.items():
        if v[0] in ("BF16", "F32"):
            a = as_array(v)
            assert np.isfinite(a).all(), k
            assert np.abs(a).max() > 0, f"{k} is all zeros"
        if k.endswith(("norm.weight",)):
            a = as_array(v)
            assert abs(float(a.mean()) - 1.0) < 0.1 and a.std() > 0.01, k
        if k.endswith(("attn_sink", ".ape", "gate.bias", "_base")):
            assert (as_array(v) != 0).mean() > 0.9, f"{k} should be non-trivial"


@params
def test_tid2eid_rows(name):
    cfg = config(name)
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    found = 0
    for k, v in tensors(name).items():
        if k.endswith("tid2eid"):
            a = as_array(v)
            assert a.shape == (cfg["vocab_size"], K)
            assert a.min() >= 0 and a.max() < E
            srt = np.sort(a, axis=1)
            assert (np.diff(srt, axis=1) > 0).all(), f"{k}: repeated expert in a row"
            found += 1
    assert found == cfg["num_hash_layers"]


# ------------------------------------------------------------------------------------------
# References
# ------------------------------------------------------------------------------------------
@params
def test_reference_metadata(name):
    r = ref(name)
    assert r["fixture"] == name
    g = r["generator"]
    assert g["torch"] == "2.13.0" and g["transformers"] == "5.23.0"
    assert g["script"] == "fixtures/make_fixtures.py"
    assert isinstance(g["seed"], int) and isinstance(g["redraws"], int)
    assert len(r["cases"]) >= 4
    lengths = [len(c["ids"]) for c in r["cases"]]
    assert len(set(lengths)) == len(lengths)
    assert set(ref_arrays(name)) == {
        f"{c['name']}.{kind}" for c in r["cases"] for kind in ("logits", "greedy_logits")
    }


@params
def test_reference_cases_self_consistent(name):
    r, arrays, V = ref(name), ref_arrays(name), config(name)["vocab_size"]
    guards = r["guards"]
    for c in r["cases"]:
        ids, S = c["ids"], len(c["ids"])
        assert all(0 <= i < V for i in ids)
        logits = arrays[f"{c['name']}.logits"]
        assert logits.dtype == np.float32 and logits.shape == (S, V)
        assert np.isfinite(logits).all()
        assert c["top1"] == logits.argmax(axis=-1).tolist()
        k = c["topk"]
        assert k == 8
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
        assert c["topk_ids"] == order.tolist()
        np.testing.assert_array_equal(
            np.array(c["topk_logits"], dtype=np.float32), np.take_along_axis(logits, order, -1)
        )
        assert c["max_abs_logit"] == pytest.approx(float(np.abs(logits).max()), rel=1e-6)
        top2 = np.sort(logits, axis=-1)[:, -2:]
        margin = (top2[:, 1] - top2[:, 0]) / np.abs(logits).max(axis=-1)
        assert margin.min() >= guards["logit_rel_margin_min"]

        new = c["greedy_new"]
        glog = arrays[f"{c['name']}.greedy_logits"]
        assert 8 <= len(new) <= 16
        assert glog.dtype == np.float32 and glog.shape == (len(new), V)
        assert glog.argmax(axis=-1).tolist() == new
        assert new[0] == c["top1"][-1], "first greedy token = teacher-forced top1 at the end"
        assert 1 not in new, "greedy continuation must not contain EOS"
        g2 = np.sort(glog, axis=-1)[:, -2:]
        assert float((g2[:, 1] - g2[:, 0]).min()) == pytest.approx(c["greedy_min_margin"])
        g_rel = (g2[:, 1] - g2[:, 0]) / np.abs(glog).max(axis=-1)
        assert g_rel.min() >= guards["logit_rel_margin_min"]
        np.testing.assert_allclose(glog[0], logits[-1], rtol=0, atol=1e-4 * c["max_abs_logit"])

        a = c["agreement"]
        tol = guards["agreement_rel_tol"] * c["max_abs_logit"]
        for key in ("nocache_vs_prefill_decode", "nocache_vs_chunked", "nocache_vs_generate"):
            assert 0 <= a[key] <= tol, (c["name"], key)
        assert sum(a["chunks"]) == S and all(n > 0 for n in a["chunks"])
        if S > 4:
            assert len(set(a["chunks"])) >= 2, "chunks of unequal size"

        for key, lim in (
            ("router_min_rel_gap", "router_rel_gap_min"),
            ("indexer_min_rel_gap", "indexer_rel_gap_min"),
        ):
            assert c[key] is None or c[key] >= guards[lim]


@params
def test_reference_exercises_the_indexer_and_clamp(name):
    r = ref(name)
    longest = max(r["cases"], key=lambda c: len(c["ids"]))
    assert longest["indexer_boundary_rows"] > 0, "indexer top-k never had to choose"
    counts = r["swiglu_clamp_active"]["counts"]
    for k in ("routed_gate", "routed_up", "shared_gate", "shared_up"):
        assert counts[k] > 0, f"SwiGLU clamp {k} never active"


# ------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------
@params
def test_tokenizer(name):
    from tokenizers import Tokenizer

    cfg = config(name)
    V = cfg["vocab_size"]
    tok = Tokenizer.from_file(str(FIXTURES_DIR / name / "tokenizer.json"))
    assert tok.get_vocab_size() == V
    for i, t in enumerate(SPECIAL_LOW):
        assert tok.token_to_id(t) == i
    for j, t in enumerate(SPECIAL_HIGH):
        assert tok.token_to_id(t) == V - len(SPECIAL_HIGH) + j
    tc = json.loads((FIXTURES_DIR / name / "tokenizer_config.json").read_text())
    assert tok.token_to_id(tc["bos_token"]) == cfg["bos_token_id"]
    assert tok.token_to_id(tc["eos_token"]) == cfg["eos_token_id"]
    assert tok.token_to_id(tc["pad_token"]) == 2
    for sid, entry in tc["added_tokens_decoder"].items():
        assert tok.token_to_id(entry["content"]) == int(sid)

    text = "<｜begin▁of▁sentence｜><｜User｜>Hello 東京 😀<｜Assistant｜></think>"
    enc = tok.encode(text, add_special_tokens=False)
    assert enc.ids[:2] == [0, V - 6] and enc.ids[-2:] == [V - 5, V - 3]
    assert tok.decode(enc.ids, skip_special_tokens=False) == text
    assert tok.encode("Hello", add_special_tokens=False).ids == tok.encode("Hello").ids
    assert max(tok.encode(text).ids) < V
