"""Image sources: what a path, a list or a shard pattern names, as a list of samples."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".tif", ".tiff")


@dataclass
class Samples:
    """The samples of a source: `paths[i]` with label `labels[i]`; `classes` when the source
    names them (ImageFolder)."""

    paths: list[str]
    labels: np.ndarray  # int64
    classes: list[str] | None
    description: str

    def __len__(self) -> int:
        return len(self.paths)


def image_folder(root: str | os.PathLike) -> Samples:
    """`root/<class>/<image>`: classes sorted by name, label = index, as torchvision's
    ImageFolder; images found recursively under each class folder, sorted."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise ValueError(f"source {str(root)!r} should be a folder in ImageFolder layout (root/<class>/<image>) or a .tar shard, but it is a file")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image folder {str(root)!r} has no class folders: expected root/<class>/<image>")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = sorted(
            os.path.join(dirpath, f)
            for dirpath, _, files in os.walk(root / name, followlinks=True)
            for f in files
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        paths += found
        labels += [label] * len(found)
    if not paths:
        raise ValueError(f"image folder {str(root)!r} has {len(classes)} class folders but no images ({', '.join(IMAGE_EXTENSIONS)})")
    return Samples(paths, np.asarray(labels, dtype=np.int64), classes, f"ImageFolder {root} ({len(paths)} images, {len(classes)} classes)")


def file_list(pairs: Sequence[Any]) -> Samples:
    """A list of (path, label) pairs, taken as given (files are checked when read)."""
    paths, labels = [], []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"a file list should hold (path, label) pairs, but item {i} is {pair!r:.100}")
        path, label = pair
        if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
            raise ValueError(f"labels should be integers, but item {i} ({path}) has label {label!r:.50}")
        paths.append(os.fspath(path))
        labels.append(int(label))
    if not paths:
        raise ValueError("the file list is empty")
    return Samples(paths, np.asarray(labels, dtype=np.int64), None, f"file list ({len(paths)} images)")


# ----------------------------------------------------------------- WebDataset shards

_SCHEMES = ("pipe:", "http://", "https://", "file:")
_HTTP_TIMEOUT = 60.0


@dataclass
class Shards:
    """WebDataset shards: `urls[s]` holds `len(keys[s])` samples; sample i of shard s is the tar
    members in bytes [spans[s][i, 0], spans[s][i, 0] + spans[s][i, 1]) and has key keys[s][i].
    From the shards' index when there is one, else from a scan of their tar headers."""

    urls: list[str]
    keys: list[list[str]]
    spans: list[np.ndarray]  # int64 [n, 2]: offset, length
    classes: list[str] | None
    description: str

    def __len__(self) -> int:
        return sum(len(k) for k in self.keys)

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(k) for k in self.keys], dtype=np.int64)


def is_shard_source(source: Any) -> bool:
    def one(s: Any) -> bool:
        s = os.fspath(s)
        return s.endswith(".tar") or s.startswith(_SCHEMES) or ("{" in s and ".." in s)

    if isinstance(source, (str, os.PathLike)):
        return one(source)
    return isinstance(source, (list, tuple)) and bool(source) and all(isinstance(s, (str, os.PathLike)) for s in source) \
        and one(source[0])


def _local(url: str) -> str | None:
    """The file path a shard URL names, or None for a stream (pipe:, http(s):)."""
    if url.startswith("file:"):
        return url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
    return None if url.startswith(("pipe:", "http://", "https://")) else url


def open_stream(url: str):
    """A binary stream of a whole shard: a file, an HTTP response, or webdataset's gopen for
    pipe: (a command whose stdout is the shard)."""
    local = _local(url)
    if local is not None:
        return open(local, "rb")
    if url.startswith("pipe:"):
        import webdataset

        return webdataset.gopen(url, "rb")
    return _http(url, None)


def _http(url: str, byte_range: tuple[int, int] | None):
    # urllib rather than webdataset's gopen (curl): gopen retries an unreachable host for a
    # minute, and cannot ask for a byte range.
    import urllib.request

    headers = {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"} if byte_range else {}
    return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=_HTTP_TIMEOUT)


