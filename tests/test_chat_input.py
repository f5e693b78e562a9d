"""The chat REPL's input and its commands: a bracketed paste is one message, \"\"\" blocks,
/set for the sampling knobs, /regen; driven through piped stdin, a pseudo-terminal, or the
functions directly."""

import json
import os
import select
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, model_for
from helpers import cli
from v4flash.chat.conversation import Conversation, Sampling
from v4flash.chat.reader import PASTE_END, PASTE_START, MessageReader
from v4flash.tokenizer import load_tokenizer

GREEDY = ["--temperature", "0"]


@pytest.fixture(autouse=True)
def _state_home(tmp_path, monkeypatch):
    """What v4flash remembers (used checkpoints, servers, chat history) goes to a folder of
    the test's own, not the home of whoever runs the tests."""
    monkeypatch.setenv("V4FLASH_HOME", str(tmp_path / "v4flash-home"))


def messages(*lines):
    """The messages MessageReader makes of these raw lines (as read_line hands them over)."""
    it = iter(lines)
    kinds = []

    def read_line(kind):
        kinds.append(kind)
        return next(it, None)

    r = MessageReader(read_line)
    out = []
    while (m := r.read()) is not None:
        out.append((m.text, m.literal))
    return out, kinds


def chat(tmp_path, text, *extra):
    stats = tmp_path / "stats.json"
    p = cli(
        *("chat", "--model", FIXTURES / "tiny-a", *GREEDY, "--max-tokens", "6"),
        *("--stats-json", stats, *extra),
        input=text,
    )
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    return p, json.loads(stats.read_text())


def saved(path):
    return json.loads(path.read_text(encoding="utf-8"))


# --- the reader -------------------------------------------------------------------------------


def test_a_bracketed_paste_is_one_message():
    # a cooked terminal hands a paste over line by line, the markers around it
    got, kinds = messages(f"{PASTE_START}line one", "line two", f"line three{PASTE_END}", "next")
    assert got == [("line one\nline two\nline three", True), ("next", False)]
    assert kinds[:3] == ["first", "paste", "paste"]  # no prompt inside a paste
    # a paste that ends with a newline: the end marker comes with the next line (Enter)
    got, _ = messages(f"{PASTE_START}a", "b", PASTE_END)
    assert got == [("a\nb", True)]
    # typed text before and after the paste joins it
    got, _ = messages(f"see {PASTE_START}x", f"y{PASTE_END} please")
    assert got == [("see x\ny please", True)]
    # a one-line paste is like typing it: a command stays a command
    assert messages(f"{PASTE_START}/reset{PASTE_END}")[0] == [("/reset", False)]
    # GNU readline assembles a paste itself: a line that holds newlines
    assert messages("a\nb\nc")[0] == [("a\nb\nc", True)]
    # the input ends inside a paste: what came is the message
    assert messages(f"{PASTE_START}a", "b")[0] == [("a\nb", True)]


def test_triple_quotes_open_and_close_a_block():
    got, kinds = messages('"""', "first line", "", "  indented", '"""', "after")
    assert got == [("first line\n\n  indented", True), ("after", False)]
    assert kinds[:5] == ["first", "block", "block", "block", "block"]
    # text on the opening and closing lines belongs to the message
    assert messages('"""Dear model,', 'two lines"""')[0] == [("Dear model,\ntwo lines", True)]
    assert messages('"""one line"""')[0] == [("one line", True)]
    # commands inside a block are text
    assert messages('"""', "/reset", '"""')[0] == [("/reset", True)]
    # the end of input closes an open block
    assert messages('"""', "a", "b")[0] == [("a\nb", True)]
    # quotes elsewhere are text
    assert messages('say """ twice')[0] == [('say """ twice', False)]


# --- piped stdin ------------------------------------------------------------------------------


def test_piped_block_and_paste_are_one_turn_each(tmp_path):
    conv = tmp_path / "conv.json"
    text = "\n".join(
        [
            '"""',
            "Hello there",
            "/reset",
            "What is 2+2?",
            '"""',
            f"{PASTE_START}Thanks!",
            f"Bye{PASTE_END}",
            "Ok",
            f"/save {conv}",
            "",
        ]
    )
    p, doc = chat(tmp_path, text)
    assert [t["reuse"] for t in doc["turns"]] == ["new", "append", "append"]
    users = [m["content"] for m in saved(conv) if m["role"] == "user"]
    assert users == ["Hello there\n/reset\nWhat is 2+2?", "Thanks!\nBye", "Ok"]
    assert "conversation reset" not in p.stdout  # /reset inside the block was text
    assert "you › Hello there\n      /reset\n      What is 2+2?" in p.stdout


def test_piped_lines_are_one_turn_each(tmp_path):
    _, doc = chat(tmp_path, "one\ntwo\nthree\n")
    assert len(doc["turns"]) == 3


