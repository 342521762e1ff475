"""`fastdata-shard`: packs an image source into WebDataset tar shards, with an index.

    fastdata-shard SRC OUT_PATTERN [--max-count N] [--max-size BYTES] [--workers N]
                   [--no-shuffle] [--seed S] [--quiet]
    fastdata-shard imagenet/train out/train-%06d.tar --max-size 1G

SRC is a folder in ImageFolder layout (SRC/<class>/<image>: classes sorted by name, label =
index; images sorted). From Python, `write_shards(source, pattern)` also takes a list of
(path, label) pairs. OUT_PATTERN names the shards printf style, as webdataset's ShardWriter:
one `%d` or `%0Nd` in the file name (no braces), e.g. out/train-%06d.tar -> out/train-000000.tar,
out/train-000001.tar, ...

The shards
  Samples go in a shuffled order, the permutation numpy.random.Generator(PCG64(seed))
  .permutation(n) of the source order (--seed, default 0), so that a shard mixes the classes
  of a class-sorted folder and a loader's shuffle buffer sees a mix; --no-shuffle keeps the
  source order. A shard holds at most --max-count samples (default 10000) and
  at most --max-size bytes (default 1G; K/M/G/T are binary: 1K = 1024); the next sample starts
  a new shard when it would pass either bound, and a single sample bigger than --max-size gets
  a shard of its own. Sample i (its position in the source order) is two tar members:
    <key>.<ext>  the image file's bytes, unchanged; ext = its extension lowercased, jpeg -> jpg
    <key>.cls    the label as decimal text (b"3")
  with key = "%08d" % i, i the sample's position in the source order. The tars are plain
  USTAR, uncompressed, written byte for byte the same on every run and for any number of
  workers: every header has mode 0644, uid/gid 0, empty uname/gname, mtime 0, and the archive
  ends with its two zero blocks (no padding to a 10 KiB record), so a shard's size is exactly
  the sum of its samples' sizes + 1024. Shards are written in parallel (--workers processes,
  default: the usable cores), each under a temporary name in the output folder and renamed
  when complete; the index is written last, so an index that exists describes a complete set.
  Shards left in the folder by an earlier, longer run are not removed (a warning names them);
  the index lists only this run's.

The index: <prefix>-index.json next to the shards
  <prefix> is the shard file name before the `%d`, without trailing "-", "_", "." or spaces
  (out/train-%06d.tar -> out/train-index.json; out/%06d.tar -> out/index.json). Compact JSON:
    {"version": 1, "format": "fastdata-wds-index",
     "shards": [{"name": "train-000000.tar",        # relative to the index's folder
                 "samples": n, "bytes": size, "sha256": "<hex of the shard file>",
                 "samples_index": [[key, offset, length], ...],
                 "members": [[key, [[ext, data_offset, data_size], ...]], ...]}, ...],
     "classes": ["<class name>", ...] or null,      # null for a (path, label) list
     "total": N}
  All offsets are bytes from the start of the shard. `offset` is where the sample's first tar
  header starts and `length` the bytes of all its members (headers, data and padding): the
  slice [offset, offset + length) is the sample's members and nothing else. A member's payload
  is [data_offset, data_offset + data_size). Both lists are in tar order (the samples' order).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import numbers
import os
import re
import secrets
import sys
import tarfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from ._cli import Parser

INDEX_FORMAT = "fastdata-wds-index"
INDEX_VERSION = 1

_BLOCK = 512
_END = b"\0" * (2 * _BLOCK)  # end of archive
_CHUNK = 1 << 20
_MAX_MEMBER = 8 ** 11 - 1  # what USTAR's 11 octal digits hold (8 GiB - 1)
_CONVERSION = re.compile(r"%(0\d+)?d")
# webdataset's split of a member name into key and extension (tariterators.base_plus_ext), and
# the metadata members it skips.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def sample_key(name: str) -> str | None:
    """The key of the sample a tar member belongs to, as webdataset groups them (split at the
    first dot of the file name); None for its metadata members (__name__) and names without
    an extension, which it skips."""
    if _META.match(name) or ("/" not in name and name.startswith("__") and name.endswith("__")):
        return None
    m = _KEY_EXT.match(name)
    return m.group(1) if m else None


# ----------------------------------------------------------------- tar layout

def _padded(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _header(name: str, size: int) -> bytes:
    """The USTAR header of a regular file `name` of `size` bytes with fixed fields (mode 0644,
    uid/gid 0, empty owner names, mtime 0), written out here so that the bytes do not depend on
    the Python version's tarfile."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError(f"tar member name {name!r} is longer than USTAR's 100 bytes")
    h = bytearray(_BLOCK)
    h[0:len(raw)] = raw
    h[100:108] = _octal(0o644, 8)
    h[108:116] = _octal(0, 8)  # uid
    h[116:124] = _octal(0, 8)  # gid
    h[124:136] = _octal(size, 12)
    h[136:148] = _octal(0, 12)  # mtime
    h[148:156] = b" " * 8  # the checksum counts its own field as spaces
    h[156:157] = tarfile.REGTYPE
    h[257:265] = b"ustar\x0000"  # magic and version
    # devmajor, devminor, linkname, owner names, prefix: empty (NUL), as tarfile leaves them
    h[148:155] = b"%06o\0" % sum(h)
    assert len(h) == _BLOCK
    return bytes(h)