def read_range(url: str, start: int, view: memoryview) -> int:
    """Reads bytes [start, start + len(view)) of a shard into `view`; returns the count read
    (fewer where the shard ends sooner). Files seek, HTTP asks for the range (a server that
    ignores Range is read up to it); pipe: streams are read from the start (the wds backend
    keeps them open between reads instead)."""
    if not len(view):
        return 0
    local = _local(url)
    if local is not None:
        with open(local, "rb", buffering=0) as f:
            f.seek(start)
            return _fill(f, view)
    if url.startswith("pipe:"):
        with open_stream(url) as f:
            _discard(f, start)
            return _fill(f, view)
    with _http(url, (start, start + len(view))) as r:
        if r.status != 206:
            _discard(r, start)
        return _fill(r, view)


def _fill(f, view: memoryview) -> int:
    """Reads into `view` until it is full or `f` ends; the count read."""
    got = 0
    readinto = getattr(f, "readinto", None)  # webdataset's Pipe has read() only
    while got < len(view):
        if readinto is not None:
            k = readinto(view[got:])
        else:
            chunk = f.read(min(len(view) - got, 1 << 20))
            k = len(chunk)
            view[got:got + k] = chunk
        if not k:
            break
        got += k
    return got


def _discard(f, n: int) -> int:
    left = n
    while left > 0:
        chunk = f.read(min(left, 1 << 20))
        if not chunk:
            break
        left -= len(chunk)
    return n - left


def _expand(source: Any) -> list[str]:
    from braceexpand import braceexpand  # webdataset's own dependency

    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    urls = [u for item in items for u in braceexpand(os.fspath(item))]
    if not urls:
        raise ValueError(f"the shard source {source!r:.200} names no shards")
    return urls


def _index_location(url: str) -> str:
    """Where an index written by fastdata-shard for these shards would be: <prefix>-index.json
    next to them, <prefix> the shard name before its number (train-000003.tar -> train)."""
    head, _, name = url.rpartition("/")
    stem = name[: -len(".tar")] if name.endswith(".tar") else name
    prefix = stem.rstrip("0123456789").rstrip("-_. ")
    index = f"{prefix}-index.json" if prefix else "index.json"
    return f"{head}/{index}" if head else index


def _load_index(urls: list[str]) -> tuple[dict | None, str]:
    from .shard import INDEX_FORMAT, read_index

    where = _index_location(urls[0])
    if urls[0].startswith("pipe:"):
        return None, where
    local = _local(where)
    if local is not None:
        return (read_index(local) if os.path.exists(local) else None), where
    import json
    import urllib.error

    try:
        with _http(where, None) as r:
            index = json.loads(r.read())
    except urllib.error.HTTPError:  # no index there (404): the shards get scanned
        return None, where
    except (OSError, ValueError):
        return None, where  # unreachable: the shards' own reads will say so
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or index.get("version") != 1:
        return None, where
    return index, where


def scan_shard(url: str) -> tuple[list[str], np.ndarray]:
    """The samples of a shard without an index, from its tar headers (webdataset's grouping:
    consecutive members with one key are a sample): (keys, [offset, length] spans). A shard cut
    off mid-member keeps that member's sample with the length its header gives: reading it
    fails there, and names the member."""
    import tarfile

    from .shard import _padded, sample_key

    keys: list[str] = []
    spans: list[list[int]] = []
    local = _local(url)
    with (open(local, "rb") if local is not None else open_stream(url)) as f:
        mode = "r:" if local is not None else "r|"
        try:
            tf = tarfile.open(fileobj=f, mode=mode)
        except tarfile.ReadError as e:
            from .errors import DataError

            raise DataError(f"cannot read shard {url}: not a tar file ({e})", path=url) from None
        with tf:
            for info in _members(tf, keys):
                tf.members = []  # keep memory flat over long shards
                key = sample_key(info.name) if info.isreg() else None
                if key is None:
                    continue
                end = info.offset_data + _padded(info.size)
                if keys and keys[-1] == key:
                    spans[-1][1] = end - spans[-1][0]
                else:
                    keys.append(key)
                    spans.append([info.offset, end - info.offset])
    return keys, np.array(spans, dtype=np.int64).reshape(-1, 2)


def _members(tf, keys: list[str]):
    """The members of an open tar; a shard cut off after its first sample (`keys` so far) just
    ends (its cut member's sample is kept: reading it names the member)."""
    import tarfile

    while True:
        try:
            info = tf.next()
        except tarfile.ReadError:
            if not keys:
                raise
            return
        if info is None:
            return
        yield info


