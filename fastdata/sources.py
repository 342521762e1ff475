"""Image sources: what a path, a list or a shard pattern names, as a list of samples."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from .shard import Scan

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".tif", ".tiff")
# Labels of a source that does not name its classes are in [0, 2**31): int64 holds them, and
# so does an int32 class index (what a loss or a one-hot takes).
MAX_LABEL = 2 ** 31


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
    """A list of (path, label) pairs; each label an int (not a bool) in [0, 2**31) (files are
    checked when read)."""
    paths, labels = [], []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"a file list should hold (path, label) pairs, but item {i} is {pair!r:.100}")
        path, label = pair
        if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
            raise ValueError(f"labels should be integers, but item {i} ({path}) has label {label!r:.50}")
        if not 0 <= label < MAX_LABEL:
            raise ValueError(f"labels should be in [0, 2**31), but item {i} ({path}) has label {label}")
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
    members in bytes [spans[s][i, 0], spans[s][i, 0] + spans[s][i, 1]) and has key keys[s][i],
    with contents[s][i] = (members, payload bytes), which the reader checks against what it
    finds there ((-1, -1): unchecked). From the shards' index when there is one (indexed[s]),
    else from a scan of their tar headers. Key "" is a slot for bytes that hold no sample the
    source can name (damaged headers; bytes the index lists in no sample): reading it reports
    them."""

    urls: list[str]
    keys: list[list[str]]
    spans: list[np.ndarray]  # int64 [n, 2]: offset, length
    classes: list[str] | None
    description: str
    contents: list[np.ndarray] | None = None  # int64 [n, 2]: members, payload bytes
    indexed: list[bool] | None = None

    @property
    def label_limit(self) -> int:
        """Labels are in [0, label_limit): the classes the index names, else [0, 2**31)."""
        return len(self.classes) if self.classes else MAX_LABEL

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


def scan_shard(url: str) -> Scan:
    """The samples of a shard without an index, from its tar headers (`shard.scan_tar`:
    webdataset's grouping, consecutive members with one key are a sample; a damaged header is
    stepped over and its loss joined to a sample that reports it when read): a `shard.Scan`.
    Raises DataError for a file in which no valid tar header is found."""
    from .errors import DataError
    from .shard import scan_tar

    local = _local(url)
    with (open(local, "rb") if local is not None else open_stream(url)) as f:
        scan = scan_tar(f, os.fstat(f.fileno()).st_size if local is not None else None)
    if scan.damage and not scan.has_members:
        raise DataError(f"cannot read shard {url}: not a tar file ({scan.damage[0].cause})", path=url)
    return scan


def _index_entry(entry: Any, where: str) -> tuple[str, int, list[str], np.ndarray, np.ndarray]:
    """(name, bytes, keys, spans, contents) of a shard's entry in an index, checked for its
    types: ValueError naming the index and the entry where it is malformed."""
    try:
        name, nbytes, rows = entry["name"], entry["bytes"], entry["samples_index"]
        if not isinstance(name, str) or type(nbytes) is not int or not isinstance(rows, list):
            raise TypeError("name, bytes or samples_index of the wrong type")
        keys = [r[0] for r in rows]
        spans = np.array([(r[1], r[2]) for r in rows]).reshape(-1, 2)
        if not all(type(k) is str and k for k in keys) or (len(rows) and spans.dtype.kind != "i"):
            raise TypeError("samples_index should hold [key, offset, length] rows")
        members = entry.get("members")
        if members is None:
            contents = np.full((len(keys), 2), -1, dtype=np.int64)
        else:
            if len(members) != len(keys) or any(m[0] != k for m, k in zip(members, keys)):
                raise ValueError("its members list other samples than its samples_index")
            contents = np.array([(len(m[1]), sum(x[2] for x in m[1])) for m in members]).reshape(-1, 2)
            if len(members) and contents.dtype.kind != "i":
                raise TypeError("members should hold [key, [[ext, offset, size], ...]] rows")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        shown = entry.get("name") if isinstance(entry, dict) else None
        raise ValueError(f"the shard index {where} is malformed: its entry for {shown!r:.100} "
                         f"({type(e).__name__}: {e})".replace("\n", " ")) from None
    return name, nbytes, keys, spans.astype(np.int64), contents.astype(np.int64)


def _with_gaps(keys: list[str], spans: np.ndarray, contents: np.ndarray, nbytes: int):
    """An index's samples of a shard of `nbytes` bytes, checked to tile it up to its two end
    blocks: (problem, or None; keys, spans, contents with a slot of key "" for each byte range
    the index lists in no sample, which reading reports: a sample the index misses)."""
    end = nbytes - 2 * 512
    if not len(spans):
        gaps = np.array([[0, end]], dtype=np.int64) if end > 0 else np.zeros((0, 2), np.int64)
        at = np.zeros(len(gaps), dtype=np.int64)
    else:
        starts, ends = spans[:, 0], spans.sum(axis=1)
        if (spans[:, 1] <= 0).any() or starts[0] < 0 or (starts[1:] < ends[:-1]).any() or ends[-1] > end:
            return "its samples' byte ranges overlap, or pass the shard's end", keys, spans, contents
        lo, hi = np.concatenate([[0], ends]), np.concatenate([starts, [end]])
        at = np.flatnonzero(hi > lo)
        gaps = np.stack([lo[at], hi[at] - lo[at]], axis=1).astype(np.int64)
    if not len(at):
        return None, keys, spans, contents
    keys = list(keys)
    for i in at[::-1].tolist():
        keys.insert(i, "")
    spans = np.insert(spans, at, gaps, axis=0)
    contents = np.insert(contents, at, [-1, -1], axis=0)
    return None, keys, spans, contents


