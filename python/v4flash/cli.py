"""The ``v4flash`` command line: ``chat``, ``run``, ``serve``, ``info``, ``doctor``, ``bench``,
``download``.

Everything the user asked for goes to stdout (answers, reports); the one-line plan, loading
progress and notices go to stderr, so ``v4flash run ... > answer.txt`` stays clean. Errors are
one line on stderr (``v4flash: error: ...``) with a non-zero exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from . import NUMERICS, __version__, hub, kernel_tier
from .config import expected_tensors  # noqa: F401  (re-exported for tests)
from .doctor import (  # noqa: E402,F401  (re-exported for tests and tools)
    Inspection,
    TensorEntry,
    inspect_checkpoint,
    is_routed_expert,
    machine_checks,
    plan_line,
    plan_summary,
    plan_table,
    thread_warning,
)
from .hub import REPO_ID, HubError
from .model import sample_params
from .units import gb, plural

# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def _checked(convert, what: str, ok=None, want: str = ""):
    """An argparse type: ``convert`` the string (else "expected WHAT"), then, with ``ok``,
    ``ok(value)`` (else "expected WANT")."""

    def parse(s: str):
        try:
            v = convert(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
        if ok is not None and not ok(v):
            raise argparse.ArgumentTypeError(f"expected {want}, got {s!r}")
        return v

    return parse


_positive_float = _checked(
    float, "a number", lambda v: math.isfinite(v) and v > 0, "a positive number"
)
_positive_int = _checked(int, "an integer", lambda v: v >= 1, "an integer >= 1")
_nonneg_int = _checked(int, "an integer", lambda v: v >= 0, "an integer >= 0")


def _sampling(name: str, convert):
    """An argparse type for a sampling parameter: converted here, checked by the core's one
    rule (``model.sample_params``), whose message names the parameter."""
    number = _checked(convert, "a number" if convert is float else "an integer")

    def parse(s: str):
        v = number(s)
        try:
            sample_params(**{name: v})
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return v

    return parse


def _stop_string(s: str) -> str:
    if not s:
        raise argparse.ArgumentTypeError("a stop string cannot be empty")
    return s


def _model_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "-m",
        "--model",
        metavar="DIR",
        help="checkpoint folder, or a Hugging Face repo id found in the local cache "
        f"({REPO_ID}) (default: the tiny demo)",
    )
    g.add_argument("--ram", type=_positive_float, metavar="GB", help="RAM budget in GB")
    g.add_argument(
        "--expert-cache-mb",
        type=_positive_float,
        metavar="MB",
        help="size the routed-expert cache directly (overrides the --ram plan)",
    )


def _engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("-t", "--threads", type=_positive_int, metavar="N", help="compute threads (all)")
    g.add_argument(
        "-c",
        "--ctx",
        type=_positive_int,
        metavar="TOKENS",
        help="context length cap (default: min(model maximum, 65536))",
    )
    g.add_argument(
        "--io",
        choices=["direct", "buffered", "mmap"],
        default="direct",
        help="expert reads: direct I/O (io_uring/O_DIRECT where available), "
        "buffered preads, or memory-mapped shards",
    )
    g.add_argument(
        "--cache-policy",
        choices=["freq-decay", "lru"],
        default="freq-decay",
        help="expert cache eviction policy",
    )
    g.add_argument(
        "--numerics",
        choices=list(NUMERICS),
        default="exact",
        help="exact: float32 activations (checked against the reference); fast: bf16 "
        "activations and bf16 products where the CPU runs them at full rate; int8 activations "
        "for the FP4 expert products on ARM; elsewhere the same as exact; fp8-act: DeepSeek's "
        "FP8 activation round trip, for measuring; official: every quantization step "
        "DeepSeek's reference inference applies (activations, KV, indexer) (see README, "
        "Numerics)",
    )
    g.add_argument(
        "--io-threads", type=_positive_int, default=8, metavar="N", help=argparse.SUPPRESS
    )


def _generation_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("generation")
    g.add_argument(
        "-n",
        "--max-tokens",
        type=_positive_int,
        default=max_tokens,
        metavar="N",
        help=f"tokens to generate per answer (default {max_tokens})",
    )
    g.add_argument(
        "--temperature",
        type=_sampling("temperature", float),
        default=1.0,
        metavar="T",
        help="sampling temperature; 0 = greedy (default 1.0, the model card's)",
    )
    g.add_argument(
        "--top-p", type=_sampling("top_p", float), default=1.0, metavar="P", help="nucleus (1.0)"
    )
    g.add_argument(
        "--top-k", type=_sampling("top_k", int), default=0, metavar="K", help="0 = off (0)"
    )
    g.add_argument(
        "--seed", type=_sampling("seed", int), metavar="N", help="sampling seed (random)"
    )
    g.add_argument("--thinking", action="store_true", help="thinking mode (reasoning first)")
    g.add_argument("--reasoning-effort", choices=("low", "high", "max"), help="thinking mode only")
    g.add_argument("--system", metavar="TEXT", help="system prompt")
    g.add_argument(
        "--stop",
        action="append",
        metavar="TEXT",
        type=_stop_string,
        help="end the answer before TEXT (repeatable; not printed)",
    )


def _output_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output").add_mutually_exclusive_group()
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also the whole memory plan, the read engine, and timings and expert traffic "
        "after each answer",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no plan, loading or per-answer status lines on stderr (errors, warnings and the "
        "demo notice stay)",
    )


def _bench_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("benchmark")
    g.add_argument(
        "-p", "--prompt", type=_positive_int, default=16, metavar="N", help="prompt tokens (16)"
    )
    g.add_argument(
        "-n", "--gen", type=_positive_int, default=4, metavar="N", help="decode tokens (4)"
    )
    g.add_argument(
        "--emulate-full-ram",
        type=_positive_float,
        metavar="GB",
        help="size the expert cache so each layer gets the share the full 43-layer model "
        "would get under this RAM budget (for short synthetic checkpoints)",
    )
    g.add_argument("--json", action="store_true", help="machine-readable output")
    g.add_argument(
        "--cold",
        action="store_true",
        help="send the prompt right after load, without waiting for the expert cache's "
        "pre-fault (the time to first token of a fresh process)",
    )
    g.add_argument("--no-machine", action="store_true", help="skip the bandwidth probes")
    g.add_argument("--no-fma", action="store_true", help="skip the FMA peak probe")
    g.add_argument(
        "--mem-gb", type=_positive_float, default=1.0, metavar="GB", help="memory probe size (1)"
    )
    g.add_argument(
        "--disk-gb", type=_positive_float, default=1.0, metavar="GB", help="disk probe size (1)"
    )
    g.add_argument(
        "--predict",
        action="store_true",
        help="print the full-model prediction table (no checkpoint needed)",
    )
    g.add_argument(
        "--mem-gbs",
        type=_positive_float,
        metavar="GB/S",
        help="memory bandwidth for --predict (default: measured here)",
    )
    # the benchmark's old name for --cache-policy
    p.add_argument(
        "--policy", dest="cache_policy", choices=["freq-decay", "lru"], help=argparse.SUPPRESS
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="v4flash",
        description="Run DeepSeek V4 Flash on the CPU, streaming experts from disk.",
        epilog="Without --model the commands use a tiny demo model (not DeepSeek).",
    )
    p.add_argument("--version", action="version", version=f"v4flash {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    chat = sub.add_parser(
        "chat",
        help="interactive chat in the terminal (or from piped stdin)",
        description="Chat in the terminal (/help lists the commands). A paste is one message; "
        '""" opens and closes a multi-line message. Piped stdin: one line is one message, '
        'except inside a """ block.',
    )
    _model_options(chat)
    _engine_options(chat)
    _generation_options(chat, 1024)
    _output_options(chat)
    chat.add_argument(
        "--stats-json", metavar="FILE", help="write per-turn statistics (JSON) to FILE at exit"
    )
    chat.add_argument(
        "--session",
        metavar="FILE",
        help="resume the conversation saved in FILE (its state too: nothing is prefilled "
        "again) and save it there at exit; a new conversation if FILE does not exist",
    )

    run = sub.add_parser(
        "run",
        help="answer one prompt on stdout",
        description="Answer one prompt on stdout. With both a prompt and piped stdin "
        '(cat notes.txt | v4flash run "Summarize"), the model gets the piped text, a blank '
        "line, then the prompt.",
    )
    run.add_argument("prompt", nargs="?", help="the prompt (default: read stdin)")
    run.add_argument(
        "-p", "--prompt", dest="prompt_option", metavar="TEXT", help="the prompt, as an option"
    )
    _model_options(run)
    _engine_options(run)
    _generation_options(run, 1024)
    _output_options(run)
    run.add_argument(
        "--raw",
        action="store_true",
        help="the prompt is raw text: no chat template (special tokens allowed)",
    )
    run.add_argument("--json", action="store_true", help="print ids, text and stats as JSON")

    serve = sub.add_parser(
        "serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)"
    )
    _model_options(serve)
    _engine_options(serve)
    g = serve.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    g.add_argument("--port", type=_nonneg_int, default=8000, help="port (8000; 0 = any free)")
    g.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("V4FLASH_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' (default: $V4FLASH_API_KEY, else none)",
    )
    g.add_argument(
        "--name", metavar="NAME", help="model id shown by /v1/models (the checkpoint folder)"
    )
    g.add_argument(
        "-n",
        "--max-tokens",
        type=_positive_int,
        default=4096,
        metavar="N",
        help="answer length when a request sets no max_tokens (4096)",
    )
    g.add_argument(
        "--prompt-cache",
        type=_nonneg_int,
        default=4,
        metavar="N",
        help="conversations whose state is kept for reuse (4; 0 = off)",
    )

    for name, text in (
        ("info", "describe a checkpoint (validated, no weights loaded) and the memory plan"),
        ("doctor", "check a checkpoint file by file and the machine, say what is wrong"),
    ):
        q = sub.add_parser(name, help=text)
        _model_options(q)
        q.add_argument(
            "-c", "--ctx", type=_positive_int, metavar="TOKENS", help="context length for the plan"
        )
        q.add_argument(
            "-t",
            "--threads",
            type=_positive_int,
            metavar="N",
            help="compute threads to check against the cores (all)"
            if name == "doctor"
            else argparse.SUPPRESS,
        )
        if name == "doctor":
            q.add_argument(
                "--verify",
                action="store_true",
                help="also hash every file and compare with the sha256 the Hugging Face hub "
                "published (reads the whole checkpoint once)",
            )

    dl = sub.add_parser(
        "download",
        help="download a checkpoint from the Hugging Face hub (resumable), then verify it",
        description="Downloads the checkpoint with huggingface_hub (an interrupted download "
        "resumes where it stopped), into the Hugging Face cache or --dir, then checks it as "
        "doctor --verify does. Needs huggingface_hub: pip install 'v4flash[hub]'.",
    )
    dl.add_argument("repo", nargs="?", default=REPO_ID, help=f"repo id (default {REPO_ID})")
    dl.add_argument(
        "--dir",
        metavar="DIR",
        help="put the files in DIR (then --model DIR) instead of the Hugging Face cache "
        "(then --model REPO)",
    )
    dl.add_argument(
        "--no-verify", action="store_true", help="skip hashing the files after the download"
    )

    bench = sub.add_parser(
        "bench",
        help="whole-run benchmark: load, prefill, decode, and the machine's limits",
        description="Loads the checkpoint, prefills a prompt, decodes greedily, measures the "
        "machine's memory and disk bandwidth and reports the decode speed this checkpoint "
        "could reach (see benches/README.md).",
    )
    _model_options(bench)
    _engine_options(bench)
    _bench_options(bench)
    return p


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


