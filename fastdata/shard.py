"""`fastdata shard` (or `fastdata-shard`): packs an image source into WebDataset tar shards,
with an index.

    fastdata shard SRC OUT_PATTERN [--max-count N] [--max-size BYTES] [--workers N]
                   [--no-shuffle] [--seed S] [--on-error raise|skip] [--quiet] [--debug]
    fastdata shard imagenet/train out/train-%06d.tar --max-size 1G

SRC is a folder in ImageFolder layout (SRC/<class>/<image>: classes sorted by name, label =
index; images sorted). From Python, `write_shards(source, pattern)` also takes a list of
(path, label) pairs. OUT_PATTERN names the shards printf style, as webdataset's ShardWriter:
one `%d` or `%0Nd` in the file name (no braces), e.g. out/train-%06d.tar -> out/train-000000.tar,
out/train-000001.tar, ...

The shards
  Each file is checked as the loader checks it before decoding (a regular file of at most
  256 MiB, its structure walked to its end, its header within the pixel limit) and read once
  (it must keep the size it had when the shards were planned): one that fails (a dangling
  link, a file that grew) stops the run with one line naming it and why, or with --on-error
  skip is left out, named in a warning line (its key is then missing from the shards). A
  class folder whose name is not UTF-8 is refused before anything is written: the index
  (JSON) could not hold its name.
  Samples go in a shuffled order, the permutation numpy.random.Generator(PCG64(seed))
  .permutation(n) of the source order (--seed, default 0), so that a shard mixes the classes
  of a class-sorted folder and a loader's shuffle buffer sees a mix; --no-shuffle keeps the
  source order. A shard holds at most --max-count samples (default 10000) and
  at most --max-size bytes (default 1G; K/M/G/T are binary: 1K = 1024); the next sample starts
  a new shard when it would pass either bound, and a single sample bigger than --max-size gets
  a shard of its own. Sample i (its position in the source order) is two tar members:
    <key>.<ext>  the image file's bytes, unchanged; ext names the format of its content (the
                 decoder's view, not the file's name): jpg, png, webp, bmp, pbm/pgm/ppm (pnm
                 for PFM), tif or gif, webdataset's names, which the wds reader takes
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
                 "members": [[key, [[ext, data_offset, data_size], ...]], ...],
                 "crc32": [crc, ...]}, ...],                # of each sample's bytes, as samples_index
     "classes": ["<class name>", ...] or null,      # null for a (path, label) list
     "total": N}
  All offsets are bytes from the start of the shard. `offset` is where the sample's first tar
  header starts and `length` the bytes of all its members (headers, data and padding): the
  slice [offset, offset + length) is the sample's members and nothing else. A member's payload
  is [data_offset, data_offset + data_size). `crc32` is zlib's CRC-32 of each sample's slice,
  which the wds reader compares as it reads the sample (an index without it: not compared); the
  shard's sha256 is for tools that read it whole. The lists are in tar order (the samples').
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import json
import os
import re
import secrets
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ._cli import Parser, add_debug, check_int, natural_int, not_a_directory, positive_int, run_alone, run_command
from ._cores import usable_cores
from .errors import one_line
from .image.read import MAX_FILE_BYTES, too_large
from .sources.files import Samples, file_list, image_folder
from .sources.tarformat import INDEX_FORMAT, INDEX_VERSION, count_samples, index_name, read_index

# read_index and count_samples are the shard format's (sources.tarformat), named here too, beside
# the writer of what they read.
__all__ = ["INDEX_FORMAT", "INDEX_VERSION", "count_samples", "index_path", "main", "parse_size", "read_index",
           "write_shards"]

_CONVERSION = re.compile(r"%(0\d+)?d")


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
    return folder, name, index_name(name[:found[0].start()].replace("%%", "%"))


def index_path(pattern: str | os.PathLike) -> Path:
    """Where `write_shards(source, pattern)` puts the index: <prefix>-index.json next to the
    shards (out/train-%06d.tar -> out/train-index.json)."""
    folder, _, index = _parse_pattern(pattern)
    return Path(folder) / index


# ----------------------------------------------------------------- write_shards

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


def _resolve_source(source: Any) -> Samples:
    if isinstance(source, Samples):
        return source
    if isinstance(source, (str, os.PathLike)):
        if os.path.isfile(source):
            raise ValueError(f"source {os.fspath(source)!r} should be a folder in ImageFolder layout "
                             "(root/<class>/<image>), but it is a file")
        return image_folder(source)
    if isinstance(source, (list, tuple)):
        return file_list(source)
    raise TypeError(f"the source should be an ImageFolder folder or a list of (path, label) pairs, "
                    f"but got {type(source).__name__}")


def _prepare_folder(folder: str) -> bool:
    """Makes the output folder and checks that a file can be written in it: whether it made it."""
    where = folder or "."
    made = not os.path.isdir(where)
    blocked = not_a_directory(where)
    if blocked is not None:  # makedirs would say "File exists" of it
        err = NotADirectoryError(f"cannot write shards in {where!r}: {str(blocked)!r} is not a directory")
        err.errno = errno.ENOTDIR
        raise err
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
    return made


@contextlib.contextmanager
def _output_folder(folder: str) -> Iterator[None]:
    """The output folder made (`_prepare_folder`) for the run inside: one the run made, and left
    empty when it fails, goes with it."""
    made = _prepare_folder(folder)
    try:
        yield
    except BaseException:
        if made and not os.listdir(folder):
            os.rmdir(folder)
        raise


def _split_into_shards(samples, max_count: int, max_size: int, order, skip: bool) -> list[list[tuple]]:
    """The samples of each shard: (key, path, label, size, cause) in `order`. `cause` is why a
    file is refused from its stat alone (it cannot be had; it is over MAX_FILE_BYTES, far below
    the 8 GiB a USTAR member holds), else None; such a file stops the run here, or with `skip`
    stays in the list, taking no bytes, for its shard's writer to report as skipped."""
    from ._tarwriter import END, refusal, sample_bytes  # imports torch, which a help page does without

    shards: list[list[tuple]] = []
    current: list[tuple] = []
    current_bytes = len(END)
    labels = samples.labels.tolist()
    for i in order:
        path, label = samples.paths[i], labels[i]
        try:
            size = os.stat(path).st_size
            cause = too_large(size) if size > MAX_FILE_BYTES else None
        except (OSError, ValueError) as e:  # ValueError: a listed path holding a NUL
            size, cause = 0, getattr(e, "strerror", None) or str(e)
        if cause is not None and not skip:
            raise refusal(path, cause)
        nbytes = 0 if cause else sample_bytes(size, len(b"%d" % label))
        if current and (len(current) + 1 > max_count or current_bytes + nbytes > max_size):
            shards.append(current)
            current, current_bytes = [], len(END)
        current.append(("%08d" % i, path, label, size, cause))
        current_bytes += nbytes
    if current:
        shards.append(current)
    return shards


