"""The ``v4flash`` command line: ``chat``, ``run``, ``serve``, ``info``, ``doctor``, ``bench``,
``download``, ``list``, ``ps``, ``completion``.

Everything the user asked for goes to stdout (answers, reports); the one-line plan, loading
progress and notices go to stderr, so ``v4flash run ... > answer.txt`` stays clean. Errors are
one line on stderr (``v4flash: error: ...``) with a non-zero exit code, never a traceback.


One module per command (``run``, ``chat``, ``serve``, ``info`` for info/doctor/download,
``bench``, ``listing`` for list, ``ps``, ``completion``), the parser in ``options`` (its class
in ``parsing``, the defaults from the environment and a file in ``defaults``), what they share
in ``common``. Nothing in v4flash imports this package but ``__main__``.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from .. import V4FlashError
from ..doctor import thread_warning
from ..hub.releases import HubError
from . import defaults
from .bench import cmd_bench
from .chat import cmd_chat
from .common import CliError, print_error
from .completion import cmd_completion
from .info import cmd_download, cmd_info
from .listing import cmd_list
from .options import parser
from .ps import cmd_ps
from .run import cmd_run
from .serve import cmd_serve


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _utf8_streams()
    p = parser()
    try:
        defaults.print_warnings(defaults.apply(p))
    except defaults.FileError as e:
        print_error(str(e))
        return 2
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
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
        if args.command in ("list", "ls"):
            return cmd_list(args)
        if args.command in ("ps", "status"):
            return cmd_ps(args)
        if args.command == "completion":
            return cmd_completion(args, p)
    except (CliError, HubError) as e:
        print_error(str(e))
        return e.code
    except KeyboardInterrupt:
        print("\nv4flash: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, MemoryError, RuntimeError, V4FlashError) as e:
        print_error(str(e))  # one line (wrapped on a terminal), no traceback
        return 1
    return 2
