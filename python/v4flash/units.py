"""Units the command line speaks: ``--ram`` in GB (10^9 bytes, as the engine's planner reads
it), ``--expert-cache-mb`` in MiB, and sizes and counts in words."""

from __future__ import annotations

GB = 10**9  # --ram is in GB (10^9 bytes), as the engine's planner reads it
MIB = 1 << 20  # --expert-cache-mb is in MiB


def gb(n: float) -> str:
    """``1.5 GB``, ``3.2 MB``, ``640 KB`` (decimal units)."""
    if n >= GB:
        return f"{n / GB:.1f} GB"
    if n >= 10**6:
        return f"{n / 10**6:.1f} MB"
    return f"{n / 1000:.0f} KB"


def plural(n: int, word: str, *, grouped: bool = False) -> str:
    """``1 thread``, ``2 threads``; ``grouped``: ``1,024 tokens``."""
    count = f"{n:,}" if grouped else f"{n}"
    return f"{count} {word}{'' if n == 1 else 's'}"
