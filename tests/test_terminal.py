"""The command line in a real terminal (tmux): the chat's prompt survives readline's redraws
(Ctrl-L, the history, a pasted block), the input history is kept between sessions, and at 60
columns nothing is broken mid-word (issue 49, section 2: frictions 4 and 5).

tmux tells which screen lines the terminal itself wrapped (``capture-pane -J`` joins them):
a program that wraps its own lines at word boundaries leaves none."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import FIXTURES

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None or sys.platform == "win32", reason="needs tmux"
)

TINY = FIXTURES / "tiny-a"


class Tmux:
    """One program in a tmux window of its own server (a private socket), its screen read
    back as text."""

    def __init__(self, argv, env, width=100, height=40):
        self.dir = tempfile.mkdtemp(prefix="v4t", dir="/tmp")  # a socket path must be short
        self.sock = os.path.join(self.dir, "s")
        vars_ = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        # env -i: only these variables (the tests' COLUMNS, say, would fix the width)
        cmd = f"env -i {vars_} {' '.join(shlex.quote(str(a)) for a in argv)}"
        self.tmux("-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height))
        self.tmux("set-option", "-g", "remain-on-exit", "on")
        self.tmux("set-option", "-g", "history-limit", "5000")
        self.tmux("respawn-pane", "-k", "-t", "0", cmd)

    def tmux(self, *args):
        return subprocess.run(
            ["tmux", "-S", self.sock, *args], capture_output=True, text=True, check=True
        ).stdout

    def keys(self, *keys):
        self.tmux("send-keys", "-t", "0", *keys)

    def type(self, text):
        self.tmux("send-keys", "-t", "0", "-l", text)

    def screen(self, joined=False):
        """The visible screen and the scrollback; ``joined``: the lines the terminal wrapped
        put back together (trailing spaces dropped either way)."""
        text = self.tmux("capture-pane", "-p", "-S", "-", *(["-J"] if joined else []), "-t", "0")
        lines = [line.rstrip() for line in text.splitlines()]
        return "\n".join(x for x in lines if x and not x.startswith("Pane is dead"))

    def visible(self):
        return self.tmux("capture-pane", "-p", "-t", "0")

    def wait(self, pred, timeout=60.0, what=""):
        end = time.time() + timeout
        while time.time() < end:
            text = self.screen()
            if pred(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{self.screen()}")

    def dead(self):
        return self.tmux("display-message", "-p", "-t", "0", "#{pane_dead}").strip() == "1"

    def wait_exit(self, timeout=60.0):
        end = time.time() + timeout
        while time.time() < end and not self.dead():
            time.sleep(0.1)
        assert self.dead(), self.screen()

    def close(self):
        subprocess.run(["tmux", "-S", self.sock, "kill-server"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def env(tmp_path):
    return {
        "V4FLASH_HOME": str(tmp_path / "home"),
        "TERM": "xterm-256color",
        "INPUTRC": os.devnull,
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", ""),
        "LANG": "C.UTF-8",
    }


@pytest.fixture
def term():
    made = []

    def start(*args, env, width=100):
        t = Tmux([sys.executable, "-m", "v4flash", *map(str, args)], env, width=width)
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


def chat_args():
    return ["chat", "-m", TINY, "--temperature", "0", "-n", "4"]


def prompts(text):
    return text.count("you ›")


def last_line_with(text, what):
    return [x for x in text.splitlines() if what in x][-1]


# --- the prompt is readline's (friction 4) ----------------------------------------------------


def test_ctrl_l_and_the_history_redraw_the_prompt(term, env):
    t = term(*chat_args(), env=env)
    t.wait(lambda s: prompts(s) >= 1, what="the prompt")
    t.type("first question")
    t.keys("Enter")
    t.wait(lambda s: prompts(s) >= 2 and "tok/s" in s, what="the answer")
    t.keys("Up")  # the history: readline redraws the line, the prompt with it
    t.wait(lambda s: s.rstrip().splitlines()[-1] == "you › first question", 5, "history")
    t.keys("C-u")
    t.type("draft")
    t.keys("C-l")  # clear the screen: readline draws the prompt and the line again
    screen = t.wait(lambda s: "draft" in t.visible(), 10, "the redraw")
    first = t.visible().splitlines()[0]
    assert first == "you › draft", (first, screen)
    t.keys("C-u", "C-d")
    t.wait_exit()


def test_a_pasted_block_keeps_the_prompt(term, env):
    t = term(*chat_args(), env=env)
    t.wait(lambda s: prompts(s) >= 1, what="the prompt")
    # a paste as the terminal sends it once bracketed-paste mode is on
    t.tmux("set-buffer", "First line of paste\nsecond line of paste")
    t.tmux("paste-buffer", "-p", "-t", "0")
    t.wait(lambda s: "second line of paste" in s, 10, "the paste")
    # an edit at its start makes readline redraw the whole block: the prompt was erased and
    # the screen showed "XFirst line of paste paste" (the old line's tail)
    t.keys("C-a")
    t.type("X")
    screen = t.wait(lambda s: "XFirst" in s, 10, "the edit")
    assert "you › XFirst line of paste\nsecond line of paste" in screen, screen
    assert "paste paste" not in screen
    t.keys("Enter")
    t.wait(lambda s: "tok/s" in s, what="the answer")
    t.keys("C-d")
    t.wait_exit()


def test_the_input_history_is_kept_between_sessions(term, env):
    t = term(*chat_args(), env=env)
    t.wait(lambda s: prompts(s) >= 1, what="the prompt")
    t.type("remember me")
    t.keys("Enter")
    t.wait(lambda s: prompts(s) >= 2 and "tok/s" in s, what="the answer")
    t.keys("C-d")
    t.wait_exit()
    history = Path(env["V4FLASH_HOME"]) / "chat_history"
    assert "remember me" in history.read_text()
    t2 = term(*chat_args(), env=env)
    t2.wait(lambda s: prompts(s) >= 1, what="the prompt")
    t2.keys("Up")
    t2.wait(lambda s: "you › remember me" in s, 10, "the previous session's line")
    t2.keys("C-u", "C-d")
    t2.wait_exit()


# --- 60 columns (friction 5) --------------------------------------------------------------------


def assert_no_word_split(t):
    """No line was wrapped by the terminal (mid-word): the program wrapped them all."""
    plain, joined = t.screen(), t.screen(joined=True)
    assert plain == joined, plain


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "-m", TINY, "--ram", "100000", "-t", "999"],
        ["info", "-m", TINY, "--ram", "2"],
        ["run", "--temperature", "0", "-n", "2", "Hi"],  # the demo notice
        ["run", "-m", "deepseek-ai/DeepSeek-V4-Flash-0731", "Hi"],  # not in the cache
    ],
    ids=["doctor", "info", "demo-notice", "error"],
)
def test_narrow_terminal_gets_whole_words(term, env, args):
    hf = tempfile.mkdtemp(prefix="hf", dir="/tmp")  # a path short enough for a line
    t = term(*args, env={**env, "HF_HUB_CACHE": hf}, width=60)
    t.wait_exit(120)
    screen = t.screen()
    shutil.rmtree(hf)
    assert "Traceback" not in screen, screen
    if args[0] == "run" and "-m" not in args:  # the demo notice, the plan (not the answer)
        cut = screen.index("loaded in")
        assert t.screen(joined=True)[:cut] == screen[:cut], screen
    else:
        assert_no_word_split(t)
    if args[0] == "doctor":
        assert "all checks passed" not in screen and "warnings:" in screen


def test_stats_at_60_columns(term, env):
    t = term(*chat_args(), env=env, width=60)
    t.wait(lambda s: prompts(s) >= 1, what="the prompt")
    t.type("Hello there")
    t.keys("Enter")
    t.wait(lambda s: prompts(s) >= 2 and "tok/s" in s, what="the answer")
    t.type("/stats")
    t.keys("Enter")
    screen = t.wait(lambda s: "engine: prefill" in s and prompts(s) >= 3, what="/stats")
    stats = screen[screen.rindex("/stats") :]
    assert "…" not in stats, stats
    turn = last_line_with(stats, "#1 chat")
    assert turn.startswith("  #1 chat · prompt"), stats
    words = " ".join(stats.split())
    assert re.search(r"TTFT \d+\.\d\ds · hit \d+%", words), stats
    t.keys("C-d")
    t.wait_exit()
    # the /stats lines were wrapped by the program at word boundaries, not by the terminal
    joined = t.screen(joined=True)
    assert joined[joined.rindex("/stats") :] == t.screen()[t.screen().rindex("/stats") :]
