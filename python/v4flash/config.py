"""A checkpoint's ``config.json``, validated by the core's own validator (``rust/config.rs``
through ``_core.validate_config``): the engine loads with the same code, so Python and the
engine accept the same files and refuse the others with the same message, which names the key,
what was expected and what was found.

The file is read exactly as DeepSeek publishes it (legacy keys ``compress_ratios``,
``num_hash_layers``, ``qk_rope_head_dim``, ``rope_scaling``). Layer kinds are derived from
``compress_ratios`` the way DeepSeek's code reads them: 0 = sliding window, 4 = compressed
sparse attention (with the lightning indexer), any other m = heavily compressed attention with
ratio m. Entries of ``compress_ratios`` after the layers' belong to the drafter (0731's DSpark
stages; the first release's MTP block). Unknown keys are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _core


@dataclass(frozen=True)
class Config:
    """The validated model configuration (the fields the engine uses), as
    ``_core.validate_config`` returns it: ``compress_ratios`` as written (one per layer, then
    the drafter's), ``layer_types`` one per layer, ``drafter`` None or ``{"kind": "mtp" |
    "dspark", "blocks": n}``, the ``dspark_*`` keys of a DSpark drafter, ``rope_scaling`` with
    its defaults filled in, ``raw`` the whole file as parsed."""

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
    num_nextn_predict_layers: int = 0
    dspark_block_size: Optional[int] = None
    dspark_noise_token_id: Optional[int] = None
    dspark_target_layer_ids: Optional[List[int]] = None
    dspark_markov_rank: Optional[int] = None
    drafter: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_layers(self) -> int:
        return self.num_hidden_layers

    def to_json(self) -> Dict[str, Any]:
        """The validated values under config.json's names: a config the core accepts as it is,
        describing the same model."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k in ("layer_types", "drafter", "raw"):
            del d[k]
        d = {k: v for k, v in d.items() if not (k.startswith("dspark_") and v is None)}
        return {"model_type": "deepseek_v4", **d}


def validate(d: Any) -> Config:
    """Validates a parsed config.json (``V4FlashError`` naming the key) and derives the layer
    kinds."""
    return Config(**_core.validate_config(d))


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
    return Config(**_core.validate_config(str(p / "config.json")))


def expected_tensors(cfg: Config) -> Dict[str, Tuple[Tuple[str, ...], Tuple[int, ...]]]:
    """Every tensor the engine reads for ``cfg`` (not the drafter's ``mtp.*``): name ->
    (accepted dtypes, the published one first; exact shape). The loader's own table
    (``rust/checkpoint/expected.rs``), which it checks before reading any weight."""
    return {name: (dtypes, shape) for name, dtypes, shape in _core.expected_tensors(cfg.to_json())}


def drafter_tensors(cfg: Config) -> Dict[str, Tuple[Tuple[str, ...], Tuple[int, ...]]]:
    """The drafter's tensors (``mtp.*``) the config describes, as ``expected_tensors``: the
    first release's MTP block or 0731's DSpark stages; empty without a drafter."""
    return {name: (dtypes, shape) for name, dtypes, shape in _core.drafter_tensors(cfg.to_json())}
