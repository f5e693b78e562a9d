"""Input lines into messages, for ``v4flash chat`` (:class:`MessageReader`): a paste is one
message, and so are the lines between two lines of three double quotes; any other line is one
message."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"  # bracketed paste (xterm, VT-style terminals)
PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"
BLOCK = '"""'


@dataclass
class Message:
    text: str
    literal: bool = False  # several lines (a paste, a """ block): a message, never a command


class MessageReader:
    """Turns raw input lines into messages.

    * A bracketed paste (the text a terminal sends between ``ESC[200~`` and ``ESC[201~``
      once bracketed-paste mode is on) is one message, whatever its newlines; so is a line
      that already holds newlines (GNU readline assembles a paste itself).
    * A line starting with ``\"\"\"`` opens a block, a line ending with ``\"\"\"`` closes it
      (as in ollama; ``\"\"\"one line\"\"\"`` is a block too): the lines between are one
      message. The end of input closes an open block.
    * Any other line is one message.

    ``read_line(kind)`` returns the next line without its newline, or None at the end of
    input; ``kind`` is ``"first"`` (a new message), ``"block"`` (inside a \"\"\" block) or
    ``"paste"`` (the rest of a paste)."""

    def __init__(self, read_line: Callable[[str], Optional[str]]):
        self.read_line = read_line
        self.eof = False

    def _line(self, kind: str) -> Optional[Tuple[str, bool]]:
        """(text, several_lines) with any bracketed paste resolved."""
        line = self.read_line(kind)
        if line is None:
            self.eof = True
            return None
        if PASTE_START not in line:
            text = line.replace(PASTE_END, "")
            return text, "\n" in text.strip("\r\n")
        before, _, rest = line.partition(PASTE_START)
        while PASTE_END not in rest:
            more = self.read_line("paste")
            if more is None:
                self.eof = True
                break
            rest += "\n" + more
        pasted, _, after = rest.partition(PASTE_END)
        text = before + pasted + after.replace(PASTE_START, "").replace(PASTE_END, "")
        text = text.replace("\r\n", "\n")
        return text, "\n" in text.strip("\r\n")

    def read(self) -> Optional[Message]:
        """The next message, or None at the end of input."""
        if self.eof:
            return None
        got = self._line("first")
        if got is None:
            return None
        text, several = got
        if several:
            return Message(text.strip("\r\n"), True)
        head = text.lstrip()
        if not head.startswith(BLOCK):
            return Message(text, False)
        rest = head[len(BLOCK) :].rstrip()
        if len(rest) >= len(BLOCK) and rest.endswith(BLOCK):
            return Message(rest[: -len(BLOCK)], True)
        lines = [rest] if rest else []
        while True:
            got = self._line("block")
            if got is None:
                break
            t = got[0].rstrip()
            if t.endswith(BLOCK):
                lines.append(t[: -len(BLOCK)])
                break
            lines.append(got[0])
        return Message("\n".join(lines).strip("\n"), True)
