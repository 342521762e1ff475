"""`fastdata run`'s pixel ops: what runs on each image after the decoder's geometry.

`pixel_op` reads one of torchvision's (v1 and v2 classes, each its exact class) into fastdata's
op: ColorJitter and the auto-augments (`transforms.ops`, run as Pillow runs them; on a tensor
image, `_tensor_augment`), RandomRotation, RandomAffine and RandomPerspective (`_rotation`),
AugMix (`_augmix`), and, here, the
self-supervised recipes' ops (SimCLR's, BYOL's, MoCo v2's: a ColorJitter applied with a chance, a
grayscale, a blur, a solarization) and the other Random* ops of one functional call:
RandomGrayscale, RandomVerticalFlip, RandomInvert, RandomPosterize, RandomSolarize,
RandomAdjustSharpness, RandomAutocontrast and RandomEqualize, and Grayscale to 3 channels, a
RandomGrayscale that always applies (`RandomCall`), GaussianBlur
(`Blur`), RandomApply, RandomChoice and RandomOrder of pixel ops (`Chance`, `Choice`, `Order`).
Their parameters are drawn per sample, and each
image is computed by torchvision's own functions with them (`F.rgb_to_grayscale`,
`F.gaussian_blur`, ..., v1's for v1's op, v2's for v2's; on a uint8 tensor image, its tensor
kernels, `TensorColorJitter` too): the draws are fastdata's, the pixels torchvision's. An op
of the script's on the PIL image there (`ScriptOp`) is called as it is, drawing its own.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..transforms import ops as fd
from ._augmix import augmix
from ._blur import served, withdrawn
from ._rotation import pillow_geometry
from ._timm import timm_augment
from ._tensor_augment import tensor_augment


class _TrivialAugmentV2(fd.TrivialAugment):
    table = "v2"  # torchvision.transforms.v2's TrivialAugmentWide: v1's, with v2's Solarize thresholds


class _RandAugmentV2(fd.RandAugment):
    table = "v2"  # torchvision.transforms.v2's RandAugment: v1's, with v2's Solarize thresholds


class _AutoAugmentV2(fd.AutoAugment):
    table = "v2"  # torchvision.transforms.v2's AutoAugment: v1's, with v2's Solarize thresholds


# torchvision's Random* ops of one functional call, each applied with chance `p`: the call, and the
# op's attributes that are its arguments. RandomGrayscale passes the image's channels, 3 wherever
# fastdata runs pixel ops (RGB folders, 3-channel arrays).
CALLS = {"RandomGrayscale": ("rgb_to_grayscale", (), (3,)), "RandomVerticalFlip": ("vflip", (), ()),
          "RandomInvert": ("invert", (), ()), "RandomPosterize": ("posterize", ("bits",), ()),
          "RandomSolarize": ("solarize", ("threshold",), ()),
          "RandomAdjustSharpness": ("adjust_sharpness", ("sharpness_factor",), ()),
          "RandomAutocontrast": ("autocontrast", (), ()), "RandomEqualize": ("equalize", (), ())}


@dataclass(frozen=True)
class RandomCall(fd.Op):
    """One of torchvision's Random* ops of one functional call (`CALLS`: RandomGrayscale,
    RandomVerticalFlip, RandomSolarize, ...): with chance `p` per sample, the call of the op's
    version's functional module with the op's arguments, as its `forward` makes it."""

    p: float
    call: str
    args: tuple
    v2: bool
    tensor: bool = False  # on the uint8 tensor image (torchvision's tensor kernel), not the PIL image

    def plan(self, u: Any) -> list[dict]:
        return [{"apply": bool(x < self.p)} for x in u[:, 0]]

    def on_pillow(self, img: Any, p: dict) -> Any:  # (the tensor image too: `transforms.pil.pixel_ops_on`)
        return getattr(_functional(self.v2), self.call)(img, *self.args) if p["apply"] else img

    on_tensor = on_pillow


@dataclass(frozen=True)
class Blur(fd.Op):
    """torchvision's GaussianBlur: a sigma uniform in `sigma` per sample (float32, as torch's
    `uniform_` gives it), the same in x and y, then `F.gaussian_blur` with the op's kernel, run
    with denormal floats flushed to zero (`flushed_denormals`)."""

    kernel: tuple[int, int]
    sigma: tuple[float, float]
    v2: bool
    tensor: bool = False  # on the uint8 tensor image, not the PIL image

    def plan(self, u: Any) -> list[dict]:
        lo, hi = self.sigma
        return [{"sigma": float(s)} for s in (lo + (hi - lo) * u[:, 0]).astype("float32")]

    def on_pillow(self, img: Any, p: dict) -> Any:  # (the tensor image too)
        with flushed_denormals():
            return _functional(self.v2).gaussian_blur(img, list(self.kernel), [p["sigma"], p["sigma"]])

    on_tensor = on_pillow


@contextlib.contextmanager
def flushed_denormals() -> Any:
    """This thread's float arithmetic with denormals flushed to zero while the block runs
    (`torch.set_flush_denormal`: x86's FTZ and DAZ; elsewhere nothing changes), then as it was.

    Why GaussianBlur runs so: with a sigma under about 1.2 (most of SimCLR's 0.1 to 2.0) the
    Gaussian's float32 kernel holds weights below the normal range (under 2^-126), and each
    multiply by one takes the CPU's slow path: torchvision's blur of a 224-pixel image with 23
    taps took 80-200 ms here instead of 17. Flushed, such a weight is 0. Nothing else in the blur
    changes: its other weights come out the same (a denormal dropped from the Gaussian's sum,
    which is at least 1, leaves it as it was), every other product is a normal weight times a
    whole level of 1 to 255, or 0, and every sum is of non-negative terms. Each term dropped is
    under 2^-118 (a denormal weight times at most 255): it moves a partial sum only while that
    sum is under 2^-93, and then a later sum only where that sum's exact value lies within
    2^-108 of a rounding midpoint, which must in turn move the final sum across a half level to
    change a pixel (tests/tools/test_run_torchvision.py compares the pixels across sigmas,
    kernels and images, dark and sparse ones too)."""
    import torch

    was = (torch.tensor([1e-39]) * 1.0).item() == 0.0  # (flushed already: a denormal times 1 is 0)
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(was)


@dataclass(frozen=True)
class TensorColorJitter(fd.ColorJitter):
    """torchvision's ColorJitter on the uint8 tensor image: its factors and order drawn as on the
    PIL image (`plan_pixels`), then the version's `adjust_*` on the tensor (torchvision's tensor
    arithmetic, not Pillow's), each only where the op has a range, as its `forward` calls them."""

    v2: bool = False
    tensor = True  # (`transforms.pil.pixel_ops_on` hands it the tensor image)

    def on_tensor(self, t: Any, p: dict) -> Any:
        F = _functional(self.v2)
        for k in p["order"]:
            name = ("brightness", "contrast", "saturation", "hue")[k]
            if getattr(self, name) != ((0.0, 0.0) if name == "hue" else (1.0, 1.0)):  # (None in torchvision)
                t = getattr(F, f"adjust_{name}")(t, p[name])
        return t


@dataclass(frozen=True)
class Chance(fd.Op):
    """torchvision's RandomApply of pixel ops: with chance `p` per sample, `ops` in turn, each
    with the parameters drawn for it (`plan_pixels` draws them from streams of their own;
    `pixel_ops_on` runs them)."""

    p: float
    ops: tuple

    def plan(self, u: Any, inner: list[list[dict]]) -> list[dict]:
        return [{"apply": bool(x < self.p), "order": list(range(len(self.ops))) if x < self.p else [],
                 "inner": [plan[i] for plan in inner]} for i, x in enumerate(u[:, 0])]


@dataclass(frozen=True)
class Choice(fd.Op):
    """torchvision's RandomChoice of pixel ops: one of `ops` per sample, op k with chance
    `weights[k] / sum(weights)` (each with the parameters drawn for it, as `Chance`'s)."""

    weights: tuple
    ops: tuple

    def plan(self, u: Any, inner: list[list[dict]]) -> list[dict]:
        bounds = np.cumsum(self.weights) / sum(self.weights)
        picks = np.minimum(np.searchsorted(bounds, u[:, 0], side="right"), len(self.ops) - 1)
        return [{"order": [int(k)], "inner": [plan[i] for plan in inner]} for i, k in enumerate(picks)]


@dataclass(frozen=True)
class Order(fd.Op):
    """torchvision's RandomOrder of pixel ops: all of `ops`, in an order drawn per sample, each
    order as likely (the ranks of independent uniform draws)."""

    ops: tuple

    @property
    def draws(self) -> int:
        return len(self.ops)

    def plan(self, u: Any, inner: list[list[dict]]) -> list[dict]:
        orders = np.argsort(u[:, :len(self.ops)], axis=1, kind="stable")
        return [{"order": order.tolist(), "inner": [plan[i] for plan in inner]} for i, order in enumerate(orders)]


class NotAPixelOp(Exception):
    """An op of the script's (`ScriptOp`) gave what fastdata does not lay out where torchvision's
    pixel ops go: the batch is then the dataset's own samples."""


# The script's ops seen to change an image (its size, mode or type) in this process: not lowered again
_CHANGED: "weakref.WeakSet[Any]" = weakref.WeakSet()


@dataclass(frozen=True)
class ScriptOp(fd.Op):
    """An op of the script's (a callable of no torchvision class, or a `Lambda`) on the PIL image
    after the geometry, as MoCo v2's, SimSiam's and DINO's GaussianBlur and Solarization are:
    called on each image in turn, as the script's Compose calls it, drawing what it draws itself
    (from Python's or torch's RNG, in the process that fetches). Its result must be a PIL image
    of the size and mode it was given; else `NotAPixelOp`, and the op is not lowered again in
    this process."""

    call: Any
    draws = 1

    def plan(self, u: Any) -> list[dict]:
        return [{} for _ in range(len(u))]

    def on_pillow(self, img: Any, p: dict) -> Any:
        from PIL import Image

        try:
            out = self.call(served(img))  # (its GaussianBlur native: `_blur`)
        finally:
            withdrawn(img)
        if isinstance(out, Image.Image) and out.size == img.size and out.mode == img.mode:
            return out
        try:
            _CHANGED.add(self.call)
        except TypeError:  # (an object that takes no weak reference: the next batch tries it again)
            pass
        got = f"a {out.mode} image of {out.size}" if isinstance(out, Image.Image) else f"a {type(out).__name__}"
        raise NotAPixelOp(f"{named(self.call)} gave {got} for a {img.mode} image of {img.size}")


def _changed(call: Any) -> bool:
    try:
        return call in _CHANGED
    except TypeError:  # (one that takes no weak reference is never kept there)
        return False


def named(call: Any) -> str:
    """How a summary names a callable of the script's: its qualified name, or its class's."""
    return getattr(call, "__qualname__", type(call).__name__)


def script_ops(ops: tuple, drawing: bool = False) -> list[str]:
    """The names of the script's ops (`ScriptOp`) among `ops` and the ops they hold; with
    `drawing`, of every op there that draws from the RNGs of the process that fetches (timm's
    auto-augments too)."""
    names = []
    for op in ops:
        if isinstance(op, ScriptOp) or (drawing and getattr(op, "process_rng", False)):
            names.append(named(op.call))
        names += script_ops(getattr(op, "ops", ()), drawing)
    return names


def _functional(v2: bool) -> Any:
    import torchvision.transforms.functional as F
    import torchvision.transforms.v2.functional as F2

    return F2 if v2 else F


def _version(op: Any, domain: str) -> bool:
    """Whether `op` is v2's; ValueError on a float tensor: fastdata runs pixel ops on the uint8
    image, before the conversion."""
    import torchvision.transforms.v2 as v2

    if domain == "float":
        raise ValueError(f"{type(op).__name__} on a float tensor: fastdata lowers it on the PIL image or the uint8 "
                         "tensor image")
    return isinstance(op, v2.Transform)


def random_call(op: Any, domain: str) -> RandomCall:
    """The lowering of one of `CALLS`' ops (a vflip of a float tensor: the uint8 image's); ValueError, saying why."""
    call, names, constant = CALLS[type(op).__name__]
    v2 = _version(op, "uint8" if call == "vflip" else domain)
    return RandomCall(float(op.p), call, tuple(getattr(op, name) for name in names) + constant, v2, domain != "pil")


def blur(op: Any, domain: str) -> Blur:
    """GaussianBlur's lowering; ValueError, saying why, where there is none."""
    v2 = _version(op, domain)
    kx, ky = (int(k) for k in op.kernel_size)
    return Blur((kx, ky), (float(op.sigma[0]), float(op.sigma[1])), v2, domain != "pil")


def pixel_op(op: Any, domain: str, within: str = "") -> fd.Op | None:
    """fastdata's op for a pixel op of torchvision's on images of `domain` ("pil", "uint8" or
    "float"), None for an op that is not one; ValueError, saying why, for one fastdata does not
    lower (`within`: the RandomApply holding it, where any other op is refused too). On a uint8
    tensor image, ColorJitter, GaussianBlur and the Random* calls run torchvision's tensor kernels
    (the row of the batch made a tensor: the image torchvision's op would get there)."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    kind, cls, tensor = type(op).__name__, type(op), domain != "pil"
    if cls in (T.RandomRotation, v2.RandomRotation, T.RandomAffine, v2.RandomAffine, T.RandomPerspective,
               v2.RandomPerspective):
        return pillow_geometry(op, tensor)
    if cls in (T.AugMix, v2.AugMix):
        return augmix(op, domain)
    if kind in CALLS and cls in (getattr(T, kind), getattr(v2, kind)):
        return random_call(op, domain)
    if cls in (T.Grayscale, v2.Grayscale):  # (RandomGrayscale's call, always)
        if op.num_output_channels != 3:
            raise ValueError(f"{kind} to {op.num_output_channels} channel: fastdata's batches hold 3 channels; it "
                             f"lowers {kind}(num_output_channels=3)")
        return RandomCall(1.0, "rgb_to_grayscale", (3,), _version(op, domain), tensor)
    if cls in (T.GaussianBlur, v2.GaussianBlur):
        return blur(op, domain)
    if cls in (T.RandomApply, v2.RandomApply):
        return Chance(float(op.p), tuple(pixel_op(one, domain, kind) for one in _opened(op.transforms)))
    if cls in (T.RandomChoice, v2.RandomChoice, T.RandomOrder, v2.RandomOrder):
        # each of its transforms one op, or a Compose of ops applied together (a RandomApply that always applies)
        ops = tuple(Chance(1.0, tuple(pixel_op(one, domain, kind) for one in _opened(t.transforms)))
                    if type(t) in (T.Compose, v2.Compose) else pixel_op(t, domain, kind) for t in op.transforms)
        if not ops:
            raise ValueError(f"{kind} of no transforms: torchvision raises; not lowered")
        if cls in (T.RandomOrder, v2.RandomOrder):
            return Order(ops)
        weights = [1.0] * len(ops) if op.p is None else [float(w) for w in op.p]
        if len(weights) != len(ops) or not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"{kind} with weights {op.p!r}: fastdata lowers non-negative weights, one per "
                             "transform, not all zero")
        return Choice(tuple(weights), ops)
    augment = cls in (T.TrivialAugmentWide, v2.TrivialAugmentWide, T.RandAugment, v2.RandAugment, T.AutoAugment,
                      v2.AutoAugment)
    if cls in (T.ColorJitter, v2.ColorJitter):  # (torchvision keeps each range as [lo, hi], None for 0)
        ranges = [tuple(r) if r is not None else 0.0 for r in (op.brightness, op.contrast, op.saturation, op.hue)]
        return TensorColorJitter(*ranges, v2=_version(op, domain)) if tensor else fd.ColorJitter(*ranges)
    if augment and tensor:  # (torchvision's tensor kernels: `_tensor_augment`)
        return tensor_augment(op, domain)
    if augment:
        sampling = interpolation(op).value
        if sampling not in ("nearest", "bilinear", "bicubic") or op.fill not in (None, 0, [0], (0,)):
            raise ValueError(f"{kind} with interpolation {sampling} or a fill other than 0: fastdata lowers "
                             "nearest, bilinear and bicubic, fill 0")
        if cls in (T.AutoAugment, v2.AutoAugment):  # (its sub-policies, as the op holds them)
            policies = op.policies if cls is T.AutoAugment else op._policies
            return (_AutoAugmentV2 if cls is v2.AutoAugment else fd.AutoAugment)(policies, sampling)
        if cls in (T.RandAugment, v2.RandAugment):
            return (_RandAugmentV2 if cls is v2.RandAugment else fd.RandAugment)(
                op.num_ops, op.magnitude, op.num_magnitude_bins, sampling)
        return (_TrivialAugmentV2 if cls is v2.TrivialAugmentWide else fd.TrivialAugment)(
            int(op.num_magnitude_bins), sampling)
    timms = timm_augment(op) if domain == "pil" else None  # (timm's RandAugment, AutoAugment: `_timm`)
    if timms is not None:
        return timms
    # (a subclass of a torchvision transform is neither: it is refused as torchvision's own classes are read)
    if domain == "pil" and callable(op) and (cls in (T.Lambda, v2.Lambda) or not any(
            c.__module__.startswith("torchvision.") for c in cls.__mro__)):
        if _changed(op):
            raise ValueError(f"{named(op)}, an op of the script's, changed an image's size or mode in a batch "
                             "before: fastdata calls an op of the script's where torchvision's pixel ops go")
        return ScriptOp(op)
    if within:
        raise ValueError(f"{kind} in a {within}: fastdata lowers a {within} of pixel ops on the PIL image "
                         "(ColorJitter, GaussianBlur, RandomGrayscale and torchvision's other Random* photometric "
                         "ops, RandomRotation, RandomAffine, RandomPerspective, the auto-augments, AugMix)")
    return None


def flip_commutes(op: fd.Op) -> bool:
    """Whether a flip before the pixel op gives the image the op then the flip gives, exactly:
    each output pixel a function of its own input pixel and of statistics of the whole image
    (ColorJitter, whose contrast takes the image's mean; a grayscale, solarization, posterization,
    inversion, autocontrast, equalization; a vertical flip, which commutes with a horizontal one),
    or a RandomApply of such ops. A sharpness adjustment or a blur sums neighbours in an order a
    flip reverses, which may round otherwise."""
    if isinstance(op, (Chance, Choice, Order)):
        return all(flip_commutes(one) for one in op.ops)
    if getattr(op, "tensor", False):  # (torch's float reductions too)
        return False
    return type(op) is fd.ColorJitter or (isinstance(op, RandomCall) and op.call != "adjust_sharpness")


def _opened(transforms: Any) -> list:
    """A RandomApply's ops in turn, a Compose among them opened."""
    import torchvision.transforms as T
    import torchvision.transforms.v2 as v2

    return [one for t in transforms for one in (_opened(t.transforms) if type(t) in (T.Compose, v2.Compose) else [t])]


def interpolation(op: Any) -> Any:
    """torchvision's InterpolationMode of an op's `interpolation`: the mode, one of PIL's integer
    filters (v2 keeps an int as given, and reads it as PIL's), or (v2's only) its name; a name
    given to a v1 op, whose functional ops raise on it, is a ValueError."""
    from torchvision.transforms import InterpolationMode

    value = op.interpolation
    if isinstance(value, str) and not type(op).__module__.startswith("torchvision.transforms.v2"):
        raise ValueError(f"{type(op).__name__} with interpolation {value!r}, a string: torchvision's v1 ops raise; "
                         "not lowered")
    if isinstance(value, int) and not isinstance(value, bool):
        pil = {0: "nearest", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming", 1: "lanczos"}
        return InterpolationMode(pil.get(value, value))
    return InterpolationMode(value)
