"""The tune cache: the config `fastdata-profile --tune` chose, kept per source, transform, batch
size and machine (under ~/.cache/fastdata/tuned, or $FASTDATA_CACHE/tuned), where
`num_workers="auto"` and `placement="auto"` find it.

An entry records what the tune measured, when, on which machine and with which package
versions, and when it expires ($FASTDATA_TUNE_TTL_DAYS days after it was made, 30 by default).
An expired entry, one made on another machine or with other versions, or one that chose a
backend not installed here, is ignored; so is one that is not this user's alone to write (the
checkpoint index's rule), over MAX_ENTRY_BYTES, kept for another source, transform or batch size
than its name's, or whose values are out of range, with a warning. Where there is no cache
folder (no $FASTDATA_CACHE and no home directory), there is no tune cache.

A leaf: the factory reads it without importing the profiler.
"""

from __future__ import annotations

import datetime
import errno
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

from ._cores import usable_cores
from ._optional import has
from ._pillow import pillow_info

TUNE_TTL = datetime.timedelta(days=30)  # how long an entry holds unless $FASTDATA_TUNE_TTL_DAYS says otherwise
MAX_PREFETCH = 64  # batches a worker may hold ahead: an entry asking for more is not applied
PLACEMENTS = ("auto", "cpu", "gpu")  # the image loader's own check's (fastdata.image.loader)
BACKENDS = {"pil": None, "wds": None, "dali": "dali", "ray": "ray"}  # the image backends, and the optional part each needs
MAX_ENTRY_BYTES = 1 << 20  # a tune's entry is a few KB; a bigger file is not read
_URLS = ("pipe:", "http://", "https://", "file:")  # sources that are not a path (sources.streams.local_path)
logger = logging.getLogger("fastdata")


def machine_key() -> str:
    """The machine a tuned config is for: CPU model, usable cores, GPU name ("cuda?" where CUDA
    says it is there but its device cannot be asked: a process forked after CUDA started, a GPU
    in exclusive mode that another job holds; every image loader computes this key, and must
    not fail for it)."""
    import torch  # here, not at the module's import: `fastdata demo --help` reads cache_root without torch

    try:
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    except Exception:
        gpu = "cuda?"
    return f"{platform.processor() or platform.machine()}, {usable_cores()} cores, {gpu}"


@functools.cache
def versions() -> dict[str, Any]:
    """The versions a tuned config depends on: fastdata, torch, Pillow (and whether it is
    Pillow-SIMD), Python."""
    try:
        ours = importlib.metadata.version("fastdata")
    except importlib.metadata.PackageNotFoundError:
        ours = None
    import torch

    pillow = pillow_info()
    return {"fastdata": ours, "torch": torch.__version__,
            "pillow": {"version": pillow["version"], "simd": pillow["simd"]}, "python": platform.python_version()}


def cache_root() -> Path | None:
    """fastdata's cache on this machine: $FASTDATA_CACHE, default ~/.cache/fastdata (the tuned
    configs, the checkpoint index); None where there is no home directory either (HOME unset
    and a uid without a passwd entry, as under `docker run --user 12345`, where Path.home()
    raises): then no tune is looked up or kept, and the checkpoint index lives in memory."""
    if os.environ.get("FASTDATA_CACHE"):
        return Path(os.environ["FASTDATA_CACHE"])
    try:
        return Path.home() / ".cache" / "fastdata"
    except (RuntimeError, KeyError, OSError):
        return None


def _root() -> Path | None:
    root = cache_root()
    return None if root is None else root / "tuned"


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
    """The source as a key: a local path (a folder, a list file, a shard or a brace pattern of
    shards) made absolute, so that `data/train` in two projects is two keys, a stream's URL as
    it is; a list with the folder its relative paths are taken from (made absolute one by one,
    a million of them took 3 s, where the list's text takes 0.4)."""
    try:
        here = os.getcwd()
    except OSError:  # (a working folder removed since: relative paths name nothing)
        here = "?"
    if isinstance(source, (list, tuple)):
        return f"{here}: {source}"
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if isinstance(path, str) and not path.startswith(_URLS):
            return os.path.normpath(os.path.join(here, os.path.expanduser(path)))  # (abspath, without a second getcwd)
        return str(path)
    return str(source)


