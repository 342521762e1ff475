"""`fastdata run` serving torchvision's in-memory datasets natively: CIFAR10 and CIFAR100 (their
`data`, uint8 NHWC in a numpy array) and MNIST, FashionMNIST, KMNIST and EMNIST (uint8 NHW in a
tensor), whose `__getitem__` makes a PIL image of one row and runs the transform on it, sample
by sample, in Python: at 32x32 pixels that is most of a training step's time.

`lower_arrays` reads the transform those scripts use: the geometry on the PIL image or uint8
tensor (RandomCrop with its padding and pad_if_needed, CenterCrop, Pad, horizontal and vertical
flips, each its exact torchvision class), then what the folders' lowering reads after the
geometry (`_lowering.lower_transform`: the conversion, Normalize, RandomErasing). `gather` runs
the geometry on a batch's rows at once: numpy's pad (the one torchvision's PIL pad calls for
edge, reflect and symmetric; its constant pad is Pillow's expand, the same fill), windows cut
at per-sample offsets, flips by mask. The batch then takes the folders' way (`NativeFolder`'s
collation, `Finish`'s lookup-table layout), so the values are torchvision's for the same crop
offsets and flips, drawn from a seed per batch as the folders' are.
"""

from __future__ import annotations

import operator
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ._lowering import Lowering, Unlowerable, flatten, folder, lower, lower_transform
from ._torchvision import FolderError, NativeFolder

_MODES = ("constant", "edge", "reflect", "symmetric")
_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def lower_any(dataset: Any) -> tuple[Lowering | None, str]:
    """`_lowering.lower` for a torchvision image folder, else `lower_arrays`."""
    lowering, why = lower(dataset)
    return (lowering, why) if lowering is not None or why else lower_arrays(dataset)


def _kind(dataset: Any) -> str | None:
    """"cifar" or "mnist" for the torchvision datasets whose `__getitem__` is CIFAR10's or
    MNIST's own (QMNIST has its own), else None."""
    if "torchvision" not in sys.modules:  # a script that made a torchvision dataset imported it; never here
        return None
    from torchvision.datasets import CIFAR10, MNIST

    get = getattr(type(dataset), "__getitem__", None)
    if isinstance(dataset, CIFAR10) and get is CIFAR10.__getitem__:
        return "cifar"
    if isinstance(dataset, MNIST) and get is MNIST.__getitem__:
        return "mnist"
    return None


def lower_arrays(dataset: Any) -> tuple[Lowering | None, str]:
    """(the lowering, "") when `dataset` (or the dataset under its Subsets) is an in-memory one
    served natively; (None, why not) for one that is not; (None, "") for any other dataset."""
    ds = folder(dataset)
    kind = _kind(ds)
    if kind is None:
        return None, ""
    channels = 3 if kind == "cifar" else 1
    if ds.transform is None:
        return None, "no transform: the samples are PIL images, which fastdata does not lay out"
    import torchvision.transforms as T

    try:
        ops = flatten(ds.transform)
        geometry, rest = _split(ops, type(ds).__name__)
        lowering = lower_transform(T.Compose(rest))
        for step in lowering.steps:
            if step[0] == "normalize" and channels == 1 and max(len(step[1]), len(step[2])) > 1:
                raise Unlowerable("Normalize with 3 means or stds for 1-channel images: torchvision raises; "
                                  "not lowered")
        if lowering.erasing and channels == 1:
            raise Unlowerable("RandomErasing on 1-channel images: not lowered")
    except Unlowerable as e:
        return None, str(e)
    except (ValueError, TypeError) as e:  # a parameter fastdata does not read
        return None, f"a parameter fastdata does not lower ({e})"
    return replace(lowering, geometry=tuple(geometry), names=", ".join(type(op).__name__ for op in ops),
                   sized=True, channels=channels, in_memory=True), ""


