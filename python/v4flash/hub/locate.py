"""What ``--model`` names: a checkpoint folder, a Hugging Face cache folder, or a repo id found
in the local cache (``try_to_load_from_cache``: no network, ever). A file, GGUF files, a repo
that is not downloaded or only partly are ``HubError``s that say what v4flash needs instead,
how to get it and how much disk that takes: the error on the first line, what to do on the
next ones, indented."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .releases import (
    REPO_ID,
    HubError,
    checkpoint_bytes,
    cli_command,
    default_cache_dir,
    download_command,
    import_hub,
    release_repo,
    space_text,
)

_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


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
            f"exists\n  download it with: {download_command(repo_id)} (or: "
            f"{cli_command(repo_id)})\n  {space_text(need, cache, repo_id, about=True)}\n"
            "  or pass --model DIR, the folder holding config.json and the shards",
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
            f"{repo_id} is only partly downloaded ({snap} has no model.safetensors.index.json)"
            f"\n  finish it with: {cmd} (it resumes)\n  "
            + space_text(need, snap, repo_id, about=True),
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
        f"(e.g. {missing[0]})\n  finish it with: {cmd} (it resumes)\n  "
        + space_text(left, snap, repo_id, about=False).replace("It needs", "The rest needs"),
        2,
    )
