"""WebDataset shards as a source: which samples a set of tar shards holds and where, from the
index fastdata-shard writes next to them, or else from a scan of their tar headers."""

from __future__ import annotations

import itertools
import os
import re
import sys
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError, one_line, warn
from .compressed import Decompressed
from .files import MAX_LABEL, Names
from .streams import describe_error, http_size, identity, local_path, open_http, open_stream
from .tarformat import (INDEX_FORMAT, INDEX_VERSION, MAX_INDEX_BYTES, ForeignIndex, Scan, StreamTooLong,
                        check_index_size, collection_paused, index_entry, index_location, parse_index,
                        read_index, scan_tar)


@dataclass
class Shards:
    """WebDataset shards: `urls[s]` holds `len(keys[s])` samples; sample i of shard s is the tar
    members in bytes [spans[s][i, 0], spans[s][i, 0] + spans[s][i, 1]) and has key keys[s][i],
    with contents[s][i] = (members, payload bytes), which the reader checks against what it
    finds there ((-1, -1): unchecked), and checksums[s][i] the index's CRC-32 of the sample's
    bytes, which the reader compares (-1, or checksums[s] None: none to compare). From the
    index beside shard s when it lists it (indexed[s]), else from a scan of its tar headers.
    Key "" is a slot for bytes that hold no sample the scan can name (damaged headers of their
    own): reading it reports them."""

    urls: list[str]
    keys: list[Names]
    spans: list[np.ndarray]  # int64 [n, 2]: offset, length
    classes: list[str] | None
    description: str
    contents: list[np.ndarray] | None = None  # int64 [n, 2]: members, payload bytes
    indexed: list[bool] | None = None
    checksums: list[np.ndarray | None] | None = None  # int64 [n]: the index's CRC-32 of each sample's bytes, -1: none
    # each local shard's `streams.identity` when it was listed (None: a stream): bytes read from
    # a file of another identity are not taken for the bytes a record found intact
    stamps: list[tuple[int, ...] | None] | None = None
    # each shard read on from its start, never by byte range: a pipe: command's output (always),
    # a compressed tar (its spans are offsets in what it decompresses to)
    streamed: list[bool] | None = None

    def __post_init__(self) -> None:
        self.keys = [k if isinstance(k, Names) else Names(k) for k in self.keys]  # (see Names)
        given = self.streamed or [False] * len(self.urls)
        self.streamed = [bool(s) or url.startswith("pipe:") for s, url in zip(given, self.urls)]

    @property
    def label_limit(self) -> int:
        """Labels are in [0, label_limit): the classes the index names, else [0, 2**31)."""
        return len(self.classes) if self.classes else MAX_LABEL

    def __len__(self) -> int:
        return sum(len(k) for k in self.keys)

    @property
    def counts(self) -> np.ndarray:
        return np.array([len(k) for k in self.keys], dtype=np.int64)

    @property
    def sizes(self) -> np.ndarray:
        """Each sample's length in the shards (its tar headers and members), in sample id order."""
        return np.concatenate([s[:, 1] for s in self.spans]) if self.spans else np.zeros(0, dtype=np.int64)


MAX_SHARDS = 1_000_000  # a source naming more is refused before its names are made
_RANGE = re.compile(r"\{(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?\}")


def _expand(source: Any) -> list[str]:
    """The shard URLs a source names: each path or URL brace-expanded (a-{000..009}.tar), `~` expanded, at
    most MAX_SHARDS. braceexpand makes lists of a pattern's groups, so a pattern such as
    {0..99999999999} would fill the memory before its first name: the product of its numeric
    ranges' lengths (an upper bound) is checked first."""
    from braceexpand import braceexpand  # webdataset's own dependency

    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    for item in items:
        bound = 1
        for lo, hi, step in _RANGE.findall(os.fspath(item)):
            bound *= abs(int(hi) - int(lo)) // max(abs(int(step or 1)), 1) + 1
        if bound > MAX_SHARDS:
            raise ValueError(f"the shard source {os.fspath(item)!r:.200} names up to {bound:,} shards, more than "
                             f"{MAX_SHARDS:,}")
    names = (os.path.expanduser(u) for item in items for u in braceexpand(os.fspath(item)))  # ~ as a shell would
    urls = list(itertools.islice(names, MAX_SHARDS + 1))
    if len(urls) > MAX_SHARDS:
        raise ValueError(f"the shard source {source!r:.200} names more than {MAX_SHARDS:,} shards")
    if not urls:
        raise ValueError(f"the shard source {source!r:.200} names no shards")
    return urls


