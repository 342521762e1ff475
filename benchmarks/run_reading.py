"""What reading a script's own Dataset class costs `fastdata run`, once a process (and once a
worker where workers start fresh: spawn, forkserver): `_filelist.file_list` on five classes as
scripts write them, its caches cleared before each reading, timed with the shapes written out only
where the class's code could be one (`_fileshapes.shapes_of`, as fastdata runs) against every
shape written out (the baseline: the code's marks all given), in ABBA rounds in one process, after
one reading of each to import what they import. Prints each class's median milliseconds and the
ratio; writes JSON. The regime: no files opened (a reading reads the class and its lists, not the
files), the interpreter's compiler writing the shapes.

    OMP_NUM_THREADS=1 python benchmarks/run_reading.py [--rounds 5] [--json PATH]

It needs torchvision and pandas (the frame tutorial's class), as a user's environment has them.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from PIL import Image
from torchvision.io import read_image

import _common
from fastdata.run import _filelist, _fileshapes, _inline, _itemsource


class Files(torch.utils.data.Dataset):  # a list of paths and one of labels
    def __init__(self, paths, labels, transform=None):
        self.image_paths, self.labels, self.transform = paths, labels, transform

    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        label = self.labels[idx]
        if self.transform:
            image = self.transform(image)
        return image, label


class CustomImageDataset(torch.utils.data.Dataset):  # the PyTorch tutorial's, a frame of names and labels
    def __init__(self, frame, img_dir, transform=None, target_transform=None):
        self.img_labels, self.img_dir = frame, img_dir
        self.transform, self.target_transform = transform, target_transform

    def __getitem__(self, idx):
        img_path = os.path.join(self.img_dir, self.img_labels.iloc[idx, 0])
        image = read_image(img_path)
        label = self.img_labels.iloc[idx, 1]
        if self.transform:
            image = self.transform(image)
        if self.target_transform:
            label = self.target_transform(label)
        return image, label


class DogsCats(torch.utils.data.Dataset):  # Kaggle's dogs and cats: the label derived from the name
    def __init__(self, file_list, transform=None):
        self.file_list, self.transform = file_list, transform

    def __getitem__(self, idx):
        img_path = self.file_list[idx]
        img = Image.open(img_path).convert("RGB")
        label = 1 if "dog" in os.path.basename(img_path) else 0
        if self.transform:
            img = self.transform(img)
        return img, label


class ImageFolderCustom(torch.utils.data.Dataset):  # a PyTorch course's: a method opens, a path's folder labels
    def __init__(self, paths, transform=None):
        self.paths, self.transform = paths, transform
        self.class_to_idx = {"cat": 0, "dog": 1}

    def load_image(self, index: int) -> Image.Image:
        image_path = self.paths[index]
        return Image.open(image_path)

    def __getitem__(self, index: int):
        img = self.load_image(index)
        class_name = self.paths[index].parent.name
        class_idx = self.class_to_idx[class_name]
        if self.transform:
            return self.transform(img), class_idx
        else:
            return img, class_idx


class Shifted(Files):  # no shape: its own arithmetic on the label (served by the drop-in)
    def __getitem__(self, idx):
        image = Image.open(self.image_paths[idx]).convert("RGB")
        label = self.labels[idx] + 1
        if self.transform:
            image = self.transform(image)
        return image, label


def _cleared() -> None:
    for module in (_filelist, _fileshapes, _inline, _itemsource):
        for value in vars(module).values():
            if hasattr(value, "cache_clear"):
                value.cache_clear()


def _reading(dataset, every: bool) -> float:
    """Seconds one reading of `dataset` takes, its caches cleared; `every`: every shape written out."""
    features = _fileshapes._features
    _cleared()
    if every:
        _fileshapes._features = lambda code: features(code) | _fileshapes.EVERY | {"os", "path", "join"}
    try:
        start = time.perf_counter()
        _filelist.file_list(dataset)
        return time.perf_counter() - start
    finally:
        _fileshapes._features = features


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        names = [f"{kind}/{kind}.{k}.jpg" for k in range(4) for kind in ("cat", "dog")]
        paths = [str(Path(tmp, name)) for name in names]
        labels = [int(name.startswith("dog")) for name in names]
        datasets = {"Files": Files(paths, labels),
                    "CustomImageDataset": CustomImageDataset(pd.DataFrame({"file": names, "label": labels}), tmp),
                    "DogsCats": DogsCats(paths),
                    "ImageFolderCustom": ImageFolderCustom([Path(p) for p in paths]),
                    "Shifted (no shape)": Shifted(paths, labels)}
        read = {name: _filelist.file_list(dataset) is not None for name, dataset in datasets.items()}
        sides = ("only the shapes it could be", "every shape")
        times = {name: {side: [] for side in sides} for name in datasets}
        for r in range(args.rounds):
            for name, dataset in datasets.items():
                for side in sides if r % 2 == 0 else reversed(sides):
                    times[name][side].append(_reading(dataset, every=side == "every shape"))
        _cleared()
    report = {}
    for name, sided in times.items():
        now, every = (_common.median(sided[side]) for side in sides)
        low, high = _common.ratio_ci(sided["every shape"], sided[sides[0]])
        print(f"{name:20} {'read' if read[name] else 'unread'}: {now * 1e3:6.1f} ms against {every * 1e3:6.1f} ms"
              f" with every shape written out: {every / now:5.1f}x faster (95% interval {low:.1f}-{high:.1f})")
        report[name] = {"read": read[name], "seconds": sided, "median_ms": {s: _common.median(sided[s]) * 1e3
                                                                            for s in sides},
                        "ratio": every / now, "ratio_ci95": [low, high]}
    _common.write("run_reading", {"rounds": args.rounds, "classes": report}, args.json)


if __name__ == "__main__":
    main()
