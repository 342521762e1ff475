"""`fastdata run` serving torchvision's in-memory datasets natively: CIFAR10 and CIFAR100 (their
`data`, uint8 NHWC in a numpy array), STL10 and SVHN (uint8 NCHW) and MNIST, FashionMNIST, KMNIST
and EMNIST (uint8 NHW in a tensor), whose `__getitem__` makes a PIL image of one row and runs the
transform on it, sample by sample, in Python: at 32x32 pixels that is most of a training step's time.

`lower_arrays` reads the transform those scripts use (MNIST's images made RGB first: `_made_rgb`):
the geometry on the PIL image or uint8 tensor (RandomCrop with its padding and pad_if_needed, CenterCrop, Pad,
horizontal and vertical flips, Resize, RandomResizedCrop, and on the PIL image RandomRotation,
RandomAffine and RandomPerspective, each its exact torchvision class), then what the folders' lowering reads
after the geometry (`_lowering.lower_transform`: ColorJitter, TrivialAugmentWide, RandAugment,
AutoAugment, GaussianBlur, RandomGrayscale and the other Random* photometric ops, a RandomApply,
RandomChoice or RandomOrder of pixel ops, AugMix, the conversion, Normalize, RandomErasing); a
multi-view wrapper's views (`_views`) each so. `_gather.gather` runs the geometry on a batch's
rows at once, as torchvision's calls on each PIL image; the pixel ops then run on each row as
the folders' do (`transforms.pil`: torchvision's own Pillow calls; AugMix and the
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
from functools import partial
from typing import Any

import numpy as np
import torch

from ..transforms import ops as fd
from ..transforms.pil import FILTERS, apply_pixel_ops
from ..transforms.plan import plan_pixels
from ._gather import Draws, gather
from ._folders import lower, sources
from ._views import converts_to_rgb
from ._wrapped import wrapped
from ._lowering import Lowering, Unlowerable, flatten, lower_transform, lower_views
from ._pixels import CALLS, flip_commutes, interpolation, pixel_op
from ._crop import padding_of
from ._rotation import pillow_geometry
from ._torchvision import FolderError, NativeFolder

_MODES = ("constant", "edge", "reflect", "symmetric")
_INTS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def lower_any(dataset: Any) -> tuple[Lowering | None, str]:
    """`_lowering.lower` for a torchvision image folder, else `lower_arrays`."""
    lowering, why = lower(dataset)
    return (lowering, why) if lowering is not None or why else lower_arrays(dataset)


def _kind(dataset: Any) -> tuple[str | None, str]:
    """("cifar", "mnist" or "chw", "") for the torchvision datasets whose `__getitem__` is
    CIFAR10's, MNIST's, STL10's or SVHN's own; (None, why) for one of theirs that has its own (QMNIST, a script's
    subclass); else (None, "")."""
    if "torchvision" not in sys.modules:  # a script that made a torchvision dataset imported it; never here
        return None, ""
    from torchvision.datasets import CIFAR10, MNIST, STL10, SVHN

    get = getattr(type(dataset), "__getitem__", None)
    for base, kind in ((CIFAR10, "cifar"), (MNIST, "mnist"), (STL10, "chw"), (SVHN, "chw")):
        if isinstance(dataset, base):
            return (kind, "") if get is base.__getitem__ else (None, f"{type(dataset).__name__} overrides __getitem__")
    return None, ""


def lower_arrays(dataset: Any) -> tuple[Lowering | None, str]:
    """(the lowering, "") when `dataset` (or the one dataset under its Subsets, joins and a
    script's wrapper: `_folders.sources`) is an in-memory one served natively; (None, why not)
    for one that is not; (None, "") for any other dataset."""
    found = sources(dataset)
    if len(found) != 1:
        return None, ""
    (ds, wrapper), = found
    kind, why = _kind(ds)
    if kind is None:
        return None, why
    channels = 1 if kind == "mnist" else 3
    transform = ds.transform
    if wrapper is not None:  # (a script's class giving its images a transform: `_wrapped`)
        if transform is not None:
            return None, (f"the {type(ds).__name__} under {type(wrapper).__name__} has a transform of its own: fastdata "
                          "lowers one transform an image")
        transform = wrapped(wrapper)[1]
    if transform is None:
        return None, "no transform: the samples are PIL images, which fastdata does not lay out"
    try:
        return lower_views(transform, lambda transform: _lower_rows(transform, channels, type(ds).__name__)), ""
    except Unlowerable as e:
        return None, str(e)
    except (ValueError, TypeError) as e:  # a parameter fastdata does not read
        return None, f"a parameter fastdata does not lower ({e})"


def _lower_rows(transform: Any, channels: int, name: str) -> Lowering:
    """The lowering of a transform of an in-memory dataset's rows of `channels`; raises
    Unlowerable, saying why, where there is none."""
    import torchvision.transforms as T

    ops = flatten(transform)
    made = _made_rgb(ops) if channels == 1 else ops
    channels = 3 if len(made) < len(ops) else channels
    geometry, rest = _split(made, name, channels == 3)
    lowering = lower_transform(T.Compose(rest))
    for step in lowering.steps:
        if step[0] == "normalize" and channels == 1 and max(len(step[1]), len(step[2])) > 1:
            raise Unlowerable("Normalize with 3 means or stds for 1-channel images: torchvision raises; not lowered")
    if channels == 1 and (lowering.erasing or lowering.pixel_ops):
        raise Unlowerable(f"{'RandomErasing' if lowering.erasing else type(lowering.pixel_ops[0]).__name__} on "
                          "1-channel images: not lowered")
    return replace(lowering, geometry=tuple(geometry), names=", ".join(type(op).__name__ for op in ops),
                   sized=True, channels=channels, in_memory=True)


def _made_rgb(ops: list) -> list:
    """`ops` of a 1-channel image without the first that makes it RGB (Grayscale(num_output_channels=3),
    or a Lambda converting to RGB: `_views.converts_to_rgb`), where only moves of pixels (crops, pads,
    flips: each channel moved alike) and Resize come before it: the rows are made 3 channels, each
    the image's, after the geometry (`NativeArrays._view`), as Pillow's conversion of an L image
    makes them. (A Resize after it then resizes the L rows: Pillow resamples each band of an image
    with the same taps and rounding, so each channel of the RGB image's resize is the L image's.)"""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    moves = (T.RandomCrop, v2.RandomCrop, T.CenterCrop, v2.CenterCrop, T.Pad, v2.Pad, T.RandomHorizontalFlip,
             v2.RandomHorizontalFlip, T.RandomVerticalFlip, v2.RandomVerticalFlip, T.Resize, v2.Resize)
    for k, op in enumerate(ops):
        if (type(op) in (T.Grayscale, v2.Grayscale) and op.num_output_channels == 3) or converts_to_rgb(op):
            return ops[:k] + ops[k + 1:]
        if type(op) not in moves:
            break
    return ops


def _split(ops: list, name: str, rgb: bool) -> tuple[list, list]:
    """(the geometry as `gather`'s ops, the other ops in their order). The geometry may stand
    anywhere before the pixel ops, Normalize and RandomErasing: it moves before the conversions
    (ToTensor, PILToTensor, ToImage, ToDtype, ConvertImageDtype), which it commutes with (each
    maps each value on its own; after a scaling one, only a fill of 0, which stays 0). A Lambda
    converting the PIL image to RGB (`_views.converts_to_rgb`) is dropped where the image is RGB
    (`rgb`): Pillow's convert of an RGB image to RGB is a copy."""
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
        if rgb and not tensor and converts_to_rgb(op):
            continue
        if cls in keeping or cls in scaling:
            scaled, tensor = scaled or cls in scaling, True
            rest.append(op)
            continue
        if cls in (T.Normalize, v2.Normalize, T.RandomErasing, v2.RandomErasing, T.ColorJitter, v2.ColorJitter,
                   T.TrivialAugmentWide, v2.TrivialAugmentWide, T.RandAugment, v2.RandAugment, T.AutoAugment,
                   v2.AutoAugment, T.AugMix, v2.AugMix, T.GaussianBlur, v2.GaussianBlur, T.RandomApply,
                   v2.RandomApply, T.RandomChoice, v2.RandomChoice, T.RandomOrder, v2.RandomOrder, *photometric):
            closed = closed or kind
            domain = "float" if scaled else "uint8" if tensor else "pil"
            pinned = pinned or ("" if cls in (T.Normalize, v2.Normalize) or _flip_commutes(op, domain) else kind)
            rest.append(op)
            continue
        if (pinned if cls in flips else closed) and cls in (
                T.RandomCrop, v2.RandomCrop, T.CenterCrop, v2.CenterCrop, T.Pad, v2.Pad, *flips, T.RandomRotation,
                T.RandomResizedCrop, v2.RandomResizedCrop, T.Resize, v2.Resize,
                v2.RandomRotation, T.RandomAffine, v2.RandomAffine, T.RandomPerspective, v2.RandomPerspective):
            raise Unlowerable(f"{kind} after {pinned if cls in flips else closed}: not lowered for an in-memory "
                              "dataset")
        if cls is v2.RandomCrop:  # one pad: the padding (kept as left, right, top, bottom) and the shortfall
            pad = _padding(op)
            if any(pad) or op.pad_if_needed:
                geometry.append(("pad", pad, *_fill(op, scaled), tensor, tuple(op.size) if op.pad_if_needed else None))
            geometry.append(("crop", (int(op.size[0]), int(op.size[1]))))
        elif cls is T.RandomCrop:  # the padding, then the shortfall, padded apart
            if op.padding is not None:
                geometry.append(("pad", _padding(op), *_fill(op, scaled), tensor, None))
            if op.pad_if_needed:
                geometry.append(("pad", (0, 0, 0, 0), *_fill(op, scaled), tensor, tuple(op.size)))
            geometry.append(("crop", (int(op.size[0]), int(op.size[1]))))
        elif cls in (T.RandomResizedCrop, v2.RandomResizedCrop):
            geometry.append(("resized", *_resized_crop(op, tensor, scaled)))
        elif cls in (T.Resize, v2.Resize):  # (the script's own, on each row: it draws nothing)
            if scaled:
                raise Unlowerable(f"{kind} on a float tensor of an in-memory dataset: fastdata resizes the uint8 rows")
            geometry.append(("resize", op, tensor, _pillow_filter(op)))
        elif cls in (T.Pad, v2.Pad):
            geometry.append(("pad", _padding(op), *_fill(op, scaled), tensor, None))
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
                              "RandomCrop, RandomResizedCrop, Resize, CenterCrop, Pad, flips, RandomRotation, "
                              "RandomAffine, "
                              "RandomPerspective, "
                              "ColorJitter, "
                              "TrivialAugmentWide, RandAugment, AutoAugment, AugMix, GaussianBlur, RandomGrayscale "
                              "and the other Random* photometric ops, RandomApply, RandomChoice and RandomOrder of "
                              "pixel ops, the conversions, "
                              "Normalize and RandomErasing there")
    return geometry, rest


def _resized_crop(op: Any, tensor: bool, scaled: bool) -> tuple:
    """(fastdata's RandomResizedCrop, its boxes drawn as torchvision's get_params draws them; on
    the PIL image the Pillow filter, None; on a uint8 tensor None, the op's own functional
    `resized_crop` with its size, interpolation and antialias, torch's resize there)."""
    kind = type(op).__name__
    size = op.size if isinstance(op.size, (list, tuple)) else (op.size, op.size)
    crop = fd.RandomResizedCrop((int(size[0]), int(size[-1])), scale=tuple(op.scale), ratio=tuple(op.ratio))
    if scaled:
        raise Unlowerable(f"{kind} on a float tensor of an in-memory dataset: fastdata resizes the uint8 rows")
    if tensor:
        import torchvision.transforms.functional as F1
        import torchvision.transforms.v2.functional as F2

        functional = F2 if type(op).__module__.startswith("torchvision.transforms.v2") else F1
        return crop, None, partial(functional.resized_crop, size=op.size, interpolation=op.interpolation,
                                   antialias=op.antialias)
    try:
        mode = interpolation(op).value
    except ValueError as e:  # (its message is the reason)
        raise Unlowerable(str(e)) from None
    if mode not in FILTERS:
        raise Unlowerable(f"{kind} with interpolation {mode}: fastdata lowers bilinear, bicubic and nearest")
    return crop, FILTERS[mode], None


def _pillow_filter(op: Any) -> int | None:
    """The Pillow filter of a Resize's interpolation where the extension has it (2, bilinear, or
    3, bicubic), else None (the script's own Resize then runs on each row)."""
    try:
        mode = interpolation(op).value
    except ValueError:  # (the script's own then raises torchvision's error)
        return None
    return FILTERS[mode] if mode in ("bilinear", "bicubic") else None


def _flip_commutes(op: Any, domain: str) -> bool:
    """Whether torchvision's pixel op `op`, on images of `domain`, commutes with a flip
    (`_pixels.flip_commutes`)."""
    try:
        lowered = pixel_op(op, domain)
    except ValueError:  # (one fastdata does not lower: the lowering says why later)
        return False
    return lowered is not None and flip_commutes(lowered)


def _padding(op: Any) -> tuple[int, int, int, int]:
    """`padding_of`, its ValueError the reason the dataset is not lowered."""
    try:
        return padding_of(op)
    except ValueError as e:
        raise Unlowerable(str(e)) from None


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


class NativeArrays(NativeFolder):
    """The dataset a natively served in-memory dataset's loader reads: the script's (or a Subset
    of it), its batches gathered from its `data` and `targets` (STL10's and SVHN's `labels`) as they are at
    that batch (`gather`); a single index is the script's own `dataset[index]`. A batch whose rows are not
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
        (ds,), _, picked = self._picked(indices)
        try:
            rows, targets = _rows(ds, picked)
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
        if images.shape[-1] < lowering.channels:  # (an L image made RGB: `_made_rgb`)
            images = np.repeat(images, lowering.channels, axis=-1)
        # the pixel ops and RandomErasing draw whatever their parameters (a RandAugment of no op, nothing)
        seed = draws.seed if lowering.random else draws.taken()
        if lowering.pixel_ops:  # (each sample's draws keyed by its place in the batch: see the module)
            plans = plan_pixels(lowering.pixel_ops, seed, 0, np.arange(len(images)), images.shape[1:3])
            for k in range(len(images)):
                apply_pixel_ops(images[k], lowering.pixel_ops, [p[k] for p in plans])
        return torch.from_numpy(images), seed


def _rows(ds: Any, indices: list) -> tuple[np.ndarray, list]:
    """(uint8 NHWC, targets) of the in-memory dataset `ds`'s `indices`, as its `__getitem__`
    reads them: CIFAR10's `data[i]` (an HWC array, an RGB image) and `targets[i]`; STL10's and
    SVHN's `data[i]` (a CHW array) and `int(labels[i])`; MNIST's `data[i]` (an HW tensor, an L image)
    and `int(targets[i])`. Raises where that would read otherwise."""
    kind = _kind(ds)[0]
    data = ds.data
    targets = ds.labels if kind == "chw" else ds.targets
    index = np.asarray([operator.index(i) for i in indices], dtype=np.int64)
    if kind == "cifar":
        if not (type(data) is np.ndarray and data.dtype == np.uint8 and data.ndim == 4 and data.shape[3] == 3):
            raise TypeError("CIFAR data that is not uint8 NHWC")
        n = len(data)
    elif kind == "chw":
        if not (type(data) is np.ndarray and data.dtype == np.uint8 and data.ndim == 4 and data.shape[1] == 3):
            raise TypeError(f"{type(ds).__name__} data that is not uint8 NCHW")
        if targets is None:
            raise TypeError(f"{type(ds).__name__} without labels (its targets are None)")
        n = len(data)
    else:
        if not (type(data) is torch.Tensor and data.dtype == torch.uint8 and data.dim() == 3 and data.device.type == "cpu"):
            raise TypeError("MNIST data that is not a uint8 NHW tensor")
        n, data = len(data), data.numpy()
    if len(index) and (index.min() < -n or index.max() >= n):
        raise IndexError("an index out of range")
    rows = data[index]
    if kind == "chw":
        return rows.transpose(0, 2, 3, 1), [int(targets[i]) for i in indices]
    if kind == "mnist":
        rows = rows[..., None]
        if type(targets) is torch.Tensor and targets.dim() == 1 and targets.dtype in _INTS:
            return rows, targets[torch.from_numpy(index)].tolist()
        return rows, [int(targets[i]) for i in indices]
    return rows, [targets[i] for i in indices]
