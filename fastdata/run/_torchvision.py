"""`fastdata run` serving torchvision's image folders natively: the decode, crop and resize of a
`torchvision.datasets.ImageFolder` (or `DatasetFolder`) with torchvision's own image loader and a
`Compose` of transforms fastdata can lower, done by fastdata's image pipeline.

`lower(dataset)` reads the script's transform op by op (torchvision's v1 and v2 classes) into
fastdata's ops: the geometry (RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip) that
the decoder applies in one pass, the pixel ops (ColorJitter, TrivialAugmentWide) that run as
Pillow runs them, and the tensor steps after the conversion (ToTensor, PILToTensor, ToImage,
ToDtype, ConvertImageDtype, Normalize), run with the very torch operations torchvision runs. It
gives the reason instead for anything else, and the loader falls back to the plain drop-in.

`NativeFolder` is the dataset the served loader's workers read: `__getitems__` (which torch's
fetcher calls with a batch's indices) reads the files named by the dataset's own `samples`,
decodes them (`image.decode.BatchDecoder`: JPEGs natively, other formats and CMYK with Pillow,
as `convert("RGB")`, the conversion torchvision's loader makes) and returns a `Prepared` batch,
which crosses to the main process as uint8; there `Finish` lays it out as default_collate would
have: `[images, targets]`, the images a contiguous NCHW tensor of the dtype the transform ends
in. Labels are the dataset's, through its `target_transform`. Random parameters follow
torchvision's distributions, drawn per batch from a seed the process's torch RNG gives (in a
worker, the seed torch gave that worker), as torchvision's transforms draw from it per sample.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from .._buffers import ProcessRings, new_batch
from .._collate import Prepared, collate, default_threads
from .._ext import native as _ext
from .._cores import batch_threads
from ..errors import DataError
from ..image.decode import BatchDecoder
from ..image.read import Failures, read_files
from ..transforms import ops as fd
from ..transforms.pil import FILTERS


@dataclass(frozen=True)
class Lowering:
    """The script's transform as fastdata runs it."""

    geometry: tuple  # fastdata geometric ops, in order
    pixel_ops: tuple  # fastdata pixel ops (ColorJitter, TrivialAugment), after the geometry
    resample: str  # the resize filter of every geometric op
    steps: tuple  # tensor steps on each CHW image: ("to", dtype, scale) or ("normalize", mean, std)
    names: str  # the script's ops, for the run's summary

    @property
    def dtype(self) -> torch.dtype:
        dtype = torch.uint8
        for step in self.steps:
            if step[0] == "to":
                dtype = step[1] or torch.get_default_dtype()
        return dtype


class _TrivialAugmentV2(fd.TrivialAugment):
    """torchvision.transforms.v2's TrivialAugmentWide: v1's, with v2's Solarize thresholds."""

    table = "v2"


class Unlowerable(Exception):
    """Why a transform cannot be served natively (the run's summary says it)."""


def lower(dataset: Any) -> tuple[Lowering | None, str]:
    """(the lowering, "") when `dataset` is served natively; (None, why not) otherwise, and
    (None, "") for a dataset that is not a torchvision image folder at all."""
    tv = sys.modules.get("torchvision")  # a script that made a torchvision dataset imported it; never here
    if tv is None:
        return None, ""
    from torchvision.datasets import DatasetFolder
    from torchvision.datasets.folder import default_loader, pil_loader

    if not isinstance(dataset, DatasetFolder):
        return None, ""
    name = type(dataset).__name__
    if type(dataset).__getitem__ is not DatasetFolder.__getitem__:
        return None, f"{name} overrides __getitem__"
    loader = getattr(dataset, "loader", None)
    if not (loader is pil_loader or (loader is default_loader and tv.get_image_backend() == "PIL")):
        return None, f"{name} has its own image loader ({getattr(loader, '__qualname__', type(loader).__name__)})"
    try:
        return _lower_transform(dataset.transform), ""
    except Unlowerable as e:
        return None, str(e)


