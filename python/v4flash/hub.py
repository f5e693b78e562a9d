"""Finding, downloading and verifying the checkpoint as the Hugging Face hub publishes it.

``--model`` takes a folder or a repo id (``deepseek-ai/DeepSeek-V4-Flash``); a repo id is looked
up in the local Hugging Face cache only (``try_to_load_from_cache``: no network, ever). When it
is not there the error says how to get it and how much disk that takes.

Verification needs no network either: the hub publishes the sha256 of every LFS file, and both
places ``huggingface_hub`` downloads to keep it:

- the cache (``models--ORG--NAME/snapshots/COMMIT/FILE`` is a link to ``blobs/ETAG``): the blob's
  file name is its etag, the sha256 of the content for LFS files (64 hex digits) and the git
  blob id, ``sha1("blob SIZE\\0" + content)``, for small files (40 hex digits);
- a ``--dir``/``local_dir`` download: ``.cache/huggingface/download/FILE.metadata`` holds the
  commit on its first line and the same etag on its second.

``huggingface_hub`` is optional (``pip install 'v4flash[hub]'``); only the repo-id lookup and
``download`` need it, verification reads the documented layouts itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

from .units import GB, gb

# The releases of DeepSeek V4 Flash, newest first: repo id -> its index's metadata.total_size
# (bytes). Both hold the same 156.0 GB model (bench.real_model_bytes); 0731 adds the DSpark
# drafter (three stages, 10.9 GB), the first release an MTP block (3.6 GB). A checkpoint's own
# index wins wherever it is present.
RELEASES = {
    "deepseek-ai/DeepSeek-V4-Flash-0731": 166_878_536_440,
    "deepseek-ai/DeepSeek-V4-Flash": 159_609_485_896,
}
# what ``download`` fetches without a repo: the newest release
REPO_ID, FIRST_RELEASE = list(RELEASES)[0], list(RELEASES)[-1]
INSTALL_HINT = "pip install 'v4flash[hub]' (or: pip install huggingface_hub)"
CHUNK = 16 << 20  # bytes per read when hashing

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


class HubError(Exception):
    """A one-line, actionable error about finding or fetching a checkpoint."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


# --------------------------------------------------------------------------------------------
# huggingface_hub (optional)
# --------------------------------------------------------------------------------------------


def import_hub(purpose: str) -> Any:
    """``huggingface_hub``, or a HubError saying how to install it."""
    try:
        import huggingface_hub
    except ImportError:
        raise HubError(
            f"{purpose} needs huggingface_hub, which is not installed: {INSTALL_HINT}", 2
        ) from None
    return huggingface_hub


def _hub_version(hub: Any) -> Tuple[int, ...]:
    try:
        return tuple(int(x) for x in re.findall(r"\d+", hub.__version__)[:2])
    except (AttributeError, ValueError):
        return (0,)


def cli_command(repo_id: str, local_dir: Optional[str] = None) -> str:
    """huggingface_hub's own command for the same download (``hf`` since 0.34, before that
    ``huggingface-cli``)."""
    try:
        import huggingface_hub as hub

        old = _hub_version(hub) < (0, 34)
    except ImportError:
        old = False
    cmd = f"{'huggingface-cli' if old else 'hf'} download {repo_id}"
    return cmd + (f" --local-dir {local_dir}" if local_dir else "")


def download_command(repo_id: str, local_dir: Optional[str] = None) -> str:
    return f"v4flash download {repo_id}" + (f" --dir {local_dir}" if local_dir else "")


def default_cache_dir() -> Path:
    """The Hugging Face cache folder (``HF_HUB_CACHE`` / ``HF_HOME``), as huggingface_hub sees it
    (its own default when it is not installed)."""
    try:
        from huggingface_hub import constants

        return Path(constants.HF_HUB_CACHE)
    except ImportError:
        pass
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def repo_folder(repo_id: str, cache_dir: Optional[os.PathLike] = None) -> Path:
    """Where the cache keeps a model repo: ``CACHE/models--ORG--NAME``."""
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return base / ("models--" + repo_id.replace("/", "--"))