# --- a terminal -------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_terminal_paste_is_one_message_and_ctrl_d_ends_the_line(tmp_path):
    """The chat under a pseudo-terminal that behaves like xterm: a paste is wrapped in
    ESC[200~ ... ESC[201~ only if the program switched bracketed-paste mode on, else its
    lines arrive as if typed, each ended by Enter."""
    import fcntl
    import pty
    import struct
    import termios

    conv, stats = tmp_path / "conv.json", tmp_path / "stats.json"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", INPUTRC=os.devnull)
    p = subprocess.Popen(
        [sys.executable, "-m", "v4flash", "chat", "--model", str(FIXTURES / "tiny-a")]
        + [*GREEDY, "--max-tokens", "4", "--stats-json", str(stats)],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.DEVNULL,
        env=env,
        close_fds=True,
    )
    os.close(slave)
    out = bytearray()

    def pump(until=None, timeout=60.0):
        end = time.time() + timeout
        while time.time() < end:
            if until is not None and until(bytes(out)):
                return
            r, _, _ = select.select([master], [], [], 0.05)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                out.extend(chunk)
            elif until is None and p.poll() is not None:
                return
        if until is not None:
            raise AssertionError(f"timed out; output so far: {bytes(out)!r}")

    def prompts(b):
        return b.count("you ›".encode())

    def paste_mode_on(b):
        on, off = b.rfind(b"\x1b[?2004h"), b.rfind(b"\x1b[?2004l")
        return on > off

    try:
        pump(lambda b: prompts(b) >= 1)
        time.sleep(0.2)
        pump(timeout=0.2)
        lines = b"Hello there\rWhat is 2+2?\rThanks!"
        if paste_mode_on(bytes(out)):
            os.write(master, PASTE_START.encode() + lines + PASTE_END.encode() + b"\r")
        else:
            os.write(master, lines + b"\r")
        pump(lambda b: prompts(b) >= 2)
        time.sleep(0.5)  # anything more (a second turn) would show up now
        pump(timeout=0.5)
        os.write(master, f"/save {conv}\r".encode())
        pump(lambda b: b"saved" in b and prompts(b) >= 3)
        time.sleep(0.2)
        pump(timeout=0.2)
        before = len(out)
        os.write(master, b"\x04")  # Ctrl-D
        pump(timeout=30)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
        os.close(master)
    assert p.returncode == 0, bytes(out)
    users = [m["content"] for m in saved(conv) if m["role"] == "user"]
    assert users == ["Hello there\nWhat is 2+2?\nThanks!"], bytes(out)
    assert len(json.loads(stats.read_text())["turns"]) == 1
    # after Ctrl-D the terminal is left at the start of a new line (not after "you › ")
    assert b"\n" in bytes(out[before:]), bytes(out[before:])


# --- /set -------------------------------------------------------------------------------------


def test_set_changes_the_sampling_knobs(tmp_path):
    lines = [
        "/set",
        "/set temperature 0.3",
        "/set top-p 0.9",
        "/set parameter top_k 5",
        "/set seed 7",
        "/set max_tokens 2",
        "Hello",
        "/set temperature -1",
        "/set top_p 0",
        "/set max_tokens 0",
        "/set seed x",
        "/set colour blue",
        "/set temperature",
        "/set",
    ]
    p, doc = chat(tmp_path, "\n".join(lines) + "\n")
    assert doc["sampling"]["temperature"] == 0.3
    assert doc["sampling"]["top_p"] == 0.9
    assert doc["sampling"]["top_k"] == 5
    assert doc["sampling"]["seed"] == 7
    assert doc["sampling"]["max_tokens"] == 2
    assert doc["turns"][0]["generated_tokens"] <= 2
    assert "temperature 0 · top_p 1 · top_k 0 · seed random · max_tokens 6" in p.stdout
    assert "temperature 0.3 · top_p 0.9 · top_k 5 · seed 7 · max_tokens 2" in p.stdout
    # the core's rule (model.sample_params) checks the sampling knobs, its message as is
    assert "/set temperature: temperature must be a finite number >= 0, got -1" in p.stdout
    assert "/set top_p: top_p must be in (0, 1], got 0" in p.stdout
    assert "expected an integer >= 1" in p.stdout and "expected an integer, got 'x'" in p.stdout
    assert "unknown setting 'colour'" in p.stdout and "usage: /set temperature VALUE" in p.stdout


def test_set_seed_random_and_the_settings_reach_the_turn(tmp_path):
    # the knobs set reach the engine: the answer is the one the API gives for them
    lines = ["/set temperature 1", "/set seed 7", "Hi", "/set seed random"]
    conv = tmp_path / "conv.json"
    _, doc = chat(tmp_path, "\n".join(lines + [f"/save {conv}"]) + "\n")
    assert doc["sampling"]["seed"] is None  # "random" clears the seed
    c = Conversation(model_for("tiny-a"), load_tokenizer(FIXTURES / "tiny-a"))
    c.respond("Hi", Sampling(temperature=1.0, seed=7, max_tokens=6))
    assert saved(conv)[-1]["content"] == c.messages[-1]["content"]