def _flatten(transform: Any) -> list:
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    if isinstance(transform, (T.Compose, v2.Compose)):
        return [op for t in transform.transforms for op in _flatten(t)]
    inner = _wrapped(transform)
    return [transform] if inner is None else _flatten(inner)


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


def _filter(op: Any, tensor: bool) -> str:
    from torchvision.transforms import InterpolationMode

    mode = op.interpolation
    mode = InterpolationMode(mode) if not isinstance(mode, InterpolationMode) else mode
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


def _lower_transform(transform: Any) -> Lowering:
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    if transform is None:
        raise Unlowerable("no transform: the samples are PIL images, which default_collate cannot batch")
    ops = _flatten(transform)
    names = ", ".join(type(op).__name__ for op in ops)
    geometry: list = []
    pixel: list = []
    steps: list = []
    filters: set[str] = set()
    domain = "pil"  # then "uint8" or "float": what the next op gets
    # the (h, w) every image has after the geometry so far, when it is fixed (for CenterCrop)
    fixed: tuple[int, int] | None = None
    short_side: int | None = None

    def check_geometry(op: Any) -> None:
        if pixel:
            raise Unlowerable(f"{type(op).__name__} after {type(pixel[-1]).__name__}: fastdata's decoder applies the "
                              "geometry first")
        if domain == "float":
            raise Unlowerable(f"{type(op).__name__} on a float tensor: fastdata resizes uint8 images")

    try:
        for op in ops:
            kind = type(op).__name__
            if isinstance(op, (T.RandomResizedCrop, v2.RandomResizedCrop)):
                check_geometry(op)
                filters.add(_filter(op, domain != "pil"))
                size = _size(op.size)
                geometry.append(fd.RandomResizedCrop(size, scale=tuple(op.scale), ratio=tuple(op.ratio)))
                fixed, short_side = _size(size, pair=True), None
            elif isinstance(op, (T.Resize, v2.Resize)):
                check_geometry(op)
                if op.max_size is not None:
                    raise Unlowerable(f"{kind} with max_size: not lowered")
                filters.add(_filter(op, domain != "pil"))
                size = _size(op.size)
                geometry.append(fd.Resize(size))
                if isinstance(size, int):
                    fixed, short_side = None, size
                else:
                    fixed, short_side = size, None
            elif isinstance(op, (T.CenterCrop, v2.CenterCrop)):
                check_geometry(op)
                h, w = _size(op.size, pair=True)
                # torchvision pads an image smaller than the crop; fastdata crops only within it.
                fits = (fixed is not None and h <= fixed[0] and w <= fixed[1]) or (
                    short_side is not None and max(h, w) <= short_side)
                if not fits:
                    raise Unlowerable(f"{kind} on images of sizes not known to fit it (torchvision pads a smaller image): "
                                      "lowered only after a Resize or RandomResizedCrop to at least its size")
                geometry.append(fd.CenterCrop((h, w)))
                fixed, short_side = (h, w), None
            elif isinstance(op, (T.RandomHorizontalFlip, v2.RandomHorizontalFlip)):
                check_geometry(op)
                geometry.append(fd.RandomHorizontalFlip(float(op.p)))
            elif isinstance(op, (T.ColorJitter, v2.ColorJitter)):
                if domain != "pil":
                    raise Unlowerable(f"{kind} on a tensor image: fastdata lowers it as Pillow computes it")
                # torchvision keeps each range as [lo, hi], None where it does nothing (0 here)
                pixel.append(fd.ColorJitter(*(tuple(r) if r is not None else 0.0 for r in
                                              (op.brightness, op.contrast, op.saturation, op.hue))))
            elif isinstance(op, (T.TrivialAugmentWide, v2.TrivialAugmentWide)):
                if domain != "pil":
                    raise Unlowerable(f"{kind} on a tensor image: fastdata lowers it as Pillow computes it")
                from torchvision.transforms import InterpolationMode

                if InterpolationMode(op.interpolation) != InterpolationMode.NEAREST or op.fill not in (None, 0, [0], (0,)):
                    raise Unlowerable(f"{kind} with an interpolation or fill other than the default: not lowered")
                pixel.append((_TrivialAugmentV2 if isinstance(op, v2.TrivialAugmentWide) else fd.TrivialAugment)(
                    int(op.num_magnitude_bins)))
            elif isinstance(op, T.ToTensor) or kind == "ToTensor":  # v2.ToTensor: the same conversion
                if domain != "pil" or steps:
                    raise Unlowerable(f"{kind} of a tensor: not lowered")
                steps.append(("to", None, "div"))
                domain = "float"
            elif isinstance(op, (T.PILToTensor, v2.PILToTensor, v2.ToImage)):
                if domain != "pil":
                    raise Unlowerable(f"{kind} of a tensor: not lowered")
                domain = "uint8"
            elif isinstance(op, T.ConvertImageDtype):
                domain = _to(steps, domain, op.dtype, "div", kind)
            elif isinstance(op, v2.ToDtype):
                if isinstance(op.dtype, dict):
                    raise Unlowerable(f"{kind} with a dtype per type: not lowered")
                domain = _to(steps, domain, op.dtype, "mul" if op.scale else None, kind)
            elif isinstance(op, getattr(v2, "ToPureTensor", ())) and domain != "pil":
                pass  # (torchvision 0.16 on) an Image as a plain tensor: default_collate's batch is one anyway
            elif isinstance(op, (T.Normalize, v2.Normalize)):
                if domain != "float":
                    raise Unlowerable(f"{kind} of a {'PIL image' if domain == 'pil' else 'uint8 tensor'}: "
                                      "torchvision refuses it; not lowered")
                steps.append(("normalize", tuple(float(m) for m in op.mean), tuple(float(s) for s in op.std)))
            else:
                raise Unlowerable(f"{kind} has no faithful lowering in fastdata")
    except (ValueError, TypeError) as e:  # a parameter fastdata's op refuses
        raise Unlowerable(f"a parameter fastdata does not lower ({e})") from None
    if domain == "pil":
        raise Unlowerable("the transform gives PIL images, which default_collate cannot batch")
    if len(filters) > 1:
        raise Unlowerable(f"geometric ops with different interpolations ({', '.join(sorted(filters))}): not lowered")
    return Lowering(tuple(geometry), tuple(pixel), filters.pop() if filters else "bilinear", tuple(steps), names)


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


