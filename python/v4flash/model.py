"""The Python face of the engine: ``load`` → ``Model`` → ``Session``.

Token ids are converted here (``ValueError`` naming the argument); everything else is checked
by the Rust core (load options: ``LoadOptions::set``; sampling: ``SampleParams``; token ids
against the vocabulary), which runs the work with the GIL released and stops cleanly on
Ctrl-C.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from .config import Config, load_config
from .sampling import sample_params

IdsLike = Union[Sequence[int], np.ndarray]


def _ids(ids: IdsLike, name: str = "ids", allow_empty: bool = False) -> List[int]:
    if isinstance(ids, (str, bytes)):
        raise ValueError(f"{name} must be a sequence of token ids, not text (tokenize it first)")
    try:
        out = [int(i) for i in ids]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of integer token ids") from None
    if not allow_empty and not out:
        raise ValueError(f"{name} is empty: give at least one token id")
    for i in out:
        if i < 0:
            raise ValueError(f"{name} contains a negative token id ({i})")
    return out


def _tokens(stream: Any) -> Iterator[int]:
    # a generator over the core's stream (checked already): one core step per next(); closed
    # with it (a model that steps its sessions together stops waiting for this one)
    try:
        yield from stream
    finally:
        stream.close()


class Session:
    """A sequence with its state: feed tokens, generate, snapshot and roll back."""

    #: The JSON value saved with the session (``Model.load_session``), else None.
    metadata: Any = None

    def __init__(self, model: Model, core: Any):
        self._model = model
        self._core = core

    @property
    def position(self) -> int:
        """Tokens in the sequence so far."""
        return self._core.position

    @property
    def tokens(self) -> List[int]:
        return list(self._core.tokens)

    def feed(self, ids: IdsLike, progress: Optional[Callable[[int, int], Any]] = None) -> None:
        """Prefills tokens (no sampling). ``progress(done, total)``, if given, is called from
        this thread as the engine works through the prompt layer by layer (``done`` tokens of
        ``total``, in whole-model units); an exception it raises stops the prefill, leaves the
        session as it was, and propagates."""
        ids = _ids(ids)
        if progress is None:
            self._core.feed(ids)
            return
        layers = max(self._model.config.num_hidden_layers, 1)
        total = len(ids)
        self._core.feed(ids, lambda n: progress(min(n // layers, total), total))

    def last_logits(self) -> Optional[np.ndarray]:
        """float32 [vocab] logits after the last fed token (after a rollback: the snapshot's),
        or None while a sampled token waits to be fed or before anything was fed."""
        return self._core.last_logits()

    def generate(self, *args: Any, **kw: Any) -> List[int]:
        """Feeds ``ids`` then returns up to ``max_new_tokens`` new tokens (greedy when
        temperature is 0), stopping after a stop id (default: EOS). Ctrl-C raises
        ``KeyboardInterrupt``; the tokens produced so far stay in the session
        (``Session.tokens``) and the session stays usable. The arguments are
        ``_generation``'s."""
        return self._generation(*args, **kw).collect()

    def stream(self, *args: Any, **kw: Any) -> Iterator[int]:
        """Like ``generate`` (the same arguments) but yields each token as soon as it is
        sampled."""
        return _tokens(self._generation(*args, **kw))

    def stream_logprobs(
        self, *args: Any, top_logprobs: int = 0, **kw: Any
    ) -> Iterator[Tuple[int, float, List[Tuple[int, float]]]]:
        """Like ``stream``, yielding ``(token, logprob, top)``: the token's log-probability
        under the model (log-softmax of the raw logits, before temperature and truncation)
        and the ``top_logprobs`` most likely tokens' ``[(id, logprob)]``."""
        g = self._generation(*args, logprobs=top_logprobs, **kw)
        try:
            for t in g:
                lp, top = g.logprobs()
                yield t, lp, top
        finally:
            g.close()

    def _generation(
        self,
        ids: IdsLike = (),
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: Optional[int] = None,
        stop_ids: Optional[Sequence[int]] = None,
        logprobs: Optional[int] = None,
        constraint: Any = None,
        wait_for: Optional[int] = None,
        speculate: Optional[str] = None,
        _oracle: Any = None,
        _force_drafts: Optional[int] = None,
    ) -> Any:
        """The core's generation for ``generate`` and ``stream``, checked (one core step per
        token: the core feeds, seeds step i with seed + i and stops at a stop id,
        ``max_new_tokens`` or a full context); nothing runs until it is iterated or
        collected. ``constraint``: a grammar compiled for this model
        (``textapi.constraints.compile_grammar``); only tokens it allows are sampled (from
        the first, or once ``wait_for`` is sampled; until then a sampled EOS becomes it).
        ``speculate``: ``off``, ``lookup``, ``dspark`` or ``auto`` (default: the model's
        ``speculate`` load option); the tokens are the same whichever, only the time
        differs (docs/model.md §9). ``dspark`` needs the model loaded with ``drafter=True``;
        a session whose earlier tokens the drafter did not observe (loaded from a file, or fed
        before ``dspark`` was asked for on a model that does not use it by default) steps
        plainly."""
        s = sample_params(temperature, top_p, top_k, seed)
        stops = [self._model.config.eos_token_id] if stop_ids is None else stop_ids
        stops = _ids(stops, "stop_ids", allow_empty=True)
        first = _ids(ids, allow_empty=True)
        return self._core.stream(
            first,
            max_new_tokens,
            s.temperature,
            s.top_p,
            s.top_k,
            s.seed,
            stops,
            logprobs,
            constraint,
            wait_for,
            speculate,
            _oracle,
            _force_drafts,
        )

    def snapshot(self) -> Any:
        """A restorable point at the current position."""
        return self._core.snapshot()

    def rollback(self, snap: Any) -> None:
        """Returns to ``snap`` (taken earlier in this session's history)."""
        self._core.rollback(snap)

    def reset(self) -> None:
        self._core.reset()

    def save(
        self,
        path: Union[str, os.PathLike],
        *,
        snapshot: Any = None,
        metadata: Any = None,
    ) -> int:
        """Writes the whole session (tokens, every layer's window, compressor buffers and
        compressed entries, the pending token and last logits) to ``path`` atomically, in the
        versioned format of docs/architecture.md §7.1; :meth:`Model.load_session` gives back a
        session that continues bit for bit. With ``snapshot`` (from :meth:`snapshot`), the
        state as it was there. ``metadata``: any JSON-serializable value, stored in the
        file's header and read back as ``Session.metadata``. Returns the file's size."""
        meta = None
        if metadata is not None:
            try:
                meta = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise ValueError(f"metadata must be JSON-serializable: {e}") from None
        return self._core.save(os.fspath(path), snapshot, meta)


# generate and stream take _generation's arguments (written once, there); help() shows them
_GENERATION = inspect.signature(Session._generation)
for _name, _returns in (("generate", List[int]), ("stream", Iterator[int])):
    getattr(Session, _name).__signature__ = _GENERATION.replace(return_annotation=_returns)


def _core_property(name: str, doc: str) -> Any:
    """A read-only attribute: the core model's ``name``."""
    return property(lambda self: getattr(self._core, name), doc=doc)


class Model:
    """A loaded checkpoint. Create with :func:`v4flash.load`."""

    def __init__(self, core: Any, config: Config, path: Path):
        self._core = core
        self.config = config
        self.path = path
        self._identity: Optional[Dict[str, Any]] = None

    def __repr__(self) -> str:
        return (
            f"v4flash.Model({str(self.path)!r}, layers={self.config.num_hidden_layers}, "
            f"threads={self.threads}, kernels={_core.kernel_tier()})"
        )

    threads = _core_property("threads", "Compute threads.")
    ctx = _core_property("ctx", "Tokens per session at most.")
    io_mode = _core_property("io_mode", "The expert store's I/O mode as it runs.")
    cache_policy = _core_property("policy", "The expert cache's eviction policy.")
    numerics = _core_property("numerics", "The numerics mode (one of ``NUMERICS``).")

    def logits(self, ids: IdsLike) -> np.ndarray:
        """float32 [len(ids), vocab]: teacher-forced logits from a fresh state."""
        return self._core.logits(_ids(ids))

    def session(self) -> Session:
        return Session(self, self._core.session())

    @property
    def identity(self) -> Dict[str, Any]:
        """What a session file records of this model (its tensor table and small weights
        hashed, the numerics mode, the kernel tier): a saved state only resumes on the same."""
        if self._identity is None:
            self._identity = json.loads(self._core.identity())
        return self._identity

    def load_session(self, path: Union[str, os.PathLike]) -> Session:
        """A session read from a file :meth:`Session.save` wrote, continuing exactly where it
        stood (its ``metadata`` is what was saved with it). ``ValueError`` naming the file and
        what differs for a file of another model, config or numerics mode, or longer than
        this model's context; also for a truncated or corrupted file or another format
        version. ``FileNotFoundError`` when there is no such file."""
        core, meta = self._core.load_session(os.fspath(path))
        s = Session(self, core)
        if meta is not None:
            s.metadata = json.loads(meta)
        return s

    def generate(self, ids: IdsLike, **kw: Any) -> List[int]:
        """New tokens after ``ids`` from a fresh session (see :meth:`Session.generate`)."""
        return self.session().generate(_ids(ids), **kw)

    def stream(self, ids: IdsLike, **kw: Any) -> Iterator[int]:
        """Iterator of new token ids from a fresh session (see :meth:`Session.stream`)."""
        return self.session().stream(_ids(ids), **kw)

    def plan(self) -> Dict[str, Any]:
        """The memory plan this model was loaded with (bytes, slots) and its switches
        (``tuning``)."""
        return self._core.plan()

    def stats(self) -> Dict[str, Any]:
        """Counters: tokens, timings, expert cache figures (``expert_hit_rate``: None before
        any request), and what the model runs with (``tuning``: the switches in force)."""
        return self._core.stats()

    # --- text level (python/v4flash/textapi.py) ----------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer (``tokenizer.json`` via ``tokenizers``), loaded once."""
        from .textapi import tokenizer_for

        return tokenizer_for(self)

    @property
    def prompt_cache(self) -> Any:
        """The :class:`~v4flash.textapi.PromptCache` that ``chat``/``complete`` use."""
        from .textapi import cache_for

        return cache_for(self)

    def chat(self, messages: List[Dict[str, Any]], **kw: Any) -> Any:
        """Answers OpenAI-style ``messages``: a ``ChatResult`` (content, reasoning, tool_calls,
        finish_reason, usage). See :func:`v4flash.textapi.chat` for the keywords."""
        from .textapi import chat

        return chat(self, messages, **kw)

    def chat_stream(self, messages: List[Dict[str, Any]], **kw: Any) -> Iterator[Any]:
        """Like :meth:`chat`, yielding ``ChatDelta`` pieces (reasoning/content/tool calls)."""
        from .textapi import chat_stream

        return chat_stream(self, messages, **kw)

    def complete(self, text: str, **kw: Any) -> Any:
        """Raw completion of ``text`` (no chat template): a ``CompletionResult``."""
        from .textapi import complete

        return complete(self, text, **kw)

    def complete_stream(self, text: str, **kw: Any) -> Iterator[Any]:
        """Like :meth:`complete`, yielding ``CompletionDelta`` pieces."""
        from .textapi import complete_stream

        return complete_stream(self, text, **kw)


def plan(
    path: Union[str, os.PathLike], ram_gb: Optional[float] = None, **options: Any
) -> Dict[str, Any]:
    """The memory plan for a checkpoint and budget, without loading any weights: the options
    of :func:`load` (the planner uses ``ram_gb``, ``ctx`` and ``expert_cache_mb``), and the
    switches a load would run with (``tuning``).

    Raises ``MemoryError`` with the needed size when the budget is too small."""
    p = Path(path)
    load_config(p)
    return _core.plan(str(p), ram_gb=ram_gb, **options)


def load(
    path: Union[str, os.PathLike],
    ram_gb: Optional[float] = None,
    threads: Optional[int] = None,
    **options: Any,
) -> Model:
    """Validates the checkpoint at ``path`` and loads its dense part.

    The options (``_core.LOAD_OPTIONS``; each checked by the core, ``ValueError`` naming it;
    an unknown one is a ``TypeError``):

    - ``ram_gb``: a budget for the whole process's resident memory, in GB (the planner splits
      it between dense weights, session state, scratch and the expert cache; default:
      available memory minus a margin);
    - ``threads``: compute threads (default: all cores);
    - ``expert_cache_mb``: sizes the routed-expert cache directly;
    - ``ctx``: the tokens per session (default: the smaller of the model's maximum and
      65,536);
    - ``sessions``: how many sessions the plan holds state for at ``ctx`` (default 1;
      ``plan()["max_sessions"]`` says how many the budget could hold, ``plan()["parallel"]``
      what a server would run). With more than one, the steps and feeds that threads ask of
      this model's sessions at the same time run together, one forward pass per round
      (continuous batching: ``chat``, ``complete``, ``generate`` and ``stream`` called from
      several threads get it as they are; each gets exactly what it gets alone);
    - ``round_prefill``: with several sessions, the prompt tokens fed per round, shared by
      the prompts waiting (default 256 when the expert cache holds at least half of the
      experts, else the plan's ``prefill_span``, which feeds a long prompt as fast as
      alone): a new request starts within about one round of a long prompt being fed;
    - ``io``: ``direct`` (O_DIRECT/F_NOCACHE where the OS allows it, else buffered, the
      default), ``buffered`` (the portable pread path) or ``mmap``; ``io_threads``: the pread
      pool's threads (default 8);
    - ``cache_policy``: ``freq-decay`` (default) or ``lru``;
    - ``numerics``: one of ``NUMERICS``: ``exact`` (float32 activations, the mode checked
      against the reference; default), ``fast`` (bf16 activations and ``vdpbf16ps`` products
      for every FP8/FP4 product where the CPU has avx512_bf16, else int8 activations per
      32-column block for the FP4 expert products), ``fp8-act`` (DeepSeek's FP8 activation
      round trip before every FP8/FP4 product, a yardstick) or ``official`` (what DeepSeek's
      reference inference computes: that round trip, plus FP8 KV entries and a
      Hadamard-rotated FP4 indexer); ``benches/fidelity.py`` and ``benches/official.py``
      measure how far each moves the output;
    - ``lookahead``, ``prefault``, ``io_uring``: this model's switches (default: the
      environment's ``V4FLASH_LOOKAHEAD``, ``V4FLASH_PREFAULT``, ``V4FLASH_IO_URING``; on);
    - ``drafter``: also load the 0731 release's DSpark drafter (its resident tensors and an
      expert cache of its own, in the plan; default off; a checkpoint without one is a
      ``ValueError``), for ``speculate='dspark'``, and ``auto``'s DSpark steps: sessions then
      keep its state in step from their first token (docs/model.md §9).
    """
    p = Path(path)
    config = load_config(p)
    core = _core.Model.load(str(p), ram_gb=ram_gb, threads=threads, **options)
    return Model(core, config, p)
