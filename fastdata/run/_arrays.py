"""`fastdata run` serving torchvision's in-memory datasets natively: CIFAR10 and CIFAR100 (their
`data`, uint8 NHWC in a numpy array) and MNIST, FashionMNIST, KMNIST and EMNIST (uint8 NHW in a
tensor), whose `__getitem__` makes a PIL image of one row and runs the transform on it, sample
by sample, in Python: at 32x32 pixels that is most of a training step's time.

`lower_arrays` reads the transform those scripts use: the geometry on the PIL image or uint8
tensor (RandomCrop with its padding and pad_if_needed, CenterCrop, Pad, horizontal and vertical
flips, and on the PIL image RandomRotation, RandomAffine and RandomPerspective, each its exact
torchvision class), then what the folders' lowering reads after the geometry
(`_lowering.lower_transform`: ColorJitter, TrivialAugmentWide, RandAugment, AutoAugment,
GaussianBlur, RandomGrayscale and the other Random* photometric ops, a RandomApply of pixel ops,
AugMix, the conversion, Normalize, RandomErasing). `gather` runs the geometry on a batch's rows
at once: numpy's pad (the one torchvision's PIL pad calls for edge, reflect and symmetric; its
constant pad is Pillow's expand, the same fill), windows cut at per-sample offsets, flips by
mask, a rotation by Pillow's rotate of each row (the call torchvision makes), an affine or
perspective map by torchvision's own `F.affine` or `F.perspective`; the pixel ops then run on
each row as the folders' do (`transforms.pil`: torchvision's own Pillow calls; AugMix and the
ops on a tensor, its tensor kernels). The batch then takes the folders' way (`NativeFolder`'s
collation, `Finish`'s lookup-table layout), so the values are torchvision's for the same crop
offsets, flips and pixel-op parameters, drawn from a seed per batch as the folders' are, and per
sample by its place in the batch (a sample drawn twice into one batch, as a sampler with
replacement may, gets two draws, as torchvision gives it).
"""

from __future__ import annotations

import operator
import sys
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ..transforms.pil import apply_pixel_ops
from ..transforms.plan import plan_pixels
from ._lowering import Lowering, Unlowerable, flatten, folder, lower, lower_transform, lower_views
from ._pixels import CALLS, flip_commutes, pixel_op
from ._rotation import pillow_geometry
from ._torchvision import FolderError, NativeFolder

_MODES = ("constant", "edge", "reflect", "symmetric")
_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def lower_any(dataset: Any) -> tuple[Lowering | None, str]:
    """`_lowering.lower` for a torchvision image folder, else `lower_arrays`."""
    lowering, why = lower(dataset)
    return (lowering, why) if lowering is not None or why else lower_arrays(dataset)


def _kind(dataset: Any) -> tuple[str | None, str]:
    """("cifar" or "mnist", "") for the torchvision datasets whose `__getitem__` is CIFAR10's or
    MNIST's own; (None, why) for one of theirs that has its own (QMNIST, a script's subclass);
    else (None, "")."""
    if "torchvision" not in sys.modules:  # a script that made a torchvision dataset imported it; never here
        return None, ""
    from torchvision.datasets import CIFAR10, MNIST

    get = getattr(type(dataset), "__getitem__", None)
    for base, kind in ((CIFAR10, "cifar"), (MNIST, "mnist")):
        if isinstance(dataset, base):
            return (kind, "") if get is base.__getitem__ else (None, f"{type(dataset).__name__} overrides __getitem__")
    return None, ""


def lower_arrays(dataset: Any) -> tuple[Lowering | None, str]:
    """(the lowering, "") when `dataset` (or the dataset under its Subsets) is an in-memory one
    served natively; (None, why not) for one that is not; (None, "") for any other dataset."""
    ds = folder(dataset)
    kind, why = _kind(ds)
    if kind is None:
        return None, why
    channels = 3 if kind == "cifar" else 1
    if ds.transform is None:
        return None, "no transform: the samples are PIL images, which fastdata does not lay out"
    try:
        return lower_views(ds.transform, lambda transform: _lower_rows(transform, channels, type(ds).__name__)), ""
    except Unlowerable as e:
        return None, str(e)
    except (ValueError, TypeError) as e:  # a parameter fastdata does not read
        return None, f"a parameter fastdata does not lower ({e})"