def _keyed(source: Any, transform: Any, batch_size: int) -> list:
    """What an entry is kept for, as its file records it: [source, transform, batch size]."""
    return [_where(source), repr(transform), batch_size]


def _path_of(keyed: list) -> Path | None:
    root = _root()
    if root is None:
        return None
    key = json.dumps([*keyed, machine_key()])
    return root / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def cache_path(source: Any, transform: Any, batch_size: int) -> Path | None:
    """Where the tuned config for (source, transform, batch size, machine) is kept; None where
    there is no cache folder (`cache_root`)."""
    return _path_of(_keyed(source, transform, batch_size))


def check_keepable(source: Any, transform: Any, batch_size: int) -> None:
    """Raises the OSError `store_tune` would where a tune could not be kept: before a tune's
    minutes of measuring, not after them."""
    fd, tmp = _temporary(cache_path(source, transform, batch_size))
    os.close(fd)
    os.unlink(tmp)


def _temporary(path: Path | None) -> tuple[int, str]:
    """A new temporary file beside `path` (its folder made), or an OSError that says what to set."""
    if path is None:
        raise OSError("cannot keep the tune: there is no cache folder ($FASTDATA_CACHE is not set and this user "
                      "has no home directory); set FASTDATA_CACHE to a writable folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise OSError(f"cannot keep the tune in {path.parent}: {e.strerror or e}; set FASTDATA_CACHE to a "
                      "writable folder") from None


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
    created, keyed = _now().replace(microsecond=0), _keyed(source, transform, batch_size)
    entry = {"loader": chosen, "tune": result, "created": created.isoformat(),
             "expires": (created + _ttl()).isoformat(), "machine": machine_key(), "versions": versions(),
             **dict(zip(("source", "transform", "batch_size"), keyed))}
    path = _path_of(keyed)
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "w") as f:
            # 0644: others may list it, only its owner write it (`_read` ignores an entry others may write)
            os.fchmod(f.fileno(), 0o644)
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


def _untrusted(st: os.stat_result) -> str | None:
    """Why an entry's file may hold values someone else chose (the checkpoint index's rule,
    csrc/index.cpp: this user's, and not writable by group or others), or None. Another user
    who may write the file, or owns it, could set every loader's workers and prefetch."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return (f"it is not this user's alone to write (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; "
                f"this is uid {os.geteuid()})")
    return None


def _out_of_range(loader: dict[str, Any]) -> str | None:
    """Why the keywords `fastdata.loader` would apply from an entry are out of range, or None:
    the loader checks num_workers' type and placement, not how many workers or batches ahead."""
    cap = 4 * usable_cores()  # the tune tries at most one worker a core; more is no tune's
    workers, prefetch = loader.get("num_workers", 0), loader.get("prefetch_factor", 2)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 0 <= workers <= cap:
        return f"its num_workers {workers!r:.50} is not an integer in [0, {cap}]"
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not 1 <= prefetch <= MAX_PREFETCH:
        return f"its prefetch_factor {prefetch!r:.50} is not an integer in [1, {MAX_PREFETCH}]"
    if loader.get("placement", "auto") not in PLACEMENTS:
        return f"its placement {loader.get('placement')!r:.50} is not one of {', '.join(map(repr, PLACEMENTS))}"
    if loader.get("backend", "pil") not in BACKENDS:
        return f"its backend {loader.get('backend')!r:.50} is not one of {', '.join(map(repr, BACKENDS))}"
    return None


