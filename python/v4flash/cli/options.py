"""The command line's arguments: the parser, its subcommands and the option groups they share
(model, engine, generation, output, benchmark), with argparse types that convert a string and
check it. The sampling options are checked by the core's rule (``model.sample_params``), the
one the server and the chat's ``/set`` use too."""

from __future__ import annotations

import argparse
import math
import os

from .. import NUMERICS, SPECULATE, __version__
from ..hub.releases import REPO_ID
from ..model import sample_params
from ..textapi.disk import DEFAULT_MIN_TOKENS
from .parsing import Parser


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
    g.add_argument(
        "--ram",
        type=_positive_float,
        metavar="GB",
        help="RAM budget for the whole process in GB (default: the memory available at the "
        "start, less a tenth of it, at least 1 GB)",
    )
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
        "--speculate",
        choices=list(SPECULATE),
        default="auto",
        help="speculative decoding: drafted tokens verified in one pass, the same answer "
        "sooner when they are right. lookup: drafts copied from the prompt and the answer; "
        "auto: lookup where the measured costs predict a gain, never where they predict a "
        "loss (default; with the 0731 drafter loaded, DSpark where it is predicted to gain, "
        "the draft's time counted); dspark: the 0731 drafter (load with --drafter); off",
    )
    g.add_argument(
        "--drafter",
        action="store_true",
        help="also load the 0731 checkpoint's DSpark drafter (0.6 GB resident and a 1.2 GB "
        "expert cache out of --ram) for --speculate dspark and auto",
    )
    g.add_argument(
        "--io-threads", type=_positive_int, default=8, metavar="N", help=argparse.SUPPRESS
    )


def _speculate_or_oracle(s: str) -> str:
    """bench's --speculate: a mode, or oracle:P (P in [0, 1])."""
    if s in SPECULATE:
        return s
    if s.startswith("oracle:"):
        try:
            p = float(s.split(":", 1)[1])
        except ValueError:
            p = -1.0
        if 0.0 <= p <= 1.0:
            return s
        raise argparse.ArgumentTypeError(f"oracle:P needs a probability P in [0, 1], got {s!r}")
    raise argparse.ArgumentTypeError(
        f"expected one of {', '.join(SPECULATE)} or oracle:P, got {s!r}"
    )


def _bench_speculate(p: argparse.ArgumentParser) -> None:
    """bench's --speculate: also oracle:P, the benchmark-only drafter of chosen acceptance;
    and the decode runs twice (without, then with) in the same process."""
    for a in p._actions:
        if a.dest == "speculate":
            a.choices = None
            a.type = _speculate_or_oracle
            a.metavar = "MODE"
            a.help = (
                "decode a second time from the same prefilled state with this speculation "
                f"and report both ({', '.join(SPECULATE)}; off: once; oracle:P: a drafter that "
                "proposes the first run's greedy continuation, each token right with "
                "probability P, for measuring the verify on checkpoints no real drafter "
                "suits; default auto)"
            )


