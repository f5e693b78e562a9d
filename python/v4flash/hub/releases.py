"""The releases of DeepSeek V4 Flash on the Hugging Face hub and where they go: repo ids, the
cache's layout, a checkpoint's size and the free disk it needs, the commands that download it,
``huggingface_hub`` (optional) imported with a hint, and :class:`HubError`."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Optional, Tuple

from ..units import GB, gb

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
    from .. import _core

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


def space_text(need: Optional[int], where: Path, repo_id: str, *, about: bool) -> str:
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
