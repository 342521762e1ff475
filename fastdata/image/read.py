"""Reading a batch's samples: their ids, names, encoded bytes and labels, or why one cannot be
had. A reader takes the keys the batch order names (`fastdata.image.order`) and returns a
`Read`; `FileReader` reads image files, `ShardReader` (`read_shards.py`) WebDataset shards.

`Failures` is the on_error policy both the readers and the decoder apply to a failed sample:
raise a DataError naming the file (and tar member) and the cause, or record a counted skip.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from .._cores import batch_threads
from .._ext import native as _ext
from ..errors import DataError, skippable


class Read(NamedTuple):
    """A batch as read: its epoch, the ids of the samples that could be read, their names
    (a path, or "<shard> (member <name>)"), bytes and labels, and the (name, cause) of the
    samples left out so far."""

    epoch: int
    index: np.ndarray
    paths: list[str]
    datas: list
    labels: np.ndarray
    errors: list[tuple[str, str]]


class Failures:
    """on_error="raise": a failed sample raises DataError; "skip": it is recorded in the
    batch's errors, which the loader counts in stats["skipped"]."""

    def __init__(self, on_error: str, backend: str) -> None:
        self.on_error, self.backend = on_error, backend

    def __call__(self, errors: list[tuple[str, str]], path: str, cause: str) -> None:
        if self.on_error == "raise":
            # a tar member is named "<shard> (member <name>)": DataError carries both
            shard, _, member = path.partition(" (member ")
            raise DataError(skippable(f"cannot read {path}: {cause} (backend {self.backend!r})"), path=shard,
                            member=member[:-1] or None)
        errors.append((path, cause))


def read_files(paths: Sequence[str], threads: int) -> list:
    """Each file's bytes, or why it could not be read (OSError's strerror: "No such file or
    directory", "Is a directory", ...). Natively when the extension is built: opened and read
    on `threads` threads with the GIL released, the same bytes and causes as below."""
    got = _ext.read_files(paths, threads) if _ext is not None else [None] * len(paths)
    for j, data in enumerate(got):
        if data is None:  # no extension, or not a regular file (a FIFO): read to its end here
            try:
                with open(paths[j], "rb") as f:
                    got[j] = f.read()
            except OSError as e:
                got[j] = e.strerror or type(e).__name__
            except ValueError as e:  # a NUL inside the path
                got[j] = str(e)
    return got


class FileReader:
    """Reads image files; a key is (epoch, sample id)."""

    def __init__(self, samples, fail: Failures) -> None:
        self.samples, self.fail = samples, fail

    def __len__(self) -> int:
        return len(self.samples)

    def num_classes(self, transform) -> int | None:
        samples = self.samples
        return len(samples.classes) if samples.classes else int(samples.labels.max()) + 1

    def close(self) -> None:
        """No threads of its own to stop."""

    def read(self, keys: Sequence[tuple[int, int]]) -> Read:
        epoch = keys[0][0]
        index = np.fromiter((k[1] for k in keys), dtype=np.int64, count=len(keys))
        errors: list[tuple[str, str]] = []
        names = [self.samples.paths[i] for i in index]
        paths, datas, ok = [], [], []
        for j, (path, data) in enumerate(zip(names, read_files(names, batch_threads()))):
            if isinstance(data, str):
                self.fail(errors, path, data)
                continue
            paths.append(path)
            datas.append(data)
            ok.append(j)
        index = index[ok]
        return Read(epoch, index, paths, datas, self.samples.labels[index], errors)
