"""What the text API keeps on a model, created on first use and shared by every request:
its tokenizer (``tokenizer.json`` next to the weights) and its prompt cache."""

from __future__ import annotations

import threading
from typing import Any, Callable

from ..tokenizer import load_tokenizer
from .cache import PromptCache

# reentrant: making one attachment may need another (the vocabulary needs the tokenizer)
_lock = threading.RLock()


def _attached(model: Any, attr: str, make: Callable[[Any], Any]) -> Any:
    """``model.<attr>``, made with ``make(model)`` the first time (once, whatever the threads)."""
    value = getattr(model, attr, None)
    if value is None:
        with _lock:
            value = getattr(model, attr, None)
            if value is None:
                value = make(model)
                setattr(model, attr, value)
    return value


def tokenizer_for(model: Any) -> Any:
    """The model's tokenizer (``tokenizer.json`` next to the weights), loaded on first use."""
    return _attached(model, "_text_tokenizer", lambda m: load_tokenizer(m.path))


def use_tokenizer(model: Any, tokenizer: Any) -> None:
    """Attaches an already loaded tokenizer (the CLI loads one next to the model)."""
    model._text_tokenizer = tokenizer


def cache_for(model: Any) -> PromptCache:
    """The model's own prompt cache (created on first use)."""
    return _attached(model, "_text_prompt_cache", PromptCache)
