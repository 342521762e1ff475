"""The augmentation ops, as data: frozen dataclasses with torchvision's names and defaults.

An op does nothing by itself. A pipeline is compiled (`plan.py`) into per-sample geometry (one
crop box, one output size, one flip: what the decoders apply in a single pass), per-sample
pixel ops, and batch ops that run after collation (Normalize, on the device). Images stay
uint8 until Normalize, so one byte per pixel crosses to the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .schedule import SizeSchedule, is_int, is_schedule


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(name: str, size: Any, where: str = "") -> tuple[int, int]:
    pair = (size, size) if is_int(size) else size
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(is_int(s) and s > 0 for s in pair)):
        raise ValueError(f"{name} size should be a positive int or an (h, w) pair{where and ' ' + where}, "
                         f"but got {size!r}")
    return (pair[0], pair[1])


def _short_side_or_pair(name: str, size: Any, where: str = "") -> int | tuple[int, int]:
    """Resize's form: an int (the shorter side) or an (h, w) pair."""
    if is_int(size) and size > 0:
        return size
    return _pair(name, size, where)


def _size_or_schedule(name: str, size: Any, check: Callable[[str, Any, str], Any]) -> Any:
    """One size in the op's form, or a `SizeSchedule` of them (a list of (epoch, size) steps, or
    a callable epoch -> size)."""
    return SizeSchedule(name, size, check) if is_schedule(size) else check(name, size, "")


class Op:
    """Base of every op. `geometric` ops change where pixels come from (folded into one crop
    box per sample); `batch` ops run on the collated batch."""

    geometric = False
    batch = False


class Sized(Op):
    """A geometric op whose output size may follow the epoch: `size` is one size in the op's
    form, or a `SizeSchedule` of them (progressive resizing)."""

    size: Any

    def size_at(self, epoch: int) -> Any:
        """The output size at `epoch`, in the op's form."""
        return self.size.at(epoch) if isinstance(self.size, SizeSchedule) else self.size


SizeSpec = Any  # an int, an (h, w) pair, a list of (epoch, size) steps, or a callable epoch -> size


@dataclass(frozen=True)
class RandomResizedCrop(Sized):
    """A random crop of `scale` of the area and `ratio` aspect, resized to `size` (h, w). `size`
    may follow the epoch: `[(0, 160), (10, 192), (20, 224)]` (each size from its epoch on) or a
    callable epoch -> size; the crop box stays the one drawn for (seed, epoch, sample)."""

    size: SizeSpec
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    geometric = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_or_schedule("RandomResizedCrop", self.size, _pair))
        lo, hi = self.scale
        if not 0 < lo <= hi:
            raise ValueError(f"RandomResizedCrop scale should be (min, max) with 0 < min <= max, but got {self.scale}")
        rlo, rhi = self.ratio
        if not 0 < rlo <= rhi:
            raise ValueError(f"RandomResizedCrop ratio should be (min, max) with 0 < min <= max, but got {self.ratio}")


@dataclass(frozen=True)
class Resize(Sized):
    """An int resizes the shorter side to it (keeping the aspect, as torchvision does); an
    (h, w) pair resizes to exactly that. Either may follow the epoch, as RandomResizedCrop's."""

    size: SizeSpec
    geometric = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_or_schedule("Resize", self.size, _short_side_or_pair))


@dataclass(frozen=True)
class CenterCrop(Sized):
    """The central (h, w) of the image (an int: a square); may follow the epoch, as
    RandomResizedCrop's."""

    size: SizeSpec
    geometric = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _size_or_schedule("CenterCrop", self.size, _pair))


@dataclass(frozen=True)
class RandomHorizontalFlip(Op):
    p: float = 0.5
    geometric = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"RandomHorizontalFlip p should be in [0, 1], but got {self.p}")


def _jitter_range(name: str, value: float | tuple[float, float], center: float, bound: tuple[float, float] | None):
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"ColorJitter {name} should be non-negative, but got {value}")
        lo, hi = center - value, center + value
        if bound is not None:
            lo = max(lo, bound[0])
    else:
        lo, hi = (float(v) for v in value)
    if bound is not None and not (bound[0] <= lo <= hi <= bound[1]):
        raise ValueError(f"ColorJitter {name} should give a range within {bound}, but got ({lo}, {hi})")
    return (float(lo), float(hi))