def shards(source: Any, progress: bool = True) -> Shards:
    """The shards a `.tar` path, brace pattern or list of paths/URLs names, with their samples:
    from the index fastdata-shard writes next to them (<prefix>-index.json), else from a scan
    of each shard's headers (for a remote shard, one full read; with `progress`, a line on
    stderr counts them once that takes more than 2 s).

    What an index says is checked against the shards where that is cheap: here, each shard's
    size (another size: a warning; a longer shard is counted from its headers, a shorter one
    keeps the index, and the samples past its end are reported lost when read) and that the
    index's samples tile the shard up to its end blocks (bytes in no sample: a warning, and a
    slot that reports them when read, so that a sample the index misses is counted; ranges
    that overlap: a warning, and the shard is counted from its headers). When a sample is
    read, the headers in its span must be its members, as many and as big as the index says
    (wds backend). The index's sha256 of each shard is not checked: it covers the whole shard,
    which the loader reads in byte ranges spread over workers, so checking it would read the
    dataset once more before the first batch, and a mismatch would not say which sample is
    wrong. Damage a header scan finds is warned about here and reported by the sample it is
    joined to when read (`shard.scan_tar`), as on_error says."""
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    from .errors import DataError

    urls = _expand(source)
    for url in urls:
        local = _local(url)
        if local is not None and not os.path.exists(local):
            raise FileNotFoundError(f"shard {url!r} does not exist")
    index, where = _load_index(urls)
    entries = {}
    if index:
        if not isinstance(index.get("shards"), list):
            raise ValueError(f"the shard index {where} is malformed: its shards should be a list")
        for e in index["shards"]:
            name, *rest = _index_entry(e, where)
            entries[name] = rest
        classes = index.get("classes")
        if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
            raise ValueError(f"the shard index {where} is malformed: its classes should be a list of names or null")
    keys: list[list[str] | None] = [None] * len(urls)
    spans: list[np.ndarray | None] = [None] * len(urls)
    contents: list[np.ndarray | None] = [None] * len(urls)
    for s, url in enumerate(urls):
        entry = entries.get(url.rpartition("/")[2])
        if entry is None:
            continue
        nbytes, k, sp, ct = entry
        local = _local(url)
        size = os.path.getsize(local) if local is not None else nbytes
        if size != nbytes:
            # Shorter: most likely cut off, and the index names what is lost. Longer: rewritten.
            how = ("keeping the index: the samples past its end will be reported lost" if size < nbytes
                   else "reading its headers instead")
            warnings.warn(f"shard {url} is {size} bytes, not the {nbytes} its index {where} gives; {how}",
                          stacklevel=4)
            if size > nbytes:
                continue
        problem, k, sp, ct = _with_gaps(k, sp, ct, nbytes)
        if problem is not None:
            warnings.warn(f"the index {where} does not fit shard {url}: {problem}; reading its headers instead",
                          stacklevel=4)
            continue
        if len(k) > len(entry[1]):
            first = int(sp[k.index(""), 0])
            warnings.warn(f"the index {where} is stale: it lists no sample in {len(k) - len(entry[1])} byte range(s) "
                          f"of shard {url}, the first at byte {first}; they are reported as samples that cannot be "
                          "read", stacklevel=4)
        if size < nbytes:  # reads stop at the shard's end: what lies past it is reported lost
            sp = np.minimum(sp.cumsum(axis=1), size)
            sp[:, 1] -= sp[:, 0]
        keys[s], spans[s], contents[s] = k, sp, ct
    indexed = [k is not None for k in keys]
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
            for done, (s, scanned) in enumerate(zip(todo, pool.map(scan, todo)), 1):
                keys[s], spans[s], contents[s] = scanned.keys, scanned.spans, scanned.contents
                if scanned.damage:
                    more = f" (and {len(scanned.damage) - 1} more)" if len(scanned.damage) > 1 else ""
                    warnings.warn(f"shard {urls[s]} is damaged: {scanned.damage[0].cause}{more}; what that lost is "
                                  "reported as a sample that cannot be read", stacklevel=4)
                if progress and (shown or time.monotonic() - start > 2):  # a line once it takes a while
                    shown = True
                    print(f"\rcounting the samples of shards without an index: {done}/{len(todo)}",
                          end="\n" if done == len(todo) else "", file=sys.stderr, flush=True)
    classes = index.get("classes") if index else None
    n = sum(len(k) for k in keys)
    how = f"index {where}" if index and len(todo) < len(urls) else "no index: counted from the tar headers"
    if index and todo:
        how += f", {len(todo)} shards counted from their headers"
    return Shards(urls, keys, spans, classes, f"WebDataset shards ({len(urls)} shards, {n} samples; {how})",
                  contents, indexed)


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
