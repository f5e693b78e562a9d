"""What the chat shows (issue 49, section 2): ``/stats`` on a narrow terminal, a resumed
session's conversation, and ``--session`` given a file ``/save`` wrote."""

import io

import pytest

from conftest import FIXTURES, model_for
from helpers import cli
from v4flash.chat.conversation import Sampling
from v4flash.tokenizer import load_tokenizer

TINY, TINY_B = FIXTURES / "tiny-a", FIXTURES / "tiny-b"
GREEDY = ["--temperature", "0"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A state folder of the test's own (inherited by subprocesses)."""
    h = tmp_path / "v4flash-home"
    monkeypatch.setenv("V4FLASH_HOME", str(h))
    return h


# --- chat: /stats at 60 columns (friction 5), --session and /save (friction 7) --------------------


def test_stats_fit_a_narrow_terminal():
    from rich.console import Console

    from v4flash.chat.terminal import ChatApp

    out = Console(file=io.StringIO(), width=60, force_terminal=True, color_system=None)
    app = ChatApp(
        model_for("tiny-a"),
        load_tokenizer(TINY),
        Sampling(temperature=0.0, max_tokens=4),
        console=out,
        stdin=io.StringIO(),
    )
    app.turn("Hello there")
    app.turn("Again")
    out.file.truncate(0)
    out.file.seek(0)
    app.print_stats()
    text = out.file.getvalue()
    assert "…" not in text and all(len(x) <= 60 for x in text.splitlines()), text
    for t in app.conv.turns:
        assert f"TTFT {t['ttft_s']:.2f}s" in " ".join(text.split()), text
        assert f"gen {t['generated_tokens']}" in text and f"#{t['turn']} chat" in text
    assert "engine: prefill" in text


def test_session_given_a_save_file_says_what_it_is_and_how_to_load_it(tmp_path):
    conv = tmp_path / "conv.json"
    p = cli("chat", "-m", TINY, *GREEDY, "-n", 4, input=f"Hello there\n/save {conv}\n")
    assert p.returncode == 0, p.stderr
    before = conv.read_bytes()
    p = cli("chat", "-m", TINY, "--session", conv, input="Hi\n")
    assert p.returncode == 1
    lines = p.stderr.splitlines()
    assert lines[0] == (
        f"v4flash: error: {conv} is a conversation saved by /save (2 messages as JSON), not a "
        "session file (which --session reads and writes: the messages and the model's state)"
    )
    assert f"  to continue it: v4flash chat, then /load {conv}" in lines
    assert "plan:" not in p.stderr  # said before the model loads
    assert conv.read_bytes() == before


def test_a_resumed_session_shows_the_conversation_so_far(tmp_path):
    f = tmp_path / "conv.v4session"
    p = cli("chat", "-m", TINY, *GREEDY, "-n", 4, "--session", f, input="Hello there\n")
    assert p.returncode == 0, p.stderr
    answer = p.stdout.split("assistant › ")[1].split("\n")[0]
    p = cli("chat", "-m", TINY, *GREEDY, "-n", 4, "--session", f, input="/exit\n")
    assert p.returncode == 0, p.stderr
    shown = p.stdout.split("the conversation so far:")[1]
    assert "  you: Hello there\n" in shown and f"  assistant: {answer}\n" in shown
    assert shown.index("you: Hello there") < shown.index("resumed 2 messages")


def test_the_prompt_hides_its_colour_codes_from_readline():
    from rich.console import Console

    from v4flash.chat.terminal import ChatApp

    def app_on(**console):
        out = Console(file=io.StringIO(), force_terminal=True, **console)
        tok = load_tokenizer(TINY)
        return ChatApp(model_for("tiny-a"), tok, Sampling(), console=out, stdin=io.StringIO())

    app = app_on(color_system="standard")
    app._readline, app._gnu_readline = object(), True  # GNU readline: \x01 ... \x02
    assert app.prompt("first") == "\x01\x1b[1;32m\x02you ›\x01\x1b[0m\x02 "
    assert app.prompt("block") == "\x01\x1b[2m\x02...\x01\x1b[0m\x02 "
    assert app.prompt("paste") == ""
    app._gnu_readline = False  # libedit: plain
    assert app.prompt("first") == "you › "
    app._readline = None  # no line editing: nothing redraws, colour as is
    assert app.prompt("first") == "\x1b[1;32myou ›\x1b[0m "
    assert app_on(color_system="standard", no_color=True).prompt("first") == "you › "
    assert app_on(color_system=None).prompt("first") == "you › "
