"""Finding the checkpoint: --model as a folder, a file, or a Hugging Face repo id looked up in the
local cache, offline on cache layouts built by tests/hub_layout.py."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES
from hub_layout import (
    COMMIT,
    REPO,
    git_blob_id,
    make_cache,
    make_local_dir,
)
from v4flash import hub
from v4flash.cli import main as cli_main
from v4flash.doctor import GB, _gb

TINY = FIXTURES / "tiny-a"
SHARD = "model-00002-of-00002.safetensors"


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def main_(capsys, *args):
    code = cli_main([str(a) for a in args])
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def cli(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "v4flash", *map(str, args)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def clean_error(p, *fragments):
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    assert "v4flash: error:" in p.stderr, p.stderr
    for f in fragments:
        assert f in p.stderr, (f, p.stderr)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache that huggingface_hub (and subprocesses) use."""
    pytest.importorskip("huggingface_hub")
    from huggingface_hub import constants

    c = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(c))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(c))
    return c


@pytest.fixture
def no_hub(monkeypatch):
    """huggingface_hub not installed."""
    for name in list(sys.modules):
        if name == "huggingface_hub" or name.startswith("huggingface_hub."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)


# --- the layout the tests build is huggingface_hub's own ---------------------------------------


def test_the_built_cache_is_what_huggingface_hub_reads(cache):
    from huggingface_hub import scan_cache_dir, snapshot_download, try_to_load_from_cache

    snap = make_cache(TINY, cache)
    info = scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.repo_type == "model"
    (rev,) = repo.revisions
    assert rev.commit_hash == COMMIT and set(rev.refs) == {"main"}
    assert {f.file_name for f in rev.files} == {p.name for p in TINY.iterdir()}
    assert try_to_load_from_cache(REPO, "config.json") == str(snap / "config.json")
    assert snapshot_download(REPO, local_files_only=True) == str(snap)


