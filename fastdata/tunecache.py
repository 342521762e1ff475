"""The tune cache: the config `fastdata-profile --tune` chose, kept per source, transform, batch
size and machine (under ~/.cache/fastdata/tuned, or $FASTDATA_CACHE/tuned), where
`num_workers="auto"` and `placement="auto"` find it.

An entry records what the tune measured, when, on which machine and with which package
versions, and when it expires ($FASTDATA_TUNE_TTL_DAYS days after it was made, 30 by default).
An expired entry, or one made on another machine or with other versions, is ignored.

A leaf: the factory reads it without importing the profiler.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from ._cores import usable_cores
from ._pillow import pillow_info

TUNE_TTL = datetime.timedelta(days=30)  # how long an entry holds unless $FASTDATA_TUNE_TTL_DAYS says otherwise
logger = logging.getLogger("fastdata")


def machine_key() -> str:
    """The machine a tuned config is for: CPU model, usable cores, GPU name."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {usable_cores()} cores, {gpu}"


@functools.cache
def versions() -> dict[str, Any]:
    """The versions a tuned config depends on: fastdata, torch, Pillow (and whether it is
    Pillow-SIMD), Python."""
    try:
        ours = importlib.metadata.version("fastdata")
    except importlib.metadata.PackageNotFoundError:
        ours = None
    pillow = pillow_info()
    return {"fastdata": ours, "torch": torch.__version__,
            "pillow": {"version": pillow["version"], "simd": pillow["simd"]}, "python": platform.python_version()}


def cache_root() -> Path:
    """fastdata's cache on this machine: $FASTDATA_CACHE, default ~/.cache/fastdata (the tuned
    configs, the checkpoint index)."""
    return Path(os.environ.get("FASTDATA_CACHE") or Path.home() / ".cache" / "fastdata")


def _root() -> Path:
    return cache_root() / "tuned"


def _ttl() -> datetime.timedelta:
    days = os.environ.get("FASTDATA_TUNE_TTL_DAYS")
    if days is None:
        return TUNE_TTL
    try:
        return datetime.timedelta(days=float(days))
    except ValueError:
        raise ValueError(f"FASTDATA_TUNE_TTL_DAYS should be a number of days, but got {days!r}") from None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _where(source: Any) -> str:
    return os.path.abspath(source) if isinstance(source, (str, os.PathLike)) and os.path.exists(source) else str(source)


def cache_path(source: Any, transform: Any, batch_size: int) -> Path:
    """Where the tuned config for (source, transform, batch size, machine) is kept."""
    key = json.dumps([_where(source), repr(transform), batch_size, machine_key()])
    return _root() / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def store_tune(source: Any, transform: Any, batch_size: int, result: dict[str, Any]) -> Path:
    """Keeps what a tune found (`TuneResult.to_json()`: its "chosen", or "loader", is what
    num_workers="auto" applies) for this source, transform, batch size and machine, with the
    date, the expiry, the machine and the versions; returns its path. Several jobs may tune
    and read the same entry at once, so it is written whole or not at all: into a temporary
    file in the same folder, flushed to disk, then renamed over the old one (a rename within a
    file system is atomic), so a reader opens the old file or the new one, never one half
    written."""
    chosen = result.get("chosen", result.get("loader"))
    if not isinstance(chosen, dict):
        raise ValueError("result should hold the chosen loader keywords under 'chosen'")
    created = _now().replace(microsecond=0)
    entry = {"loader": chosen, "tune": result, "created": created.isoformat(),
             "expires": (created + _ttl()).isoformat(), "machine": machine_key(), "versions": versions(),
             "source": _where(source), "transform": repr(transform), "batch_size": batch_size}
    path = cache_path(source, transform, batch_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from a cache shared between users
            f.write(json.dumps(entry, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _read(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the entry, None) when it holds and (the entry or None, why not) when it does not."""
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable: {e}"
    if not isinstance(entry, dict) or not isinstance(entry.get("loader"), dict):
        return None, "unreadable: no loader keywords in it"
    try:
        expires = datetime.datetime.fromisoformat(entry["expires"])
    except (KeyError, TypeError, ValueError):
        expires = None
    if expires is None or expires.tzinfo is None:
        return entry, "it has no valid expiry date (made by an older fastdata)"
    if _now() >= expires:
        return entry, f"it expired on {entry['expires']}"
    if entry.get("machine") != machine_key():
        return entry, f"it was tuned on another machine ({entry.get('machine')}; this one is {machine_key()})"
    now = versions()
    then = entry.get("versions") or {}
    changed = [f"{name} {then.get(name)} (now {value})" for name, value in now.items() if then.get(name) != value]
    if changed:
        return entry, "it was tuned with " + ", ".join(changed)
    return entry, None


def cached_tune(source: Any, transform: Any, batch_size: int) -> dict[str, Any] | None:
    """The entry `store_tune` wrote for this source, transform, batch size and machine (its
    "loader" keywords, "created", "expires", ...; plus "path"), or None when there is none or
    it is unreadable, expired, or made on another machine or with other versions (said at
    DEBUG on the "fastdata" logger). `store_tune` replaces the file whole, so a read never
    sees a torn one."""
    path = cache_path(source, transform, batch_size)
    if not path.exists():
        return None
    entry, why = _read(path)
    if why is not None:
        logger.debug("ignoring the tuned config in %s: %s", path, why)
        return None
    return {**entry, "path": str(path)}


def list_tunes() -> list[dict[str, Any]]:
    """Every entry of the cache, oldest first: the entry (or only "path" when unreadable) plus
    "path", "valid" (whether `num_workers="auto"` would use it) and "why_not" (None when valid)."""
    entries = []
    for path in sorted(_root().glob("*.json")):
        entry, why = _read(path)
        entries.append({**(entry or {}), "path": str(path), "valid": why is None, "why_not": why})
    return sorted(entries, key=lambda e: str(e.get("created", "")))


def clear_tunes() -> int:
    """Removes every entry of the cache; returns how many files it removed."""
    removed = 0
    for path in _root().glob("*.json"):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:  # another process removed it first
            pass
    return removed
