"""What the terminal shows about a turn, for ``v4flash chat`` and ``v4flash run``: a status
line after each answer (``--verbose``: a detailed one) and, on a terminal, a progress bar while
a long prompt is prefilled."""

from __future__ import annotations

from typing import Any, Dict, Optional

from .conversation import ProgressCallback

PREFILL_CHUNK = 256  # the smallest prefill chunk of the engine (the plan's may be larger)


def status_line(s: Dict[str, Any]) -> str:
    """One line: tokens, speed, time to first token, prefill, expert hit rate."""
    if s.get("stop") == "cancelled":
        return "interrupted during the prompt's prefill: nothing generated"
    parts = [f"{s.get('generated_tokens', 0)} tokens"]
    if s.get("decode_tok_s") is not None:
        parts.append(f"{s['decode_tok_s']:.1f} tok/s")
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s']:.2f} s")
    pre = f"prefill {s.get('prefill_tokens', 0)}"
    if s.get("reused_tokens"):
        pre += f" (reused {s['reused_tokens']}, {s.get('reuse')})"
    parts.append(pre)
    hit = s.get("expert_hit_rate")
    parts.append("experts " + ("-" if hit is None else f"{hit:.0%} hit"))
    if s.get("stop") not in (None, "eos"):
        parts.append(str(s["stop"]))
    return " · ".join(parts)


def detail_line(s: Dict[str, Any]) -> str:
    """``--verbose``: the status line's figures with their times, and the expert traffic."""
    pre_n, pre_s = s.get("prefill_tokens", 0), s.get("prefill_s") or 0.0
    pre = f"prefill {pre_n} tokens in {pre_s:.2f} s"
    if pre_n and pre_s:
        pre += f" ({pre_n / pre_s:.1f} tok/s)"
    pre += f", reused {s.get('reused_tokens', 0)} ({s.get('reuse')})"
    parts = [pre]
    if s.get("ttft_s") is not None:
        parts.append(f"TTFT {s['ttft_s']:.2f} s")
    dec = f"decode {s.get('generated_tokens', 0)} tokens"
    if s.get("decode_s"):
        dec += f" in {s['decode_s']:.2f} s"
    if s.get("decode_tok_s") is not None:
        dec += f" ({s['decode_tok_s']:.1f} tok/s)"
    parts.append(dec)
    hit = s.get("expert_hit_rate")
    parts.append(
        f"experts {s.get('expert_requests', 0)} requests, "
        + ("-" if hit is None else f"{hit:.0%}")
        + f" hit, {s.get('expert_bytes_read', 0) / (1 << 20):.1f} MB read"
    )
    parts.append(f"{s.get('session_tokens', 0)} tokens in the session")
    parts.append(f"stop: {s.get('stop')}")
    return " · ".join(parts)


class PrefillBar:
    """A transient progress bar on a terminal for prompts of 512+ tokens (else silent; no
    console: never)."""

    def __init__(self, console: Any, min_tokens: int = 2 * PREFILL_CHUNK):
        self.console = console
        self.min_tokens = min_tokens
        self._progress: Any = None
        self._task: Any = None
        on = console is not None and console.is_terminal
        self.callback: Optional[ProgressCallback] = self._update if on else None

    def _update(self, done: int, total: int) -> None:
        if total < self.min_tokens:
            return
        if self._progress is None:
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self._progress = Progress(
                TextColumn("prefill"),
                BarColumn(),
                TaskProgressColumn(),
                TextColumn("{task.completed}/{task.total} tokens"),
                console=self.console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("prefill", total=total)
        self._progress.update(self._task, completed=done)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