def _split(ops: list, name: str) -> tuple[list, list]:
    """(the geometry as `gather`'s ops, the other ops in their order). The geometry may stand
    anywhere before Normalize, RandomErasing and any other op: it moves before the conversions
    (ToTensor, PILToTensor, ToImage, ToDtype, ConvertImageDtype), which it commutes with (each
    maps each value on its own; after a scaling one, only a fill of 0, which stays 0)."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    keeping = (T.PILToTensor, v2.PILToTensor, v2.ToImage, getattr(v2, "ToPureTensor", v2.ToImage))
    scaling = (T.ToTensor, getattr(v2, "ToTensor", T.ToTensor), T.ConvertImageDtype, v2.ToDtype)
    geometry: list = []
    rest: list = []
    scaled, closed = False, ""
    for op in ops:
        cls, kind = type(op), type(op).__name__
        if cls in keeping or cls in scaling:
            scaled = scaled or cls in scaling
            rest.append(op)
            continue
        if cls in (T.Normalize, v2.Normalize, T.RandomErasing, v2.RandomErasing):
            closed = closed or kind
            rest.append(op)
            continue
        if closed and cls in (T.RandomCrop, v2.RandomCrop, T.CenterCrop, v2.CenterCrop, T.Pad, v2.Pad,
                              T.RandomHorizontalFlip, v2.RandomHorizontalFlip, T.RandomVerticalFlip,
                              v2.RandomVerticalFlip):
            raise Unlowerable(f"{kind} after {closed}: not lowered for an in-memory dataset")
        if cls in (T.RandomCrop, v2.RandomCrop):
            if op.padding is not None:
                # v2 keeps it parsed as (left, right, top, bottom); v1 as given
                pad = (op.padding[0], op.padding[2], op.padding[1], op.padding[3]) if cls is v2.RandomCrop \
                    else _ltrb(op.padding)
                geometry.append(("pad", pad, *_fill(op, scaled)))
            if op.pad_if_needed:
                geometry.append(("pad_to", tuple(op.size), *_fill(op, scaled)))
            geometry.append(("crop", (int(op.size[0]), int(op.size[1]))))
        elif cls in (T.Pad, v2.Pad):
            geometry.append(("pad", _ltrb(op.padding), *_fill(op, scaled)))
        elif cls in (T.CenterCrop, v2.CenterCrop):
            size = list(op.size) if isinstance(op.size, (list, tuple)) else [op.size]
            geometry.append(("center", (int(size[0]), int(size[-1]))))
        elif cls in (T.RandomHorizontalFlip, v2.RandomHorizontalFlip, T.RandomVerticalFlip, v2.RandomVerticalFlip):
            geometry.append(("flip", 2 if "Horizontal" in kind else 1, float(op.p)))
        else:
            raise Unlowerable(f"{kind} has no faithful lowering for an in-memory dataset ({name}): fastdata lowers "
                              "RandomCrop, CenterCrop, Pad, flips, the conversions, Normalize and RandomErasing there")
    return geometry, rest


def _ltrb(padding: Any) -> tuple[int, int, int, int]:
    """torchvision's padding (an int, or 1, 2 or 4 of them) as (left, top, right, bottom)."""
    p = [padding] if isinstance(padding, int) else [operator.index(x) for x in padding]
    if len(p) == 1:
        p = p * 4
    elif len(p) == 2:
        p = p * 2
    if len(p) != 4 or min(p) < 0:
        raise Unlowerable(f"padding {padding!r}: fastdata lowers 1, 2 or 4 sizes of at least 0")
    return tuple(p)  # type: ignore[return-value]


def _fill(op: Any, scaled: bool) -> tuple[int, str]:
    """(fill, padding_mode) of a padding op: a fill of one int 0-255 (0 once the values are
    scaled: it is then padded on the scaled image) and one of torchvision's modes."""
    fill, mode = op.fill, op.padding_mode
    if type(fill) is not int or not 0 <= fill <= (0 if scaled and mode == "constant" else 255):
        raise Unlowerable(f"{type(op).__name__} with fill {fill!r}: fastdata lowers one int 0-255 (0 on a scaled "
                          "tensor)")
    if mode not in _MODES:
        raise Unlowerable(f"{type(op).__name__} with padding_mode {mode!r}: not lowered")
    return fill, mode


