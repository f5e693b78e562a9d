"""What the command line remembers between runs, in one small folder: the checkpoints used
(``v4flash list``) and what ``doctor --verify`` found about them, the servers running on this
machine (``v4flash ps``), and the chat's input history.

Where: ``$V4FLASH_HOME`` when set, else ``$XDG_STATE_HOME/v4flash`` (``~/.local/state/v4flash``;
on Windows ``%LOCALAPPDATA%\\v4flash``). The defaults file (``cli.defaults``) is
``$V4FLASH_CONFIG``, else ``$V4FLASH_HOME/config.toml``, else
``$XDG_CONFIG_HOME/v4flash/config.toml`` (``~/.config/v4flash/config.toml``; on Windows
``%APPDATA%\\v4flash\\config.toml``).

Nothing here may make a command fail: a folder that cannot be written (a read-only home) means
nothing is remembered, and a damaged file is read as empty. Files are replaced whole (write, then
rename), so a reader never sees half of one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

STATE_VERSION = 1
CHECKPOINTS = "checkpoints.json"  # {"version", "checkpoints": {abs path: {...}}}
SERVERS = "servers"  # one PID.json per running `v4flash serve`
HISTORY = "chat_history"  # readline's history file
HISTORY_LENGTH = 1000


def home() -> Path:
    """The state folder (not created here)."""
    v = os.environ.get("V4FLASH_HOME")
    if v:
        return Path(v).expanduser()
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~/AppData/Local")
        return Path(base) / "v4flash"
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "v4flash"


def config_file() -> Path:
    """The defaults file (it need not exist)."""
    v = os.environ.get("V4FLASH_CONFIG")
    if v:
        return Path(v).expanduser()
    if os.environ.get("V4FLASH_HOME"):
        return home() / "config.toml"
    if os.name == "nt":
        base = os.environ.get("APPDATA") or os.path.expanduser("~/AppData/Roaming")
    else:
        base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "v4flash" / "config.toml"


def history_file() -> Path:
    return home() / HISTORY


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def read_json(path: Path) -> Any:
    """The file's JSON, or None (missing, unreadable, damaged)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, doc: Any) -> bool:
    """Replaces ``path`` with ``doc`` (write, then rename); False when it cannot."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, ensure_ascii=False)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Holds ``path.lock`` (posix ``flock``) around a read-modify-write, where it can."""
    try:
        import fcntl
    except ImportError:  # Windows: last writer wins (the file is replaced whole either way)
        yield
        return
    f = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(str(path) + ".lock", "a")
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    except OSError:
        if f is not None:
            f.close()
        f = None
    try:
        yield
    finally:
        if f is not None:
            f.close()  # releases the lock


def _update_checkpoints(change: Callable[[Dict[str, Any]], None]) -> bool:
    path = home() / CHECKPOINTS
    with _locked(path):
        doc = read_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("checkpoints"), dict):
            doc = {"version": STATE_VERSION, "checkpoints": {}}
        change(doc["checkpoints"])
        return write_json(path, doc)


# --------------------------------------------------------------------------------------------
# Checkpoints used (v4flash list)
# --------------------------------------------------------------------------------------------


def _key(path: os.PathLike) -> str:
    return os.path.abspath(os.path.expanduser(str(path)))


def checkpoints() -> Dict[str, Dict[str, Any]]:
    """abs path -> {"repo", "last_used", "verified"} of the checkpoints remembered."""
    doc = read_json(home() / CHECKPOINTS)
    found = doc.get("checkpoints") if isinstance(doc, dict) else None
    if not isinstance(found, dict):
        return {}
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, dict)}


def remember_checkpoint(path: os.PathLike, repo: Optional[str] = None) -> bool:
    """Notes that a command used the checkpoint at ``path`` (now)."""

    def change(found: Dict[str, Any]) -> None:
        entry = found.setdefault(_key(path), {})
        entry["last_used"] = time.time()
        if repo:
            entry["repo"] = repo

    return _update_checkpoints(change)


