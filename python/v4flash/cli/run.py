"""``v4flash run``: one prompt answered on stdout (the reasoning on stderr), from an argument,
piped stdin, or both; ``--raw`` continues text without the chat template, ``--json`` prints
ids, text and figures."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from ..chat.conversation import Conversation, Sampling
from ..chat.display import PrefillBar, detail_line, status_line
from ..textapi import prepare_chat, prepare_completion, run_job
from .common import CliError, err_console, load_model, resolve_model


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


def response_format(args: argparse.Namespace) -> Any:
    """``--json-schema FILE`` / ``--grammar FILE`` as a response format (None: neither)."""
    path = getattr(args, "json_schema", None) or getattr(args, "grammar", None)
    if path is None:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"{path}: cannot read it: {getattr(e, 'strerror', None) or e}", 2) from None
    if getattr(args, "grammar", None):
        return {"type": "grammar", "grammar": text}
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise CliError(f"{path}: not a JSON Schema (not JSON: {e})", 2) from None
    return {"type": "json_schema", "json_schema": {"name": Path(path).stem, "schema": schema}}


def run_structured(args, model, prompt, rf, sampling, on_text) -> Any:
    """The answer under a grammar, through the text API (which compiles it; a grammar it
    cannot compile is a one-line error): the same fields as the conversation's result."""
    from types import SimpleNamespace

    kw = dict(
        max_new_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        response_format=rf,
        cache=False,
    )
    try:
        if args.raw:
            job = prepare_completion(model, prompt, **kw)
        else:
            msgs = [{"role": "system", "content": args.system}] if args.system else []
            msgs.append({"role": "user", "content": prompt})
            job = prepare_chat(
                model, msgs, thinking=args.thinking, reasoning_effort=args.reasoning_effort, **kw
            )
    except ValueError as e:
        raise CliError(str(e), 2) from None
    parts: dict = {"reasoning": [], "content": [], "text": []}
    end: dict = {}
    for kind, value in run_job(job):
        if kind in parts:
            parts[kind].append(value)
            on_text("content" if kind == "text" else kind, value)
        elif kind == "end":
            end = value
    usage, timings = end["usage"], end["timings"]
    stats = dict(
        timings,
        generated_tokens=usage.completion_tokens,
        prefill_tokens=usage.prompt_tokens,
        stop="eos" if end["finish_reason"] in ("stop", "tool_calls") else end["finish_reason"],
        expert_hit_rate=model.stats().get("expert_hit_rate"),
    )
    return SimpleNamespace(
        prompt_ids=list(job.prompt),
        ids=end["ids"],
        text=end["text"],
        reasoning="".join(parts["reasoning"]),
        content="".join(parts["content"] + parts["text"]),
        stop=stats["stop"],
        stats=stats,
    )


def cmd_run(args: argparse.Namespace) -> int:

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

    bar = PrefillBar(err_console() if not args.quiet else None)
    rf = response_format(args)
    try:
        if rf is not None:
            result = run_structured(args, model, prompt, rf, sampling, on_text)
        elif args.raw:
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
            print(status_line(result.stats), file=sys.stderr)
    # Ctrl-C: 130 (128 + SIGINT) whether it came during the prefill or the answer
    return 130 if result.stop in ("interrupted", "cancelled") else 0