@dataclass(frozen=True)
class ColorJitter(Op):
    """torchvision's ColorJitter: brightness, contrast and saturation factors drawn from
    [max(0, 1 - v), 1 + v] (or a given range), hue from [-h, h]; applied in a random order."""

    brightness: float | tuple[float, float] = 0.0
    contrast: float | tuple[float, float] = 0.0
    saturation: float | tuple[float, float] = 0.0
    hue: float | tuple[float, float] = 0.0

    def __post_init__(self) -> None:
        inf = float("inf")
        object.__setattr__(self, "brightness", _jitter_range("brightness", self.brightness, 1.0, (0.0, inf)))
        object.__setattr__(self, "contrast", _jitter_range("contrast", self.contrast, 1.0, (0.0, inf)))
        object.__setattr__(self, "saturation", _jitter_range("saturation", self.saturation, 1.0, (0.0, inf)))
        object.__setattr__(self, "hue", _jitter_range("hue", self.hue, 0.0, (-0.5, 0.5)))


_SAMPLINGS = ("nearest", "bilinear", "bicubic")
TRIVIAL_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
               "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
AUTO_OPS = (*TRIVIAL_OPS, "Invert")  # AutoAugment's policies name Invert too


@dataclass(frozen=True)
class TrivialAugment(Op):
    """torchvision's TrivialAugmentWide: one of 14 ops per image, at one of `num_magnitude_bins`
    magnitudes, both drawn uniformly; signed ops take a random sign. `interpolation`: how its
    shears, translations and rotations sample the image, "nearest" (torchvision's default),
    "bilinear" or "bicubic" (its references' recipes), as Pillow samples."""

    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    # whose magnitude table: torchvision.transforms' ("v1") or transforms.v2's ("v2"), which
    # differ in Solarize's thresholds (`plan._magnitudes`); a class attribute, not a field
    table = "v1"

    def __post_init__(self) -> None:
        if self.num_magnitude_bins < 2:
            raise ValueError(f"TrivialAugment num_magnitude_bins should be at least 2, but got {self.num_magnitude_bins}")
        _check_sampling(self)


@dataclass(frozen=True)
class RandAugment(Op):
    """torchvision's RandAugment: `num_ops` ops per image in turn, each drawn uniformly from
    TrivialAugment's 14, all at bin `magnitude` of `num_magnitude_bins` of RandAugment's own
    tables (narrower; translations a fraction of the image's side); signed ops take a random
    sign. `interpolation` as TrivialAugment's."""

    num_ops: int = 2
    magnitude: int = 9
    num_magnitude_bins: int = 31
    interpolation: str = "nearest"
    table = "v1"  # as TrivialAugment's: whose Solarize thresholds (a class attribute, not a field)

    def __post_init__(self) -> None:
        if not (is_int(self.num_ops) and self.num_ops >= 0):
            raise ValueError(f"RandAugment num_ops should be a non-negative int, but got {self.num_ops!r}")
        if not (is_int(self.num_magnitude_bins) and self.num_magnitude_bins >= 2):
            raise ValueError(f"RandAugment num_magnitude_bins should be at least 2, "
                             f"but got {self.num_magnitude_bins!r}")
        if not (is_int(self.magnitude) and 0 <= self.magnitude < self.num_magnitude_bins):
            raise ValueError(f"RandAugment magnitude should be a bin in [0, {self.num_magnitude_bins}), "
                             f"but got {self.magnitude!r}")
        _check_sampling(self)


@dataclass(frozen=True)
class AutoAugment(Op):
    """torchvision's AutoAugment with the sub-policies it holds (`policies`: each a tuple of (op,
    probability, magnitude bin or None)): per image one sub-policy drawn uniformly, each of its
    ops applied with its probability, at its bin of RandAugment's tables over 10 bins; signed ops
    take a random sign. `fastdata run` reads the policies from the script's op (not a public
    name: torchvision's policies are its own)."""

    policies: tuple
    interpolation: str = "nearest"
    table = "v1"  # as TrivialAugment's: whose Solarize thresholds (a class attribute, not a field)

    def __post_init__(self) -> None:
        policies = tuple(tuple((str(name), float(p), None if b is None else int(b)) for name, p, b in sub)
                         for sub in self.policies)
        for name, p, b in (step for sub in policies for step in sub):
            if name not in AUTO_OPS or not 0.0 <= p <= 1.0 or not (b is None or 0 <= b < 10):
                raise ValueError(f"AutoAugment sub-policy step ({name!r}, {p}, {b}) is not one fastdata runs")
        if not policies:
            raise ValueError("AutoAugment should get at least one sub-policy")
        object.__setattr__(self, "policies", policies)
        _check_sampling(self)


