"""`fastdata run` reading timm's datasets and transforms as torchvision's.

timm's `ImageDataset` on its `ReaderImageFolder` (what timm's train.py makes of a folder of class
folders: `create_dataset`) reads an image folder as torchvision's ImageFolder does: a list of
(path, class) pairs (`reader.samples`), each file opened by Pillow and converted to RGB, then the
transform; `image_dataset` says whether one is read so. It skips a file Pillow cannot read to the
next index where torchvision raises: a batch with a file fastdata does not read is the dataset's
own fetch, so that skip and its warning are timm's.

What `timm.data.create_transform` builds (timm's train.py, DeiT's, ConvNeXt's and MAE's
fine-tuning main.py) is torchvision's ops but for a few of timm's own classes, which `translated`
gives as the torchvision ops that do the same, so `_lowering` reads the rest as it reads
torchvision's:

- `RandomResizedCropAndInterpolation`: torchvision's RandomResizedCrop (the same box distribution,
  drawn with Python's RNG there and torch's here, and the same `F.resized_crop`); with 'random'
  (train.py's default: bilinear or bicubic, drawn per image), a `FilterDrawn` crop, whose filter
  the decoder draws per image from the same choice.
- `MaybeToTensor` on a PIL image: `F.to_tensor`, ToTensor's; `MaybePILToTensor`: PILToTensor's;
  timm's `ToTensor(dtype)`: PILToTensor, then a cast without scaling (v2's ToDtype, scale=False).
- `RandomErasing` (timm.data.random_erasing): itself, which `_erasing.lowered_timm` reads.

timm's other classes there and in `timm.data.naflex_transforms` crop, pad, resize or convert
(ResizeKeepRatio, CenterCropOrPad, ToNumpy, Patchify, ...): not lowered. Its auto-augments (`rand_augment_transform`'s
RandAugment, AutoAugment, AugMixAugment) are pixel ops on the PIL image of no torchvision class,
so `_pixels` calls them as the script's own ops. Only timm's exact classes are read: a subclass's
own methods may do anything.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any


def _timms(op: Any, module: str, name: str) -> bool:
    return type(op) is getattr(sys.modules.get(f"timm.data.{module}"), name, None)


@dataclass(frozen=True)
class FilterDrawn:
    """A RandomResizedCrop (`crop`, torchvision's) whose filter is drawn per image, uniformly
    from `filters` (names), as timm's crop with interpolation 'random' draws it."""

    crop: Any
    filters: tuple[str, ...]


def image_dataset(dataset: Any) -> str | None:
    """For timm's ImageDataset: "" where it reads a folder as torchvision's ImageFolder does (see
    the module's docstring), else why not; None for any other dataset."""
    if not _timms(dataset, "dataset", "ImageDataset"):
        return None
    reader = getattr(dataset, "reader", None)
    if not _timms(reader, "readers.reader_image_folder", "ReaderImageFolder"):
        return f"ImageDataset with timm's {type(reader).__name__}: not lowered (fastdata reads an image folder)"
    if getattr(dataset, "load_bytes", False):
        return "ImageDataset with load_bytes=True: its samples are the files' bytes"
    mode = getattr(dataset, "input_img_mode", None)
    if mode != "RGB":
        return f"ImageDataset with input_img_mode={mode!r}: fastdata decodes to RGB"
    if getattr(dataset, "additional_features", None) is not None:
        return "ImageDataset with additional_features: not lowered"
    return ""


def is_erasing(op: Any) -> bool:
    """Whether `op` is timm's RandomErasing."""
    return _timms(op, "random_erasing", "RandomErasing")


def translated(op: Any) -> list:
    """torchvision's ops that do what `op` does when it is one of timm's classes above, else
    [op]; ValueError, saying why, for one of timm's that fastdata does not lower."""
    module = type(op).__module__
    if not module.startswith("timm.data.") or module in ("timm.data.auto_augment", "timm.data.random_erasing"):
        return [op]
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    name = type(op).__name__
    if _timms(op, "transforms", "RandomResizedCropAndInterpolation"):
        drawn = isinstance(op.interpolation, (tuple, list))
        with warnings.catch_warnings():  # (timm warned of a range out of order already)
            warnings.simplefilter("ignore")
            crop = T.RandomResizedCrop(op.size, scale=op.scale, ratio=op.ratio,
                                       interpolation=op.interpolation[0] if drawn else op.interpolation)
        if drawn:  # (timm's modes are torchvision's InterpolationMode)
            return [FilterDrawn(crop, tuple(T.InterpolationMode(mode).value for mode in op.interpolation))]
        return [crop]
    if _timms(op, "transforms", "MaybeToTensor"):
        return [T.ToTensor()]
    if _timms(op, "transforms", "MaybePILToTensor"):
        return [T.PILToTensor()]
    if _timms(op, "transforms", "ToTensor"):
        return [T.PILToTensor(), v2.ToDtype(op.dtype, scale=False)]
    raise ValueError(f"timm's {name} has no faithful lowering in fastdata")