def _apply_steps(out: torch.Tensor, image: torch.Tensor, steps: tuple) -> None:
    """Writes `image` (uint8 HWC) through `steps` into `out` (CHW), with torchvision's own
    operations: ToTensor's `.to(dtype).div(255)`, ConvertImageDtype's `/ 255`, ToDtype's
    `.mul_(1 / 255)`, Normalize's `.sub_(mean).div_(std)` with float mean and std of the image's
    dtype; so the values are torchvision's, bit for bit, for the same uint8 pixels."""
    out.copy_(image.permute(2, 0, 1))
    for step in steps:
        if step[0] == "to":
            if step[2] == "div":
                out.div_(255)
            elif step[2] == "mul":
                out.mul_(1.0 / 255)
        else:
            _, mean, std = step
            m = torch.as_tensor(mean, dtype=out.dtype).view(-1, 1, 1)
            s = torch.as_tensor(std, dtype=out.dtype).view(-1, 1, 1)
            out.sub_(m).div_(s)


def lookup_table(steps: tuple, dtype: torch.dtype) -> torch.Tensor:
    """[3, 256] of `dtype`: what `steps` make of each uint8 value in each channel, computed by
    `_apply_steps` itself. Every step is per value and per channel, so laying out a batch
    through this table (natively, in one pass) gives `_apply_steps`' values bit for bit."""
    values = torch.arange(256, dtype=torch.uint8).view(1, 256, 1).expand(1, 256, 3)
    out = torch.empty((3, 1, 256), dtype=dtype)
    _apply_steps(out, values, steps)
    return out.view(3, 256)


class FolderBatch(Prepared):
    """A decoded batch (uint8 NHWC, in the process's scratch) and its targets. It crosses to the
    main process as uint8 (a quarter of float32's bytes and shared pages), where `Finish` lays
    it out in the transform's dtype."""

    def __init__(self, images: torch.Tensor, targets: list) -> None:
        self.images, self.targets = images, targets

    def __len__(self) -> int:
        return len(self.images)

    def collate_into(self, ring: Any) -> Any:
        out, handle = new_batch(ring, tuple(self.images.shape), torch.uint8)
        out.copy_(self.images)
        return [handle, collate(self.targets)]