# --- /regen -----------------------------------------------------------------------------------


def test_regen_answers_the_last_message_again(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    lines = ["/regen", "Hello there", f"/save {a}", "/regen", f"/save {b}", "What is 2+2?"]
    p, doc = chat(tmp_path, "\n".join(lines) + "\n")
    assert "nothing to regenerate" in p.stdout and "regenerating the last answer" in p.stdout
    first, again, third = doc["turns"]
    # rolled back to the snapshot at <｜Assistant｜>: only </think> is fed again
    assert again["reuse"] == "rollback"
    assert again["reused_tokens"] == first["prompt_tokens"] - 1
    assert again["prompt_tokens"] == first["prompt_tokens"]
    # the old answer is replaced (greedy: by the same one), not added
    assert [m["role"] for m in saved(b)] == ["user", "assistant"]
    assert saved(b) == saved(a)
    # and the conversation goes on from the new answer
    assert third["reuse"] == "append"
    assert third["reused_tokens"] == again["session_tokens"]


def test_regenerate_in_process():
    m = model_for("tiny-a")
    tok = load_tokenizer(FIXTURES / "tiny-a")
    conv = Conversation(m, tok)
    s = Sampling(temperature=0.0, max_tokens=5)
    assert conv.regenerate(s) is None  # nothing yet
    r1 = conv.respond("Hello", s)
    r2 = conv.regenerate(s)
    assert r2.ids == r1.ids and r2.prompt_ids == r1.prompt_ids
    assert r2.stats["reuse"] == "rollback" and r2.stats["prefill_tokens"] == 1
    assert [x["role"] for x in conv.messages] == ["user", "assistant"]
    assert conv.session.tokens == r2.prompt_ids + r2.ids
    # another temperature gives another answer in place of the old one
    r3 = conv.regenerate(Sampling(temperature=1.0, seed=3, max_tokens=5))
    assert len(conv.messages) == 2
    assert conv.messages[-1]["content"] == tok.decode(r3.ids[:-1] if r3.stop == "eos" else r3.ids)


def test_regenerate_cancelled_during_the_prefill_keeps_the_previous_answer():
    m = model_for("tiny-a")
    tok = load_tokenizer(FIXTURES / "tiny-a")
    conv = Conversation(m, tok)
    s = Sampling(temperature=0.0, max_tokens=4)
    conv.respond("Hello", s)
    before = [dict(x) for x in conv.messages]
    conv.load(conv.export())  # a fresh session: the regeneration has to prefill everything

    def ctrl_c(done, total):
        raise KeyboardInterrupt

    r = conv.regenerate(s, on_progress=ctrl_c)
    assert r.stop == "cancelled"
    assert conv.messages == before
    assert conv.regenerate(s).stats["reuse"] == "new"  # and it still works afterwards


class _TTY:
    def isatty(self):
        return True


def _scripted_console(lines):
    """A rich console that is a terminal and writes to a string, and an ``input()`` that
    writes its prompt there and reads ``lines``."""
    import io

    from rich.console import Console

    console = Console(
        file=io.StringIO(), force_terminal=True, color_system=None, width=100, highlight=False
    )

    def read(prompt=""):
        console.file.write(prompt)
        if not lines:
            raise EOFError
        line = lines.pop(0)
        console.file.write(line + "\n")  # the terminal's echo
        return line

    return console, read


def test_without_readline_the_chat_asks_the_terminal_for_bracketed_paste(monkeypatch):
    from v4flash.chat.reader import PASTE_OFF, PASTE_ON
    from v4flash.chat.terminal import ChatApp

    monkeypatch.setitem(sys.modules, "readline", None)  # import readline fails
    out, read = _scripted_console([f"{PASTE_START}Hello there", f"What is 2+2?{PASTE_END}"])
    app = ChatApp(
        model_for("tiny-a"),
        load_tokenizer(FIXTURES / "tiny-a"),
        Sampling(temperature=0.0, max_tokens=3),
        stdin=_TTY(),
        console=out,
        read_input=read,
    )
    assert app.run() == 0
    text = out.file.getvalue()
    assert text.startswith(PASTE_ON) and text.rstrip("\n").endswith(PASTE_OFF)
    assert len(app.conv.turns) == 1
    assert app.conv.messages[0]["content"] == "Hello there\nWhat is 2+2?"
    # Ctrl-D at the prompt: the line is ended before the chat exits
    assert text[: -len(PASTE_OFF)].endswith("› \n")
