"""The ``v4flash`` command line."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from . import __version__, kernel_tier


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="v4flash",
        description="Run DeepSeek V4 Flash on the CPU, streaming experts from disk.",
    )
    p.add_argument("--version", action="version", version=f"v4flash {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    info = sub.add_parser("info", help="describe the build (and a checkpoint, with --model)")
    info.add_argument("--model", help="checkpoint directory")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 0
    if args.command == "info":
        print(f"v4flash {__version__}  kernels: {kernel_tier()}")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
