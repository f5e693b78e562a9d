"""v4flash: DeepSeek V4 Flash on an ordinary CPU.

The Rust core (``v4flash._core``) reads the checkpoint as DeepSeek publishes it, streams the
routed experts from disk through a bounded cache, and runs the forward pass. This package is
the thin Python side: config validation, tokenization, chat encoding and the CLI.
"""

from __future__ import annotations

from ._core import NUMERICS, SPECULATE, V4FlashError, __version__, kernel_tier
from .config import Config, load_config
from .encoding import encode_messages, parse_completion
from .model import Model, Session, load, plan

__all__ = [
    "NUMERICS",
    "SPECULATE",
    "Config",
    "Model",
    "Session",
    "V4FlashError",
    "__version__",
    "encode_messages",
    "kernel_tier",
    "load",
    "load_config",
    "parse_completion",
    "plan",
]
