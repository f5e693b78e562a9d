"""The README's two commands stay true: the demo command runs, the test command runs pytest."""

import re
import shlex
from pathlib import Path

from v4flash.cli import main

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def _block(name: str) -> str:
    m = re.search(rf"<!-- {name} -->\s*```\s*\n(.*?)\n```\s*<!-- /{name} -->", README, re.S)
    assert m, f"README has no {name} block"
    return m.group(1).strip()


def test_test_command_installs_and_runs_pytest():
    cmd = _block("test-command")
    assert "pip install" in cmd and "pytest" in cmd


def test_demo_command_runs_the_demo(capsys):
    cmd = _block("demo-command")
    assert cmd.startswith("python3 -m pip install . && python3 -m v4flash ")
    args = shlex.split(cmd.split("python3 -m v4flash ", 1)[1])
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.strip(), "the demo printed no answer"
    assert "NOT DeepSeek" in err
