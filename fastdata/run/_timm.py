"""`fastdata run` reading timm's transforms as torchvision's: what `timm.data.create_transform`
builds (DeiT's, ConvNeXt's and MAE's fine-tuning main.py build theirs with it on an ImageFolder)
is torchvision's ops but for a few of timm's own classes, which `translated` gives as the
torchvision ops that do the same, so `_lowering` reads the rest as it reads torchvision's:

- `RandomResizedCropAndInterpolation` with one interpolation: torchvision's RandomResizedCrop (the
  same box distribution, drawn with Python's RNG there and torch's here, and the same
  `F.resized_crop`); with 'random' (a filter drawn per image) it is not lowered.
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
from typing import Any


def _timms(op: Any, module: str, name: str) -> bool:
    return type(op) is getattr(sys.modules.get(f"timm.data.{module}"), name, None)


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
        if isinstance(op.interpolation, (tuple, list)):
            raise ValueError(f"{name} with interpolation 'random' (a filter drawn for each image): not lowered")
        with warnings.catch_warnings():  # (timm warned of a range out of order already)
            warnings.simplefilter("ignore")
            return [T.RandomResizedCrop(op.size, scale=op.scale, ratio=op.ratio, interpolation=op.interpolation)]
    if _timms(op, "transforms", "MaybeToTensor"):
        return [T.ToTensor()]
    if _timms(op, "transforms", "MaybePILToTensor"):
        return [T.PILToTensor()]
    if _timms(op, "transforms", "ToTensor"):
        return [T.PILToTensor(), v2.ToDtype(op.dtype, scale=False)]
    raise ValueError(f"timm's {name} has no faithful lowering in fastdata")