def _read(path: Path) -> tuple[dict[str, Any] | None, str | None, bool]:
    """(the entry, None, False) when it holds and (the entry or None, why not, whether to warn)
    when it does not: a warning where the file is untrusted or its values out of range (set by
    someone or something other than a tune), the DEBUG log where it is only stale or foreign.
    Opened without following a link or waiting on a FIFO, and checked on the open file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return (None, "it is a symlink", True) if e.errno == errno.ELOOP else (None, f"unreadable: {e}", False)
    try:
        with os.fdopen(fd, "rb") as f:
            why = _untrusted(os.fstat(f.fileno()))
            if why is not None:
                return None, why, True
            data = f.read(MAX_ENTRY_BYTES + 1)
            if len(data) > MAX_ENTRY_BYTES:
                return None, f"it is over {MAX_ENTRY_BYTES:,} bytes (a tune writes a few KB)", True
            entry = json.loads(data)
    except (OSError, ValueError) as e:
        return None, f"unreadable: {e}"[:300], False
    if not isinstance(entry, dict) or not isinstance(entry.get("loader"), dict):
        return None, "unreadable: no loader keywords in it", False
    try:
        expires = datetime.datetime.fromisoformat(entry["expires"])
    except (KeyError, TypeError, ValueError):
        expires = None
    if expires is None or expires.tzinfo is None:
        return entry, "it has no valid expiry date (made by an older fastdata)", False
    if _now() >= expires:
        return entry, f"it expired on {entry['expires']}", False
    if entry.get("machine") != machine_key():
        return entry, f"it was tuned on another machine ({entry.get('machine')}; this one is {machine_key()})", False
    now = versions()
    then = entry.get("versions") or {}
    changed = [f"{name} {then.get(name)} (now {value})" for name, value in now.items() if then.get(name) != value]
    if changed:
        return entry, "it was tuned with " + ", ".join(changed), False
    why = _out_of_range(entry["loader"])  # after the machine: another's may have had more cores
    if why is not None:
        return entry, why, True
    part = BACKENDS.get(entry["loader"].get("backend", "pil"))
    if part is not None and not has(part):  # (uninstalled since, or another environment on this machine)
        return entry, f"it chose backend {entry['loader']['backend']!r}, which is not installed here", False
    return entry, None, False


def cached_tune(source: Any, transform: Any, batch_size: int) -> dict[str, Any] | None:
    """The entry `store_tune` wrote for this source, transform, batch size and machine (its
    "loader" keywords, "created", "expires", ...; plus "path"), or None when there is none or
    it is unreadable, expired, or made on another machine or with other versions (said at
    DEBUG on the "fastdata" logger), or untrusted or out of range (a warning). None, with no
    lookup, where there is no cache folder. `store_tune` replaces the file whole, so a read
    never sees a torn one."""
    keyed = _keyed(source, transform, batch_size)  # (a list source's text is made once: 0.4 s for a million)
    path = _path_of(keyed)
    if path is None or not os.path.lexists(path):
        return None
    entry, why, warn = _read(path)
    if why is None:
        kept = [entry.get("source"), entry.get("transform"), entry.get("batch_size")]
        if kept != keyed:  # (the name is 80 bits of their hash)
            why, warn = (f"it was kept for another source, transform or batch size "
                         f"({', '.join(repr(k)[:200] for k in kept)})"), True
    if why is not None:
        if warn:
            warnings.warn(f"ignoring the tuned config in {path}: {why}", stacklevel=2)
        else:
            logger.debug("ignoring the tuned config in %s: %s", path, why)
        return None
    return {**entry, "path": str(path)}


def list_tunes() -> list[dict[str, Any]]:
    """Every entry of the cache, oldest first: the entry (or only "path" when unreadable) plus
    "path", "valid" (whether `num_workers="auto"` would use it) and "why_not" (None when valid)."""
    root = _root()
    entries = []
    for path in sorted(root.glob("*.json") if root is not None else ()):
        entry, why, _ = _read(path)
        entries.append({**(entry or {}), "path": str(path), "valid": why is None, "why_not": why})
    return sorted(entries, key=lambda e: str(e.get("created", "")))


def clear_tunes() -> int:
    """Removes every entry of the cache; returns how many files it removed (a folder that
    happens to match is no entry, and is left)."""
    root = _root()
    removed = 0
    for path in root.glob("*.json") if root is not None else ():
        try:
            path.unlink()
            removed += 1
        except (FileNotFoundError, IsADirectoryError):  # (FileNotFound: another process removed it first)
            pass
    return removed
