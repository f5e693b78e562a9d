"""The bundled demo checkpoint: a tiny random-weight model shaped like DeepSeek V4 Flash
(byte-level BPE tokenizer with DeepSeek's special tokens); it is the ``tiny-a`` test fixture.

It is used when no ``--model`` is given so that ``pip install .`` followed by
``python -m v4flash info`` / ``run`` / ``chat`` works out of the box. Its answers are noise: it
is NOT DeepSeek, and the CLI says so every time it is used.

Where it lives: the files are in the package itself (``v4flash/demo/``, shipped by maturin's
``include`` rule in pyproject.toml), so every wheel carries them, Windows included. In the
repository ``fixtures/tiny-a`` is a symlink to that folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

DEMO_NAME = "tiny-a"
DEMO_NOTICE = (
    "No --model given: using the bundled demo checkpoint, a tiny random-weight model shaped "
    "like DeepSeek V4 Flash. It is NOT DeepSeek and its output is noise. "
    "Pass --model DIR to run the real checkpoint."
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
