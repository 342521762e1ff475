"""Reading a batch's samples: their ids, names, encoded bytes and labels, or why one cannot be
had. A reader takes the keys the batch order names (`fastdata.image.order`) and returns a
`Read`; `FileReader` reads image files, `ShardReader` (`read_shards.py`) WebDataset shards.

`Failures` is the on_error policy both the readers and the decoder apply to a failed sample:
raise a DataError naming the file (and tar member) and the cause, or record a counted skip;
`Skipped` is what the loader keeps and logs of those skips.
`BlockBuffer` is the memory a shard reader reads into, kept for the process's next reader.
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from .._cores import batch_threads
from .._ext import native as _ext
from ..errors import DataError, one_line, skippable
from ..sources.streams import open_regular

logger = logging.getLogger("fastdata")

MAX_FILE_BYTES = 1 << 28
"""The most bytes an image file, or a shard's sample (its headers and members), may have: 256
MiB. An image within the pixel limit (`_structure.MAX_IMAGE_PIXELS`, 2**28 / 3) needs less unless it
is padded, and a file or sample is read whole into memory before its first bytes are looked at,
so a larger one (a sparse file is cheap to make) is refused from its size, before anything is
allocated for it. The native reader's limit is the same (`_native.MAX_FILE_BYTES`)."""


MAX_PART_BYTES = 1 << 30
"""The most bytes of a batch's image files held at once: 1 GiB. A batch's files are read together
and decoded together; past this, a part at a time (`FileReader.parts`), each read once the part
before is decoded and its bytes dropped, so that a batch of large files (256 files near
MAX_FILE_BYTES would be 64 GiB) needs at most this much, plus one file, to read. A batch of
ImageNet's photos is about 30 MB: one part. (A shard's samples are read a block at a time, see
`read_shards.py`.)"""


def too_large(nbytes: int, what: str = "an image file") -> str:
    """Why a file or sample of `nbytes` is not read (the extension's words, csrc/module.cpp)."""
    return f"too large: {nbytes} bytes, over the {MAX_FILE_BYTES} {what} may have"


class BlockBuffer:
    """Memory a shard reader reads blocks into (`read_shards.py`), grown as they need: an
    anonymous private mapping, so that growing copies nothing and zero-fills nothing with the
    GIL held (growing a bytearray does: for a 100 MB block, tens of ms in which the decode
    thread cannot run), and its pages are faulted in by the read itself. The old mapping lives
    on while views of it do."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def view(self, n: int) -> memoryview:
        if self._map is None or len(self._map) < n:
            # An eighth more than asked: blocks of the same length in samples differ a little
            # in bytes, and each growth maps anew while the old mapping may still be in use.
            # Of the extra eighth, only the pages a read reaches are ever faulted in.
            self._map = mmap.mmap(-1, max(n + n // 8, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return memoryview(self._map)[:n]

    def size(self) -> int:
        return len(self._map) if self._map is not None else 0

    def idle(self) -> None:
        """Its pages may be taken by the kernel until it is written again (MADV_FREE)."""
        if self._map is None:
            return
        try:
            self._map.madvise(mmap.MADV_FREE)
        except (AttributeError, OSError, ValueError):  # no MADV_FREE (a kernel before 4.5, not Linux)
            pass


# Buffers a closed reader gave back, for the next reader of this process: a loader built afresh
# each epoch (or a pass in the training process, whose end closes the reader) would otherwise
# fault in a new 100 MB block's pages each time, about as long again as the read itself (see
# benchmarks/results/MEASURED.md). Given back with MADV_FREE: while they wait, the kernel may
# take their pages under memory pressure (a later read then faults them in anew), and if it has
# not, a read writes to them as they are. (pid, buffers); a forked child starts with none, since
# writing to the pages it shares with its parent would copy each.
_SPARE_KEPT = 2  # a shard reader's two block buffers
_spare: tuple[int, list[BlockBuffer]] = (0, [])


def take_buffer() -> BlockBuffer:
    """A buffer a reader of this process gave back, else a new one."""
    pid, spare = _spare
    return spare.pop() if pid == os.getpid() and spare else BlockBuffer()


def give_back(buffers: list[BlockBuffer]) -> None:
    """Keeps a closed reader's buffers (nothing reads into them any more) for the next."""
    global _spare
    pid, spare = _spare
    if pid != os.getpid():
        _spare = pid, spare = os.getpid(), []
    for buf in buffers:
        buf.idle()
    spare.extend(buffers)
    spare.sort(key=BlockBuffer.size)
    del spare[:-_SPARE_KEPT]  # the largest kept: a smaller one would map anew for a block