def _ext(path: str) -> str:
    ext = os.path.splitext(path)[1][1:].lower()
    if not ext:
        raise ValueError(f"{path} has no file extension, which its tar member would be named by (e.g. .jpg)")
    return "jpg" if ext == "jpeg" else ext


def _sample_bytes(size: int, cls_size: int) -> int:
    return 2 * _BLOCK + _padded(size) + _padded(cls_size)


# ----------------------------------------------------------------- the pattern

def _parse_pattern(pattern: Any) -> tuple[str, str, str]:
    """(folder, file name pattern, index file name) for a printf-style shard pattern."""
    if not isinstance(pattern, (str, os.PathLike)):
        raise TypeError(f"the shard pattern should be a path such as 'out/train-%06d.tar', but got {pattern!r:.100}")
    pattern = os.fspath(pattern)
    folder, name = os.path.split(pattern)
    if "{" in pattern or "}" in pattern:
        raise ValueError(f"the shard pattern {pattern!r} should number shards printf style (out/train-%06d.tar), "
                         "not with braces")
    if "%" in folder:
        raise ValueError(f"the shard pattern {pattern!r} should have its %d in the file name, not in a folder")
    found = list(_CONVERSION.finditer(name))
    if len(found) != 1 or name.replace("%%", "").count("%") != 1:
        raise ValueError(f"the shard pattern {pattern!r} should hold exactly one %d or %0Nd for the shard number "
                         "(e.g. out/train-%06d.tar)")
    if name.lower().endswith((".gz", ".tgz", ".bz2", ".xz", ".zst", ".lz4")):
        raise ValueError(f"the shard pattern {pattern!r} names compressed files, but the shards are plain tar files")
    prefix = (name[:found[0].start()].replace("%%", "%")).rstrip("-_. ")
    return folder, name, f"{prefix}-index.json" if prefix else "index.json"


def index_path(pattern: str | os.PathLike) -> Path:
    """Where `write_shards(source, pattern)` puts the index: <prefix>-index.json next to the
    shards (out/train-%06d.tar -> out/train-index.json)."""
    folder, _, index = _parse_pattern(pattern)
    return Path(folder) / index


# ----------------------------------------------------------------- writing one shard

# (samples, bytes) written so far by all workers, and its lock (set in pool workers).
_SHARED: tuple[Any, Any] | None = None


def _init_worker(counts, lock) -> None:
    global _SHARED
    _SHARED = (counts, lock)


def _shared_tick(samples: int, nbytes: int) -> None:
    if _SHARED is not None:
        counts, lock = _SHARED
        with lock:
            counts[0] += samples
            counts[1] += nbytes