class Finish:
    """The main process's step for a natively served loader: each batch's uint8 NHWC images
    laid out as the transform gives them (NCHW, its dtype and values), in a reused slot of this
    process's ring (pinned with `pin`; shared pages with `forks`, for a loader that forks workers),
    through the lookup table natively, else `_apply_steps`."""

    def __init__(self, lowering: Lowering, slots: int, pin: bool, forks: bool) -> None:
        self.lowering = lowering
        self.rings = ProcessRings(slots, pin, forks)
        self._table: torch.Tensor | None = None

    def __call__(self, batch: list) -> list:
        images = batch[0]
        n, h, w, _ = images.shape
        steps, dtype = self.lowering.steps, self.lowering.dtype
        ring = self.rings.ring()
        try:
            out, handle = new_batch(ring, (n, 3, h, w), dtype)
            if _ext is not None and n:
                if self._table is None or self._table.dtype != dtype:
                    self._table = lookup_table(steps, dtype)
                _ext.lookup_planes(images, self._table, out, default_threads())
            else:
                for k in range(n):
                    _apply_steps(out[k], images[k], steps)
        finally:
            ring.end()
        return [handle, batch[1]]


class Raise(Failures):
    """A file that cannot be read or decoded raises DataError naming it and the cause: the script
    chose no on_error, so the message offers none."""

    def __init__(self) -> None:
        super().__init__("raise", "pil")

    def __call__(self, errors: list[tuple[str, str]], path: str, cause: str) -> None:
        raise DataError(f"cannot read {path}: {cause} (its folder served natively by fastdata run)", path=path)


class NativeFolder(Dataset):
    """The dataset a natively served loader's workers read: the script's torchvision folder
    (`dataset`), decoded by fastdata per batch (`__getitems__`); a single index is the script's
    own `dataset[index]`."""

    def __init__(self, dataset: Any, lowering: Lowering) -> None:
        self.dataset, self.lowering = dataset, lowering
        transform = fd.Compose([*lowering.geometry, *lowering.pixel_ops])
        # The record of files that decoded whole is made here, before any worker forks: shared.
        self.decoder = BatchDecoder(transform, 0, Raise(), slots=1, pin=False, ids=len(dataset))
        self.decoder.resample = lowering.resample
        self.decoder.crop_first = True
        self._scratch: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_scratch": None}

    def __getitems__(self, indices: list[int]) -> FolderBatch:
        ds = self.dataset
        samples = [ds.samples[i] for i in indices]
        paths = [path for path, _ in samples]
        errors: list[tuple[str, str]] = []
        datas = read_files(paths, batch_threads(self.decoder.threads))
        for path, data in zip(paths, datas):
            if isinstance(data, str):
                self.decoder.fail(errors, path, data)
        # One seed a batch from this process's torch RNG: torchvision's transforms draw from it
        # per sample, and a worker's is seeded by the DataLoader.
        self.decoder.seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        index = np.asarray(indices, dtype=np.int64)
        c = self.decoder.check(0, index, paths, datas, np.zeros(len(index), np.int64), errors)
        w, h = c.size
        images = self._images(len(c.datas), h, w)
        self.decoder.fill(images, c, 0, errors)
        targets = [target for _, target in samples]
        if ds.target_transform is not None:
            targets = [ds.target_transform(t) for t in targets]
        return FolderBatch(images, targets)

    def _images(self, n: int, h: int, w: int) -> torch.Tensor:
        """uint8 [n, h, w, 3] in this process's scratch (reused: the batch is laid out in the
        collate function's buffers right after it is decoded, in this process)."""
        need = n * h * w * 3
        if self._scratch is None or self._scratch.numel() < need:
            self._scratch = torch.empty(need, dtype=torch.uint8)
        return self._scratch[:need].view(n, h, w, 3)
