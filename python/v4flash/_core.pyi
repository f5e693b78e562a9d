"""Types of the Rust extension ``v4flash._core`` (rust/python/); checked against the built
module by ``python3 -m mypy.stubtest v4flash._core`` in CI. The public API is ``v4flash.load``
and friends (model.py); the core checks the arguments (names, kinds, ranges)."""

from os import PathLike
from typing import Any, Callable, Literal, Sequence, TypedDict, final, type_check_only

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack

__all__ = [
    "__version__",
    "V4FlashError",
    "NUMERICS",
    "SPECULATE",
    "PUBLISHED_CONFIG",
    "CONFIG_KEYS",
    "DTYPE_SIZES",
    "LOAD_OPTIONS",
    "kernel_tier",
    "bf16_products",
    "fast_products",
    "tuning",
    "memory_info",
    "io_uring_probe",
    "open_checkpoint",
    "inspect_checkpoint",
    "validate_config",
    "config_json",
    "expected_tensors",
    "drafter_tensors",
    "is_routed_expert",
    "is_drafter",
    "published_config",
    "table_bytes",
    "sample_params",
    "plan",
    "mem_read_gbs",
    "disk_read_gbs",
    "fma_peak_gflops",
    "Model",
    "Session",
    "Snapshot",
    "Stream",
    "Vocabulary",
    "Grammar",
    "BatchSession",
    "step_batch",
]

_Path = str | PathLike[str]

__version__: str
NUMERICS: tuple[str, ...]
SPECULATE: tuple[str, ...]
PUBLISHED_CONFIG: str
CONFIG_KEYS: tuple[str, ...]
DTYPE_SIZES: dict[str, int]
LOAD_OPTIONS: tuple[str, ...]

@type_check_only
class LoadOptions(TypedDict, total=False):
    """What ``Model.load`` and ``plan`` take (``LoadOptions::set`` in rust/options.rs)."""

    ram_gb: float | None
    threads: int | None
    expert_cache_mb: float | None
    ctx: int | None
    sessions: int | None
    io: Literal["direct", "buffered", "mmap"] | None
    cache_policy: Literal["freq-decay", "lru"] | None
    io_threads: int | None
    numerics: str | None
    lookahead: bool | None
    prefault: bool | None
    io_uring: bool | None
    drafter: bool | None
    speculate: Literal["off", "lookup", "dspark", "auto"] | None

@type_check_only
class Tuning(TypedDict):
    """The switches in force (``report::TuningReport``)."""

    kernels: str
    bf16_products: bool
    fast_products: str
    fp8_bits: bool | None
    gemm_x_ahead: bool | None
    lookahead: bool
    prefault: bool
    io_uring: bool

@type_check_only
class Plan(TypedDict):
    """A memory plan (``plan::Plan`` and ``report::PlanReport``), bytes unless named otherwise."""

    budget_bytes: int | None
    available_bytes: int | None
    dense_bytes: int
    drafter_bytes: int
    drafter_resident_bytes: int
    drafter_slots: int
    drafter_cache_bytes: int
    embed_head_bytes: int
    state_bytes: int
    sessions: int
    max_sessions: int
    scratch_bytes: int
    prefill_chunk: int
    prefill_span: int
    span_bytes: int
    overhead_bytes: int
    slot_bytes: int
    slots: int
    total_experts: int
    ctx: int
    cache_bytes: int
    total_bytes: int
    tuning: Tuning

@type_check_only
class Stats(TypedDict):
    """A loaded model's counters and figures (``report::Stats``); times in seconds."""

    prefill_tokens: int
    decode_tokens: int
    prefill_s: float
    decode_s: float
    attn_s: float
    moe_s: float
    head_s: float
    lookahead: bool
    lookahead_guessed: int
    lookahead_guessed_used: int
    lookahead_needed: int
    expert_requests: int
    expert_hits: int
    expert_misses: int
    expert_hit_rate: float | None
    expert_prefetches: int
    expert_prefetch_used: int
    expert_bytes_read: int
    expert_read_s: float
    expert_wait_s: float
    expert_slots: int
    io_engine: str
    io_uring_interrupts: int
    direct_io: bool
    kernel_tier: str
    numerics: str
    bf16_products: bool
    fast_products: str | None
    kernel_s: float
    kernel_gflop: float
    prefaulted_slots: int
    prefault_running: bool
    warm_slots: int
    threads: int
    tuning: Tuning
    speculation: SpecStats

@type_check_only
class SpecStats(TypedDict):
    """Speculative decoding's counters (``speculate::SpecStats``)."""

    verifies: int
    drafted: int
    accepted: int
    plain_steps: int
    saved_s: float