def _write_shard(job: tuple, tick: Callable[[int, int], None] = _shared_tick) -> dict:
    """Writes one shard through its temporary name; returns its index entry."""
    final, tmp, samples = job
    digest = hashlib.sha256()
    samples_index, members = [], []
    offset = 0

    def put(data: bytes) -> None:
        nonlocal offset
        f.write(data)
        digest.update(data)
        offset += len(data)

    try:
        with open(tmp, "wb") as f:
            for key, path, ext, label, size in samples:
                start = offset
                put(_header(f"{key}.{ext}", size))
                data_offset = offset
                got = 0
                try:
                    with open(path, "rb") as src:
                        while chunk := src.read(_CHUNK):
                            got += len(chunk)
                            if got > size:
                                break
                            put(chunk)
                except OSError as e:
                    from .errors import DataError

                    raise DataError(f"cannot read {path}: {e.strerror or e}", path=path) from None
                if got != size:
                    from .errors import DataError

                    raise DataError(f"{path} changed size while being sharded ({size} bytes, then {got})", path=path)
                put(b"\0" * (_padded(size) - size))
                cls = b"%d" % label
                put(_header(f"{key}.cls", len(cls)))
                cls_offset = offset
                put(cls + b"\0" * (_padded(len(cls)) - len(cls)))
                samples_index.append([key, start, offset - start])
                members.append([key, [[ext, data_offset, size], ["cls", cls_offset, len(cls)]]])
                tick(1, offset - start)
            put(_END)
        tick(0, len(_END))
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return {"name": os.path.basename(final), "samples": len(samples), "bytes": offset, "sha256": digest.hexdigest(),
            "samples_index": samples_index, "members": members}


# ----------------------------------------------------------------- write_shards

def _default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may use
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"`{name}` should be an integer >= {minimum}, but got {value!r}")
    return int(value)


