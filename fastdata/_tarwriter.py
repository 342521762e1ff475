"""How `fastdata.shard` writes shards' bytes: USTAR headers with fixed fields (so that a shard is
the same bytes on every run and Python version), one shard written through a temporary name,
and a pool of processes that writes many, with one progress line for all."""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import time
import warnings
import zlib
from typing import Any, Callable

from ._optional import require_pillow
from ._pillow import open_image
from ._pool import process_pool
from .errors import DataError, error_line, one_line, skippable
from .image.check import check_complete
from .image.read import read_files
from .sources.tarformat import BLOCK, padded

END = b"\0" * (2 * BLOCK)  # the end of a tar archive


# ----------------------------------------------------------------- tar layout

def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _header(name: str, size: int) -> bytes:
    """The USTAR header of a regular file `name` of `size` bytes with fixed fields (mode 0644,
    uid/gid 0, empty owner names, mtime 0), written out here so that the bytes do not depend on
    the Python version's tarfile."""
    raw = name.encode("utf-8")
    if len(raw) > 100:
        raise ValueError(f"tar member name {name!r} is longer than USTAR's 100 bytes")
    h = bytearray(BLOCK)
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
    assert len(h) == BLOCK
    return bytes(h)


# The image member's extension for each format the loader decodes (`_pillow.FORMATS`), by the
# MIME type Pillow gives the content (a PPM's tells P4 from P5 and P6; PFM is Pillow's "anymap");
# webdataset's names where it has one (jpg, pbm/pgm/ppm/pnm, tif). Each is one of the reader's
# IMAGE_MEMBERS (sources.tarformat).
_MEMBER_EXT = {"image/jpeg": "jpg", "image/mpo": "jpg", "image/png": "png", "image/webp": "webp", "image/bmp": "bmp",
               "image/x-portable-bitmap": "pbm", "image/x-portable-graymap": "pgm",
               "image/x-portable-pixmap": "ppm", "image/x-portable-anymap": "pnm", "image/tiff": "tif",
               "image/gif": "gif"}


def member_ext(data: bytes, is_jpeg: bool) -> str:
    """The extension of the tar member that holds the image `data` (which `check_complete`
    passed, `is_jpeg` from it): its format's (`_MEMBER_EXT`), from its content as the decoder
    sees it, whatever its file is named. ValueError saying why for content Pillow cannot open
    after all (a PNG's chunks, which check_complete walks but does not parse)."""
    if is_jpeg:
        return "jpg"
    require_pillow("to pack an image that is not a JPEG")
    from PIL import Image

    try:
        with warnings.catch_warnings():  # the pixel limit is check_complete's, which passed
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with open_image(data) as img:
                kind, mime = img.format, img.get_format_mimetype()
    except Exception as e:  # Pillow's header parsers raise OSError, SyntaxError, ValueError, ...
        raise ValueError(f"not a readable image ({error_line(e)})") from None
    if mime not in _MEMBER_EXT:
        raise ValueError(f"not an image format shards name ({kind}, {mime})")
    return _MEMBER_EXT[mime]


def sample_bytes(size: int, cls_size: int) -> int:
    """The bytes a sample takes in a shard: an image member of `size` bytes and a cls member of
    `cls_size`, each a header and its padded data."""
    return 2 * BLOCK + padded(size) + padded(cls_size)


# ----------------------------------------------------------------- writing shards

# Set in pool workers: (samples, bytes) written so far by each job, two slots a job, each
# written by its job's worker alone (so no lock, which a worker that dies could leave held),
# and, in the last slot, the flag that tells the workers to stop.
_SHARED: Any = None
_STOP = -1


def _init_worker(counts) -> None:
    global _SHARED
    _SHARED = counts


class _Stopped(Exception):
    """Raised within `_write_shard` alone, where it is told to stop."""


def _pool_job(k: int, job: tuple) -> dict | None:
    """`_write_shard` in a pool worker: job `k` counts in its own two slots of the shared counts."""
    counts = _SHARED

    def tick(samples: int, nbytes: int) -> None:
        counts[2 * k] += samples
        counts[2 * k + 1] += nbytes
    return _write_shard(job, tick, lambda: bool(counts[_STOP]))


def refusal(path: str, cause: str) -> DataError:
    """The error that stops a run at a file it cannot pack (on_error "raise"): one line naming
    the file and why, ending with the way past it."""
    return DataError(skippable(one_line(f"cannot pack {path}: {cause}")), path=path)


def _image_bytes(path: str, size: int) -> tuple[bytes, str] | str:
    """The file's bytes and its member's extension (`member_ext`), or why it is not an image the
    loader would read: the checks the loader makes before it decodes (`image.check`: a regular
    file of at most MAX_FILE_BYTES, its structure walked to its end, its header within the pixel
    limit), and that it still has the `size` its shard was planned with. A corrupt entropy-coded
    segment is not found here: that takes a decode."""
    data = read_files([path], 1)[0]
    if isinstance(data, str):
        return data
    if len(data) != size:
        return f"it changed size while being sharded ({size} bytes, then {len(data)})"
    cause, is_jpeg, _, _ = check_complete([data])[0]
    if cause is not None:
        return cause
    try:
        return data, member_ext(data, is_jpeg)
    except ValueError as e:
        return str(e)