@type_check_only
class ModelBytes(TypedDict):
    """Bytes and parameters of a tensor table (``checkpoint::sizes::ModelBytes``)."""

    dense_bytes: int
    embed_head_bytes: int
    embed_bytes: int
    dense_bytes_per_token: int
    experts_bytes: int
    n_experts: int
    drafter_bytes: int
    dense_params: int
    head_params: int
    expert_params: int
    expert_bytes: float
    active_params_per_token: float
    prefill_params_per_token: float

class V4FlashError(Exception):
    """A checkpoint or config that v4flash cannot use."""

def kernel_tier() -> str: ...
def bf16_products() -> bool: ...
def fast_products() -> str: ...
def tuning() -> Tuning: ...
def memory_info() -> tuple[int | None, int | None]: ...
def io_uring_probe() -> tuple[bool | None, str]: ...
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
def table_bytes(
    config: _Path | dict[str, Any],
    tensors: Sequence[tuple[str, str, Sequence[int], int]] | None = None,
) -> ModelBytes: ...
def inspect_checkpoint(path: _Path) -> dict[str, Any]: ...
def sample_params(
    temperature: Any = None, top_p: Any = None, top_k: Any = None, seed: Any = None
) -> tuple[float, float, int, int]: ...
def plan(path: _Path, **options: Unpack[LoadOptions]) -> Plan: ...
def mem_read_gbs(nbytes: int = ..., threads: int | None = None, reps: int = 3) -> float: ...
def disk_read_gbs(path: _Path, nbytes: int = ..., readers: int = ...) -> tuple[float, bool]: ...
def fma_peak_gflops(threads: int | None = None) -> float: ...

@final
class Model:
    @staticmethod
    def load(path: _Path, **options: Unpack[LoadOptions]) -> Model: ...
    def plan(self) -> Plan: ...
    def stats(self) -> Stats: ...
    @property
    def io_mode(self) -> str: ...
    @property
    def numerics(self) -> str: ...
    @property
    def policy(self) -> str: ...
    def logits(self, ids: Sequence[int]) -> npt.NDArray[np.float32]: ...
    def read_experts(self, layer: int, experts: Sequence[int]) -> float: ...
    # private hooks for tests and measurements (tests/test_official.py, benches/official.py),
    # not part of the API
    def _layer_probe(
        self, layer: int, ids: Sequence[int], x: npt.NDArray[np.float32] | None = None
    ) -> tuple[npt.NDArray[np.float32], list[list[int]] | None]: ...
    def _probe_logits(
        self, x: npt.NDArray[np.float32], rows: Sequence[int]
    ) -> npt.NDArray[np.float32]: ...
    def session(self) -> Session: ...
    def identity(self) -> str: ...
    def load_session(self, path: _Path) -> tuple[Session, str | None]: ...
    @property
    def ctx(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def expert_bytes(self) -> int: ...

@final
class Session:
    @property
    def position(self) -> int: ...
    @property
    def tokens(self) -> list[int]: ...
    def feed(self, ids: Sequence[int], progress: Callable[[int], object] | None = None) -> None: ...
    def stream(
        self,
        ids: Sequence[int],
        max_new: int,
        temperature: float,
        top_p: float,
        top_k: int,
        seed: int,
        stop_ids: Sequence[int],
        logprobs: int | None = None,
        constraint: Grammar | None = None,
        wait_for: int | None = None,
        speculate: str | None = None,
        _oracle: tuple[Sequence[int], float, int] | None = None,
        _force_drafts: int | None = None,
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
    def collect(self) -> list[int]: ...
    def close(self) -> None: ...
    def speculation(self) -> dict[str, Any] | None: ...
    def logprobs(self) -> tuple[float, list[tuple[int, float]]] | None: ...
    def mask_times(self) -> list[float]: ...

@final
class Vocabulary:
    def __new__(cls, tokens: Sequence[bytes], eos_id: int) -> Vocabulary: ...
    @property
    def size(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    def compile(self, kind: str, source: str) -> Grammar: ...
    def cache_stats(self) -> tuple[int, int, int]: ...
    # a private hook for measurements (benches/structured.py), not part of the API
    def _mask_times(self, grammar: Grammar, tokens: Sequence[int]) -> list[float]: ...

@final
class Grammar:
    @property
    def kind(self) -> str: ...
    @property
    def compile_seconds(self) -> float: ...

@final
class BatchSession:
    """A sequence that ``step_batch`` feeds together with others (rust/python/batch.rs)."""

    def __new__(cls, model: Model) -> BatchSession: ...
    @property
    def position(self) -> int: ...
    @property
    def tokens(self) -> list[int]: ...
    def last_logits(self) -> npt.NDArray[np.float32] | None: ...
    def reset(self) -> None: ...

def step_batch(
    items: Sequence[tuple[BatchSession, Sequence[int], Literal["none", "last", "all"]]],
) -> list[npt.NDArray[np.float32] | None]: ...
