"""Text for a terminal: lines wrapped at word boundaries (never mid-word, as the terminal
itself would wrap them) when the stream is a terminal, whole lines for a pipe or a file."""

from __future__ import annotations

import shutil
import sys
import textwrap
from typing import Optional, TextIO


def terminal_width(stream: Optional[TextIO] = None) -> Optional[int]:
    """The width to wrap ``stream``'s lines at when it is a terminal; None for a pipe or a
    file, whose lines stay whole (one message, one line: easy to grep)."""
    stream = sys.stderr if stream is None else stream
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError, OSError):
        return None
    return max(20, shutil.get_terminal_size().columns)


def wrap(text: str, width: Optional[int], indent: str = "  ") -> str:
    """``text`` wrapped at word boundaries to ``width`` (None: as it is), each line's
    continuation indented by ``indent`` more than the line; a word longer than a line (a
    path) stays whole."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        lead = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(
            line,
            width=width,
            subsequent_indent=lead + indent,
            break_long_words=False,
            break_on_hyphens=False,
        ) or [""]
    return "\n".join(out)
