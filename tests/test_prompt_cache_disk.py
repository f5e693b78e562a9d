"""The prompt cache on disk (textapi/disk.py, ``serve --prompt-cache-dir``): states at turn
boundaries written as session files in the background, found again by a new cache (a restart),
the output after a disk hit equal to a cold run; damaged and foreign files skipped with a log
line and never served; the disk budget kept by removing the least recently used files."""

from __future__ import annotations

import shutil

import pytest

from conftest import model_for
from v4flash.textapi.cache import PromptCache
from v4flash.textapi.disk import SUFFIX, DiskOptions

SYS = {"role": "system", "content": "You are a careful assistant. Answer in one sentence."}
FIRST = [SYS, {"role": "user", "content": "Hello there, how are you today?"}]
GREEDY = {"max_new_tokens": 6, "temperature": 0}


@pytest.fixture(scope="module")
def m():
    return model_for("tiny-a")


def disk_cache(m, d, logs=None, max_bytes=1 << 30, **kw):
    pc = PromptCache(m, **kw)
    pc.use_disk(d, max_bytes, min_tokens=4, log=(logs.append if logs is not None else None))
    return pc


def files(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(SUFFIX))


def test_a_restart_resumes_from_disk_and_answers_as_a_cold_run(m, tmp_path):
    cold = m.chat(FIRST, cache=False, **GREEDY)
    pc = disk_cache(m, tmp_path)
    first = m.chat(FIRST, cache=pc, **GREEDY)
    assert first.ids == cold.ids and first.usage.cached_tokens == 0
    pc.flush()
    (name,) = files(tmp_path)  # the state through the prompt's last <｜Assistant｜>
    held = int(name.split("-")[0])
    assert 4 <= held < cold.usage.prompt_tokens
    assert pc.stats()["disk"]["writes"] == 1

    # "restart": a new cache on the same directory, nothing in RAM
    again = disk_cache(m, tmp_path)
    r = m.chat(FIRST, cache=again, **GREEDY)
    assert r.ids == cold.ids and r.text == cold.text
    assert r.usage.cached_tokens == held
    assert again.stats()["disk"]["hits"] == 1

    # the next turn of the conversation resumes from the same file after another restart
    turn2 = FIRST + [
        {"role": "assistant", "content": cold.text},
        {"role": "user", "content": "And tomorrow?"},
    ]
    want = m.chat(turn2, cache=False, **GREEDY)
    third = disk_cache(m, tmp_path)
    r2 = m.chat(turn2, cache=third, **GREEDY)
    assert r2.ids == want.ids
    assert r2.usage.cached_tokens == held
    third.flush()
    assert len(files(tmp_path)) == 2  # and its own boundary was written too


def test_the_file_is_not_written_twice_and_ram_wins_ties(m, tmp_path):
    pc = disk_cache(m, tmp_path)
    m.chat(FIRST, cache=pc, **GREEDY)
    pc.flush()
    m.chat(FIRST, cache=pc, **GREEDY)  # from RAM (same length on disk): no disk read
    pc.flush()
    st = pc.stats()["disk"]
    assert st["writes"] == 1 and st["hits"] == 0 and st["files"] == 1


def test_short_states_are_not_written(m, tmp_path):
    pc = PromptCache(m)
    pc.use_disk(tmp_path, 1 << 30, min_tokens=10_000)
    m.chat(FIRST, cache=pc, **GREEDY)
    pc.flush()
    assert files(tmp_path) == []


def test_a_damaged_file_is_skipped_logged_deleted_never_served(m, tmp_path):
    cold = m.chat(FIRST, cache=False, **GREEDY)
    pc = disk_cache(m, tmp_path)
    m.chat(FIRST, cache=pc, **GREEDY)
    pc.flush()
    (name,) = files(tmp_path)
    p = tmp_path / name
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the body: its checksum says so
    p.write_bytes(bytes(data))

    logs = []
    again = disk_cache(m, tmp_path, logs)
    r = m.chat(FIRST, cache=again, **GREEDY)
    assert r.ids == cold.ids and r.usage.cached_tokens == 0
    assert len(logs) == 1 and name in logs[0] and "skipping" in logs[0]
    again.flush()
    # the damaged file went; the cold run's state was written in its place, intact
    assert files(tmp_path) == [name] and p.read_bytes() != bytes(data)
    assert again.stats()["disk"]["skipped"] == 1


def test_a_truncated_file_is_skipped(m, tmp_path):
    pc = disk_cache(m, tmp_path)
    m.chat(FIRST, cache=pc, **GREEDY)
    pc.flush()
    (name,) = files(tmp_path)
    p = tmp_path / name
    p.write_bytes(p.read_bytes()[:100])
    logs = []
    again = disk_cache(m, tmp_path, logs)
    r = m.chat(FIRST, cache=again, **GREEDY)
    assert r.usage.cached_tokens == 0 and len(logs) == 1 and name in logs[0]


