"""``v4flash list`` (``ls``): the checkpoints on this machine, as ``ollama list`` shows its
models: those in the Hugging Face cache and the folders v4flash has used (``state``), each
with its size, its release (the core's config summary: an MTP drafter is the first release, a
DSpark one 0731) and a cheap check (the shard headers, no weights read: ``doctor``'s
inspection). "verified" only when ``doctor --verify`` or ``download`` hashed every file and the
files are still those that were hashed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import _core, state
from ..doctor import inspect_checkpoint
from ..hub.releases import RELEASES, default_cache_dir
from ..units import gb
from .common import ago, columns, terminal_width

RELEASE_OF_DRAFTER = {"dspark": "0731 (DSpark)", "mtp": "first (MTP)"}


def _release(folder: Path) -> Optional[str]:
    """The release by the core's config summary, "" for a checkpoint without a drafter, None
    when config.json is not a DeepSeek V4 Flash config."""
    try:
        summary = _core.validate_config(str(folder / "config.json"))
    except (OSError, ValueError, _core.V4FlashError):
        return None
    kind = str((summary.get("drafter") or {}).get("kind") or "")
    return RELEASE_OF_DRAFTER.get(kind, kind)


def _size(folder: Path) -> int:
    """Bytes of the checkpoint's files (links followed: a cache snapshot's blobs)."""
    n = 0
    try:
        for p in folder.iterdir():
            try:
                if p.is_file():
                    n += p.stat().st_size
            except OSError:
                pass
    except OSError:
        pass
    return n


def _missing_shards(folder: Path) -> Optional[tuple]:
    """(missing, total) shards by the index, when some are missing (a download that stopped)."""
    try:
        doc = json.loads((folder / "model.safetensors.index.json").read_bytes())
        shards = sorted(set(doc["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    missing = [s for s in shards if not (folder / s).is_file()]
    return (len(missing), len(shards)) if missing else None


def check(folder: Path, entry: Optional[Dict[str, Any]] = None) -> tuple:
    """(word, detail): "verified", "verify failed", "ok" (headers), "incomplete", "damaged",
    "not found"."""
    if not folder.is_dir():
        return "not found", f"{folder} does not exist (an unmounted disk, or deleted)"
    if not (folder / "config.json").is_file():
        return "incomplete", "no config.json yet"
    gone = _missing_shards(folder)
    if gone:
        return "incomplete", f"{gone[0]} of {gone[1]} shards missing"
    ins = inspect_checkpoint(folder, tokenizer=False)
    if not ins.ok:
        _, what, detail = ins.problems[0]
        detail = detail if len(detail) <= 80 else detail[:80] + " …"
        return "damaged", f"{what}: {detail}"
    verified = state.verification(folder, entry or {})
    if verified is True:
        return "verified", "every file's hash matched the hub's (doctor --verify)"
    if verified is False:
        return "verify failed", "doctor --verify found files that differ from the hub's"
    return "ok", "headers checked; doctor --verify hashes every file"


def _cache_snapshots(cache: Path) -> List[tuple]:
    """(repo id, snapshot folder) of every model repo in the Hugging Face cache: the snapshot
    ``refs/main`` names, else every one."""
    out: List[tuple] = []
    try:
        repos = sorted(d for d in cache.glob("models--*") if d.is_dir())
    except OSError:
        return out
    for d in repos:
        repo = d.name[len("models--") :].replace("--", "/")
        ref = d / "refs" / "main"
        try:
            if ref.is_file():
                out.append((repo, d / "snapshots" / ref.read_text().strip()))
            else:
                out += [(repo, s) for s in sorted((d / "snapshots").iterdir()) if s.is_dir()]
        except OSError:
            continue
    return out


def find_checkpoints(cache: Optional[Path] = None) -> List[Dict[str, Any]]:
    """Every checkpoint found: the cache's DeepSeek V4 Flash repos (others are skipped), then
    the remembered folders, each once."""
    cache = default_cache_dir() if cache is None else cache
    remembered = state.checkpoints()
    by_real = {os.path.realpath(k): (k, v) for k, v in remembered.items()}
    seen = set()
    found: List[Dict[str, Any]] = []
    now = time.time()

    def add(name: str, folder: Path, repo: Optional[str], entry: Dict[str, Any]) -> None:
        release = _release(folder)
        if release is None and repo not in RELEASES and folder.is_dir():
            return  # not a DeepSeek V4 Flash checkpoint
        word, detail = check(folder, entry)
        used = entry.get("last_used")
        found.append(
            {
                "name": name,
                "path": str(folder),
                "repo": repo,
                "release": release or ("-" if release == "" else "unknown"),
                "bytes": _size(folder),
                "check": word,
                "detail": detail,
                "last_used": used,
                "used": ago(now - used) if isinstance(used, (int, float)) else "-",
            }
        )

    for repo, snap in _cache_snapshots(cache):
        real = os.path.realpath(snap)
        seen.add(real)
        entry = by_real.get(real, (None, {}))[1]
        add(repo, snap, repo, entry)
    for key, entry in sorted(remembered.items()):
        real = os.path.realpath(key)
        if real in seen:
            continue
        seen.add(real)
        add(key, Path(key), entry.get("repo"), entry)
    return found


def cmd_list(args: argparse.Namespace) -> int:
    found = find_checkpoints()
    if args.json:
        print(json.dumps(found, indent=1))
        return 0
    if not found:
        print(
            f"no checkpoint found (Hugging Face cache: {default_cache_dir()}; none used yet); "
            "v4flash download fetches one"
        )
        return 0
    rows = [
        (
            f["name"],
            f["release"],
            gb(f["bytes"]),
            f["check"] + (f" ({f['detail']})" if f["check"] in ("incomplete", "damaged") else ""),
            f["used"],
        )
        for f in found
    ]
    print(columns(("NAME", "RELEASE", "SIZE", "CHECK", "USED"), rows, terminal_width(sys.stdout)))
    return 0