def parse_size(text: str | int) -> int:
    """Bytes for a size such as 1073741824, "1G", "500M", "64KiB", "1.5g" (binary units:
    1K = 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"a size should be a number of bytes, optionally with K, M, G or T (e.g. 500M), but got {text!r}")
    scale = 1024 ** " kmgt".index(m.group(2).lower() or " ")
    return int(float(m.group(1)) * scale) if "." in m.group(1) else int(m.group(1)) * scale


def _resolve_source(source: Any):
    from . import sources

    if isinstance(source, sources.Samples):
        return source
    if isinstance(source, (str, os.PathLike)):
        if os.path.isfile(source):
            raise ValueError(f"source {os.fspath(source)!r} should be a folder in ImageFolder layout "
                             "(root/<class>/<image>), but it is a file")
        return sources.image_folder(source)
    if isinstance(source, (list, tuple)):
        return sources.file_list(source)
    raise TypeError(f"the source should be an ImageFolder folder or a list of (path, label) pairs, "
                    f"but got {type(source).__name__}")


def _prepare_folder(folder: str) -> None:
    """Makes the output folder and checks that a file can be written in it."""
    where = folder or "."
    try:
        os.makedirs(where, exist_ok=True)
        probe = os.path.join(where, f".fastdata-shard-probe-{os.getpid()}-{secrets.token_hex(4)}")
        with open(probe, "wb"):
            pass
        os.unlink(probe)
    except OSError as e:
        err = OSError(f"cannot write shards in {where!r}: {e.strerror or e}")
        err.errno = e.errno
        raise err from None


def _plan(samples, max_count: int, max_size: int, order) -> list[list[tuple]]:
    """The samples of each shard: (key, path, ext, label, size) in `order`."""
    from .errors import DataError

    shards: list[list[tuple]] = []
    current: list[tuple] = []
    current_bytes = len(_END)
    labels = samples.labels.tolist()
    for i in order:
        path, label = samples.paths[i], labels[i]
        ext = _ext(path)
        try:
            size = os.stat(path).st_size
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror or e}", path=path) from None
        if size > _MAX_MEMBER:
            raise ValueError(f"{path} is {size} bytes, more than a USTAR member holds (8 GiB)")
        nbytes = _sample_bytes(size, len(b"%d" % label))
        if current and (len(current) + 1 > max_count or current_bytes + nbytes > max_size):
            shards.append(current)
            current, current_bytes = [], len(_END)
        current.append(("%08d" % i, path, ext, label, size))
        current_bytes += nbytes
    if current:
        shards.append(current)
    return shards


class _Progress:
    def __init__(self, enabled: bool, what: str, total: int) -> None:
        self.enabled, self.what, self.total = enabled, what, total
        self.start = self.last = time.monotonic()
        self.samples = self.bytes = 0

    def show(self, final: bool = False, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not (final or force) and now - self.last < 0.25:
            return
        self.last = now
        rate = self.bytes / 1e6 / max(now - self.start, 1e-6)
        print(f"\rshards {self.what}: {self.samples}/{self.total} samples, {self.bytes / 1e6:.1f} MB, {rate:.1f} MB/s",
              end="\n" if final else "", file=sys.stderr, flush=True)

    def tick(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.bytes += nbytes
        self.show()


def _run(jobs: list[tuple], workers: int, progress: _Progress) -> list[dict]:
    if workers <= 1 or len(jobs) == 1:
        return [_write_shard(job, progress.tick) for job in jobs]
    import multiprocessing

    # fork where there is one: the children need nothing imported again.
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    counts, lock = ctx.RawArray("q", 2), ctx.Lock()
    finished = threading.Event()
    failed: list[BaseException] = []
    left = [len(jobs)]

    def done(_):
        left[0] -= 1
        if not left[0]:
            finished.set()

    def error(e):
        failed.append(e)
        finished.set()

    with ctx.Pool(min(workers, len(jobs)), initializer=_init_worker, initargs=(counts, lock)) as pool:
        pending = [pool.apply_async(_write_shard, (job,), callback=done, error_callback=error) for job in jobs]
        while not finished.wait(0.1):
            with lock:
                progress.samples, progress.bytes = counts[0], counts[1]
            progress.show()
        if failed:
            raise failed[0]  # leaving the with block terminates the other workers
        results = [r.get() for r in pending]
    progress.samples, progress.bytes = counts[0], counts[1]
    return results


def _write(source: Any, pattern: Any, max_count: int, max_size: int | str, workers: int | None,
           progress: bool, shuffle: bool = True, seed: int = 0) -> tuple[Path, dict]:
    max_count = _check_int("max_count", max_count, 1)
    max_size = _check_int("max_size", parse_size(max_size) if isinstance(max_size, str) else max_size, 1)
    workers = _default_workers() if workers is None else _check_int("workers", workers, 1)
    folder, name, index_name = _parse_pattern(pattern)
    samples = _resolve_source(source)
    _prepare_folder(folder)
    seed = _check_int("seed", seed, 0)
    order = np.random.Generator(np.random.PCG64(seed)).permutation(len(samples)) if shuffle else range(len(samples))
    plan = _plan(samples, max_count, max_size, [int(i) for i in order])
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    finals = [os.path.join(folder, name % k) for k in range(len(plan))]
    index_file = os.path.join(folder, index_name)
    if index_file in finals:
        raise ValueError(f"the shard pattern {os.fspath(pattern)!r} names a shard {index_name}, the index's name")
    jobs = [(final, os.path.join(folder, f".{os.path.basename(final)}.{token}.tmp"), shard)
            for final, shard in zip(finals, plan)]
    report = _Progress(progress, os.fspath(pattern), len(samples))
    report.show(force=True)
    try:
        entries = _run(jobs, workers, report)
    except BaseException:
        for _, tmp, _ in jobs:  # what a terminated worker left
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise
    report.show(final=True)
    index = {"version": INDEX_VERSION, "format": INDEX_FORMAT, "shards": entries, "classes": samples.classes,
             "total": len(samples)}
    tmp = os.path.join(folder, f".{index_name}.{token}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(index, separators=(",", ":")) + "\n")
    os.replace(tmp, index_file)
    stale = [os.path.join(folder, name % k) for k in range(len(plan), len(plan) + 1)]
    if any(os.path.exists(p) for p in stale):
        warnings.warn(f"{stale[0]} (and maybe more) is left from an earlier run: it is not one of the {len(plan)} "
                      f"shards of this set, which {index_file} lists", stacklevel=3)
    return Path(index_file), index


def write_shards(source: Any, pattern: str | os.PathLike, *, max_count: int = 10000, max_size: int | str = 1 << 30,
                 workers: int | None = None, shuffle: bool = True, seed: int = 0, progress: bool = False) -> Path:
    """Writes `source` (an ImageFolder folder or a list of (path, label) pairs) as WebDataset
    tar shards named by `pattern` ("out/train-%06d.tar") and returns the path of their index,
    <prefix>-index.json next to them. See the module docstring for the shards' content and
    the index format.

    A shard holds at most `max_count` samples and `max_size` bytes (an int, or "500M", "1G"),
    except that a sample bigger than `max_size` gets a shard of its own. `workers` processes
    write shards in parallel (default: the usable cores); the output is byte-identical for any
    number. Samples go in the order of a permutation drawn from `seed`, or in source order with
    `shuffle=False`. `progress` prints a line on stderr (samples written / total, MB/s).

    Raises FileNotFoundError / ValueError for a bad source or pattern, OSError when the output
    folder cannot be written, fastdata.DataError when an image file cannot be read."""
    return _write(source, pattern, max_count, max_size, workers, progress, shuffle, seed)[0]


# ----------------------------------------------------------------- walking tar headers

# The extensions a sample's image member may have (the contract's).
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp")
_ZERO = bytes(_BLOCK)
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_MAX_EXTENDED = 1 << 20  # a pax or GNU long-name header bigger than this is taken as damage
_RESYNC_READ = 128 * _BLOCK


class Member(NamedTuple):
    """A regular tar member: where its headers start (a pax or GNU long-name header before its
    own included), its name, where its data starts, and its size."""

    offset: int
    name: str
    data: int
    size: int


class Damage(NamedTuple):
    """Bytes [offset, end) of a tar that hold no readable member (`end` None where the walk
    stopped there); `name` is the member's name where its damaged header still shows one."""

    offset: int
    end: int | None
    name: str | None
    cause: str


