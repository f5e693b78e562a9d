"""The argument parser's class: an error in the arguments is the one line that matters,
``v4flash: error: …``, and one line saying where the help is (argparse's own prints the whole
usage first, nine lines for ``run``); a mistyped command gets the nearest one."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with short errors (its subcommands' parsers are too)."""

    def error(self, message: str) -> NoReturn:
        m = re.match(r"argument COMMAND: invalid choice: '([^']*)'", message)
        if m:
            known = sorted(self._commands())
            near = difflib.get_close_matches(m.group(1), known, n=1)
            message = f"unknown command {m.group(1)!r}" + (
                f"; did you mean {near[0]!r}?" if near else f" (commands: {', '.join(known)})"
            )
        sys.stderr.write(f"v4flash: error: {message}\n  see {self.prog} --help\n")
        sys.exit(2)

    def _commands(self) -> list:
        for a in self._actions:
            if isinstance(a, argparse._SubParsersAction):
                return list(a.choices)
        return []