def _generation_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("generation")
    g.add_argument(
        "-n",
        "--max-tokens",
        type=_positive_int,
        default=max_tokens,
        metavar="N",
        help=f"tokens to generate per answer (default {max_tokens}; serve's is 4096, for API "
        "clients that set none, often agents that write long answers)",
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
        help="no plan, loading, demo notice or per-answer status lines on stderr (errors and "
        "warnings stay)",
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
    g.add_argument(
        "--draft-ms",
        type=_positive_float,
        metavar="MS",
        help="a DSpark draft's time for --predict's DSpark columns, as measured by "
        "`cargo bench --bench dspark` on a 0731 checkpoint (default: estimated from its reads)",
    )
    # the benchmark's old name for --cache-policy
    p.add_argument(
        "--policy", dest="cache_policy", choices=["freq-decay", "lru"], help=argparse.SUPPRESS
    )


def parser() -> argparse.ArgumentParser:
    p = Parser(
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
    g = run.add_argument_group("structured output (the answer generated under a grammar)")
    g = g.add_mutually_exclusive_group()
    g.add_argument(
        "--json-schema",
        metavar="FILE",
        help="the answer is JSON valid against the JSON Schema in FILE",
    )
    g.add_argument("--grammar", metavar="FILE", help="the answer follows the Lark grammar in FILE")

    serve = sub.add_parser(
        "serve",
        help="HTTP server for OpenAI and Anthropic API clients",
        description="HTTP server: OpenAI's chat completions, completions and Responses APIs, "
        "Anthropic's Messages API, /metrics, /tokenize; it binds its port first, then loads "
        "the model (/health answers 503 until it is ready).",
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
        help="answer length when a request sets no max_tokens (4096, more than chat and run's "
        "1024: API clients, agents above all, rarely set it and their answers run long)",
    )
    g.add_argument(
        "--parallel",
        type=_positive_int,
        metavar="N",
        help="requests answered side by side, stepped together (one pass over the weights "
        "for all of them); more wait in arrival order (default: the plan's 'parallel': up to "
        "4 while their state leaves the expert cache room; 1 = one at a time)",
    )
    g.add_argument(
        "--round-prefill",
        type=_positive_int,
        metavar="N",
        help="with --parallel > 1: prompt tokens fed per round, shared by the prompts "
        "waiting (256 when the cache holds half the experts or more, else the plan's prefill "
        "span); "
        "smaller lets a new request start sooner behind a long prompt",
    )
    g.add_argument(
        "--prompt-cache",
        type=_nonneg_int,
        default=4,
        metavar="N",
        help="conversations whose state is kept for reuse (4; 0 = off)",
    )
    g.add_argument(
        "--prompt-cache-dir",
        metavar="DIR",
        help="keep conversation states on disk in DIR too, so that a long prompt is not "
        "prefilled again after a restart (default: RAM only)",
    )
    g.add_argument(
        "--prompt-cache-disk",
        type=_positive_float,
        default=20.0,
        metavar="GB",
        help="disk space the files in --prompt-cache-dir may take; least recently used go "
        "first (20)",
    )
    g.add_argument(
        "--prompt-cache-min",
        type=_positive_int,
        default=DEFAULT_MIN_TOKENS,
        metavar="N",
        help=f"states shorter than N tokens are not written to disk ({DEFAULT_MIN_TOKENS})",
    )
    g.add_argument(
        "--cors",
        action="append",
        metavar="ORIGIN",
        help="let web pages of ORIGIN (e.g. http://localhost:3000; * for any) call the API "
        "from a browser (repeatable; none by default)",
    )
    g.add_argument(
        "--sse-ping",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="a quiet event stream (a long prefill, a wait in the queue) gets a keep-alive "
        "every S seconds (10)",
    )
    g.add_argument(
        "--no-webui",
        dest="webui",
        action="store_false",
        help="no chat page at / (it is on by default)",
    )
    g.add_argument(
        "--max-body-mb",
        type=_positive_float,
        default=8.0,
        metavar="MB",
        help="largest request body accepted (8 MiB)",
    )

    for name, text in (
        ("info", "describe a checkpoint (validated, no weights loaded) and the memory plan"),
        ("doctor", "check a checkpoint file by file and the machine, say what is wrong"),
    ):
        q = sub.add_parser(name, help=text, description=_DESCRIPTIONS[name])
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
            q.add_argument(
                "--strict",
                action="store_true",
                help="exit 1 when a check warns (a warning alone exits 0)",
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
    dl.add_argument(
        "--force",
        action="store_true",
        help="start even when the disk looks too small for what is left to download",
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
    _bench_speculate(bench)
    _bench_options(bench)
    _manage_commands(sub)
    return p


_DESCRIPTIONS = {
    "info": "Describes a checkpoint without loading any weights: config.json and every shard "
    "header checked, the tensors and their sizes, the drafter, then the memory plan at --ram "
    "and --ctx. Exits 1 when the checkpoint is not usable.",
    "doctor": "Checks a checkpoint file by file (config, index, shard headers, every tensor's "
    "dtype and shape, the tokenizer; --verify: every file's sha256 against the Hugging Face "
    "hub's), then the machine (cores against --threads, free RAM against --ram, huge pages, "
    "the checkpoint disk's direct-read speed, io_uring, memory bandwidth) and the decode speed "
    "to expect. Exits 1 on a failed check; a warning is named in the summary (and exits 1 "
    "with --strict).",
}


def _manage_commands(sub) -> None:
    """``list``, ``ps`` and ``completion``: what is on this machine, and the shell's help."""
    ls = sub.add_parser(
        "list",
        aliases=["ls"],
        help="the checkpoints on this machine: size, release, whether they check out",
        description="Lists the checkpoints in the Hugging Face cache and the folders v4flash "
        "has used (remembered in its state folder, $V4FLASH_HOME), with their size, release "
        "(the first one, with an MTP block, or 0731, with DSpark) and a check of their headers "
        '(no weights read); "verified" when doctor --verify (or download) hashed every file '
        "and nothing changed since.",
    )
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ps = sub.add_parser(
        "ps",
        aliases=["status"],
        help="the v4flash servers running on this machine and what they are doing",
        description="Lists the running v4flash serve processes of this machine (each registers "
        "itself in the state folder, $V4FLASH_HOME, while it runs): address, model, whether it "
        "is loading, busy or idle, queued requests, the prompt cache (from its /health), "
        "memory in use and uptime.",
    )
    ps.add_argument("--json", action="store_true", help="machine-readable output")
    comp = sub.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh, fish)",
        description="Prints a completion script for the shell. bash: "
        'eval "$(v4flash completion bash)" in ~/.bashrc; zsh: '
        'eval "$(v4flash completion zsh)" in ~/.zshrc; fish: '
        "v4flash completion fish > ~/.config/fish/completions/v4flash.fish",
    )
    comp.add_argument("shell", choices=("bash", "zsh", "fish"), help="the shell")
