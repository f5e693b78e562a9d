"""Validation of a checkpoint's ``config.json`` with messages that name the key.

The file is read exactly as DeepSeek publishes it (legacy keys ``compress_ratios``,
``num_hash_layers``, ``qk_rope_head_dim``, ``rope_scaling``). Layer kinds are derived from
``compress_ratios`` the way DeepSeek's code reads them: 0 = sliding window, 4 = compressed
sparse attention (with the lightning indexer), any other m = heavily compressed attention with
ratio m. Unknown keys are ignored. The Rust core re-checks what it relies on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ._core import V4FlashError

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"

_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_groups",
    "o_lora_rank",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "sliding_window",
    "hc_mult",
    "hc_sinkhorn_iters",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
)
_MAX_CONFIG_BYTES = 64 << 20

_POSITIVE_NUMBERS = (
    "routed_scaling_factor",
    "swiglu_limit",
    "rope_theta",
    "compress_rope_theta",
    "hc_eps",
    "rms_norm_eps",
)


@dataclass(frozen=True)
class Config:
    """The validated model configuration (the fields the engine uses)."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    sliding_window: int
    hc_mult: int
    hc_sinkhorn_iters: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    routed_scaling_factor: float
    swiglu_limit: float
    rope_theta: float
    compress_rope_theta: float
    hc_eps: float
    rms_norm_eps: float
    num_hash_layers: int
    compress_ratios: List[int]
    layer_types: List[str]
    bos_token_id: int = 0
    eos_token_id: int = 1
    max_position_embeddings: int = 1 << 20
    rope_scaling: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers


def _err(msg: str) -> V4FlashError:
    return V4FlashError(f"config.json: {msg}")


def _int(d: Dict[str, Any], key: str, *, positive: bool = True) -> int:
    if key not in d:
        raise _err(f'missing key "{key}"')
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise _err(f'"{key}" must be an integer, found {v!r}')
    if v < 0 or (positive and v == 0):
        raise _err(f'"{key}" must be {"positive" if positive else "non-negative"}, found {v}')
    return v


def _num(d: Dict[str, Any], key: str) -> float:
    if key not in d:
        raise _err(f'missing key "{key}"')
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _err(f'"{key}" must be a number, found {v!r}')
    if not math.isfinite(v) or v <= 0:
        raise _err(f'"{key}" must be a positive finite number, found {v}')
    return float(v)