class Read(NamedTuple):
    """A batch as read: its epoch, the ids of the samples that could be read, their names
    (a path, or "<shard> (member <name>)"), bytes and labels, the (name, cause) of the
    samples left out so far, and their draw keys where the order gives them (`FileOrder`)."""

    epoch: int
    index: np.ndarray
    paths: list[str]
    datas: list
    labels: np.ndarray
    errors: list[tuple[str, str]]
    draws: np.ndarray | None = None  # what the samples' random draws are keyed by, where not their ids


class MemberName(str):
    """A tar member as errors name it, "<shard> (member <name>)", keeping the shard and the
    member apart for `DataError.path` and `.member` (either may hold that very text)."""

    def __new__(cls, shard: str, member: str) -> "MemberName":
        name = str.__new__(cls, f"{shard} (member {member})")
        name.shard, name.member = shard, member
        return name

    def __reduce__(self) -> tuple:
        return MemberName, (self.shard, self.member)


class Failures:
    """on_error="raise": a failed sample raises DataError; "skip": it is recorded in the
    batch's errors, which the loader counts in stats["skipped"]."""

    def __init__(self, on_error: str, backend: str) -> None:
        self.on_error, self.backend = on_error, backend

    def __call__(self, errors: list[tuple[str, str]], path: str, cause: str) -> None:
        if self.on_error == "raise":
            raise DataError(skippable(one_line(f"cannot read {path}: {cause} (backend {self.backend!r})")),
                            path=getattr(path, "shard", path), member=getattr(path, "member", None))
        errors.append((path, cause))


MAX_NAMED = 100
"""The skipped files a loader names (in stats["errors"] and a warning each); the rest are counted."""


class Skipped:
    """What a loader keeps of the samples on_error="skip" left out, in its `stats`: each skip
    counted in "skipped" (a bad file is skipped again each epoch); each file once in
    "skipped_files"; the first MAX_NAMED files listed in "errors" (path, cause, and "count", the
    times skipped) and named in a warning each. Past those, files are counted, not named one by
    one, so that a source of thousands of bad files (macOS's ._ files beside each image) does not
    flood the log: the first of them is named with a warning that says so, and the end of each
    epoch that skipped more such files counts them in one line."""

    def __init__(self, stats: dict) -> None:
        self.stats = stats
        self.seen: dict[str, dict | None] = {}  # a skipped file -> its stats["errors"] entry, None past MAX_NAMED
        self.unnamed = 0  # files first skipped in this epoch and not named

    def record(self, errors: list[tuple[str, str]]) -> None:
        stats, seen = self.stats, self.seen
        stats["skipped"] += len(errors)
        for path, cause in errors:
            if path not in seen:
                listed = len(stats["errors"]) < MAX_NAMED
                seen[path] = {"path": path, "cause": cause, "count": 0} if listed else None
                stats["errors"] += [seen[path]] if listed else []
                stats["skipped_files"] += 1
                if listed or stats["skipped_files"] == MAX_NAMED + 1:
                    more = "" if listed else (f" (the {MAX_NAMED + 1}st file skipped: the files skipped after it are "
                                              "counted in loader.stats['skipped_files'] and at each epoch's end, "
                                              "not named one by one)")
                    logger.warning("%s", one_line(f"skipped {path}: {cause}{more}"), extra={"fastdata_skipped": path})
                else:
                    self.unnamed += 1
            if seen[path] is not None:
                seen[path]["count"] += 1

    def epoch_done(self, epoch: int) -> None:
        if self.unnamed:
            logger.warning("epoch %d skipped %d more files, not named one by one (loader.stats['skipped_files']: %d "
                           "files in all)", epoch, self.unnamed, self.stats["skipped_files"])
        self.unnamed = 0