def test_a_file_holding_other_tokens_than_its_name_is_not_served(m, tmp_path):
    """A file renamed to another prefix's name (or a hash collision) holds other tokens."""
    a, b = list(range(40, 52)), list(range(60, 72))  # raw prompts of one length
    pc = disk_cache(m, tmp_path)
    m.complete(a, cache=pc, **GREEDY)
    pc.flush()
    (wrong,) = files(tmp_path)
    right = pc.disk.name(b[:-1])  # the state b resumes from: all but its last token
    assert wrong == pc.disk.name(a[:-1]) and wrong != right
    (tmp_path / wrong).rename(tmp_path / right)
    logs = []
    again = disk_cache(m, tmp_path, logs)
    r = m.complete(b, cache=again, **GREEDY)
    assert r.ids == m.complete(b, cache=False, **GREEDY).ids
    assert r.usage.cached_tokens == 0
    assert len(logs) == 1 and right in logs[0] and "other tokens" in logs[0]


def test_another_models_files_are_never_read(m, tmp_path):
    """Files are named by the model's identity: another numerics mode (or model) looks for
    other names; a foreign file copied under this model's name is refused by the core."""
    ids = list(range(40, 52))
    pc = disk_cache(m, tmp_path)
    m.complete(ids, cache=pc, **GREEDY)
    pc.flush()
    (name,) = files(tmp_path)
    other = model_for("tiny-a", numerics="official")
    assert other.identity != m.identity
    logs = []
    oc = disk_cache(other, tmp_path, logs)
    r = other.complete(ids, cache=oc, **GREEDY)
    assert r.usage.cached_tokens == 0 and logs == []  # not even tried
    oc.flush()
    foreign = oc.disk.name(ids[:-1])
    assert sorted(files(tmp_path)) == sorted([name, foreign])  # each mode its own file

    # the exact-mode file under the official-mode name: the core refuses it, logged
    shutil.copy(tmp_path / name, tmp_path / foreign)
    logs = []
    oc = disk_cache(other, tmp_path, logs)
    r = other.complete(ids, cache=oc, **GREEDY)
    assert r.usage.cached_tokens == 0
    assert len(logs) == 1 and foreign in logs[0] and "numerics" in logs[0]


def test_the_disk_budget_removes_the_least_recently_used(m, tmp_path):
    pc = disk_cache(m, tmp_path)
    m.chat(FIRST, cache=pc, **GREEDY)
    pc.flush()
    (one,) = files(tmp_path)
    size = (tmp_path / one).stat().st_size
    # room for one file and a half: the second conversation's file pushes the first out
    small = disk_cache(m, tmp_path, max_bytes=size + size // 2, max_sessions=0)
    other = [SYS, {"role": "user", "content": "Another question, quite different."}]
    m.chat(other, cache=small, **GREEDY)
    small.flush()
    (left,) = files(tmp_path)
    assert left != one
    assert small.stats()["disk"]["bytes"] <= size + size // 2


def test_bad_arguments_are_refused_with_their_name(m, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="cannot use as the prompt cache directory"):
        DiskOptions(tmp_path / "f" / "sub", 1 << 30).prepare()
    with pytest.raises(ValueError, match="disk budget"):
        PromptCache(m).use_disk(tmp_path, 0)
    with pytest.raises(ValueError, match="min_tokens"):
        PromptCache(m).use_disk(tmp_path, 1 << 20, min_tokens=0)


def test_the_server_keeps_its_prompt_cache_across_a_restart(m, tmp_path):
    httpx = pytest.importorskip("httpx")
    from test_server import TIMEOUT, Running

    opts = DiskOptions(tmp_path, 1 << 30, min_tokens=4)
    body = {"model": "demo", "messages": FIRST, "max_tokens": 6, "temperature": 0}

    def ask(s, path="/v1/chat/completions"):
        r = httpx.post(s.url + path, json=body, timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        return r.json()

    s = Running(m, name="demo", cache_disk=opts)
    try:
        first = ask(s)
    finally:
        s.close()  # writes what is pending
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(files(tmp_path)) == 1
    s = Running(m, name="demo", cache_disk=opts)
    try:
        again = ask(s)
        disk = httpx.get(s.url + "/health", timeout=TIMEOUT).json()["prompt_cache"]["disk"]
    finally:
        s.close()
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert disk["hits"] == 1 and disk["files"] == 1


def test_serve_says_a_bad_cache_directory_before_loading(capsys, tmp_path):
    from conftest import FIXTURES, main_

    (tmp_path / "f").write_text("x")
    bad = tmp_path / "f" / "cache"
    p = main_(
        capsys, "serve", "--model", FIXTURES / "tiny-a", "--port", 0, "--prompt-cache-dir", bad
    )
    assert p.returncode != 0 and str(bad) in p.stderr and "prompt cache directory" in p.stderr


def test_serve_reads_the_disk_cache_flags():
    from v4flash.cli.options import parser

    a = parser().parse_args(
        [
            "serve",
            "--prompt-cache-dir",
            "D",
            "--prompt-cache-disk",
            "2.5",
            "--prompt-cache-min",
            "9",
        ]
    )
    assert (a.prompt_cache_dir, a.prompt_cache_disk, a.prompt_cache_min) == ("D", 2.5, 9)
    a = parser().parse_args(["serve"])
    assert a.prompt_cache_dir is None and a.prompt_cache_min == 256
