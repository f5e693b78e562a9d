"""``v4flash chat``: the terminal chat (``chat.terminal.ChatApp``) on a loaded model;
``--stats-json`` writes each turn's figures at exit."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..chat.conversation import Sampling
from ..chat.terminal import ChatApp, saved_conversation_problem
from .common import CliError, load_model, resolve_model


def cmd_chat(args: argparse.Namespace) -> int:
    if args.session:  # a /save file: said before the model loads
        problem = saved_conversation_problem(Path(args.session).expanduser())
        if problem:
            raise CliError(problem)
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