def _check_classes(classes: list[str] | None) -> None:
    """ValueError naming the first class folder whose name is not UTF-8: Python lists such a
    name with lone surrogates (surrogateescape), which the index's JSON cannot hold (json.dumps
    writes them as \\udcXX escapes, which strict readers refuse)."""
    for name in classes or ():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"the class folder named {os.fsencode(name)!r} (bytes that are not UTF-8) cannot be "
                             "named in the shards' index, which is JSON: rename it") from None


def _write(source: Any, pattern: Any, max_count: int, max_size: int | str, workers: int | None,
           progress: bool, shuffle: bool = True, seed: int = 0, on_error: str = "raise") -> tuple[Path, dict, int]:
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error should be 'raise' or 'skip', but got {on_error!r:.100}")
    max_count = check_int("max_count", max_count, 1)
    max_size = check_int("max_size", parse_size(max_size) if isinstance(max_size, str) else max_size, 1)
    workers = usable_cores() if workers is None else check_int("workers", workers, 1)
    folder, name, index_file_name = _parse_pattern(pattern)
    samples = _resolve_source(source)
    _check_classes(samples.classes)
    seed = check_int("seed", seed, 0)
    with _output_folder(folder):
        order = np.random.Generator(np.random.PCG64(seed)).permutation(len(samples)) if shuffle else \
            range(len(samples))
        contents = _split_into_shards(samples, max_count, max_size, [int(i) for i in order], on_error == "skip")
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        finals = [os.path.join(folder, name % k) for k in range(len(contents))]
        index_file = os.path.join(folder, index_file_name)
        if index_file in finals:
            raise ValueError(f"the shard pattern {os.fspath(pattern)!r} names a shard {index_file_name}, the "
                             "index's name")
        jobs = [(final, os.path.join(folder, f".{os.path.basename(final)}.{token}.tmp"), shard, on_error == "skip")
                for final, shard in zip(finals, contents)]
        from ._tarwriter import Progress, write_all

        report = Progress(progress, os.fspath(pattern), len(samples))
        report.show(force=True)
        try:
            entries = write_all(jobs, workers, report)
        except BaseException:
            report.show(final=True)  # the error's line starts a line of its own
            for _, tmp, _, _ in jobs:  # what a terminated worker left
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise
        report.show(final=True)
        skipped = [pair for entry in entries for pair in entry.pop("skipped")]
        for path, cause in skipped:
            warnings.warn(one_line(f"skipped {path}: {cause}"), stacklevel=3)
        index = {"version": INDEX_VERSION, "format": INDEX_FORMAT, "shards": entries, "classes": samples.classes,
                 "total": len(samples) - len(skipped)}
        tmp = os.path.join(folder, f".{index_file_name}.{token}.tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(index, separators=(",", ":")) + "\n")
        os.replace(tmp, index_file)
        stale = [os.path.join(folder, name % k) for k in range(len(contents), len(contents) + 1)]
        if any(os.path.exists(p) for p in stale):
            warnings.warn(f"{stale[0]} (and maybe more) is left from an earlier run: it is not one of the "
                          f"{len(contents)} shards of this set, which {index_file} lists", stacklevel=3)
        return Path(index_file), index, len(skipped)


def write_shards(source: Any, pattern: str | os.PathLike, *, max_count: int = 10000, max_size: int | str = 1 << 30,
                 workers: int | None = None, shuffle: bool = True, seed: int = 0, progress: bool = False,
                 on_error: str = "raise") -> Path:
    """Writes `source` (an ImageFolder folder or a list of (path, label) pairs) as WebDataset
    tar shards named by `pattern` ("out/train-%06d.tar") and returns the path of their index,
    <prefix>-index.json next to them. See the module docstring for the shards' content and
    the index format.

    A shard holds at most `max_count` samples and `max_size` bytes (an int, or "500M", "1G"),
    except that a sample bigger than `max_size` gets a shard of its own. `workers` processes
    write shards in parallel (default: the usable cores); the output is byte-identical for any
    number. Samples go in the order of a permutation drawn from `seed`, or in source order with
    `shuffle=False`. `progress` prints a line on stderr (samples written / total, MB/s).

    Each file is checked as the loader checks it before decoding (a regular file of at most
    256 MiB, its structure walked to its end, its header within the pixel limit): one that
    fails raises fastdata.DataError naming it, or with `on_error="skip"` is left out with a
    warning naming it and why (its key is then missing from the shards).

    Raises FileNotFoundError / ValueError for a bad source or pattern, OSError when the output
    folder cannot be written, fastdata.DataError when an image file cannot be read."""
    return _write(source, pattern, max_count, max_size, workers, progress, shuffle, seed, on_error)[0]


# ----------------------------------------------------------------- CLI

def _size(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"should be at least 1 byte, but got {text!r}")
    return value


def _pattern(text: str) -> str:
    try:
        _parse_pattern(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


# an image folder made first, so that the example runs anywhere (a single %: the epilog is not %-formatted)
EXAMPLE = ("python -m fastdata.synthetic /tmp/fastdata-images --images 200\n"
           "  fastdata shard /tmp/fastdata-images /tmp/fastdata-shards/train-%06d.tar --max-count 50")


def add_arguments(ap: Parser) -> None:
    """The command's arguments, on its parser (`fastdata-shard`, or `fastdata shard`)."""
    ap.add_argument("src", metavar="SRC", help="a folder in ImageFolder layout (SRC/<class>/<image>)")
    ap.add_argument("pattern", metavar="OUT_PATTERN", type=_pattern,
                    help="shard names, printf style: out/train-%%06d.tar")
    ap.add_argument("--max-count", type=positive_int, default=10000, metavar="N",
                    help="samples per shard, at most (default 10000)")
    ap.add_argument("--max-size", type=_size, default=1 << 30, metavar="BYTES",
                    help="bytes per shard, at most: 1073741824, 500M, 1G (binary units; default 1G)")
    ap.add_argument("--workers", type=positive_int, default=None, metavar="N",
                    help="processes writing shards (default: the usable cores)")
    ap.add_argument("--no-shuffle", action="store_true", help="keep the source order (default: a shuffled order)")
    ap.add_argument("--seed", type=natural_int, default=0, help="the shuffled order's seed (default 0)")
    ap.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                    help="a file that is not a readable image: stop with its name (raise, the default), or leave "
                         "it out with a warning line naming it (skip)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress line on stderr")
    add_debug(ap)
    ap.set_defaults(run=functools.partial(run, ap))


def run(ap: Parser, args: argparse.Namespace) -> int:
    """The command on parsed arguments; its exit status."""
    def body() -> int:
        t = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            path, index, skipped = _write(args.src, args.pattern, args.max_count, args.max_size, args.workers,
                                          progress=not args.quiet, shuffle=not args.no_shuffle, seed=args.seed,
                                          on_error=args.on_error)
        for w in caught:
            print(f"{ap.prog}: warning: {w.message}", file=sys.stderr)
        nbytes = sum(s["bytes"] for s in index["shards"])
        print(f"{len(index['shards'])} shards, {index['total']} samples, {nbytes} bytes ({nbytes / 2**20:.1f} MiB) "
              f"in {time.perf_counter() - t:.1f} s" + (f"; {skipped} file(s) skipped" if skipped else ""))
        print(f"index: {path}")
        return 0
    return run_command(ap.prog, body, args.debug, skip_flag="--on-error skip")


def main(argv: list[str] | None = None) -> int:
    """`fastdata-shard`: the same command as `fastdata shard`."""
    return run_alone("fastdata-shard", __doc__, EXAMPLE, add_arguments, argv)


if __name__ == "__main__":
    raise SystemExit(main())
