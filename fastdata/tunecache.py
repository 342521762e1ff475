"""The tune cache: the config `fastdata-profile --tune` chose, kept per source, transform, batch
size and machine (under ~/.cache/fastdata/tuned, or $FASTDATA_CACHE/tuned), where
`num_workers="auto"` and `placement="auto"` find it.

A leaf: the factory reads it without importing the profiler.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import torch

from ._cores import usable_cores


def machine_key() -> str:
    """The machine a tuned config is for: CPU model, usable cores, GPU name."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {usable_cores()} cores, {gpu}"


def cache_path(source: Any, transform: Any, batch_size: int) -> Path:
    """Where the tuned config for (source, transform, batch size, machine) is kept."""
    where = os.path.abspath(source) if isinstance(source, (str, os.PathLike)) and os.path.exists(source) else str(source)
    key = json.dumps([where, repr(transform), batch_size, machine_key()])
    root = Path(os.environ.get("FASTDATA_CACHE", Path.home() / ".cache" / "fastdata")) / "tuned"
    return root / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def store_tune(source: Any, transform: Any, batch_size: int, config: dict[str, Any]) -> Path:
    """Keeps `config` (what `--tune` chose, under "loader") as the tuned config for this source,
    transform, batch size and machine; returns its path. Several jobs may tune and read the
    same entry at once, so it is written whole or not at all: into a temporary file in the same
    folder, flushed to disk, then renamed over the old one (a rename within a file system is
    atomic), so a reader opens the old file or the new one, never one half written."""
    path = cache_path(source, transform, batch_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from a cache shared between users
            f.write(json.dumps(config, indent=2) + "\n")
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


def cached_tune(source: Any, transform: Any, batch_size: int) -> dict[str, Any] | None:
    """The loader keywords a `--tune` chose for this source, transform, batch size and machine,
    or None. (`store_tune` replaces the file whole, so a read never sees a torn one.)"""
    path = cache_path(source, transform, batch_size)
    try:
        return json.loads(path.read_text())["loader"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