def repo_of_snapshot(folder: Path) -> Optional[str]:
    """``org/name`` for ``.../models--org--name/snapshots/COMMIT``, else None."""
    if folder.parent.name != "snapshots":
        return None
    name = folder.parent.parent.name
    if not name.startswith("models--"):
        return None
    return name[len("models--") :].replace("--", "/")


# --------------------------------------------------------------------------------------------
# Sizes and free space
# --------------------------------------------------------------------------------------------


def free_bytes(path: os.PathLike) -> Optional[int]:
    """Free space on the file system that holds ``path`` (or would: its nearest existing
    ancestor)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def index_total_size(folder: Optional[os.PathLike]) -> Optional[int]:
    """``metadata.total_size`` of the folder's ``model.safetensors.index.json``, if any."""
    if folder is None:
        return None
    try:
        doc = json.loads((Path(folder) / "model.safetensors.index.json").read_bytes())
        n = (doc.get("metadata") or {}).get("total_size")
    except (OSError, ValueError, AttributeError):
        return None
    return n if isinstance(n, int) and n > 0 else None


def release_repo(folder: os.PathLike) -> str:
    """The release a checkpoint folder holds, by its config: the repo id of 0731 when the core
    finds a DSpark drafter in it, else the first release's (for a ``--dir`` download, whose
    folder does not name its repo)."""
    from . import _core

    try:
        drafter = _core.validate_config(str(Path(folder) / "config.json")).get("drafter")
    except (OSError, ValueError, _core.V4FlashError):
        return REPO_ID
    return REPO_ID if (drafter or {}).get("kind") == "dspark" else FIRST_RELEASE


def checkpoint_bytes(
    folder: Optional[os.PathLike] = None, repo_id: str = REPO_ID
) -> Tuple[Optional[int], str]:
    """(bytes the whole checkpoint takes, how that is known): the folder's index, else the
    release's published size, else (None, "unknown") for a repo that is not a known release."""
    n = index_total_size(folder)
    if n is not None:
        return n, "the index's total_size"
    if repo_id in RELEASES:
        return RELEASES[repo_id], "the published checkpoint"
    return None, "unknown"


def _space_text(need: Optional[int], where: Path, repo_id: str, *, about: bool) -> str:
    """``It needs about 160 GB of disk; 65.2 GB is free there.`` (and where to put it when that
    is not enough); for a repo of unknown size, only what is free."""
    free = free_bytes(where)
    if need is None:
        where_free = f" ({gb(free)} is free on the disk of {where})" if free is not None else ""
        return f"Its size is not known before its index is downloaded{where_free}."
    size = f"about {need / GB:.0f} GB" if about else gb(need)
    text = f"It needs {size} of disk"
    if free is None:
        return text + "."
    text += f"; {gb(free)} is free on the disk of {where}"
    if free < need:
        text += (
            f", not enough: download it to a disk with room with `"
            f"{download_command(repo_id, 'DIR')}`, then --model DIR"
        )
    return text + "."


# --------------------------------------------------------------------------------------------
# --model: folder, file or repo id
# --------------------------------------------------------------------------------------------


@dataclass
class Located:
    path: Path
    repo_id: Optional[str] = None  # set when --model named a repo (or a cache folder)


def looks_like_repo_id(s: str) -> bool:
    """``org/name``: one slash, hub characters only (never ``./x``, ``/x``, ``~/x``, ``a/b/c``)."""
    return bool(_REPO_RE.match(s)) and ".." not in s


def locate(model: str, cache_dir: Optional[os.PathLike] = None) -> Located:
    """What ``--model`` names: a checkpoint folder (``~`` expanded), a Hugging Face cache repo
    folder (``models--ORG--NAME``: its ``main`` snapshot), or a repo id found in the local cache.
    A file, a folder of GGUF files and a repo id that is not downloaded are ``HubError``s that say
    what v4flash needs instead. A path that does not exist is returned as it is (the loader's
    ``FileNotFoundError`` names it)."""
    p = Path(os.path.expanduser(model))
    if p.is_file():
        raise HubError(_file_message(p), 2)
    if p.is_dir():
        if not (p / "config.json").exists():
            if (p / "snapshots").is_dir() and p.name.startswith("models--"):
                return _cache_repo_folder(p)
            ggufs = sorted(p.glob("*.gguf"))
            if ggufs:
                raise HubError(
                    f"{p} holds GGUF files ({ggufs[0].name}{', …' if len(ggufs) > 1 else ''}), "
                    f"llama.cpp's format; {_WHAT_IT_NEEDS}",
                    2,
                )
        elif (p / ".cache" / "huggingface" / "download").is_dir():  # a --dir download
            _check_complete(p, release_repo(p), local_dir=p)
        return Located(p)
    if looks_like_repo_id(model):
        return resolve_repo(model, cache_dir)
    return Located(p)


