"""What the commands share: the one-line error (:class:`CliError`), the stderr console, the
checkpoint a command runs on (``--model``: a folder or a repo id in the Hugging Face cache, else
the demo) and loading it with the plan line on stderr."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Dict, Tuple

from ..doctor import plan_line, plan_table
from ..hub.locate import locate
from ..hub.releases import HubError


class CliError(Exception):
    """An error to print as one line (exit code ``code``)."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)


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
    print(f"v4flash: {DEMO_NOTICE}", file=sys.stderr)
    return d, True


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
    t0 = time.perf_counter()
    kw: Dict[str, Any] = dict(
        ram_gb=args.ram, threads=args.threads, expert_cache_mb=args.expert_cache_mb, ctx=args.ctx
    )
    for opt in ("io", "cache_policy", "io_threads", "numerics"):
        if getattr(args, opt, None) is not None:
            kw[opt] = getattr(args, opt)
    if err.is_terminal:
        with err.status(f"loading {path} …", spinner="dots"):
            model = v4flash.load(path, **kw)
    else:
        model = v4flash.load(path, **kw)
    if not getattr(args, "quiet", False):
        plan = model.plan()
        print(plan_line(plan, model.threads, model.numerics), file=sys.stderr)
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
        print(f"loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return model, tok