def _check_sampling(op: Op) -> None:
    if op.interpolation not in _SAMPLINGS:
        raise ValueError(f"{type(op).__name__} interpolation should be one of {_SAMPLINGS}, "
                         f"but got {op.interpolation!r}")


@dataclass(frozen=True)
class Normalize(Op):
    """(x / 255 - mean) / std per channel, then the loader's `dtype`. Runs on the batch, on
    the target device."""

    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    batch = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ValueError(f"Normalize should get 3 means and 3 positive stds, but got {self.mean}, {self.std}")


@dataclass(frozen=True)
class MixUp(Op):
    """Per batch: lam ~ Beta(alpha, alpha); images and (soft) labels become lam * own +
    (1 - lam) * the batch rolled by one, as torchvision.transforms.v2.MixUp does."""

    alpha: float = 0.2
    batch = True

    def __post_init__(self) -> None:
        if self.alpha <= 0:
            raise ValueError(f"MixUp alpha should be positive, but got {self.alpha}")


@dataclass(frozen=True)
class CutMix(Op):
    """Per batch: lam ~ Beta(alpha, alpha); a box of (1 - lam) of the area is pasted from the
    batch rolled by one, and labels mix by the area actually pasted (torchvision's v2.CutMix).
    With MixUp in the same pipeline, each batch gets one of the two, at even odds."""

    alpha: float = 1.0
    batch = True

    def __post_init__(self) -> None:
        if self.alpha <= 0:
            raise ValueError(f"CutMix alpha should be positive, but got {self.alpha}")


@dataclass(frozen=True)
class LabelSmoothing(Op):
    """Soft targets: (1 - eps) * one_hot + eps / num_classes."""

    eps: float = 0.1
    batch = True

    def __post_init__(self) -> None:
        if not 0 <= self.eps < 1:
            raise ValueError(f"LabelSmoothing eps should be in [0, 1), but got {self.eps}")


@dataclass(frozen=True)
class Compose:
    """A pipeline: per-sample ops first (geometry, then pixel ops), batch ops last."""

    ops: tuple[Op, ...] = field(default_factory=tuple)

    def __init__(self, ops: Sequence[Op]) -> None:
        ops = tuple(ops)
        for op in ops:
            if not isinstance(op, Op):
                raise TypeError(f"Compose should get fastdata.transforms ops, but got {op!r}")
        seen_batch = seen_pixel = False
        for op in ops:
            if op.batch:
                seen_batch = True
            elif seen_batch:
                raise ValueError(f"{type(op).__name__} should come before the batch ops (Normalize), but comes after")
            elif op.geometric and seen_pixel:
                # The geometry runs in the decoder, before any pixel op: say so rather than reorder.
                raise ValueError(f"{type(op).__name__} should come before ColorJitter, TrivialAugment and "
                                 "RandAugment, but comes after")
            else:
                seen_pixel = seen_pixel or not op.geometric
        object.__setattr__(self, "ops", ops)

    @property
    def geometry(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.geometric)

    @property
    def pixel_ops(self) -> tuple[Op, ...]:
        """Per-sample ops that change values, not geometry (ColorJitter, TrivialAugment, RandAugment,
        AutoAugment)."""
        return tuple(op for op in self.ops if not op.geometric and not op.batch)

    @property
    def batch_ops(self) -> tuple[Op, ...]:
        return tuple(op for op in self.ops if op.batch)

    @property
    def soft_labels(self) -> bool:
        """Whether labels come out as float [N, num_classes] targets instead of int64 [N]."""
        return any(isinstance(op, (MixUp, CutMix, LabelSmoothing)) for op in self.ops)

    @property
    def normalize(self) -> Normalize | None:
        return next((op for op in self.ops if isinstance(op, Normalize)), None)

    def __iter__(self):
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)


def imagenet_train(size: SizeSpec = 224) -> Compose:
    """RandomResizedCrop(size), RandomHorizontalFlip(), Normalize(ImageNet mean and std); `size`
    may be a schedule (see RandomResizedCrop)."""
    return Compose([RandomResizedCrop(size), RandomHorizontalFlip(), Normalize()])


def imagenet_eval(size: int = 224) -> Compose:
    """Resize(size / 0.875) (256 for 224), CenterCrop(size), Normalize(ImageNet mean and std)."""
    if not is_int(size):
        raise ValueError(f"imagenet_eval size should be an int, but got {size!r}; for sizes that follow the epoch, "
                         f"compose Resize and CenterCrop with size schedules")
    return Compose([Resize(int(math.floor(size / 0.875))), CenterCrop(size), Normalize()])
