"""Types of the Rust extension ``v4flash._core`` (rust/python/); checked against the built
module by ``python3 -m mypy.stubtest v4flash._core`` in CI. The public API is ``v4flash.load``
and friends (model.py), which check arguments before they reach these functions."""

from os import PathLike
from typing import Any, Callable, Sequence, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "__version__",
    "V4FlashError",
    "NUMERICS",
    "PUBLISHED_CONFIG",
    "CONFIG_KEYS",
    "kernel_tier",
    "bf16_products",
    "fast_products",
    "open_checkpoint",
    "inspect_checkpoint",
    "validate_config",
    "config_json",
    "expected_tensors",
    "drafter_tensors",
    "is_routed_expert",
    "is_drafter",
    "published_config",
    "sample_params",
    "plan",
    "mem_read_gbs",
    "disk_read_gbs",
    "fma_peak_gflops",
    "Model",
    "Session",
    "Snapshot",
    "Stream",
]

_Path = str | PathLike[str]

__version__: str
NUMERICS: tuple[str, ...]
PUBLISHED_CONFIG: str
CONFIG_KEYS: tuple[str, ...]

class V4FlashError(Exception):
    """A checkpoint or config that v4flash cannot use."""

def kernel_tier() -> str: ...
def bf16_products() -> bool: ...
def fast_products() -> str: ...
def open_checkpoint(path: _Path) -> int: ...
def validate_config(source: _Path | dict[str, Any]) -> dict[str, Any]: ...
def config_json(summary: dict[str, Any]) -> dict[str, Any]: ...
def expected_tensors(
    source: _Path | dict[str, Any],
) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]: ...
def drafter_tensors(
    source: _Path | dict[str, Any],
) -> list[tuple[str, tuple[str, ...], tuple[int, ...]]]: ...
def is_routed_expert(name: str) -> bool: ...
def is_drafter(name: str) -> bool: ...
def published_config(release: str) -> dict[str, Any]: ...
def inspect_checkpoint(path: _Path) -> dict[str, Any]: ...
def sample_params(
    temperature: Any = None, top_p: Any = None, top_k: Any = None, seed: Any = None
) -> tuple[float, float, int, int]: ...
def plan(
    path: _Path,
    ram_bytes: int | None = None,
    ctx: int | None = None,
    expert_cache_bytes: int | None = None,
) -> dict[str, int]: ...
def mem_read_gbs(nbytes: int = ..., threads: int | None = None, reps: int = 3) -> float: ...
def disk_read_gbs(path: _Path, nbytes: int = ..., readers: int = ...) -> tuple[float, bool]: ...
def fma_peak_gflops(threads: int | None = None) -> float: ...

@final
class Model:
    @staticmethod
    def load(
        path: _Path,
        threads: int | None = None,
        expert_cache_bytes: int | None = None,
        ctx: int | None = None,
        ram_bytes: int | None = None,
        io: str = "direct",
        policy: str = "freq-decay",
        io_threads: int = 8,
        numerics: str = "exact",
    ) -> Model: ...
    def plan(self) -> dict[str, int]: ...
    @property
    def io_mode(self) -> str: ...
    @property
    def numerics(self) -> str: ...
    @property
    def policy(self) -> str: ...
    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]: ...
    def read_experts(self, layer: int, experts: Sequence[int]) -> float: ...
    def _layer_probe(
        self, layer: int, ids: Sequence[int], x: npt.NDArray[np.float32] | None = None
    ) -> tuple[npt.NDArray[np.float32], list[list[int]] | None]: ...
    def _probe_logits(
        self, x: npt.NDArray[np.float32], rows: Sequence[int]
    ) -> npt.NDArray[np.float32]: ...
    def session(self) -> Session: ...
    def load_session(self, path: _Path) -> tuple[Session, str | None]: ...
    @property
    def ctx(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def resident_bytes(self) -> int: ...
    @property
    def expert_bytes(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...

@final
class Session:
    @property
    def position(self) -> int: ...
    @property
    def tokens(self) -> list[int]: ...
    def feed(self, ids: Sequence[int], progress: Callable[[int], object] | None = None) -> None: ...
    def generate(
        self,
        ids: Sequence[int],
        max_new: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int,
        stop_ids: Sequence[int],
    ) -> list[int]: ...
    def stream(
        self,
        ids: Sequence[int],
        max_new: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int,
        stop_ids: Sequence[int],
    ) -> Stream: ...
    def snapshot(self) -> Snapshot: ...
    def rollback(self, snap: Snapshot) -> None: ...
    def last_logits(self) -> npt.NDArray[np.float32] | None: ...
    def reset(self) -> None: ...
    def save(
        self, path: _Path, snapshot: Snapshot | None = None, metadata: str | None = None
    ) -> int: ...

@final
class Snapshot:
    @property
    def position(self) -> int: ...

@final
class Stream:
    def __iter__(self) -> Stream: ...
    def __next__(self) -> int: ...
