"""Finding the checkpoint (--model as a folder, a file, or a Hugging Face repo id looked up in the
local cache), ``doctor --verify`` (every file against the hash the hub published) and
``v4flash download``, all offline on cache layouts built by tests/hub_layout.py."""

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FIXTURES, main_
from helpers import cli
from hub_layout import (
    COMMIT,
    REPO,
    blob_of,
    corrupt,
    git_blob_id,
    make_cache,
    make_local_dir,
)
from v4flash import _core
from v4flash.hub import fetch, hashes, releases
from v4flash.hub.locate import looks_like_repo_id
from v4flash.units import GB, gb

TINY = FIXTURES / "tiny-a"
TINY_TOTAL = 5310484  # its index's metadata.total_size
SHARD = "model-00002-of-00002.safetensors"


@pytest.fixture(autouse=True)
def _state_home(tmp_path, monkeypatch):
    """What v4flash remembers (used checkpoints, servers, chat history) goes to a folder of
    the test's own, not the home of whoever runs the tests."""
    monkeypatch.setenv("V4FLASH_HOME", str(tmp_path / "v4flash-home"))


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
    assert all(looks_like_repo_id(s) for s in yes)
    assert not any(looks_like_repo_id(s) for s in no)


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
    # the error, then what to do, one hint a line (it was one line of 560 characters)
    first, *hints = p.stderr.splitlines()
    assert first.startswith("v4flash: error: ") and first.endswith("no folder of that name exists")
    assert len(hints) == 3 and all(h.startswith("  ") for h in hints), p.stderr
    assert hints[0] == f"  download it with: v4flash download {REPO} (or: hf download {REPO})"


def test_a_repo_not_in_the_cache_on_a_small_disk_says_where_else(cache, capsys, monkeypatch):
    monkeypatch.setattr(releases, "free_bytes", lambda path: 10 * GB)
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
        f"The rest needs {gb(total['total_size'] - have)} of disk",
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


def test_published_sizes_agree_with_the_tensor_tables():
    import math

    from v4flash.bench import ITEMSIZE

    def table_bytes(rows):
        return sum(math.prod(shape) * ITEMSIZE[dtypes[0]] for _, dtypes, shape in rows)

    for repo, release in [(REPO, "first"), (REPO + "-0731", "0731")]:
        cfg = _core.published_config(release)
        total = table_bytes(_core.expected_tensors(cfg)) + table_bytes(_core.drafter_tensors(cfg))
        assert releases.RELEASES[repo] == total, repo
        assert releases.checkpoint_bytes(None, repo) == (total, "the published checkpoint")
    assert releases.REPO_ID == REPO + "-0731"  # download fetches the newest release
    assert releases.checkpoint_bytes(TINY) == (TINY_TOTAL, "the index's total_size")
    assert releases.checkpoint_bytes(None, "org/other") == (None, "unknown")


def test_without_huggingface_hub_a_repo_id_says_how_to_install_it(no_hub, capsys):
    p = main_(capsys, "info", "--model", REPO)
    clean_error(p, "needs huggingface_hub, which is not installed", "pip install 'v4flash[hub]'")
    p = main_(capsys, "download")
    clean_error(p, "v4flash download needs huggingface_hub", "pip install 'v4flash[hub]'")
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

    from v4flash.cli.serve import _served_name

    snap = make_cache(TINY, cache)
    a = argparse.Namespace(name=None, model_repo=REPO)
    assert _served_name(a, snap, False) == REPO
    a = argparse.Namespace(name=None, model_repo=None)
    assert _served_name(a, Path(TINY), False) == TINY.resolve().name
    assert _served_name(argparse.Namespace(name="x", model_repo=REPO), snap, False) == "x"


# --- doctor --verify ----------------------------------------------------------------------------


def test_verify_passes_on_an_intact_cache(cache, capsys):
    make_cache(TINY, cache, extra={"README.md": b"# DeepSeek V4 Flash\n"})
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    assert p.returncode == 0, p.stderr
    n = len(list(TINY.iterdir())) + 1
    assert f"ok   verify: {n} files" in p.stdout and "every hash matches" in p.stdout
    assert "all checks passed" in p.stdout


def test_verify_finds_a_corrupted_blob(cache, capsys):
    snap = make_cache(TINY, cache)
    corrupt(snap / SHARD)  # same size, one byte flipped: only the hash can tell
    assert main_(capsys, "doctor", "-m", REPO).returncode == 0  # sizes and headers look fine
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    clean_error(p, SHARD, "sha256")
    line = next(x for x in p.stdout.splitlines() if x.startswith(f"FAIL {SHARD}"))
    assert "the hub published " + blob_of(snap / SHARD).name[:12] in line
    assert f"'{snap / SHARD}'" in line and f"'{blob_of(snap / SHARD)}'" in line  # rm both
    assert f"v4flash download {REPO}" in line
    assert sum(x.startswith("FAIL") for x in p.stdout.splitlines()) == 1
    assert "all checks passed" not in p.stdout


