"""The bundled demo checkpoint: a tiny DeepSeek V4 (4.4 M parameters, every layer kind of the
real model, FP8/FP4 weights in the real checkpoint layout) trained for half an hour on a CPU on
Debian's fortune databases, with a 1,536-token byte-level BPE carrying DeepSeek's special
tokens. ``fixtures/make_demo.py`` trains and exports it.

It is used when no ``--model`` is given so that ``pip install .`` followed by
``python -m v4flash info`` / ``run`` / ``chat`` works out of the box. It writes English-looking
text (quotes, jokes and riddles in the style of ``fortune``), but it knows nothing: it is NOT
DeepSeek, and the CLI says so every time it is used.

Where it lives: the files are in the package itself (``v4flash/demo/``, shipped by maturin's
``include`` rule in pyproject.toml), so every wheel carries them, Windows included.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

DEMO_NOTICE = (
    "No --model given: using the bundled demo checkpoint, a tiny model with DeepSeek V4 "
    "Flash's architecture trained on fortune cookies. It is NOT DeepSeek: it writes "
    "English-looking text and knows nothing. Pass --model DIR to run the real checkpoint."
)


def _candidates() -> List[Path]:
    pkg = Path(__file__).resolve().parent  # .../v4flash
    return [pkg / "demo"]


def demo_path() -> Optional[Path]:
    """The demo checkpoint directory, or None if this installation does not carry it."""
    for p in _candidates():
        if (p / "config.json").is_file() and (p / "tokenizer.json").is_file():
            return p
    return None


def is_demo(path: os.PathLike) -> bool:
    d = demo_path()
    try:
        return d is not None and Path(path).resolve() == d.resolve()
    except OSError:
        return False
