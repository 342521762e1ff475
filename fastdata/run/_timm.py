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
(ResizeKeepRatio, CenterCropOrPad, ToNumpy, Patchify, ...): not lowered.

Its RandAugment and AutoAugment (`rand_augment_transform`'s, `auto_augment_transform`'s:
DeiT's `rand-m9-mstd0.5-inc1`, train.py's `--aa`) run as `TimmAugment`: timm's own `__call__`
(its choice of ops, each op's chance and magnitude, drawn from NumPy's and Python's RNGs in the
process that fetches, as the script's op draws them) on a copy of the op whose AugmentOps compute
their pixels with `_FUNCTIONS`, fastdata's twins of timm.data.auto_augment's pixel functions (on
the decoded array: Pillow's arithmetic, natively where this Pillow's was found, `transforms.pil`
and `transforms.geometry`), each checked once a process against timm's own (`_same`); one not
found the same, or one fastdata has no twin of (the blurs), is timm's own call on the PIL image
(whose Pillow GaussianBlur, the blurs', is computed natively there: `_blur`).
Such an op with a function of the script's, and timm's AugMixAugment, which mixes PIL images
itself, are called as the script's own ops (`_pixels`). Only timm's exact classes are read: a
subclass's own methods may do anything.
"""

from __future__ import annotations

import copy
import functools
import random
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..transforms import geometry, ops as fd, pil
from ._blur import served, withdrawn


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


def is_fast_mixup(op: Any) -> bool:
    """Whether `op` is timm's FastCollateMixup (`_timm_collate`)."""
    return _timms(op, "mixup", "FastCollateMixup")


def is_timm_collate(fn: Any) -> bool:
    """Whether `fn` is timm's fast_collate or FastCollateMixup (`_timm_collate`)."""
    found = getattr(sys.modules.get("timm.data.loader"), "fast_collate", None)
    return (found is not None and fn is found) or is_fast_mixup(fn)


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


@dataclass(frozen=True)
class TimmAugment(fd.Op):
    """timm's RandAugment or AutoAugment after the geometry (see the module's docstring): `call`,
    the op's copy with fastdata's pixel functions, on each image in turn, drawing what timm's
    draws from the RNGs of the process that fetches."""

    call: Any
    draws = 1
    arrays = True  # (`transforms.pil.pixel_ops_on` hands it the decoded array)
    process_rng = True  # (`_decide`: workers would draw elsewhere)

    def plan(self, u: Any) -> list[dict]:
        return [{} for _ in range(len(u))]

    def on_pillow(self, img: Any, p: dict) -> Any:
        return self.call(img)


def timm_augment(op: Any) -> TimmAugment | None:
    """`op` as a TimmAugment where it is timm's RandAugment or AutoAugment of timm's AugmentOps,
    else None."""
    module = sys.modules.get("timm.data.auto_augment")
    if module is None:
        return None
    if type(op) is getattr(module, "RandAugment", None) and isinstance(getattr(op, "ops", None), list):
        ops = [_ours(one, module) for one in op.ops]
        if all(ops):
            twin = copy.copy(op)
            twin.ops = ops
            return TimmAugment(twin)
    if type(op) is getattr(module, "AutoAugment", None) and isinstance(getattr(op, "policy", None), list):
        policy = [[_ours(one, module) for one in sub] if isinstance(sub, (list, tuple)) else [None]
                  for sub in op.policy]
        if all(all(sub) for sub in policy):
            twin = copy.copy(op)
            twin.policy = policy
            return TimmAugment(twin)
    return None


def _ours(op: Any, module: Any) -> Any:
    """A copy of timm's AugmentOp `op` computing its pixels with fastdata's twin of its function
    (`_FUNCTIONS`) where one was found the same, else calling timm's function on the PIL image;
    None for an op of another class or a function that is not one of timm's (the script's, which
    may change the image's size: the op is then the script's own, `_pixels.ScriptOp`)."""
    function = getattr(op, "aug_fn", None)
    name = getattr(function, "__name__", "")
    if type(op) is not getattr(module, "AugmentOp", None) or function is None or \
            getattr(module, name, None) is not function:
        return None
    twin = copy.copy(op)
    twin.aug_fn = _FUNCTIONS[name] if name in _FUNCTIONS and _same(name, function) else functools.partial(
        _on_image, function)
    return twin


def _on_image(function: Any, img: Any, *args: Any, **kwargs: Any) -> Any:
    image = served(geometry.as_image(img))  # (timm's blurs' GaussianBlur native: `_blur`)
    try:
        return function(image, *args, **kwargs)
    finally:
        withdrawn(image)


# timm.data.auto_augment's pixel functions (as timm 1.0 writes them: `_same` checks the installed
# timm's), by name, on an HWC uint8 array or a PIL image: timm's arguments, its draws (a geometric
# op's filter, where its kwargs give a list: Python's random.choice, as timm's `_check_args_tf`)
# and its pixels and errors (Pillow's transform, rotate, ImageOps and ImageEnhance calls, as
# `transforms.pil` and `transforms.geometry` give them), in the form given where native.

def _filter(kwargs: dict) -> Any:
    resample = kwargs.get("resample", 3)  # (timm's default: bicubic)
    return random.choice(resample) if isinstance(resample, (list, tuple)) else resample


def _fill(kwargs: dict) -> Any:
    fill = kwargs.get("fillcolor")
    return 0 if fill is None else fill  # (Pillow's None: black)


def _moved(name: str, img: Any, value: float, **kwargs: Any) -> Any:
    """shear_x, shear_y, translate_x_rel, ..._abs, translate_y_...: Pillow's affine transform."""
    vertical = name in ("shear_y", "translate_y_rel", "translate_y_abs")
    if name.endswith("_rel"):  # (a share of the width or the height)
        w, h = img.size if hasattr(img, "getbands") else (img.shape[1], img.shape[0])
        value = value * (h if vertical else w)
    if name.startswith("shear"):
        data = (1, 0, 0, value, 1, 0) if vertical else (1, value, 0, 0, 1, 0)
    else:
        data = (1, 0, 0, 0, 1, value) if vertical else (1, 0, value, 0, 1, 0)
    return geometry.affine(img, data, _filter(kwargs), _fill(kwargs))


def _rotate(img: Any, degrees: float, **kwargs: Any) -> Any:
    resample = _filter(kwargs)
    return geometry.rotate(img, degrees, resample, None, _fill(kwargs))


def _table(name: str, img: Any, m: Any = 0, **_: Any) -> Any:
    """auto_contrast, invert, equalize, solarize(thresh): ImageOps' call."""
    return pil.trivial_augment(img, {"op": name, "magnitude": m})


def _posterize(img: Any, bits_to_keep: int, **_: Any) -> Any:
    return img if bits_to_keep >= 8 else pil.trivial_augment(img, {"op": "Posterize", "magnitude": bits_to_keep})


def _solarize_add(img: Any, add: int, thresh: int = 128, **_: Any) -> Any:
    if isinstance(img, np.ndarray) and geometry.bands(img) and type(add) is int and type(thresh) is int \
            and pil.native_tables():
        return pil.table_op(img, "SolarizeAdd", (add, thresh))
    return sys.modules["timm.data.auto_augment"].solarize_add(geometry.as_image(img), add, thresh)


def _enhance(kind: int, img: Any, factor: float, **_: Any) -> Any:
    """brightness, contrast, color, sharpness: ImageEnhance's."""
    return pil.enhance(img, kind, factor)


def _desaturate(img: Any, factor: float, **_: Any) -> Any:
    return pil.enhance(img, 2, min(1.0, max(0.0, 1.0 - factor)))


_FUNCTIONS = {
    **{name: functools.partial(_moved, name) for name in ("shear_x", "shear_y", "translate_x_rel", "translate_y_rel",
                                                         "translate_x_abs", "translate_y_abs")},
    "rotate": _rotate, "posterize": _posterize, "solarize_add": _solarize_add, "desaturate": _desaturate,
    **{name: functools.partial(_table, op) for name, op in (("auto_contrast", "AutoContrast"), ("invert", "Invert"),
                                                           ("equalize", "Equalize"), ("solarize", "Solarize"))},
    **{name: functools.partial(_enhance, kind) for kind, name in enumerate(("brightness", "contrast", "color",
                                                                           "sharpness"))},
}

# Each function's arguments in `_same`'s check: both signs, the ends of timm's levels (posterize
# to 0 bits, which Pillow 13 refuses), an exact turn; each with a drawn filter and a fill, a fixed
# one, and neither.
_PROBE_ARGS = {"shear_x": (0.3, -0.17), "shear_y": (0.3, -0.17), "translate_x_rel": (0.45, -0.2),
               "translate_y_rel": (0.45, -0.2), "translate_x_abs": (9.0, -13.5), "translate_y_abs": (9.0, -13.5),
               "rotate": (30.0, -17.3, 90.0, 180.0), "auto_contrast": (), "invert": (), "equalize": (),
               "solarize": (0, 100, 256), "solarize_add": (0, 110), "posterize": (0, 3, 8),
               "brightness": (0.1, 1.9), "contrast": (0.1, 1.9), "color": (0.1, 1.9), "sharpness": (0.1, 1.9),
               "desaturate": (0.0, 0.4, 1.0)}
_PROBE_KWARGS = ({"fillcolor": (128, 64, 7), "resample": (2, 3)}, {"fillcolor": (9, 200, 31), "resample": 3},
                 {"resample": 0})
_SAME: dict[str, bool] = {}


def _same(name: str, theirs: Any) -> bool:
    """Whether `_FUNCTIONS[name]` gives what timm's `theirs` gives (pixels, or the error, and
    Python's RNG after it), checked once a process on 18 x 22 noise with each of `_PROBE_ARGS`
    and `_PROBE_KWARGS`; Python's RNG is left as it was."""
    if name not in _SAME:
        from PIL import Image

        pixels = np.random.default_rng(3).integers(0, 256, (18, 22, 3), dtype=np.uint8)
        saved, same = random.getstate(), True
        try:
            for args in [(a,) for a in _PROBE_ARGS[name]] or [()]:
                for kwargs in _PROBE_KWARGS:
                    got = []
                    for function, img in ((theirs, Image.fromarray(pixels)), (_FUNCTIONS[name], pixels)):
                        random.seed(7)
                        try:
                            out: Any = np.asarray(function(img, *args, **kwargs))
                        except Exception as e:  # (timm's error, where it raises: the twin must raise it too)
                            out = f"{type(e).__name__}: {e}"
                        got.append((out, random.getstate()))
                    (a, state_a), (b, state_b) = got
                    errors = isinstance(a, str), isinstance(b, str)
                    same = same and state_a == state_b and (a == b if all(errors) else
                                                            not any(errors) and np.array_equal(a, b))
        finally:
            random.setstate(saved)
        _SAME[name] = bool(same)
    return _SAME[name]
