"""Image sources, the first stage of the data flow: what a path, a list or a shard pattern
names, as the samples the loader orders and reads.

A source is either image files (`files`: an ImageFolder folder, or a list of (path, label)
pairs: `Samples`) or WebDataset tar shards (`webdataset`: a `.tar` path, a brace pattern, a
list of paths or URLs: `Shards`). `streams` reads a shard's bytes wherever its URL points;
`tarformat` is the shard format the reader and the writer (`fastdata.shard`) share;
`compressed` reads a tar compressed as a stream (gzip, bzip2, xz).
"""

from __future__ import annotations

import os
from typing import Any

from .files import IMAGE_EXTENSIONS, MAX_LABEL, Names, Samples, file_list, image_folder
from .streams import URL_SCHEMES, describe_error, discard, fill, open_stream, read_range
from .tarformat import SHARD_SUFFIXES
from .webdataset import Shards, scan_shard, shards

__all__ = ["IMAGE_EXTENSIONS", "MAX_LABEL", "Names", "Samples", "Shards", "describe_error", "discard", "file_list",
           "fill", "image_folder", "is_image_source", "is_shard_source", "open_stream", "read_range", "resolve",
           "scan_shard", "shards"]


def is_shard_source(source: Any) -> bool:
    """Whether `source` names WebDataset shards: a path or URL (or a list of them, by its
    first) that ends in .tar or a compressed tar's suffix (SHARD_SUFFIXES), has a URL scheme, or
    is a brace pattern."""
    def one(s: Any) -> bool:
        s = os.fspath(s)
        return s.endswith(SHARD_SUFFIXES) or s.startswith(URL_SCHEMES) or ("{" in s and ".." in s)

    if isinstance(source, (str, os.PathLike)):
        return one(source)
    return isinstance(source, (list, tuple)) and bool(source) and all(isinstance(s, (str, os.PathLike)) for s in source) \
        and one(source[0])


def is_image_source(source: Any) -> bool:
    """Whether `source` has the shape of an image source (a path, a list of paths, or a list of
    (path, label) pairs, a path there str, bytes or os.PathLike), as opposed to a Dataset."""
    if isinstance(source, (str, os.PathLike)):
        return True
    if isinstance(source, (list, tuple)) and source:
        first = source[0]
        if isinstance(first, (str, os.PathLike)):
            return True
        if isinstance(first, (list, tuple)) and len(first) == 2 and isinstance(first[0], (str, bytes, os.PathLike)):
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
                         "is not one; a file list holds (path, label) pairs, and a list to batch as it is, as "
                         "DataLoader does, goes in a Dataset")
    return file_list(source)
