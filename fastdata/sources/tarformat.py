"""The shard format, which the reader (`fastdata.sources`) and the writer (`fastdata.shard`)
share: where a set's index is and how it is read (its layout: `fastdata.shard`'s docstring);
webdataset's rule for which sample a tar member belongs to; a walk over tar headers that says
what damage it steps over; and the samples of a tar counted from its headers alone. Over 400
lines: the tar walk, and the scan and count built on it, are one format kept in one place.

Imports nothing of fastdata but its errors, the native extension and `compressed`, so that
both sides can import it.
"""

from __future__ import annotations

import array
import contextlib
import errno
import gc
import itertools
import json
import lzma
import os
import re
import stat
import tarfile
import zlib
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from .._ext import native
from ..errors import DataError, error_line
from .compressed import COMPRESSED_HEAD, compression, decompressing
from .streams import open_file

INDEX_FORMAT = "fastdata-wds-index"
INDEX_VERSION = 1

BLOCK = 512  # tar headers and padded member data come in blocks of this size
# The extensions a sample's image member may have: webdataset's names of the formats fastdata
# decodes from a folder (`_pillow.FORMATS`: the decoder goes by content, not by this name), the
# first one a sample has in this order being its image.
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "pbm", "pnm", "tif", "tiff", "gif")

_ZERO = bytes(BLOCK)
_EXTENDED = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
             tarfile.SOLARIS_XHDTYPE)
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
_LINKS = (tarfile.LNKTYPE, tarfile.SYMTYPE)
_MAX_EXTENDED = 1 << 20  # a pax or GNU long-name header bigger than this is taken as damage, and so
# are a member's extended headers that come to more than _MAX_EXTENDED_RUN (writers put a few
# before a member: a global pax header, a pax header, or GNU's long name and long link): an
# endless run of them is steps of damage, each bounded
_MAX_EXTENDED_RUN = 4 << 20
MAX_INDEX_BYTES = 1 << 30  # a bigger shard index is refused unread (fastdata shard writes ~100 bytes a sample)
# What a stream (HTTP, pipe:, a compressed tar) is scanned for at most: its length is not known
# beforehand, and an endless one would otherwise be read, and its samples kept, forever.
MAX_STREAM_SAMPLES = 1_000_000
MAX_STREAM_BYTES = 1 << 36
# The keys one scan keeps, in characters (a Python string takes 1 to 4 bytes a character): an
# honest shard's come to a few MB (webdataset's keys are paths), where names of up to
# _MAX_NAME characters would make a listing of GBs.
MAX_SCAN_KEY_CHARS = 1 << 27
# A stream with no valid header in this many bytes after its end blocks or after damage is taken
# to end there: an honest gap is at most one member's data (a sample is at most 256 MiB,
# `image.read.MAX_FILE_BYTES`), where zeros served without end would be read to MAX_STREAM_BYTES.
_MAX_STREAM_GAP = 1 << 28
_MAX_NAME = 4096  # a longer member name (Linux's PATH_MAX) is taken as damage: it would fill every message naming it
_RESYNC_READ = 128 * BLOCK
_SKIP_READ = 1 << 20  # a stream is read past unwanted bytes in pieces of at most this
# A numeric header field as every tar writer fills it: octal digits, padded with spaces or NULs.
_OCTAL = re.compile(rb"[ ]*[0-7]*[ \0]*")
_NUMERIC = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156), (329, 337), (337, 345))
# webdataset's split of a member name into key and extension (tariterators.base_plus_ext), and
# the metadata members it skips.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(r"__[^/]*__($|/)")