def walk_tar(read: Callable[[int, int], bytes], pos: int = 0, stop: int | None = None, length: int | None = None,
             resync: bool = True) -> Iterator[Member | Damage]:
    """The regular members of a tar from byte `pos` to `stop` (default: its end-of-archive
    blocks), from their headers alone, and Damage for bytes that hold no readable member.
    `read(p, n)` gives bytes [p, p + n) (fewer where the data ends), `p` never below a position
    already passed (a stream works); `length` is the data's size where it is known (a member
    that passes it is cut off). With `resync`, a damaged header is stepped over: the walk goes
    on at the next 512-aligned block that is a valid header; without, it stops at the damage.

    Written out here because tarfile takes a header that fails its checksum mid-archive for the
    end of the archive (TarFile.next returns None: every member after it is lost without a
    word), and its ignore_zeros mode steps over such blocks without saying where or what was
    lost. Each header is still parsed by tarfile (TarInfo.frombuf: checksum, numeric fields,
    the USTAR prefix)."""
    while stop is None or pos < stop:
        header = read(pos, _BLOCK)
        if not header:
            if pos == 0:
                yield Damage(0, 0, None, "empty file")
            return  # the end of the data (a tar cut off after a member, or without end blocks)
        if header == _ZERO:
            zeros = f"a block of zeros at byte {pos} where a tar header should be"
            if not resync:
                yield Damage(pos, None, None, zeros)
                return
            # The end of the archive, unless a header follows after something other than zeros
            # (a zeroed header: its member's data comes next). Zeros alone before a header are
            # the end blocks of concatenated archives.
            nxt, found, dirty = _resync(read, pos + _BLOCK, stop)
            if not found:
                return
            if dirty:
                yield Damage(pos, nxt, None, zeros)
            pos = nxt
            continue
        item, after = _member(read, pos, header, length)
        if type(item) is Damage:
            if not resync or after is None:  # (after None: the data ends in it)
                yield item
                return
            nxt, found, _ = _resync(read, after, stop)
            yield item._replace(end=nxt)
            if not found:
                return
            pos = nxt
            continue
        if item is not None:
            yield item
        pos = after