_WHAT_IT_NEEDS = (
    "v4flash reads the checkpoint exactly as DeepSeek publishes it: a folder with config.json, "
    "model.safetensors.index.json, the model-*.safetensors shards and tokenizer.json "
    f"(get it with: {download_command(REPO_ID)})"
)


def _file_message(p: Path) -> str:
    suffix = p.suffix.lower()
    if suffix == ".gguf":
        return (
            f"{p} is a GGUF file (llama.cpp's format, a converted and usually re-quantized "
            f"model); {_WHAT_IT_NEEDS}"
        )
    if suffix == ".safetensors":
        parent = p.parent
        if (parent / "config.json").is_file():
            return (
                f"{p} is one safetensors shard; --model takes the folder that holds the shards, "
                f"config.json and the index: --model {parent}"
            )
        return f"{p} is a single safetensors file, not a checkpoint folder; {_WHAT_IT_NEEDS}"
    return f"{p} is a file; --model takes a checkpoint folder or a repo id. {_WHAT_IT_NEEDS}"


def _cache_repo_folder(repo_dir: Path) -> Located:
    """``models--ORG--NAME`` given directly: the snapshot ``refs/main`` names (else the only
    one)."""
    repo_id = repo_dir.name[len("models--") :].replace("--", "/")
    snaps = repo_dir / "snapshots"
    ref = repo_dir / "refs" / "main"
    snap = None
    if ref.is_file():
        snap = snaps / ref.read_text().strip()
    else:
        found = [d for d in snaps.iterdir() if d.is_dir()]
        if len(found) == 1:
            snap = found[0]
    if snap is None or not (snap / "config.json").exists():
        raise HubError(
            f"{repo_dir} is a Hugging Face cache folder without a downloaded main snapshot; "
            f"get it with: {download_command(repo_id)}",
            2,
        )
    _check_complete(snap, repo_id)
    return Located(snap, repo_id)


def resolve_repo(repo_id: str, cache_dir: Optional[os.PathLike] = None) -> Located:
    """The local snapshot of ``repo_id`` (revision ``main``), offline. A repo that is not in the
    cache, or only partly, is a HubError with the command that downloads (or resumes) it."""
    hub = import_hub(
        f"no folder {repo_id} exists; looking it up as a Hugging Face repo id in the local cache"
    )
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    found = hub.try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache))
    if not isinstance(found, str):
        need, _ = checkpoint_bytes(None, repo_id)
        if "gguf" in repo_id.lower():
            raise HubError(
                f"{repo_id} is not in the Hugging Face cache, and it looks like a GGUF "
                f"conversion (llama.cpp's format) anyway; {_WHAT_IT_NEEDS}",
                2,
            )
        raise HubError(
            f"{repo_id} is not in the Hugging Face cache ({cache}) and no folder of that name "
            f"exists. Download it with: {download_command(repo_id)} (or: "
            f"{cli_command(repo_id)}). {_space_text(need, cache, repo_id, about=True)} "
            "Or pass --model DIR, the folder holding config.json and the shards.",
            2,
        )
    snap = Path(found).parent
    _check_complete(snap, repo_id)
    return Located(snap, repo_id)