def _load_index(where: str) -> dict | None:
    """The index at `where` (a shard's `tarformat.index_location`), or None where there is none,
    it cannot be had, or it is JSON of another format (a dataset's own `index.json`: the shards
    get scanned). A local index of fastdata's format that is not a valid one raises ValueError
    (`read_index`), as does a local file there that is no JSON."""
    if where.startswith("pipe:"):
        return None
    local = local_path(where)
    if local is not None:
        try:
            return read_index(local) if os.path.exists(local) else None
        except ForeignIndex:
            return None
    try:
        with open_http(where) as r:
            data = r.read(MAX_INDEX_BYTES + 1)
    except OSError as e:
        # Said where it fails (5xx) or is too slow; not a 4xx (no index there, or none this client
        # may read), nor an unreachable host (the shards' own reads will say so).
        failed = e.code >= 500 if isinstance(e, urllib.error.HTTPError) else \
            isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError)
        if isinstance(e, urllib.error.HTTPError):
            e.close()  # an HTTPError is the response too: its connection, closed now rather than by the collector
        if failed:
            warn(f"the index {where} could not be read ({describe_error(e)}); counting the samples of its "
                 "shards from their headers instead")
        return None
    check_index_size(len(data), where)
    try:
        index = parse_index(data, where)
    except ValueError:
        return None  # not an index: the shards get scanned
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or index.get("version") != INDEX_VERSION:
        return None
    return index


def _indexes(urls: list[str]) -> tuple[list[str], dict[str, dict], list[str] | None]:
    """(where each shard's index would be: `tarformat.index_location`, next to the shard; the
    entries of each index found, by location, then by shard name; the classes the first index
    found names). An index's names are relative to its own folder, so a shard takes its entry
    only from the index beside it: shards of one name in two folders each keep their own. Each
    location is read once. Indexes naming other classes than the first: a warning, and the
    first's are kept (labels are checked against them). A local index that is malformed raises
    ValueError."""
    wheres = [index_location(url) for url in urls]
    entries: dict[str, dict] = {}
    classes, first = None, None
    for where in dict.fromkeys(wheres):
        with collection_paused():  # until the parsed index is gone (see collection_paused)
            index = _load_index(where)
            if not index:
                continue
            if not isinstance(index.get("shards"), list):
                raise ValueError(f"the shard index {where} is malformed: its shards should be a list")
            named = {}
            for e in index["shards"]:
                name, *rest = index_entry(e, where)
                if name in named:  # which of the two describes the shard is not known
                    raise ValueError(f"the shard index {where} is malformed: it has two entries for {name!r:.100}")
                named[name] = rest
            entries[where] = named
            listed = index.get("classes")
            del index
        if listed is not None and not (isinstance(listed, list) and all(isinstance(c, str) for c in listed)):
            raise ValueError(f"the shard index {where} is malformed: its classes should be a list of names or null")
        if first is None:
            classes, first = listed, where
        elif listed != classes:
            warn(f"the shard indexes {first} and {where} name different classes; the labels are taken as "
                 f"{first}'s")
    return wheres, entries, classes


def scan_shard(url: str) -> Scan:
    """The samples of a shard without an index, from its tar headers (`tarformat.scan_tar`:
    webdataset's grouping, consecutive members with one key are a sample; a damaged header is
    stepped over and its loss joined to a sample that reports it when read): a `tarformat.Scan`.
    Raises DataError for a file in which no valid tar header is found."""
    with open_stream(url) as f:
        compressed = isinstance(f, Decompressed)
        length = os.fstat(f.fileno()).st_size if local_path(url) is not None and not compressed else None
        try:
            scan = scan_tar(f, length)
        except StreamTooLong as e:
            raise DataError(f"cannot read shard {url}: {e}", path=url) from None
    if compressed and f.error and not (len(scan.keys) and scan.has_members):
        raise DataError(one_line(f"cannot read shard {url}: {f.error}"), path=url)
    if scan.damage and not scan.has_members:
        raise DataError(one_line(f"cannot read shard {url}: not a tar file ({scan.damage[0].cause})"), path=url)
    # A failure after the tar's end blocks (bytes after the stream) lost nothing: tarfile reads on as well.
    end = int(scan.spans[-1].sum()) + 2 * 512 if len(scan.keys) else 0
    failed = f.error if compressed and f.error and f.at < end else scan.failed
    return scan._replace(compressed=compressed, failed=failed)


