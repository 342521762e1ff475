"""Image files as a source: an ImageFolder folder or a list of (path, label) pairs, listed as
`Samples`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

# torchvision.datasets.folder.IMG_EXTENSIONS: a folder lists the files ImageFolder lists.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
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
    """`root/<class>/<image>`, listed as torchvision's ImageFolder lists it: the classes are the
    sub-folders of `root` sorted by name, label = index; a class's images are its files with an
    image extension (IMAGE_EXTENSIONS, any case), found recursively, folder by folder in sorted
    order. Unlike ImageFolder, a hidden sub-folder (.ipynb_checkpoints) is no class, and a class
    folder without images keeps its label; a folder without any image is refused."""
    root = os.fspath(root)
    if not os.path.exists(root):
        raise FileNotFoundError(f"image folder {root!r} does not exist")
    if not os.path.isdir(root):
        raise ValueError(f"source {root!r} should be a folder in ImageFolder layout (root/<class>/<image>) or a .tar shard, but it is a file")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image folder {root!r} has no class folders: expected root/<class>/<image>")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        n = len(paths)
        for dirpath, _, files in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            paths += [os.path.join(dirpath, f) for f in sorted(files)
                      if f.lower().endswith(IMAGE_EXTENSIONS)]
        labels += [label] * (len(paths) - n)
    if not paths:
        raise ValueError(f"image folder {root!r} has {len(classes)} class folders but no images ({', '.join(IMAGE_EXTENSIONS)})")
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
