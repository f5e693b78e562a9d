"""What the commands share: the one-line error (:class:`CliError`) and how errors and notes
fit a terminal (wrapped at word boundaries, never mid-word), the stderr console, the
checkpoint a command runs on (``--model``: a folder or a repo id in the Hugging Face cache, else
the demo), remembered for ``v4flash list``, and loading it (what is read, how much of it, how
long) with the plan line on stderr."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional, TextIO, Tuple

from .. import state
from ..doctor import plan_line, plan_table
from ..hub.locate import locate
from ..hub.releases import HubError
from ..termtext import columns, terminal_width, wrap  # noqa: F401 (the commands' names)
from ..units import gb


class CliError(Exception):
    """An error to print as one line (exit code ``code``)."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)


def print_error(msg: str, stream: Optional[TextIO] = None) -> None:
    """``v4flash: error: MSG`` on stderr: the first line of ``msg`` is the error, any others
    (indented) say what to do; on a terminal each wraps at word boundaries."""
    stream = sys.stderr if stream is None else stream
    print(wrap(f"v4flash: error: {msg}", terminal_width(stream)), file=stream)


def note(msg: str, prefix: str = "v4flash: ") -> None:
    """A note on stderr, wrapped at word boundaries on a terminal."""
    print(wrap(prefix + msg, terminal_width(sys.stderr)), file=sys.stderr)


def resolve_model(args: argparse.Namespace) -> Tuple[Path, bool]:
    """(checkpoint dir, is_demo); prints the demo notice on stderr."""
    from ..demo import DEMO_NOTICE, demo_path

    if getattr(args, "reasoning_effort", None) and not getattr(args, "thinking", True):
        print(
            "v4flash: note: --reasoning-effort applies to thinking mode only (add --thinking)",
            file=sys.stderr,
        )

    if args.model:
        try:
            found = locate(args.model)
        except HubError as e:
            raise CliError(str(e), e.code) from None
        args.model_repo = found.repo_id
        return found.path, False
    d = demo_path()
    if d is None:
        raise CliError(
            "no --model given and this installation carries no demo checkpoint; "
            "pass --model DIR (the folder holding config.json and the .safetensors shards)",
            2,
        )
    if not getattr(args, "quiet", False):
        note(DEMO_NOTICE)
    return d, True


def remember(path: Path, args: argparse.Namespace) -> None:
    """Notes the checkpoint a command used, for ``v4flash list`` (not the demo)."""
    from ..demo import is_demo

    if not is_demo(path):
        state.remember_checkpoint(path, getattr(args, "model_repo", None))


def _bytes_read() -> Optional[int]:
    """Bytes this process has read so far (Linux: /proc/self/io's rchar, which counts the
    core's preads of the dense part), None where the OS does not say."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class LoadProgress:
    """While the core loads the checkpoint (it reports no progress itself): on a terminal a
    transient line with what is loaded, the dense part's size, how much of it has been read
    (the bytes this process read, where the OS says) and the time so far."""

    def __init__(self, console: Any, path: Path, dense_bytes: Optional[int]):
        self.console, self.path, self.dense = console, path, dense_bytes
        self.t0 = time.perf_counter()
        self.start_bytes = _bytes_read()
        self._stop = threading.Event()
        self._live: Any = None
        self._thread: Optional[threading.Thread] = None

    def read_bytes(self) -> Optional[int]:
        now = _bytes_read()
        if now is None or self.start_bytes is None:
            return None
        return now - self.start_bytes

    def text(self) -> str:
        took = time.perf_counter() - self.t0
        what = f"loading {self.path.name}"
        if self.dense:
            done = self.read_bytes()
            if done is not None:
                frac = min(done / self.dense, 1.0)
                what += f": dense part {gb(min(done, self.dense))} of {gb(self.dense)} ({frac:.0%})"
            else:
                what += f": dense part {gb(self.dense)}"
        return f"{what} · {took:.0f} s"

    def __enter__(self) -> LoadProgress:
        if self.console is not None and self.console.is_terminal:
            from rich.live import Live
            from rich.spinner import Spinner

            self._spinner = Spinner("dots", self.text())
            self._live = Live(self._spinner, console=self.console, transient=True)
            self._live.start()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(0.25):
            self._spinner.update(text=self.text())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._live is not None:
            self._live.stop()

    def done_line(self) -> str:
        took = time.perf_counter() - self.t0
        done = self.read_bytes()
        read = f" ({gb(done)} read)" if done else ""
        return f"loaded in {took:.1f} s{read}"


def load_model(args: argparse.Namespace, path: Path):
    """Loads the checkpoint (a spinner on a terminal), then prints the plan it runs with and
    the load time on stderr (nothing with ``--quiet``; the whole plan with ``--verbose``):
    after the load, so an error that makes the plan moot is the only thing printed. Returns
    (model, tokenizer)."""
    import v4flash

    from ..tokenizer import load_tokenizer

    err = err_console()
    v4flash.load_config(path)  # a missing or foreign checkpoint: its own error, first
    tok = load_tokenizer(path)  # cheap: a bad tokenizer.json fails before the long load
    kw: Dict[str, Any] = dict(
        ram_gb=args.ram, threads=args.threads, expert_cache_mb=args.expert_cache_mb, ctx=args.ctx
    )
    opts = (
        "io",
        "cache_policy",
        "io_threads",
        "numerics",
        "speculate",
        "sessions",
        "round_prefill",
    )
    for opt in opts:
        if getattr(args, opt, None) is not None:
            kw[opt] = getattr(args, opt)
    if getattr(args, "drafter", False):
        kw["drafter"] = True
    quiet = getattr(args, "quiet", False)
    dense = None
    if err.is_terminal and not quiet:
        try:  # the size to show while loading (a plan that fails: the load says why)
            dense = v4flash.plan(path, args.ram, ctx=args.ctx).get("dense_bytes")
        except (ValueError, MemoryError, OSError, RuntimeError, v4flash.V4FlashError):
            pass
    with LoadProgress(err if not quiet else None, path, dense) as progress:
        model = v4flash.load(path, **kw)
    remember(path, args)
    if not quiet:
        plan = model.plan()
        note(plan_line(plan, model.threads, model.numerics), prefix="")
        if getattr(args, "verbose", False):
            for k, v in plan_table(plan):
                print(f"  {k + ':':<28} {v}", file=sys.stderr)
            st = model.stats()
            print(
                f"  {'expert reads:':<28} {st.get('io_engine')} "
                f"({'direct I/O' if st.get('direct_io') else 'page cache'}, --io "
                f"{model.io_mode}) · cache policy {model.cache_policy} · ctx {model.ctx:,}",
                file=sys.stderr,
            )
        print(progress.done_line(), file=sys.stderr)
    return model, tok


def ago(seconds: Optional[float]) -> str:
    """``just now``, ``5 min ago``, ``3 h ago``, ``2 days ago``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 60:
        return "just now"
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    if s < 86400 * 2:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} days ago"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3 h 05 min``, ``2 days 4 h``."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} days {s % 86400 // 3600} h"
