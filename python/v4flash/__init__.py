"""v4flash: DeepSeek V4 Flash on an ordinary CPU.

The Rust core (``v4flash._core``) reads the checkpoint as DeepSeek publishes it, streams the
routed experts from disk through a bounded cache, and runs the forward pass. This package is
the thin Python side: config validation, tokenization, chat encoding and the CLI.
"""

from __future__ import annotations

from ._core import V4FlashError, __version__, kernel_tier

__all__ = ["V4FlashError", "__version__", "kernel_tier"]
