"""Image files as a source: an ImageFolder folder or a list of (path, label) pairs, listed as
`Samples`."""

from __future__ import annotations

import array
import itertools
import operator
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..errors import one_line

# torchvision.datasets.folder.IMG_EXTENSIONS: a folder lists the files ImageFolder lists.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# Labels of a source that does not name its classes are in [0, 2**31): int64 holds them, and
# so does an int32 class index (what a loss or a one-hot takes).
MAX_LABEL = 2 ** 31
# The longest path Linux opens (PATH_MAX, its final NUL counted): a longer one can never be read,
# and named in every message about its sample it would make that message as long.
MAX_PATH_BYTES = 4095


class Names(Sequence[str]):
    """A list of strings, read only, kept as one buffer of their UTF-8 bytes and where each
    ends: what a source lists a sample by (a file's path, a shard sample's key).

    A list of a million str objects holds a million reference counts, which each read writes:
    a worker forked from the process that made the list copies every page of it that its
    samples' names lie on, and over an epoch it has copied them all (a listing of ImageNet's
    1.28M paths, over 100 MB, once more in each worker: PyTorch's issue 13246). Reading a
    name here writes nothing the workers share. Any str is kept as it is (`surrogatepass`:
    a path of bytes that are not UTF-8, decoded by the OS's surrogateescape, included)."""

    __slots__ = ("_data", "_ends")

    def __init__(self, items: Iterable[str] = ()) -> None:
        items = items if isinstance(items, list) else list(items)
        try:
            joined = "".join(items)
        except TypeError:  # an item that is no str: refused by `encode` below
            joined = None
        data = None if joined is None else joined.encode("utf-8", "surrogatepass")
        if data is not None and len(data) == len(joined):
            # All ASCII (any other character takes 2 to 4 bytes): each name's bytes are its
            # characters, so one encode and the lengths' sums do (half the time it takes name
            # by name: 0.15 s against 0.32 at ImageNet's 1.28M paths).
            lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
            self._ends, self._data = array.array("q", np.cumsum(lengths).tobytes()), data
            return
        encoded = [s.encode("utf-8", "surrogatepass") for s in items]
        self._ends = array.array("q", itertools.accumulate(map(len, encoded)))
        self._data = b"".join(encoded)

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: Any) -> Any:
        """Name i; a slice gives a list of them."""
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self._ends)))]
        i, n = operator.index(i), len(self._ends)
        if not -n <= i < n:
            raise IndexError("Names index out of range")
        i %= n
        return self._data[self._ends[i - 1] if i else 0:self._ends[i]].decode("utf-8", "surrogatepass")

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Names):
            return self._ends == other._ends and self._data == other._data
        return isinstance(other, list) and list(self) == other

    __hash__ = None  # type: ignore[assignment]  # (as a list's: equal to one)

    def __repr__(self) -> str:
        shown = ", ".join(map(repr, self[:3]))
        return f"Names([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} names)"

    def __reduce__(self) -> tuple:
        return _names, (self._data, self._ends)

    def digest(self, h: Any) -> None:
        """Feeds the names, exactly, to hashlib's `h`."""
        h.update(self._ends.tobytes())
        h.update(self._data)


def _names(data: bytes, ends: array.array) -> Names:
    """A pickled Names again (any protocol)."""
    names = Names.__new__(Names)
    names._data, names._ends = data, ends
    return names