def test_verify_checks_small_files_by_their_git_blob_id(cache, capsys):
    snap = make_cache(TINY, cache, extra={"README.md": b"# DeepSeek V4 Flash\n"})
    assert len(blob_of(snap / "README.md").name) == 40
    corrupt(snap / "README.md")
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    clean_error(p, "README.md", "git blob id")


def test_verify_finds_a_truncated_blob_and_a_missing_one(cache, capsys):
    snap = make_cache(TINY, cache)
    blob = blob_of(snap / SHARD)
    blob.write_bytes(blob.read_bytes()[:-4096])
    os.unlink(blob_of(snap / "tokenizer_config.json"))
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    clean_error(p)
    assert f"FAIL {SHARD}: sha256" in p.stdout
    assert "FAIL tokenizer_config.json: its blob" in p.stdout and "missing" in p.stdout


def test_verify_a_local_dir_download(tmp_path, capsys):
    d = make_local_dir(TINY, tmp_path / "ck")
    p = main_(capsys, "doctor", "--verify", "-m", d)
    assert p.returncode == 0, p.stderr
    assert "every hash matches" in p.stdout
    corrupt(d / SHARD)
    p = main_(capsys, "doctor", "--verify", "-m", d)
    clean_error(p, SHARD)
    assert f"v4flash download {REPO} --dir {d}" in p.stdout and f"rm '{d / SHARD}'" in p.stdout


def test_verify_on_a_plain_folder_says_it_cannot(capsys):
    p = main_(capsys, "doctor", "--verify", "-m", TINY)
    assert p.returncode == 0, p.stderr
    assert "warn verify: " in p.stdout and "not a Hugging Face download" in p.stdout


def test_verify_reads_every_file_once_front_to_back(cache, monkeypatch):
    snap = make_cache(TINY, cache)
    real = hashes._read_chunks
    reads = []

    def recording(path, chunk=hashes.CHUNK):
        offset = 0
        for b in real(path, 64 << 10):  # small chunks: several per shard
            reads.append((path, offset, len(b)))
            offset += len(b)
            yield b

    monkeypatch.setattr(hashes, "_read_chunks", recording)
    seen = []
    h = hashes.published_hashes(snap)
    v = hashes.verify(snap, lambda n, name: seen.append((name, n)), h)
    assert v.ok
    order = [p for i, (p, _, _) in enumerate(reads) if i == 0 or reads[i - 1][0] != p]
    assert order == [f.data for f in h.files]  # one pass per file, in order
    assert len(set(order)) == len(order) == len(list(TINY.iterdir()))
    for f in h.files:  # contiguous reads that cover the file exactly
        mine = [(o, n) for p, o, n in reads if p == f.data]
        assert [o for o, _ in mine] == [sum(n for _, n in mine[:i]) for i in range(len(mine))]
        assert sum(n for _, n in mine) == f.size
    assert sum(n for _, n in seen) == h.total_bytes == v.bytes_read


def test_an_unreadable_file_fails_and_the_rest_is_still_checked(cache, capsys, monkeypatch):
    snap = make_cache(TINY, cache)
    real = hashes._read_chunks
    bad = blob_of(snap / SHARD)

    def failing(path, chunk=hashes.CHUNK):
        if path == bad:
            raise OSError(5, "Input/output error")
        yield from real(path, chunk)

    monkeypatch.setattr(hashes, "_read_chunks", failing)
    v = hashes.verify(snap)
    assert [f.rel for f, _ in v.unreadable] == [SHARD] and not v.bad
    assert v.bytes_read == v.hashes.total_bytes - bad.stat().st_size
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    clean_error(p, SHARD)
    assert "cannot be read (Input/output error)" in p.stdout


def test_verify_shows_a_progress_bar_on_a_terminal(cache, capsys, monkeypatch):
    from rich.console import Console

    import v4flash.cli.info as cli_info

    make_cache(TINY, cache)
    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=120)
    monkeypatch.setattr(cli_info, "err_console", lambda: term)
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    assert p.returncode == 0, p.stderr
    assert "verifying" in buf.getvalue()


def test_an_interrupted_download_is_mentioned(cache, capsys):
    snap = make_cache(TINY, cache)
    (snap.parent.parent / "blobs" / ("ab" * 32 + ".incomplete")).write_bytes(b"x")
    p = main_(capsys, "doctor", "--verify", "-m", REPO)
    assert "warn downloads: 1 interrupted download left behind" in p.stdout
    assert f"v4flash download {REPO}` resumes" in p.stdout


# --- v4flash download -----------------------------------------------------------------------------


OFFLINE = {"HF_HUB_OFFLINE": "1"}


def test_download_of_a_complete_repo_verifies_it(cache):
    """The real snapshot_download, offline: everything is in the cache already."""
    make_cache(TINY, cache)
    p = cli("download", REPO, env={**OFFLINE, "HF_HUB_CACHE": str(cache)})
    assert p.returncode == 0, p.stderr
    assert "every hash matches" in p.stdout and f"ready: v4flash chat --model {REPO}" in p.stdout


