"""What the command-line, server and chat tests share: ``v4flash`` run in a subprocess, a
``v4flash serve`` process that says where it listens, and the OpenAI tools used as examples."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo d'une ville",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


def cli(*args, input=None, env=None, timeout=120):
    """``python -m v4flash ARGS`` (stdin: ``input``, else nothing), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "v4flash", *map(str, args)],
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


@contextlib.contextmanager
def serving(*args, timeout=120):
    """``v4flash serve --port 0 ARGS`` in a subprocess, once it says it serves: yields (the
    process, its stderr lines so far and to come, the base URL ``http://HOST:PORT/v1``).
    The process is killed at the end if it still runs, and its stderr read to the end."""
    p = subprocess.Popen(
        [sys.executable, "-m", "v4flash", "serve", "--port", "0", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    err: list = []
    reader = threading.Thread(target=lambda: err.extend(iter(p.stderr.readline, "")))
    reader.start()
    try:
        end = time.time() + timeout
        while not any("serving" in x for x in err) and time.time() < end and p.poll() is None:
            time.sleep(0.05)
        line = next(x for x in err if "serving" in x)
        yield p, err, line.split(" at ")[1].split()[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        reader.join(30)