def _misfit(spans: np.ndarray, nbytes: int) -> str | None:
    """Why an index's samples (`spans`) of a shard of `nbytes` bytes do not tile it up to its two
    end blocks, or None where they do: ranges that pass its end or overlap, or bytes in no
    sample (a sample the index misses, which may hold any number of samples)."""
    end = nbytes - 2 * 512
    if not len(spans):
        return f"it lists no sample in bytes [0, {end}) of it" if end > 0 else None
    starts, lengths = spans[:, 0], spans[:, 1]
    # Each span is checked against the end before offset + length is formed: a crafted pair
    # could wrap past int64 and pass for a range before the end.
    if end <= 0 or (lengths <= 0).any() or (starts < 0).any() or (lengths > end - starts).any():
        return "its samples' byte ranges pass the shard's end"
    ends = starts + lengths
    if (starts[1:] < ends[:-1]).any():
        return "its samples' byte ranges overlap"
    lo, hi = np.concatenate([[0], ends]), np.concatenate([starts, [end]])
    gaps = np.flatnonzero(hi > lo)
    if len(gaps):
        return f"it lists no sample in {len(gaps)} byte range(s) of it, the first at byte {lo[gaps[0]]}"
    return None


def _sizes(urls: list[str], listed: dict) -> dict[int, int]:
    """The sizes of the indexed shards (`listed`: by position in `urls`) that can be known
    without reading them: a file's, and an HTTP(S) object's (one small request each, 8 at a
    time); not a pipe:'s (its index is taken as it is)."""
    sizes = {s: os.path.getsize(local) for s in listed if (local := local_path(urls[s])) is not None}
    remote = [s for s in listed if urls[s].startswith(("http://", "https://"))]

    def size(s: int) -> int | None:
        try:
            return http_size(urls[s])
        except Exception as e:  # OSError, URLError, a bad header
            raise DataError(f"cannot read shard {urls[s]}: {describe_error(e)}", path=urls[s]) from None

    if remote:
        with ThreadPoolExecutor(min(8, len(remote))) as pool:
            sizes.update((s, n) for s, n in zip(remote, pool.map(size, remote)) if n is not None)
    return sizes


