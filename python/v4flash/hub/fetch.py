"""``v4flash download``: ``huggingface_hub``'s ``snapshot_download`` (resumable), with the
size to expect, a refusal when the disk has no room for what is left (unless forced), and
every hub error as one line that says how to resume."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from ..units import GB, gb
from .releases import (
    HubError,
    checkpoint_bytes,
    default_cache_dir,
    download_command,
    free_bytes,
    import_hub,
    repo_folder,
)


def download(repo_id: str, local_dir: Optional[str] = None, *, force: bool = False) -> Path:
    """``snapshot_download`` (resumable: files already there are skipped, ``.incomplete`` ones
    continue), into the cache or ``local_dir``. Returns the folder. A disk too small for what
    is left of a checkpoint of known size is a HubError before anything is fetched, unless
    ``force``."""
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
    if free is not None and need is not None and free < need:
        short = (
            f"about {gb(need)} more is needed but only {gb(free)} is free on the disk of "
            f"{target}: the download would fail before it ends"
        )
        if not force:
            where = (
                "choose a folder on another disk with room for --dir"
                if local_dir
                else f"download it to a disk with room: {download_command(repo_id, 'DIR')}"
            )
            raise HubError(f"{repo_id}: {short}; {where} (--force: start anyway)", 1)
        print(f"v4flash: warning: {short} (--force given: starting anyway)", file=sys.stderr)
    print(f"v4flash: downloading {repo_id} into {target} ({size}{more})", file=sys.stderr)
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
