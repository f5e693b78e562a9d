"""Verification with no network: every file of a downloaded checkpoint hashed against the
hash the hub published for it, which both places ``huggingface_hub`` downloads to keep (see
the package's docstring). Files are read once, front to back, the reads overlapping the
hashing; the pages read are dropped from the page cache behind the reader."""

from __future__ import annotations

import hashlib
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

from ..units import gb
from .releases import REPO_ID, download_command, release_repo, repo_of_snapshot

CHUNK = 16 << 20  # bytes per read when hashing
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class Published:
    """One file and the hash the hub published for it."""

    rel: str  # path in the repo
    path: Path  # the file as the checkpoint folder shows it (maybe a link)
    algo: str  # "sha256" (LFS files) or "git-sha1" (small files: the git blob id)
    digest: str
    data: Path  # where the bytes are (the cache blob, or the file itself)
    size: int


@dataclass
class Hashes:
    layout: str  # "hf-cache", "local-dir" or "plain"
    files: List[Published] = field(default_factory=list)
    unknown: List[str] = field(default_factory=list)  # files with no published hash
    broken: List[Tuple[str, str]] = field(default_factory=list)  # (file, what is wrong)
    repo_id: Optional[str] = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _algo(etag: str) -> Optional[str]:
    if _HEX64.match(etag):
        return "sha256"
    if _HEX40.match(etag):
        return "git-sha1"
    return None