def _read_file(path, room: int | None = None) -> bytes | str | None:
    """One file's bytes, at most the size it had when opened, or why not; None, unread, where
    it has more than `room` bytes."""
    opened = open_regular(path)
    if isinstance(opened, str):
        return opened
    fd, size = opened[0], opened[1].st_size
    if size > MAX_FILE_BYTES:
        os.close(fd)
        return too_large(size)
    if room is not None and size > room:
        os.close(fd)
        return None
    try:
        chunks, done = [], 0
        while done < size:  # a file that shrank is read to its end
            chunk = os.pread(fd, size - done, done)
            if not chunk:
                break
            chunks.append(chunk)
            done += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except OSError as e:
        return e.strerror or type(e).__name__
    finally:
        os.close(fd)


def read_files(paths: Sequence[str], threads: int, budget: int | None = None) -> list:
    """Each file's bytes, or why it could not be read: OSError's strerror ("No such file or
    directory", "Is a directory", ...), "embedded null byte", or, for a file that is not a
    regular one (a symlink to one included), "not a regular file (a FIFO)" ("(a character
    device)", "(a block device)", "(a socket)"), which is never read: a FIFO could block the
    read forever, /dev/zero give bytes without end; or "too large: ..." over MAX_FILE_BYTES.
    Each file is opened, then sized by fstat of that descriptor, and read to at most that size.
    With a `budget`, the files are read in order while their sizes add up to at most `budget`
    bytes (the first with any always), and from the first that would go past it on, each is
    None, unread. Natively when the extension is built (opened and read on `threads` threads
    with the GIL released), else here, one by one, with the same bytes and causes."""
    if _ext is not None:
        return _ext.read_files(paths, threads, -1 if budget is None else budget)
    out: list = []
    total = 0
    for path in paths:
        data = _read_file(path, None if budget is None or not total else budget - total)
        if data is None:
            return out + [None] * (len(paths) - len(out))
        total += 0 if isinstance(data, str) else len(data)
        out.append(data)
    return out


class FileReader:
    """Reads image files; a key is (epoch, sample id) or (epoch, sample id, draw key)."""

    def __init__(self, samples, fail: Failures) -> None:
        self.samples, self.fail = samples, fail

    def __len__(self) -> int:
        return len(self.samples)

    def num_classes(self, transform) -> int | None:
        samples = self.samples
        return len(samples.classes) if samples.classes else int(samples.labels.max()) + 1

    def close(self) -> None:
        """No threads of its own to stop."""

    def read(self, keys: Sequence[tuple[int, ...]]) -> Read:
        """The batch's files, all at once."""
        return self._read(keys, None)[0]

    def parts(self, keys: Sequence[tuple[int, ...]]) -> Iterator[tuple[Read, bool]]:
        """The batch's files in parts of at most MAX_PART_BYTES (one part but for batches of
        large files), in the order of `keys`, each with whether more follow; each is read once
        the one before is taken."""
        while keys:
            read, keys = self._read(keys, MAX_PART_BYTES)
            yield read, bool(len(keys))
            del read  # its bytes go before the next part's are read

    def _read(self, keys: Sequence[tuple[int, ...]], budget: int | None) -> tuple[Read, Sequence]:
        """(the Read of the first files of `keys` within `budget` bytes, the keys left)."""
        epoch = keys[0][0]
        index = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
        draws = np.fromiter((k[2] for k in keys), dtype=np.int64, count=len(keys)) if len(keys[0]) > 2 else None
        errors: list[tuple[str, str]] = []
        names = [self.samples.paths[i] for i in index]
        paths, datas, ok = [], [], []
        for j, (path, data) in enumerate(zip(names, read_files(names, batch_threads(), budget))):
            if data is None:  # left for the next part, with all after it
                keys = keys[j:]
                break
            if isinstance(data, str):
                self.fail(errors, path, data)
                continue
            paths.append(path)
            datas.append(data)
            ok.append(j)
        else:
            keys = keys[:0]
        index = index[ok]
        return Read(epoch, index, paths, datas, self.samples.labels[index], errors,
                    None if draws is None else draws[ok]), keys
