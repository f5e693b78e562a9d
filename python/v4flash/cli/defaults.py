"""Defaults from the environment and from a file, as llama.cpp's ``LLAMA_ARG_*`` and ollama's
``OLLAMA_*``: ``V4FLASH_MODEL=DIR v4flash chat`` is ``v4flash chat --model DIR``.

Precedence: a flag, then the environment variable, then the defaults file, then the built-in
default. The file (``state.config_file()``, e.g. ``~/.config/v4flash/config.toml``) holds
``key = value`` lines (a small TOML subset: ``#`` comments, quoted or bare values); the keys are
the long option names (``max-tokens`` or ``max_tokens``); keys under a ``[serve]`` (``[chat]``,
…) header apply to that command only, and win over the keys above every header::

    model = "deepseek-ai/DeepSeek-V4-Flash-0731"
    ram = 24
    [serve]
    port = 8080

A value is checked only by the command that takes it, as the flag would be, and the error
names where it came from. ``--help`` shows each option's variable, and the value in force when
one is set. The engine's switches (``V4FLASH_KERNELS``, ``V4FLASH_BF16``, …) are the core's
(``rust/tuning.rs``), not read here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import state

# option (its dest) -> the environment variable that sets its default
ENV: Dict[str, str] = {
    "model": "V4FLASH_MODEL",
    "ram": "V4FLASH_RAM",
    "ctx": "V4FLASH_CTX",
    "threads": "V4FLASH_THREADS",
    "expert_cache_mb": "V4FLASH_EXPERT_CACHE_MB",
    "numerics": "V4FLASH_NUMERICS",
    "max_tokens": "V4FLASH_MAX_TOKENS",
    "temperature": "V4FLASH_TEMPERATURE",
    "host": "V4FLASH_HOST",
    "port": "V4FLASH_PORT",
    "api_key": "V4FLASH_API_KEY",
    "prompt_cache_dir": "V4FLASH_PROMPT_CACHE_DIR",
}
SECRET = {"api_key"}  # never shown in --help


class Sourced(str):
    """A default's text with where it came from (``$V4FLASH_RAM``, ``FILE line 3``)."""

    origin: str = ""

    def __new__(cls, text: str, origin: str) -> Sourced:
        s = super().__new__(cls, text)
        s.origin = origin
        return s


class FileError(ValueError):
    pass


def _value(raw: str, where: str) -> str:
    v = raw.strip()
    if v.startswith('"'):
        end = v.find('"', 1)
        while end > 0 and v[end - 1] == "\\":
            end = v.find('"', end + 1)
        if end < 0:
            raise FileError(f"{where}: unterminated string")
        try:
            return json.loads(v[: end + 1])
        except ValueError:
            raise FileError(f"{where}: bad string {v[: end + 1]}") from None
    if v.startswith("'"):
        end = v.find("'", 1)
        if end < 0:
            raise FileError(f"{where}: unterminated string")
        return v[1:end]
    return v.split(" #", 1)[0].split("\t#", 1)[0].strip()


def read_file(path: Path) -> Dict[str, Dict[str, Tuple[str, str]]]:
    """section ("" above every header) -> key (an option's dest) -> (value, where); {} when
    the file does not exist. ``FileError`` for a line that is not ``key = value``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise FileError(f"{path}: cannot read it: {e}") from None
    out: Dict[str, Dict[str, Tuple[str, str]]] = {"": {}}
    section = ""
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{path} line {n}"
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        if s.startswith("["):
            if not s.endswith("]") or not s[1:-1].strip():
                raise FileError(f"{where}: expected [COMMAND], got {s!r}")
            section = s[1:-1].strip().strip("\"'")
            out.setdefault(section, {})
            continue
        key, eq, raw = s.partition("=")
        key = key.strip().strip("\"'")
        if not eq or not key:
            raise FileError(f"{where}: expected KEY = VALUE, got {s!r}")
        out[section][key.replace("-", "_").lower()] = (_value(raw, where), where)
    return out


def _subparsers(p: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _checked_type(action: argparse.Action) -> Callable[[str], Any]:
    """The action's type, which also names where a default came from when it refuses it, and
    checks its choices (argparse does not check a default's)."""
    convert = action.type or (lambda s: s)
    choices = action.choices

    def parse(s: str) -> Any:
        origin = getattr(s, "origin", None)
        try:
            v = convert(str(s))  # type: ignore[operator]
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (from {origin})" if origin else str(e)) from None
        except ValueError:
            if origin:
                raise argparse.ArgumentTypeError(
                    f"invalid value {str(s)!r} (from {origin})"
                ) from None
            raise
        if origin and choices is not None and v not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {str(s)!r} (from {origin}); choose from "
                + ", ".join(map(str, choices))
            )
        return v

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def apply(p: argparse.ArgumentParser, environ: Optional[Dict[str, str]] = None) -> List[str]:
    """Sets the defaults of ``p``'s commands from the environment and the defaults file, and
    names each option's variable in its help. Returns the warnings to print (unknown keys).
    ``FileError`` for a file that cannot be read."""
    env = os.environ if environ is None else environ
    path = state.config_file()
    doc = read_file(path)
    warnings: List[str] = []
    commands = _subparsers(p)
    for section, keys in doc.items():
        if section and section not in commands:
            where = next(iter(keys.values()), ("", str(path)))[1]
            warnings.append(f"{path}: [{section}] is not a command ({where})")
        for key, (_, where) in keys.items():
            if key not in ENV:
                warnings.append(
                    f"{where}: unknown setting {key!r} (known: "
                    + ", ".join(k.replace("_", "-") for k in ENV)
                    + ")"
                )
    seen = set()
    for name, sub in commands.items():
        if id(sub) in seen:  # an alias
            continue
        seen.add(id(sub))
        for action in sub._actions:
            var = ENV.get(action.dest)
            if var is None or not action.option_strings:
                continue
            value: Optional[Sourced] = None
            if env.get(var):
                value = Sourced(env[var], f"${var}")
            else:
                for section in (name, ""):
                    if action.dest in doc.get(section, {}):
                        text, where = doc[section][action.dest]
                        value = Sourced(text, where)
                        break
            action.type = _checked_type(action)
            if value is not None:
                action.default = value
            if action.help is argparse.SUPPRESS:
                continue
            note = f"${var}"
            if value is not None:
                shown = "set" if action.dest in SECRET else repr(str(value))
                place = "the environment" if value.origin.startswith("$") else value.origin
                note += f"; here {shown}, from {place}"
            action.help = f"{action.help or ''} [{note.replace('%', '%%')}]".strip()
    p.epilog = (
        (p.epilog + " " if p.epilog else "")
        + "Options default to their V4FLASH_* environment variable (named in each command's "
        f"--help), else to {path} (KEY = VALUE lines; [COMMAND] sections), else to the "
        "built-in default."
    )
    return warnings


def print_warnings(warnings: List[str]) -> None:
    for w in warnings:
        print(f"v4flash: warning: {w}", file=sys.stderr)
