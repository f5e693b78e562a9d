"""``v4flash info`` and ``doctor`` (and the checks after ``download``): a checkpoint described
or checked file by file without loading any weights, the machine checked (``doctor``), every
file hashed against the hub's published hashes (``doctor --verify``), then the memory plan.
The inspection is ``doctor``'s; this module only renders it, wrapped at word boundaries on a
terminal. A checkpoint that checks out is remembered for ``list``, and what ``--verify`` found
with it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from .. import __version__, kernel_tier, state
from ..doctor import Inspection, inspect_checkpoint, machine_checks, plan_summary, plan_table
from ..hub.fetch import download
from ..hub.hashes import incomplete_downloads, published_hashes, verify, verify_checks
from ..hub.releases import HubError, download_command, release_repo
from ..units import gb, plural
from .common import CliError, err_console, print_error, remember, resolve_model, wrap


def out_console():
    """stdout: wrapped at word boundaries on a terminal; a pipe gets whole lines."""
    from rich.console import Console

    out = Console(highlight=False, emoji=False)
    out.soft_wrap = not out.is_terminal
    return out


def cmd_info(args: argparse.Namespace, doctor: bool) -> int:
    from rich.table import Table

    out = out_console()
    path, demo = resolve_model(args)
    out.print(
        f"v4flash {__version__} · kernels {kernel_tier()} · {os.cpu_count()} cpus", markup=False
    )
    repo = getattr(args, "model_repo", None)
    where = f"{repo} (Hugging Face cache: {path})" if repo else str(path)
    out.print(
        f"checkpoint: {where}" + ("  (tiny DEMO model, not DeepSeek)" if demo else ""),
        markup=False,
    )
    ins = inspect_checkpoint(path)
    machine: list = []
    if doctor:
        _print_rows(out, ins.checks)
        if args.verify:
            rows = _verify_rows(path)
            for row in rows:
                ins.add(*row)
            _print_rows(out, rows)
        room = None
        if ins.ok:
            try:  # the room the planner takes without --ram, for the expected speed
                room = plan_summary(path, None, ctx=args.ctx).get("available_bytes")
            except (ValueError, MemoryError):
                pass
        shard = max(ins.shard_sizes, key=lambda n: ins.shard_sizes[n], default=None)
        machine = machine_checks(path / shard if shard else None, args.ram, args.threads, room)
        _print_rows(out, machine)
    else:
        if ins.config is not None:
            out.print(f"model: {ins.checks[0][2]}", markup=False)
        if ins.tensors:
            out.print(_size_line(ins), markup=False)
        if ins.drafter is not None and ins.drafter["usable"]:
            out.print(f"drafter: {ins.drafter['summary']}", markup=False)
        _print_rows(out, [row for row in ins.checks if row[0] != "ok"])
    if not ins.ok:
        probs = ins.problems
        _, what, detail = probs[0]
        detail = detail if len(detail) <= 240 else detail[:240] + " …"
        more = f" (+{len(probs) - 1} more problems, see above)" if len(probs) > 1 else ""
        print_error(f"{path} is not a usable checkpoint: {what}: {detail}{more}")
        return 1
    remember(path, args)
    try:
        plan = plan_summary(path, args.ram, ctx=args.ctx, expert_cache_mb=args.expert_cache_mb)
    except (ValueError, MemoryError) as e:
        print_error(str(e))
        return 1
    t = Table(
        title="memory plan" + ("" if args.ram else " (no --ram: cache every expert)"),
        show_header=False,
        title_justify="left",
    )
    for k, v in plan_table(plan):
        t.add_row(k, v)
    out.print(t)
    if not doctor:
        out.print("checkpoint ok")
        return 0
    warned = [what for status, what, _ in ins.checks + machine if status == "warn"]
    if not warned:
        out.print("[green]all checks passed[/]")
        return 0
    out.print(
        f"[yellow]{plural(len(warned), 'warning')}[/]: {', '.join(warned)} (see above); the "
        "checkpoint is usable" + ("" if args.strict else " (--strict: exit 1 on a warning)")
    )
    return 1 if args.strict else 0


def _size_line(ins: Inspection) -> str:
    z = ins.sizes
    drafter = f" · drafter {gb(z['drafter'])} (not used)" if z.get("drafter") else ""
    return (
        f"tensors: {len(ins.tensors)} · dense {gb(z['dense'])} · routed experts "
        f"{gb(z['experts'])}{drafter} · shards {len(ins.shard_sizes)}"
    )


_MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


def _print_rows(out, rows) -> None:
    """``ok   what: detail`` lines; on a terminal each wraps at word boundaries, its
    continuation indented under ``what``."""
    width = out.width if out.is_terminal else None
    for status, what, detail in rows:
        text = wrap(f"{status:<4} {what}: {detail}", width, " " * 5)
        out.print(_MARKS[status], end="")
        out.print(text[4:], markup=False, soft_wrap=True)


def _verify_rows(path: Path) -> list:
    """``doctor --verify``: every file hashed against the hub's published hash, with a progress
    bar on a terminal (stderr); the rows to print."""
    hashes = published_hashes(path)
    err = err_console()
    if err.is_terminal and hashes.files:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        with Progress(
            TextColumn("verifying {task.fields[file]}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("verify", total=hashes.total_bytes, file="")

            def progress(n: int, name: str) -> None:
                bar.update(task, advance=n, file=name)

            v = verify(path, progress, hashes)
    else:
        v = verify(path, None, hashes)
    if hashes.files:  # for list: "verified" while the files stay those hashed
        state.record_verification(
            path, v.ok, len(hashes.files), v.bytes_read, hashes.repo_id or None
        )
    rows = verify_checks(v, path)
    left = incomplete_downloads(path)
    if left:
        rows.append(
            (
                "warn",
                "downloads",
                f"{plural(len(left), 'interrupted download')} left behind ({left[0].name}); "
                f"`{download_command(hashes.repo_id or release_repo(path))}` resumes",
            )
        )
    return rows


def cmd_download(args: argparse.Namespace) -> int:
    try:
        folder = download(args.repo, args.dir, force=args.force)
    except HubError as e:
        raise CliError(str(e), e.code) from None
    out = out_console()
    out.print(f"downloaded {args.repo} to {folder}", markup=False)
    ins = inspect_checkpoint(folder)
    _print_rows(out, ins.checks)
    if not args.no_verify:
        rows = _verify_rows(folder)
        for row in rows:
            ins.add(*row)
        _print_rows(out, rows)
    if not ins.ok:
        _, what, detail = ins.problems[0]
        more = f" (+{len(ins.problems) - 1} more, see above)" if len(ins.problems) > 1 else ""
        print_error(f"the download of {args.repo} is not usable: {what}: {detail}{more}")
        return 1
    state.remember_checkpoint(folder, None if args.dir else args.repo)
    model = args.dir if args.dir else args.repo
    out.print(f"ready: v4flash chat --model {model}", markup=False)
    return 0
