"""The ``rich`` terminal front end of ``v4flash chat``: reads messages (from a terminal, with
line editing, input history kept between sessions and bracketed paste, or from piped stdin),
runs slash commands (``commands``) and turns (``Conversation``), and renders the answers as
they stream, the reasoning dimmed. ``--session FILE`` resumes the conversation saved there
(showing it) and saves it at exit.

The prompt (``you ›``) is readline's own: it is passed to ``input()``, its colour codes
between readline's invisible-text markers, so that a redraw (Ctrl-L, history, a pasted block)
draws it again instead of erasing it."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .. import state
from ..termtext import wrap
from ..units import plural
from . import commands
from .conversation import Conversation, Sampling, TurnResult
from .display import PrefillBar, detail_line, status_line
from .reader import PASTE_OFF, PASTE_ON, Message, MessageReader

SHOWN_MESSAGES = 20  # of a resumed or loaded conversation


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
        read_input: Optional[Callable[[str], str]] = None,
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
        self.read_input = read_input or input  # input(prompt): readline's when imported
        self.out = console or Console(highlight=False, emoji=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, emoji=False)
        self.interactive = bool(getattr(self.stdin, "isatty", lambda: False)())
        self.reader = MessageReader(self._read_line)
        self._paste_mode = ""  # "readline" | "terminal" | "" (none)
        self._readline: Any = None  # the module, when input() edits lines with it
        self._gnu_readline = False
        self._history_at = 0  # history entries read from the file at the start
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
            self._readline = readline
            self._load_history()
            backend = getattr(readline, "backend", None) or (
                "editline" if "libedit" in (readline.__doc__ or "") else "readline"
            )
            if backend != "readline":
                return
            self._gnu_readline = True
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

    # --- input history (kept in the state folder between sessions) ---------------------------

    def _load_history(self) -> None:
        rl = self._readline
        try:
            rl.read_history_file(str(state.history_file()))
        except (OSError, AttributeError):
            pass
        try:
            self._history_at = rl.get_current_history_length()
            rl.set_history_length(state.HISTORY_LENGTH)
        except AttributeError:
            pass

    def save_history(self) -> None:
        """Appends this session's lines to the history file (another chat running at the same
        time keeps its lines too), then cuts the file to the last ``HISTORY_LENGTH``."""
        rl = self._readline
        if rl is None:
            return
        path = state.history_file()
        try:
            new = rl.get_current_history_length() - self._history_at
            if new <= 0:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                path.touch(mode=0o600)
            rl.append_history_file(new, str(path))
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines(True)
            if len(lines) > 2 * state.HISTORY_LENGTH:
                path.write_text("".join(lines[-state.HISTORY_LENGTH :]), encoding="utf-8")
        except (OSError, AttributeError):
            pass

    def prompt(self, kind: str) -> str:
        """The prompt ``input()`` shows for ``kind``, coloured where the console has colour;
        with GNU readline the codes go between ``\x01`` and ``\x02`` (they take no column),
        and with libedit the prompt stays plain."""
        text = {"first": "you ›", "block": "..."}.get(kind)
        if text is None:
            return ""
        color = (
            self.out.color_system is not None
            and not self.out.no_color  # NO_COLOR
            and (self._gnu_readline or not self._readline)
        )
        if not color:
            return text + " "
        start = "\x1b[1;32m" if kind == "first" else "\x1b[2m"
        end = "\x1b[0m"
        if self._gnu_readline:
            start, end = f"\x01{start}\x02", f"\x01{end}\x02"
        return f"{start}{text}{end} "

    def _read_line(self, kind: str) -> Optional[str]:
        if self.interactive:
            try:
                return self.read_input(self.prompt(kind))
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
            self.save_history()
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
        except ValueError as e:
            problem = saved_conversation_problem(path)
            if problem is None:
                raise
            raise ValueError(problem) from e
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
        self.out.print(
            f"[bold]{title}[/] · {mode} mode · /help for commands",
            highlight=False,
            soft_wrap=not self.out.is_terminal,
        )
        if resumed:
            self.show_conversation()
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
        # a terminal wraps it at word boundaries; a pipe gets it whole
        self.out.print(f"· {msg}", style="dim", markup=False, soft_wrap=not self.out.is_terminal)

    def show_conversation(self, limit: int = SHOWN_MESSAGES) -> None:
        """The conversation so far (a resumed session, a /load), so that the next message has
        its context on the screen: the last ``limit`` messages, dimmed and marked as earlier
        (``you:``, ``assistant:``), the reasoning left out."""
        from rich.text import Text

        msgs: List[Dict[str, Any]] = self.conv.messages
        if not msgs and not self.conv.system:
            return
        self.note("the conversation so far:")
        if self.conv.system:
            self.note(f"system prompt: {self.conv.system}")
        if len(msgs) > limit:
            self.note(f"({plural(len(msgs) - limit, 'earlier message')} not shown)")
        soft = not self.out.is_terminal
        for m in msgs[-limit:]:
            content = m.get("content")
            if not isinstance(content, str):
                content = json.dumps(content, ensure_ascii=False)
            role = str(m.get("role"))
            if role == "assistant" and not content and m.get("reasoning_content"):
                content = "(reasoning only)"
            line = Text("  ")
            line.append(f"{'you' if role == 'user' else role}: ", style="bold")
            line.append(content.replace("\n", "\n    "))
            self.out.print(line, style="dim", soft_wrap=soft)

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
        soft = not out.is_terminal  # a terminal: wrapped at word boundaries
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
            out.print(f"[{detail_line(result.stats)}]", style="dim", markup=False, soft_wrap=soft)
        elif self.verbosity == 0:
            out.print(f"[{status_line(result.stats)}]", style="dim", markup=False, soft_wrap=soft)
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

        cols = ("#", "mode", "prompt", "reused", "prefill", "how", "gen", "tok/s", "TTFT", "hit")
        rows = []
        for s in self.conv.turns:
            hit = s.get("expert_hit_rate")
            rows.append(
                (
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
            )
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(cols)]
        soft = not self.out.is_terminal
        if self.out.is_terminal and sum(widths) + 2 * len(cols) > self.out.width:
            # too narrow for the table (its cells would split or be cut): a line per turn
            self.out.print("turns", markup=False)
            for r in rows:
                line = (
                    f"  #{r[0]} {r[1]} · prompt {r[2]} (reused {r[3]}, prefill {r[4]}, {r[5]}) "
                    f"· gen {r[6]} · {r[7]} tok/s · TTFT {r[8]} · hit {r[9]}"
                )
                self.out.print(wrap(line, self.out.width, "  "), markup=False, soft_wrap=True)
        else:
            t = Table(title="turns", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
            for col, w in zip(cols, widths):
                t.add_column(
                    col,
                    justify="left" if col in ("mode", "how") else "right",
                    no_wrap=True,
                    min_width=w,
                )
            for r in rows:
                t.add_row(*r)
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
            soft_wrap=soft,
        )


def saved_conversation_problem(path: Path) -> Optional[str]:
    """What to say when ``--session`` names a file /save wrote (JSON messages, not a session
    file); None for any other file."""
    saved = _saved_messages(path)
    if saved is None:
        return None
    return (
        f"{path} is a conversation saved by /save ({plural(saved, 'message')} as JSON), not a "
        "session file (which --session reads and writes: the messages and the model's state)"
        f"\n  to continue it: v4flash chat, then /load {path}"
        "\n  (add --session NEW_FILE to keep it in a session file from then on)"
    )


def _saved_messages(path: Path) -> Optional[int]:
    """The number of messages when ``path`` holds what /save writes (JSON messages), else
    None."""
    try:
        with open(path, "rb") as f:
            if f.read(1) not in (b"[", b"{", b" ", b"\n", b"\r", b"\t"):
                return None  # a session file starts with its magic, V4FLSESS
            f.seek(0)
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None
    msgs = doc.get("messages") if isinstance(doc, dict) else doc
    if isinstance(msgs, list) and all(isinstance(m, dict) and "role" in m for m in msgs):
        return len(msgs)
    return None