@dataclass
class Samples:
    """The samples of a source: `paths[i]` with label `labels[i]`; `classes` when the source
    names them (ImageFolder). `paths` is kept as `Names`, whatever sequence it is given as."""

    paths: Names
    labels: np.ndarray  # int64
    classes: list[str] | None
    description: str

    def __post_init__(self) -> None:
        self.paths = self.paths if isinstance(self.paths, Names) else Names(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


def image_folder(root: str | os.PathLike) -> Samples:
    """`root/<class>/<image>`, listed as torchvision's ImageFolder lists it: the classes are the
    sub-folders of `root` sorted by name, label = index; a class's images are its files with an
    image extension (IMAGE_EXTENSIONS, any case), found recursively, folder by folder in sorted
    order. Unlike ImageFolder, a hidden sub-folder (.ipynb_checkpoints) is no class, and a class
    folder without images keeps its label; a folder without any image is refused. Symlinks are
    followed, as ImageFolder follows them, but a class's walk enters each folder once
    (`_walk_once`): a link back to `root`, to a folder above it (`/`: it holds the listing) or to
    a folder already entered is not entered again, and said in one warning; a folder that cannot
    be listed is left out, as ImageFolder leaves it out, and said in another. The walk is not
    recursive: a tree of any depth is listed."""
    root = os.path.expanduser(os.fspath(root))  # as ImageFolder does
    if not os.path.exists(root):
        glob = any(c in root for c in "*?[")
        raise FileNotFoundError(f"image folder {root!r} does not exist" + (
            " (a glob is no source: give the folder in ImageFolder layout, or a list of (path, label) pairs, "
            "as glob.glob's paths with their labels)" if glob else ""))
    if not os.path.isdir(root):
        raise ValueError(f"source {root!r} should be a folder in ImageFolder layout (root/<class>/<image>) or a .tar shard, but it is a file")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image folder {root!r} has no class folders: expected root/<class>/<image>" + _held(root))
    paths: list[str] = []
    labels: list[int] = []
    again: list[str] = []
    unlisted: list[str] = []
    holders = _holders(root)
    for label, name in enumerate(classes):
        n = len(paths)
        for dirpath, files in sorted(_walk_once(os.path.join(root, name), holders, again, unlisted)):
            paths += [os.path.join(dirpath, f) for f in sorted(files)
                      if f.lower().endswith(IMAGE_EXTENSIONS)]
        labels += [label] * (len(paths) - n)
    if again:
        more = f" (and {len(again) - 1} more)" if len(again) > 1 else ""
        warnings.warn(f"image folder {root!r}: {again[0]!r}{more} leads to a folder this listing already entered "
                      "or one that holds it (a symlink loop, or a second link to one folder); its images are listed "
                      "once", stacklevel=2)
    if unlisted:
        more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
        warnings.warn(one_line(f"image folder {root!r}: cannot list {unlisted[0]}{more}; its images are left out, as "
                               "ImageFolder leaves them out"), stacklevel=2)
    if not paths:
        raise ValueError(f"image folder {root!r} has {len(classes)} class folders but no images ({', '.join(IMAGE_EXTENSIONS)})")
    return Samples(paths, np.asarray(labels, dtype=np.int64), classes, f"ImageFolder {root} ({len(paths)} images, {len(classes)} classes)")


def _held(root: str) -> str:
    """What a folder without class folders holds instead, for its error: shards or images."""
    try:
        with os.scandir(root) as entries:
            names = [e.name for e in itertools.islice(entries, 100_000) if not e.name.startswith(".")]
    except OSError:
        return ""
    tars = sorted(n for n in names if n.endswith(".tar"))
    images = sum(n.lower().endswith(IMAGE_EXTENSIONS) for n in names)
    if tars:
        # train-000000.tar ... train-000009.tar: the brace pattern that names them all, where one does
        numbered = [re.fullmatch(r"(.*?)(\d+)\.tar", n) for n in (tars[0], tars[-1])]
        pattern = None
        if all(numbered) and numbered[0][1] == numbered[1][1] and len(numbered[0][2]) == len(numbered[1][2]):
            pattern = os.path.join(root, f"{numbered[0][1]}{{{numbered[0][2]}..{numbered[1][2]}}}.tar")
        return one_line(f"; it holds {len(tars)} .tar file{'s' if len(tars) > 1 else ''} ({tars[0]}"
                        f"{f' ... {tars[-1]}' if len(tars) > 1 else ''}): give WebDataset shards as a brace pattern"
                        f"{f' ({pattern})' if pattern else ''} or a list of their paths")
    if images:
        return (f"; it holds {images} image{'s' if images > 1 else ''} itself: move them into a folder per class, or "
                "give a list of (path, label) pairs")
    return ""


def _dir_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # gone, or a chain of links the OS refuses to follow (ELOOP)
        return None
    return st.st_dev, st.st_ino


def _holders(root: str) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of `root` and of every folder above it, up to `/`, along both its
    written path and its resolved one: each holds the whole listing, so a link to one leads
    back into it."""
    ids = set()
    for path in {os.path.abspath(root), os.path.realpath(root)}:
        while True:
            ids.add(_dir_id(path))
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    ids.discard(None)
    return ids


def _walk_once(top: str, holders: set[tuple[int, int]], again: list[str],
               unlisted: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(folder, names of what is not a folder in it) of os.walk(top, followlinks=True), entering
    each folder once: a folder whose (st_dev, st_ino) is in `holders` (`_holders`), is `top`'s
    or was met before in this walk is not entered, and its path is appended to `again`. A link
    to an ancestor (`loop -> .`) would otherwise be entered until the path grows past ELOOP's
    limit, listing its images each time, and two such links make the walk exponential in that
    depth. Sub-folders go in sorted order, so which path of a folder reached twice is kept does
    not depend on the order the file system lists them in.
    The walk keeps its own stack of folders to enter, where os.walk before Python 3.12 recurses
    once a level (RecursionError past ~1,000 levels). It visits folders in os.walk's order
    (top-down, depth first); as os.walk, it skips a folder it cannot list (appended to
    `unlisted`, with the cause), and counts an entry whose type it cannot read as no folder."""
    key = _dir_id(top)
    if key in holders:  # a class folder that is a link to `root` or above
        again.append(top)
        return
    seen = holders | {key}
    stack = [top]
    while stack:
        dirpath = stack.pop()
        dirnames: list[str] = []
        files: list[str] = []
        try:
            with os.scandir(dirpath) as entries:
                for entry in entries:
                    try:
                        is_dir = entry.is_dir()  # through a link
                    except OSError:
                        is_dir = False
                    (dirnames if is_dir else files).append(entry.name)
        except OSError as e:  # gone, unreadable, or failed part-way
            unlisted.append(f"{dirpath!r} ({type(e).__name__}: {e.strerror or e})")
            continue
        keep = []
        for name in sorted(dirnames):
            path = os.path.join(dirpath, name)
            key = _dir_id(path)
            if key is None:
                continue
            if key in seen:
                again.append(path)
            else:
                seen.add(key)
                keep.append(path)
        stack += reversed(keep)  # the first sub-folder is entered next, as os.walk enters it
        yield dirpath, files


def _integer(label: Any) -> int | None:
    """`label` as an int: an int or a NumPy integer, or a 0-d integer array or tensor (what
    `zip(paths, labels)` gives for a tensor or array of labels); None for anything else (a
    bool, a float, a string, an array of more than one element)."""
    boolean = isinstance(label, (bool, np.bool_)) or "bool" in str(getattr(label, "dtype", ""))
    if boolean or getattr(label, "ndim", 0) != 0:
        return None
    try:
        return operator.index(label)  # integers only: a float, a string or a float tensor raises
    except TypeError:
        return None


def file_list(pairs: Sequence[Any]) -> Samples:
    """A list of (path, label) pairs; each label an integer (`_integer`) in [0, 2**31) (files
    are checked when read)."""
    paths, labels = [], []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"a file list should hold (path, label) pairs, but item {i} is {pair!r:.100}")
        path, label = pair
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise ValueError(f"a file list's paths should be str or os.PathLike, but item {i} has path {path!r:.100}")
        path = os.fsdecode(path)
        # (a character takes at most 4 bytes: only a long path is encoded to count them)
        size = len(path.encode("utf-8", "surrogatepass")) if len(path) > MAX_PATH_BYTES // 4 else 0
        if size > MAX_PATH_BYTES:
            raise ValueError(f"a file list's paths should be at most {MAX_PATH_BYTES} bytes (the longest the OS "
                             f"opens), but item {i}'s path has {size:,}: {one_line(path[:100])}...")
        label = _integer(label)
        if label is None:
            raise ValueError(f"labels should be integers, but item {i} ({path}) has label {pair[1]!r:.50}")
        if not 0 <= label < MAX_LABEL:
            raise ValueError(f"labels should be in [0, 2**31), but item {i} ({path}) has label {label}")
        paths.append(path)
        labels.append(int(label))
    if not paths:
        raise ValueError("the file list is empty")
    return Samples(paths, np.asarray(labels, dtype=np.int64), None, f"file list ({len(paths)} images)")
