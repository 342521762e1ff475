"""Image sources: what a path, a list or a shard pattern names, as a list of samples."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".tif", ".tiff")


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
    """`root/<class>/<image>`: classes sorted by name, label = index, as torchvision's
    ImageFolder; images found recursively under each class folder, sorted."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"image folder {str(root)!r} does not exist")
    if not root.is_dir():
        raise ValueError(f"source {str(root)!r} should be a folder in ImageFolder layout (root/<class>/<image>) or a .tar shard, but it is a file")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"image folder {str(root)!r} has no class folders: expected root/<class>/<image>")
    paths: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = sorted(
            os.path.join(dirpath, f)
            for dirpath, _, files in os.walk(root / name, followlinks=True)
            for f in files
            if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        paths += found
        labels += [label] * len(found)
    if not paths:
        raise ValueError(f"image folder {str(root)!r} has {len(classes)} class folders but no images ({', '.join(IMAGE_EXTENSIONS)})")
    return Samples(paths, np.asarray(labels, dtype=np.int64), classes, f"ImageFolder {root} ({len(paths)} images, {len(classes)} classes)")


def file_list(pairs: Sequence[Any]) -> Samples:
    """A list of (path, label) pairs, taken as given (files are checked when read)."""
    paths, labels = [], []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"a file list should hold (path, label) pairs, but item {i} is {pair!r:.100}")
        path, label = pair
        if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
            raise ValueError(f"labels should be integers, but item {i} ({path}) has label {label!r:.50}")
        paths.append(os.fspath(path))
        labels.append(int(label))
    if not paths:
        raise ValueError("the file list is empty")
    return Samples(paths, np.asarray(labels, dtype=np.int64), None, f"file list ({len(paths)} images)")


def is_image_source(source: Any) -> bool:
    if isinstance(source, (str, os.PathLike)):
        return True
    if isinstance(source, (list, tuple)) and source:
        first = source[0]
        if isinstance(first, (str, os.PathLike)):
            return True
        if isinstance(first, (list, tuple)) and len(first) == 2 and isinstance(first[0], (str, os.PathLike)):
            return True
    return False


def resolve(source: Any) -> Samples:
    """Samples for an image source (shards come with the wds backend)."""
    if isinstance(source, (str, os.PathLike)):
        s = os.fspath(source)
        if s.endswith(".tar") or "{" in s or s.startswith(("pipe:", "http://", "https://", "file:")):
            raise RuntimeError(f"WebDataset shards ({s}) need the 'wds' backend, which is not built yet")
        return image_folder(s)
    if isinstance(source, (list, tuple)) and source and isinstance(source[0], (str, os.PathLike)):
        raise RuntimeError("a list of shard paths needs the 'wds' backend, which is not built yet")
    return file_list(source)
