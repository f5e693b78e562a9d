"""``v4flash list`` and ``v4flash ps`` (issue 49, section 2), as ``ollama list`` and ``ollama
ps``: the checkpoints on this machine and the servers running on it, from the state folder
(``$V4FLASH_HOME``) and the Hugging Face cache."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from conftest import FIXTURES, main_
from helpers import serving
from hub_layout import corrupt, make_cache
from v4flash import state
from v4flash.termtext import columns

TINY, TINY_B = FIXTURES / "tiny-a", FIXTURES / "tiny-b"
GREEDY = ["--temperature", "0"]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    """A state folder of the test's own (inherited by subprocesses)."""
    h = tmp_path / "v4flash-home"
    monkeypatch.setenv("V4FLASH_HOME", str(h))
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


# --- v4flash list ---------------------------------------------------------------------------------


def test_list_shows_cache_repos_and_used_folders_with_release_and_check(
    capsys, cache, tmp_path, home
):
    make_cache(TINY, cache, repo="deepseek-ai/DeepSeek-V4-Flash")
    snap_b = make_cache(TINY_B, cache, repo="deepseek-ai/DeepSeek-V4-Flash-0731")
    partial = make_cache(
        TINY, cache, repo="someone/partial-v4", skip=("model-00002-of-00002.safetensors",)
    )
    other = make_cache(TINY, cache, repo="someone/llama")
    cfg = json.loads((other / "config.json").read_text())
    cfg["model_type"] = "llama"
    (other / "config.json").unlink()
    (other / "config.json").write_text(json.dumps(cfg))
    used = tmp_path / "my-checkpoint"
    shutil.copytree(TINY_B, used)
    gone = tmp_path / "gone"
    shutil.copytree(TINY, gone)
    assert main_(capsys, "info", "-m", used).returncode == 0  # remembered
    assert main_(capsys, "info", "-m", gone).returncode == 0
    shutil.rmtree(gone)

    p = main_(capsys, "list", "--json")
    assert p.returncode == 0, p.stderr
    found = {f["name"]: f for f in json.loads(p.stdout)}
    assert set(found) == {
        "deepseek-ai/DeepSeek-V4-Flash",
        "deepseek-ai/DeepSeek-V4-Flash-0731",
        "someone/partial-v4",
        str(used),
        str(gone),
    }, found  # someone/llama is not a DeepSeek V4 Flash checkpoint
    assert found["deepseek-ai/DeepSeek-V4-Flash"]["release"] == "first (MTP)"
    assert found["deepseek-ai/DeepSeek-V4-Flash-0731"]["release"] == "0731 (DSpark)"
    assert found[str(used)]["release"] == "0731 (DSpark)"
    size_b = sum(f.stat().st_size for f in TINY_B.iterdir())
    assert found[str(used)]["bytes"] == size_b
    assert found["deepseek-ai/DeepSeek-V4-Flash-0731"]["bytes"] == size_b
    assert found[str(used)]["check"] == "ok" and found[str(used)]["used"] == "just now"
    assert found["deepseek-ai/DeepSeek-V4-Flash"]["used"] == "-"  # never used by v4flash
    assert found["someone/partial-v4"]["check"] == "incomplete"
    assert "1 of 2 shards missing" in found["someone/partial-v4"]["detail"]
    assert found[str(gone)]["check"] == "not found"
    assert str(partial) == found["someone/partial-v4"]["path"]

    # "verified" only after doctor --verify, and only while the files stay those hashed
    assert main_(capsys, "doctor", "-m", "deepseek-ai/DeepSeek-V4-Flash-0731", "--verify")
    found = {f["name"]: f for f in json.loads(main_(capsys, "list", "--json").stdout)}
    assert found["deepseek-ai/DeepSeek-V4-Flash-0731"]["check"] == "verified"
    corrupt(snap_b / "model-00001-of-00006.safetensors")
    found = {f["name"]: f for f in json.loads(main_(capsys, "list", "--json").stdout)}
    assert found["deepseek-ai/DeepSeek-V4-Flash-0731"]["check"] == "ok"

    text = main_(capsys, "list").stdout  # a pipe: one line per checkpoint, aligned
    lines = text.splitlines()
    assert lines[0].split() == ["NAME", "RELEASE", "SIZE", "CHECK", "USED"]
    assert len(lines) == 6 and any(line.startswith(str(used)) for line in lines)


def test_list_with_nothing_says_how_to_get_a_checkpoint(capsys, cache):
    p = main_(capsys, "ls")
    assert p.returncode == 0 and "no checkpoint found" in p.stdout and "download" in p.stdout


def test_columns_turn_into_blocks_when_too_narrow():
    rows = [("deepseek-ai/DeepSeek-V4-Flash-0731", "0731 (DSpark)", "166.9 GB", "ok", "-")]
    headers = ("NAME", "RELEASE", "SIZE", "CHECK", "USED")
    wide = columns(headers, rows, 120).splitlines()
    assert len(wide) == 2 and wide[1].startswith("deepseek-ai/DeepSeek-V4-Flash-0731  0731")
    narrow = columns(headers, rows, 40).splitlines()
    assert narrow[0] == "deepseek-ai/DeepSeek-V4-Flash-0731"
    assert "  release: 0731 (DSpark)" in narrow and all(len(x) <= 40 for x in narrow)


# --- v4flash ps -----------------------------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGTERM")
def test_ps_lists_a_running_server_and_forgets_it_at_exit(capsys, home):
    with serving("--model", TINY, "--name", "tiny-under-test") as (p, err, url):
        got = json.loads(main_(capsys, "ps", "--json").stdout)
        assert [s["pid"] for s in got] == [p.pid]
        s = got[0]
        assert s["url"] + "/v1" == url and s["model"] == "tiny-under-test"
        assert s["health"]["status"] == "ok" and s["health"]["busy"] is False
        assert s["health"]["prompt_cache"]["max_sessions"] == 4
        if sys.platform.startswith("linux"):
            assert s["rss"] > 1 << 20
        text = main_(capsys, "status").stdout
        assert text.splitlines()[0].split()[:4] == ["PID", "URL", "MODEL", "STATE"]
        assert f"{p.pid}  {url}" in text and "idle" in text and "tiny-under-test" in text
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    assert list((home / "servers").glob("*.json")) == []
    assert "no v4flash server is running" in main_(capsys, "ps").stdout


def test_ps_drops_the_entry_of_a_server_that_is_gone(capsys, home):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    entry = home / "servers" / f"{dead.pid}.json"
    state.write_json(entry, {"pid": dead.pid, "url": "http://127.0.0.1:9", "model": "x"})
    assert json.loads(main_(capsys, "ps", "--json").stdout) == []
    assert not entry.exists()


def test_ps_says_when_a_live_server_does_not_answer(capsys, home):
    # this process stands for a server whose port answers nothing
    state.register_server({"url": "http://127.0.0.1:9", "model": "m"})
    got = json.loads(main_(capsys, "ps", "--json").stdout)
    assert [s["pid"] for s in got] == [os.getpid()]
    assert got[0]["health"]["status"] == "not answering"
    assert "not answering" in main_(capsys, "ps").stdout