def validate(d: Any) -> Config:
    """Validates a parsed config.json and derives the layer kinds."""
    if not isinstance(d, dict):
        raise _err("the top level must be a JSON object")
    mt = d.get("model_type")
    if mt is None:
        raise _err('missing key "model_type" (expected "deepseek_v4")')
    if mt != "deepseek_v4":
        raise _err(
            f'"model_type" is {mt!r}, expected "deepseek_v4" (v4flash runs DeepSeek V4 Flash only)'
        )
    vals: Dict[str, Any] = {k: _int(d, k) for k in _POSITIVE_INTS}
    vals.update({k: _num(d, k) for k in _POSITIVE_NUMBERS})
    n = vals["num_hidden_layers"]
    vals["num_hash_layers"] = _int(d, "num_hash_layers", positive=False)
    nextn = (
        _int(d, "num_nextn_predict_layers", positive=False)
        if "num_nextn_predict_layers" in d
        else 0
    )

    ratios = d.get("compress_ratios")
    if ratios is None:
        raise _err(
            'missing key "compress_ratios" '
            "(the per-layer attention kinds; v4flash never guesses them)"
        )
    if not isinstance(ratios, list):
        raise _err(f'"compress_ratios" must be a list of integers, found {type(ratios).__name__}')
    if len(ratios) not in (n, n + nextn):
        extra = f" or num_hidden_layers + num_nextn_predict_layers ({n + nextn})" if nextn else ""
        raise _err(
            f'"compress_ratios" has {len(ratios)} entries, expected num_hidden_layers ({n}){extra}'
        )
    layer_types = []
    for i, r in enumerate(ratios[:n]):
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise _err(f"compress_ratios[{i}] must be a non-negative integer, found {r!r}")
        layer_types.append(SLIDING if r == 0 else CSA if r == 4 else HCA)

    if vals["num_hash_layers"] > n:
        raise _err(f'"num_hash_layers" = {vals["num_hash_layers"]} exceeds num_hidden_layers = {n}')
    if vals["num_experts_per_tok"] > vals["n_routed_experts"]:
        raise _err(
            f'"num_experts_per_tok" = {vals["num_experts_per_tok"]} exceeds '
            f'"n_routed_experts" = {vals["n_routed_experts"]}'
        )
    if vals["num_attention_heads"] % vals["o_groups"]:
        raise _err(
            f'"num_attention_heads" = {vals["num_attention_heads"]} is not divisible by '
            f'"o_groups" = {vals["o_groups"]}'
        )
    rd = vals["qk_rope_head_dim"]
    if rd % 2 or rd > vals["head_dim"] or rd > vals["index_head_dim"]:
        raise _err(
            f'"qk_rope_head_dim" = {rd} must be even and at most head_dim ({vals["head_dim"]}) '
            f"and index_head_dim ({vals['index_head_dim']})"
        )
    for k in ("hidden_size", "moe_intermediate_size"):
        if vals[k] % 32:
            raise _err(f'"{k}" = {vals[k]} must be a multiple of 32 (FP4 expert scale blocks)')
    if d.get("num_key_value_heads", 1) != 1:
        raise _err(
            f'"num_key_value_heads" is {d["num_key_value_heads"]!r}, '
            "expected 1 (shared-KV attention)"
        )
    if d.get("scoring_func", "sqrtsoftplus") != "sqrtsoftplus":
        raise _err(f'"scoring_func" is {d["scoring_func"]!r}, expected "sqrtsoftplus"')
    if d.get("n_shared_experts", 1) != 1:
        raise _err(f'"n_shared_experts" is {d["n_shared_experts"]!r}, only 1 is supported')
    rs = d.get("rope_scaling")
    if rs is not None:
        if not isinstance(rs, dict):
            raise _err(f'"rope_scaling" must be an object, found {rs!r}')
        t = rs.get("type", rs.get("rope_type"))
        if t != "yarn":
            raise _err(f'"rope_scaling.type" is {t!r}, only "yarn" is supported')
        for k in ("factor", "original_max_position_embeddings"):
            try:
                _num(rs, k)
            except V4FlashError as e:
                raise _err(str(e).replace('config.json: "', '"rope_scaling.', 1)) from None
    mpe = _int(d, "max_position_embeddings") if "max_position_embeddings" in d else 1 << 20
    token_ids = {}
    for k, default in (("bos_token_id", 0), ("eos_token_id", 1)):
        tid = _int(d, k, positive=False) if k in d else default
        if tid >= vals["vocab_size"]:
            raise _err(f'"{k}" = {tid} is outside the vocabulary (vocab_size {vals["vocab_size"]})')
        token_ids[k] = tid
    return Config(
        **vals,
        compress_ratios=list(ratios[:n]),
        layer_types=layer_types,
        **token_ids,
        max_position_embeddings=mpe,
        rope_scaling=rs,
        raw=d,
    )


def load_config(model_dir: Union[str, Path]) -> Config:
    """Reads and validates ``model_dir/config.json``."""
    p = Path(model_dir)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such checkpoint directory")
    if not p.is_dir():
        raise ValueError(
            f"{p}: is a file, not a checkpoint directory "
            "(pass the folder holding config.json and the shards)"
        )
    cp = p / "config.json"
    if not cp.exists():
        raise FileNotFoundError(f"{cp}: no such file (every checkpoint ships a config.json)")
    if not cp.is_file():
        # a directory fails late and a FIFO would block the read forever
        raise _err(f"{cp} is not a regular file")
    size = cp.stat().st_size
    if size > _MAX_CONFIG_BYTES:
        raise _err(f"{size} bytes is implausibly large for a config (limit {_MAX_CONFIG_BYTES})")
    try:
        d = json.loads(cp.read_bytes())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digit limit
        raise _err(f"not valid JSON ({e})") from None
    except RecursionError:
        raise _err("not valid JSON (nested too deeply)") from None
    return validate(d)