def _write_shard(job: tuple, tick: Callable[[int, int], None],
                 stop: Callable[[], bool] | None = None) -> dict | None:
    """Writes one shard through its temporary name; returns its index entry, with the files left
    out under "skipped" ([path, cause] each: only where `job` says to skip them); None, and no
    shard, where `stop()` said to stop before a sample."""
    final, tmp, samples, skip = job
    digest = hashlib.sha256()
    samples_index, members, crcs, skipped = [], [], [], []
    offset = crc = 0

    def put(data: bytes) -> None:
        nonlocal offset, crc
        f.write(data)
        digest.update(data)
        crc = zlib.crc32(data, crc)
        offset += len(data)

    try:
        with open(tmp, "wb") as f:
            for key, path, label, size, cause in samples:
                if stop is not None and stop():
                    raise _Stopped
                got = _image_bytes(path, size) if cause is None else cause
                if isinstance(got, str):
                    if not skip:
                        raise refusal(path, got)
                    skipped.append([path, got])
                    tick(1, 0)
                    continue
                data, ext = got
                start, crc = offset, 0
                put(_header(f"{key}.{ext}", size))
                data_offset = offset
                put(data)
                put(b"\0" * (padded(size) - size))
                cls = b"%d" % label
                put(_header(f"{key}.cls", len(cls)))
                cls_offset = offset
                put(cls + b"\0" * (padded(len(cls)) - len(cls)))
                samples_index.append([key, start, offset - start])
                crcs.append(crc)
                members.append([key, [[ext, data_offset, size], ["cls", cls_offset, len(cls)]]])
                tick(1, offset - start)
            put(END)
        tick(0, len(END))
        os.replace(tmp, final)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, _Stopped):
            return None
        raise
    return {"name": os.path.basename(final), "samples": len(samples_index), "bytes": offset,
            "sha256": digest.hexdigest(), "samples_index": samples_index, "members": members, "crc32": crcs,
            "skipped": skipped}


class Progress:
    """The progress line on stderr (samples and MB written, MB/s), redrawn at most 4 times a
    second on a terminal, a line at the start and one at the end in a log; nothing when not `enabled`."""

    def __init__(self, enabled: bool, what: str, total: int) -> None:
        self.enabled, self.what, self.total = enabled, what, total
        self.tty = sys.stderr.isatty()
        self.start = self.last = time.monotonic()
        self.samples = self.bytes = 0

    def show(self, final: bool = False, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not (final or force) and (now - self.last < 0.25 or not self.tty):
            return
        self.last = now
        rate = self.bytes / 2**20 / max(now - self.start, 1e-6)  # (binary, as --max-size)
        line = f"shards {self.what}: {self.samples}/{self.total} samples, {self.bytes / 2**20:.1f} MiB, {rate:.1f} MiB/s"
        if self.tty:  # redrawn in place
            print(f"\r{line}", end="\n" if final else "", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def tick(self, samples: int, nbytes: int) -> None:
        self.samples += samples
        self.bytes += nbytes
        self.show()


def write_all(jobs: list[tuple], workers: int, progress: Progress) -> list[dict]:
    """Writes the shards `jobs` names ((final path, temporary path, samples, skip) each) with up
    to `workers` processes; returns their index entries in job order. The first failure (in job
    order among those that failed before the rest stopped) is raised once the others stop.

    The workers (`_pool`) are not terminated on a failure: the others are told to stop through
    a shared flag, which they read before each sample, and the pool ends as after a run that
    succeeds. One that dies fails the run with BrokenProcessPool."""
    if workers <= 1 or len(jobs) == 1:
        return [_write_shard(job, progress.tick) for job in jobs]
    import multiprocessing
    from concurrent.futures import FIRST_EXCEPTION, wait

    counts = multiprocessing.RawArray("q", 2 * len(jobs) + 1)

    def count() -> None:
        progress.samples, progress.bytes = sum(counts[0:-1:2]), sum(counts[1:-1:2])

    with process_pool(min(workers, len(jobs)), _init_worker, (counts,)) as pool:
        futures: list = []
        try:
            pending = futures = [pool.submit(_pool_job, k, job) for k, job in enumerate(jobs)]
            while pending:
                done, pending = wait(pending, 0.1, FIRST_EXCEPTION)
                count()
                progress.show()
                if any(f.exception() is not None for f in done):
                    break
        finally:  # a failure, or Ctrl-C here (which the workers had too), stops the rest; after
            counts[_STOP] = 1  # a run that succeeded, no job is left to read it
            pool.shutdown(wait=True, cancel_futures=True)
    count()
    for f in futures:
        if not f.cancelled() and f.exception() is not None:
            raise f.exception()
    return [f.result() for f in futures]