class CliError(Exception):
    """An error to print as one line (exit code ``code``)."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


def _err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)


def resolve_model(args: argparse.Namespace) -> Tuple[Path, bool]:
    """(checkpoint dir, is_demo); prints the demo notice on stderr."""
    from .demo import DEMO_NOTICE, demo_path

    if getattr(args, "reasoning_effort", None) and not getattr(args, "thinking", True):
        print(
            "v4flash: note: --reasoning-effort applies to thinking mode only (add --thinking)",
            file=sys.stderr,
        )

    if args.model:
        try:
            found = hub.locate(args.model)
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

    from .tokenizer import load_tokenizer

    err = _err_console()
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


def cmd_info(args: argparse.Namespace, doctor: bool) -> int:
    from rich.console import Console
    from rich.table import Table

    out = Console(highlight=False, emoji=False, soft_wrap=True)
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
    marks = _MARKS
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
        _print_rows(
            out,
            machine_checks(path / shard if shard else None, args.ram, args.threads, room),
        )
    else:
        if ins.config is not None:
            out.print(f"model: {ins.checks[0][2]}", markup=False)
        if ins.tensors:
            out.print(_size_line(ins), markup=False)
        if ins.drafter is not None and ins.drafter["usable"]:
            out.print(f"drafter: {ins.drafter['summary']}", markup=False)
        for status, what, detail in ins.checks:
            if status != "ok":
                out.print(f"{marks[status]} {what}: ", end="")
                out.print(detail, markup=False)
    if not ins.ok:
        probs = ins.problems
        _, what, detail = probs[0]
        detail = detail if len(detail) <= 240 else detail[:240] + " …"
        more = f" (+{len(probs) - 1} more problems, see above)" if len(probs) > 1 else ""
        print(
            f"v4flash: error: {path} is not a usable checkpoint: {what}: {detail}{more}",
            file=sys.stderr,
        )
        return 1
    try:
        plan = plan_summary(path, args.ram, ctx=args.ctx, expert_cache_mb=args.expert_cache_mb)
    except (ValueError, MemoryError) as e:
        print(f"v4flash: error: {e}", file=sys.stderr)
        return 1
    t = Table(
        title="memory plan" + ("" if args.ram else " (no --ram: cache every expert)"),
        show_header=False,
        title_justify="left",
    )
    for k, v in plan_table(plan):
        t.add_row(k, v)
    out.print(t)
    out.print("checkpoint ok" if not doctor else "[green]all checks passed[/]")
    return 0


def _size_line(ins: Inspection) -> str:
    z = ins.sizes
    drafter = f" · drafter {gb(z['drafter'])} (not used)" if z.get("drafter") else ""
    return (
        f"tensors: {len(ins.tensors)} · dense {gb(z['dense'])} · routed experts "
        f"{gb(z['experts'])}{drafter} · shards {len(ins.shard_sizes)}"
    )


_MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}


def _print_rows(out, rows) -> None:
    for status, what, detail in rows:
        out.print(f"{_MARKS[status]} {what}: ", end="")
        out.print(detail, markup=False)


def _verify_rows(path: Path) -> list:
    """``doctor --verify``: every file hashed against the hub's published hash, with a progress
    bar on a terminal (stderr); the rows to print."""
    hashes = hub.published_hashes(path)
    err = _err_console()
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

            v = hub.verify(path, progress, hashes)
    else:
        v = hub.verify(path, None, hashes)
    rows = hub.verify_checks(v, path)
    left = hub.incomplete_downloads(path)
    if left:
        rows.append(
            (
                "warn",
                "downloads",
                f"{plural(len(left), 'interrupted download')} left behind ({left[0].name}); "
                f"`{hub.download_command(hashes.repo_id or hub.release_repo(path))}` resumes",
            )
        )
    return rows


def _piped_stdin(stdin: Any) -> bool:
    """True when stdin is a pipe or a redirected file (``cat f | v4flash run ...``,
    ``< f``): data to read that ends. Not for a terminal, /dev/null, a socket, or a stand-in
    without a file descriptor."""
    import stat

    if stdin is None:
        return False
    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def read_prompt(args: argparse.Namespace, stdin: Any = None) -> str:
    """The prompt: the argument (or ``-p``), piped stdin, or both: the piped text, a blank
    line, then the argument (an instruction after the text it is about, as
    ``cat notes.txt | v4flash run "Summarize"`` reads)."""
    stdin = sys.stdin if stdin is None else stdin
    given = [x for x in (args.prompt, args.prompt_option) if x is not None]
    if len(given) > 1:
        raise CliError("give the prompt once: as an argument or with -p/--prompt, not both", 2)
    arg = given[0] if given else None
    if arg is None:
        if stdin is None or stdin.isatty():
            raise CliError(
                'run needs a prompt: v4flash run "your question" (or pipe it on stdin)', 2
            )
        return stdin.read()
    if not _piped_stdin(stdin):
        return arg
    piped = stdin.read()
    if not piped.strip():
        return arg
    return piped.rstrip() + "\n\n" + arg


def cmd_run(args: argparse.Namespace) -> int:
    from .chat.conversation import Conversation, Sampling
    from .chat.display import PrefillBar, detail_line

    prompt = read_prompt(args)
    if not prompt.strip():
        raise CliError("the prompt is empty", 2)
    path, demo = resolve_model(args)
    model, tok = load_model(args, path)
    sampling = Sampling(
        args.temperature, args.top_p, args.top_k, args.seed, args.max_tokens, tuple(args.stop or ())
    )
    stream = not args.json
    state = {"phase": None}

    def on_text(kind: str, text: str) -> None:
        if not stream or not text:
            return
        if kind == "reasoning":  # the answer goes to stdout; reasoning to stderr
            sys.stderr.write(text)
            sys.stderr.flush()
        else:
            if state["phase"] == "reasoning":
                sys.stderr.write("\n")
            sys.stdout.write(text)
            sys.stdout.flush()
        state["phase"] = kind

    bar = PrefillBar(_err_console() if not args.quiet else None)
    try:
        if args.raw:
            conv = Conversation(model, tok, thinking=False)
            result = conv.complete_raw(tok.encode(prompt), sampling, on_text, bar.callback)
        else:
            conv = Conversation(
                model,
                tok,
                thinking=args.thinking,
                system=args.system,
                reasoning_effort=args.reasoning_effort,
            )
            result = conv.respond(prompt, sampling, on_text, bar.callback)
    finally:
        bar.stop()
    if state["phase"] == "reasoning":  # the reasoning ended the output: end its line
        sys.stderr.write("\n")
        sys.stderr.flush()
    if result.stats.get("error"):
        raise CliError(result.stats["error"])
    if args.json:
        doc = {
            "model": str(path),
            "demo": demo,
            "numerics": model.numerics,
            "prompt_ids": result.prompt_ids,
            "ids": result.ids,
            "text": result.text,
            "reasoning": result.reasoning,
            "content": result.content,
            "stop": result.stop,
            "stats": result.stats,
        }
        print(json.dumps(doc, ensure_ascii=False))
    else:
        if not result.text.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.flush()
        if args.verbose:
            print(detail_line(result.stats), file=sys.stderr)
        elif not args.quiet:
            print(_status_text(result.stats), file=sys.stderr)
    return 130 if result.stop == "interrupted" else 0


def _status_text(s: Dict[str, Any]) -> str:
    from .chat.display import status_line

    return status_line(s)


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat.conversation import Sampling
    from .chat.terminal import ChatApp

    path, demo = resolve_model(args)
    model, tok = load_model(args, path)
    sampling = Sampling(
        args.temperature, args.top_p, args.top_k, args.seed, args.max_tokens, tuple(args.stop or ())
    )
    app = ChatApp(
        model,
        tok,
        sampling,
        thinking=args.thinking,
        system=args.system,
        reasoning_effort=args.reasoning_effort,
        demo=demo,
        verbosity=-1 if args.quiet else (1 if args.verbose else 0),
        session_path=Path(args.session).expanduser() if args.session else None,
    )
    code = app.run()
    if args.stats_json:
        Path(args.stats_json).write_text(json.dumps(app.stats_doc(), indent=1))
    return code


def _served_name(args: argparse.Namespace, path: Path, demo: bool) -> str:
    """The model id /v1/models shows: --name, else the repo id --model named, else the
    checkpoint folder's name."""
    if args.name:
        return args.name
    if demo:
        return "v4flash-demo"
    return getattr(args, "model_repo", None) or path.resolve().name