def padded(n: int) -> int:
    """`n` bytes of member data rounded up to whole blocks, as a tar stores them."""
    return -(-n // BLOCK) * BLOCK


# ----------------------------------------------------------------- the index

def index_name(prefix: str) -> str:
    """The file name of the index of shards whose names start with `prefix` (the part before
    the shard number): <prefix>-index.json, `prefix` without trailing "-", "_", "." or spaces;
    index.json where nothing is left of it."""
    prefix = prefix.rstrip("-_. ")
    return f"{prefix}-index.json" if prefix else "index.json"


def index_location(url: str) -> str:
    """Where the index fastdata-shard writes for the shard `url` would be: next to it, named by
    the shard's name before its number (.../train-000003.tar -> .../train-index.json)."""
    head, _, name = url.rpartition("/")
    suffix = next((x for x in SHARD_SUFFIXES if name.endswith(x)), "")
    stem = name[: len(name) - len(suffix)]
    index = index_name(stem.rstrip("0123456789"))
    return f"{head}/{index}" if head else index


def check_index_size(nbytes: int, where: str) -> None:
    """ValueError "the shard index <where> is malformed: it is over 1 GiB ..." for an index of
    more than MAX_INDEX_BYTES: checked from a file's size before it is read, or from a read of
    at most MAX_INDEX_BYTES + 1 bytes."""
    if nbytes > MAX_INDEX_BYTES:
        raise ValueError(f"the shard index {where} is malformed: it is over {MAX_INDEX_BYTES >> 30} GiB (about 10 "
                         "million samples): index the dataset in parts, or remove the index to have the shards scanned")


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while millions of lists are made that can hold no
    cycle (an index parsed, its entries listed): with it on, every few hundred new lists start
    a collection, and the older generations it scans hold the index parsed so far, again and
    again. It is turned on again afterwards only where it was on before."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def parse_index(data: bytes, where: str) -> Any:
    """The JSON of an index's bytes: ValueError "the shard index <where> is malformed: <cause>"
    when it is not JSON, over MAX_INDEX_BYTES, or denser in lists and objects than an index is.
    Parsed, an index takes about 9 times its bytes (one list or object in 19 bytes, as `fastdata
    shard` writes them); a list costs 56 bytes however short, so 1 GiB of `[],` would take 22
    GiB. One in 8 bytes at most keeps any index near a real one's cost (12 times its bytes)."""
    check_index_size(len(data), where)
    containers = data.count(b"[") + data.count(b"{")  # brackets inside strings too: an upper bound
    if containers > len(data) // 8 + 64:
        raise ValueError(f"the shard index {where} is malformed: it holds {containers} lists or objects in "
                         f"{len(data)} bytes, more than an index has (one in 19 bytes)")
    try:
        with collection_paused():
            return json.loads(data)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; nesting past the stack
        raise ValueError(f"the shard index {where} is malformed: it is not JSON ({type(e).__name__}: {e})") from None


class ForeignIndex(ValueError):
    """A file where a shard index would be that is JSON of another kind: its format is not
    INDEX_FORMAT (`index.json` beside shards named 000000.tar may be a dataset's own)."""


def read_index(path: str | os.PathLike) -> dict:
    """The index written by write_shards (its "name"s are relative to the index's folder),
    checked for its format, version and counts: ValueError "the shard index <path> is
    malformed: <cause>" for anything else (another version says so). It is opened without
    blocking and checked to be a regular file before it is read: a FIFO named like the index
    would wait for a writer forever, a link to /dev/zero never end."""
    path = os.fspath(path)
    malformed = f"the shard index {path} is malformed"
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{malformed}: it is not a regular file")
        check_index_size(st.st_size, path)  # before a byte is read: a sparse file claims any size
        index = parse_index(f.read(MAX_INDEX_BYTES + 1), path)  # capped too: the file may have grown
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise ForeignIndex(f"{malformed}: it is not a {INDEX_FORMAT} file")
    if index.get("version") != INDEX_VERSION:
        raise ValueError(f"{path} is a {INDEX_FORMAT} of version {index.get('version')!r:.50}; "
                         f"this fastdata reads version {INDEX_VERSION}")
    shards = index.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise ValueError(f"{malformed}: its shards should be a list of objects")
    counts = [s.get("samples", 0) for s in shards]
    bad = [n for n in counts if type(n) is not int or n < 0]
    if bad:
        raise ValueError(f"{malformed}: its shards' sample counts should be integers >= 0, but one is {bad[0]!r:.50}")
    if index.get("total") != sum(counts):
        raise ValueError(f"{malformed}: the shards' sample counts do not add up to its total")
    return index


def index_entry(entry: Any, where: str) -> tuple[str, int, list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(name, bytes, keys, spans, contents, checksums) of a shard's entry in an index, checked
    for its types: ValueError naming the index and the entry where it is malformed."""
    try:
        name, nbytes, rows = entry["name"], entry["bytes"], entry["samples_index"]
        if not isinstance(name, str) or type(nbytes) is not int or not isinstance(rows, list):
            raise TypeError("name, bytes or samples_index of the wrong type")
        if not 0 <= nbytes < 2**62:  # so that no sum of offsets and lengths checked against it overflows
            raise ValueError(f"a shard of {nbytes} bytes")
        keys = [r[0] for r in rows]
        offsets, lengths = _integers([r[1] for r in rows]), _integers([r[2] for r in rows])
        if offsets is None or lengths is None or not set(map(type, keys)) <= {str} or "" in keys:
            raise TypeError("samples_index should hold [key, offset, length] rows")
        spans = np.stack([offsets, lengths], axis=1)
        members = entry.get("members")
        if members is None:
            contents = np.full((len(keys), 2), -1, dtype=np.int64)
        else:
            if not isinstance(members, list) or [m[0] for m in members] != keys:
                raise ValueError("its members list other samples than its samples_index")
            contents = _contents(members, nbytes)
        crcs = entry.get("crc32")
        if crcs is None:
            checksums = np.full(len(keys), -1, dtype=np.int64)
        else:
            checksums = _integers(crcs, 0, 2**32)
            if checksums is None or len(checksums) != len(keys):
                raise ValueError("its crc32 list should hold a 32-bit integer for each sample of its samples_index")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        shown = entry.get("name") if isinstance(entry, dict) else None
        raise ValueError(f"the shard index {where} is malformed: its entry for {shown!r:.100} "
                         f"({error_line(e)})") from None
    return name, nbytes, keys, spans, contents, checksums


def _integers(values: Any, low: int = -2**63, high: int = 2**63) -> np.ndarray | None:
    """A list of ints, each in [low, high), as int64; None for anything else (a bool, a float,
    a value out of range, not a list)."""
    if not isinstance(values, list) or not set(map(type, values)) <= {int}:
        return None
    array = np.array(values) if values else np.zeros(0, np.int64)
    if array.dtype != np.int64 or (len(array) and (array.min() < low or array.max() >= high)):
        return None  # (a value past int64 makes an object or uint64 array)
    return array


def _contents(members: list, nbytes: int) -> np.ndarray:
    """[member count, payload bytes] of each sample's row [key, [[ext, offset, size], ...]] in an
    index's members. Each size is at most the shard's `nbytes` (< 2**62), and a sample whose
    sizes add up to more is refused from their sums in float64 first, so that no int64 sum can
    wrap."""
    lists = [m[1] for m in members]
    if not set(map(type, lists)) <= {list}:
        raise TypeError("members should hold [key, [[ext, offset, size], ...]] rows")
    counts = np.array([len(x) for x in lists], dtype=np.int64)
    sizes = _integers([x[2] for row in lists for x in row], 0, nbytes + 1)
    if sizes is None:
        raise TypeError("members should hold [key, [[ext, offset, size], ...]] rows, each size at most the shard's")
    sums = np.zeros(len(lists), dtype=np.int64)
    filled = counts > 0
    if filled.any():
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])[filled]
        if (np.add.reduceat(sizes.astype(np.float64), starts) > nbytes).any():
            raise ValueError("a sample's members come to more bytes than its shard")
        sums[filled] = np.add.reduceat(sizes, starts)
    return np.stack([counts, sums], axis=1)


# ----------------------------------------------------------------- the tar key rule

def split_name(name: str) -> tuple[str, str] | None:
    """(key, extension) of a tar member's name as webdataset splits it: at the first dot of the
    file name, the key being the sample it belongs to (the extension is lowercased, as the
    readers match it); None for webdataset's metadata members (__name__) and names without an
    extension, which it skips."""
    if _META.match(name) or ("/" not in name and name.startswith("__") and name.endswith("__")):
        return None
    m = _KEY_EXT.match(name)
    return (m.group(1), m.group(2).lower()) if m else None


def sample_key(name: str) -> str | None:
    """The key of the sample a tar member belongs to (`split_name`), or None for a member that
    belongs to none."""
    split = split_name(name)
    return split[0] if split else None


# ----------------------------------------------------------------- walking tar headers

class Member(NamedTuple):
    """A regular tar member, or a link: where its headers start (a pax or GNU long-name header
    before its own included), its name, where its data starts, and its size; for a hard or
    symbolic link (no data: size 0), what it is, as a sample's error says it ("a hard link to
    s0.jpg"), else None."""

    offset: int
    name: str
    data: int
    size: int
    link: str | None = None


class Damage(NamedTuple):
    """Bytes [offset, end) of a tar that hold no readable member (`end` None where the walk
    stopped there); `name` is the member's name where its damaged header still shows one."""

    offset: int
    end: int | None
    name: str | None
    cause: str


def walk_tar(read: Callable[[int, int], bytes], pos: int = 0, stop: int | None = None, length: int | None = None,
             resync: bool = True) -> Iterator[Member | Damage]:
    """The regular members and links of a tar from byte `pos` to `stop` (default: its
    end-of-archive blocks), from their headers alone, and Damage for bytes that hold no readable
    member.
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
        if stop is None and length is None and pos > MAX_STREAM_BYTES:
            raise _too_long()  # (headers that give no event, directories' and devices', count too)
        header = read(pos, BLOCK)
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
            nxt, found, dirty = _resync(read, pos + BLOCK, stop, length)
            if not found:
                return
            if dirty:
                yield Damage(pos, nxt, None, zeros)
            pos = nxt
            continue
        item, after = _member(read, pos, header, length, resync)
        if type(item) is Damage:
            if not resync or after is None:  # (after None: the data ends in it)
                yield item
                return
            nxt, found, _ = _resync(read, after, stop, length)
            yield item._replace(end=nxt)
            if not found:
                return
            pos = nxt
            continue
        if item is not None:
            yield item
        pos = after


def walk_tar_bytes(raw: memoryview | bytes, start: int, pos: int, stop: int,
                   resync: bool = True) -> Iterator[Member | Damage]:
    """walk_tar over bytes [pos, stop) of a tar whose bytes from `start` on are all in `raw`:
    the same members and damage, the plain regular members' headers parsed natively where the
    extension is built (csrc/tar.cpp: a shard holds two headers an image), the rest here."""
    if native is not None:
        found, pos = native.tar_plain_members(raw, start, pos, stop)
        yield from itertools.starmap(Member, found)  # (Member._make takes no default: `link` None)
    if pos < stop:
        yield from walk_tar(lambda p, n: bytes(raw[p - start:p - start + n]), pos, stop, start + len(raw), resync)


class _Header(NamedTuple):
    name: str
    size: int
    type: bytes


def _plain_header(header: bytes) -> _Header | None:
    """A regular file's header (type "0", every numeric field plain octal, the unsigned
    checksum right) parsed as TarInfo.frombuf parses it, at a fraction of its cost (shards hold
    two headers an image, and frombuf parses every field); None for anything else, which
    frombuf then decides."""
    if header[156:157] != tarfile.REGTYPE:
        return None
    for a, b in _NUMERIC:
        if _OCTAL.fullmatch(header, a, b) is None:
            return None
    checksum = header[148:156].split(b"\0", 1)[0].strip()
    if int(checksum or b"0", 8) != 256 + sum(header) - sum(header[148:156]):
        return None
    size = header[124:136].split(b"\0", 1)[0].strip()
    name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    prefix = header[345:500].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
    return _Header(prefix + "/" + name if prefix else name, int(size or b"0", 8), tarfile.REGTYPE)


def _member(read, pos: int, header: bytes, length: int | None,
            look: bool = True) -> tuple[Member | Damage | None, int | None]:
    """(the member or link whose headers start at `pos` (None for a directory, device or fifo)
    or its Damage, the position after it: None where the data ends inside it). A member that runs
    past `length` is looked past, with `look`, for a header after it (a walk that resyncs: one
    that stops there, as a sample's read does, need not read on)."""
    first, name, size, link = pos, None, None, None
    while True:
        if len(header) < BLOCK:
            return Damage(first, pos + len(header), _shown_name(header) or name,
                          f"the shard is cut off in a tar header at byte {pos}"), None
        info = _plain_header(header)
        if info is not None:
            break
        try:
            info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
            if info.size < 0:
                raise tarfile.InvalidHeaderError("negative size")
        except tarfile.HeaderError as e:
            return Damage(first, None, _shown_name(header) or name, f"invalid tar header at byte {pos} ({e})"), pos + BLOCK
        if info.type not in _EXTENDED:
            break
        # pax and GNU long-name headers: their data names (and sizes) the member that follows, or
        # what a link member links to
        if info.size > _MAX_EXTENDED:
            return Damage(first, None, name, f"invalid tar header at byte {pos} (a {info.size}-byte extended header)"), \
                pos + BLOCK
        payload = read(pos + BLOCK, info.size)
        if len(payload) < info.size:
            return Damage(first, pos + BLOCK + len(payload), name,
                          f"the shard is cut off in a tar header at byte {pos}"), None
        try:
            if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                text = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                name, link = (text, link) if info.type == tarfile.GNUTYPE_LONGNAME else (name, text)
            elif info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                name, size, link = _pax(payload, name, size, link)
        except ValueError as e:
            return Damage(first, None, name, f"invalid pax header at byte {pos} ({e})"), pos + BLOCK
        if name is not None and len(name) > _MAX_NAME:
            return Damage(first, None, None, f"invalid tar header at byte {pos} (a member name of {len(name)} "
                                             f"characters, more than the {_MAX_NAME} of a path)"), pos + BLOCK
        pos += BLOCK + padded(info.size)
        if pos - first > _MAX_EXTENDED_RUN:
            return Damage(first, None, name, f"invalid tar header at byte {first} (extended headers of more than "
                                             f"{_MAX_EXTENDED_RUN} bytes before a member)"), pos
        header = read(pos, BLOCK)
    name = info.name if name is None else name
    size = info.size if size is None else size
    data = pos + BLOCK
    if info.type == tarfile.GNUTYPE_SPARSE:
        return Damage(first, None, name, f"member {name} at byte {first} is a GNU sparse file"), data
    if info.type in _LINKS:
        # No data follows, and webdataset (tarfile) reads none: a link is a member of its sample
        # with no bytes, so that a sample left without its image or label by one says so.
        kind = "hard" if info.type == tarfile.LNKTYPE else "symbolic"
        target = link if link is not None and len(link) <= _MAX_NAME else info.linkname
        return Member(first, name, data, 0, f"a {kind} link to {target}"), data
    if info.type not in _REGULAR and info.type in tarfile.SUPPORTED_TYPES:
        return None, data  # a directory, device or fifo: no data follows (as tarfile reads them)
    if length is not None and data + size > length:
        # Cut off, or a size no member of this tar can have: which, the headers after it say.
        if not (look and _resync(read, data, None, length)[1]):
            return Damage(first, length, name, f"the shard is cut off in member {name} (at byte {length - data} of "
                                               f"its {size})"), None
        return Damage(first, None, name, f"invalid tar header at byte {first} (member {name} of {size} bytes, "
                                         f"past the shard's end at byte {length}, and tar headers after it)"), data
    if length is None and data + size > MAX_STREAM_BYTES:  # no stream is read that far (scan_tar)
        return Damage(first, None, name, f"invalid tar header at byte {first} (member {name} of {size} bytes, "
                                         f"more than a stream is read for)"), data
    return (Member(first, name, data, size) if info.type in _REGULAR else None), data + padded(size)


def _pax(payload: bytes, name: str | None, size: int | None,
         link: str | None) -> tuple[str | None, int | None, str | None]:
    """The path, size and link path a pax header's records ("<length> <key>=<value>\\n") give."""
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
        elif key == b"linkpath":
            link = value.decode("utf-8", "surrogateescape")
        at += n
    return name, size, link


def _resync(read, pos: int, stop: int | None, length: int | None = None) -> tuple[int, bool, bool]:
    """(where the next 512-aligned valid header from `pos` is, or where the data or `stop`
    ends; whether one was found; whether anything but zero blocks came before it). In a stream
    (no `stop`, no `length`) it reads at most to MAX_STREAM_BYTES, as scan_tar does, and
    _MAX_STREAM_GAP bytes from `pos`."""
    dirty, start = False, pos
    data_from = getattr(read, "data_from", None)
    while stop is None or pos < stop:
        if stop is None and length is None:
            if pos > MAX_STREAM_BYTES:
                raise _too_long()
            if pos - start > _MAX_STREAM_GAP:
                return pos, False, dirty
        if data_from is not None:  # (holes are zero blocks, which hold no header)
            pos = data_from(pos) if stop is None else min(stop, data_from(pos))
            if stop is not None and pos >= stop:
                break
        n = _RESYNC_READ if stop is None else min(_RESYNC_READ, stop - pos)
        chunk = read(pos, n)
        for k in range(0, len(chunk) - BLOCK + 1, BLOCK):
            block = chunk[k:k + BLOCK]
            if block == _ZERO:
                continue
            try:
                tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError:
                dirty = True
                continue
            return pos + k, True, dirty
        if len(chunk) < n:
            return pos + len(chunk), False, dirty or any(chunk[len(chunk) - len(chunk) % BLOCK:])
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
    compressed: bool = False  # read through a decompressor: its offsets are the decompressed tar's
    failed: str | None = None  # why the stream ended before the tar's end (decompression failed, or a cut)

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

        try:
            fd = f.fileno()
        except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both of the last two)
            fd = None
        if fd is not None and hasattr(os, "SEEK_DATA"):
            read.data_from = lambda pos: _data_from(fd, pos)
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
            skipped = f.read(min(pos - at[0], _SKIP_READ))
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
        data = head + b"".join(parts)  # (kept from where this read began: _resync may come back to it)
        kept[0], kept[1] = at[0] - len(head), data
        at[0] += got
        return data

    read_on.reached = lambda: at[0]  # how far the stream has been read (its end, once a read came short)
    return read_on


def _data_from(fd: int, pos: int) -> int:
    """The first block boundary at or after `pos` from which the file has data: a sparse file's
    holes (zeros that take no disk, made by a seek or `truncate -s` past the end) stepped over,
    so that looking for the next header costs what the file holds on disk, not the gigabytes it
    says it has. The file's end where only holes follow; `pos` where the file system cannot say.
    The descriptor's offset is put back (a buffered reader may count on it)."""
    try:
        here = os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return pos
    try:
        at = os.lseek(fd, pos, os.SEEK_DATA)
    except OSError as e:
        at = os.fstat(fd).st_size if e.errno == errno.ENXIO else pos  # ENXIO: no data from pos on
    finally:
        os.lseek(fd, here, os.SEEK_SET)
    return max(pos, pos + (at - pos) // BLOCK * BLOCK)


class StreamTooLong(ValueError):
    """A stream scanned without a known length passed MAX_STREAM_SAMPLES or MAX_STREAM_BYTES,
    or a tar's keys MAX_SCAN_KEY_CHARS."""


def _too_long() -> StreamTooLong:
    return StreamTooLong(f"a stream scanned without an index may hold {MAX_STREAM_SAMPLES:,} samples and "
                         f"{MAX_STREAM_BYTES >> 30} GiB at most, and this one goes on past that; split it")


def scan_tar(f, length: int | None = None) -> Scan:
    """The samples of the tar read from `f` (`length`: its size where known), grouped as
    webdataset groups them (consecutive members with one key), from the headers alone: a
    seekable file is read header by header. A hard or symbolic link is a member of its sample
    with no bytes (webdataset reads no link): a sample of links alone is listed, and fails
    naming them when read, where webdataset would drop it without a word.

    Damaged bytes (a header that fails its checksum, a zeroed one, a cut-off end) are stepped
    over (walk_tar) and joined to the sample they most likely belong to, so that what they
    lost is counted once, as that sample, when it is read: the sample whose key the damaged
    header still shows; else a neighbour left without its image or cls member by the loss (the
    one before, then the one after); else they are a sample of their own. A member cut off by
    the end of a stream (unknown length) keeps its sample with the length its header gives:
    reading it fails there, and names the member.

    The samples found so far are kept as a key and five numbers each (`_Found`), about a
    fifth of what a Python object a sample took, so that the listing of a stream, bounded in
    samples but not in size beforehand, costs little more than its keys; and their keys come
    to at most MAX_SCAN_KEY_CHARS characters (a name is up to 4,096 of them)."""
    found = _Found()
    damage: list[Damage] = []
    after: list[int] = []  # damage[j] came after the first after[j] samples
    chars = 0
    read = _reader(f)
    for event in walk_tar(read, 0, None, length):
        if length is None:  # a stream: bounded, as it has no end to stop at
            reach = (event.end or event.offset) if type(event) is Damage else event.data + event.size
            if len(found.keys) + len(damage) >= MAX_STREAM_SAMPLES or reach > MAX_STREAM_BYTES:
                raise _too_long()
        if type(event) is Damage:
            damage.append(event)
            after.append(len(found.keys))
            continue
        split = split_name(event.name)
        if split is None:
            continue
        key, ext = split
        end, flag = event.data + padded(event.size), 0 if event.link else _flag(ext)  # (a link has no bytes)
        if found.keys and found.keys[-1] == key and not (after and after[-1] == len(found.keys)):
            found.extend(len(found.keys) - 1, end, 1, event.size, flag)  # (the last item is this sample)
            continue
        chars += len(key)
        if chars > MAX_SCAN_KEY_CHARS:
            raise StreamTooLong(f"the keys of its samples come to more than {MAX_SCAN_KEY_CHARS:,} characters; "
                                "split it")
        found.add(key, event.offset, end, 1, event.size, flag)
    failed = None
    reached = getattr(read, "reached", None)
    if reached is not None and found.keys and reached() < found.rows[-3]:
        # A stream that ends inside a member: its header's size may have stepped over samples
        # (it cannot be read again to look), so the loss is said here, not only by that sample.
        failed = (f"it ends at byte {reached()}, inside sample {found.keys[-1]}'s members, which its headers give "
                  f"bytes up to {found.rows[-3]}")
    if damage:
        found = _place_damage(found, damage, after)
    rows = np.frombuffer(found.rows, dtype=np.int64).reshape(-1, 4)
    spans = np.stack([rows[:, 0], rows[:, 1] - rows[:, 0]], axis=1)
    return Scan(found.keys, spans, rows[:, 2:].copy(), damage, failed=failed)


_CLS, _IMAGE = 1, 2  # a sample's members, as _Found keeps them: whether it has a cls and an image member


def _flag(ext: str) -> int:
    return _CLS if ext == "cls" else _IMAGE if ext in IMAGE_MEMBERS else 0


class _Found:
    """Samples as scan_tar finds them: sample i has key keys[i], bytes [rows[4i], rows[4i + 1]),
    rows[4i + 2] members of rows[4i + 3] payload bytes (-1, -1: damaged bytes of their own),
    and flags[i] (_CLS, _IMAGE)."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.rows = array.array("q")
        self.flags = bytearray()

    def add(self, key: str, start: int, end: int, members: int, payload: int, flags: int) -> None:
        self.keys.append(key)
        self.rows.extend((start, end, members, payload))
        self.flags.append(flags)

    def extend(self, i: int, end: int, members: int, payload: int, flags: int) -> None:
        """Sample i goes on to `end` with `members` more members of `payload` bytes."""
        self.rows[4 * i + 1] = end
        self.rows[4 * i + 2] += members
        self.rows[4 * i + 3] += payload
        self.flags[i] |= flags

    def complete(self, i: int) -> bool:
        return self.flags[i] == _CLS | _IMAGE


def _place_damage(found: _Found, damage: list[Damage], after: list[int]) -> _Found:
    """The samples with each damaged region joined to one (see scan_tar)."""
    out, rows, keys = _Found(), found.rows, found.keys
    j = 0
    for i in range(len(keys) + 1):
        while j < len(damage) and after[j] == i:
            d = damage[j]
            last = len(out.keys) - 1
            prev = last if last >= 0 and out.rows[4 * last + 2] >= 0 and out.rows[4 * last + 1] == d.offset else None
            # the next sample, where it comes right after (not after more damage)
            nxt = i if i < len(keys) and not (j + 1 < len(damage) and after[j + 1] == i) and rows[4 * i] == d.end \
                else None
            key = sample_key(d.name) if d.name else None
            if prev is not None and nxt is not None and out.keys[prev] == keys[nxt]:
                to_prev, to_next = True, False  # one sample on both sides: joined again below
            elif key is not None:
                to_prev = prev is not None and out.keys[prev] == key
                to_next = not to_prev and nxt is not None and keys[nxt] == key
            else:
                to_prev = prev is not None and not out.complete(prev)
                to_next = not to_prev and nxt is not None and not found.complete(nxt)
            if to_prev:
                out.rows[4 * prev + 1] = d.end
            elif to_next:
                rows[4 * i] = d.offset
            else:
                out.add(key or "", d.offset, d.end, -1, -1, 0)
            j += 1
        if i < len(keys):
            out.add(keys[i], *rows[4 * i:4 * i + 4], found.flags[i])
    joined = _Found()
    for i, key in enumerate(out.keys):
        start, end, members, payload = out.rows[4 * i:4 * i + 4]
        last = len(joined.keys) - 1
        if last >= 0 and joined.keys[last] == key and joined.rows[4 * last + 1] == start and \
                min(joined.rows[4 * last + 2], members) >= 0:
            joined.extend(last, end, members, payload, out.flags[i])
        else:
            joined.add(key, start, end, members, payload, out.flags[i])
    return joined


# The suffixes of a shard's name: a tar, or one compressed as a stream (read as webdataset's
# tarfile "r|*" reads it: told by its first bytes, not by its name).
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def count_samples(tar_path: str | os.PathLike) -> int:
    """The number of samples in a tar shard as the loader lists them: as webdataset groups
    them, but for a sample of links alone, which webdataset drops: regular members and links,
    less webdataset's __metadata__ ones, split into key and extension at the first dot of the
    file name, with consecutive members of one key making a sample. Reads the headers only,
    seeking over the data (a gzip, bzip2 or xz tar is decompressed as a stream). A damaged
    header is stepped over as the loader's scan does (`scan_tar`), so the count is the
    loader's: a damaged region counts as the sample it is joined to (or as one of its own).
    Raises fastdata.DataError for a file that is not a tar."""
    path = os.fspath(tar_path)
    try:
        raw = open_file(path)  # (a FIFO's open would wait for a writer, /dev/zero give zeros without end)
    except OSError as e:
        raise DataError(f"cannot read shard {path}: {e.strerror or e}", path=path) from None
    with raw:
        kind = compression(raw.read(COMPRESSED_HEAD))
        raw.seek(0)
        try:
            if kind is None:
                scan = scan_tar(raw, os.fstat(raw.fileno()).st_size)
            else:
                with decompressing(raw, kind) as f:
                    scan = scan_tar(f)
        except (OSError, EOFError, lzma.LZMAError, zlib.error, StreamTooLong) as e:  # a corrupt or endless stream
            raise DataError(f"cannot read shard {path}: {e}".replace("\n", " "), path=path) from None
    if scan.damage and not scan.has_members:
        raise DataError(f"cannot read shard {path}: not a tar file ({scan.damage[0].cause})", path=path)
    return len(scan.keys)

