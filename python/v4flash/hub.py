"""Finding the checkpoint as the Hugging Face hub publishes it.

``--model`` takes a folder or a repo id (``deepseek-ai/DeepSeek-V4-Flash``); a repo id is looked
up in the local Hugging Face cache only (``try_to_load_from_cache``: no network, ever). When it
is not there the error says how to get it and how much disk that takes.

``huggingface_hub`` is optional (``pip install 'v4flash[hub]'``); only the repo-id lookup needs
it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Tuple

from .doctor import GB, _gb

REPO_ID = "deepseek-ai/DeepSeek-V4-Flash"
# The published checkpoint's size on disk, "about 160 GB": the 43 layers' tensors are 156.0 GB
# (bench.real_model_bytes) and the MTP layer adds the rest. A checkpoint's own index
# (metadata.total_size) wins wherever it is present.
PUBLISHED_BYTES = 160 * 10**9
INSTALL_HINT = "pip install 'v4flash[hub]' (or: pip install huggingface_hub)"

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


def checkpoint_bytes(folder: Optional[os.PathLike] = None) -> Tuple[int, str]:
    """(bytes the whole checkpoint takes, how that is known)."""
    n = index_total_size(folder)
    if n is not None:
        return n, "the index's total_size"
    return PUBLISHED_BYTES, "the published checkpoint"


def _space_text(need: int, where: Path, repo_id: str, *, about: bool) -> str:
    """``It needs about 160 GB of disk; 65.2 GB is free there.`` (and where to put it when that
    is not enough)."""
    size = f"about {need / GB:.0f} GB" if about else _gb(need)
    text = f"It needs {size} of disk"
    free = free_bytes(where)
    if free is None:
        return text + "."
    text += f"; {_gb(free)} is free on the disk of {where}"
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
            _check_complete(p, REPO_ID, local_dir=p)
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
        need, _ = checkpoint_bytes(None)
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
        need, _ = checkpoint_bytes(None)
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
    total = index_total_size(snap) or PUBLISHED_BYTES
    have = sum((snap / s).stat().st_size for s in shards if (snap / s).is_file())
    raise HubError(
        f"{repo_id} is only partly downloaded: {len(missing)} of {len(shards)} shards missing "
        f"(e.g. {missing[0]}); finish it with: {cmd} (it resumes). "
        + _space_text(max(total - have, 0), snap, repo_id, about=False).replace(
            "It needs", "The rest needs"
        ),
        2,
    )
