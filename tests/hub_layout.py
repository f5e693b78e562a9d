"""Hugging Face download layouts built offline from a checkpoint folder, exactly as
huggingface_hub documents them (https://huggingface.co/docs/huggingface_hub/guides/manage-cache
and the module comment of huggingface_hub/_local_folder.py):

    CACHE/models--ORG--NAME/
        blobs/ETAG                 the bytes; ETAG = sha256 (LFS files) or the git blob id (others)
        refs/main                  the commit ``main`` points at
        snapshots/COMMIT/FILE      relative symlink to ../../blobs/ETAG

    DIR/FILE + DIR/.cache/huggingface/download/FILE.metadata   (commit, etag, timestamp lines)

tests/test_hub.py checks that huggingface_hub itself (scan_cache_dir, try_to_load_from_cache,
snapshot_download(local_files_only=True)) reads these layouts as its own.
"""

import hashlib
import os
import time
from pathlib import Path

REPO = "deepseek-ai/DeepSeek-V4-Flash"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS = (".safetensors",)  # stored in LFS on the hub (etag = sha256); the rest are git blobs


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def etag(name: str, data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if name.endswith(LFS) else git_blob_id(data)


def _files(src: Path, extra):
    out = {p.name: p.read_bytes() for p in sorted(Path(src).iterdir()) if p.is_file()}
    out.update(extra or {})
    return out


def make_cache(src, cache, repo=REPO, commit=COMMIT, skip=(), extra=None) -> Path:
    """The cache entry of ``repo`` holding ``src``'s files (but ``skip``; plus ``extra``
    {name: bytes}); returns the snapshot folder."""
    root = Path(cache) / ("models--" + repo.replace("/", "--"))
    blobs, snap = root / "blobs", root / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    for name, data in _files(src, extra).items():
        if name in skip:
            continue
        blob = blobs / etag(name, data)
        blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(os.path.relpath(blob, link.parent), link)
    return snap


def blob_of(link: Path) -> Path:
    return Path(os.path.realpath(link))


def make_local_dir(src, dest, commit=COMMIT, skip=(), extra=None) -> Path:
    """A ``snapshot_download(local_dir=dest)`` result holding ``src``'s files (but ``skip``)."""
    dest = Path(dest)
    meta = dest / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True, exist_ok=True)
    for name, data in _files(src, extra).items():
        if name in skip:
            continue
        (dest / name).write_bytes(data)
        (meta / f"{name}.metadata").write_text(f"{commit}\n{etag(name, data)}\n{time.time()}\n")
    return dest


def corrupt(path: Path) -> None:
    """Flips one byte in the middle of the file (same size: only a hash can tell)."""
    p = Path(os.path.realpath(path))
    with open(p, "r+b") as f:
        f.seek(p.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