def gather(images: np.ndarray, geometry: tuple, rng: np.random.Generator) -> np.ndarray:
    """`images` (uint8 NHWC, a batch's rows, which it may write) through `geometry`, each op on
    all rows at once; raises ValueError where torchvision's op would raise or pad otherwise
    (the script's own fetch then gives its result)."""
    x = images
    for op in geometry:
        n, height, width = x.shape[:3]
        if op[0] == "pad_to":  # RandomCrop's pad_if_needed: both sides by the shortfall
            dh, dw = max(op[1][0] - height, 0), max(op[1][1] - width, 0)
            op = ("pad", (dw, dh, dw, dh), op[2], op[3])
        if op[0] == "pad":
            left, top, right, bottom = op[1]
            if op[3] != "constant" and (max(left, right) >= width or max(top, bottom) >= height):
                raise ValueError("a reflected padding as wide as the image")  # (torch's reflect raises)
            widths = ((0, 0), (top, bottom), (left, right), (0, 0))
            x = np.pad(x, widths, constant_values=op[2]) if op[3] == "constant" else np.pad(x, widths, op[3])
        elif op[0] == "crop":
            h, w = op[1]
            if height < h or width < w:
                raise ValueError(f"crop {h}x{w} larger than the image, {height}x{width}")
            if (height, width) != (h, w):
                top = rng.integers(0, height - h + 1, n)
                left = rng.integers(0, width - w + 1, n)
                windows = np.lib.stride_tricks.sliding_window_view(x, (h, w), axis=(1, 2))  # [n, i, j, c, h, w]
                x = windows[np.arange(n), top, left].transpose(0, 2, 3, 1)
        elif op[0] == "center":
            h, w = op[1]
            if height < h or width < w:
                raise ValueError(f"a center crop {h}x{w} larger than the image, {height}x{width}")  # (it pads)
            top, left = int(round((height - h) / 2.0)), int(round((width - w) / 2.0))
            x = x[:, top:top + h, left:left + w]
        else:  # flip
            flipped = rng.random(n) < op[2]
            if flipped.any():
                x = np.array(x)
                x[flipped] = np.flip(x[flipped], op[1])
    return x


class NativeArrays(NativeFolder):
    """The dataset a natively served in-memory dataset's loader reads: the script's (or a Subset
    of it), its batches gathered from its `data` and `targets` as they are at that batch
    (`gather`); a single index is the script's own `dataset[index]`. A batch whose rows are not
    what its class's `__getitem__` reads as it does (data of another type or shape, an index out
    of range) is the script's own fetch."""

    def _decoder(self, dataset: Any) -> Any:
        return None

    def _lowered(self, dataset: Any) -> Lowering | None:
        return lower_arrays(dataset)[0]

    def _use(self, lowering: Lowering) -> None:
        self.lowering = lowering

    def _native(self, indices: list[int], lowering: Lowering) -> Any:
        self._use(lowering)
        ds, picked = self._picked(indices)
        try:
            rows, targets = _rows(ds, picked, lowering.channels)
            # One seed a batch from this process's torch RNG, as the folders' (see NativeFolder)
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64)) if lowering.random else 0
            images = np.ascontiguousarray(gather(rows, lowering.geometry, np.random.default_rng(seed)))
        except Exception as e:  # (its own fetch raises the script's error, where it raises)
            raise FolderError(str(e)) from None
        return self._batch(ds, torch.from_numpy(images), targets, np.asarray(picked, np.int64), lowering, seed)


def _rows(ds: Any, indices: list, channels: int) -> tuple[np.ndarray, list]:
    """(uint8 NHWC, targets) of the in-memory dataset `ds`'s `indices`, as its `__getitem__`
    reads them: CIFAR10's `data[i]` (an HWC array, an RGB image) and `targets[i]`; MNIST's
    `data[i]` (an HW tensor, an L image) and `int(targets[i])`. Raises where that would read
    otherwise."""
    data, targets = ds.data, ds.targets
    index = np.asarray([operator.index(i) for i in indices], dtype=np.int64)
    if channels == 3:
        if not (type(data) is np.ndarray and data.dtype == np.uint8 and data.ndim == 4 and data.shape[3] == 3):
            raise TypeError("CIFAR data that is not uint8 NHWC")
        n = len(data)
    else:
        if not (type(data) is torch.Tensor and data.dtype == torch.uint8 and data.dim() == 3 and data.device.type == "cpu"):
            raise TypeError("MNIST data that is not a uint8 NHW tensor")
        n, data = len(data), data.numpy()
    if len(index) and (index.min() < -n or index.max() >= n):
        raise IndexError("an index out of range")
    rows = data[index]
    if channels == 1:
        rows = rows[..., None]
        if type(targets) is torch.Tensor and targets.dim() == 1 and targets.dtype in _INTS:
            return rows, targets[torch.from_numpy(index)].tolist()
        return rows, [int(targets[i]) for i in indices]
    return rows, [targets[i] for i in indices]
