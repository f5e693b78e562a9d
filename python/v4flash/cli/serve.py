"""``v4flash serve``: the HTTP server (``server``) on a loaded model, until Ctrl-C or SIGTERM;
running answers end at their next token, queued requests get 503. While it runs it is
registered in the state folder (pid, address, model, start) for ``v4flash ps``."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from .. import __version__, state
from ..server import make_server
from ..server.guard import is_loopback
from ..server.transport import Limits
from ..textapi.attached import use_tokenizer
from ..textapi.disk import DiskOptions
from ..units import GB
from .common import CliError, load_model, resolve_model


def _served_name(args: argparse.Namespace, path: Path, demo: bool) -> str:
    """The model id /v1/models shows: --name, else the repo id --model named, else the
    checkpoint folder's name."""
    if args.name:
        return args.name
    if demo:
        return "v4flash-demo"
    return getattr(args, "model_repo", None) or path.resolve().name


def _planned_parallel(args: argparse.Namespace, path: Path) -> int:
    """The plan's ``parallel`` for this checkpoint, budget and context (1 when it cannot be
    planned: the load then says why)."""
    import v4flash

    kw = {"ctx": args.ctx}
    if getattr(args, "expert_cache_mb", None) is not None:
        kw["expert_cache_mb"] = args.expert_cache_mb
    try:
        return int(v4flash.plan(path, args.ram, **kw).get("parallel", 1))
    except (ValueError, MemoryError, OSError, RuntimeError, v4flash.V4FlashError):
        return 1


def cmd_serve(args: argparse.Namespace) -> int:
    path, demo = resolve_model(args)
    name = _served_name(args, path, demo)
    limits = Limits(max_body_bytes=int(args.max_body_mb * (1 << 20)))
    disk = None
    if args.prompt_cache_dir:
        disk = DiskOptions(
            Path(args.prompt_cache_dir).expanduser(),
            int(args.prompt_cache_disk * GB),
            args.prompt_cache_min,
        )
        try:
            disk.prepare()  # a bad directory is said now, not after the model loads
        except ValueError as e:
            raise CliError(str(e)) from None
    parallel = args.parallel or _planned_parallel(args, path)
    try:  # bind first: a taken port is said before the model loads, not minutes after
        srv = make_server(
            None,
            args.host,
            args.port,
            name=name,
            api_key=args.api_key,
            max_tokens=args.max_tokens,
            cache_sessions=args.prompt_cache,
            cache_disk=disk,
            cors=args.cors or (),
            ping_every=args.sse_ping,
            limits=limits,
            webui=args.webui,
            parallel=parallel,
        )
    except OSError as e:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from None
    if not is_loopback(args.host) and not args.api_key:
        print(
            f"v4flash: warning: listening on {args.host} without --api-key: anyone who can "
            "reach this port can use the model",
            file=sys.stderr,
        )
    srv.start()  # /health answers 503 "loading" meanwhile
    entry = state.register_server(  # for v4flash ps; removed at exit
        {
            "url": srv.url,
            "model": name,
            "path": str(path),
            "demo": demo,
            "version": __version__,
            "api_key": bool(args.api_key),
        }
    )

    def on_term(signum, frame):  # SIGTERM: stop like Ctrl-C
        raise KeyboardInterrupt

    old = None
    if hasattr(signal, "SIGTERM"):
        try:
            old = signal.signal(signal.SIGTERM, on_term)
        except ValueError:  # not the main thread
            pass
    done = True
    try:
        args.sessions = parallel  # the scheduler steps that many side by side
        model, tok = load_model(args, path)  # prints the plan line
        use_tokenizer(model, tok)
        srv.engine.set_model(model)
        print(
            f"v4flash: serving {name} at {srv.url}/v1 (OpenAI, Anthropic and Responses APIs; "
            + (f"{parallel} requests side by side; " if parallel > 1 else "")
            + (f"chat page at {srv.url}/; " if args.webui else "")
            + "Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        srv.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        state.unregister_server(entry)
        done = srv.shutdown(10.0)  # running answers end at their next token, queued get 503
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    print(
        "v4flash: server stopped" + ("" if done else " (requests still running were cut)"),
        file=sys.stderr,
    )
    return 0