def _check_complete(snap: Path, repo_id: str, local_dir: Optional[Path] = None) -> None:
    """A downloaded snapshot (cache or ``local_dir``) with shards missing, an interrupted
    download: say so, and how much is left to fetch, before anything tries to load it."""
    cmd = download_command(repo_id, str(local_dir) if local_dir else None)
    index = snap / "model.safetensors.index.json"
    if not index.is_file():
        if (snap / "model.safetensors").is_file():
            return
        need, _ = checkpoint_bytes(None, repo_id)
        raise HubError(
            f"{repo_id} is only partly downloaded ({snap} has no model.safetensors.index.json); "
            f"finish it with: {cmd} (it resumes). " + _space_text(need, snap, repo_id, about=True),
            2,
        )
    try:
        shards = sorted(set(json.loads(index.read_bytes())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # a bad index: the checkpoint inspection says what is wrong with it
    missing = [s for s in shards if not (snap / s).is_file()]
    if not missing:
        return
    total, _ = checkpoint_bytes(snap, repo_id)
    have = sum((snap / s).stat().st_size for s in shards if (snap / s).is_file())
    left = None if total is None else max(total - have, 0)
    raise HubError(
        f"{repo_id} is only partly downloaded: {len(missing)} of {len(shards)} shards missing "
        f"(e.g. {missing[0]}); finish it with: {cmd} (it resumes). "
        + _space_text(left, snap, repo_id, about=False).replace("It needs", "The rest needs"),
        2,
    )


# --------------------------------------------------------------------------------------------
# Published hashes and verification
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# download
# --------------------------------------------------------------------------------------------


def download(repo_id: str, local_dir: Optional[str] = None) -> Path:
    """``snapshot_download`` (resumable: files already there are skipped, ``.incomplete`` ones
    continue), into the cache or ``local_dir``. Returns the folder."""
    hub = import_hub("v4flash download")
    target = (Path(local_dir).expanduser() if local_dir else default_cache_dir()).absolute()
    there = Path(local_dir).expanduser() if local_dir else repo_folder(repo_id, target)
    total, how = checkpoint_bytes(_known_snapshot(there), repo_id)
    if total is None:
        size = "size not known before its index"
    else:
        size = gb(total) if how.startswith("the index") else f"about {total / GB:.0f} GB"
    have = _bytes_under(there)
    need = None if total is None else max(total - have, 0)
    free = free_bytes(target)
    more = f", {gb(have)} of it already there" if have else ""
    print(f"v4flash: downloading {repo_id} into {target} ({size}{more})", file=sys.stderr)
    if free is not None and need is not None and free < need:
        print(
            f"v4flash: warning: about {gb(need)} more is needed but only {gb(free)} is free "
            f"on the disk of {target}: the download will fail before it ends (use --dir DIR on "
            "a disk with room)",
            file=sys.stderr,
        )
    kw: dict = {"repo_id": repo_id}
    if local_dir:
        kw["local_dir"] = str(target)
    try:
        path = hub.snapshot_download(**kw)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - every hub error is one line
        raise HubError(_download_error(e, repo_id, local_dir)) from None
    return Path(path)


def _known_snapshot(there: Path) -> Optional[Path]:
    """A folder already holding this repo's index (a resumed download), if any."""
    if (there / "model.safetensors.index.json").is_file():
        return there
    snaps = there / "snapshots"
    if snaps.is_dir():
        for d in sorted(snaps.iterdir()):
            if (d / "model.safetensors.index.json").is_file():
                return d
    return None


def _bytes_under(d: Path) -> int:
    n = 0
    if d.is_dir():
        for dirpath, _, files in os.walk(d):
            for name in files:
                p = Path(dirpath) / name
                try:
                    if not p.is_symlink():
                        n += p.stat().st_size
                except OSError:
                    pass
    return n


def _download_error(e: BaseException, repo_id: str, local_dir: Optional[str]) -> str:
    names = {c.__name__ for c in type(e).__mro__}
    detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    again = f"run `{download_command(repo_id, local_dir)}` again to resume"
    if names & {"RepositoryNotFoundError", "GatedRepoError"}:
        return (
            f"{repo_id}: not found on the Hugging Face hub, or not accessible without a token "
            f"(`hf auth login`): {detail}"
        )
    if names & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "IncompleteSnapshotError"}:
        return (
            f"cannot download {repo_id}: the Hugging Face hub cannot be reached (offline, "
            f"HF_HUB_OFFLINE set, or no connection) and the files are not all here yet; "
            f"{again} when it can ({detail})"
        )
    if isinstance(e, OSError) and getattr(e, "errno", None) == 28:
        return f"cannot download {repo_id}: the disk is full ({detail}); free space, then {again}"
    return f"cannot download {repo_id}: {type(e).__name__}: {detail}; {again}"
