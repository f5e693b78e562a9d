"""The ``rich`` terminal front end of ``v4flash chat``: reads messages (from a terminal, with
line editing and bracketed paste, or from piped stdin), runs slash commands (``commands``) and
turns (``Conversation``), and renders the answers as they stream, the reasoning dimmed.
``--session FILE`` resumes the conversation saved there and saves it at exit."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from ..units import plural
from . import commands
from .conversation import Conversation, Sampling, TurnResult
from .display import PrefillBar, detail_line, status_line
from .reader import PASTE_OFF, PASTE_ON, Message, MessageReader


class ChatApp:
    """Reads messages (terminal or piped stdin), runs commands and turns, renders with rich."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        sampling: Sampling,
        *,
        thinking: bool = False,
        system: Optional[str] = None,
        reasoning_effort: Optional[str] = None,
        demo: bool = False,
        stdin: Any = None,
        console: Any = None,
        verbosity: int = 0,
        session_path: Optional[Path] = None,
    ):
        from rich.console import Console

        self.conv = Conversation(
            model, tokenizer, thinking=thinking, system=system, reasoning_effort=reasoning_effort
        )
        # chat --session FILE: resumed at the start, saved at the end (not after a refusal)
        self.session_path = session_path
        self._overrides = (system, thinking, reasoning_effort)
        self._save_on_exit = False
        self.sampling = sampling
        self.demo = demo
        self.verbosity = verbosity  # -1 --quiet (no status lines), 0, 1 --verbose
        self.stdin = stdin if stdin is not None else sys.stdin
        self.out = console or Console(highlight=False, emoji=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, emoji=False)
        self.interactive = bool(getattr(self.stdin, "isatty", lambda: False)())
        self.reader = MessageReader(self._read_line)
        self._paste_mode = ""  # "readline" | "terminal" | "" (none)
        self._eof_newline = self.interactive
        if self.interactive:
            self._setup_terminal()

    # --- input ---------------------------------------------------------------------------

    def _setup_terminal(self) -> None:
        """Line editing, and bracketed paste so that a paste is one message: GNU readline
        asks the terminal for it around each line it reads (CPython turns it off); without
        readline the mode is switched on here for the whole chat and the markers are parsed
        from the lines. Not with libedit (macOS): its key handling would mangle the markers."""
        try:
            import readline
        except ImportError:
            readline = None  # type: ignore[assignment]
        if readline is not None:
            backend = getattr(readline, "backend", None) or (
                "editline" if "libedit" in (readline.__doc__ or "") else "readline"
            )
            if backend != "readline":
                return
            readline.parse_and_bind("set enable-bracketed-paste on")
            self._paste_mode = "readline"
            # readline >= 8.1 ends the line itself at EOF while the mode is on
            ver = getattr(readline, "_READLINE_LIBRARY_VERSION", "0")
            try:
                self._eof_newline = tuple(int(x) for x in ver.split(".")[:2]) < (8, 1)
            except ValueError:
                self._eof_newline = True
        elif os.name == "posix" and self.out.is_terminal:
            import atexit

            self._paste_mode = "terminal"
            self._write_terminal(PASTE_ON)
            atexit.register(self._restore_terminal)

    def _write_terminal(self, seq: str) -> None:
        try:
            self.out.file.write(seq)
            self.out.file.flush()
        except (OSError, ValueError):
            pass

    def _restore_terminal(self) -> None:
        if self._paste_mode == "terminal":
            self._paste_mode = ""
            self._write_terminal(PASTE_OFF)

    def _read_line(self, kind: str) -> Optional[str]:
        if self.interactive:
            prompt = {"first": "[bold green]you ›[/] ", "block": "[dim]...[/] "}.get(kind, "")
            try:
                return self.out.input(prompt)
            except EOFError:
                if self._eof_newline:  # Ctrl-D: leave the terminal at the start of a line
                    self.out.print()
                return None
        line = self.stdin.readline()
        if not line:
            return None
        return line.rstrip("\r\n")

    def _read(self) -> Optional[Message]:
        msg = self.reader.read()
        if msg is not None and not self.interactive:  # echo piped input
            self.out.print("you › " + msg.text.replace("\n", "\n      "), markup=False)
        return msg

    # --- loop ----------------------------------------------------------------------------

    def run(self) -> int:
        code = 1
        try:
            code = self._loop()
        finally:
            self._restore_terminal()
            if self._save_on_exit and not self.save_session():
                code = 1
        return code

    def resume_session(self) -> Optional[str]:
        """``--session FILE``: continues the conversation saved there (the options given on
        the command line, --system, --thinking, --reasoning-effort, override the saved ones),
        or starts a new one when there is no such file. Returns the note to show. A file that
        cannot be used raises ``ValueError``/``OSError``, and is then never overwritten."""
        path = self.session_path
        if path is None:
            return None
        try:
            n = self.conv.resume(path)
        except FileNotFoundError:
            self._save_on_exit = True
            return f"new session: the conversation is saved to {path} at exit"
        system, thinking, effort = self._overrides
        if system is not None:
            self.conv.set_system(system)
        if thinking:
            self.conv.set_thinking(True)
        if effort is not None:
            self.conv.reasoning_effort = effort
        self._save_on_exit = True
        tokens = self.conv.session.position
        return (
            f"resumed {plural(n, 'message', grouped=True)} from {path} "
            f"({plural(tokens, 'token', grouped=True)} of state, "
            "not prefilled again); saved there at exit"
        )

    def save_session(self) -> bool:
        """Writes the conversation to ``--session FILE``; a note either way."""
        path = self.session_path
        try:
            size = self.conv.save_session(path)
        except (OSError, ValueError, RuntimeError) as e:
            self.err.print(f"v4flash: error: cannot save the session to {path}: {e}", markup=False)
            return False
        self.note(f"session saved to {path} ({size / 1e6:.2f} MB)")
        return True

    def _loop(self) -> int:
        resumed = self.resume_session()
        mode = "thinking" if self.conv.thinking else "chat"
        title = "v4flash chat" + (" · tiny DEMO model (not DeepSeek)" if self.demo else "")
        self.out.print(f"[bold]{title}[/] · {mode} mode · /help for commands", highlight=False)
        if resumed:
            self.note(resumed)
        interrupts = 0
        while True:
            try:
                msg = self._read()
            except KeyboardInterrupt:
                self.out.print()
                interrupts += 1
                if interrupts > 1 or not self.interactive:
                    break
                self.note("Ctrl-C again, /exit or Ctrl-D to quit")
                continue
            interrupts = 0
            if msg is None:
                break
            text = msg.text.strip()
            if text:
                if text.startswith("/") and not msg.literal:
                    if commands.run(self, text) == "exit":
                        break
                else:
                    self.turn(msg.text)
            if self.reader.eof:  # the input ended inside a block: that was the last message
                break
        return 0

    def regen(self) -> None:
        if not self.conv.can_regenerate():
            self.note("nothing to regenerate: the conversation does not end with an answer")
            return
        self.note("regenerating the last answer")
        result = self._answer(lambda *cb: self.conv.regenerate(self.sampling, *cb))
        if result is not None and result.stop == "cancelled":
            self.note("the previous answer stays")

    def note(self, msg: str) -> None:
        self.out.print(f"· {msg}", style="dim", markup=False)

    def turn(self, user_text: str) -> Optional[TurnResult]:
        return self._answer(lambda *cb: self.conv.respond(user_text, self.sampling, *cb))

    def _answer(self, go: Callable[..., Optional[TurnResult]]) -> Optional[TurnResult]:
        """Runs ``go(on_text, on_progress)`` and renders the answer as it streams."""
        from rich.text import Text

        out = self.out
        state = {"kind": None}

        def on_text(kind: str, text: str) -> None:
            if state["kind"] is None:
                out.print("assistant › ", style="bold cyan", end="")
                if kind == "reasoning":
                    out.print("[thinking] ", style="dim italic", end="", markup=False)
            elif kind != state["kind"]:
                out.print()
                out.print("[answer] ", style="dim italic", end="", markup=False)
            state["kind"] = kind
            out.print(Text(text, style="dim" if kind == "reasoning" else ""), end="")

        bar = PrefillBar(self.err if self.verbosity >= 0 else None)
        try:
            result = go(on_text, bar.callback)
        except (ValueError, RuntimeError) as e:
            out.print(f"error: {e}", style="red", markup=False)
            return None
        finally:
            bar.stop()
        if result is None:
            return None
        if state["kind"] is None:
            out.print("assistant › ", style="bold cyan", end="")
        out.print()
        if result.stop == "cancelled":
            self.note("cancelled during the prompt; the turn was dropped")
            return result
        if result.stop == "interrupted":
            self.note("stopped; the partial answer stays in the conversation")
        if result.stats.get("error"):
            out.print(f"error: {result.stats['error']}", style="red", markup=False)
        if self.verbosity > 0:
            out.print(f"[{detail_line(result.stats)}]", style="dim", markup=False)
        elif self.verbosity == 0:
            out.print(f"[{status_line(result.stats)}]", style="dim", markup=False)
        return result

    # --- stats ---------------------------------------------------------------------------

    def stats_doc(self) -> Dict[str, Any]:
        return {
            "turns": self.conv.turns,
            "reuse": dict(self.conv.reuse_counts),
            "engine": {k: v for k, v in self.conv.model.stats().items()},
            "sampling": asdict(self.sampling),
            "session_tokens": self.conv.session.position,
        }

    def print_stats(self) -> None:
        from rich import box
        from rich.table import Table

        t = Table(title="turns", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for col in (
            "#",
            "mode",
            "prompt",
            "reused",
            "prefill",
            "how",
            "gen",
            "tok/s",
            "TTFT",
            "hit",
        ):
            t.add_column(
                col,
                justify="left" if col in ("mode", "how") else "right",
                no_wrap=True,
                min_width={"mode": 8, "how": 8, "hit": 4, "tok/s": 5}.get(col, len(col)),
            )
        for s in self.conv.turns:
            hit = s.get("expert_hit_rate")
            t.add_row(
                str(s["turn"]),
                s["mode"],
                str(s["prompt_tokens"]),
                str(s["reused_tokens"]),
                str(s["prefill_tokens"]),
                s["reuse"],
                str(s["generated_tokens"]),
                "-" if s["decode_tok_s"] is None else f"{s['decode_tok_s']:.1f}",
                "-" if s["ttft_s"] is None else f"{s['ttft_s']:.2f}s",
                "-" if hit is None else f"{hit:.0%}",
            )
        self.out.print(t)
        e = self.conv.model.stats()
        hit = e.get("expert_hit_rate")
        threads = e["threads"]
        self.out.print(
            f"engine: prefill {e['prefill_tokens']} tok in {e['prefill_s']:.2f} s · decode "
            f"{e['decode_tokens']} tok in {e['decode_s']:.2f} s · experts "
            f"{e['expert_requests']} requests, "
            f"{'-' if hit is None else format(hit, '.1%')} hit, "
            f"{e['expert_bytes_read'] / (1 << 20):.1f} MB read · kernels {e['kernel_tier']} · "
            f"{threads} thread{'' if threads == 1 else 's'}",
            markup=False,
        )
