"""Text for a terminal: lines wrapped at word boundaries (never mid-word, as the terminal
itself would wrap them) when the stream is a terminal, whole lines for a pipe or a file, and
aligned columns that turn into blocks when they do not fit."""

from __future__ import annotations

import shutil
import sys
import textwrap
from typing import Optional, TextIO, Tuple


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


def columns(headers: Tuple[str, ...], rows: list, width: Optional[int]) -> str:
    """Rows of strings as aligned columns (two spaces apart, no borders, as ``ollama list``
    prints them); when they do not fit in ``width`` (a narrow terminal), each row as a block:
    its first cell, then ``header: cell`` lines, indented."""
    if not rows:
        return ""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    if width is None or sum(widths) + 2 * (len(widths) - 1) <= width:
        lines = [headers] + [tuple(r) for r in rows]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines
        )
    out = []
    for r in rows:
        out.append(wrap(r[0], width))
        for h, c in zip(headers[1:], r[1:]):
            if c:
                out.append(wrap(f"  {h.lower()}: {c}", width, "    "))
    return "\n".join(out)