def _member(read, pos: int, header: bytes, length: int | None) -> tuple[Member | Damage | None, int | None]:
    """(the member whose headers start at `pos` (None for a directory, link and the like) or
    its Damage, the position after it: None where the data ends inside it)."""
    first, name, size = pos, None, None
    while True:
        if len(header) < _BLOCK:
            return Damage(first, pos + len(header), _shown_name(header) or name,
                          f"the shard is cut off in a tar header at byte {pos}"), None
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            if info.size < 0:
                raise tarfile.InvalidHeaderError("negative size")
        except tarfile.HeaderError as e:
            return Damage(first, None, _shown_name(header) or name, f"invalid tar header at byte {pos} ({e})"), pos + _BLOCK
        if info.type not in _EXTENDED:
            break
        # pax and GNU long-name headers: their data names (and sizes) the member that follows
        if info.size > _MAX_EXTENDED:
            return Damage(first, None, name, f"invalid tar header at byte {pos} (a {info.size}-byte extended header)"), \
                pos + _BLOCK
        payload = read(pos + _BLOCK, info.size)
        if len(payload) < info.size:
            return Damage(first, pos + _BLOCK + len(payload), name,
                          f"the shard is cut off in a tar header at byte {pos}"), None
        try:
            if info.type == tarfile.GNUTYPE_LONGNAME:
                name = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                name, size = _pax(payload, name, size)
        except ValueError as e:
            return Damage(first, None, name, f"invalid pax header at byte {pos} ({e})"), pos + _BLOCK
        pos += _BLOCK + _padded(info.size)
        header = read(pos, _BLOCK)
    name = info.name if name is None else name
    size = info.size if size is None else size
    data = pos + _BLOCK
    if info.type == tarfile.GNUTYPE_SPARSE:
        return Damage(first, None, name, f"member {name} at byte {first} is a GNU sparse file"), data
    if info.type not in _REGULAR and info.type in tarfile.SUPPORTED_TYPES:
        return None, data  # a directory, link, device or fifo: no data follows (as tarfile reads them)
    if length is not None and data + size > length:
        return Damage(first, length, name, f"the shard is cut off in member {name} (at byte {length - data} of its "
                                           f"{size})"), None
    return (Member(first, name, data, size) if info.type in _REGULAR else None), data + _padded(size)


def _pax(payload: bytes, name: str | None, size: int | None) -> tuple[str | None, int | None]:
    """The path and size a pax header's records ("<length> <key>=<value>\\n") give."""
    at = 0
    while at < len(payload) and payload[at]:
        space = payload.index(b" ", at)
        n = int(payload[at:space])
        if n <= space - at or at + n > len(payload):
            raise ValueError(f"a record of {n} bytes at {at}")
        key, _, value = payload[space + 1:at + n - 1].partition(b"=")
        if key == b"path":
            name = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            size = int(value)
            if size < 0:
                raise ValueError("a negative size")
        at += n
    return name, size


def _resync(read, pos: int, stop: int | None) -> tuple[int, bool, bool]:
    """(where the next 512-aligned valid header from `pos` is, or where the data or `stop`
    ends; whether one was found; whether anything but zero blocks came before it)."""
    dirty = False
    while stop is None or pos < stop:
        n = _RESYNC_READ if stop is None else min(_RESYNC_READ, stop - pos)
        chunk = read(pos, n)
        for k in range(0, len(chunk) - _BLOCK + 1, _BLOCK):
            block = chunk[k:k + _BLOCK]
            if block == _ZERO:
                continue
            try:
                tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                dirty = True
                continue
            return pos + k, True, dirty
        if len(chunk) < n:
            return pos + len(chunk), False, dirty or any(chunk[len(chunk) - len(chunk) % _BLOCK:])
        pos += n
    return pos, False, dirty