def test_download_reports_a_corrupted_file(cache):
    snap = make_cache(TINY, cache)
    corrupt(snap / SHARD)
    p = cli("download", REPO, env={**OFFLINE, "HF_HUB_CACHE": str(cache)})
    clean_error(p, f"the download of {REPO} is not usable", SHARD)
    assert f"FAIL {SHARD}: sha256" in p.stdout


def test_download_that_cannot_reach_the_hub_is_one_line(cache):
    p = cli("download", "org/not-here", env={**OFFLINE, "HF_HUB_CACHE": str(cache)})
    clean_error(p, "cannot download org/not-here", "cannot be reached", "again to resume")


class FakeSnapshot:
    """snapshot_download stand-in: records the call, lays the files out as the real one would."""

    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def __call__(self, **kw):
        self.calls.append(kw)
        if self.fail:
            raise self.fail
        if kw.get("local_dir"):
            return str(make_local_dir(TINY, kw["local_dir"]))
        from huggingface_hub import constants

        return str(make_cache(TINY, constants.HF_HUB_CACHE, repo=kw["repo_id"]))


def test_download_into_a_dir(cache, capsys, monkeypatch, tmp_path):
    import huggingface_hub

    fake = FakeSnapshot()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    d = tmp_path / "ck"
    p = main_(capsys, "download", "org/x", "--dir", d)
    assert p.returncode == 0, p.stderr
    assert fake.calls == [{"repo_id": "org/x", "local_dir": str(d)}]  # may go online, resumes
    assert "every hash matches" in p.stdout and f"ready: v4flash chat --model {d}" in p.stdout
    assert f"downloading org/x into {d}" in p.stderr
    p = main_(capsys, "download", "org/x", "--dir", d, "--no-verify")
    assert p.returncode == 0 and "verify" not in p.stdout


def test_download_defaults_to_deepseek_into_the_cache(cache, capsys, monkeypatch):
    import huggingface_hub

    fake = FakeSnapshot()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(fetch, "free_bytes", lambda path: 1000 * GB)
    p = main_(capsys, "download")
    assert p.returncode == 0, p.stderr
    assert fake.calls == [{"repo_id": releases.REPO_ID}]
    assert f"ready: v4flash chat --model {releases.REPO_ID}" in p.stdout


def test_download_refuses_when_the_disk_is_too_small(cache, capsys, monkeypatch, tmp_path):
    import huggingface_hub

    fake = FakeSnapshot()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(fetch, "free_bytes", lambda path: 5 * GB)
    # issue 49, friction 2: it said the download would fail, then started it
    p = main_(capsys, "download", "--no-verify")
    clean_error(p, "about 166.9 GB more is needed but only 5.0 GB is free", "--force")
    assert p.returncode == 1 and fake.calls == [] and p.stderr.count("\n") == 1, p.stderr
    assert f"v4flash download {releases.REPO_ID} --dir DIR" in p.stderr  # where else to put it
    # with --dir: another folder, not --dir again
    p = main_(capsys, "download", "--dir", tmp_path / "d", "--no-verify")
    clean_error(p, "choose a folder on another disk with room for --dir")
    assert "--dir DIR" not in p.stderr and fake.calls == []
    # --force starts anyway, saying so
    p = main_(capsys, "download", "--no-verify", "--force")
    assert p.returncode == 0, p.stderr
    assert f"downloading {releases.REPO_ID} into {cache} (about 167 GB)" in p.stderr
    assert "warning: about 166.9 GB more is needed but only 5.0 GB is free" in p.stderr
    assert "--force given: starting anyway" in p.stderr
    # resuming: the index that is already there gives the size, what is there counts
    monkeypatch.setattr(fetch, "free_bytes", lambda path: 1)
    p = main_(capsys, "download", "--no-verify")
    have = sum(f.stat().st_size for f in TINY.iterdir()) + len(COMMIT)  # blobs + refs/main
    assert f"(5.3 MB, {gb(have)} of it already there)" in p.stderr
    assert "warning" not in p.stderr


def test_download_of_an_unknown_repo_claims_no_size(cache, capsys, monkeypatch):
    import huggingface_hub

    fake = FakeSnapshot()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(fetch, "free_bytes", lambda path: 1)  # no size: nothing to refuse
    p = main_(capsys, "download", "foo/bar", "--no-verify")
    assert p.returncode == 0, p.stderr
    assert "downloading foo/bar into" in p.stderr and "size not known" in p.stderr
    assert " GB" not in p.stderr.splitlines()[0] and "warning" not in p.stderr


def test_download_errors_are_one_line(cache, capsys, monkeypatch):
    import huggingface_hub

    class RepositoryNotFoundError(Exception):
        pass

    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", FakeSnapshot(RepositoryNotFoundError("404"))
    )
    clean_error(main_(capsys, "download", "org/x"), "org/x: not found on the Hugging Face hub")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", FakeSnapshot(OSError(28, "full")))
    clean_error(main_(capsys, "download", "org/x"), "the disk is full", "again to resume")
