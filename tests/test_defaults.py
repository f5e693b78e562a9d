"""What users of llama.cpp and ollama expect of a command line (issue 49, section 2): short
argument errors, defaults from ``V4FLASH_*`` variables and a file, said in ``--help``, and
shell completion."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import FIXTURES, main_
from helpers import cli
from hub_layout import make_cache
from v4flash.cli import defaults
from v4flash.cli.options import parser

TINY, TINY_B = FIXTURES / "tiny-a", FIXTURES / "tiny-b"
GREEDY = ["--temperature", "0"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A state folder of the test's own (inherited by subprocesses), and no V4FLASH_* default
    or config file from the machine running the tests."""
    h = tmp_path / "v4flash-home"
    monkeypatch.setenv("V4FLASH_HOME", str(h))
    monkeypatch.delenv("V4FLASH_CONFIG", raising=False)
    for var in defaults.ENV.values():
        monkeypatch.delenv(var, raising=False)
    return h


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache that huggingface_hub (and subprocesses) use."""
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    c = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(c))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(c))
    return c


# --- argument errors and --help (friction 8) ------------------------------------------------------


def test_an_argument_error_is_one_line_and_where_the_help_is():
    p = cli("run", "--ram", "x", "Hi")
    assert p.returncode == 2
    assert p.stderr.splitlines() == [
        "v4flash: error: argument --ram: expected a number, got 'x'",
        "  see v4flash run --help",
    ]
    p = cli("chta")
    assert p.returncode == 2
    assert (
        p.stderr.splitlines()[0] == "v4flash: error: unknown command 'chta'; did you mean 'chat'?"
    )
    assert len(p.stderr.splitlines()) == 2


def test_help_describes_every_command_and_the_defaults(capsys):
    def help_of(*cmd):
        with pytest.raises(SystemExit):
            main_(capsys, *cmd, "--help")
        return " ".join(capsys.readouterr().out.split())

    for cmd in ("serve", "info", "doctor", "list", "ps", "completion"):
        text = help_of(cmd)
        usage_end = text.index("options:")
        assert len(text[:usage_end].split(". ")) > 1 or "Lists" in text, (cmd, text)
    assert "Describes a checkpoint without loading any weights" in help_of("info")
    assert "Checks a checkpoint file by file" in help_of("doctor")
    for cmd in ("chat", "run", "serve", "info", "doctor", "bench"):
        assert "the memory available at the start" in help_of(cmd), cmd  # --ram's default
    # -n: 1024 in chat and run, 4096 in serve, and each says why
    assert "(default 1024; serve's is 4096" in help_of("run")
    assert "(4096, more than chat and run's 1024" in help_of("serve")
    # the variable that sets each default
    text = help_of("serve")
    for var in ("V4FLASH_MODEL", "V4FLASH_RAM", "V4FLASH_HOST", "V4FLASH_PORT", "V4FLASH_API_KEY"):
        assert f"[${var}]" in text, var
    assert "no demo notice" not in text


# --- defaults from the environment and the file ---------------------------------------------------


def parse(*argv, environ=None):
    p = parser()
    warnings = defaults.apply(p, environ or {})
    return p.parse_args(list(argv)), warnings


def test_flag_beats_environment_beats_file_beats_builtin(home):
    a, _ = parse("run", "Hi")
    assert (a.ram, a.max_tokens, a.model, a.numerics) == (None, 1024, None, "exact")
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        "# my defaults\n"
        'model = "/models/v4"  # a comment\n'
        "ram = 12\n"
        "max-tokens = 300\n"
        "[serve]\n"
        "port = 9000\n"
        "max_tokens = 2000\n"
    )
    a, warnings = parse("run", "Hi")
    assert (a.ram, a.max_tokens, a.model) == (12.0, 300, "/models/v4") and warnings == []
    a, _ = parse("serve")
    assert (a.port, a.max_tokens, a.ram) == (9000, 2000, 12.0)  # [serve] wins over the top
    a, _ = parse("run", "Hi", environ={"V4FLASH_RAM": "24", "V4FLASH_NUMERICS": "fast"})
    assert (a.ram, a.numerics, a.max_tokens) == (24.0, "fast", 300)
    a, _ = parse("run", "--ram", "8", "Hi", environ={"V4FLASH_RAM": "24"})
    assert a.ram == 8.0


def test_a_bad_default_is_refused_by_the_command_that_takes_it_naming_where_it_came_from(
    capsys, monkeypatch, home
):
    monkeypatch.setenv("V4FLASH_PORT", "eighty")
    p = main_(capsys, "info", "--model", TINY)  # info takes no --port: not its business
    assert p.returncode == 0, p.stderr
    with pytest.raises(SystemExit) as e:
        main_(capsys, "serve", "--model", TINY)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert "argument --port: expected an integer, got 'eighty' (from $V4FLASH_PORT)" in err
    monkeypatch.delenv("V4FLASH_PORT")
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text("numerics = quick\nrma = 3\n")
    with pytest.raises(SystemExit):
        main_(capsys, "run", "Hi")
    err = capsys.readouterr().err
    assert f"invalid choice 'quick' (from {home / 'config.toml'} line 1)" in err
    assert "warning:" in err and "line 2: unknown setting 'rma'" in err
    (home / "config.toml").write_text("ram 3\n")
    p = main_(capsys, "run", "Hi")
    assert p.returncode == 2 and "line 1: expected KEY = VALUE" in p.stderr


def test_the_environment_picks_the_model_and_help_says_so(capsys, monkeypatch):
    monkeypatch.setenv("V4FLASH_MODEL", str(TINY_B))
    monkeypatch.setenv("V4FLASH_API_KEY", "sekret")
    p = main_(capsys, "run", *GREEDY, "-n", 2, "--json", "Hi")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["model"] == str(TINY_B) and doc["demo"] is False
    assert "NOT DeepSeek" not in p.stderr
    with pytest.raises(SystemExit):
        main_(capsys, "serve", "--help")
    text = " ".join(capsys.readouterr().out.split())
    assert f"[$V4FLASH_MODEL; here '{TINY_B}', from the environment]" in text
    assert "[$V4FLASH_API_KEY; here set, from the environment]" in text
    assert "sekret" not in text


# --- completion -----------------------------------------------------------------------------------


def _bash_complete(script, words, env=None):
    line = " ".join(words)
    cmd = (
        f"source {script}\n"
        f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}\n"
        "_v4flash\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    p = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion(capsys, tmp_path, cache):
    p = main_(capsys, "completion", "bash")
    assert p.returncode == 0
    script = tmp_path / "v4flash.bash"
    script.write_text(p.stdout)
    assert _bash_complete(script, ["v4flash", "ch"]) == ["chat"]
    assert set(_bash_complete(script, ["v4flash", "''"])) >= {"list", "ps", "status", "serve"}
    assert _bash_complete(script, ["v4flash", "run", "--num"]) == ["--numerics"]
    assert _bash_complete(script, ["v4flash", "run", "--numerics", "''"]) == [
        "exact",
        "fast",
        "fp8-act",
        "official",
    ]
    assert _bash_complete(script, ["v4flash", "completion", "''"]) == ["bash", "zsh", "fish"]
    assert _bash_complete(script, ["v4flash", "doctor", "--str"]) == ["--strict"]
    make_cache(TINY, cache, repo="deepseek-ai/DeepSeek-V4-Flash")
    env = {"HF_HUB_CACHE": str(cache)}
    assert _bash_complete(script, ["v4flash", "chat", "-m", "deepseek"], env) == [
        "deepseek-ai/DeepSeek-V4-Flash"
    ]
    assert _bash_complete(script, ["v4flash", "download", "deep"], env) == [
        "deepseek-ai/DeepSeek-V4-Flash"
    ]


def test_completion_scripts_name_every_option(capsys):
    p = parser()
    flags = {
        f
        for name, q in next(
            a for a in p._actions if a.__class__.__name__ == "_SubParsersAction"
        ).choices.items()
        for a in q._actions
        if a.help != "==SUPPRESS=="
        for f in a.option_strings
        if f.startswith("--")
    }
    for shell in ("bash", "zsh", "fish"):
        text = main_(capsys, "completion", shell).stdout
        for f in flags:
            want = f"-l {f[2:]}" if shell == "fish" else f
            assert want in text, (shell, f)


@pytest.mark.skipif(shutil.which("zsh") is None, reason="needs zsh")
def test_zsh_completion_loads(capsys, tmp_path):
    script = tmp_path / "_v4flash"
    script.write_text(main_(capsys, "completion", "zsh").stdout)
    assert subprocess.run(["zsh", "-n", str(script)], capture_output=True).returncode == 0
    p = subprocess.run(
        [
            "zsh",
            "-f",
            "-c",
            f"autoload -U compinit; compinit -u -D; source {script}; print -r -- $_comps[v4flash]",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert p.stdout.strip() == "_v4flash", p.stderr


@pytest.mark.skipif(shutil.which("fish") is None, reason="needs fish")
def test_fish_completion(capsys, tmp_path):
    script = tmp_path / "v4flash.fish"
    script.write_text(main_(capsys, "completion", "fish").stdout)

    def complete(line):
        p = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            env={**os.environ, "HOME": str(tmp_path)},
        )
        assert p.returncode == 0, p.stderr
        return [x.split("\t")[0] for x in p.stdout.splitlines()]

    assert complete("v4flash ch") == ["chat"]
    assert "--numerics" in complete("v4flash run --num")
    assert complete("v4flash run --numerics ") == ["exact", "fast", "fp8-act", "official"]
