"""`fastdata run`: a served image folder's transform (`fastdata.run._folders`) in fastdata's ops.

`lower_transform` reads the transform op by op (torchvision's v1 and v2 classes, each its exact
class: a subclass may do anything in its own methods) into fastdata's ops: the geometry
(RandomResizedCrop, Resize, CenterCrop, RandomCrop and Pad: `_crop`, RandomHorizontalFlip) that the
decoder applies in one pass, the pixel ops (`_pixels`: ColorJitter, TrivialAugmentWide,
RandAugment, AutoAugment, RandomRotation, RandomAffine, GaussianBlur, RandomGrayscale,
RandomVerticalFlip and the other Random* ops of one functional call, Grayscale to 3 channels, a
RandomApply, RandomChoice or RandomOrder of them, AugMix, an op of the script's, a flip after ops
it may not commute with; a Lambda converting to RGB, the identity there: `_views.converts_to_rgb`)
that run as Pillow, torchvision and the script run them, the tensor steps after
the conversion (ToTensor, PILToTensor, ToImage, ToDtype, ConvertImageDtype, Normalize), run with
the very torch operations torchvision runs, and RandomErasing on the tensor (`_erasing`: its
rectangles drawn per sample, written over the laid-out batch); timm's classes that
`create_transform` adds as the torchvision ops that do the same (`_timm`). It gives the reason
instead for anything else, and the loader falls back to the plain drop-in.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..transforms import ops as fd
from ..transforms.pil import FILTERS
from ._crop import RandomCrop, fits, pad, random_crop
from ._erasing import lowered as lowered_erasing, lowered_timm
from ._pixels import RandomCall, flip_commutes, interpolation, pixel_op, script_ops
from ._timm import FilterDrawn, is_erasing, translated
from ._views import converts_to_rgb, views


def steps_dtype(steps: tuple) -> torch.dtype:
    """The dtype the tensor steps end in (the last conversion's; uint8 without one)."""
    return next((step[1] or torch.get_default_dtype() for step in reversed(steps) if step[0] == "to"), torch.uint8)


@dataclass(frozen=True)
class Lowering:
    """The script's transform as fastdata runs it."""

    geometry: tuple  # fastdata geometric ops, in order
    pixel_ops: tuple  # after the geometry: ColorJitter, the auto-augment ops, Rotation, Affine, AugMix
    resample: str | tuple  # the resize filter of every geometric op; a tuple: drawn per image from it
    steps: tuple  # tensor steps on each CHW image: ("to", dtype, scale) or ("normalize", mean, std)
    names: str  # the script's ops, for the run's summary
    erasing: tuple = ()  # _erasing.Erase per RandomErasing, in order (after the layout, each after its steps)
    # whether torchvision's samples are tv_tensors.Image (v2's ToImage, no ToPureTensor after it):
    # default_collate's batch is a plain tensor either way, a collate_fn of the script's sees the type
    tv_image: bool = False
    sized: bool = True  # whether every image comes out one size (else a batch's may differ)
    # an in-memory dataset's (`fastdata.run._arrays`): its images' channels, and `geometry` is array ops
    channels: int = 3
    in_memory: bool = False
    # a multi-view wrapper's (`_views`): each view's lowering, in order; this one's own ops are then empty
    views: tuple = ()
    tensor_resize: bool = False  # its geometry resizes a tensor: torch's interpolation, horizontal pass first

    @property
    def dtype(self) -> torch.dtype:
        return steps_dtype(self.steps)

    @property
    def script_ops(self) -> tuple[str, ...]:
        """The names of the script's own ops it calls (`_pixels.ScriptOp`), its views' too."""
        return tuple(name for view in self.views for name in view.script_ops) + tuple(script_ops(self.pixel_ops))

    @property
    def own_draws(self) -> tuple[str, ...]:
        """The names of its ops that draw from the RNGs of the process that fetches: the script's
        own ops, timm's auto-augments (`_timm.TimmAugment`); its views' too."""
        return tuple(name for view in self.views for name in view.own_draws) + tuple(
            script_ops(self.pixel_ops, drawing=True))

    @property
    def random(self) -> bool:
        """Whether the transform has a random op. torchvision's draw from torch's RNG whatever
        their parameters (a flip with p=1 too); the others draw nothing."""
        if self.views:
            return any(view.random for view in self.views)
        drawing = [op for op in self.pixel_ops if not (isinstance(op, fd.RandAugment) and op.num_ops == 0)]
        if self.in_memory:  # (its geometry: `_arrays`' ops, tuples; a crop draws where it can move: `_gather.Draws`)
            return bool(drawing or self.erasing) or any(op[0] in ("flip", "rotate", "resized") for op in self.geometry)
        return bool(drawing or self.erasing) or any(
            isinstance(op, (fd.RandomResizedCrop, fd.RandomHorizontalFlip, RandomCrop)) for op in self.geometry)


class Unlowerable(Exception):
    """Why a transform cannot be served natively (the run's summary says it)."""


def lower_views(transform: Any, lower_one: Any) -> Lowering:
    """`lower_one(transform)`, or for a multi-view wrapper (`_views.views`), the lowering of its views."""
    found = views(transform)
    if found is None:
        return lower_one(transform)
    name, lowered = type(transform).__name__, []
    for k, view in enumerate(found):
        try:
            lowered.append(lower_one(view))
        except Unlowerable as e:
            raise Unlowerable(f"{name}'s view {k + 1}: {e}") from None
    names = [f"({view.names})" for view in lowered]
    if len(set(names)) == 1:
        said = f"{len(lowered)} views of {names[0]}"
    else:  # each run of views alike once: DINO's "(...), (...), 8 of (...)"
        runs = [(nm, len(list(group))) for nm, group in itertools.groupby(names)]
        said = f"{len(lowered)} views: " + ", ".join(nm if n == 1 else f"{n} of {nm}" for nm, n in runs)
    first = lowered[0]
    return Lowering((), (), first.resample, (), f"{name}: {said}",
                    tv_image=any(v.tv_image for v in lowered), sized=all(v.sized for v in lowered),
                    channels=first.channels, in_memory=first.in_memory, views=tuple(lowered))


def samples_refused(lowering: Lowering) -> str:
    """Why a collate_fn of the script's is not handed fastdata's samples for this lowering (it
    gets the dataset's own), or "": images that may come out in different sizes (fastdata decodes
    a batch into one tensor), or samples torchvision gives as tv_tensors.Image."""
    if not lowering.sized:
        return "its images may come out in different sizes, which a collate_fn of the script's may take"
    if lowering.tv_image:
        return "its samples are tv_tensors.Image (ToImage without ToPureTensor)"
    return ""


def flatten(transform: Any) -> list:
    """The ops a transform runs in turn (Composes and thin wrappers opened, a weights' preset expanded)."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    if type(transform) in (T.Compose, v2.Compose):
        return [op for t in transform.transforms for op in flatten(t)]
    presets = sys.modules.get("torchvision.transforms._presets")
    if presets is not None and type(transform) is presets.ImageClassification:
        t = transform  # a weights' transforms() (the model docs' evaluation): its forward is these v1 ops in turn
        return [T.Resize(t.resize_size, t.interpolation, antialias=t.antialias), T.CenterCrop(t.crop_size),
                T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(t.mean, t.std)]
    inner = _wrapped(transform)
    return [transform] if inner is None else flatten(inner)


class _Preset:  # a thin wrapper of a Compose, as torchvision's references' presets.py writes one
    def __call__(self, img):
        return self.transforms(img)


def _wrapped(transform: Any) -> Any:
    """The transform a thin wrapper calls (a `__call__` with _Preset's instructions, names and
    constants, and `transforms` the instance's own, found plainly), or None."""
    cls, ref = type(transform), _Preset.__call__.__code__
    code = getattr(getattr(cls, "__call__", None), "__code__", None)
    plain = cls.__getattribute__ is object.__getattribute__ and not any("transforms" in vars(c) for c in cls.__mro__)
    same = code is not None and all(getattr(code, k) == getattr(ref, k) for k in ("co_code", "co_names", "co_consts"))
    return getattr(transform, "__dict__", {}).get("transforms") if plain and same else None


def _no_lowering(op: Any) -> Unlowerable:
    cls = type(op)
    base = None if cls.__module__.startswith("torchvision.") else next(
        (c for c in cls.__mro__[1:] if c.__module__.startswith("torchvision.")), None)
    why = f"{cls.__name__} has no faithful lowering in fastdata"
    if base is not None:  # its own methods may do anything: only torchvision's classes are read
        why += f" (a subclass of torchvision's {base.__name__}: fastdata lowers torchvision's own classes)"
    return Unlowerable(why)


def _filter(op: Any, tensor: bool) -> str:
    try:
        mode = interpolation(op)
    except ValueError as e:  # (its message is the reason)
        raise Unlowerable(str(e)) from None
    if mode.value not in FILTERS:
        raise Unlowerable(f"{type(op).__name__} with interpolation {mode.value}: fastdata lowers bilinear, bicubic "
                          "and nearest")
    if tensor and (mode.value != "bilinear" or getattr(op, "antialias", True) is False):
        raise Unlowerable(f"{type(op).__name__} on a tensor image, {mode.value}, antialias={op.antialias}: fastdata "
                          "lowers tensor resizes only as antialiased bilinear (Pillow's filter)")
    return mode.value


def _size(size: Any, pair: bool = False) -> Any:
    """torchvision's size as fastdata's op takes it: an int, or an (h, w) pair (always with `pair`)."""
    if isinstance(size, (list, tuple)) and len(size) != 1:
        return (int(size[0]), int(size[1]))
    size = int(size[0] if isinstance(size, (list, tuple)) else size)
    return (size, size) if pair else size


def lower_transform(transform: Any, start: str = "pil") -> Lowering:
    """The lowering of a torchvision transform of a PIL image (`start` "uint8": of a uint8 tensor,
    as torchvision.io reads a file); raises Unlowerable, saying why, where there is none."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    if transform is None:
        raise Unlowerable(f"no transform: the samples are {'PIL images' if start == 'pil' else 'uint8 tensors'}, "
                          "which fastdata does not lay out")
    ops = flatten(transform)
    if len(ops) == 1 and ops[0] is transform and not type(transform).__module__.startswith("torchvision."):
        raise _no_lowering(transform)  # the script's own transform as a whole (a wrapper fastdata does not read)
    names = ", ".join(type(op).__name__ for op in ops)
    try:  # timm's classes as the torchvision ops that do the same (`_timm`)
        ops = [one for op in ops for one in translated(op)]
    except ValueError as e:  # (its message is the reason)
        raise Unlowerable(str(e)) from None
    geometry: list = []
    pixel: list = []
    pixel_names: list[str] = []  # the script's names of the pixel ops
    steps: list = []
    erasing: list = []
    tv_image = tensor_resize = False
    filters: set[str] = set()
    domain = start  # "pil", then "uint8" or "float": what the next op gets
    # the (h, w) every image has after the geometry so far, when it is fixed (for CenterCrop)
    fixed: tuple[int, int] | None = None
    short_side: int | None = None
    padding: str | None = None  # what may have padded the image (then no resize may follow)
    modal: str | None = None  # what padded it in a mode other than constant (then nothing else may pad)
    to_tensor = (T.ToTensor, getattr(v2, "ToTensor", T.ToTensor))  # v2's (deprecated): the same conversion
    # the geometry that only moves pixels (and pads): after a padding (no resize blends its edge), and
    # on a float tensor, the same moves of the uint8 image before the tensor steps (each step per
    # value; zeros pad before a Normalize)
    moves = (T.RandomCrop, v2.RandomCrop, T.CenterCrop, v2.CenterCrop, T.Pad, v2.Pad, T.RandomHorizontalFlip,
             v2.RandomHorizontalFlip)
    pure = getattr(v2, "ToPureTensor", None)  # torchvision 0.16 on

    def check_geometry(op: Any) -> None:
        if padding and not isinstance(op, moves):
            raise Unlowerable(f"{type(op).__name__} after {padding}: torchvision blends the padding's edge into the "
                              "resize")
        # (a horizontal flip after pixel ops that commute with it: the decoder's may come first)
        if pixel and not (type(op) in (T.RandomHorizontalFlip, v2.RandomHorizontalFlip) and all(
                flip_commutes(one) for one in pixel)):
            raise Unlowerable(f"{type(op).__name__} after {pixel_names[-1]}: fastdata's decoder applies the "
                              "geometry first")
        if erasing:
            raise Unlowerable(f"{type(op).__name__} after RandomErasing: fastdata erases the laid-out batch")
        if domain == "float" and not isinstance(op, moves):
            raise Unlowerable(f"{type(op).__name__} on a float tensor: fastdata resizes uint8 images")

    def pads(what: str, op: Any = None) -> None:  # `what` pads: an op with a mode and fill (a CenterCrop: None)
        nonlocal padding, modal
        how = "" if op is None or (op.mode == "constant" and not any(op.fill)) else \
            op.mode if op.mode != "constant" else f"fill {op.fill}"  # (other than with zeros)
        if domain == "float" and any(step[0] == "normalize" for step in steps):
            raise Unlowerable(f"{what} after Normalize: fastdata pads with zeros before the tensor steps, "
                              "torchvision after them")
        if modal or (padding and how):
            raise Unlowerable(f"{what} after {modal or padding}: fastdata pads an image once where it pads other "
                              "than with zeros")
        padding, modal = padding or what, f"{what} ({how})" if how else None

    try:
        for op in ops:
            kind, cls = type(op).__name__, type(op)
            if cls in (T.RandomResizedCrop, v2.RandomResizedCrop) or cls is FilterDrawn:
                check_geometry(op)
                if cls is FilterDrawn:  # (timm's, its filter drawn per image: on a PIL image only)
                    op, drawn = op.crop, op.filters
                    if domain != "pil" or not set(drawn) <= {"bilinear", "bicubic"}:
                        raise Unlowerable(f"RandomResizedCropAndInterpolation drawing its filter from "
                                          f"{', '.join(drawn)} on a {'PIL image' if domain == 'pil' else 'tensor'}: "
                                          "not lowered")
                    filters.add(drawn)
                else:
                    filters.add(_filter(op, domain != "pil"))
                tensor_resize = tensor_resize or domain != "pil"
                size = _size(op.size)
                geometry.append(fd.RandomResizedCrop(size, scale=tuple(op.scale), ratio=tuple(op.ratio)))
                fixed, short_side = _size(size, pair=True), None
            elif cls in (T.Resize, v2.Resize):
                check_geometry(op)
                if op.max_size is not None:
                    raise Unlowerable(f"{kind} with max_size: not lowered")
                filters.add(_filter(op, domain != "pil"))
                tensor_resize = tensor_resize or domain != "pil"
                size = _size(op.size)
                geometry.append(fd.Resize(size))
                if isinstance(size, int):
                    fixed, short_side = None, size
                else:
                    fixed, short_side = size, None
            elif cls in (T.CenterCrop, v2.CenterCrop):
                check_geometry(op)
                h, w = _size(op.size, pair=True)
                # torchvision pads an image smaller than the crop with zeros, as fastdata's decoders do
                if not fits(h, w, fixed, short_side):
                    pads(f"{kind} on images of sizes not known to fit it")
                geometry.append(fd.CenterCrop((h, w)))
                fixed, short_side = (h, w), None
            elif cls in (T.RandomCrop, v2.RandomCrop):  # (a ValueError from random_crop says why not)
                check_geometry(op)
                crop = random_crop(op, fixed, domain)
                geometry += [crop] if crop is not None else []
                if crop is not None and (any(crop.padding) or crop.pad_if_needed and not fits(*crop.size, fixed,
                                                                                                 short_side)):
                    pads(f"{kind}'s padding" if any(crop.padding) else f"{kind} on images of sizes not known to fit "
                         "it", crop)  # (its window may reach past the image)
                fixed, short_side = (fixed, short_side) if crop is None else (crop.size, None)
            elif cls in (T.Pad, v2.Pad):
                check_geometry(op)
                padded = pad(op, domain)  # (a ValueError says why not)
                if padded is not None:
                    pads(kind, padded)
                    geometry.append(padded)
                    fixed = None if fixed is None else padded.padded_size(*fixed)
                    short_side = None
            elif cls in (T.RandomHorizontalFlip, v2.RandomHorizontalFlip):
                if pixel and not erasing and not all(flip_commutes(one) for one in pixel):
                    # after pixel ops it may not commute with (a blur): torchvision's flip of their image
                    pixel.append(RandomCall(float(op.p), "hflip", (), cls is v2.RandomHorizontalFlip, domain != "pil"))
                else:
                    check_geometry(op)
                    geometry.append(fd.RandomHorizontalFlip(float(op.p)))
            elif cls in to_tensor:
                if domain != "pil" or steps:
                    raise Unlowerable(f"{kind} of a tensor: not lowered")
                steps.append(("to", None, "div"))
                domain = "float"
            elif cls in (T.PILToTensor, v2.PILToTensor, v2.ToImage):
                tv_image = cls is v2.ToImage
                if domain != "pil" and not (tv_image and domain == "uint8"):  # (ToImage wraps a uint8 tensor)
                    raise Unlowerable(f"{kind} of a tensor: not lowered")
                domain = "uint8"
            elif cls is T.ConvertImageDtype:
                domain = _to(steps, domain, op.dtype, "div", kind)
            elif cls is v2.ToDtype:
                if isinstance(op.dtype, dict):
                    raise Unlowerable(f"{kind} with a dtype per type: not lowered")
                domain = _to(steps, domain, op.dtype, "mul" if op.scale else None, kind)
            elif cls is pure and domain != "pil":
                tv_image = False  # an Image as a plain tensor (default_collate's batch is one anyway)
            elif cls in (T.Normalize, v2.Normalize):
                if domain != "float":
                    raise Unlowerable(f"{kind} of a {'PIL image' if domain == 'pil' else 'uint8 tensor'}: "
                                      "torchvision refuses it; not lowered")
                steps.append(_normalize(op, steps_dtype(tuple(steps))))
            elif cls in (T.RandomErasing, v2.RandomErasing) or is_erasing(op):
                try:
                    erasing.append(lowered_timm(op, domain, len(steps)) if is_erasing(op) else
                                   lowered_erasing(op, cls is v2.RandomErasing, domain, len(steps)))
                except ValueError as e:  # (its message is the reason)
                    raise Unlowerable(str(e)) from None
            elif domain == "pil" and converts_to_rgb(op):
                pass  # (the identity on the RGB image a folder gives, which the pixel ops keep RGB: `_views`)
            else:  # (after the geometry: pixel ops)
                try:
                    lowered = pixel_op(op, domain)
                except ValueError as e:  # (its message is the reason)
                    raise Unlowerable(str(e)) from None
                if lowered is None:
                    raise _no_lowering(op)
                if erasing:  # (torchvision's op would change the erased rectangles too)
                    raise Unlowerable(f"{kind} after RandomErasing: fastdata erases the laid-out batch, after the "
                                      "pixel ops")
                pixel.append(lowered)
            if len(pixel) > len(pixel_names):
                pixel_names.append(kind)
    except (ValueError, TypeError) as e:  # a parameter fastdata's op refuses
        raise Unlowerable(f"a parameter fastdata does not lower ({e})") from None
    if domain == "pil":
        raise Unlowerable("the transform gives PIL images, which fastdata does not lay out")
    if len(filters) > 1:
        said = sorted(f if isinstance(f, str) else " or ".join(f) for f in filters)
        raise Unlowerable(f"geometric ops with different interpolations ({', '.join(said)}): not lowered")
    return Lowering(tuple(geometry), tuple(pixel), filters.pop() if filters else "bilinear", tuple(steps), names,
                    tuple(erasing), tv_image, fixed is not None, tensor_resize=tensor_resize)


def _normalize(op: Any, dtype: torch.dtype) -> tuple:
    """Normalize's step; where torchvision raises (a std of zero in the image's dtype, a mean or
    std that does not broadcast over 3 channels), none: the script's own transform raises it."""
    # (v1's Normalize takes a number or a tensor too: torchvision broadcasts it as a tensor)
    mean, std = (tuple(torch.as_tensor(x, dtype=torch.float64).reshape(-1).tolist()) for x in (op.mean, op.std))
    kind = type(op).__name__
    if len(mean) not in (1, 3) or len(std) not in (1, 3):
        raise Unlowerable(f"{kind} with {len(mean)} means and {len(std)} stds for 3 channels: torchvision raises; "
                          "not lowered")
    if torch.as_tensor(std, dtype=dtype).eq(0).any():
        raise Unlowerable(f"{kind} with a std of zero in {dtype}: torchvision raises; not lowered")
    return ("normalize", mean, std)


def _to(steps: list, domain: str, dtype: torch.dtype, scale: str | None, kind: str) -> str:
    if domain == "pil":
        raise Unlowerable(f"{kind} of a PIL image: not lowered")
    if any(step[0] == "to" for step in steps):
        raise Unlowerable(f"a second dtype conversion ({kind}): not lowered")
    if not dtype.is_floating_point:
        if dtype == torch.uint8 and domain == "uint8":
            return domain
        raise Unlowerable(f"{kind} to {dtype}: fastdata lowers conversions to uint8 and float dtypes")
    steps.append(("to", dtype, scale if domain == "uint8" else None))
    return "float"
