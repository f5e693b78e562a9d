"""The friction points of the command line (issue 49, section 2): Ctrl-C during ``run``'s
prefill, ``doctor``'s warnings, ``bench``'s JSON and words, errors and reports wrapped at word
boundaries, what loading reads."""

import io
import json
import sys
import time

import pytest

from conftest import FIXTURES, main_
from v4flash import limits
from v4flash.chat.conversation import Conversation
from v4flash.termtext import wrap

TINY, TINY_B = FIXTURES / "tiny-a", FIXTURES / "tiny-b"
GREEDY = ["--temperature", "0"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A state folder of the test's own (inherited by subprocesses)."""
    h = tmp_path / "v4flash-home"
    monkeypatch.setenv("V4FLASH_HOME", str(h))
    return h


def no_constants(name):
    raise AssertionError(f"not JSON: {name}")


# --- run: Ctrl-C during the prefill (friction 3) --------------------------------------------------


def test_ctrl_c_during_runs_prefill_exits_130(capsys, monkeypatch):
    def interrupted(self, ids, progress):
        raise KeyboardInterrupt

    monkeypatch.setattr(Conversation, "_feed", interrupted)
    p = main_(capsys, "run", "-m", TINY, *GREEDY, "-n", 4, "Hi")
    assert p.returncode == 130
    assert "interrupted during the prompt's prefill" in p.stderr and p.stdout.strip() == ""


# --- doctor's warnings (friction 6) ---------------------------------------------------------------


@pytest.fixture
def probes(monkeypatch):
    from v4flash import _core

    monkeypatch.setattr(_core, "disk_read_gbs", lambda path, n, readers=1: (2.0, True))
    monkeypatch.setattr(limits, "mem_read_gbs", lambda n, threads: (0.4, "fake"))


def _row(out, what):
    return next(line for line in out.splitlines() if line[5:].startswith(what + ":"))


def test_doctor_warnings_are_counted_and_distort_the_prediction(capsys, probes):
    p = main_(capsys, "doctor", "-m", TINY, "--ram", 100000, "-t", 999)
    assert p.returncode == 0, p.stderr
    assert "all checks passed" not in p.stdout
    assert _row(p.stdout, "cores").startswith("warn")
    assert _row(p.stdout, "memory").startswith("warn")
    bandwidth = _row(p.stdout, "memory bandwidth")
    assert bandwidth.startswith("warn") and "999 threads" in bandwidth
    expected = _row(p.stdout, "expected decode")
    assert expected.startswith("warn") and "distorted by the warnings above" in expected
    summary = p.stdout.splitlines()[-1]
    assert summary.startswith("4 warnings: cores, memory, memory bandwidth, expected decode")
    assert (
        main_(capsys, "doctor", "-m", TINY, "--ram", 100000, "-t", 999, "--strict").returncode == 1
    )
    # no warning: all checks passed, and --strict changes nothing
    p = main_(capsys, "doctor", "-m", TINY, "-t", 1, "--strict")
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "all checks passed", p.stdout


# --- bench: valid JSON, words not names (frictions 5, 8) ------------------------------------------


def test_bench_json_has_null_where_a_figure_is_infinite(capsys):
    p = main_(capsys, "bench", "-m", TINY, "-p", 3, "-n", 2, "--no-machine", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout, parse_constant=no_constants)  # no Infinity, no NaN
    assert doc["limit_decode_tok_s"] is None and doc["mem_read_gbs"] is None


def test_bench_table_shows_no_internal_names(capsys):
    p = main_(
        capsys,
        "bench",
        "-m",
        TINY,
        "-p",
        3,
        "-n",
        2,
        "--mem-gb",
        0.05,
        "--disk-gb",
        0.01,
        "--no-fma",
    )
    assert p.returncode == 0, p.stderr
    assert "_core" not in p.stdout and "thread(s)" not in p.stdout
    assert "memory read bandwidth" in p.stdout


# --- text on a terminal (friction 5) --------------------------------------------------------------


def test_wrap_breaks_at_word_boundaries_and_indents_the_rest():
    text = "v4flash: error: this message is long enough to need three lines at this width"
    got = wrap(text, 30).splitlines()
    assert all(len(x) <= 30 for x in got) and all(x.startswith("  ") for x in got[1:])
    assert " ".join(x.strip() for x in got) == text
    assert wrap(text, None) == text
    assert wrap("see /a/very/long/path/that/does/not/fit/anywhere ok", 20).splitlines()[1] == (
        "  /a/very/long/path/that/does/not/fit/anywhere"
    )


# --- load progress --------------------------------------------------------------------------------


def test_the_load_line_says_how_much_was_read(capsys):
    p = main_(capsys, "run", "-m", TINY, *GREEDY, "-n", 2, "Hi")
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stderr.splitlines() if x.startswith("loaded in "))
    if sys.platform.startswith("linux"):  # /proc/self/io counts the dense part's reads
        assert "MB read)" in line, line


def test_load_progress_on_a_terminal_names_the_dense_part(tmp_path):
    from rich.console import Console

    from v4flash.cli.common import LoadProgress

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    with LoadProgress(console, TINY, 8_900_000_000) as progress:
        time.sleep(0.05)
        text = progress.text()
    assert text.startswith("loading tiny-a: dense part") and "of 8.9 GB" in text
