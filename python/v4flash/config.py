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

``Config`` has one field per key of the core's summary (``_core.CONFIG_KEYS``, from the key
table in ``rust/config.rs``), plus ``raw``: nothing here lists the keys again.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Tuple, Union

from . import _core


def _to_json(self: Any) -> Dict[str, Any]:
    """The validated values under config.json's names: a config the core accepts as it is,
    describing the same model (``_core.config_json``)."""
    return _core.config_json({k: getattr(self, k) for k in _core.CONFIG_KEYS})


_DOC = """The validated model configuration, as ``_core.validate_config`` returns it: one field per
    key the engine reads, under config.json's names (``compress_ratios`` as written, one per
    layer then the drafter's; ``rope_scaling`` with its defaults filled in; the ``dspark_*``
    keys of a DSpark drafter, else None), ``layer_types`` one per layer, ``drafter`` None or
    ``{"kind": "mtp" | "dspark", "blocks": n}``, and ``raw`` the whole file as parsed."""

if TYPE_CHECKING:

    class Config:
        raw: Dict[str, Any]

        def __init__(self, **values: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        @property
        def n_layers(self) -> int: ...
        def to_json(self) -> Dict[str, Any]: ...

else:
    Config = make_dataclass(
        "Config",
        [(k, Any) for k in _core.CONFIG_KEYS]
        + [("raw", Dict[str, Any], field(default_factory=dict, repr=False, compare=False))],
        frozen=True,
        namespace={
            "__doc__": _DOC,
            "__module__": __name__,
            "n_layers": property(lambda self: self.num_hidden_layers),
            "to_json": _to_json,
        },
    )


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