def cmd_serve(args: argparse.Namespace) -> int:
    import signal

    from .server import make_server
    from .textapi.attached import use_tokenizer

    path, demo = resolve_model(args)
    model, tok = load_model(args, path)  # prints the plan line
    use_tokenizer(model, tok)
    name = _served_name(args, path, demo)
    try:
        srv = make_server(
            model,
            args.host,
            args.port,
            name=name,
            api_key=args.api_key,
            max_tokens=args.max_tokens,
            cache_sessions=args.prompt_cache,
        )
    except OSError as e:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(
            f"v4flash: warning: listening on {args.host} without --api-key: anyone who can "
            "reach this port can use the model",
            file=sys.stderr,
        )
    print(
        f"v4flash: serving {name} at {srv.url}/v1 (OpenAI API; Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )

    def on_term(signum, frame):  # SIGTERM: stop like Ctrl-C
        raise KeyboardInterrupt

    old = None
    if hasattr(signal, "SIGTERM"):
        try:
            old = signal.signal(signal.SIGTERM, on_term)
        except ValueError:  # not the main thread
            pass
    try:
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        srv.engine.stopping.set()  # running answers end at their next token, queued get 503
        srv.server_close()
        done = srv.engine.wait_idle(10.0)
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    print(
        "v4flash: server stopped" + ("" if done else " (requests still running were cut)"),
        file=sys.stderr,
    )
    return 0


def _utf8_streams() -> None:
    """Generated text is arbitrary Unicode: write pipes as UTF-8 and never die on a console
    that cannot show a character (Windows code pages)."""
    for s in (sys.stdout, sys.stderr):
        if not hasattr(s, "reconfigure"):
            continue
        try:
            if s.isatty():
                s.reconfigure(errors="replace")
            elif (s.encoding or "").lower().replace("-", "") != "utf8":
                s.reconfigure(encoding="utf-8", errors="replace")
        except (ValueError, OSError):
            pass


def cmd_download(args: argparse.Namespace) -> int:
    from rich.console import Console

    try:
        folder = hub.download(args.repo, args.dir)
    except HubError as e:
        raise CliError(str(e), e.code) from None
    out = Console(highlight=False, emoji=False, soft_wrap=True)
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
        print(
            f"v4flash: error: the download of {args.repo} is not usable: {what}: {detail}{more}",
            file=sys.stderr,
        )
        return 1
    model = args.dir if args.dir else args.repo
    out.print(f"ready: v4flash chat --model {model}", markup=False)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.predict:
        return bench.predict(args.mem_gbs, args.mem_gb, args.threads, args.json)
    path, _ = resolve_model(args)
    return bench.bench_command(path, args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _utf8_streams()
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command in ("chat", "run", "serve", "bench"):
        warning = thread_warning(getattr(args, "threads", None))
        if warning:
            print(f"v4flash: warning: {warning}", file=sys.stderr)
    try:
        if args.command == "download":
            return cmd_download(args)
        if args.command in ("info", "doctor"):
            return cmd_info(args, args.command == "doctor")
        if args.command == "run":
            return cmd_run(args)
        if args.command == "chat":
            return cmd_chat(args)
        if args.command == "serve":
            return cmd_serve(args)
        if args.command == "bench":
            return cmd_bench(args)
    except (CliError, HubError) as e:
        print(f"v4flash: error: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print("\nv4flash: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, MemoryError, RuntimeError) as e:
        print(f"v4flash: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # V4FlashError and friends: one line, no traceback
        from . import V4FlashError

        if isinstance(e, V4FlashError):
            print(f"v4flash: error: {e}", file=sys.stderr)
            return 1
        raise
    return 2


if __name__ == "__main__":
    sys.exit(main())
