"""The chat's slash commands (``/help`` lists them): ``/think``, ``/system``, ``/set`` (the
sampling knobs, checked by the core's rule), ``/regen``, ``/reset``, ``/save`` and ``/load``
(the conversation as JSON messages), ``/stats``, ``/exit``. Each acts on a
:class:`~v4flash.chat.terminal.ChatApp` and says what it did in a note."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from ..sampling import sample_params

HELP = """commands:
  /think on|off    thinking mode (reasoning shown dimmed before the answer)
  /system TEXT     set the system prompt (/system alone clears it)
  /set KEY VALUE   temperature, top_p, top_k, seed (a number or random), max_tokens;
                   /set alone shows them
  /regen           answer the last message again (drops the last answer)
  /reset           start a new conversation
  /save FILE       write the conversation as JSON messages
  /load FILE       continue a saved conversation (JSON messages)
  /stats           per-turn and engine statistics
  /exit            quit (also /quit, Ctrl-D)
A paste is one message, whatever its lines; \"\"\" opens a multi-line message and \"\"\" closes it.
Ctrl-C stops the current answer and keeps the conversation."""


def _parse_int(v: str, lo: int) -> int:
    try:
        x = int(v)
    except ValueError:
        raise ValueError(f"expected an integer, got {v!r}") from None
    if x < lo:
        raise ValueError(f"expected an integer >= {lo}, got {v!r}")
    return x


def _sampling(name: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """A /set parser for a sampling parameter: converted here, checked by the core's one rule
    (``sampling.sample_params``), whose message names the parameter."""
    what = "a number" if convert is float else "an integer"

    def parse(v: str) -> Any:
        if name == "seed" and v.lower() in ("random", "none", "off"):
            return None
        try:
            x = convert(v)
        except ValueError:
            raise ValueError(f"expected {what}, got {v!r}") from None
        sample_params(**{name: x})
        return x

    return parse


# /set KEY VALUE: the sampling knobs (names as the options and the OpenAI API spell them)
SETTINGS: Dict[str, Callable[[str], Any]] = {
    "temperature": _sampling("temperature", float),
    "top_p": _sampling("top_p", float),
    "top_k": _sampling("top_k", int),
    "seed": _sampling("seed", int),
    "max_tokens": lambda v: _parse_int(v, 1),
}
SETTING_ALIASES = {
    "temp": "temperature",
    "num_predict": "max_tokens",
    "max_new_tokens": "max_tokens",
}


def run(app: Any, text: str) -> Optional[str]:
    """Runs the command ``text``; ``"exit"`` when the chat should end."""
    cmd, _, arg = text.partition(" ")
    arg = arg.strip()
    cmd = cmd.lower()
    if cmd in ("/exit", "/quit", "/bye"):
        return "exit"
    if cmd == "/think":
        if arg.lower() in ("on", "1", "true", "yes"):
            app.conv.set_thinking(True)
        elif arg.lower() in ("off", "0", "false", "no"):
            app.conv.set_thinking(False)
        elif arg:
            app.note("usage: /think on|off")
            return None
        app.note(f"thinking mode {'on' if app.conv.thinking else 'off'}")
    elif cmd == "/system":
        app.conv.set_system(arg)
        app.note(f"system prompt set: {arg}" if arg else "system prompt cleared")
    elif cmd == "/set":
        _set(app, arg)
    elif cmd in ("/regen", "/retry"):
        app.regen()
    elif cmd == "/reset":
        app.conv.reset()
        app.note("conversation reset")
    elif cmd == "/stats":
        app.print_stats()
    elif cmd in ("/save", "/load"):
        _save_load(app, cmd, arg)
    elif cmd in ("/help", "/?"):
        app.out.print(HELP, markup=False)
    else:
        app.note(f"unknown command {cmd}; /help lists them")
    return None


def settings_text(s: Any) -> str:
    """The sampling settings (a ``Sampling``) in one line."""
    seed = "random" if s.seed is None else str(s.seed)
    text = (
        f"temperature {s.temperature:g} · top_p {s.top_p:g} · top_k {s.top_k} · "
        f"seed {seed} · max_tokens {s.max_tokens}"
    )
    if s.stop:
        text += " · stop " + ", ".join(repr(x) for x in s.stop)
    return text


def _set(app: Any, arg: str) -> None:
    words = arg.split()
    if words and words[0].lower() == "parameter":  # ollama's /set parameter KEY VALUE
        words = words[1:]
    if not words:
        app.note(settings_text(app.sampling))
        return
    key = words[0].lower().replace("-", "_")
    key = SETTING_ALIASES.get(key, key)
    if key not in SETTINGS:
        app.note(f"unknown setting {words[0]!r}; /set takes {', '.join(SETTINGS)}")
        return
    if len(words) != 2:
        app.note(f"usage: /set {key} VALUE")
        return
    try:
        value = SETTINGS[key](words[1])
    except ValueError as e:
        app.note(f"/set {key}: {e}")
        return
    setattr(app.sampling, key, value)
    app.note(f"{key} set to {'random' if value is None else value}")


def _save_load(app: Any, cmd: str, arg: str) -> None:
    if not arg:
        app.note(f"usage: {cmd} FILE")
        return
    path = Path(arg).expanduser()
    try:
        if cmd == "/save":
            doc = app.conv.export()
            path.write_text(json.dumps(doc, ensure_ascii=False, indent=1), encoding="utf-8")
            app.note(f"saved {len(doc)} messages to {path}")
        else:
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError as e:
                raise ValueError(f"not UTF-8 text ({e.reason})") from None
            n = app.conv.load(doc)
            app.show_conversation()
            app.note(f"loaded {n} messages from {path}")
    except (OSError, ValueError) as e:
        what = "save to" if cmd == "/save" else "load"
        app.note(f"cannot {what} {path}: {e}")
