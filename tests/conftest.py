import atexit
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

# The Ctrl-C tests send SIGINT to child processes. A runner started in the background by a
# non-interactive shell has SIGINT ignored, and an ignored signal stays ignored across exec,
# so those children would never see it. A handled signal is reset to the default across
# exec instead: handle it here, and every child starts with Python's usual Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# What the CLI and the server remember (servers running, checkpoints used) goes to a folder of
# this run, not to the state folder of whoever runs the tests (children inherit it).
_HOME = tempfile.mkdtemp(prefix="v4flash-tests-home-")
os.environ["V4FLASH_HOME"] = _HOME
atexit.register(shutil.rmtree, _HOME, True)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
FIXTURE_NAMES = ["tiny-a", "tiny-b"]


def copy_fixture(tmp_path: Path, name: str = "tiny-a") -> Path:
    """A writable copy of fixture ``name`` in ``tmp_path`` (for tests that damage one)."""
    d = tmp_path / name
    shutil.copytree(FIXTURES / name, d)
    for p in d.iterdir():
        p.chmod(0o644)
    return d


def bench_module(name: str):
    """``benches/<name>.py`` as a module (measurement tools live there, not in the package),
    loaded once and registered under its name, so the benches that import it share it."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benches" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


class Reference:
    def __init__(self, name: str):
        self.name = name
        self.path = FIXTURES / name
        self.meta = json.loads((FIXTURES / f"{name}.ref.json").read_text())
        self.arrays = np.load(FIXTURES / f"{name}.ref.npz")
        self.cases = self.meta["cases"]

    def logits(self, case) -> np.ndarray:
        return self.arrays[case["name"] + ".logits"]

    def greedy_logits(self, case) -> np.ndarray:
        return self.arrays[case["name"] + ".greedy_logits"]


@pytest.fixture(scope="session", params=FIXTURE_NAMES)
def ref(request) -> Reference:
    return Reference(request.param)


_models = {}


def model_for(name: str, **kw):
    import v4flash

    key = (name, tuple(sorted(kw.items())))
    if key not in _models:
        _models[key] = v4flash.load(FIXTURES / name, **kw)
    return _models[key]


class CliResult:
    """What an in-process CLI run returned: exit code and captured output."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def main_(capsys, *args):
    """In-process ``v4flash ARGS`` (faster than a subprocess; same code path)."""
    from v4flash.cli import main as cli_main

    code = cli_main([str(a) for a in args])
    out = capsys.readouterr()
    return CliResult(code, out.out, out.err)