def files_signature(path: os.PathLike) -> Optional[str]:
    """A digest of the names, sizes and modification times of the checkpoint's files (links
    followed): what a recorded verification holds for. None when the folder cannot be read."""
    root = Path(path)
    h = hashlib.sha256()
    try:
        names = sorted(p.name for p in root.iterdir())
        for name in names:
            p = root / name
            if not p.is_file():
                continue
            st = p.stat()
            h.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    except OSError:
        return None
    return h.hexdigest()


def record_verification(
    path: os.PathLike, ok: bool, files: int, nbytes: int, repo: Optional[str] = None
) -> bool:
    """Notes what hashing every file of ``path`` against the hub's hashes found (``doctor
    --verify``, ``download``), with the files' signature: ``list`` says "verified" only while
    the files are those that were hashed."""

    def change(found: Dict[str, Any]) -> None:
        entry = found.setdefault(_key(path), {})
        entry["verified"] = {
            "ok": bool(ok),
            "at": time.time(),
            "files": files,
            "bytes": nbytes,
            "signature": files_signature(path),
        }
        if repo:
            entry["repo"] = repo

    return _update_checkpoints(change)


def verification(path: os.PathLike, entry: Optional[Dict[str, Any]] = None) -> Optional[bool]:
    """True (verified) or False (failed) when a verification was recorded for ``path`` and its
    files have not changed since; None otherwise."""
    if entry is None:
        entry = checkpoints().get(_key(path), {})
    v = entry.get("verified")
    if not isinstance(v, dict) or v.get("signature") is None:
        return None
    if v["signature"] != files_signature(path):
        return None
    return bool(v.get("ok"))


# --------------------------------------------------------------------------------------------
# Servers running on this machine (v4flash ps)
# --------------------------------------------------------------------------------------------


def process_start(pid: int) -> Optional[str]:
    """An id of the process's start (Linux: its start time in clock ticks since boot, field 22
    of /proc/PID/stat), so that a recycled pid is not taken for the server; None elsewhere."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def pid_alive(pid: int) -> Optional[bool]:
    """Whether process ``pid`` exists; None where that cannot be asked without side effects
    (Windows: ``os.kill`` there would end it)."""
    if os.name == "nt":
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        return True
    except OSError:
        return None
    return True


def register_server(info: Dict[str, Any]) -> Optional[Path]:
    """Writes this process's server entry (``info``: url, model, …; pid and start added);
    returns its file (to update or remove), None when it cannot be written."""
    pid = os.getpid()
    doc = {
        "version": STATE_VERSION,
        "pid": pid,
        "started": time.time(),
        "proc_start": process_start(pid),
        **info,
    }
    path = home() / SERVERS / f"{pid}.json"
    return path if write_json(path, doc) else None


def update_server(path: Optional[Path], **changes: Any) -> None:
    if path is None:
        return
    doc = read_json(path)
    if isinstance(doc, dict):
        doc.update(changes)
        write_json(path, doc)


def unregister_server(path: Optional[Path]) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def servers(prune: bool = True) -> List[Dict[str, Any]]:
    """The servers registered here whose process still runs (same pid, same start); the
    entries of those that are gone are removed (``prune``)."""
    d = home() / SERVERS
    out: List[Dict[str, Any]] = []
    try:
        files = sorted(d.glob("*.json"))
    except OSError:
        return out
    for f in files:
        doc = read_json(f)
        live = False
        if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
            alive = pid_alive(doc["pid"])
            live = alive is not False
            if alive and doc.get("proc_start") is not None:
                live = process_start(doc["pid"]) == doc["proc_start"]
        if live:
            doc["file"] = str(f)
            out.append(doc)
        elif prune:
            with contextlib.suppress(OSError):
                f.unlink()
    return out


def process_rss(pid: int) -> Optional[int]:
    """Resident memory of process ``pid`` in bytes: /proc/PID/status on Linux, ``ps`` on
    other Unixes; None when not known."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None
    except (OSError, ValueError, IndexError):
        pass
    if os.name != "posix" or sys.platform.startswith("linux"):
        return None
    import subprocess

    try:
        out = subprocess.run(
            ["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        ).stdout.strip()
        return int(out) * 1024 if out else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
