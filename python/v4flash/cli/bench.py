"""``v4flash bench``: the whole-run benchmark (``v4flash.bench``) on a checkpoint, or with
``--predict`` the full model's predicted speed on this machine."""

from __future__ import annotations

import argparse

from .. import bench
from .common import resolve_model


def cmd_bench(args: argparse.Namespace) -> int:
    if args.predict:
        return bench.predict(args.mem_gbs, args.mem_gb, args.threads, args.json, args.draft_ms)
    path, _ = resolve_model(args)
    return bench.bench_command(path, args)