def shards(source: Any, progress: bool = True) -> Shards:
    """The shards a `.tar` path, brace pattern or list of paths/URLs names, with their samples:
    from the index fastdata-shard writes next to them (<prefix>-index.json), else from a scan
    of each shard's headers (for a remote shard, one full read; with `progress`, a line on
    stderr counts them once that takes more than 2 s)."""
    from concurrent.futures import ThreadPoolExecutor

    from .errors import DataError

    urls = _expand(source)
    for url in urls:
        local = _local(url)
        if local is not None and not os.path.exists(local):
            raise FileNotFoundError(f"shard {url!r} does not exist")
    index, where = _load_index(urls)
    entries = {e["name"]: e for e in index["shards"]} if index else {}
    keys: list[list[str] | None] = [None] * len(urls)
    spans: list[np.ndarray | None] = [None] * len(urls)
    for s, url in enumerate(urls):
        entry = entries.get(url.rpartition("/")[2])
        if entry is None:
            continue
        local = _local(url)
        size = os.path.getsize(local) if local is not None else entry["bytes"]
        if size != entry["bytes"]:
            import warnings

            # Shorter: most likely cut off, and the index names what is lost. Longer: rewritten.
            how = ("keeping the index: the samples past its end will be reported lost" if size < entry["bytes"]
                   else "reading its headers instead")
            warnings.warn(f"shard {url} is {size} bytes, not the {entry['bytes']} its index {where} gives; {how}",
                          stacklevel=4)
            if size > entry["bytes"]:
                continue
        keys[s] = [k for k, _, _ in entry["samples_index"]]
        spans[s] = np.array([[o, n] for _, o, n in entry["samples_index"]], dtype=np.int64).reshape(-1, 2)
    todo = [s for s in range(len(urls)) if keys[s] is None]
    if todo:
        def scan(s: int):
            try:
                return scan_shard(urls[s])
            except DataError:
                raise
            except Exception as e:  # OSError, URLError, tarfile errors
                raise DataError(f"cannot read shard {urls[s]}: {_cause(e)}", path=urls[s]) from None

        import sys
        import time

        start, shown = time.monotonic(), False
        with ThreadPoolExecutor(min(8, len(todo))) as pool:
            for done, (s, (k, sp)) in enumerate(zip(todo, pool.map(scan, todo)), 1):
                keys[s], spans[s] = k, sp
                if progress and (shown or time.monotonic() - start > 2):  # a line once it takes a while
                    shown = True
                    print(f"\rcounting the samples of shards without an index: {done}/{len(todo)}",
                          end="\n" if done == len(todo) else "", file=sys.stderr, flush=True)
    classes = index.get("classes") if index else None
    n = sum(len(k) for k in keys)
    how = f"index {where}" if index and len(todo) < len(urls) else "no index: counted from the tar headers"
    if index and todo:
        how += f", {len(todo)} shards counted from their headers"
    return Shards(urls, keys, spans, classes, f"WebDataset shards ({len(urls)} shards, {n} samples; {how})")


def _cause(e: BaseException) -> str:
    if isinstance(getattr(e, "code", None), int):  # urllib's HTTPError
        return f"HTTP {e.code} {getattr(e, 'reason', '')}".strip()
    reason = getattr(e, "reason", None)  # urllib's URLError
    if reason is not None:
        return f"{type(e).__name__}: {reason}"
    return getattr(e, "strerror", None) or f"{type(e).__name__}: {e}"


def is_image_source(source: Any) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    if isinstance(source, (list, tuple)) and source:
        first = source[0]
        if isinstance(first, (str, os.PathLike)):
            return True
        if isinstance(first, (list, tuple)) and len(first) == 2 and isinstance(first[0], (str, os.PathLike)):
            return True
    return False


def resolve(source: Any) -> Samples | Shards:
    """What an image source names: Shards for shards, else Samples (files)."""
    if is_shard_source(source):
        return shards(source)
    if isinstance(source, (str, os.PathLike)):
        return image_folder(source)
    if isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, os.PathLike)):
        raise ValueError(f"a list of paths should name WebDataset shards (.tar), but {os.fspath(source[0])!r} "
                         "is not one; a file list holds (path, label) pairs")
    return file_list(source)