def _lower_rows(transform: Any, channels: int, name: str) -> Lowering:
    """The lowering of a transform of an in-memory dataset's rows of `channels`; raises
    Unlowerable, saying why, where there is none."""
    import torchvision.transforms as T

    ops = flatten(transform)
    geometry, rest = _split(ops, name)
    lowering = lower_transform(T.Compose(rest))
    for step in lowering.steps:
        if step[0] == "normalize" and channels == 1 and max(len(step[1]), len(step[2])) > 1:
            raise Unlowerable("Normalize with 3 means or stds for 1-channel images: torchvision raises; not lowered")
    if channels == 1 and (lowering.erasing or lowering.pixel_ops):
        raise Unlowerable(f"{'RandomErasing' if lowering.erasing else type(lowering.pixel_ops[0]).__name__} on "
                          "1-channel images: not lowered")
    return replace(lowering, geometry=tuple(geometry), names=", ".join(type(op).__name__ for op in ops),
                   sized=True, channels=channels, in_memory=True)


def _split(ops: list, name: str) -> tuple[list, list]:
    """(the geometry as `gather`'s ops, the other ops in their order). The geometry may stand
    anywhere before the pixel ops, Normalize and RandomErasing: it moves before the conversions
    (ToTensor, PILToTensor, ToImage, ToDtype, ConvertImageDtype), which it commutes with (each
    maps each value on its own; after a scaling one, only a fill of 0, which stays 0)."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    keeping = (T.PILToTensor, v2.PILToTensor, v2.ToImage, getattr(v2, "ToPureTensor", v2.ToImage))
    scaling = (T.ToTensor, getattr(v2, "ToTensor", T.ToTensor), T.ConvertImageDtype, v2.ToDtype)
    geometry: list = []
    rest: list = []
    # `closed`: the first op after which no geometry may come; `pinned`: the first after which no flip
    # may come either (a flip commutes with Normalize and with the pixel ops `flip_commutes` names)
    scaled, tensor, closed, pinned = False, False, "", ""
    # the Random* ops of one functional call but the flip (geometry here): RandomGrayscale, RandomSolarize, ...
    photometric = tuple(getattr(M, kind) for kind in CALLS if "Flip" not in kind for M in (T, v2))
    flips = (T.RandomHorizontalFlip, v2.RandomHorizontalFlip, T.RandomVerticalFlip, v2.RandomVerticalFlip)
    for op in ops:
        cls, kind = type(op), type(op).__name__
        if cls in keeping or cls in scaling:
            scaled, tensor = scaled or cls in scaling, True
            rest.append(op)
            continue
        if cls in (T.Normalize, v2.Normalize, T.RandomErasing, v2.RandomErasing, T.ColorJitter, v2.ColorJitter,
                   T.TrivialAugmentWide, v2.TrivialAugmentWide, T.RandAugment, v2.RandAugment, T.AutoAugment,
                   v2.AutoAugment, T.AugMix, v2.AugMix, T.GaussianBlur, v2.GaussianBlur, T.RandomApply,
                   v2.RandomApply, *photometric):
            closed = closed or kind
            domain = "float" if scaled else "uint8" if tensor else "pil"
            pinned = pinned or ("" if cls in (T.Normalize, v2.Normalize) or _flip_commutes(op, domain) else kind)
            rest.append(op)
            continue
        if (pinned if cls in flips else closed) and cls in (
                T.RandomCrop, v2.RandomCrop, T.CenterCrop, v2.CenterCrop, T.Pad, v2.Pad, *flips, T.RandomRotation,
                v2.RandomRotation, T.RandomAffine, v2.RandomAffine, T.RandomPerspective, v2.RandomPerspective):
            raise Unlowerable(f"{kind} after {pinned if cls in flips else closed}: not lowered for an in-memory "
                              "dataset")
        if cls is v2.RandomCrop:  # one pad: the padding (kept as left, right, top, bottom) and the shortfall
            pad = (op.padding[0], op.padding[2], op.padding[1], op.padding[3]) if op.padding else (0, 0, 0, 0)
            if any(pad) or op.pad_if_needed:
                geometry.append(("pad", pad, *_fill(op, scaled), tensor, tuple(op.size) if op.pad_if_needed else None))
            geometry.append(("crop", (int(op.size[0]), int(op.size[1]))))
        elif cls is T.RandomCrop:  # the padding, then the shortfall, padded apart
            if op.padding is not None:
                geometry.append(("pad", _ltrb(op.padding), *_fill(op, scaled), tensor, None))
            if op.pad_if_needed:
                geometry.append(("pad", (0, 0, 0, 0), *_fill(op, scaled), tensor, tuple(op.size)))
            geometry.append(("crop", (int(op.size[0]), int(op.size[1]))))
        elif cls in (T.Pad, v2.Pad):
            geometry.append(("pad", _ltrb(op.padding), *_fill(op, scaled), tensor, None))
        elif cls in (T.CenterCrop, v2.CenterCrop):
            size = list(op.size) if isinstance(op.size, (list, tuple)) else [op.size]
            geometry.append(("center", (int(size[0]), int(size[-1]))))
        elif cls in (T.RandomHorizontalFlip, v2.RandomHorizontalFlip, T.RandomVerticalFlip, v2.RandomVerticalFlip):
            geometry.append(("flip", 2 if "Horizontal" in kind else 1, float(op.p)))
        elif cls in (T.RandomRotation, v2.RandomRotation, T.RandomAffine, v2.RandomAffine, T.RandomPerspective,
                     v2.RandomPerspective):
            try:
                geometry.append(("rotate", pillow_geometry(op, tensor)))
            except ValueError as e:  # (its message is the reason)
                raise Unlowerable(str(e)) from None
        else:
            raise Unlowerable(f"{kind} has no faithful lowering for an in-memory dataset ({name}): fastdata lowers "
                              "RandomCrop, CenterCrop, Pad, flips, RandomRotation, RandomAffine, RandomPerspective, "
                              "ColorJitter, "
                              "TrivialAugmentWide, RandAugment, AutoAugment, AugMix, GaussianBlur, RandomGrayscale "
                              "and the other Random* photometric ops, RandomApply of pixel ops, the conversions, "
                              "Normalize and RandomErasing there")
    return geometry, rest


def _flip_commutes(op: Any, domain: str) -> bool:
    """Whether torchvision's pixel op `op`, on images of `domain`, commutes with a flip
    (`_pixels.flip_commutes`)."""
    try:
        lowered = pixel_op(op, domain)
    except ValueError:  # (one fastdata does not lower: the lowering says why later)
        return False
    return lowered is not None and flip_commutes(lowered)


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
    """(fill, padding_mode) of a padding op: one of torchvision's modes, and for "constant" a
    fill of one int 0-255 (0 once the values are scaled: it is then padded on the scaled image);
    the other modes take no fill."""
    fill, mode = op.fill, op.padding_mode
    if mode not in _MODES:
        raise Unlowerable(f"{type(op).__name__} with padding_mode {mode!r}: not lowered")
    if mode != "constant":
        return 0, mode
    if type(fill) is not int or not 0 <= fill <= (0 if scaled else 255):
        raise Unlowerable(f"{type(op).__name__} with fill {fill!r}: fastdata lowers one int 0-255 (0 on a scaled "
                          "tensor)")
    return fill, mode


class Draws:
    """A batch's random numbers: one seed from this process's torch RNG, drawn at its first use
    (torchvision draws nothing for a crop that cannot move), as the folders' (see NativeFolder)."""

    def __init__(self) -> None:
        self._seed: int | None = None
        self._rng: np.random.Generator | None = None

    @property
    def seed(self) -> int:
        if self._seed is None:
            self._seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        return self._seed

    def taken(self) -> int:
        """The seed if it was drawn, else 0 (without drawing it)."""
        return 0 if self._seed is None else self._seed

    def rng(self) -> np.random.Generator:
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng


def gather(images: np.ndarray, geometry: tuple, draws: Draws) -> np.ndarray:
    """`images` (uint8 NHWC, a batch's rows, which it may write) through `geometry`, each op on
    all rows at once; raises ValueError where torchvision raises (a crop larger than the padded
    image; a reflect or symmetric pad of a tensor past its size, which torch refuses): the
    script's own fetch then raises it."""
    x = images
    for op in geometry:
        n, height, width = x.shape[:3]
        if op[0] == "pad":
            left, top, right, bottom = op[1]
            if op[5] is not None:  # RandomCrop's pad_if_needed: both sides by the shortfall after the padding
                dh, dw = max(op[5][0] - height - top - bottom, 0), max(op[5][1] - width - left - right, 0)
                left, top, right, bottom = left + dw, top + dh, right + dw, bottom + dh
            x = _pad(x, (left, top, right, bottom), op[2], op[3], op[4])
        elif op[0] == "crop":
            h, w = op[1]
            if height < h or width < w:
                raise ValueError(f"crop {h}x{w} larger than the image, {height}x{width}")
            if (height, width) != (h, w):
                rng = draws.rng()
                top = rng.integers(0, height - h + 1, n)
                left = rng.integers(0, width - w + 1, n)
                windows = np.lib.stride_tricks.sliding_window_view(x, (h, w), axis=(1, 2))  # [n, i, j, c, h, w]
                x = windows[np.arange(n), top, left].transpose(0, 2, 3, 1)
        elif op[0] == "center":
            h, w = op[1]
            if h > height or w > width:  # torchvision pads it with zeros first, the odd pixel after
                dh, dw = max(h - height, 0), max(w - width, 0)
                x = _pad(x, (dw // 2, dh // 2, (dw + 1) // 2, (dh + 1) // 2), 0, "constant", False)
                height, width = x.shape[1:3]
            top, left = int(round((height - h) / 2.0)), int(round((width - w) / 2.0))
            x = x[:, top:top + h, left:left + w]
        elif op[0] == "rotate":  # each row as torchvision transforms the PIL image (F.rotate's, F.affine's call)
            from PIL import Image  # (here, not at import: `fastdata run` serves scripts without Pillow)

            rotate = op[1]
            x = np.array(x)
            one = x.shape[3] == 1
            for k, p in enumerate(rotate.plan(draws.rng().random((n, getattr(rotate, "draws", 6))))):
                img = Image.fromarray(x[k, :, :, 0] if one else x[k])
                x[k] = np.asarray(rotate.on_pillow(img, p)).reshape(x[k].shape)
        else:  # flip
            flipped = draws.rng().random(n) < op[2]
            if flipped.any():
                x = np.array(x)
                x[flipped] = np.flip(x[flipped], op[1])
    return x


def _pad(x: np.ndarray, ltrb: tuple, fill: int, mode: str, tensor: bool) -> np.ndarray:
    """numpy's pad, torchvision's for a PIL image in every mode (its constant one, Pillow's
    expand, gives the same fill); on a tensor, torch's reflect takes pads below the size only,
    and torchvision's symmetric one pads up to the size."""
    left, top, right, bottom = ltrb
    height, width = x.shape[1:3]
    if tensor and mode in ("reflect", "symmetric"):
        most = (height - 1, width - 1) if mode == "reflect" else (height, width)
        if max(top, bottom) > most[0] or max(left, right) > most[1]:
            raise ValueError(f"a {mode} padding of {ltrb} on a {height}x{width} tensor")
    widths = ((0, 0), (top, bottom), (left, right), (0, 0))
    return np.pad(x, widths, constant_values=fill) if mode == "constant" else np.pad(x, widths, mode)


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
        except Exception as e:  # (its own fetch raises the script's error, where it raises)
            raise FolderError(str(e)) from None
        views = lowering.views or (lowering,)  # (a multi-view wrapper's: each view from the rows)
        made = [self._view(rows if v == len(views) - 1 else rows.copy(), view) for v, view in enumerate(views)]
        if ds.target_transform is not None:
            targets = [ds.target_transform(t) for t in targets]
        return self._joined([self._batch(images, targets, view, seed) for (images, seed), view in zip(made, views)],
                            targets, lowering)

    def _view(self, rows: np.ndarray, lowering: Lowering) -> tuple[torch.Tensor, int]:
        """(uint8 NHWC images, the seed they were drawn from): `rows` (which it may write)
        through the lowering of one view."""
        draws = Draws()
        try:
            images = np.ascontiguousarray(gather(rows, lowering.geometry, draws))
        except Exception as e:  # (its own fetch raises the script's error, where it raises)
            raise FolderError(str(e)) from None
        # the pixel ops and RandomErasing draw whatever their parameters (a RandAugment of no op, nothing)
        seed = draws.seed if lowering.random else draws.taken()
        if lowering.pixel_ops:  # (each sample's draws keyed by its place in the batch: see the module)
            plans = plan_pixels(lowering.pixel_ops, seed, 0, np.arange(len(images)), images.shape[1:3])
            for k in range(len(images)):
                apply_pixel_ops(images[k], lowering.pixel_ops, [p[k] for p in plans])
        return torch.from_numpy(images), seed


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