def shards(source: Any, progress: bool = True) -> Shards:
    """The shards a `.tar` path, brace pattern or list of paths/URLs names, with their samples:
    from the index fastdata-shard writes next to them (<prefix>-index.json, in each shard's own
    folder: `_indexes`), else from a scan of each shard's headers (for a remote shard, one full
    read; with `progress`, a line on stderr counts them once that takes more than 2 s).

    What an index says is checked against the shards where that is cheap: here, each shard's
    size, a file's or an HTTP(S) object's, not a pipe:'s (another size: a warning; a longer
    shard is counted from its headers, a shorter one keeps the index, and the samples past its
    end are reported lost when read) and that the index's samples tile the shard up to its end
    blocks (where not: bytes in no sample, which may hold any number of samples the index
    misses, or ranges that overlap or pass its end: a warning, and the shard is counted from its
    headers, so that every sample it holds is read or reported). When a
    sample is read, the headers in its span must be its members, as many and as big as the index says
    (wds backend), and their bytes must have the CRC-32 the index gives (fastdata-shard writes
    one a sample). The index's sha256 of each shard is not checked: it covers the whole shard,
    which the loader reads in byte ranges spread over workers, so checking it would read the
    dataset once more before the first batch, and a mismatch would not say which sample is
    wrong. Damage a header scan finds is warned about here and reported by the sample it is
    joined to when read (`tarformat.scan_tar`), as on_error says."""
    urls = _expand(source)
    for url in urls:
        local = local_path(url)
        if local is not None and not os.path.exists(local):
            glob = " (a shard pattern is a brace range, as train-{000000..000127}.tar, not a glob)" \
                if any(c in url for c in "*?[") else ""
            raise FileNotFoundError(f"shard {url!r} does not exist{glob}")
    # before anything is read of them: a shard written after this is another version
    stamps = [None if (local := local_path(url)) is None else identity(os.stat(local)) for url in urls]
    wheres, entries, classes = _indexes(urls)
    keys: list[list[str] | None] = [None] * len(urls)
    spans: list[np.ndarray | None] = [None] * len(urls)
    contents: list[np.ndarray | None] = [None] * len(urls)
    checksums: list[np.ndarray | None] = [None] * len(urls)
    named = ((s, entries.get(wheres[s], {}).get(url.rpartition("/")[2])) for s, url in enumerate(urls))
    listed = {s: entry for s, entry in named if entry is not None}
    sizes = _sizes(urls, listed)
    for s, url in enumerate(urls):
        where = wheres[s]
        entry = listed.get(s)
        if entry is None:
            continue
        nbytes, k, sp, ct, cs = entry
        size = sizes.get(s, nbytes)
        if size != nbytes:
            # Shorter: most likely cut off, and the index names what is lost. Longer: rewritten.
            how = ("keeping the index: the samples past its end will be reported lost" if size < nbytes
                   else "reading its headers instead")
            warn(f"shard {url} is {size} bytes, not the {nbytes} its index {where} gives; {how}")
            if size > nbytes:
                continue
        problem = _misfit(sp, nbytes)
        if problem is not None:  # (stale, or crafted): the shard's headers say what it holds
            warn(f"the index {where} does not fit shard {url}: {problem}; reading its headers instead")
            continue
        if size < nbytes:  # reads stop at the shard's end: what lies past it is reported lost
            sp = np.minimum(sp.cumsum(axis=1), size)
            sp[:, 1] -= sp[:, 0]
        keys[s], spans[s], contents[s], checksums[s] = k, sp, ct, cs
    indexed = [k is not None for k in keys]
    compressed = [False] * len(urls)
    todo = [s for s in range(len(urls)) if keys[s] is None]
    if todo:
        def scan(s: int):
            try:
                return scan_shard(urls[s])
            except DataError:
                raise
            except Exception as e:  # OSError, URLError, tarfile errors
                raise DataError(f"cannot read shard {urls[s]}: {describe_error(e)}", path=urls[s]) from None

        start, shown = time.monotonic(), False
        with ThreadPoolExecutor(min(8, len(todo))) as pool:
            for done, (s, scanned) in enumerate(zip(todo, pool.map(scan, todo)), 1):
                keys[s], spans[s], contents[s] = scanned.keys, scanned.spans, scanned.contents
                compressed[s] = scanned.compressed
                if scanned.damage:
                    more = f" (and {len(scanned.damage) - 1} more)" if len(scanned.damage) > 1 else ""
                    warn(one_line(f"shard {urls[s]} is damaged: {scanned.damage[0].cause}{more}; what that "
                                  "lost is reported as a sample that cannot be read"))
                if scanned.failed:  # a member it cut is reported when read; those after it are not found
                    what = "a compressed tar" if scanned.compressed else "a stream"
                    warn(one_line(f"shard {urls[s]} ends early: {scanned.failed}; the samples after that point "
                                  f"cannot be found ({what} is read on from its start)"))
                if progress and (shown or time.monotonic() - start > 2):  # a line once it takes a while
                    shown = True
                    print(f"\rcounting the samples of shards without an index: {done}/{len(todo)}",
                          end="\n" if done == len(todo) else "", file=sys.stderr, flush=True)
    n = sum(len(k) for k in keys)
    used = list(dict.fromkeys(wheres[s] for s in range(len(urls)) if indexed[s]))
    more = f" and {len(used) - 1} more" if len(used) > 1 else ""
    how = f"index{'es' if more else ''} {used[0]}{more}" if used else "no index: counted from the tar headers"
    if used and todo:
        how += f", {len(todo)} shards counted from their headers"
    return Shards(urls, keys, spans, classes, f"WebDataset shards ({len(urls)} shards, {n} samples; {how})",
                  contents, indexed, checksums, stamps, compressed)