def test_git_blob_id_is_gits(tmp_path):
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git")
    f = tmp_path / "x.json"
    f.write_bytes((TINY / "config.json").read_bytes())
    out = subprocess.run([git, "hash-object", str(f)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == git_blob_id(f.read_bytes())


# --- --model ------------------------------------------------------------------------------------


def test_looks_like_repo_id():
    yes = [REPO, "org/name", "a-b_c/d.e-1"]
    no = ["./x", "/abs/x", "~/x", "a/b/c", "name", "org/", "/org", "../x", "org/..", "a b/c"]
    assert all(hub.looks_like_repo_id(s) for s in yes)
    assert not any(hub.looks_like_repo_id(s) for s in no)


def test_model_repo_id_is_found_in_the_cache(cache, capsys):
    snap = make_cache(TINY, cache)
    p = main_(capsys, "info", "--model", REPO)
    assert p.returncode == 0, p.stderr
    assert f"checkpoint: {REPO} (Hugging Face cache: {snap})" in p.stdout
    assert "checkpoint ok" in p.stdout
    args = ["--temperature", "0", "-n", "4", "--json", "Hello"]
    by_repo = main_(capsys, "run", "-m", REPO, *args)
    by_dir = main_(capsys, "run", "-m", TINY, *args)
    assert by_repo.returncode == 0, by_repo.stderr
    assert json.loads(by_repo.stdout)["ids"] == json.loads(by_dir.stdout)["ids"]


def test_a_cache_repo_folder_is_its_main_snapshot(cache, capsys):
    snap = make_cache(TINY, cache)
    p = main_(capsys, "info", "-m", cache / ("models--" + REPO.replace("/", "--")))
    assert p.returncode == 0, p.stderr
    assert f"{REPO} (Hugging Face cache: {snap})" in p.stdout


def test_the_lookup_is_offline_and_never_downloads(cache, capsys, monkeypatch):
    import huggingface_hub

    def no_network(*a, **k):
        raise AssertionError("the lookup must not download")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    p = main_(capsys, "info", "-m", "org/not-here")
    clean_error(p, "not in the Hugging Face cache")


def test_a_repo_not_in_the_cache_says_how_to_get_it(cache, capsys):
    p = main_(capsys, "info", "--model", REPO)
    clean_error(
        p,
        f"{REPO} is not in the Hugging Face cache ({cache})",
        f"v4flash download {REPO}",
        f"hf download {REPO}",
        "about 160 GB of disk",
        "is free on the disk of",
    )
    assert p.returncode == 2


def test_a_repo_not_in_the_cache_on_a_small_disk_says_where_else(cache, capsys, monkeypatch):
    monkeypatch.setattr(hub, "free_bytes", lambda path: 10 * GB)
    p = main_(capsys, "run", "--model", REPO, "hi")
    clean_error(p, "10.0 GB is free", "not enough", f"v4flash download {REPO} --dir DIR")


def test_a_partial_download_says_what_is_left(cache, capsys):
    snap = make_cache(TINY, cache, skip=(SHARD,))
    total = json.loads((TINY / "model.safetensors.index.json").read_text())["metadata"]
    have = sum(p.stat().st_size for p in snap.glob("*.safetensors"))
    p = main_(capsys, "run", "--model", REPO, "hi")
    clean_error(
        p,
        "only partly downloaded: 1 of 2 shards missing",
        SHARD,
        f"The rest needs {_gb(total['total_size'] - have)} of disk",
        f"v4flash download {REPO} (it resumes)",
    )
    assert "plan:" not in p.stderr


def test_a_partial_dir_download_says_how_to_resume_it(tmp_path, capsys):
    d = make_local_dir(TINY, tmp_path / "ck", skip=(SHARD,))
    p = main_(capsys, "info", "--model", d)
    clean_error(p, "1 of 2 shards missing", f"v4flash download {REPO} --dir {d} (it resumes)")


def test_a_gguf_repo_id_says_what_v4flash_needs(cache, capsys):
    p = main_(capsys, "info", "--model", "someone/DeepSeek-V4-Flash-GGUF")
    clean_error(p, "looks like a GGUF conversion", "config.json", f"v4flash download {REPO}")


def test_a_download_stopped_before_the_index_uses_the_published_size(cache, capsys):
    make_cache(TINY, cache, skip=("model.safetensors.index.json", SHARD))
    p = main_(capsys, "info", "--model", REPO)
    clean_error(p, "no model.safetensors.index.json", "about 160 GB", f"v4flash download {REPO}")


def test_published_size_agrees_with_the_model_shapes():
    from v4flash.bench import real_model_bytes

    m = real_model_bytes()
    layers = m["dense_resident_bytes"] + m["embed_bytes"] + 43 * 256 * m["expert_bytes"]
    assert layers < hub.PUBLISHED_BYTES < layers * 1.05  # plus the MTP layer
    assert hub.checkpoint_bytes(TINY) == (5310484, "the index's total_size")
    assert hub.checkpoint_bytes(None)[0] == hub.PUBLISHED_BYTES


def test_without_huggingface_hub_a_repo_id_says_how_to_install_it(no_hub, capsys):
    p = main_(capsys, "info", "--model", REPO)
    clean_error(p, "needs huggingface_hub, which is not installed", "pip install 'v4flash[hub]'")
    p = main_(capsys, "info", "--model", TINY)  # folders need no huggingface_hub
    assert p.returncode == 0, p.stderr


def test_tilde_is_expanded(tmp_path, monkeypatch, capsys):
    (tmp_path / "models").mkdir()
    os.symlink(TINY, tmp_path / "models" / "ck")
    monkeypatch.setenv("HOME", str(tmp_path))
    p = main_(capsys, "info", "--model=~/models/ck")  # the shell leaves this ~ alone
    assert p.returncode == 0, p.stderr
    assert f"checkpoint: {tmp_path}/models/ck" in p.stdout


def test_files_get_a_message_saying_what_v4flash_needs(tmp_path, capsys):
    gguf = tmp_path / "DeepSeek-V4-Flash-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    p = main_(capsys, "run", "-m", gguf, "hi")
    clean_error(p, "is a GGUF file", "llama.cpp", "config.json", "v4flash download " + REPO)

    ggufs = tmp_path / "ggufs"
    ggufs.mkdir()
    (ggufs / "a-00001-of-00002.gguf").write_bytes(b"GGUF")
    clean_error(main_(capsys, "info", "-m", ggufs), "holds GGUF files", "a-00001-of-00002.gguf")

    p = main_(capsys, "info", "-m", TINY / SHARD)
    clean_error(p, "is one safetensors shard", f"--model {TINY}")

    lone = tmp_path / "model.safetensors"
    lone.write_bytes((TINY / SHARD).read_bytes())
    clean_error(main_(capsys, "info", "-m", lone), "a single safetensors file", "config.json")

    other = tmp_path / "notes.txt"
    other.write_text("x")
    clean_error(main_(capsys, "info", "-m", other), "is a file", "checkpoint folder")


def test_serve_names_the_model_after_the_repo(cache):
    import argparse
    from pathlib import Path

    from v4flash.cli import _served_name

    snap = make_cache(TINY, cache)
    a = argparse.Namespace(name=None, model_repo=REPO)
    assert _served_name(a, snap, False) == REPO
    a = argparse.Namespace(name=None, model_repo=None)
    assert _served_name(a, Path(TINY), False) == TINY.resolve().name
    assert _served_name(argparse.Namespace(name="x", model_repo=REPO), snap, False) == "x"