def _walk(folder: Path, skip: Tuple[str, ...] = ()) -> Iterator[Tuple[str, Path]]:
    """(posix path in the repo, path) of every file under ``folder``, sorted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        rel_dir = Path(dirpath).relative_to(folder)
        dirnames[:] = sorted(d for d in dirnames if not (rel_dir == Path(".") and d in skip))
        for name in filenames:
            rel = (rel_dir / name).as_posix()
            out.append((rel, Path(dirpath) / name))
    yield from sorted(out)


def published_hashes(folder: os.PathLike) -> Hashes:
    """Every file of a checkpoint folder with the hash the hub published for it, read from the
    layout huggingface_hub left (a cache snapshot or a ``local_dir`` download); a folder that is
    neither has none."""
    folder = Path(folder)
    blobs = folder.parent.parent / "blobs"
    if folder.parent.name == "snapshots" and blobs.is_dir():
        h = Hashes("hf-cache", repo_id=repo_of_snapshot(folder))
        blobs_real = blobs.resolve()
        for rel, p in _walk(folder):
            if not p.is_symlink():
                h.unknown.append(rel)  # a copied file (no symlinks on this file system)
                continue
            target = Path(os.path.abspath(p.parent / os.readlink(p)))
            if not target.exists():
                h.broken.append((rel, f"its blob {target} is missing (the link is broken)"))
                continue
            algo = _algo(target.name)
            if algo is None or target.resolve().parent != blobs_real:
                h.unknown.append(rel)
                continue
            h.files.append(Published(rel, p, algo, target.name, target, target.stat().st_size))
        return h
    meta_root = folder / ".cache" / "huggingface" / "download"
    if meta_root.is_dir():
        h = Hashes("local-dir")
        for rel, p in _walk(folder, skip=(".cache",)):
            meta = meta_root / (rel + ".metadata")
            etag = None
            try:
                lines = meta.read_text().splitlines()
                etag = lines[1].strip() if len(lines) > 1 else None
            except OSError:
                pass
            algo = _algo(etag or "")
            if algo is None:
                h.unknown.append(rel)
                continue
            h.files.append(Published(rel, p, algo, etag or "", p, p.stat().st_size))
        return h
    return Hashes("plain", unknown=[rel for rel, _ in _walk(folder)])


def _read_chunks(path: Path, chunk: int = CHUNK) -> Iterator[bytes]:
    """The file's bytes, front to back, in ``chunk``-sized reads; read pages are dropped from
    the page cache behind the reader (hashing 160 GB should not evict everything else)."""
    with open(path, "rb", buffering=0) as f:
        fd = f.fileno()
        advise = getattr(os, "posix_fadvise", None)
        if advise is not None:
            try:
                advise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            except OSError:
                advise = None
        off = 0
        while True:
            b = f.read(chunk)
            if not b:
                return
            yield b
            if advise is not None:
                try:
                    advise(fd, off, len(b), os.POSIX_FADV_DONTNEED)
                except OSError:
                    pass
            off += len(b)


def _hasher(p: Published) -> Any:
    if p.algo == "sha256":
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(f"blob {p.size}\0".encode())
    return h


@dataclass
class _ReadFailed:
    error: OSError


@dataclass
class Verified:
    hashes: Hashes
    bad: List[Tuple[Published, str]] = field(default_factory=list)  # (file, digest found)
    unreadable: List[Tuple[Published, str]] = field(default_factory=list)  # (file, error)
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.bad and not self.unreadable and not self.hashes.broken


def verify(
    folder: os.PathLike,
    progress: Optional[Callable[[int, str], None]] = None,
    hashes: Optional[Hashes] = None,
) -> Verified:
    """Hashes every file that has a published hash and compares. Files are read once, one
    after the other, front to back; a reader thread keeps the next chunks coming while this
    one hashes (hashlib releases the GIL), so disk and hash run at the same time.
    ``progress(nbytes, file)`` is called after every chunk."""
    h = hashes if hashes is not None else published_hashes(folder)
    res = Verified(h)
    t0 = time.perf_counter()
    q: queue.Queue[Any] = queue.Queue(maxsize=4)
    stop = threading.Event()
    END = object()

    def reader() -> None:
        try:
            for f in h.files:
                try:
                    for b in _read_chunks(f.data):
                        if stop.is_set():
                            return
                        q.put(b)
                except OSError as e:  # this file cannot be read: say so, go on with the next
                    q.put(_ReadFailed(e))
                    continue
                q.put(END)
        except BaseException as e:  # noqa: BLE001 - handed to the hashing thread
            q.put(e)

    t = threading.Thread(target=reader, name="v4flash-verify", daemon=True)
    t.start()
    try:
        for f in h.files:
            d = _hasher(f)
            n = 0
            while True:
                b = q.get()
                if isinstance(b, BaseException):
                    raise b
                if b is END or isinstance(b, _ReadFailed):
                    break
                d.update(b)
                n += len(b)
                if progress is not None:
                    progress(len(b), f.rel)
            res.bytes_read += n
            if isinstance(b, _ReadFailed):
                res.unreadable.append((f, f"{b.error.strerror or b.error}"))
                continue
            found = d.hexdigest()
            if found != f.digest:
                res.bad.append((f, found))
    finally:
        stop.set()
        while t.is_alive():  # unblock a reader waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)
    res.seconds = time.perf_counter() - t0
    return res


def repair_hint(v: Verified, folder: Path) -> str:
    """What to do about the damaged files: delete them, fetch them again."""
    h = v.hashes
    repo = h.repo_id or release_repo(folder)
    paths: List[str] = []
    for f, _ in v.bad + v.unreadable:
        paths.append(str(f.path))
        if f.data != f.path:
            paths.append(str(f.data))
    for rel, _ in h.broken:
        paths.append(str(folder / rel))
    rm = " ".join(f"'{p}'" for p in paths[:6]) + (" …" if len(paths) > 6 else "")
    cmd = download_command(repo, str(folder) if h.layout == "local-dir" else None)
    return f"delete {'it' if len(paths) == 1 else 'them'} (rm {rm}) and run `{cmd}` again"


def verify_checks(v: Verified, folder: Path) -> List[Tuple[str, str, str]]:
    """The verification as (status, what, detail) rows, as ``doctor`` prints them."""
    h = v.hashes
    rows: List[Tuple[str, str, str]] = []
    if h.layout == "plain":
        rows.append(
            (
                "warn",
                "verify",
                f"{folder} is not a Hugging Face download (no cache blobs, no "
                ".cache/huggingface metadata), so the hashes the hub published are not known "
                "here; only the sizes and headers above were checked. "
                f"`{download_command(REPO_ID)}` keeps them",
            )
        )
        return rows
    hint = repair_hint(v, folder) if not v.ok else ""
    for f, found in v.bad:
        what = "sha256" if f.algo == "sha256" else "git blob id"
        rows.append(
            (
                "fail",
                f.rel,
                f"{what} {found[:12]}… but the hub published {f.digest[:12]}… ({gb(f.size)} "
                f"read): the file is damaged or incomplete; {hint}",
            )
        )
    for f, err in v.unreadable:
        rows.append(("fail", f.rel, f"cannot be read ({err}): {hint}"))
    for rel, why in h.broken:
        rows.append(("fail", rel, f"{why}; {hint}"))
    if h.unknown:
        rows.append(
            (
                "warn",
                "verify",
                f"{len(h.unknown)} files without a published hash, not checked (e.g. "
                f"{h.unknown[0]})",
            )
        )
    if v.ok:
        speed = v.bytes_read / v.seconds / 1e9 if v.seconds > 0 else float("nan")
        rows.append(
            (
                "ok",
                "verify",
                f"{len(h.files)} files, {gb(v.bytes_read)}: every hash matches what the hub "
                f"published ({speed:.2f} GB/s)",
            )
        )
    return rows


def incomplete_downloads(folder: Path) -> List[Path]:
    """``*.incomplete`` files an interrupted download left (cache blobs or ``local_dir``)."""
    places = []
    if folder.parent.name == "snapshots":
        places.append(folder.parent.parent / "blobs")
    places.append(folder / ".cache" / "huggingface" / "download")
    out: List[Path] = []
    for d in places:
        if d.is_dir():
            out += sorted(d.rglob("*.incomplete"))
    return out