def _shown_name(header: bytes) -> str | None:
    """The member name a damaged header still shows: its name field, where that is printable
    UTF-8 that names a sample member (key.ext); else None."""
    raw = header[:100]
    if b"\0" not in raw and len(raw) < 100:
        return None
    try:
        name = raw.split(b"\0", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if name.isprintable() and sample_key(name) is not None else None


class Scan(NamedTuple):
    """The samples of a tar from its headers: keys[i] is in bytes [spans[i, 0], spans[i, 0] +
    spans[i, 1]) and has contents[i] = (members, payload bytes), (-1, -1) for damaged bytes
    that are a sample of their own; `damage` lists the damaged bytes found."""

    keys: list[str]
    spans: np.ndarray
    contents: np.ndarray
    damage: list[Damage]

    @property
    def has_members(self) -> bool:
        """Whether any valid member was found (a file of damage alone is not a tar)."""
        return bool((self.contents[:, 0] >= 0).any())


def _reader(f) -> Callable[[int, int], bytes]:
    """read(pos, n) over a binary file: seek and read where it can seek, else read on (a pipe, an
    HTTP response), discarding what lies before `pos`."""
    if getattr(f, "seekable", lambda: False)():
        def read(pos: int, n: int) -> bytes:
            f.seek(pos)
            return f.read(n)

        return read
    at = [0]
    kept = [0, b""]  # the last bytes read from the stream and where they start: _resync reads
    # ahead, and the walk then goes back to the header it found in them

    def read_on(pos: int, n: int) -> bytes:
        head = b""
        if pos < at[0]:
            start, data = kept
            if pos < start:
                raise ValueError(f"a tar stream read at byte {pos}, after it passed byte {start}")
            head = data[pos - start:pos - start + n]
            pos, n = pos + len(head), n - len(head)
            if not n or pos < at[0]:
                return head
        while at[0] < pos:
            skipped = f.read(min(pos - at[0], _CHUNK))
            if not skipped:
                return head
            at[0] += len(skipped)
        parts, got = [], 0
        while got < n:
            part = f.read(n - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
        data = b"".join(parts)
        kept[0], kept[1] = at[0], data
        at[0] += got
        return head + data

    return read_on


def scan_tar(f, length: int | None = None) -> Scan:
    """The samples of the tar read from `f` (`length`: its size where known), grouped as
    webdataset groups them (consecutive members with one key), from the headers alone: a
    seekable file is read header by header.

    Damaged bytes (a header that fails its checksum, a zeroed one, a cut-off end) are stepped
    over (walk_tar) and joined to the sample they most likely belong to, so that what they
    lost is counted once, as that sample, when it is read: the sample whose key the damaged
    header still shows; else a neighbour left without its image or cls member by the loss (the
    one before, then the one after); else they are a sample of their own. A member cut off by
    the end of a stream (unknown length) keeps its sample with the length its header gives:
    reading it fails there, and names the member."""
    items: list = []  # [key, start, end, members, payload bytes, extensions], and Damage
    for event in walk_tar(_reader(f), 0, None, length):
        if type(event) is Damage:
            items.append(event)
            continue
        key = sample_key(event.name)
        if key is None:
            continue
        ext = event.name[len(key) + 1:].lower()
        end = event.data + _padded(event.size)
        last = items[-1] if items else None
        if type(last) is list and last[0] == key:
            last[2] = end
            last[3] += 1
            last[4] += event.size
            last[5].add(ext)
        else:
            items.append([key, event.offset, end, 1, event.size, {ext}])
    damage = [d for d in items if type(d) is Damage]
    groups = _place_damage(items) if damage else items
    keys = [g[0] for g in groups]
    spans = np.array([(g[1], g[2] - g[1]) for g in groups], dtype=np.int64).reshape(-1, 2)
    contents = np.array([(g[3], g[4]) for g in groups], dtype=np.int64).reshape(-1, 2)
    return Scan(keys, spans, contents, damage)


def _place_damage(items: list) -> list:
    """The samples with each damaged region joined to one (see scan_tar)."""

    def complete(g: list) -> bool:
        return "cls" in g[5] and any(e in g[5] for e in IMAGE_MEMBERS)

    out: list = []
    for j, item in enumerate(items):
        if type(item) is not Damage:
            out.append(item)
            continue
        prev = out[-1] if out and out[-1][3] >= 0 and out[-1][2] == item.offset else None
        after = items[j + 1] if j + 1 < len(items) else None
        nxt = after if type(after) is list and after[1] == item.end else None
        key = sample_key(item.name) if item.name else None
        if prev is not None and nxt is not None and prev[0] == nxt[0]:
            target = prev  # one sample on both sides: joined again below
        elif key is not None:
            target = prev if prev is not None and prev[0] == key else nxt if nxt is not None and nxt[0] == key else None
        else:
            target = prev if prev is not None and not complete(prev) else \
                nxt if nxt is not None and not complete(nxt) else None
        if target is not None and target is prev:
            prev[2] = item.end
        elif target is not None:
            nxt[1] = item.offset
        else:
            out.append([key or "", item.offset, item.end, -1, -1, set()])
    joined: list = []
    for g in out:
        last = joined[-1] if joined else None
        if last is not None and last[0] == g[0] and last[2] == g[1] and min(last[3], g[3]) >= 0:
            last[2] = g[2]
            last[3] += g[3]
            last[4] += g[4]
            last[5] |= g[5]
        else:
            joined.append(g)
    return joined


# ----------------------------------------------------------------- reading

def read_index(path: str | os.PathLike) -> dict:
    """The index written by write_shards (its "name"s are relative to the index's folder),
    checked for its format and version."""
    path = os.fspath(path)
    try:
        with open(path) as f:
            index = json.load(f)
    except ValueError as e:
        raise ValueError(f"{path} is not a JSON shard index: {e}") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise ValueError(f"{path} is not a {INDEX_FORMAT} file")
    if index.get("version") != INDEX_VERSION:
        raise ValueError(f"{path} is a {INDEX_FORMAT} of version {index.get('version')!r}; "
                         f"this fastdata reads version {INDEX_VERSION}")
    shards = index.get("shards")
    if not isinstance(shards, list) or index.get("total") != sum(s.get("samples", 0) for s in shards):
        raise ValueError(f"{path}: the shards' sample counts do not add up to its total")
    return index


def count_samples(tar_path: str | os.PathLike) -> int:
    """The number of samples in a tar shard as webdataset groups them: regular members, less
    webdataset's __metadata__ ones, split into key and extension at the first dot of the file
    name, with consecutive members of one key making a sample. Reads the headers only,
    seeking over the data (a gzip, bzip2 or xz tar is decompressed as a stream). A damaged
    header is stepped over as the loader's scan does (`scan_tar`), so the count is the
    loader's: a damaged region counts as the sample it is joined to (or as one of its own).
    Raises fastdata.DataError for a file that is not a tar."""
    import bz2
    import gzip
    import lzma

    from .errors import DataError

    path = os.fspath(tar_path)
    with open(path, "rb") as raw:
        magic = raw.read(6)
        raw.seek(0)
        opener = {b"\x1f\x8b": lambda f: gzip.GzipFile(fileobj=f), b"BZh": bz2.BZ2File, b"\xfd7zXZ": lzma.LZMAFile}
        kind = next((k for k in opener if magic.startswith(k)), None)
        try:
            if kind is None:
                scan = scan_tar(raw, os.fstat(raw.fileno()).st_size)
            else:
                with opener[kind](raw) as f:
                    scan = scan_tar(f)
        except (OSError, EOFError, lzma.LZMAError) as e:  # a corrupt compressed stream
            raise DataError(f"cannot read shard {path}: {e}".replace("\n", " "), path=path) from None
    if scan.damage and not scan.has_members:
        raise DataError(f"cannot read shard {path}: not a tar file ({scan.damage[0].cause})", path=path)
    return len(scan.keys)


# ----------------------------------------------------------------- CLI

def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be an integer >= 1, but got {text!r}")
    return value


def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be at least 1 byte, but got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="fastdata-shard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", metavar="SRC", help="a folder in ImageFolder layout (SRC/<class>/<image>)")
    ap.add_argument("pattern", metavar="OUT_PATTERN", help="shard names, printf style: out/train-%%06d.tar")
    ap.add_argument("--max-count", type=_positive, default=10000, metavar="N",
                    help="samples per shard, at most (default 10000)")
    ap.add_argument("--max-size", type=_size, default=1 << 30, metavar="BYTES",
                    help="bytes per shard, at most: 1073741824, 500M, 1G (binary units; default 1G)")
    ap.add_argument("--workers", type=_positive, default=None, metavar="N",
                    help="processes writing shards (default: the usable cores)")
    ap.add_argument("--no-shuffle", action="store_true", help="keep the source order (default: a shuffled order)")
    ap.add_argument("--seed", type=int, default=0, help="the shuffled order's seed (default 0)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")
    args = ap.parse_args(argv)

    from .errors import DataError

    t = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path, index = _write(args.src, args.pattern, args.max_count, args.max_size, args.workers,
                                 progress=not args.quiet, shuffle=not args.no_shuffle, seed=args.seed)
    except (OSError, ValueError, DataError) as e:
        print(f"{ap.prog}: error: {e}".replace("\n", " "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{ap.prog}: interrupted", file=sys.stderr)
        return 130
    for w in caught:
        print(f"{ap.prog}: warning: {w.message}", file=sys.stderr)
    nbytes = sum(s["bytes"] for s in index["shards"])
    print(f"{len(index['shards'])} shards, {index['total']} samples, {nbytes} bytes ({nbytes / 1e6:.1f} MB) "
          f"in {time.perf_counter() - t:.1f} s")
    print(f"index: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
